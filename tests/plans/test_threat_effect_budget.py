"""Threat: effect-budget bypass -- more effects, rows, bytes, fields or steps than approved."""

from __future__ import annotations

from typing import Any

import pytest

from agentsafe.executor.plans import (
    AgentExecutionError,
    AgentSafetyError,
    dry_run_agent_plan,
    issue_agent_approval,
    verify_agent_execution_receipt,
)

from . import support as s
from .conftest import World


def _dry_code(plan: Any, policy: Any = None) -> str:
    with pytest.raises(AgentSafetyError) as caught:
        dry_run_agent_plan(plan, policy or s.policy(), now=s.NOW)
    return caught.value.code


def test_default_effect_allowlist_is_read_only() -> None:
    policy = s.policy()
    del policy["allowedEffects"]
    assert dry_run_agent_plan(s.plan(), policy, now=s.NOW)["budget"]["effects"] == ("read",)
    for effect in ("write", "publish", "share", "subscribe", "job"):
        assert _dry_code(s.plan(s.step(effect=effect)), policy) == "PLAN_EFFECT_NOT_ALLOWED"


def test_unknown_effect_and_tool() -> None:
    assert _dry_code(s.plan(s.step(effect="delete"))) == "PLAN_INVALID"
    assert _dry_code(s.plan(s.step(tool="shell"))) == "PLAN_TOOL_NOT_ALLOWED"


def test_rows_bytes_fields_steps_ceilings() -> None:
    assert _dry_code(s.plan(s.step(maxRows=501))) == "PLAN_LIMIT_EXCEEDED"
    assert _dry_code(s.plan(s.step(maxBytes=2_000_001))) == "PLAN_LIMIT_EXCEEDED"
    assert _dry_code(s.plan(s.step(fields=["OBJECTID", "secret"]))) == "PLAN_FIELD_NOT_ALLOWED"
    steps = [s.step(f"s{i}", maxRows=100) for i in range(5)]
    assert _dry_code(s.plan(*steps)) == "PLAN_LIMIT_EXCEEDED"  # 5 steps > maxSteps 4
    # each step within, the sum beyond: 3 x 200 rows > 500
    assert _dry_code(s.plan(*(s.step(f"s{i}") for i in range(3)))) == "PLAN_LIMIT_EXCEEDED"


async def _approve(world: World, dry_run: Any, **request: Any) -> str:
    with pytest.raises(AgentSafetyError) as caught:
        await issue_agent_approval(
            dry_run,
            world.policy,
            s.request(**request),
            world.approver,
            now=s.NOW,
            max_clock_skew_ms=5_000,
        )
    return caught.value.code


async def test_approval_may_narrow_but_never_widen(world: World) -> None:
    assert await _approve(world, world.dry_run, maxRows=201) == "APPROVAL_WIDENS"
    assert await _approve(world, world.dry_run, maxBytes=100_001) == "APPROVAL_WIDENS"
    step_limits = [{"stepId": "query-incidents", "maxRows": 1_000}]
    assert await _approve(world, world.dry_run, stepLimits=step_limits) == "APPROVAL_WIDENS"


async def test_multi_step_aggregate_narrowing_is_ambiguous(world: World) -> None:
    dry = dry_run_agent_plan(
        s.plan(s.step("a", maxRows=100), s.step("b", maxRows=100)), world.policy, now=s.NOW
    )
    assert await _approve(world, dry, maxRows=50) == "APPROVAL_AMBIGUOUS_NARROWING"
    assert await _approve(world, dry, maxBytes=50) == "APPROVAL_AMBIGUOUS_NARROWING"
    approval = await issue_agent_approval(
        dry,
        world.policy,
        s.request(stepLimits=[{"stepId": "b", "maxRows": 7}]),
        world.approver,
        now=s.NOW,
        max_clock_skew_ms=0,
    )
    rows = {a["stepId"]: a["maxRows"] for a in approval["payload"]["steps"]}
    assert rows == {"a": 100, "b": 7}
    bad = [{"stepId": "c", "maxRows": 1}]
    assert await _approve(world, dry, stepLimits=bad) == "STEP_UNKNOWN"


async def test_executor_for_another_effect_is_refused_before_consumption(world: World) -> None:
    world.executor.effect = "write"
    with pytest.raises(AgentSafetyError) as caught:
        await world.execute()
    assert caught.value.code == "EXECUTOR_MISMATCH"
    world.executor.effect = "read"
    world.executor.tool = "query-all"
    with pytest.raises(AgentSafetyError) as caught:
        await world.execute()
    assert caught.value.code == "EXECUTOR_MISMATCH"
    world.executor.tool = "query"
    await world.execute()  # nothing was consumed by the refusals
    assert len(world.executor.calls) == 1


async def test_result_over_approved_rows_or_bytes(store, approver, receipt_signer) -> None:
    w = World(store, approver, receipt_signer)
    await w.approve(maxRows=2, maxBytes=64)
    w.executor.rows = 3
    with pytest.raises(AgentExecutionError) as caught:
        await w.execute()
    assert caught.value.code == "RESULT_ROWS_EXCEEDED"
    receipt = caught.value.receipt
    assert receipt["payload"]["outcome"] == "failed"
    assert receipt["payload"]["resultDigest"] is None
    verified = await verify_agent_execution_receipt(receipt, **w.verify_kwargs())
    assert verified["errorCode"] == "RESULT_ROWS_EXCEEDED"

    w2 = World(store, approver, receipt_signer)
    await w2.approve(id="approval-43", maxBytes=64)
    w2.executor.value = [{"status": "x" * 100}]
    with pytest.raises(AgentExecutionError) as caught:
        await w2.execute()
    assert caught.value.code == "RESULT_BYTES_EXCEEDED"


async def test_uncounted_or_non_json_results_are_refused(store, approver, receipt_signer) -> None:
    for index, (value, rows, code) in enumerate(
        [
            ([1], None, "RESULT_UNCOUNTED"),
            ([1], True, "RESULT_UNCOUNTED"),
            ([1], -1, "RESULT_UNCOUNTED"),
            ({1, 2}, 1, "RESULT_INVALID"),
            ([float("nan")], 1, "RESULT_INVALID"),
        ]
    ):
        w = World(store, approver, receipt_signer)
        await w.approve(id=f"approval-{index}")
        w.executor.value = value
        w.executor.rows = rows
        with pytest.raises(AgentExecutionError) as caught:
            await w.execute()
        assert caught.value.code == code


async def test_operation_parameters_over_the_policy_limits(world: World) -> None:
    params = {"blob": "x" * 20_000}
    with pytest.raises(AgentSafetyError) as caught:
        await world.execute(operation=s.operation(parameters=params))
    assert caught.value.code == "OPERATION_PARAMETERS_EXCEEDED"


async def test_forged_evidence_beyond_the_approval_cannot_be_receipted(world: World) -> None:
    result = await world.execute()
    receipt = s.deep(result.receipt)
    receipt["payload"]["rows"] = 10_000
    with pytest.raises(AgentSafetyError):
        await verify_agent_execution_receipt(receipt, **world.verify_kwargs())
