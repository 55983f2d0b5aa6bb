"""Everything one AgentPolicy becomes, in the order it is applied.

:func:`render_children` compiles the policy first (the executor's
:func:`~agentsafe.executor.policy.policy.compile_policy`): an invalid CEL expression or parameter
schema is a ``RenderError`` with reason ``PolicyInvalid`` and the compiler's message, and nothing is
rendered, so existing children stay as they were.

Callers: ``render/__init__.py``, which re-exports it; the tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentsafe.executor.errors import PolicyError
from agentsafe.executor.policy.policy import CompiledPolicy, compile_policy

from ..models import ConditionReason
from .common import RenderError, RenderInput
from .config import render_configmap
from .network import (
    render_agent_network_policies,
    render_executor_network_policy,
    render_pdb,
    render_service,
)
from .workload import config_digest, render_service_account, render_statefulset

__all__ = ["Rendered", "check_policy", "render_children"]


@dataclass(frozen=True)
class Rendered:
    """The manifests to apply (in order) and what status reports about them."""

    objects: tuple[dict[str, Any], ...]
    policy_digest: str
    principals: tuple[str, ...]


def check_policy(inp: RenderInput) -> CompiledPolicy:
    """Compile ``spec.policy`` as the executor will; ``PolicyInvalid`` with the compiler's
    message if it does not compile."""
    try:
        return compile_policy(inp.spec.policy)
    except PolicyError as exc:
        raise RenderError(ConditionReason.POLICY_INVALID, str(exc)) from None


def render_children(inp: RenderInput) -> Rendered:
    compiled = check_policy(inp)
    configmap = render_configmap(inp)
    digest = config_digest(inp, configmap)
    objects = (
        render_service_account(inp),
        configmap,
        render_service(inp),
        render_statefulset(inp, digest=digest),
        render_pdb(inp),
        render_executor_network_policy(inp),
        *render_agent_network_policies(inp),
    )
    return Rendered(
        objects=objects,
        policy_digest=compiled.digest,
        principals=tuple(sorted(p.name for p in inp.principals)),
    )
