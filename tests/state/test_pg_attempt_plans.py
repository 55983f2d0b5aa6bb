"""A statement about one attempt reaches its row by the primary key, on a real PostgreSQL with
a realistic table (issue 34).

``attempts_open`` (state, lease_until) serves the takeover's scan of lapsed leases. When a
per-attempt statement said ``state = 'OPEN'``, the planner judged the open range (nearly every
row of a long-lived table is CLOSED) cheaper than one primary-key probe and scanned every open
attempt. At SERIALIZABLE that took read locks on all of them, so each fenced claim conflicted
with every concurrent attempt's write: about one serialization failure per ALLOW at
concurrency 16. The statements' meaning is unchanged; these tests read their plans.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest

from agentsafe.executor.state.journal import RecordType
from agentsafe.executor.state.pgattempts import SharedAttemptMirror
from agentsafe.executor.state.pgstore import PostgresStore
from tests.support.intents import make_intent, opened_record

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("postgres")]

CLOSED_ROWS = 20_000


async def _plan(url: str, sql: str, params: Sequence[object]) -> str:
    """The plan of ``sql`` (EXPLAIN runs nothing), as JSON text."""
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute("EXPLAIN (FORMAT JSON) " + sql, params)  # type: ignore[arg-type]
        row = await cur.fetchone()
        assert row is not None
        return json.dumps(row[0])


async def _closed_history(url: str) -> None:
    """A table a replica has served for a while: many CLOSED attempts, statistics taken."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO attempts (attempt_id, owner, lease_until, state, intent_hash, binding,"
            " opened_at, closed_at) SELECT 'old-' || i, 'a', 1, 'CLOSED', 'h', '{}', 'x', 1"
            " FROM generate_series(1, %s) AS i",
            (CLOSED_ROWS,),
        )
        await conn.execute("ANALYZE attempts")


async def test_the_fenced_claim_and_grant_claimed_probe_the_primary_key(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await PostgresStore.open(pg_url)
    try:
        await _closed_history(pg_url)
        mirror = SharedAttemptMirror(store.attempts, owner="a", lease_seconds=30)
        for attempt_id in ("att-1", "att-2"):
            await mirror.record(
                RecordType.ATTEMPT_OPENED, opened_record(attempt_id, make_intent(now=1.0))
            )
        sent: list[tuple[str, Sequence[object]]] = []
        statement = store.statement

        async def recorded(sql: str, params: Sequence[object] = ()) -> Any:
            sent.append((sql, params))
            return await statement(sql, params)

        monkeypatch.setattr(store, "statement", recorded)
        fence = mirror.fence("att-1")
        assert fence is not None
        assert await store.use_store.claim_grant(
            "g-1",
            binding_digest="sha256:b",
            expires_at=2_000_000_000.0,
            now=1.0,
            fence=fence,
            payload_digest="sha256:p",
        )
        await store.attempts.grant_claimed(
            attempt_id="att-2",
            grant_id="g-2",
            grant_expires_at="2033-05-18T03:33:20.000Z",
            payload_digest="sha256:p",
            owner="a",
            epoch=1,
        )
        assert len(sent) == 2
        for sql, params in sent:
            plan = await _plan(pg_url, sql, params)
            assert "attempts_pkey" in plan, plan
            assert "attempts_open" not in plan, plan
    finally:
        await store.close()
