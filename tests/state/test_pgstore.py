"""The shared store on a real PostgreSQL: migrations, single use, windows, leases, outages."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from psycopg.rows import TupleRow

from agentsafe.executor.errors import StoreError
from agentsafe.executor.state.journal import RecordType
from agentsafe.executor.state.pgattempts import SharedAttemptMirror
from agentsafe.executor.state.pgconn import migrate_url
from agentsafe.executor.state.pgschema import SCHEMA_VERSION
from agentsafe.executor.state.pgstore import PostgresStore
from agentsafe.executor.state.records import (
    ApprovalError,
    ApprovalRequest,
    ApprovalState,
    IdempotencyKind,
)
from tests.support.intents import make_intent, opened_record
from tests.support.postgres import PostgresServer

# One worker runs every test on the one PostgreSQL server its session starts.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("postgres")]


async def test_three_replicas_migrating_at_once_apply_each_migration_once(pg_url: str) -> None:
    stores = await asyncio.gather(*(PostgresStore.open(pg_url) for _ in range(3)))
    try:
        async with await psycopg.AsyncConnection.connect(pg_url) as conn:
            cur = await conn.execute("SELECT version FROM agentsafe_schema")
            assert await cur.fetchall() == [(SCHEMA_VERSION,)]
        assert await migrate_url(pg_url) == (SCHEMA_VERSION, SCHEMA_VERSION)
    finally:
        for store in stores:
            await store.close()


async def test_a_schema_newer_than_the_code_refuses_to_start(pg_url: str) -> None:
    assert await migrate_url(pg_url) == (0, SCHEMA_VERSION)
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        await conn.execute("UPDATE agentsafe_schema SET version = version + 1")
    with pytest.raises(StoreError) as err:
        await PostgresStore.open(pg_url)
    assert err.value.code == "STORE_SCHEMA_UNSUPPORTED"


async def test_single_use_holds_across_replicas(pg_url: str) -> None:
    a, b = await PostgresStore.open(pg_url), await PostgresStore.open(pg_url)
    try:
        claims = await asyncio.gather(
            *(
                s.use_store.claim_grant("g-1", binding_digest="d", expires_at=100.0, now=1.0)
                for s in (a, b) * 20
            )
        )
        assert claims.count(True) == 1
        scope = {"tenant": "t", "principal": "p", "key": "k"}
        begins = await asyncio.gather(
            *(
                s.use_store.idempotency_begin(**scope, payload_digest="x", now=1.0)
                for s in (a, b) * 30
            )
        )
        kinds = [state.kind for state in begins]
        assert kinds.count(IdempotencyKind.NEW) == 1
        assert set(kinds) == {IdempotencyKind.NEW, IdempotencyKind.IN_PROGRESS}
        other = await b.use_store.idempotency_begin(**scope, payload_digest="y", now=1.0)
        assert other.kind is IdempotencyKind.CONFLICT
        answer = {"status": 200, "body": {"outcome": "COMPLETED"}}
        await a.use_store.idempotency_complete(**scope, response=answer, now=2.0)
        replay = await b.use_store.idempotency_begin(**scope, payload_digest="x", now=3.0)
        assert replay.kind is IdempotencyKind.REPLAY
        assert replay.response == answer
        with pytest.raises(StoreError) as err:
            await b.use_store.idempotency_complete(
                **scope, response={"status": 200, "body": {}}, now=4.0
            )
        assert err.value.code == "IDEMPOTENCY_ALREADY_COMPLETE"
        records = await asyncio.gather(
            *(s.use_store.consume("plan", "step-1", binding={"a": 1}, now=5.0) for s in (a, b))
        )
        issued = [r for r in records if r is not None]
        assert len(issued) == 1
        assert await a.use_store.verify_consumption(issued[0])
        assert await b.use_store.verify_consumption(issued[0])
    finally:
        await a.close()
        await b.close()


async def test_an_approval_is_decided_once_whichever_replica_decides(pg_url: str) -> None:
    a, b = await PostgresStore.open(pg_url), await PostgresStore.open(pg_url)
    try:
        intent = make_intent(now=1.0)
        request = ApprovalRequest(
            request_id="req-1",
            intent=intent.binding,
            intent_hash=intent.intent_hash,
            approvers=("approver-1", "approver-2"),
            proposer_principal="agent",
            proposer_actor="agent",
            expires_at=1000.0,
            created_at=1.0,
        )
        await a.use_store.approval_create(request)
        pending = await b.use_store.approval_list(state=ApprovalState.PENDING, now=2.0)
        assert [r.request.request_id for r in pending] == ["req-1"]

        async def decide(store: PostgresStore, who: str) -> str:
            try:
                await store.use_store.approval_decide(
                    "req-1", decision="APPROVE", approver=who, reason="ok", now=3.0
                )
            except ApprovalError as exc:
                return exc.code
            return "DECIDED"

        results = await asyncio.gather(decide(a, "approver-1"), decide(b, "approver-2"))
        assert sorted(results) == ["APPROVAL_ALREADY_DECIDED", "DECIDED"]
        record = await a.use_store.approval_get("req-1")
        assert record is not None
        assert record.stored_state is ApprovalState.APPROVED
    finally:
        await a.close()
        await b.close()


async def test_the_window_is_shared_not_per_replica(pg_url: str) -> None:
    stores = [await PostgresStore.open(pg_url) for _ in range(3)]
    try:

        async def reserve(store: PostgresStore) -> str | None:
            full, _ = await store.window.reserve(
                window_seconds=60, amount_minor=10, count_limit=5, sum_limit=None
            )
            return full

        results = await asyncio.gather(*(reserve(stores[i % 3]) for i in range(30)))
        assert results.count(None) == 5
        assert await stores[1].window.usage(60) == (5, 50)
    finally:
        for store in stores:
            await store.close()


async def test_a_lapsed_lease_is_taken_by_exactly_one_replica(pg_url: str) -> None:
    stores = [await PostgresStore.open(pg_url) for _ in range(3)]
    try:
        intent = make_intent(now=1.0)
        dead = SharedAttemptMirror(stores[0].attempts, owner="replica-a", lease_seconds=2)
        await dead.record(RecordType.ATTEMPT_OPENED, opened_record("att-1", intent))
        held_until = await _lease_until(pg_url, "att-1")
        live = await stores[1].attempts.take_lapsed(owner="replica-b", lease_seconds=30)
        if await stores[1].now() < held_until:
            assert live is None  # asked while the lease was still live (on the database's clock)
        else:  # a loaded machine took longer than the lease; nothing to conclude
            pytest.skip("the 2 s lease lapsed before it could be asked about while live")

        async def lapsed() -> None:
            while await stores[1].now() < (await _lease_until(pg_url, "att-1")):
                await asyncio.sleep(0.05)

        await asyncio.wait_for(lapsed(), timeout=10)
        takers = await asyncio.gather(
            stores[1].attempts.take_lapsed(owner="replica-b", lease_seconds=30),
            stores[2].attempts.take_lapsed(owner="replica-c", lease_seconds=30),
        )
        taken = [row for row in takers if row is not None]
        assert len(taken) == 1
        assert taken[0].owner in ("replica-b", "replica-c")
        assert taken[0].binding == intent.binding
        state, _ = await stores[0].attempts.take("att-1", owner="replica-a", lease_seconds=30)
        assert state == "HELD"
    finally:
        for store in stores:
            await store.close()


async def _lease_until(url: str, attempt_id: str) -> float:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute(
            "SELECT lease_until FROM attempts WHERE attempt_id = %s", (attempt_id,)
        )
        row = await cur.fetchone()
        assert row is not None
        return float(row[0])


async def test_an_unreachable_database_is_store_unavailable_then_service_resumes(
    postgres: PostgresServer, pg_url: str
) -> None:
    store = await PostgresStore.open(pg_url, connect_timeout=2)
    try:
        assert await store.ping()
        await asyncio.to_thread(postgres.stop)
        try:
            with pytest.raises(StoreError) as err:
                await store.use_store.claim_grant(
                    "g-down", binding_digest="d", expires_at=100.0, now=1.0
                )
            assert err.value.code == "STORE_UNAVAILABLE"
            assert not await store.ping()
        finally:
            await asyncio.to_thread(postgres.start)

        async def back() -> bool:
            return await store.ping()

        deadline = asyncio.get_running_loop().time() + 30
        while not await back():
            assert asyncio.get_running_loop().time() < deadline, "the store never came back"
            await asyncio.sleep(0.1)
        assert await store.use_store.claim_grant(
            "g-down", binding_digest="d", expires_at=100.0, now=1.0
        )
    finally:
        await store.close()


async def test_a_key_whose_holder_never_opened_its_attempt_is_taken_over_after_its_lease(
    pg_url: str,
) -> None:
    """Each request runs in its own task (as aiohttp runs them), so each has its own holder.

    A key IN_PROGRESS whose holder's lease lapsed before its attempt opened is taken over by
    the next request; the old holder can then neither open an attempt nor record an answer.
    A key whose attempt opened belongs to it: never taken over while the attempt is open or
    its grant was claimed; taken over at once when the attempt closed without a claim."""
    store = await PostgresStore.open(pg_url, lease_seconds=0.3)
    intent = make_intent(now=1.0)
    scope = {"tenant": "t", "principal": "p", "key": "k-held"}
    mirror = SharedAttemptMirror(store.attempts, owner="replica-a", lease_seconds=30)

    async def begin() -> IdempotencyKind:
        state = await store.use_store.idempotency_begin(**scope, payload_digest="d", now=1.0)
        return state.kind

    async def open_attempt(attempt_id: str) -> None:
        await mirror.record(RecordType.ATTEMPT_OPENED, opened_record(attempt_id, intent))

    async def lapsed() -> None:
        await _until_true(
            pg_url,
            "SELECT lease_until < extract(epoch from clock_timestamp())"
            " FROM idempotency WHERE key = 'k-held'",
        )

    try:
        # The first request records the key, then loses the database (it does nothing more).
        first_done = asyncio.Event()
        first_go = asyncio.Event()
        first_errors: list[str] = []

        async def first() -> None:
            assert await begin() is IdempotencyKind.NEW
            first_done.set()
            await first_go.wait()  # back after the takeover: fenced off
            for step in (
                open_attempt("att-old"),
                store.use_store.idempotency_complete(
                    **scope, response={"status": 200, "body": {}}, now=2.0
                ),
            ):
                try:
                    await step
                except StoreError as exc:
                    first_errors.append(exc.code)

        first_task = asyncio.create_task(first())
        await first_done.wait()
        assert await asyncio.create_task(begin()) is IdempotencyKind.IN_PROGRESS  # lease live
        await lapsed()

        async def second() -> None:
            assert await begin() is IdempotencyKind.NEW  # taken over
            first_go.set()
            await first_task
            await open_attempt("att-new")  # the key now belongs to att-new

        await asyncio.create_task(second())
        assert first_errors == ["IDEMPOTENCY_TAKEN_OVER", "IDEMPOTENCY_TAKEN_OVER"]
        # The old holder's attempt never opened in the shared store.
        assert [row.attempt_id for row in await store.attempts.open_attempts()] == ["att-new"]
        await lapsed()
        assert await asyncio.create_task(begin()) is IdempotencyKind.IN_PROGRESS  # attempt open
        # A release from reconciliation leaves a key its open attempt holds.
        await asyncio.create_task(store.use_store.idempotency_release(**scope))
        assert await asyncio.create_task(begin()) is IdempotencyKind.IN_PROGRESS
        # Closed without claiming its grant (nothing was sent): free at once.
        await store.attempts.settle(attempt_id="att-new", closed=True, status="NOT_CLAIMED")

        async def third() -> None:
            assert await begin() is IdempotencyKind.NEW
            await open_attempt("att-3")
            await store.attempts.grant_claimed(
                attempt_id="att-3", grant_id="g", grant_expires_at="x", payload_digest="d"
            )
            await store.attempts.settle(attempt_id="att-3", closed=True, status="COMPLETED")

        await asyncio.create_task(third())
        await lapsed()
        # Claimed: its answer is the attempt's, never a new run's.
        assert await asyncio.create_task(begin()) is IdempotencyKind.IN_PROGRESS
        await asyncio.create_task(store.use_store.idempotency_release(**scope))
        assert await asyncio.create_task(begin()) is IdempotencyKind.IN_PROGRESS

        # Its answer was never recorded: a lease after the close, a retry opens the attempt
        # again for a lease keeper, whose reconciliation settles the key.
        await _until_true(
            pg_url,
            # (or already opened again, by a retry above that came late enough)
            "SELECT state = 'OPEN' OR closed_at < extract(epoch from clock_timestamp()) - 0.3"
            " FROM attempts WHERE attempt_id = 'att-3'",
        )
        assert await asyncio.create_task(begin()) is IdempotencyKind.IN_PROGRESS
        reopened = await store.attempts.take_lapsed(owner="replica-b", lease_seconds=30)
        assert reopened is not None
        assert (reopened.attempt_id, reopened.grant_claimed) == ("att-3", True)
        assert reopened.last_status == "ANSWER_NOT_RECORDED"
        answer = {"status": 200, "body": {"outcome": "COMPLETED"}}
        # Reconciliation settles every key the attempt holds (whatever the key is named).
        assert await store.use_store.idempotency_settle_attempt("att-3", response=answer, now=3.0)
        assert await store.use_store.idempotency_settle_attempt("att-3", response={}, now=3.0) == 0
        replay = await store.use_store.idempotency_begin(**scope, payload_digest="d", now=4.0)
        assert (replay.kind, replay.response) == (IdempotencyKind.REPLAY, answer)
    finally:
        await store.close()


async def _until_true(url: str, sql: str) -> None:
    """Poll ``sql`` (one boolean) on the database's own clock until it is true (10 s at most)."""

    async def wait() -> None:
        async with await psycopg.AsyncConnection.connect(url) as conn:
            while True:
                cur = await conn.execute(sql)
                row = await cur.fetchone()
                if row is not None and row[0]:
                    return
                await asyncio.sleep(0.05)

    await asyncio.wait_for(wait(), timeout=10)


