"""An attempt's close and its key's answer in one statement, on a real PostgreSQL (issue 34).

When a request holds its idempotency key (``state/pgconn.py`` ``HeldKey``) and its attempt's
ATTEMPT_CLOSED carries the answer the caller is given, the mirror closes the attempt and
completes the key in one statement; the request's ``idempotency_complete`` then sends nothing.
What must not change: the close stays fenced by owner and epoch, the key takes the answer only
under this request's holder, a key that cannot take it is answered for as before, and a
statement that fails loses neither the close nor the answer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import psycopg
import pytest

from agentsafe.executor.canonical import canonical_text
from agentsafe.executor.codes import Code
from agentsafe.executor.errors import StoreError
from agentsafe.executor.state import pgconn
from agentsafe.executor.state.journal import RecordType
from agentsafe.executor.state.pgattempts import SharedAttemptMirror
from agentsafe.executor.state.pgstore import PostgresStore
from agentsafe.executor.state.records import IdempotencyKind, closing_response
from tests.support.intents import make_intent, opened_record

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("postgres")]

SCOPE = {"tenant": "t", "principal": "agent", "key": "k-1"}
BODY = {"outcome": "COMPLETED", "executed": True, "intent_id": "i-1", "result": {"id": "p-1"}}


class Counted:
    """Every statement and transaction the store is asked for, counted (the real ones run)."""

    def __init__(self, store: PostgresStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.statements: list[str] = []
        self.transactions = 0
        statement, transaction = store.statement, store.transaction

        async def counted_statement(sql: str, params: Sequence[object] = ()) -> Any:
            self.statements.append(sql)
            return await statement(sql, params)

        async def counted_transaction(fn: Any) -> Any:
            self.transactions += 1
            return await transaction(fn)

        monkeypatch.setattr(store, "statement", counted_statement)
        monkeypatch.setattr(store, "transaction", counted_transaction)


@pytest.fixture
async def store(pg_url: str) -> AsyncIterator[PostgresStore]:
    opened = await PostgresStore.open(pg_url)
    try:
        yield opened
    finally:
        await opened.close()


async def _begin_and_open(store: PostgresStore, **clock: Any) -> SharedAttemptMirror:
    """The request's key begun (its ``HeldKey`` in this task) and its attempt opened."""
    mirror = SharedAttemptMirror(store.attempts, owner="a", lease_seconds=30, **clock)
    state = await store.use_store.idempotency_begin(
        **SCOPE, payload_digest="sha256:p", now=1.0, attempt_id="att-1", owner="a"
    )
    assert state.kind is IdempotencyKind.NEW
    await mirror.record(RecordType.ATTEMPT_OPENED, opened_record("att-1", make_intent(now=1.0)))
    return mirror


async def _close(mirror: SharedAttemptMirror, *, outcome: str = "COMPLETED", **extra: Any) -> None:
    await mirror.record(
        RecordType.ATTEMPT_CLOSED,
        {
            "attempt_id": "att-1",
            "outcome": outcome,
            "executed": True,
            "finalization": "RECORDED",
            **extra,
        },
    )


async def _rows(url: str) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """(the key's state, response, completed_at), (the attempt's state, last_status)."""
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute(
            "SELECT state, response, completed_at FROM idempotency WHERE key = %s",
            (SCOPE["key"],),
        )
        key = await cur.fetchone()
        cur = await conn.execute(
            "SELECT state, last_status FROM attempts WHERE attempt_id = 'att-1'"
        )
        attempt = await cur.fetchone()
    assert key is not None
    assert attempt is not None
    return tuple(key), tuple(attempt)


