"""The shared store when its server stops being the primary: a connection to a server that went
read-only (SQLSTATE 25006) is dropped, never kept, and the host list leads to the writable one;
and the lost-writes guard on a real database (``state/lostwrites.py``)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from agentsafe.executor.clock import format_ms, utc_day
from agentsafe.executor.state.lostwrites import LostWritesGuard, journal_claims
from agentsafe.executor.state.pgstore import PostgresStore
from agentsafe.executor.tools.pgserver import PostgresServer, PostgresUnavailable, postgres_server

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("postgres")]


@contextlib.contextmanager
def _server() -> Iterator[PostgresServer]:
    try:
        with postgres_server() as server:
            yield server
    except PostgresUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture
def two_servers() -> Iterator[tuple[PostgresServer, PostgresServer]]:
    with _server() as first, _server() as second:
        yield first, second


async def _grant_on(url: str, grant_id: str) -> bool:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute("SELECT 1 FROM grant_claims WHERE grant_id = %s", (grant_id,))
        return await cur.fetchone() is not None


async def test_a_server_gone_read_only_loses_its_connection_and_the_host_list_finds_the_primary(
    two_servers: tuple[PostgresServer, PostgresServer],
) -> None:
    first, second = two_servers
    first_url = first.create_database()
    name = first_url.rsplit("/", 1)[1]
    second.psql("postgres", f"CREATE DATABASE {name}")
    second_url = second.url(name)
    for url in (first_url, second_url):
        await (await PostgresStore.open(url)).close()  # both migrated
    both = (
        f"host=127.0.0.1,127.0.0.1 port={first.port},{second.port} user=agentsafe"
        f" dbname={name} target_session_attrs=read-write"
    )
    store = await PostgresStore.open(both)
    try:
        claims = store.use_store
        assert await claims.claim_grant("g-1", binding_digest="d", expires_at=1e12, now=1.0)
        assert await _grant_on(first_url, "g-1")
        # The first server stops taking writes while the pool holds its connections (a
        # demoted or fenced primary): every session there, the pooled ones too, answers 25006.
        first.psql("postgres", "ALTER SYSTEM SET default_transaction_read_only = on")
        first.psql("postgres", "SELECT pg_reload_conf()")
        async with await psycopg.AsyncConnection.connect(first_url) as probe:
            cur = await probe.execute("SHOW default_transaction_read_only")
            assert await cur.fetchone() == ("on",)
        for grant in ("g-2", "g-3", "g-4"):
            # refused there (25006), the connection dropped, the claim run on the writable one
            assert await claims.claim_grant(grant, binding_digest="d", expires_at=1e12, now=1.0)
            assert await _grant_on(second_url, grant)
            assert not await _grant_on(first_url, grant)
    finally:
        await store.close()


NOW = time.time()
AT = format_ms(NOW - 3600)  # the claims were made an hour ago
EXPIRES = format_ms(NOW - 3540)


def _journal(tmp_path: Path, records: list[dict[str, object]]) -> Path:
    root = tmp_path / "journal" / "attempts"
    root.mkdir(parents=True)
    day = utc_day(NOW - 3600)
    with (root / f"{day}.jsonl").open("w") as out:
        for record in records:
            out.write(json.dumps(record) + "\n")
    return tmp_path / "journal"


def _opened(attempt: str, key: str) -> dict[str, object]:
    return {
        "record": "ATTEMPT_OPENED",
        "at": AT,
        "attempt_id": attempt,
        "intent_hash": "sha256:" + "0" * 64,
        "caller": "treasury-workflow",
        "action": "create_payout",
        "intent": {
            "tenant_id": "t-1",
            "idempotency_key": key,
            "action": {"type": "create_payout", "resource": "r", "parameters": {"a": 1}},
        },
    }


def _claimed(attempt: str, grant: str, *, shared: bool = True) -> dict[str, object]:
    return {
        "record": "GRANT_CLAIMED",
        "at": AT,
        "attempt_id": attempt,
        "grant_id": grant,
        "grant_expires_at": EXPIRES,
        "payload_digest": "sha256:" + "1" * 64,
        **({"store": "shared"} if shared else {}),
    }


def test_the_journal_names_every_claim_the_database_acknowledged_and_none_never_sent(
    tmp_path: Path,
) -> None:
    journal = _journal(
        tmp_path,
        [
            _opened("a-1", "k-1"),
            _claimed("a-1", "g-1"),
            _opened("a-2", "k-2"),
            _claimed("a-2", "g-2"),
            {
                "record": "ATTEMPT_CLOSED",
                "at": AT,
                "attempt_id": "a-2",
                "outcome": "FAILED_BEFORE_DISPATCH",
                "executed": False,
            },
            _opened("a-3", "k-3"),  # never claimed
            # claimed on the journal's own SQLite store before it served a shared one (a
            # policy scaled from one replica to two): never in the shared database to lose
            _opened("a-4", "k-4"),
            _claimed("a-4", "g-4", shared=False),
        ],
    )
    claims = journal_claims(journal, now=NOW)
    assert [(c.attempt_id, c.grant_id) for c in claims] == [("a-1", "g-1")]
    # past the store's retention (less its margin) a claim is no longer the database's to keep
    assert journal_claims(journal, now=NOW + 24 * 3600) == []


async def test_the_guard_reasserts_a_lost_claim_and_leaves_a_kept_one(
    tmp_path: Path, pg_url: str
) -> None:
    journal = _journal(
        tmp_path,
        [
            _opened("a-1", "k-1"),
            _claimed("a-1", "g-1"),
            _opened("a-2", "k-2"),
            _claimed("a-2", "g-2"),
        ],
    )
    await (await PostgresStore.open(pg_url)).close()
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        await conn.execute("INSERT INTO grant_claims VALUES ('g-2', 'd', %s, 1)", (NOW,))
        # a-1's row survived the failover (it was opened before the lost claim), still under
        # r0's live lease and unclaimed: left so, r0 would renew it and nobody reconcile it
        await conn.execute(
            "INSERT INTO attempts (attempt_id, owner, lease_until, state, intent_hash, binding,"
            " opened_at) VALUES ('a-1', 'r0', %s, 'OPEN', 'h', '{}', 'x')",
            (NOW + 3600,),
        )
    guard = LostWritesGuard(journal, owner="r0")
    found: list[object] = []
    guard.on_lost = found.extend
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        await guard(conn)
        assert guard.verified is not None
        cur = await conn.execute("SELECT grant_id FROM grant_claims ORDER BY grant_id")
        granted = [r[0] for r in await cur.fetchall()]
        cur = await conn.execute(
            "SELECT state, owner, grant_claimed, last_status, epoch,"
            " lease_until < extract(epoch from clock_timestamp())"
            " FROM attempts WHERE attempt_id = 'a-1'"
        )
        attempt = await cur.fetchone()
        cur = await conn.execute("SELECT state, opened_attempt FROM idempotency WHERE key = 'k-1'")
        key = await cur.fetchone()
        await guard(conn)  # the same server again: not checked again
    assert guard.checks == 1
    assert [c.attempt_id for c in guard.lost.values()] == ["a-1"]
    assert len(found) == 1
    assert granted == ["g-1", "g-2"]
    assert attempt == ("OPEN", "STORE_LOST_WRITES:r0", True, "STORE_LOST_WRITES", 2, True)
    assert key == ("IN_PROGRESS", "a-1")
