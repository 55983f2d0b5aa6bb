"""The attempt on its own (``lifecycle/attempt.py``): claim, journal, dispatch once, finalize.

Every collaborator is the real one (the local authority over the example policy, the SQLite use
store, the attempt journal in a temporary directory, the dispatch registry, the host ceilings)
except the handler, which is scripted so a test can choose how the provider call ends.
"""

from __future__ import annotations

import copy
import errno
import json
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentsafe.executor.clock import ManualClock
from agentsafe.executor.dispatch.seam import (
    Dispatch,
    ExecutionContext,
    Outcome,
    ReconcileResult,
    ReconcileStatus,
    Registry,
)
from agentsafe.executor.egress.transport import TransportError
from agentsafe.executor.events import MemorySink, Streams
from agentsafe.executor.grants import SigningKey
from agentsafe.executor.intent import CapturedIntent
from agentsafe.executor.lifecycle.attempt import Attempt, Progress, Unreported
from agentsafe.executor.lifecycle.ceilings import HostCeilings
from agentsafe.executor.policy.authority import (
    RECOVERY_TYP,
    Claim,
    Decision,
    LocalAuthority,
    Verdict,
)
from agentsafe.executor.policy.policy import compile_policy, parse_policy
from agentsafe.executor.state import journal as journal_module
from agentsafe.executor.state.journal import AttemptJournal
from agentsafe.executor.state.usestore import SQLiteUseStore
from tests.support.intents import PAYOUT_PRINCIPAL, make_intent

REPO = Path(__file__).resolve().parents[2]
EXAMPLE: dict[str, Any] = yaml.safe_load((REPO / "examples" / "policy.yaml").read_text())
PROPOSER = PAYOUT_PRINCIPAL


class ScriptedHandler:
    """The one stand-in: a provider call that ends as the test says, counted."""

    parameters_schema: Mapping[str, Any] = EXAMPLE["actions"][0]["parameters"]

    def __init__(self, script: str = "ok") -> None:
        self.script = script
        self.sent = 0

    async def execute(self, ctx: ExecutionContext, dispatch: Dispatch) -> Mapping[str, Any]:
        async def send(key: str) -> str:
            self.sent += 1
            if self.script == "lost":
                raise TransportError("EGRESS_TIMEOUT", True)
            return key

        await dispatch.run(send)
        return {"provider_reference": "ref-1", "effect_receipt": "receipt-jws"}

    async def reconcile(self, idempotency_key: str, *, intent_hash: str) -> ReconcileResult:
        return ReconcileResult(ReconcileStatus.UNKNOWN)


@dataclass
class Counted(Unreported):
    """The attempt's reporter, keeping only the outcomes it counts."""

    counted: list[Outcome]

    def outcome(self, outcome: Outcome) -> None:
        self.counted.append(outcome)


@dataclass
class World:
    clock: ManualClock
    authority: LocalAuthority
    journal: AttemptJournal
    handler: ScriptedHandler
    streams: Streams
    counted: list[Outcome] = field(default_factory=list)

    def attempt(self, *, ceilings: HostCeilings | None = None) -> Attempt:
        registry = Registry()
        registry.register("forward_request", self.handler)
        registry.seal()
        return Attempt(
            authority=self.authority,
            signer=self.authority,
            registry=registry,
            journal=self.journal,
            ceilings=ceilings,
            streams=self.streams,
            clock=self.clock,
            report=Counted(self.counted),
        )

    def intent(self, amount: int = 4200) -> CapturedIntent:
        return make_intent(
            now=self.clock.now(),
            parameters={"amountMinor": amount, "currency": "EUR"},
            idempotency_key=str(uuid.uuid4()),
            ttl_seconds=120,
        )

    async def allow(self, intent: CapturedIntent) -> Decision:
        decision = await self.authority.evaluate(intent, principal=PROPOSER)
        assert decision.verdict is Verdict.ALLOW
        return decision

    @property
    def evidence(self) -> MemorySink:
        sink = self.streams.evidence
        assert isinstance(sink, MemorySink)
        return sink

    def events(self) -> list[str]:
        return [event for event, _ in self.evidence.events]


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    clock = ManualClock()
    store = await SQLiteUseStore.open(tmp_path / "state", clock=clock)
    journal = await AttemptJournal.open(tmp_path / "journal", retain_days=1, clock=clock)
    policy = compile_policy(
        parse_policy(copy.deepcopy(EXAMPLE)), registered_handlers={"forward_request"}
    )
    authority = LocalAuthority(policy, keys=SigningKey.generate(), store=store, clock=clock)
    yield World(clock, authority, journal, ScriptedHandler(), Streams.memory())
    await journal.close()
    await store.close()


