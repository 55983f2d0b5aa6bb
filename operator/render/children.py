"""Everything one AgentPolicy becomes, in the order it is applied.

:func:`render_children` compiles the policy first (:func:`compile_spec_policy`, the executor's
:func:`~agentsafe.executor.policy.policy.compile_policy`; the admission webhook applies the same
function before the object is stored): an invalid CEL expression or parameter
schema is a ``RenderError`` with reason ``PolicyInvalid`` and the compiler's message, and nothing is
rendered, so existing children stay as they were; so is a case of ``spec.tests`` the policy does
not answer as expected (reason ``PolicyTestsFailed``).

Callers: ``render/__init__.py``, which re-exports it; the tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentsafe.executor.errors import PolicyError
from agentsafe.executor.policy.policy import CompiledPolicy, PolicyDocument, compile_policy
from agentsafe.executor.policy.trial import run_cases

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

__all__ = ["Rendered", "check_policy", "compile_spec_policy", "render_children"]


@dataclass(frozen=True)
class Rendered:
    """The manifests to apply (in order) and what status reports about them."""

    objects: tuple[dict[str, Any], ...]
    policy_digest: str
    principals: tuple[str, ...]


def compile_spec_policy(policy: PolicyDocument) -> CompiledPolicy:
    """Compile ``spec.policy`` as the executor will: every parameter schema checked, every CEL
    ``when`` compiled by the authority's own compiler. A refusal is ``RenderError`` with reason
    ``PolicyInvalid`` and the refusal's public words (``PolicyError.public_message``): the
    rule's path and what is wrong (``actions[0].rules[1].when: the expression does not
    compile ...``), never a value of the object (the expression, a pattern, a name; issue 30,
    item 18). The one check both the reconcile (a condition, afterwards) and the admission
    webhook (``admission.py``, a refusal, before) apply."""
    try:
        return compile_policy(policy)
    except PolicyError as exc:
        raise RenderError(ConditionReason.POLICY_INVALID, exc.public_message) from None


def check_policy(inp: RenderInput) -> CompiledPolicy:
    """Compile ``spec.policy`` (:func:`compile_spec_policy`), then run ``spec.tests`` through
    the authority's evaluation as ``agentsafe policy test`` does (``PolicyTestsFailed`` naming
    the failing cases)."""
    compiled = compile_spec_policy(inp.spec.policy)
    failed = [result for result in run_cases(compiled, inp.spec.tests) if not result.passed]
    if failed:
        shown = "; ".join(f"{r.name!r}: {', '.join(r.failures)}" for r in failed[:5])
        more = f" (and {len(failed) - 5} more)" if len(failed) > 5 else ""
        raise RenderError(
            ConditionReason.POLICY_TESTS_FAILED,
            f"{len(failed)} of {len(inp.spec.tests)} policy tests failed: {shown}{more}",
        )
    return compiled


def render_children(inp: RenderInput) -> Rendered:
    compiled = check_policy(inp)
    configmap = render_configmap(inp)
    digest = config_digest(inp, configmap)
    pdb = render_pdb(inp)
    objects = (
        render_service_account(inp),
        configmap,
        render_service(inp),
        render_statefulset(inp, digest=digest),
        *([pdb] if pdb is not None else []),
        render_executor_network_policy(inp),
        *render_agent_network_policies(inp),
    )
    return Rendered(
        objects=objects,
        policy_digest=compiled.digest,
        principals=tuple(sorted(p.name for p in inp.principals)),
    )
