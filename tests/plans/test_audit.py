"""The audit contract: started before execution, completed after every outcome, pseudonymous
digests only, and a failed terminal append surfaces the signed receipt."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentsafe.executor.plans import AgentExecutionError, verify_agent_execution_receipt

from . import support as s
from .conftest import World

SECRETS = [
    "agent:triage",
    "example-provider",
    "example-model",
    "query-incidents",
    "incidents:read",
    "https://data.example.test",
    "status = 'open'",
    "reviewer@example.test",
    "execution-42",
    "City incident feed",
    "OBJECTID",
    "secret backend error text",
    "plan-1",
]


async def test_events_carry_no_raw_identity_parameters_results_or_secrets(world: World) -> None:
    result = await world.execute()
    text = json.dumps(world.audit.events)
    for secret in SECRETS:
        assert secret not in text, secret
    assert result.receipt["signature"] not in text
    assert result.receipt["payload"]["consumption"]["nonce"] not in text
    assert result.receipt["payload"]["consumption"]["token"] not in text
    started, completed = world.audit.events
    assert started["effect"] == "read"
    assert started["dataMode"] == "live"
    assert started["actorDigest"].startswith("sha256:")
    assert completed["useDigest"] == result.receipt["payload"]["useDigest"]


async def test_failure_is_audited_without_error_text(world: World) -> None:
    world.executor.fail = True
    with pytest.raises(AgentExecutionError) as caught:
        await world.execute()
    assert caught.value.code == "EXECUTOR_FAILED"
    assert "secret backend error text" not in str(caught.value)
    assert world.audit.kinds() == ["agent_plan_step.started", "agent_plan_step.completed"]
    assert world.audit.events[1]["outcome"] == "failed"
    assert world.audit.events[1]["errorCode"] == "EXECUTOR_FAILED"
    assert "secret backend error text" not in json.dumps(world.audit.events)


async def test_failed_terminal_audit_carries_the_signed_receipt(world: World) -> None:
    world.audit.fail_on = {"agent_plan_step.completed"}
    with pytest.raises(AgentExecutionError) as caught:
        await world.execute()
    assert caught.value.code == "AUDIT_COMPLETE_FAILED"
    verified = await verify_agent_execution_receipt(caught.value.receipt, **world.verify_kwargs())
    assert verified["outcome"] == "succeeded"
    assert world.audit.kinds() == ["agent_plan_step.started"]
    assert len(world.executor.calls) == 1


async def test_inputs_captured_before_the_first_await(world: World) -> None:
    operation = s.operation()
    ctx = s.context()
    kwargs = world.kwargs(operation=operation, context=ctx)
    # Start the call, let it reach its first await, then mutate everything it was given.
    running = asyncio.ensure_future(world.execute(**kwargs))
    await asyncio.sleep(0)
    operation["parameters"]["where"] = "1 = 1"
    ctx["sources"]["incidents"]["schemaVersion"] = "schema-8"
    world.executor.tool = "other"
    result = await running
    assert result.rows == 1
    assert world.executor.calls[0].parameters["where"] == "status = 'open'"
