"""Threat: plan-fingerprint mismatch -- the executed operation, plan or policy differs from the
one the reviewer approved."""

from __future__ import annotations

from typing import Any

import pytest

from agentsafe.executor.canonical import sha256_digest
from agentsafe.executor.plans import AgentSafetyError, dry_run_agent_plan, issue_agent_approval

from . import support as s
from .conftest import World


async def _exec_code(world: World, **overrides: Any) -> str:
    with pytest.raises(AgentSafetyError) as caught:
        await world.execute(**overrides)
    assert world.executor.calls == []
    return caught.value.code


def test_operation_digest_recomputed_from_visible_fields() -> None:
    forged = s.step()
    forged["fields"] = ["OBJECTID", "severity"]  # the claimed digest still names old fields
    with pytest.raises(AgentSafetyError) as caught:
        dry_run_agent_plan(s.plan(forged), s.policy(), now=s.NOW)
    assert caught.value.code == "PLAN_OPERATION_DIGEST_MISMATCH"
    forged = s.step()
    forged["queryPlanFingerprint"] = sha256_digest("another plan")
    with pytest.raises(AgentSafetyError) as caught:
        dry_run_agent_plan(s.plan(forged), s.policy(), now=s.NOW)
    assert caught.value.code == "PLAN_OPERATION_DIGEST_MISMATCH"


async def test_operation_with_other_parameters(world: World) -> None:
    op = s.operation(parameters={"where": "1 = 1", "limit": 50, "step": "query-incidents"})
    assert await _exec_code(world, operation=op) == "OPERATION_MISMATCH"


async def test_operation_with_other_fingerprint_fields_or_source(world: World) -> None:
    for op in (
        s.operation(queryPlanFingerprint=sha256_digest("other")),
        s.operation(fields=["OBJECTID", "status", "severity"]),
        s.operation(fields=["status", "OBJECTID"]),
        s.operation(sourceId="payments"),
        s.operation(tool="query-all"),
    ):
        assert await _exec_code(world, operation=op) == "OPERATION_MISMATCH"


async def test_dry_run_altered_after_approval(world: World) -> None:
    dry = s.deep(world.dry_run)
    dry["steps"][0]["maxRows"] = 500
    assert await _exec_code(world, dry_run=dry) == "DRY_RUN_MISMATCH"
    dry = s.deep(world.dry_run)
    dry["plan"]["steps"][0]["fields"] = ["OBJECTID"]
    assert await _exec_code(world, dry_run=dry) == "DRY_RUN_MISMATCH"


async def test_policy_changed_after_approval(world: World) -> None:
    wider = s.policy(maxRows=499)
    assert await _exec_code(world, policy=wider) == "POLICY_DIGEST_MISMATCH"


async def test_approval_for_another_plan(world: World) -> None:
    other_dry = dry_run_agent_plan(s.plan(id="plan-2"), world.policy, now=s.NOW)
    other = await issue_agent_approval(
        other_dry, world.policy, s.request(), world.approver, now=s.NOW, max_clock_skew_ms=0
    )
    assert await _exec_code(world, approval=other) == "APPROVAL_BINDING_MISMATCH"


async def test_unknown_step(world: World) -> None:
    assert await _exec_code(world, step_id="query-payments") == "STEP_UNKNOWN"


async def test_source_context_drift(world: World) -> None:
    for ctx, code in (
        (s.context(schemaVersion="schema-8"), "CONTEXT_MISMATCH"),
        (s.context(authorizationScope=["incidents:list"]), "CONTEXT_MISMATCH"),
        (s.context(observedAt="2026-07-10T19:58:59.000Z"), "CONTEXT_STALE"),
        ({"sources": {}}, "CONTEXT_MISMATCH"),
    ):
        assert await _exec_code(world, context=ctx) == code