async def test_a_statement_on_its_own_is_a_serializable_transaction(pg_url: str) -> None:
    """``statement`` sends no BEGIN: the session's default level is what it runs at."""
    store = await PostgresStore.open(pg_url)
    try:
        _, row = await store.statement("SELECT current_setting('transaction_isolation')")
        assert row == ("serializable",)
    finally:
        await store.close()


async def test_a_statement_cut_off_after_it_was_sent_is_unavailable_and_never_run_again(
    pg_url: str,
) -> None:
    """A claim waiting on another transaction's uncommitted claim of the same grant has its
    backend terminated: STORE_UNAVAILABLE (it may have committed, as far as the executor can
    tell), and nothing re-runs it: once the other transaction rolls back, the grant is free."""
    store = await PostgresStore.open(pg_url)
    try:
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as other:
            await other.execute("BEGIN")
            await other.execute(
                "INSERT INTO grant_claims (grant_id, binding_digest, expires_at, claimed_at)"
                " VALUES ('g-cut', 'd', 100, 1)"
            )
            claim = asyncio.create_task(
                store.use_store.claim_grant("g-cut", binding_digest="d", expires_at=100.0, now=1.0)
            )
            async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as admin:
                deadline = asyncio.get_running_loop().time() + 30
                while True:
                    cur = await admin.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO grant_claims%'"
                    )
                    if await cur.fetchall():
                        break
                    assert asyncio.get_running_loop().time() < deadline, "the claim never waited"
                    await asyncio.sleep(0.05)
            with pytest.raises(StoreError) as err:
                await claim
            assert err.value.code == "STORE_UNAVAILABLE"
            await other.execute("ROLLBACK")
        assert await store.use_store.claim_grant(
            "g-cut", binding_digest="d", expires_at=100.0, now=1.0
        )
    finally:
        await store.close()