def common(intent: CapturedIntent, decision: Decision) -> dict[str, Any]:
    return {
        "mode": "ENFORCEMENT",
        "intent_id": intent.intent_id,
        "intent_hash": intent.intent_hash,
        "verdict": decision.verdict.value,
        "decision_id": decision.decision_id,
        "dossier_id": decision.dossier_id,
    }


async def run(world: World, attempt: Attempt, intent: CapturedIntent, decision: Decision) -> Any:
    progress = Progress()
    answer = await attempt.run(
        intent=intent,
        principal=PROPOSER,
        decision=decision,
        handler="forward_request",
        common=common(intent, decision),
        progress=progress,
    )
    return answer, progress


async def test_an_allow_runs_once_and_closes_the_attempt(world: World) -> None:
    intent = world.intent()
    decision = await world.allow(intent)
    answer, progress = await run(world, world.attempt(), intent, decision)
    assert progress.started
    assert answer.status == 200
    body = answer.body
    assert (body["outcome"], body["executed"], body["fail_closed"]) == ("COMPLETED", True, False)
    assert body["authorization"]["grant_id"] == decision.grant_id
    assert body["result"] == {"provider_reference": "ref-1", "effect_receipt": "receipt-jws"}
    assert body["recovery"] is None
    assert world.handler.sent == 1
    assert world.events() == ["GRANT_CLAIMED", "DISPATCH", "OUTCOME"]
    [outcome_line] = world.evidence.named("OUTCOME")
    assert outcome_line["effect_receipt"] == "receipt-jws"
    assert await world.journal.open_attempts() == []
    assert world.counted == [Outcome.COMPLETED]


async def test_a_grant_claimed_twice_fails_before_dispatch(world: World) -> None:
    intent = world.intent()
    decision = await world.allow(intent)
    attempt = world.attempt()
    await run(world, attempt, intent, decision)
    answer, progress = await run(world, attempt, intent, decision)
    assert progress.started  # the journal was written: the key is never freed
    body = answer.body
    assert body["outcome"] == "FAILED_BEFORE_DISPATCH"
    assert body["reason_codes"] == ["GRANT_ALREADY_CLAIMED"]
    assert (body["executed"], body["fail_closed"], body["authorization"]) == (False, True, None)
    assert world.handler.sent == 1
    assert await world.journal.open_attempts() == []  # closed NOT_CLAIMED
    assert world.counted == [Outcome.COMPLETED, Outcome.FAILED_BEFORE_DISPATCH]


async def test_an_unknown_outcome_stays_open_with_a_signed_recovery(world: World) -> None:
    world.handler.script = "lost"
    intent = world.intent()
    decision = await world.allow(intent)
    answer, _ = await run(world, world.attempt(), intent, decision)
    body = answer.body
    assert (body["outcome"], body["executed"]) == ("UNKNOWN_AFTER_DISPATCH", None)
    assert body["reason_codes"] == [*decision.reason_codes, "EGRESS_TIMEOUT"]
    assert body["result"] is None
    recovery = body["recovery"]
    assert recovery["intent"] == dict(intent.binding)
    claims = world.authority.verify_token(recovery["reference"], typ=RECOVERY_TYP)
    assert claims["intent_hash"] == intent.intent_hash
    assert claims["grant_id"] == decision.grant_id
    [still_open] = await world.journal.open_attempts()
    assert still_open.attempt_id == claims["attempt_id"]
    assert still_open.grant_claimed


