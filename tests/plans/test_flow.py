"""The whole boundary end to end: dry run, approval, execution, receipt verification."""

from __future__ import annotations

import pytest

from agentsafe.executor.plans import (
    AgentSafetyError,
    FrozenDict,
    envelope_digest,
    issue_agent_execution_receipt,
    thaw,
    verify_agent_execution_receipt,
    verify_agent_step_authorization,
)

from . import support as s
from .conftest import World


def test_dry_run_budget_and_identity(world: World) -> None:
    dry = world.dry_run
    assert type(dry) is FrozenDict
    assert thaw(dry["budget"]) == {
        "steps": 1,
        "maxRows": 200,
        "maxBytes": 100_000,
        "effects": ["read"],
    }
    assert dry["steps"][0]["operationDigest"] == s.step()["operationDigest"]
    assert dry["plan"]["steps"][0]["source"]["citations"] == (
        "https://data.example.test/incidents/open",
    )
    with pytest.raises(TypeError):
        dry["version"] = "x"  # type: ignore[index]


async def test_execute_returns_value_and_verifiable_receipt(world: World) -> None:
    result = await world.execute()
    assert thaw(result.value) == [{"OBJECTID": 1, "status": "open"}]
    assert result.rows == 1
    assert world.audit.kinds() == ["agent_plan_step.started", "agent_plan_step.completed"]
    assert world.executor.calls[0].max_rows == 200
    verified = await verify_agent_execution_receipt(result.receipt, **world.verify_kwargs())
    assert verified["outcome"] == "succeeded"
    assert verified["receiptDigest"] == result.receipt_digest == envelope_digest(result.receipt)
    completed = world.audit.events[1]
    assert completed["outcome"] == "succeeded"
    assert completed["receiptDigest"] == result.receipt_digest


async def test_narrowed_limits_reach_the_executor(store, approver, receipt_signer) -> None:
    w = World(store, approver, receipt_signer)
    await w.approve(maxRows=10, maxBytes=5_000)
    auth = await verify_agent_step_authorization(
        dry_run=w.dry_run,
        policy=w.policy,
        approval=w.approval,
        verifier=approver.verifier(),
        step_id="query-incidents",
        context=s.context(),
        now=s.NOW,
        max_clock_skew_ms=0,
        operation=s.operation(),
    )
    assert (auth["maxRows"], auth["maxBytes"]) == (10, 5_000)
    await w.execute()
    assert (w.executor.calls[0].max_rows, w.executor.calls[0].max_bytes) == (10, 5_000)


async def test_receipt_verifies_after_approval_expiry(world: World) -> None:
    result = await world.execute()
    world.clock.advance(3600)  # the approval expired long ago; the receipt stays verifiable
    verified = await verify_agent_execution_receipt(result.receipt, **world.verify_kwargs())
    assert verified["stepId"] == "query-incidents"


async def test_standalone_receipt_issue_requires_a_real_consumption(world: World) -> None:
    record = await world.store.consume(
        "agentsafe.plan-step",
        "sha256:" + "0" * 64 + "/query-incidents",
        binding={"x": 1},
        now=s.NOW_S,
    )
    assert record is not None
    from agentsafe.executor.plans.receipts import consumption_json

    with pytest.raises(AgentSafetyError) as caught:
        await issue_agent_execution_receipt(
            dry_run=world.dry_run,
            policy=world.policy,
            approval=world.approval,
            approval_verifier=world.approver.verifier(),
            context=s.context(),
            step_id="query-incidents",
            operation=s.operation(),
            consumption=consumption_json(record),
            use_verifier=world.store,
            evidence={
                "outcome": "succeeded",
                "rows": 1,
                "bytes": 10,
                "resultDigest": "sha256:" + "1" * 64,
            },
            execution_id="e-1",
            signer=world.receipt_signer,
            now=s.NOW,
            max_clock_skew_ms=0,
        )
    assert caught.value.code == "CONSUMPTION_MISMATCH"