async def test_pooled_connections_a_restart_dropped_are_replaced_before_anything_is_sent(
    postgres: PostgresServer, pg_url: str
) -> None:
    """After the server restarted, every pooled connection is dead; the next statements and
    transactions run at once on fresh ones (no error, no waiting for the pool to notice)."""
    store = await PostgresStore.open(pg_url, max_connections=4)
    try:
        # Fill the pool: four transactions at once hold four connections.
        await asyncio.gather(*(store.transaction(_sleep_briefly) for _ in range(4)))
        await asyncio.to_thread(postgres.stop)
        await asyncio.to_thread(postgres.start)
        results = await asyncio.gather(
            *(
                store.use_store.claim_grant(f"g-r{i}", binding_digest="d", expires_at=9.0, now=1.0)
                for i in range(4)
            ),
            store.ping(),
        )
        assert results == [True] * 5
    finally:
        await store.close()


async def _sleep_briefly(conn: psycopg.AsyncConnection[TupleRow]) -> None:
    await conn.execute("SELECT pg_sleep(0.05)")


async def test_idempotency_complete_takes_the_first_answer_and_refuses_a_missing_key(
    pg_url: str,
) -> None:
    store = await PostgresStore.open(pg_url)
    try:
        scope = {"tenant": "t", "principal": "p", "key": "k-complete"}
        answer = {"status": 200, "body": {"outcome": "COMPLETED"}}
        with pytest.raises(StoreError) as err:
            await store.use_store.idempotency_complete(**scope, response=answer, now=1.0)
        assert err.value.code == "IDEMPOTENCY_RECORD_MISSING"

        async def request() -> None:  # its own task, as aiohttp runs requests: its own holder
            begun = await store.use_store.idempotency_begin(**scope, payload_digest="x", now=1.0)
            assert begun.kind is IdempotencyKind.NEW
            await store.use_store.idempotency_complete(**scope, response=answer, now=2.0)
            await store.use_store.idempotency_complete(**scope, response=answer, now=3.0)

        await asyncio.create_task(request())
        replay = await store.use_store.idempotency_begin(**scope, payload_digest="x", now=4.0)
        assert replay.kind is IdempotencyKind.REPLAY
        assert replay.response == answer
    finally:
        await store.close()


async def test_a_pool_busy_with_a_burst_still_pings_true_at_once(pg_url: str) -> None:
    """Every pooled connection busy is backpressure, not "the store is down": the ping has its own
    connection. Pooled, it queued behind the burst past the health loop's one-second deadline
    and the next proposal was answered 503 STORE_UNAVAILABLE."""
    store = await PostgresStore.open(pg_url, max_connections=1, connect_timeout=5.0)
    held = asyncio.Event()
    release = asyncio.Event()

    async def hold(conn: psycopg.AsyncConnection[TupleRow]) -> None:
        held.set()
        await release.wait()

    holder = asyncio.ensure_future(store.transaction(hold))
    try:
        await asyncio.wait_for(held.wait(), 10)
        async with asyncio.timeout(1.0):  # the store-health loop's own deadline
            assert await store.ping() is True
    finally:
        release.set()
        await holder
        await store.close()