async def test_a_journal_that_refuses_claims_nothing_and_frees_the_ceiling(world: World) -> None:
    ceilings = HostCeilings(window_seconds=60, window_count=1, clock=world.clock)
    intent = world.intent()
    decision = await world.allow(intent)
    await world.journal.close()
    answer, progress = await run(world, world.attempt(ceilings=ceilings), intent, decision)
    assert progress.started
    assert answer.body["outcome"] == "FAILED_BEFORE_DISPATCH"
    assert answer.body["reason_codes"] == ["JOURNAL_UNAVAILABLE"]
    assert world.handler.sent == 0
    assert world.events() == []
    await (await ceilings.commit(intent.parameters)).release()  # the one place is free again
    claim = await world.authority.claim(decision.grant or "", intent=intent)
    assert claim.grant_id == decision.grant_id  # the grant was never consumed


async def test_a_journal_that_refuses_grant_claimed_sends_nothing(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The seam prepared the execution and the grant is claimed, but the GRANT_CLAIMED record
    cannot be made durable (its fsync fails): the handler never runs, FAILED_BEFORE_DISPATCH
    with JOURNAL_UNAVAILABLE, and the journal, failed, cannot close the attempt (it stays open
    for reconciliation)."""

    def broken_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "I/O error")

    claim = world.authority.claim

    async def claim_then_break_the_disk(grant: str, **kwargs: Any) -> Claim:
        claimed = await claim(grant, **kwargs)
        monkeypatch.setattr(journal_module.os, "fsync", broken_fsync)  # the next record fails
        return claimed

    monkeypatch.setattr(world.authority, "claim", claim_then_break_the_disk)
    intent = world.intent()
    decision = await world.allow(intent)
    answer, progress = await run(world, world.attempt(), intent, decision)
    monkeypatch.undo()
    assert progress.started
    body = answer.body
    assert (body["outcome"], body["executed"], body["fail_closed"]) == (
        "FAILED_BEFORE_DISPATCH",
        False,
        True,
    )
    assert body["reason_codes"] == [*decision.reason_codes, "JOURNAL_UNAVAILABLE"]
    assert world.handler.sent == 0
    assert world.events() == ["GRANT_CLAIMED", "OUTCOME"]  # no DISPATCH line
    assert world.journal.failed
    security = world.streams.security
    assert [f["code"] for f in security.named("ATTEMPT_CLOSE_NOT_RECORDED")] == [  # type: ignore[attr-defined]
        "JOURNAL_UNAVAILABLE"
    ]
    assert world.counted == [Outcome.FAILED_BEFORE_DISPATCH]


async def test_a_prepared_execution_the_seam_refuses_journals_no_grant_claimed(
    world: World,
) -> None:
    """The seam's checks come before GRANT_CLAIMED: a refusal there (here, parameters the
    handler's schema does not take) claims the grant but journals no GRANT_CLAIMED and closes
    the attempt FAILED_BEFORE_DISPATCH."""
    world.handler.parameters_schema = {
        "type": "object",
        "additionalProperties": False,
        "properties": {"other": {"type": "string"}},
    }
    intent = world.intent()
    decision = await world.allow(intent)
    answer, _ = await run(world, world.attempt(), intent, decision)
    body = answer.body
    assert (body["outcome"], body["executed"]) == ("FAILED_BEFORE_DISPATCH", False)
    assert body["reason_codes"] == [*decision.reason_codes, "PARAMETERS_INVALID"]
    assert world.handler.sent == 0
    assert world.events() == ["GRANT_CLAIMED", "OUTCOME"]
    records = [
        json.loads(line)["record"]
        for day in sorted(world.journal.path.glob("*.jsonl"))
        for line in day.read_text().splitlines()
    ]
    assert records == ["ATTEMPT_OPENED", "ATTEMPT_CLOSED"]


async def test_only_an_allow_with_a_grant_starts_an_attempt(world: World) -> None:
    intent = world.intent(amount=9_000_000)
    decision = await world.authority.evaluate(intent, principal=PROPOSER)
    assert decision.verdict is Verdict.BLOCK
    with pytest.raises(ValueError, match="ALLOW"):
        await run(world, world.attempt(), intent, decision)
    assert world.events() == []
