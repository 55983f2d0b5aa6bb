"""Fencing on a real PostgreSQL (issue 29): the grant claim is made only under the attempt's
current owner, epoch and live lease, in one statement; every takeover increments the epoch."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from agentsafe.executor.errors import StoreError
from agentsafe.executor.intent import CapturedIntent
from agentsafe.executor.state.journal import RecordType
from agentsafe.executor.state.pgattempts import OPENING_EPOCH, SharedAttemptMirror
from agentsafe.executor.state.pgschema import MIGRATIONS, SCHEMA_VERSION
from agentsafe.executor.state.pgstore import PostgresStore
from agentsafe.executor.state.records import AttemptFence
from tests.support.intents import make_intent, opened_record

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("postgres")]


class Ticks:
    """A monotonic clock the test moves (the fences' local lease deadlines)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _open(mirror: SharedAttemptMirror, attempt_id: str, intent: CapturedIntent) -> None:
    await mirror.record(RecordType.ATTEMPT_OPENED, opened_record(attempt_id, intent))


async def _claim(store: PostgresStore, grant_id: str, fence: AttemptFence | None) -> bool:
    return await store.use_store.claim_grant(
        grant_id,
        binding_digest="sha256:b",
        expires_at=2_000_000_000.0,
        now=1.0,
        fence=fence,
        payload_digest="sha256:p",
    )


async def _row(url: str, attempt_id: str) -> tuple[Any, ...]:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute(
            "SELECT owner, epoch, state, grant_claimed, grant_id, payload_digest"
            " FROM attempts WHERE attempt_id = %s",
            (attempt_id,),
        )
        row = await cur.fetchone()
        assert row is not None
        return tuple(row)


async def _claims(url: str) -> list[str]:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute("SELECT grant_id FROM grant_claims ORDER BY grant_id")
        return [str(r[0]) for r in await cur.fetchall()]


async def _lapse(store: PostgresStore, url: str, attempt_id: str) -> None:
    """Until the attempt's lease lapsed on the database's clock (bounded)."""

    async def lease_until() -> float:
        async with await psycopg.AsyncConnection.connect(url) as conn:
            cur = await conn.execute(
                "SELECT lease_until FROM attempts WHERE attempt_id = %s", (attempt_id,)
            )
            row = await cur.fetchone()
            assert row is not None
            return float(row[0])

    async def lapsed() -> None:
        while await store.now() <= await lease_until():
            await asyncio.sleep(0.05)

    await asyncio.wait_for(lapsed(), timeout=20)


async def test_a_live_holder_claims_once_in_the_statement_that_records_grant_claimed(
    pg_url: str,
) -> None:
    store = await PostgresStore.open(pg_url)
    ticks = Ticks()
    try:
        mirror = SharedAttemptMirror(
            store.attempts, owner="a", lease_seconds=30, dispatch_seconds=2, monotonic=ticks
        )
        await _open(mirror, "att-1", make_intent(now=1.0))
        fence = mirror.fence("att-1")
        assert fence is not None
        assert (fence.owner, fence.epoch, fence.claimed) == ("a", OPENING_EPOCH, False)
        assert fence.can_dispatch()
        ticks.now += 10
        assert await _claim(store, "g-1", fence)
        assert fence.claimed
        assert fence.deadline == pytest.approx(ticks.now + 30 - 1)  # renewed by the claim
        assert await _row(pg_url, "att-1") == ("a", 1, "OPEN", True, "g-1", "sha256:p")
        assert await _claims(pg_url) == ["g-1"]
        # GRANT_CLAIMED through the mirror adds no statement: the claim wrote it
        await mirror.record(
            RecordType.GRANT_CLAIMED,
            {
                "attempt_id": "att-1",
                "grant_id": "g-1",
                "grant_expires_at": "x",
                "payload_digest": "y",
            },
        )
        assert await _row(pg_url, "att-1") == ("a", 1, "OPEN", True, "g-1", "sha256:p")
        # a second claim on the attempt (claimed already) claims nothing
        with pytest.raises(StoreError) as err:
            await _claim(store, "g-2", fence)
        assert err.value.code == "ATTEMPT_FENCED"
        assert await _claims(pg_url) == ["g-1"]
        # the local deadline: a dispatch must end under it
        ticks.now = fence.deadline - 2
        assert not fence.can_dispatch()
    finally:
        await store.close()


async def test_a_holder_whose_lease_lapsed_claims_nothing_and_a_taken_over_one_neither(
    pg_url: str,
) -> None:
    a_store, b_store = await PostgresStore.open(pg_url), await PostgresStore.open(pg_url)
    try:
        a = SharedAttemptMirror(a_store.attempts, owner="a", lease_seconds=0.5)
        b = SharedAttemptMirror(b_store.attempts, owner="b", lease_seconds=30)
        intent = make_intent(now=1.0)
        await _open(a, "att-lapsed", intent)
        fence = a.fence("att-lapsed")
        assert fence is not None
        await _lapse(a_store, pg_url, "att-lapsed")
        # lapsed, not yet taken: fenced by the lease on the database's clock
        with pytest.raises(StoreError) as err:
            await _claim(a_store, "g-lapsed", fence)
        assert err.value.code == "ATTEMPT_FENCED"
        assert await _claims(pg_url) == []
        assert await _row(pg_url, "att-lapsed") == ("a", 1, "OPEN", False, None, None)

        # taken over: the epoch moves with the owner, in the takeover's transaction
        row = await b_store.attempts.take_lapsed(owner="b", lease_seconds=30)
        assert row is not None
        assert (row.attempt_id, row.owner, row.epoch) == ("att-lapsed", "b", 2)
        b.held(row, sent_at=0.0)
        # even a lease renewed by the old holder's renewal cannot bring the claim back
        assert await a.renew() == 0
        with pytest.raises(StoreError) as err:
            await _claim(a_store, "g-lapsed", fence)
        assert err.value.code == "ATTEMPT_FENCED"
        assert await _claims(pg_url) == []
        # the old holder's close is fenced too: the row stays the new owner's, open
        await a.record(
            RecordType.ATTEMPT_CLOSED,
            {"attempt_id": "att-lapsed", "outcome": "FAILED_BEFORE_DISPATCH"},
        )
        assert await _row(pg_url, "att-lapsed") == ("b", 2, "OPEN", False, None, None)
        # the new owner concludes UNCLAIMED under the epoch it holds
        await b.record(RecordType.RECONCILED, {"attempt_id": "att-lapsed", "status": "UNCLAIMED"})
        assert (await _row(pg_url, "att-lapsed"))[:3] == ("b", 2, "CLOSED")
        with pytest.raises(StoreError):
            await _claim(a_store, "g-lapsed", fence)
        assert await _claims(pg_url) == []
        # a named take (start-up's gate) increments it as well
        await _open(a, "att-2", intent)
        await _lapse(a_store, pg_url, "att-2")
        state, taken = await b_store.attempts.take("att-2", owner="b", lease_seconds=30)
        assert state == "TAKEN"
        assert taken is not None
        assert taken.epoch == 2
        state, _ = await a_store.attempts.take("att-2", owner="a", lease_seconds=30)
        assert state == "HELD"
    finally:
        await a_store.close()
        await b_store.close()


async def test_renewal_moves_the_local_deadline_only_of_attempts_still_held_at_their_epoch(
    pg_url: str,
) -> None:
    a_store, b_store = await PostgresStore.open(pg_url), await PostgresStore.open(pg_url)
    ticks = Ticks()
    try:
        a = SharedAttemptMirror(a_store.attempts, owner="a", lease_seconds=0.5, monotonic=ticks)
        intent = make_intent(now=1.0)
        await _open(a, "att-kept", intent)
        await _open(a, "att-lost", intent)
        kept, lost = a.fence("att-kept"), a.fence("att-lost")
        assert kept is not None
        assert lost is not None
        await _lapse(a_store, pg_url, "att-lost")
        await _lapse(a_store, pg_url, "att-kept")
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
            # only att-lost is offered to the taker
            await conn.execute(
                "UPDATE attempts SET opened_at = '2000-01-01' WHERE attempt_id = 'att-lost'"
            )
        taken = await b_store.attempts.take_lapsed(owner="b", lease_seconds=30)
        assert taken is not None
        assert taken.attempt_id == "att-lost"
        before = lost.deadline
        ticks.now += 100
        assert await a.renew() == 1
        assert kept.deadline == pytest.approx(ticks.now + 0.5 - 1)
        assert lost.deadline == before
    finally:
        await a_store.close()
        await b_store.close()


async def test_a_restarted_replica_renews_only_the_attempts_it_holds_fences_for(
    pg_url: str,
) -> None:
    """Same EXECUTOR_REPLICA_ID, new process: an open attempt of its predecessor that this
    process holds no fence for is not renewed, so it lapses and another replica takes it and
    reconciles it (the protocol model's GAP_RENEW_ALL: it was renewed for ever, its key 409 for
    ever)."""
    store = await PostgresStore.open(pg_url)
    try:
        before = SharedAttemptMirror(store.attempts, owner="a", lease_seconds=30)
        await _open(before, "att-orphan", make_intent(now=1.0))
        after = SharedAttemptMirror(store.attempts, owner="a", lease_seconds=30)  # the restart
        await _open(after, "att-own", make_intent(now=1.0))
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
            await conn.execute("UPDATE attempts SET lease_until = 0")  # both lapsed
        assert await after.renew() == 1
        taken = await store.attempts.take_lapsed(owner="b", lease_seconds=30)
        assert taken is not None
        assert taken.attempt_id == "att-orphan"
        assert await store.attempts.take_lapsed(owner="b", lease_seconds=30) is None
    finally:
        await store.close()


async def test_an_existing_schema_migrates_and_its_open_attempts_start_at_epoch_one(
    pg_url: str,
) -> None:
    before = SCHEMA_VERSION - 1
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        for statements in MIGRATIONS[:before]:
            for statement in statements:
                await conn.execute(statement)
        await conn.execute(
            "CREATE TABLE agentsafe_schema (singleton boolean PRIMARY KEY DEFAULT true"
            " CHECK (singleton), version integer NOT NULL)"
        )
        await conn.execute("INSERT INTO agentsafe_schema (version) VALUES (%s)", (before,))
        await conn.execute(
            "INSERT INTO attempts (attempt_id, owner, lease_until, state, intent_hash, binding,"
            " opened_at) VALUES ('att-old', 'a', 0, 'OPEN', 'sha256:x', '{}', 'then')"
        )
    store = await PostgresStore.open(pg_url)
    try:
        async with await psycopg.AsyncConnection.connect(pg_url) as conn:
            cur = await conn.execute("SELECT version FROM agentsafe_schema")
            assert await cur.fetchall() == [(SCHEMA_VERSION,)]
        assert (await _row(pg_url, "att-old"))[:2] == ("a", 1)
        row = await store.attempts.take_lapsed(owner="b", lease_seconds=30)
        assert row is not None
        assert (row.attempt_id, row.epoch) == ("att-old", 2)
    finally:
        await store.close()
