"""Approval time checks: clock skew, lifetime, not-yet-valid, expiry during and after a step."""

from __future__ import annotations

from typing import Any

import pytest

from agentsafe.executor.plans import AgentSafetyError, issue_agent_approval

from . import support as s
from .conftest import World


async def _issue_code(world: World, **request: Any) -> str:
    with pytest.raises(AgentSafetyError) as caught:
        await issue_agent_approval(
            world.dry_run,
            world.policy,
            s.request(**request),
            world.approver,
            now=s.NOW,
            max_clock_skew_ms=5_000,
        )
    return caught.value.code


async def test_issued_at_skew_at_and_past_the_limit(world: World) -> None:
    await issue_agent_approval(
        world.dry_run,
        world.policy,
        s.request(id="a-ok", issuedAt="2026-07-10T20:00:05.000Z"),
        world.approver,
        now=s.NOW,
        max_clock_skew_ms=5_000,
    )
    code = await _issue_code(world, issuedAt="2026-07-10T20:00:05.001Z")
    assert code == "APPROVAL_CLOCK_SKEW"


async def test_lifetime_at_and_past_the_policy(world: World) -> None:
    # default maxApprovalLifetimeMs is 15 minutes
    await issue_agent_approval(
        world.dry_run,
        world.policy,
        s.request(expiresAt="2026-07-10T20:15:00.000Z"),
        world.approver,
        now=s.NOW,
        max_clock_skew_ms=0,
    )
    assert await _issue_code(world, expiresAt="2026-07-10T20:15:00.001Z") == (
        "APPROVAL_LIFETIME_EXCEEDED"
    )
    assert await _issue_code(world, expiresAt=s.NOW) == "APPROVAL_REQUEST_INVALID"


async def test_skew_argument_bounded(world: World) -> None:
    with pytest.raises(AgentSafetyError) as caught:
        await issue_agent_approval(
            world.dry_run,
            world.policy,
            s.request(),
            world.approver,
            now=s.NOW,
            max_clock_skew_ms=300_001,
        )
    assert caught.value.code == "SKEW_INVALID"


async def test_expired_and_not_yet_valid_at_execution(world: World) -> None:
    world.clock.advance(-10)  # 10 s before issuedAt, beyond the 5 s skew
    with pytest.raises(AgentSafetyError) as caught:
        await world.execute(context=s.context(observedAt="2026-07-10T19:59:40.000Z"))
    assert caught.value.code == "APPROVAL_NOT_YET_VALID"
    world.clock.advance(10 + 300)  # exactly expiresAt
    with pytest.raises(AgentSafetyError) as caught:
        await world.execute(context=s.context(observedAt="2026-07-10T20:04:30.000Z"))
    assert caught.value.code == "APPROVAL_EXPIRED"
    assert world.executor.calls == []


async def test_expiry_during_the_step_yields_no_receipt_but_a_completed_event(
    world: World,
) -> None:
    class Slow(s.RecordingExecutor):
        async def execute(self, request: Any) -> Any:
            world.clock.advance(600)  # the step outlives the approval
            return await super().execute(request)

    with pytest.raises(AgentSafetyError) as caught:
        await world.execute(executor=Slow())
    assert caught.value.code == "RECEIPT_REFUSED"
    assert world.audit.kinds() == ["agent_plan_step.started", "agent_plan_step.completed"]
    assert world.audit.events[1]["outcome"] == "failed"
    assert world.audit.events[1]["errorCode"] == "APPROVAL_EXPIRED"
