"""Conditions (``conditions.py``): set through the model, read back through it."""

from __future__ import annotations

from typing import Any

from agentsafe.operator.conditions import set_condition, spec_invalid_status, stored_conditions
from agentsafe.operator.models import (
    AgentPolicyStatus,
    ConditionReason,
    ConditionType,
    HaltSwitchStatus,
)

EARLIER = "2026-01-01T00:00:00Z"
LATER = "2026-01-02T00:00:00Z"


def _stored(*conditions: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"generation": 3}, "status": {"conditions": list(conditions)}}


READY_FALSE = {
    "type": "Ready",
    "status": "False",
    "reason": "ExecutorsNotReady",
    "message": "0/1 ready",
    "lastTransitionTime": EARLIER,
    "observedGeneration": 2,
}


def test_a_condition_that_does_not_validate_is_dropped_when_read_back() -> None:
    broken = {"type": "Ready", "status": "Maybe", "reason": "x", "lastTransitionTime": EARLIER}
    (kept,) = stored_conditions(_stored(READY_FALSE, broken))
    assert kept.wire() == READY_FALSE


def test_the_transition_time_moves_only_with_the_status() -> None:
    previous = stored_conditions(_stored(READY_FALSE))
    same = set_condition(
        previous,
        type=ConditionType.READY,
        status=False,
        reason=ConditionReason.EXECUTORS_NOT_READY,
        message="1/2 ready",
        generation=3,
        now=LATER,
    )
    moved = set_condition(
        previous,
        type=ConditionType.READY,
        status=True,
        reason=ConditionReason.EXECUTORS_READY,
        message="2/2 ready",
        generation=3,
        now=LATER,
    )
    assert [c.wire()["lastTransitionTime"] for c in (*same, *moved)] == [EARLIER, LATER]
    assert same[0].wire()["observedGeneration"] == 3


def test_conditions_are_kept_in_type_order_and_others_carried_over() -> None:
    conditions = set_condition(
        stored_conditions(_stored(READY_FALSE)),
        type=ConditionType.RECONCILED,
        status=None,
        reason=ConditionReason.APPLIED,
        message="m" * 40000,
        generation=None,
        now=LATER,
    )
    ready, reconciled = (c.wire() for c in conditions)
    assert ready == READY_FALSE
    assert (reconciled["type"], reconciled["status"], len(reconciled["message"])) == (
        "Reconciled",
        "Unknown",
        32768,
    )
    assert "observedGeneration" not in reconciled


def test_spec_invalid_is_a_merge_patch_of_two_fields_for_every_kind() -> None:
    for model in (AgentPolicyStatus, HaltSwitchStatus):
        patch = spec_invalid_status(model, _stored(READY_FALSE), "spec.x: bad").patch()
        assert set(patch) == {"observedGeneration", "conditions"}
        (ready,) = patch["conditions"]
        assert (ready["status"], ready["reason"], ready["observedGeneration"]) == (
            "False",
            "SpecInvalid",
            3,
        )
        assert ready["lastTransitionTime"] == EARLIER  # it was already False
