"""The attempt fenced by its shared-store ownership (issue 29), on a real PostgreSQL.

Every collaborator is the real one (the local authority over the example policy, the shared
store, its attempt mirror, the journal) except the handler (scripted and counted, from
``test_attempt.py``) and :class:`Pausing`, a stand-in wrapped around the real use store whose
``claim_grant`` lets the test act at the exact moment a pause would: just before the claim (the
attempt is taken over) or just after it (the local monotonic clock jumps past the lease).
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from agentsafe.executor.clock import ManualClock
from agentsafe.executor.errors import RequestRejected
from agentsafe.executor.events import Streams
from agentsafe.executor.grants import SigningKey
from agentsafe.executor.lifecycle.attempt import Attempt
from agentsafe.executor.policy.authority import LocalAuthority
from agentsafe.executor.policy.policy import compile_policy, parse_policy
from agentsafe.executor.state.journal import AttemptJournal
from agentsafe.executor.state.pgattempts import SharedAttemptMirror
from agentsafe.executor.state.pgstore import PostgresStore
from tests.lifecycle.test_attempt import EXAMPLE, ScriptedHandler, World, run

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("postgres")]


class Ticks:
    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now


class Pausing:
    """The real use store, with a step the test chooses run before or after ``claim_grant``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.before: Callable[[], Awaitable[None]] | None = None
        self.after: Callable[[], None] | None = None

    async def claim_grant(self, grant_id: str, **kwargs: Any) -> bool:
        if self.before is not None:
            await self.before()
        claimed: bool = await self.inner.claim_grant(grant_id, **kwargs)
        if self.after is not None:
            self.after()
        return claimed


class Fenced(World):
    store: PostgresStore
    other: PostgresStore
    pausing: Pausing
    ticks: Ticks
    url: str


@pytest.fixture
async def fenced(tmp_path: Path, pg_url: str) -> AsyncIterator[Fenced]:
    clock = ManualClock()
    store = await PostgresStore.open(pg_url)
    other = await PostgresStore.open(pg_url)
    ticks = Ticks()
    mirror = SharedAttemptMirror(
        store.attempts, owner="replica-a", lease_seconds=30, dispatch_seconds=2, monotonic=ticks
    )
    journal = await AttemptJournal.open(
        tmp_path / "journal", retain_days=1, clock=clock, mirror=mirror
    )
    pausing = Pausing(store.use_store)
    policy = compile_policy(
        parse_policy(copy.deepcopy(EXAMPLE)), registered_handlers={"forward_request"}
    )
    authority = LocalAuthority(policy, keys=SigningKey.generate(), store=pausing, clock=clock)  # type: ignore[arg-type]
    world = Fenced(clock, authority, journal, ScriptedHandler(), Streams.memory())
    world.store, world.other, world.pausing, world.ticks, world.url = (
        store,
        other,
        pausing,
        ticks,
        pg_url,
    )
    yield world
    await journal.close()
    await store.close()
    await other.close()


async def _claims(url: str) -> int:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute("SELECT count(*) FROM grant_claims")
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])


async def test_an_attempt_taken_over_before_its_claim_is_refused_and_sends_nothing(
    fenced: Fenced,
) -> None:
    async def taken_over() -> None:  # A paused here; its lease lapsed; B took the attempt
        async with await psycopg.AsyncConnection.connect(fenced.url, autocommit=True) as conn:
            await conn.execute("UPDATE attempts SET lease_until = 0")
        row = await fenced.other.attempts.take_lapsed(owner="replica-b", lease_seconds=30)
        assert row is not None
        assert row.epoch == 2

    fenced.pausing.before = taken_over
    intent = fenced.intent()
    decision = await fenced.allow(intent)
    attempt: Attempt = fenced.attempt()
    with pytest.raises(RequestRejected) as refused:
        await run(fenced, attempt, intent, decision)
    assert refused.value.code == "ATTEMPT_FENCED"
    assert fenced.handler.sent == 0
    assert await _claims(fenced.url) == 0
    [line] = fenced.evidence.named("ATTEMPT_FENCED")
    assert line["intent_id"] == intent.intent_id
    assert "GRANT_CLAIMED" not in fenced.events()
    assert "OUTCOME" not in fenced.events()
    # the journal says why, and the attempt is closed in it
    assert await fenced.journal.open_attempts() == []
    closes = [
        r
        for f in sorted((fenced.journal.path).glob("*.jsonl"))
        for r in map(_json, f.read_text().splitlines())
        if r["record"] == "ATTEMPT_CLOSED"
    ]
    assert [(c["outcome"], c["executed"], c["finalization"]) for c in closes] == [
        ("FAILED_BEFORE_DISPATCH", False, "FENCED")
    ]
    # the shared store's row is still the new owner's, open: its close was fenced off
    [row] = await fenced.store.attempts.open_attempts()
    assert (row.owner, row.epoch, row.grant_claimed) == ("replica-b", 2, False)


