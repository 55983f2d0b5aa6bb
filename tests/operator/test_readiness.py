"""The Ready decision (``readiness.py``): every transition, pure, no API.

:func:`executor_readiness` is what both the reconcile and the StatefulSet watch decide with;
:func:`readiness_status` is the watch path's status patch (or nothing).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from agentsafe.operator.models import ConditionReason
from agentsafe.operator.readiness import (
    Owner,
    Readiness,
    executor_readiness,
    owning_policy,
    readiness_status,
    set_ready,
)

EARLIER = "2026-01-01T00:00:00Z"


def _sts(
    *,
    generation: int = 3,
    observed: int | None = 3,
    ready: int | None = 1,
    updated: int | None = 1,
    current: str | None = "rev-a",
    update: str | None = "rev-a",
    spec_replicas: int = 1,
) -> dict[str, Any]:
    status: dict[str, Any] = {"replicas": spec_replicas}
    for key, value in [
        ("observedGeneration", observed),
        ("readyReplicas", ready),
        ("updatedReplicas", updated),
        ("currentRevision", current),
        ("updateRevision", update),
    ]:
        if value is not None:
            status[key] = value
    return {
        "metadata": {"name": "payouts-executor", "generation": generation},
        "spec": {"replicas": spec_replicas},
        "status": status,
    }


NOT_READY = "ExecutorsNotReady"


@pytest.mark.parametrize(
    ("statefulset", "desired", "expected"),
    [
        (None, 1, (False, NOT_READY, "the executor StatefulSet does not exist")),
        (_sts(), 1, (True, "ExecutorsReady", "1/1 ready")),
        (_sts(ready=3, updated=3, spec_replicas=3), 3, (True, "ExecutorsReady", "3/3 ready")),
        # readyReplicas is omitted by the API server when zero.
        (_sts(ready=None), 1, (False, NOT_READY, "0/1 ready")),
        (_sts(ready=1, updated=1, spec_replicas=2), 2, (False, NOT_READY, "1/2 ready")),
        # The controller has not seen the latest spec: its counts describe the old one.
        (
            _sts(observed=2),
            1,
            (False, NOT_READY, "StatefulSet generation 3 not yet observed by its controller"),
        ),
        (
            _sts(observed=None),
            1,
            (False, NOT_READY, "StatefulSet generation 3 not yet observed by its controller"),
        ),
        # Pods ready but not all at the new revision: a rollout is under way.
        (_sts(updated=0), 1, (False, NOT_READY, "rollout in progress: 0/1 updated")),
        (_sts(updated=None), 1, (False, NOT_READY, "rollout in progress: 0/1 updated")),
        (
            _sts(update="rev-b"),
            1,
            (False, NOT_READY, "rollout in progress: revision rev-a -> rev-b"),
        ),
        # Revisions are compared only when the controller reports both.
        (_sts(current=None, update=None), 1, (True, "ExecutorsReady", "1/1 ready")),
        # Scaled down by hand: the policy's count is the one that matters.
        (_sts(ready=None, updated=None, spec_replicas=0), 1, (False, NOT_READY, "0/1 ready")),
        # A boolean is not a count.
        (_sts(ready=True), 1, (False, NOT_READY, "0/1 ready")),
    ],
)
def test_executor_readiness(
    statefulset: dict[str, Any] | None, desired: int, expected: tuple[bool, str, str]
) -> None:
    readiness = executor_readiness(desired_replicas=desired, statefulset=statefulset, halted=False)
    assert (readiness.ready, readiness.reason, readiness.message) == expected
    assert readiness.halted is False


@pytest.mark.parametrize("statefulset", [None, _sts(), _sts(ready=None), _sts(observed=1)])
def test_halted_wins_over_every_statefulset_state(statefulset: dict[str, Any] | None) -> None:
    readiness = executor_readiness(desired_replicas=1, statefulset=statefulset, halted=True)
    assert (readiness.ready, readiness.reason, readiness.halted) == (False, "Halted", True)


# --------------------------------------------------------------------------------------------
# Owner references


def _ref(**overrides: Any) -> dict[str, Any]:
    ref = {
        "apiVersion": "agentsafe.io/v1alpha1",
        "kind": "AgentPolicy",
        "name": "payouts",
        "uid": "u-1",
        "controller": True,
    }
    ref.update(overrides)
    return ref


@pytest.mark.parametrize(
    ("refs", "expected"),
    [
        ([_ref()], Owner("payouts", "u-1")),
        ([_ref(controller=False), _ref(name="other", uid="u-2")], Owner("other", "u-2")),
        ([_ref(controller=False)], None),
        ([_ref(kind="Deployment")], None),
        ([_ref(apiVersion="agentsafe.io/v2")], None),
        ([_ref(uid="")], None),
        ([], None),
    ],
)
def test_owning_policy(refs: list[dict[str, Any]], expected: Owner | None) -> None:
    assert owning_policy({"metadata": {"ownerReferences": refs}}) == expected


def test_no_owner_references_is_no_owner() -> None:
    assert owning_policy({"metadata": {"name": "x"}}) is None
    assert owning_policy({}) is None


# --------------------------------------------------------------------------------------------
# The watch path's status patch


def _condition(
    type_: str, status: str, reason: str, *, generation: int, message: str = "m"
) -> dict[str, Any]:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": EARLIER,
        "observedGeneration": generation,
    }


def _policy(
    *,
    generation: int = 2,
    reconciled: tuple[str, str, int] | None = ("True", "Applied", 2),
    ready: tuple[str, str, str] = ("False", NOT_READY, "0/1 ready"),
    halted: bool = False,
) -> dict[str, Any]:
    conditions = [_condition("Ready", ready[0], ready[1], generation=2, message=ready[2])]
    if reconciled is not None:
        status, reason, observed = reconciled
        conditions.append(_condition("Reconciled", status, reason, generation=observed))
    return {
        "metadata": {"name": "payouts", "namespace": "payments", "generation": generation},
        "status": {"observedGeneration": 2, "halted": halted, "conditions": conditions},
    }


READY = Readiness(True, ConditionReason.EXECUTORS_READY, "1/1 ready")
NOT_YET = Readiness(False, ConditionReason.EXECUTORS_NOT_READY, "0/1 ready")
HALTED = Readiness(
    False, ConditionReason.HALTED, "a HaltSwitch halts this policy's executors", halted=True
)


def _patch(policy: dict[str, Any], readiness: Readiness) -> dict[str, Any] | None:
    """The watch path's status patch as the API server receives it."""
    status = readiness_status(policy, readiness)
    return None if status is None else status.patch()


