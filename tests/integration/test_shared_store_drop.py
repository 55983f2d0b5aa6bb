"""A real PostgreSQL stopped between a key's idempotency record and its attempt's claim.

The executor runs in process (``assembly.assemble``, as the integration fixture builds it) on a
real PostgreSQL; the one test hook wraps the store's ``idempotency_begin`` so the server is
stopped right after the key's IN_PROGRESS record is committed, before the grant is claimed. The
key must not stay 409 IDEMPOTENCY_IN_PROGRESS for ever: it is visibly open (IN_PROGRESS, with no
attempt), then free after ``EXECUTOR_ATTEMPT_LEASE_SECONDS``, and the retry runs once.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from agentsafe.executor.state.records import IdempotencyKind, IdempotencyState
from agentsafe.executor.tools.harness import wait_until
from tests.support.postgres import PostgresServer

from .conftest import Factory

# One worker runs every test on the one PostgreSQL server its session starts.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("postgres")]


async def _key_row(url: str, key: str) -> tuple[Any, ...] | None:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute(
            "SELECT state, holder IS NOT NULL, opened_attempt FROM idempotency WHERE key = %s",
            (key,),
        )
        row = await cur.fetchone()
        return tuple(row) if row is not None else None


async def test_a_key_recorded_just_before_the_database_drops_ends_settled(
    running: Factory, postgres: PostgresServer, pg_url: str
) -> None:
    run = await running(
        EXECUTOR_STORE_URL=pg_url,
        EXECUTOR_REPLICA_ID="solo",
        EXECUTOR_ATTEMPT_LEASE_SECONDS="5",
        DOWNSTREAM_TIMEOUT_MS="2000",  # the lease must outlive a send (issue 29)
    )
    assert run.executor.backend.name == "postgresql"
    store = run.executor.store
    begin = store.idempotency_begin
    dropped: list[str] = []

    async def begin_then_drop(**scope: Any) -> IdempotencyState:
        state = await begin(**scope)
        if not dropped and state.kind is IdempotencyKind.NEW:
            dropped.append(scope["key"])
            await asyncio.to_thread(postgres.stop)  # recorded; the claim is still to come
        return state

    store.idempotency_begin = begin_then_drop  # type: ignore[method-assign]
    try:
        status, body = await run.propose(amount=4000, key="drop-1")
    finally:
        await asyncio.to_thread(postgres.start)
    assert dropped == ["drop-1"]
    # Nothing was sent: refused for want of the store, or failed before dispatch.
    assert body.get("executed", False) is False, body
    assert status in (200, 503), body
    assert run.provider.received == []
    # Visibly open: IN_PROGRESS under its holder, with no attempt.
    assert await _key_row(pg_url, "drop-1") == ("IN_PROGRESS", True, None)
    answers: list[int] = []

    async def settled() -> bool:
        status, body = await run.propose(amount=4000, key="drop-1")
        answers.append(status)
        return status == 200 and body["outcome"] == "COMPLETED"

    # Before the fix the key answered 409 until a restart; now once its lease has lapsed.
    await wait_until(settled, timeout=60, interval=0.5, what="the retry to run")
    assert set(answers[:-1]) <= {409, 503}, answers
    again_status, again = await run.propose(amount=4000, key="drop-1")
    assert again_status == 200
    assert again["replayed"] is True
    assert len(run.provider.received) == 1
    row = await _key_row(pg_url, "drop-1")
    assert row is not None
    assert row[:2] == ("DONE", True)
    assert row[2] is not None  # the answer belongs to the attempt that ran
