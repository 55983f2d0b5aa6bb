"""An AgentPolicy's ``Ready`` condition from its executor StatefulSet: the one source of truth.

Two paths write ``Ready``, and both decide it here:

- the reconcile (create/update/resume and the drift timer, ``handlers.reconcile_policy``), right
  after it applied the children;
- the StatefulSet watch and the HaltSwitch handler (``handlers.refresh_ready``), which only
  recompute ``Ready`` (and ``halted``, which ``Ready`` reports) and never render or apply.

:func:`executor_readiness` is the decision, pure: halted first (``Halted``); then the
StatefulSet as ``kubectl rollout status`` reads it (missing, its controller has not observed its
latest generation, fewer ready or updated replicas than the policy asks for, a rolling update
between revisions) is ``ExecutorsNotReady`` with what is missing; otherwise ``ExecutorsReady``.
The desired count is the policy's ``spec.replicas``, not the StatefulSet's, so a StatefulSet
scaled down by hand is not ready.

:func:`readiness_status` is the watch path's status patch: ``None`` when the policy's children
were not applied for its current generation (a failed render keeps its own ``Ready`` reason,
such as ``PolicyInvalid``, and a new generation belongs to its update handler) or when nothing
would change; otherwise ``halted`` and the conditions with ``Ready`` set (its
``lastTransitionTime`` kept while the status stays the same, ``observedGeneration`` the
policy's).

Callers: ``handlers.py``, the tests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from .conditions import set_condition
from .models import API_VERSION

__all__ = [
    "READY",
    "RECONCILED",
    "Owner",
    "Readiness",
    "executor_readiness",
    "owning_policy",
    "readiness_status",
    "set_ready",
]

READY: Final = "Ready"
RECONCILED: Final = "Reconciled"


@dataclass(frozen=True)
class Readiness:
    """What the ``Ready`` condition says: status, reason and message."""

    ready: bool
    reason: str
    message: str
    halted: bool = False


@dataclass(frozen=True)
class Owner:
    """The AgentPolicy that controls a child (from the child's owner references)."""

    name: str
    uid: str


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def executor_readiness(
    *, desired_replicas: int, statefulset: Mapping[str, Any] | None, halted: bool
) -> Readiness:
    """``Ready`` of a policy whose children are applied, from its executor StatefulSet."""
    if halted:
        return Readiness(False, "Halted", "a HaltSwitch halts this policy's executors", halted=True)
    if statefulset is None:
        return Readiness(False, "ExecutorsNotReady", "the executor StatefulSet does not exist")
    meta = statefulset.get("metadata") or {}
    status = statefulset.get("status") or {}
    generation = _int(meta.get("generation"))
    observed = _int(status.get("observedGeneration"))
    if generation is not None and (observed is None or observed < generation):
        return Readiness(
            False,
            "ExecutorsNotReady",
            f"StatefulSet generation {generation} not yet observed by its controller",
        )
    ready = _int(status.get("readyReplicas")) or 0  # omitted when zero
    if ready < desired_replicas:
        return Readiness(False, "ExecutorsNotReady", f"{ready}/{desired_replicas} ready")
    updated = _int(status.get("updatedReplicas")) or 0
    if updated < desired_replicas:
        return Readiness(
            False,
            "ExecutorsNotReady",
            f"rollout in progress: {updated}/{desired_replicas} updated",
        )
    current, update = status.get("currentRevision"), status.get("updateRevision")
    if current and update and current != update:
        return Readiness(
            False, "ExecutorsNotReady", f"rollout in progress: revision {current} -> {update}"
        )
    return Readiness(True, "ExecutorsReady", f"{ready}/{desired_replicas} ready")


def set_ready(
    conditions: Sequence[dict[str, Any]], readiness: Readiness, *, generation: int
) -> list[dict[str, Any]]:
    """``conditions`` with ``Ready`` set from ``readiness`` (see :func:`.set_condition`)."""
    return set_condition(
        conditions,
        type=READY,
        status=readiness.ready,
        reason=readiness.reason,
        message=readiness.message,
        generation=generation,
    )


def owning_policy(child: Mapping[str, Any]) -> Owner | None:
    """The controlling AgentPolicy of ``child``, or ``None`` when no AgentPolicy controls it."""
    for ref in (child.get("metadata") or {}).get("ownerReferences") or []:
        if (
            ref.get("controller") is True
            and ref.get("kind") == "AgentPolicy"
            and ref.get("apiVersion") == API_VERSION
            and ref.get("name")
            and ref.get("uid")
        ):
            return Owner(name=str(ref["name"]), uid=str(ref["uid"]))
    return None


def _condition(conditions: Sequence[Mapping[str, Any]], type_: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions if c.get("type") == type_), None)


def _comparable(condition: Mapping[str, Any] | None) -> tuple[Any, ...]:
    if condition is None:
        return ()
    return tuple(condition.get(k) for k in ("status", "reason", "message", "observedGeneration"))


def readiness_status(policy: Mapping[str, Any], readiness: Readiness) -> dict[str, Any] | None:
    """The status patch that makes ``policy``'s ``Ready`` say ``readiness``, or ``None`` when
    the watch path must leave it (children not applied for this generation) or it already
    says so."""
    meta = policy.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return None
    generation = _int(meta.get("generation")) or 1
    status = policy.get("status") or {}
    previous = [dict(c) for c in status.get("conditions") or [] if isinstance(c, Mapping)]
    reconciled = _condition(previous, RECONCILED)
    if (
        reconciled is None
        or reconciled.get("status") != "True"
        or reconciled.get("observedGeneration") != generation
    ):
        return None
    conditions = set_ready(previous, readiness, generation=generation)
    halted = readiness.halted
    unchanged = _comparable(_condition(previous, READY)) == _comparable(
        _condition(conditions, READY)
    )
    if unchanged and status.get("halted") is halted:
        return None
    return {"halted": halted, "conditions": conditions}
