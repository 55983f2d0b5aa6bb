"""An AgentPolicy's ``Ready`` condition from its executor StatefulSet: the one source of truth.

Two paths write ``Ready``, and both decide it here:

- the reconcile (create/update/resume and the drift timer, ``reconcile.reconcile_policy``),
  right after it applied the children;
- the StatefulSet watch and the HaltSwitch enforcement (:func:`refresh_ready`, called by
  ``handlers.statefulset_handler`` and ``halt.enforce_halt``), which only recompute ``Ready``
  (and ``halted``, which ``Ready`` reports) and never render or apply.

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

:func:`refresh_ready` is the watch path's I/O: it reads the policy, its StatefulSet and the
HaltSwitches, patches the status with the policy's ``resourceVersion`` (a 409 reads everything
again, up to :data:`READY_PATCH_ATTEMPTS` times) and posts an Event when ``Ready`` moved
(:func:`ready_moved`).

Callers: ``reconcile.py``, ``halt.py``, ``handlers.py``, the tests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from pydantic import ValidationError

from .conditions import set_condition, stored_conditions
from .kubeapi import ApiError
from .models import (
    API_VERSION,
    AgentPolicySpec,
    AgentPolicyStatus,
    Condition,
    ConditionReason,
    ConditionStatus,
    ConditionType,
)
from .render import names
from .render.halt import switches_halting
from .runtime import EventType, Runtime, policy_ref

__all__ = [
    "READY_PATCH_ATTEMPTS",
    "Owner",
    "Readiness",
    "executor_readiness",
    "owning_policy",
    "readiness_status",
    "ready_moved",
    "refresh_ready",
    "set_ready",
]


@dataclass(frozen=True)
class Readiness:
    """What the ``Ready`` condition says: status, reason and message."""

    ready: bool
    reason: ConditionReason
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
        return Readiness(
            False, ConditionReason.HALTED, "a HaltSwitch halts this policy's executors", halted=True
        )
    if statefulset is None:
        return Readiness(
            False, ConditionReason.EXECUTORS_NOT_READY, "the executor StatefulSet does not exist"
        )
    meta = statefulset.get("metadata") or {}
    status = statefulset.get("status") or {}
    generation = _int(meta.get("generation"))
    observed = _int(status.get("observedGeneration"))
    if generation is not None and (observed is None or observed < generation):
        return Readiness(
            False,
            ConditionReason.EXECUTORS_NOT_READY,
            f"StatefulSet generation {generation} not yet observed by its controller",
        )
    ready = _int(status.get("readyReplicas")) or 0  # omitted when zero
    if ready < desired_replicas:
        return Readiness(
            False, ConditionReason.EXECUTORS_NOT_READY, f"{ready}/{desired_replicas} ready"
        )
    updated = _int(status.get("updatedReplicas")) or 0
    if updated < desired_replicas:
        return Readiness(
            False,
            ConditionReason.EXECUTORS_NOT_READY,
            f"rollout in progress: {updated}/{desired_replicas} updated",
        )
    current, update = status.get("currentRevision"), status.get("updateRevision")
    if current and update and current != update:
        return Readiness(
            False,
            ConditionReason.EXECUTORS_NOT_READY,
            f"rollout in progress: revision {current} -> {update}",
        )
    return Readiness(True, ConditionReason.EXECUTORS_READY, f"{ready}/{desired_replicas} ready")


def set_ready(
    conditions: Sequence[Condition], readiness: Readiness, *, generation: int
) -> list[Condition]:
    """``conditions`` with ``Ready`` set from ``readiness`` (see :func:`.set_condition`)."""
    return set_condition(
        conditions,
        type=ConditionType.READY,
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


def _condition(conditions: Sequence[Condition], type_: ConditionType) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)


def _comparable(condition: Condition | None) -> tuple[Any, ...]:
    if condition is None:
        return ()
    return (condition.status, condition.reason, condition.message, condition.observed_generation)


def readiness_status(policy: Mapping[str, Any], readiness: Readiness) -> AgentPolicyStatus | None:
    """The status patch that makes ``policy``'s ``Ready`` say ``readiness`` (``halted`` and
    ``conditions`` only), or ``None`` when the watch path must leave it (children not applied
    for this generation) or it already says so."""
    meta = policy.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return None
    generation = _int(meta.get("generation")) or 1
    previous = stored_conditions(policy)
    reconciled = _condition(previous, ConditionType.RECONCILED)
    if (
        reconciled is None
        or reconciled.status is not ConditionStatus.TRUE
        or reconciled.observed_generation != generation
    ):
        return None
    conditions = set_ready(previous, readiness, generation=generation)
    halted = readiness.halted
    unchanged = _comparable(_condition(previous, ConditionType.READY)) == _comparable(
        _condition(conditions, ConditionType.READY)
    )
    if unchanged and (policy.get("status") or {}).get("halted") is halted:
        return None
    return AgentPolicyStatus(halted=halted, conditions=conditions)


def ready_moved(body: Mapping[str, Any], status: AgentPolicyStatus) -> bool:
    """``Ready``'s status differs between the stored ``body`` and the new ``status``: the one
    change worth a Normal Event (the drift timer runs every minute)."""
    old = _condition(stored_conditions(body), ConditionType.READY)
    new = status.condition(ConditionType.READY)
    return (old.status if old else None) != (new.status if new else None)


READY_PATCH_ATTEMPTS: Final = 3
"""Optimistic-concurrency retries of one readiness patch (409: the policy changed meanwhile)."""


async def refresh_ready(
    rt: Runtime,
    namespace: str,
    name: str,
    *,
    uid: str | None = None,
    halted: bool | None = None,
) -> bool:
    """Recompute one AgentPolicy's ``Ready`` (and ``halted``) from its executor StatefulSet and
    the HaltSwitches, and patch only those status fields; ``True`` when it patched.

    Never renders or applies anything: a policy whose children were not applied for its
    current generation is left to its own handlers (see :func:`readiness_status`). ``uid``
    (from a child's owner reference) skips a policy recreated under the same name; ``halted``
    is given by the HaltSwitch enforcement, which already knows it. The patch carries the
    policy's ``resourceVersion``, so it never overwrites a status written meanwhile: on 409
    everything is read again. Other API refusals leave as ``ApiError``.
    """
    for attempt in range(READY_PATCH_ATTEMPTS):
        policy = await rt.kube.get("AgentPolicy", namespace, name)
        if policy is None or (uid is not None and policy["metadata"].get("uid") != uid):
            return False
        try:
            spec = AgentPolicySpec.model_validate(policy.get("spec") or {})
        except ValidationError:
            return False  # its own handler reports SpecInvalid
        ref = policy_ref(policy)
        if halted is None:
            switches = await rt.kube.list_objects("HaltSwitch", namespace)
            halting = bool(switches_halting(switches, policy["metadata"].get("labels")))
        else:
            halting = halted
        sts = await rt.kube.get("StatefulSet", namespace, names(ref).executor)
        readiness = executor_readiness(
            desired_replicas=spec.replicas, statefulset=sts, halted=halting
        )
        status = readiness_status(policy, readiness)
        if status is None:
            return False
        try:
            await rt.kube.patch_status(
                "AgentPolicy",
                namespace,
                name,
                status.patch(),
                resource_version=policy["metadata"].get("resourceVersion"),
            )
        except ApiError as exc:
            if exc.status == 409 and attempt + 1 < READY_PATCH_ATTEMPTS:
                continue
            raise
        if ready_moved(policy, status):
            rt.events.post(
                policy,
                type=EventType.NORMAL if readiness.ready else EventType.WARNING,
                reason=readiness.reason,
                message=readiness.message,
            )
        return True
    return False  # pragma: no cover - the loop returns or raises