def _by_type(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def test_not_ready_to_ready_moves_the_transition_time() -> None:
    policy = _policy()
    patch = _patch(policy, READY)
    assert patch is not None
    assert set(patch) == {"halted", "conditions"}  # nothing else of the status is written
    assert patch["halted"] is False
    ready = _by_type(patch)["Ready"]
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "True",
        "ExecutorsReady",
        "1/1 ready",
    )
    assert ready["observedGeneration"] == 2
    assert ready["lastTransitionTime"] != EARLIER
    # Every other condition is carried over as it was.
    assert _by_type(patch)["Reconciled"] == _by_type(policy["status"])["Reconciled"]


def test_ready_to_not_ready_and_back() -> None:
    ready_policy = _policy(ready=("True", "ExecutorsReady", "1/1 ready"))
    patch = _patch(ready_policy, NOT_YET)
    assert patch is not None
    ready = _by_type(patch)["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", NOT_READY)
    assert ready["lastTransitionTime"] != EARLIER


def test_a_new_message_with_the_same_status_keeps_the_transition_time() -> None:
    policy = _policy(ready=("False", NOT_READY, "0/2 ready"))
    patch = _patch(policy, Readiness(False, ConditionReason.EXECUTORS_NOT_READY, "1/2 ready"))
    assert patch is not None
    ready = _by_type(patch)["Ready"]
    assert ready["message"] == "1/2 ready"
    assert ready["lastTransitionTime"] == EARLIER


def test_nothing_to_change_is_no_patch() -> None:
    assert _patch(_policy(), NOT_YET) is None
    ready_policy = _policy(ready=("True", "ExecutorsReady", "1/1 ready"))
    assert _patch(ready_policy, READY) is None


def test_halt_and_release() -> None:
    ready_policy = _policy(ready=("True", "ExecutorsReady", "1/1 ready"))
    patch = _patch(ready_policy, HALTED)
    assert patch is not None
    assert patch["halted"] is True
    assert (_by_type(patch)["Ready"]["status"], _by_type(patch)["Ready"]["reason"]) == (
        "False",
        "Halted",
    )
    halted_policy = copy.deepcopy(ready_policy)
    halted_policy["status"].update(patch)
    assert _patch(halted_policy, HALTED) is None
    released = _patch(halted_policy, READY)
    assert released is not None
    assert released["halted"] is False
    assert _by_type(released)["Ready"]["reason"] == "ExecutorsReady"


def test_a_stale_halted_field_alone_is_patched() -> None:
    policy = _policy(halted=True)
    assert _patch(policy, NOT_YET) == {
        "halted": False,
        "conditions": policy["status"]["conditions"],
    }


@pytest.mark.parametrize(
    "policy",
    [
        # Never reconciled: no status at all.
        {"metadata": {"name": "payouts", "generation": 1}},
        # The render failed: Ready keeps its own reason (PolicyInvalid, SecretMissing, ...).
        _policy(
            reconciled=("False", "PolicyInvalid", 2), ready=("False", "PolicyInvalid", "bad CEL")
        ),
        # A new generation its update handler has not applied yet.
        _policy(generation=3),
        _policy(reconciled=None),
    ],
)
def test_the_watch_leaves_a_policy_whose_children_are_not_current(policy: dict[str, Any]) -> None:
    assert _patch(policy, READY) is None
    assert _patch(policy, HALTED) is None


def test_a_policy_being_deleted_is_left_alone() -> None:
    policy = _policy()
    policy["metadata"]["deletionTimestamp"] = EARLIER
    assert _patch(policy, READY) is None


def test_set_ready_is_the_reconcile_paths_condition() -> None:
    conditions = set_ready([], READY, generation=4)
    (ready,) = (c.wire() for c in conditions)
    assert ready["type"] == "Ready"
    assert (ready["status"], ready["reason"], ready["observedGeneration"]) == (
        "True",
        "ExecutorsReady",
        4,
    )