async def _closed_after(
    store: PostgresStore, pg_url: str, meanwhile: str
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """Begin, open, let ``meanwhile`` change the rows (another request or replica), close with
    the answer; the rows after."""
    mirror = await _begin_and_open(store)
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        await conn.execute(meanwhile.encode())
    await _close(mirror, answer=dict(BODY))
    return await _rows(pg_url)


async def test_the_close_with_its_answer_completes_the_key_in_the_same_statement(
    store: PostgresStore, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    mirror = await _begin_and_open(store, now=lambda: 7.0)
    counted = Counted(store, monkeypatch)
    await _close(mirror, answer=dict(BODY))
    assert len(counted.statements) == 1
    assert counted.transactions == 0
    key, attempt = await _rows(pg_url)
    assert key == ("DONE", canonical_text(closing_response(BODY)), 7.0)
    assert attempt == ("CLOSED", "COMPLETED")
    assert mirror.fence("att-1") is None  # closed: no lease of it is renewed any more
    held = pgconn.HELD_KEY.get()
    assert held is not None
    assert held.recorded == {"status": 200, "body": BODY}
    # the request's own completion, with the answer it gives, sends nothing more
    await store.use_store.idempotency_complete(
        **SCOPE, response={"status": 200, "body": dict(BODY)}, now=8.0
    )
    assert len(counted.statements) == 1
    assert counted.transactions == 0
    assert pgconn.HELD_KEY.get() is None  # let go, as a sent completion lets go
    # a retry replays exactly the answer the caller was given
    replay = await store.use_store.idempotency_begin(**SCOPE, payload_digest="sha256:p", now=9.0)
    assert replay.kind is IdempotencyKind.REPLAY
    assert replay.response == {"status": 200, "body": BODY}


async def test_a_key_another_holder_took_is_not_answered_and_the_close_still_holds(
    store: PostgresStore, pg_url: str
) -> None:
    key, attempt = await _closed_after(
        store, pg_url, "UPDATE idempotency SET holder = 'another request'"
    )
    assert key[0] == "IN_PROGRESS"
    assert attempt == ("CLOSED", "COMPLETED")
    held = pgconn.HELD_KEY.get()
    assert held is not None
    assert held.recorded is None
    # the request's completion says why, as it did before the close carried the answer
    with pytest.raises(StoreError) as refused:
        await store.use_store.idempotency_complete(
            **SCOPE, response={"status": 200, "body": dict(BODY)}, now=8.0
        )
    assert refused.value.code == Code.IDEMPOTENCY_TAKEN_OVER


async def test_a_close_taken_over_changes_no_attempt_but_the_key_still_takes_its_answer(
    store: PostgresStore, pg_url: str
) -> None:
    key, attempt = await _closed_after(
        store, pg_url, "UPDATE attempts SET owner = 'b', epoch = epoch + 1"
    )
    assert attempt == ("OPEN", None)  # the new owner's to resolve, as a fenced close leaves it
    assert key[0] == "DONE"  # the answer given stays the key's, as it did with two statements


async def test_a_failed_statement_loses_neither_the_close_nor_the_answer(
    store: PostgresStore, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    mirror = await _begin_and_open(store)

    async def dropped(**_: Any) -> bool:
        raise StoreError("the shared store failed", code=Code.STORE_UNAVAILABLE)

    monkeypatch.setattr(store.attempts, "close_answering", dropped)
    await _close(mirror, answer=dict(BODY))  # never raises: the outcome is known
    assert mirror.backlog == 1
    key, attempt = await _rows(pg_url)
    assert (key[0], attempt[0]) == ("IN_PROGRESS", "OPEN")
    held = pgconn.HELD_KEY.get()
    assert held is not None
    assert held.recorded is None
    await store.use_store.idempotency_complete(
        **SCOPE, response={"status": 200, "body": dict(BODY)}, now=8.0
    )
    assert await mirror.flush() == 0
    key, attempt = await _rows(pg_url)
    assert key[:2] == ("DONE", canonical_text(closing_response(BODY)))
    assert attempt == ("CLOSED", "COMPLETED")


@pytest.mark.parametrize(
    ("outcome", "extra", "attempt_state"),
    [
        ("FAILED_BEFORE_DISPATCH", {}, "CLOSED"),  # a close with no answer (a fenced claim)
        ("UNKNOWN_AFTER_DISPATCH", {"answer": {"outcome": "UNKNOWN_AFTER_DISPATCH"}}, "OPEN"),
    ],
)
async def test_a_close_without_a_final_answer_leaves_the_key_to_its_request(
    store: PostgresStore, pg_url: str, outcome: str, extra: dict[str, Any], attempt_state: str
) -> None:
    mirror = await _begin_and_open(store)
    await _close(mirror, outcome=outcome, **extra)
    key, attempt = await _rows(pg_url)
    assert (key[0], attempt[0]) == ("IN_PROGRESS", attempt_state)
    held = pgconn.HELD_KEY.get()
    assert held is not None
    assert held.recorded is None