async def test_an_attempt_whose_key_was_taken_over_before_it_opened_never_says_not_executed(
    fenced: Fenced,
) -> None:
    """The request paused between its key's record and its attempt's open; its key lease lapsed
    and a retry took the key over (and may have run it). The open is refused in the database,
    and the answer is 409 IDEMPOTENCY_TAKEN_OVER, never FAILED_BEFORE_DISPATCH with
    ``executed: false`` (the protocol model's GAP_TAKEN_OVER_NOT_EXECUTED, docs/protocol.md)."""
    from agentsafe.executor.state import pgconn

    intent = fenced.intent()
    decision = await fenced.allow(intent)
    attempt: Attempt = fenced.attempt()
    # the key this request began is now another request's: its holder token no longer matches
    held = pgconn.HELD_KEY.set(
        pgconn.HeldKey(("tenant", "principal", "key"), "the-holder-that-lost-it")
    )
    try:
        with pytest.raises(RequestRejected) as refused:
            await run(fenced, attempt, intent, decision)
    finally:
        pgconn.HELD_KEY.reset(held)
    assert refused.value.code == "IDEMPOTENCY_TAKEN_OVER"
    assert fenced.handler.sent == 0
    assert await _claims(fenced.url) == 0
    assert await fenced.store.attempts.open_attempts() == []  # nothing opened in the database
    [line] = fenced.evidence.named("ATTEMPT_FENCED")
    assert line["code"] == "IDEMPOTENCY_TAKEN_OVER"
    assert "OUTCOME" not in fenced.events()
    closes = [
        r
        for f in sorted((fenced.journal.path).glob("*.jsonl"))
        for r in map(_json, f.read_text().splitlines())
        if r["record"] == "ATTEMPT_CLOSED"
    ]
    assert [(c["outcome"], c["executed"], c["finalization"]) for c in closes] == [
        ("FAILED_BEFORE_DISPATCH", False, "FENCED")
    ]


async def test_a_lease_that_would_lapse_before_the_send_ends_sends_nothing(
    fenced: Fenced,
) -> None:
    def paused() -> None:  # A paused right after its claim, longer than its lease
        fenced.ticks.now += 60

    fenced.pausing.after = paused
    intent = fenced.intent()
    decision = await fenced.allow(intent)
    answer, progress = await run(fenced, fenced.attempt(), intent, decision)
    assert progress.started
    body = answer.body
    assert (body["outcome"], body["executed"]) == ("FAILED_BEFORE_DISPATCH", False)
    assert body["reason_codes"] == [*decision.reason_codes, "ATTEMPT_LEASE_LAPSED"]
    assert fenced.handler.sent == 0
    assert fenced.events() == ["GRANT_CLAIMED", "OUTCOME"]  # withheld: no DISPATCH line
    records = [
        _json(line)["record"]
        for day in sorted(fenced.journal.path.glob("*.jsonl"))
        for line in day.read_text().splitlines()
    ]  # the claim was made durable (between the seam's prepare and run), then withheld
    assert records == ["ATTEMPT_OPENED", "GRANT_CLAIMED", "ATTEMPT_CLOSED"]
    assert await _claims(fenced.url) == 1  # claimed: nobody else can send under this grant
    security = fenced.streams.security
    assert [f["code"] for f in security.named("DISPATCH_WITHHELD")] == [  # type: ignore[attr-defined]
        "ATTEMPT_LEASE_LAPSED"
    ]


async def test_a_live_lease_claims_and_sends_once(fenced: Fenced) -> None:
    intent = fenced.intent()
    decision = await fenced.allow(intent)
    answer, _ = await run(fenced, fenced.attempt(), intent, decision)
    assert (answer.body["outcome"], answer.body["executed"]) == ("COMPLETED", True)
    assert fenced.handler.sent == 1
    assert await _claims(fenced.url) == 1
    assert await fenced.store.attempts.open_attempts() == []


def _json(line: str) -> dict[str, Any]:
    import json

    record: dict[str, Any] = json.loads(line)
    return record
