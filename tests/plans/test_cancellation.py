"""Cancellation at every await point: asyncio cancellation and the abort event.

Each host object below waits on a gate the test controls; the test cancels there and checks that
no approval or receipt came back, what ran, and what the audit shows."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from agentsafe.executor.plans import (
    AgentSafetyAborted,
    issue_agent_approval,
    verify_agent_execution_receipt,
)

from . import support as s
from .conftest import World

DEADLINE = 30.0


@dataclass
class Gate:
    """Blocks the first call through it until the test decides."""

    reached: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    used: bool = False

    async def wait(self) -> None:
        if self.used:
            return
        self.used = True
        self.reached.set()
        await self.release.wait()


class GatedVerifier:
    def __init__(self, inner: Any, gate: Gate) -> None:
        self.algorithm, self.key_id = inner.algorithm, inner.key_id
        self._inner, self._gate = inner, gate

    async def verify(self, message: bytes, signature: bytes) -> bool:
        await self._gate.wait()
        return bool(await self._inner.verify(message, signature))


class GatedSigner:
    def __init__(self, inner: Any, gate: Gate) -> None:
        self.algorithm, self.key_id = inner.algorithm, inner.key_id
        self._inner, self._gate = inner, gate

    async def sign(self, message: bytes) -> bytes:
        await self._gate.wait()
        return bytes(await self._inner.sign(message))


class GatedStore:
    def __init__(self, inner: Any, gate: Gate, method: str) -> None:
        self._inner, self._gate, self._method = inner, gate, method

    async def consume(self, *args: Any, **kwargs: Any) -> Any:
        if self._method == "consume":
            await self._gate.wait()
        return await self._inner.consume(*args, **kwargs)

    async def verify_consumption(self, record: Any) -> bool:
        if self._method == "verify_consumption":
            await self._gate.wait()
        return bool(await self._inner.verify_consumption(record))


class GatedAudit(s.MemoryAudit):
    def __init__(self, gate: Gate, event: str) -> None:
        super().__init__()
        self._gate, self._event = gate, event

    async def append(self, event: Any) -> None:
        if event["event"] == self._event:
            await self._gate.wait()
        await super().append(event)


class GatedExecutor(s.RecordingExecutor):
    def __init__(self, gate: Gate) -> None:
        super().__init__()
        self._gate = gate

    async def execute(self, request: Any) -> Any:
        self.calls.append(request)
        await self._gate.wait()
        return s.StepResult(value=[], rows=0)


POINTS = [
    "approval_verifier",
    "consume",
    "verify_consumption",
    "audit_started",
    "executor",
    "receipt_signer",
    "audit_completed",
]


def _gated(world: World, point: str, gate: Gate) -> dict[str, Any]:
    if point == "approval_verifier":
        return {"approval_verifier": GatedVerifier(world.approver.verifier(), gate)}
    if point in ("consume", "verify_consumption"):
        return {"use_consumer": GatedStore(world.store, gate, point)}
    if point == "audit_started":
        world.audit = GatedAudit(gate, "agent_plan_step.started")
        return {"audit_sink": world.audit}
    if point == "audit_completed":
        world.audit = GatedAudit(gate, "agent_plan_step.completed")
        return {"audit_sink": world.audit}
    if point == "executor":
        world.executor = GatedExecutor(gate)
        return {"executor": world.executor}
    assert point == "receipt_signer"
    return {"receipt_signer": GatedSigner(world.receipt_signer, gate)}


@pytest.mark.parametrize("mode", ["asyncio", "abort"])
@pytest.mark.parametrize("point", POINTS)
async def test_execute_cancelled_at(world: World, point: str, mode: str) -> None:
    gate = Gate()
    abort = asyncio.Event()
    overrides = _gated(world, point, gate)
    task = asyncio.create_task(world.execute(cancel=abort, **overrides))
    await asyncio.wait_for(gate.reached.wait(), DEADLINE)
    if mode == "asyncio":
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    else:
        abort.set()
        with pytest.raises(AgentSafetyAborted):
            await task

    kinds = world.audit.kinds()
    ran = point in ("executor", "receipt_signer", "audit_completed")
    assert len(world.executor.calls) == (1 if ran else 0)
    if ran:
        assert kinds == ["agent_plan_step.started", "agent_plan_step.completed"]
        completed = world.audit.events[-1]
        assert completed["outcome"] == "cancelled"
        assert completed["receiptDigest"] is None
    else:
        assert kinds == []
    # Was the approval spent? Only if the consumption happened before the cancellation.
    fresh = s.RecordingExecutor()
    if point == "approval_verifier" or point == "consume":
        await world.execute(executor=fresh, audit_sink=s.MemoryAudit())
        assert len(fresh.calls) == 1
    else:
        with pytest.raises(Exception) as caught:
            await world.execute(executor=fresh, audit_sink=s.MemoryAudit())
        assert getattr(caught.value, "code", None) == "APPROVAL_ALREADY_USED"
        assert fresh.calls == []


async def test_abort_already_set_is_checked_before_validation(world: World) -> None:
    abort = asyncio.Event()
    abort.set()
    with pytest.raises(AgentSafetyAborted):
        await world.execute(cancel=abort, dry_run="not even a dry run")
    with pytest.raises(AgentSafetyAborted):
        await issue_agent_approval(
            None, None, None, None, now=s.NOW, max_clock_skew_ms=0, cancel=abort
        )
    assert world.executor.calls == []


@pytest.mark.parametrize("mode", ["asyncio", "abort"])
async def test_approval_signing_cancelled(world: World, mode: str) -> None:
    gate = Gate()
    abort = asyncio.Event()
    task = asyncio.create_task(
        issue_agent_approval(
            world.dry_run,
            world.policy,
            s.request(),
            GatedSigner(world.approver, gate),
            now=s.NOW,
            max_clock_skew_ms=0,
            cancel=abort,
        )
    )
    await asyncio.wait_for(gate.reached.wait(), DEADLINE)
    if mode == "asyncio":
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    else:
        abort.set()
        with pytest.raises(AgentSafetyAborted):
            await task


async def test_abort_after_signing_returns_no_approval(world: World) -> None:
    abort = asyncio.Event()

    class SetsAbort:
        algorithm, key_id = world.approver.algorithm, world.approver.key_id

        async def sign(self, message: bytes) -> bytes:
            signature = await world.approver.sign(message)
            abort.set()  # the signature exists, but the caller aborted meanwhile
            return signature

    with pytest.raises(AgentSafetyAborted):
        await issue_agent_approval(
            world.dry_run,
            world.policy,
            s.request(),
            SetsAbort(),
            now=s.NOW,
            max_clock_skew_ms=0,
            cancel=abort,
        )


@pytest.mark.parametrize("which", ["receipt_verifier", "approval_verifier", "use_verifier"])
async def test_receipt_verification_cancelled(world: World, which: str) -> None:
    receipt = (await world.execute()).receipt
    gate = Gate()
    abort = asyncio.Event()
    if which == "use_verifier":
        override: Any = GatedStore(world.store, gate, "verify_consumption")
    elif which == "receipt_verifier":
        override = GatedVerifier(world.receipt_signer.verifier(), gate)
    else:
        override = GatedVerifier(world.approver.verifier(), gate)
    task = asyncio.create_task(
        verify_agent_execution_receipt(
            receipt, **world.verify_kwargs(**{which: override}), cancel=abort
        )
    )
    await asyncio.wait_for(gate.reached.wait(), DEADLINE)
    abort.set()
    with pytest.raises(AgentSafetyAborted):
        await task
