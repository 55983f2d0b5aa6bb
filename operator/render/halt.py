"""The durable half of a halt: which HaltSwitches hold a policy, and the halt key they write.

The key ``halt`` of the policy's ConfigMap, which ``EXECUTOR_HALT_FILE`` points at, exists while
any HaltSwitch that selects the policy is halted (a pod that restarts starts halted; the
executor refuses to resume while the file exists). :func:`switches_halting` decides which
switches hold a policy, :func:`halt_document` is the file's content and
:func:`render_halt_configmap` the object the operator applies under its own field manager
(``agentsafe-operator-halt``), so that re-rendering the ConfigMap never clears the key and a
policy that fails to render can still be halted. All pure.

Callers: ``operator/halt.py`` (:func:`~..halt.sync_halt`), ``readiness.py``
(:func:`~..readiness.refresh_ready`), the tests.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..models import HaltSwitchSpec
from .common import PolicyRef, names
from .config import HALT_KEY

__all__ = ["halt_document", "render_halt_configmap", "switches_halting"]


def switches_halting(
    switches: Iterable[Mapping[str, Any]], policy_labels: Mapping[str, str] | None
) -> list[tuple[str, str]]:
    """(name, reason) of every halted HaltSwitch (not being deleted) selecting the policy."""
    out: list[tuple[str, str]] = []
    for switch in switches:
        if switch.get("metadata", {}).get("deletionTimestamp"):
            continue
        try:
            spec = HaltSwitchSpec.model_validate(switch.get("spec") or {})
        except ValueError:
            continue  # an invalid stored switch halts nothing; its own handler reports it
        if spec.halted and spec.policy_selector.matches(dict(policy_labels or {})):
            out.append((str(switch["metadata"]["name"]), spec.reason or ""))
    return sorted(out)


def halt_document(halting: Sequence[tuple[str, str]]) -> str | None:
    """The halt file's content, or ``None`` when nothing halts the policy."""
    if not halting:
        return None
    body = {"haltedBy": [{"haltSwitch": name, "reason": reason} for name, reason in halting]}
    return json.dumps(body, sort_keys=True) + "\n"


def render_halt_configmap(policy: PolicyRef, document: str | None) -> dict[str, Any]:
    """What the halt field manager applies: the halt key, or no key at all (which removes the
    one it applied before)."""
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": names(policy).config, "namespace": policy.namespace},
    }
    if document is not None:
        body["data"] = {HALT_KEY: document}
    return body
