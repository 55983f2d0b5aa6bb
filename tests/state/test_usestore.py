"""The SQLite use store: single claims across processes, idempotency, consumptions, approvals."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import hmac
import json
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from agentsafe.executor.canonical import canonical_text, sha256_digest
from agentsafe.executor.clock import ManualClock
from agentsafe.executor.errors import StoreError
from agentsafe.executor.state.pgattempts import PostgresAttempts
from agentsafe.executor.state.pgstore import PostgresUseStore
from agentsafe.executor.state.protocol import UseStore
from agentsafe.executor.state.records import (
    RETENTION_SECONDS,
    ApprovalError,
    ApprovalRequest,
    ApprovalState,
    ConsumptionRecord,
    IdempotencyKind,
    IdempotencyState,
    consumption_token,
)
from agentsafe.executor.state.usestore import DATABASE_NAME, SCHEMA_VERSION, SQLiteUseStore

NOW = 1_800_000_000.0
RACE_SCRIPT = Path(__file__).resolve().parents[1] / "support" / "usestore_race.py"


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[SQLiteUseStore]:
    """The SQLite backend alone, for the tests of its engine (``store``, in conftest.py, is
    each backend in turn)."""
    opened = await SQLiteUseStore.open(tmp_path / "state", clock=ManualClock(NOW))
    yield opened
    await opened.close()


def _race(state_dir: Path, mode: str, *args: str, processes: int, count: int) -> list[Any]:
    """Start ``processes`` racers, wait until every one has the store open, release them
    together, and return all their results."""
    children = [
        subprocess.Popen(
            [sys.executable, str(RACE_SCRIPT), str(state_dir), mode, str(count), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=state_dir.parent,
        )
        for _ in range(processes)
    ]
    try:
        for child in children:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "READY"
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.close()
        results: list[Any] = []
        for child in children:
            assert child.stdout is not None
            out = child.stdout.read()
            assert child.wait(timeout=120) == 0
            results.extend(json.loads(out))
        return results
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
            for pipe in (child.stdin, child.stdout):
                if pipe is not None:
                    pipe.close()


def _intent(amount: int = 100) -> dict[str, Any]:
    return {
        "protocol_version": "agent-safe.intent/1",
        "tenant_id": "acme",
        "action": {"type": "create_payout", "resource": "payouts", "parameters": {"a": amount}},
    }


def _request(request_id: str = "req-1", *, expires_at: float = NOW + 300) -> ApprovalRequest:
    intent = _intent()
    return ApprovalRequest(
        request_id=request_id,
        intent=intent,
        intent_hash=sha256_digest(intent),
        approvers=("lead-a", "lead-b"),
        proposer_principal="agent-1",
        proposer_actor="actor-1",
        expires_at=expires_at,
        created_at=NOW,
    )


# -- opening -----------------------------------------------------------------------------------


async def test_open_creates_a_private_wal_database(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    store = await SQLiteUseStore.open(state_dir, clock=ManualClock(NOW))
    try:
        assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700
        assert stat.S_IMODE((state_dir / DATABASE_NAME).stat().st_mode) == 0o600
        synchronous = await store._run(lambda c: c.execute("PRAGMA synchronous").fetchone()[0])
        assert synchronous == 2  # FULL
    finally:
        await store.close()
    with sqlite3.connect(state_dir / DATABASE_NAME) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
    conn.close()


async def test_a_version_1_store_gains_attempt_and_owner_and_keeps_its_keys(
    tmp_path: Path,
) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    with sqlite3.connect(state_dir / DATABASE_NAME) as conn:
        conn.execute(
            "CREATE TABLE idempotency (tenant TEXT NOT NULL, principal TEXT NOT NULL,"
            " key TEXT NOT NULL, payload_digest TEXT NOT NULL, state TEXT NOT NULL,"
            " response TEXT, created_at REAL NOT NULL, completed_at REAL,"
            " PRIMARY KEY (tenant, principal, key))"
        )
        conn.execute(
            "INSERT INTO idempotency VALUES ('t', 'p', 'old', 'd', 'IN_PROGRESS', NULL, 1, NULL)"
        )
        conn.execute("PRAGMA user_version = 1")
    conn.close()
    store = await SQLiteUseStore.open(state_dir, clock=ManualClock(NOW))
    try:
        state = await store.idempotency_begin(
            tenant="t", principal="p", key="old", payload_digest="d", now=NOW
        )
        assert state.kind is IdempotencyKind.IN_PROGRESS
        await store.idempotency_begin(
            tenant="t",
            principal="p",
            key="new",
            payload_digest="d",
            now=NOW,
            attempt_id="att-1",
            owner="journal-a",
        )
        orphans = await store.idempotency_orphans(owner="journal-a", before=NOW + 1)
        assert [(o.key, o.attempt_id) for o in orphans] == [("new", "att-1")]
        assert await store.idempotency_orphans(owner="journal-a", before=NOW) == []
        assert await store.idempotency_orphans(owner="journal-b", before=NOW + 1) == []
        found = await store.idempotency_for_attempt("att-1")
        assert found is not None
        assert found.scope == {"tenant": "t", "principal": "p", "key": "new"}
        assert await store.idempotency_for_attempt("att-2") is None
        assert not await store.grant_claimed("g-1")
        assert await store.claim_grant("g-1", binding_digest="b", expires_at=NOW + 60, now=NOW)
        assert await store.grant_claimed("g-1")
    finally:
        await store.close()


async def test_purge_frees_an_old_in_flight_key_only_where_no_journal_ran(tmp_path: Path) -> None:
    store = await SQLiteUseStore.open(tmp_path / "state", clock=ManualClock(NOW))
    try:
        for key, owner in (("shadow", ""), ("journaled", "journal-a")):
            await store.idempotency_begin(
                tenant="t",
                principal="p",
                key=key,
                payload_digest="d",
                now=NOW,
                attempt_id="att-" + key,
                owner=owner,
            )
        assert await store.purge(NOW + RETENTION_SECONDS - 1) == 0
        assert await store.purge(NOW + RETENTION_SECONDS + 1) == 1
        assert await store.idempotency_for_attempt("att-shadow") is None
        assert await store.idempotency_for_attempt("att-journaled") is not None
    finally:
        await store.close()


async def test_open_tightens_an_existing_loose_directory(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o755)
    state_dir.chmod(0o755)
    store = await SQLiteUseStore.open(state_dir, clock=ManualClock(NOW))
    await store.close()
    assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700


async def test_open_refuses_a_newer_schema(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    store = await SQLiteUseStore.open(state_dir, clock=ManualClock(NOW))
    await store.close()
    conn = sqlite3.connect(state_dir / DATABASE_NAME)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(StoreError) as caught:
        await SQLiteUseStore.open(state_dir, clock=ManualClock(NOW))
    assert caught.value.code == "STORE_SCHEMA_UNSUPPORTED"


async def test_a_closed_store_refuses_work(tmp_path: Path) -> None:
    store = await SQLiteUseStore.open(tmp_path / "state", clock=ManualClock(NOW))
    await store.close()
    await store.close()  # idempotent
    with pytest.raises(StoreError) as caught:
        await store.claim_grant("g", binding_digest="d", expires_at=NOW, now=NOW)
    assert caught.value.code == "STORE_CLOSED"


async def test_the_allow_writes_hand_back_their_futures(tmp_path: Path) -> None:
    """Issue 32: the three writes of an ALLOW are the write's own future (no store frame in the
    request's await chain); a closed store refuses at the call, as it refused when awaited."""
    store = await SQLiteUseStore.open(tmp_path / "state", clock=ManualClock(NOW))
    ids = {"tenant": "acme", "principal": "agent-1", "key": "k"}
    begun = store.idempotency_begin(**ids, payload_digest="sha256:p", now=NOW)
    claimed = store.claim_grant("g", binding_digest="d", expires_at=NOW + 60, now=NOW)
    assert isinstance(begun, asyncio.Future)
    assert isinstance(claimed, asyncio.Future)
    assert (await begun).kind is IdempotencyKind.NEW
    assert await claimed
    completed = store.idempotency_complete(**ids, response={"x": 1}, now=NOW)
    assert isinstance(completed, asyncio.Future)
    assert await completed is None
    await store.close()
    for write in (
        lambda: store.idempotency_begin(**ids, payload_digest="sha256:p", now=NOW),
        lambda: store.claim_grant("g", binding_digest="d", expires_at=NOW, now=NOW),
        lambda: store.idempotency_complete(**ids, response={"x": 1}, now=NOW),
    ):
        with pytest.raises(StoreError) as caught:
            write()
        assert caught.value.code == "STORE_CLOSED"


# -- grant claims ------------------------------------------------------------------------------


async def test_a_grant_is_claimed_once(store: UseStore) -> None:
    first = await store.claim_grant("g-1", binding_digest="sha256:a", expires_at=NOW + 60, now=NOW)
    again = await store.claim_grant("g-1", binding_digest="sha256:a", expires_at=NOW + 60, now=NOW)
    other = await store.claim_grant("g-2", binding_digest="sha256:a", expires_at=NOW + 60, now=NOW)
    assert (first, again, other) == (True, False, True)


def test_fifty_claims_from_five_processes_yield_one_success(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    results = _race(state_dir, "claim", "grant-raced", processes=5, count=10)
    assert len(results) == 50
    assert results.count(True) == 1
    assert results.count(False) == 49


# -- idempotency -------------------------------------------------------------------------------


async def test_idempotency_state_machine(store: UseStore) -> None:
    ids = {"tenant": "acme", "principal": "agent-1", "key": "k-1"}
    first = await store.idempotency_begin(**ids, payload_digest="sha256:p1", now=NOW)
    assert first.kind is IdempotencyKind.NEW
    in_flight = await store.idempotency_begin(**ids, payload_digest="sha256:p1", now=NOW)
    assert in_flight.kind is IdempotencyKind.IN_PROGRESS
    assert in_flight.response is None
    conflict = await store.idempotency_begin(**ids, payload_digest="sha256:p2", now=NOW)
    assert conflict.kind is IdempotencyKind.CONFLICT

    answer = {"outcome": "COMPLETED", "executed": True, "reason_codes": []}
    await store.idempotency_complete(**ids, response=answer, now=NOW + 1)
    replay = await store.idempotency_begin(**ids, payload_digest="sha256:p1", now=NOW + 2)
    assert replay.kind is IdempotencyKind.REPLAY
    assert replay.response == answer
    after = await store.idempotency_begin(**ids, payload_digest="sha256:p2", now=NOW + 2)
    assert after.kind is IdempotencyKind.CONFLICT


async def test_a_key_recorded_with_its_final_answer_in_one_write(store: UseStore) -> None:
    """A BLOCK's key and answer together (issue 34): a new key is NEW and replays that answer
    from then on; a key already kept is reported as ``idempotency_begin`` reports it, and keeps
    what it had."""
    ids = {"tenant": "acme", "principal": "agent-1", "key": "k-rec"}
    blocked = {"status": 200, "body": {"outcome": "BLOCKED", "executed": False}}
    first = await store.idempotency_record(
        **ids, payload_digest="sha256:p1", response=blocked, now=NOW
    )
    assert first == IdempotencyState(IdempotencyKind.NEW)
    replay = await store.idempotency_begin(**ids, payload_digest="sha256:p1", now=NOW + 1)
    assert (replay.kind, replay.response) == (IdempotencyKind.REPLAY, blocked)
    other = {"status": 200, "body": {"outcome": "BLOCKED", "executed": False, "n": 2}}
    again = await store.idempotency_record(
        **ids, payload_digest="sha256:p1", response=other, now=NOW + 2
    )
    assert (again.kind, again.response) == (IdempotencyKind.REPLAY, blocked)
    conflict = await store.idempotency_record(
        **ids, payload_digest="sha256:p2", response=other, now=NOW + 2
    )
    assert conflict == IdempotencyState(IdempotencyKind.CONFLICT)

    flight = {**ids, "key": "k-flight"}
    assert (await store.idempotency_begin(**flight, payload_digest="sha256:p1", now=NOW)).kind is (
        IdempotencyKind.NEW
    )
    in_flight = await store.idempotency_record(
        **flight, payload_digest="sha256:p1", response=blocked, now=NOW + 1
    )
    assert in_flight == IdempotencyState(IdempotencyKind.IN_PROGRESS)
    completed = {"status": 200, "body": {"outcome": "COMPLETED", "executed": True}}
    await store.idempotency_complete(**flight, response=completed, now=NOW + 2)
    kept = await store.idempotency_begin(**flight, payload_digest="sha256:p1", now=NOW + 3)
    assert (kept.kind, kept.response) == (IdempotencyKind.REPLAY, completed)


async def test_idempotency_keys_are_scoped_by_tenant_and_principal(store: UseStore) -> None:
    kinds = [
        (
            await store.idempotency_begin(
                tenant=t, principal=p, key="shared", payload_digest="sha256:p", now=NOW
            )
        ).kind
        for t, p in [("acme", "a"), ("acme", "b"), ("other", "a"), ("acme", "a")]
    ]
    assert kinds == [
        IdempotencyKind.NEW,
        IdempotencyKind.NEW,
        IdempotencyKind.NEW,
        IdempotencyKind.IN_PROGRESS,
    ]


async def test_release_frees_an_in_flight_key_but_never_a_finished_one(
    store: UseStore,
) -> None:
    ids = {"tenant": "acme", "principal": "agent-1"}
    await store.idempotency_begin(**ids, key="k", payload_digest="sha256:p", now=NOW)
    await store.idempotency_release(**ids, key="k")
    again = await store.idempotency_begin(**ids, key="k", payload_digest="sha256:other", now=NOW)
    assert again.kind is IdempotencyKind.NEW

    await store.idempotency_complete(**ids, key="k", response={"outcome": "BLOCKED"}, now=NOW)
    await store.idempotency_release(**ids, key="k")
    kept = await store.idempotency_begin(**ids, key="k", payload_digest="sha256:other", now=NOW)
    assert kept.kind is IdempotencyKind.REPLAY
    assert kept.response == {"outcome": "BLOCKED"}


async def test_complete_keeps_the_first_final_answer(store: UseStore) -> None:
    ids = {"tenant": "acme", "principal": "agent-1", "key": "k"}
    with pytest.raises(StoreError) as missing:
        await store.idempotency_complete(**ids, response={"x": 1}, now=NOW)
    assert (missing.value.code, missing.value.message) == (
        "IDEMPOTENCY_RECORD_MISSING",
        "no idempotency record for this key",
    )

    await store.idempotency_begin(**ids, payload_digest="sha256:p", now=NOW)
    await store.idempotency_complete(**ids, response={"x": 1}, now=NOW)
    await store.idempotency_complete(**ids, response={"x": 1}, now=NOW + 5)  # same: accepted
    with pytest.raises(StoreError) as changed:
        await store.idempotency_complete(**ids, response={"x": 2}, now=NOW + 5)
    assert (changed.value.code, changed.value.message) == (
        "IDEMPOTENCY_ALREADY_COMPLETE",
        "this key already has a final answer",
    )
    replay = await store.idempotency_begin(**ids, payload_digest="sha256:p", now=NOW)
    assert replay.response == {"x": 1}


async def test_complete_refuses_a_response_without_canonical_form(store: UseStore) -> None:
    ids = {"tenant": "acme", "principal": "agent-1", "key": "k"}
    await store.idempotency_begin(**ids, payload_digest="sha256:p", now=NOW)
    with pytest.raises(StoreError) as caught:
        await store.idempotency_complete(**ids, response={"x": float("nan")}, now=NOW)
    assert caught.value.code == "STORE_VALUE_INVALID"
    still = await store.idempotency_begin(**ids, payload_digest="sha256:p", now=NOW)
    assert still.kind is IdempotencyKind.IN_PROGRESS


def test_concurrent_begins_from_several_processes_create_one_record(tmp_path: Path) -> None:
    results = _race(tmp_path / "state", "begin", "key-raced", processes=5, count=6)
    assert len(results) == 30
    assert results.count("NEW") == 1
    assert results.count("IN_PROGRESS") == 29


async def test_purge_deletes_only_old_finished_records(store: UseStore) -> None:
    ids = {"tenant": "acme", "principal": "agent-1"}
    await store.idempotency_begin(**ids, key="done", payload_digest="sha256:p", now=NOW)
    await store.idempotency_complete(**ids, key="done", response={"ok": True}, now=NOW)
    await store.idempotency_begin(**ids, key="open", payload_digest="sha256:p", now=NOW)
    await store.claim_grant("g", binding_digest="sha256:b", expires_at=NOW + 60, now=NOW)

    assert await store.purge(NOW + RETENTION_SECONDS - 1) == 0
    kept = await store.idempotency_begin(**ids, key="done", payload_digest="sha256:p", now=NOW)
    assert kept.kind is IdempotencyKind.REPLAY

    assert await store.purge(NOW + RETENTION_SECONDS + 61) == 2
    gone = await store.idempotency_begin(**ids, key="done", payload_digest="sha256:p", now=NOW)
    assert gone.kind is IdempotencyKind.NEW
    still = await store.idempotency_begin(**ids, key="open", payload_digest="sha256:p", now=NOW)
    assert still.kind is IdempotencyKind.IN_PROGRESS


# -- consumptions ------------------------------------------------------------------------------


async def test_consume_once_and_verify(store: UseStore) -> None:
    binding = {"plan": "p-1", "digest": "sha256:abc"}
    record = await store.consume("plan-approval", "a-1", binding=binding, now=NOW)
    assert record is not None
    assert record.binding_digest == sha256_digest(binding)
    assert await store.verify_consumption(record)
    assert await store.consume("plan-approval", "a-1", binding=binding, now=NOW + 1) is None
    other = await store.consume("other-namespace", "a-1", binding=binding, now=NOW)
    assert other is not None
    assert other.nonce != record.nonce
    for nonce in (record.nonce, other.nonce):  # 128 random bits, in hex
        assert len(nonce) == 32
        assert set(nonce) <= set("0123456789abcdef")


def test_the_consumption_token_is_one_hmac_of_five_named_fields() -> None:
    """Both stores (SQLite here, PostgreSQL in ``pgstore``) compute a consumption token this one
    way, and a token recorded before an upgrade verifies after it: HMAC-SHA256 under the store's
    secret of the RFC 8785 text of exactly these five fields, by these names."""
    fields = {
        "namespace": "plan-approval",
        "key": "a-1",
        "nonce": "0f" * 16,
        "consumed_at": NOW,
        "binding_digest": "sha256:" + "ab" * 32,
    }
    message = canonical_text(fields).encode()
    token = consumption_token(b"the store's secret", **fields)
    assert token == hmac.new(b"the store's secret", message, hashlib.sha256).hexdigest()
    # The same, computed by hand from the sorted-key text: the rule itself, pinned.
    assert token == "fa6a24540eb4a98798ed4567b8fa817f745051008c78abf2ab4f79a4c7a4e39c"


async def test_verify_refuses_tampered_or_unknown_records(store: UseStore) -> None:
    record = await store.consume("plan-approval", "a-1", binding={"x": 1}, now=NOW)
    assert record is not None
    flipped = ("0" if record.token[0] != "0" else "1") + record.token[1:]
    tampered = [
        dataclasses.replace(record, token=flipped),
        dataclasses.replace(record, token=""),
        dataclasses.replace(record, binding_digest=sha256_digest({"x": 2})),
        dataclasses.replace(record, nonce="0" * 32),
        dataclasses.replace(record, consumed_at=NOW + 1),
        dataclasses.replace(record, key="a-2"),
        dataclasses.replace(record, consumed_at=float("nan")),  # no canonical form: no token
    ]
    for candidate in tampered:
        assert not await store.verify_consumption(candidate), candidate


async def test_verify_refuses_a_forged_token_for_a_row_that_exists(
    store: UseStore, tmp_path: Path
) -> None:
    """A record minted by another store (another secret) for the same row does not verify."""
    record = await store.consume("ns", "k", binding={"x": 1}, now=NOW)
    assert record is not None
    elsewhere = await SQLiteUseStore.open(tmp_path / "elsewhere", clock=ManualClock(NOW))
    try:
        foreign = await elsewhere.consume("ns", "k", binding={"x": 1}, now=NOW)
        assert foreign is not None
        forged = dataclasses.replace(record, token=foreign.token)
        assert not await store.verify_consumption(forged)
        assert not await elsewhere.verify_consumption(record)
    finally:
        await elsewhere.close()


async def test_a_record_whose_row_was_removed_no_longer_verifies(
    sqlite_store: SQLiteUseStore,
) -> None:
    store = sqlite_store
    record = await store.consume("ns", "k", binding={"x": 1}, now=NOW)
    assert record is not None
    await store._run(lambda c: c.execute("DELETE FROM consumptions"))
    assert not await store.verify_consumption(record)


# -- approvals ---------------------------------------------------------------------------------


async def test_approval_lifecycle(store: UseStore) -> None:
    request = _request()
    await store.approval_create(request)
    got = await store.approval_get("req-1")
    assert got is not None
    assert got.request == request
    assert got.state_at(NOW) is ApprovalState.PENDING

    pending = await store.approval_list(state=ApprovalState.PENDING, now=NOW)
    assert [r.request.request_id for r in pending] == ["req-1"]
    assert await store.approval_list(state=ApprovalState.PENDING, now=NOW, approver="lead-a")
    assert not await store.approval_list(state=ApprovalState.PENDING, now=NOW, approver="nobody")
    assert not await store.approval_list(state=ApprovalState.PENDING, now=NOW, approver="agent-1")

    decided = await store.approval_decide(
        "req-1", decision="APPROVE", approver="lead-a", reason="ok", now=NOW + 10
    )
    assert decided.stored_state is ApprovalState.APPROVED
    assert (decided.approver, decided.reason, decided.decided_at) == ("lead-a", "ok", NOW + 10)
    assert await store.approval_get("req-1") == decided
    assert not await store.approval_list(state=ApprovalState.PENDING, now=NOW)
    approved = await store.approval_list(state=ApprovalState.APPROVED, now=NOW)
    assert [r.request.request_id for r in approved] == ["req-1"]


async def test_a_second_decision_is_refused(store: UseStore) -> None:
    await store.approval_create(_request())
    await store.approval_decide("req-1", decision="DENY", approver="lead-a", reason="", now=NOW)
    for decision, approver in [("APPROVE", "lead-b"), ("DENY", "lead-a")]:
        with pytest.raises(ApprovalError) as caught:
            await store.approval_decide(
                "req-1", decision=decision, approver=approver, reason="", now=NOW
            )
        assert caught.value.code == "APPROVAL_ALREADY_DECIDED"
    record = await store.approval_get("req-1")
    assert record is not None
    assert (record.stored_state, record.approver) == (ApprovalState.DENIED, "lead-a")


@pytest.mark.parametrize(
    ("request_id", "decision", "approver", "now", "code"),
    [
        ("missing", "APPROVE", "lead-a", NOW, "APPROVAL_NOT_FOUND"),
        ("req-1", "APPROVE", "lead-a", NOW + 300, "APPROVAL_EXPIRED"),
        ("req-1", "APPROVE", "agent-1", NOW, "APPROVAL_NOT_PERMITTED"),
        ("req-1", "APPROVE", "stranger", NOW, "APPROVAL_NOT_PERMITTED"),
        ("req-1", "MAYBE", "lead-a", NOW, "APPROVAL_DECISION_INVALID"),
    ],
)
async def test_refused_decisions_change_nothing(
    store: UseStore, request_id: str, decision: str, approver: str, now: float, code: str
) -> None:
    await store.approval_create(_request())
    with pytest.raises(ApprovalError) as caught:
        await store.approval_decide(
            request_id, decision=decision, approver=approver, reason="r", now=now
        )
    assert caught.value.code == code
    record = await store.approval_get("req-1")
    assert record is not None
    assert record.stored_state is ApprovalState.PENDING
    assert record.approver is None


async def test_the_proposer_cannot_approve_even_when_listed(store: UseStore) -> None:
    request = dataclasses.replace(_request(), approvers=("agent-1", "lead-a"))
    await store.approval_create(request)
    with pytest.raises(ApprovalError) as caught:
        await store.approval_decide(
            "req-1", decision="APPROVE", approver="agent-1", reason="", now=NOW
        )
    assert caught.value.code == "APPROVAL_NOT_PERMITTED"


async def test_expired_requests_list_as_expired(store: UseStore) -> None:
    await store.approval_create(_request("old", expires_at=NOW + 10))
    await store.approval_create(_request("new", expires_at=NOW + 100))
    later = NOW + 10
    pending = await store.approval_list(state=ApprovalState.PENDING, now=later)
    expired = await store.approval_list(state=ApprovalState.EXPIRED, now=later)
    assert [r.request.request_id for r in pending] == ["new"]
    assert [r.request.request_id for r in expired] == ["old"]
    assert expired[0].state_at(later) is ApprovalState.EXPIRED


async def test_create_refuses_duplicates_and_rebound_intents(store: UseStore) -> None:
    await store.approval_create(_request())
    with pytest.raises(ApprovalError) as duplicate:
        await store.approval_create(_request())
    assert duplicate.value.code == "APPROVAL_EXISTS"
    rebound = dataclasses.replace(_request("req-2"), intent=_intent(amount=999_999))
    with pytest.raises(ApprovalError) as mismatch:
        await store.approval_create(rebound)
    assert mismatch.value.code == "APPROVAL_BINDING_MISMATCH"
    assert await store.approval_get("req-2") is None


def test_concurrent_deciders_in_several_processes_record_one_decision(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"

    async def prepare() -> None:
        store = await SQLiteUseStore.open(state_dir, clock=ManualClock(NOW))
        try:
            await store.approval_create(_request("raced", expires_at=NOW + 300))
        finally:
            await store.close()

    asyncio.run(prepare())
    results = _race(state_dir, "decide", "raced", "lead-a", processes=4, count=3)
    assert len(results) == 12
    assert results.count("OK") == 1
    assert results.count("APPROVAL_ALREADY_DECIDED") == 11


# -- durability --------------------------------------------------------------------------------


async def test_everything_survives_a_reopen(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    store = await SQLiteUseStore.open(state_dir, clock=ManualClock(NOW))
    ids = {"tenant": "acme", "principal": "agent-1", "key": "k"}
    try:
        assert await store.claim_grant("g", binding_digest="d", expires_at=NOW + 60, now=NOW)
        await store.idempotency_begin(**ids, payload_digest="sha256:p", now=NOW)
        await store.idempotency_complete(**ids, response={"done": True}, now=NOW)
        await store.idempotency_begin(**{**ids, "key": "k2"}, payload_digest="sha256:p", now=NOW)
        record = await store.consume("ns", "c", binding={"b": 1}, now=NOW)
        assert record is not None
        await store.approval_create(_request())
    finally:
        await store.close()

    reopened = await SQLiteUseStore.open(state_dir, clock=ManualClock(NOW))
    try:
        assert not await reopened.claim_grant("g", binding_digest="d", expires_at=NOW, now=NOW)
        replay = await reopened.idempotency_begin(**ids, payload_digest="sha256:p", now=NOW)
        assert replay.response == {"done": True}
        in_flight = await reopened.idempotency_begin(
            **{**ids, "key": "k2"}, payload_digest="sha256:p", now=NOW
        )
        assert in_flight.kind is IdempotencyKind.IN_PROGRESS
        assert await reopened.verify_consumption(record)  # the secret persisted
        assert await reopened.consume("ns", "c", binding={"b": 1}, now=NOW) is None
        approval = await reopened.approval_get("req-1")
        assert approval is not None
        assert approval.request == _request()
    finally:
        await reopened.close()


async def test_settle_replaces_only_an_unknown_answer(store: UseStore) -> None:
    scope = {"tenant": "t", "principal": "p"}
    unknown = {"status": 200, "body": {"outcome": "UNKNOWN_AFTER_DISPATCH"}}
    settled = {"status": 200, "body": {"outcome": "DEFINITELY_NOT_EXECUTED"}}
    for key, first in (
        ("unknown", unknown),
        ("done", {"status": 200, "body": {"outcome": "COMPLETED"}}),
    ):
        await store.idempotency_begin(**scope, key=key, payload_digest="d", now=NOW)
        await store.idempotency_complete(**scope, key=key, response=first, now=NOW)
    assert await store.idempotency_settle(**scope, key="unknown", response=settled, now=NOW)
    assert not await store.idempotency_settle(**scope, key="done", response=settled, now=NOW)
    assert not await store.idempotency_settle(**scope, key="absent", response=settled, now=NOW)
    await store.idempotency_begin(**scope, key="flight", payload_digest="d", now=NOW)
    assert await store.idempotency_settle(**scope, key="flight", response=settled, now=NOW)
    for key, outcome in (
        ("unknown", "DEFINITELY_NOT_EXECUTED"),
        ("done", "COMPLETED"),
        ("flight", "DEFINITELY_NOT_EXECUTED"),
    ):
        state = await store.idempotency_begin(**scope, key=key, payload_digest="d", now=NOW)
        assert state.kind == "REPLAY"
        assert state.response is not None
        assert state.response["body"]["outcome"] == outcome


async def _attempt_opens(store: UseStore, attempt_id: str) -> None:
    """The attempt the key was begun for opens. On SQLite the journal alone records it (the
    key already names it); on PostgreSQL the attempt's row is inserted and the key this task
    began becomes the attempt's (``state/pgattempts.py``)."""
    if isinstance(store, PostgresUseStore):
        await PostgresAttempts(store._store).opened(
            owner="replica-a",
            lease_seconds=30.0,
            attempt_id=attempt_id,
            fields={"intent_hash": "h"},
            binding={},
            opened_at="2027-01-15T08:00:00.000Z",
        )


async def test_settle_attempt_answers_every_key_in_flight_for_that_attempt(
    store: UseStore,
) -> None:
    """An approval's key (``approval:<request id>``) is not the one its intent names: the
    reconciled answer reaches it through its attempt, on every backend."""
    scope = {"tenant": "t", "principal": "p"}
    for key, attempt in (("approval:req-1", "att-1"), ("approval:req-2", "att-2")):
        state = await store.idempotency_begin(
            **scope, key=key, payload_digest="d", now=NOW, attempt_id=attempt, owner="replica-a"
        )
        assert state.kind is IdempotencyKind.NEW
        await _attempt_opens(store, attempt)
    settled = {"status": 200, "body": {"outcome": "DEFINITELY_NOT_EXECUTED"}}
    assert await store.idempotency_settle_attempt("att-1", response=settled, now=NOW + 1) == 1
    replay = await store.idempotency_begin(
        **scope, key="approval:req-1", payload_digest="d", now=NOW + 2
    )
    assert replay.kind is IdempotencyKind.REPLAY
    assert replay.response == settled
    other = await store.idempotency_begin(
        **scope, key="approval:req-2", payload_digest="d", now=NOW + 2
    )
    assert other.kind is IdempotencyKind.IN_PROGRESS  # another attempt's key is left alone
    # Only keys still in flight take it: a finished one is never rewritten.
    again = {"status": 200, "body": {"outcome": "COMPLETED"}}
    assert await store.idempotency_settle_attempt("att-1", response=again, now=NOW + 3) == 0
    replay = await store.idempotency_begin(
        **scope, key="approval:req-1", payload_digest="d", now=NOW + 4
    )
    assert replay.response == settled


# -- group commit ------------------------------------------------------------------------------


class CommitCounter:
    """Wraps the store's commit step and counts group commits (each is one fsync)."""

    def __init__(self, store: SQLiteUseStore) -> None:
        self.commits = 0
        self._inner = store._commit
        store._commit = self

    def __call__(self, conn: sqlite3.Connection) -> None:
        self._inner(conn)
        self.commits += 1


class FailingCommit:
    """Test double for a COMMIT the disk refuses: raises where the commit would happen."""

    def __init__(self, store: SQLiteUseStore) -> None:
        self.calls = 0
        self._store = store
        self._inner = store._commit
        store._commit = self

    def __call__(self, conn: sqlite3.Connection) -> None:
        self.calls += 1
        raise sqlite3.OperationalError("disk I/O error (test double)")

    def restore(self) -> None:
        self._store._commit = self._inner


@contextlib.asynccontextmanager
async def held_worker(store: SQLiteUseStore) -> AsyncIterator[None]:
    """Keep the store's one thread busy; writes submitted inside the block queue up and form
    one group when it ends."""
    entered, release = threading.Event(), threading.Event()

    def hold(_conn: sqlite3.Connection) -> None:
        entered.set()
        release.wait(timeout=60)

    holder = asyncio.ensure_future(store._run(hold))
    try:
        assert await asyncio.to_thread(entered.wait, 60)
        yield
    finally:
        release.set()
        await holder


async def _queued(store: SQLiteUseStore, count: int) -> None:
    """Poll (deadline, no sleeps) until ``count`` writes wait in the store's queue."""
    deadline = time.monotonic() + 30
    while len(store._pending) < count:
        assert time.monotonic() < deadline, "writes never reached the queue"
        await asyncio.sleep(0)


async def _one_group(
    store: SQLiteUseStore, operations: Callable[[], list[Awaitable[Any]]]
) -> list[Any]:
    """Submit ``operations()`` while the worker is held so they share one group; their results
    (exceptions returned, not raised), in submission order. A thunk, because the writes of every
    ALLOW (``idempotency_begin``, ``claim_grant``, ``idempotency_complete``) are queued when
    they are called, not when they are awaited."""
    async with held_worker(store):
        tasks = [asyncio.ensure_future(op) for op in operations()]
        await _queued(store, len(tasks))
    return list(await asyncio.gather(*tasks, return_exceptions=True))


def _code(result: object) -> str:
    assert isinstance(result, StoreError), result
    return result.code


def _rows(state_dir: Path, sql: str) -> list[tuple[Any, ...]]:
    """What another connection (another process would) sees as committed."""
    conn = sqlite3.connect(state_dir / DATABASE_NAME)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


async def test_two_hundred_concurrent_begins_share_one_commit(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    store = await SQLiteUseStore.open(state_dir, clock=ManualClock(NOW))
    try:
        counter = CommitCounter(store)
        results = await _one_group(
            store,
            lambda: [
                store.idempotency_begin(
                    tenant="acme", principal="p", key=f"k-{i}", payload_digest="sha256:p", now=NOW
                )
                for i in range(200)
            ],
        )
        assert [r.kind for r in results] == [IdempotencyKind.NEW] * 200
        assert counter.commits == 1  # 200 writes, one fsync
        assert _rows(state_dir, "SELECT count(*) FROM idempotency") == [(200,)]
    finally:
        await store.close()


async def test_a_group_wakes_its_callers_loop_once(tmp_path: Path) -> None:
    """A group's answers cross from the store's thread to the event loop in one wakeup, not one
    per write (each wakeup is a write to the loop's self-pipe and a turn of the selector)."""
    store = await SQLiteUseStore.open(tmp_path / "state", clock=ManualClock(NOW))
    loop = asyncio.get_running_loop()
    store_thread_calls = 0
    inner = loop.call_soon_threadsafe

    def counting(callback: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal store_thread_calls
        if threading.current_thread().name.startswith("agentsafe-usestore"):
            store_thread_calls += 1
        return inner(callback, *args, **kwargs)

    try:
        async with held_worker(store):
            loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
            tasks = [
                asyncio.ensure_future(
                    store.claim_grant(f"g-{i}", binding_digest="d", expires_at=NOW + 60, now=NOW)
                )
                for i in range(50)
            ]
            await _queued(store, len(tasks))
        assert await asyncio.gather(*tasks) == [True] * 50
        # the held read's own answer is one wakeup (run_in_executor); the group's is the other
        assert store_thread_calls <= 2
    finally:
        loop.call_soon_threadsafe = inner  # type: ignore[method-assign]
        await store.close()


async def test_callers_are_answered_only_after_their_commit_returned(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    store = await SQLiteUseStore.open(state_dir, clock=ManualClock(NOW))
    in_commit, finish = threading.Event(), threading.Event()
    inner = store._commit

    def slow_commit(conn: sqlite3.Connection) -> None:
        in_commit.set()
        finish.wait(timeout=60)
        inner(conn)

    store._commit = slow_commit
    try:
        tasks = [
            asyncio.ensure_future(
                store.claim_grant(f"g-{i}", binding_digest="d", expires_at=NOW + 60, now=NOW)
            )
            for i in range(5)
        ]
        assert await asyncio.to_thread(in_commit.wait, 60)
        for _ in range(10):
            await asyncio.sleep(0)  # give any premature answer the chance to arrive
        assert not any(task.done() for task in tasks)
        assert _rows(state_dir, "SELECT count(*) FROM grant_claims") == [(0,)]
        finish.set()
        assert await asyncio.gather(*tasks) == [True] * 5
        assert _rows(state_dir, "SELECT count(*) FROM grant_claims") == [(5,)]
    finally:
        finish.set()
        await store.close()


async def test_a_group_applies_its_writes_in_submission_order(sqlite_store: SQLiteUseStore) -> None:
    store = sqlite_store
    counter = CommitCounter(store)
    ids = {"tenant": "acme", "principal": "agent-1", "key": "k"}
    answer = {"outcome": "BLOCKED"}
    results = await _one_group(
        store,
        lambda: [
            store.idempotency_begin(**ids, payload_digest="sha256:p", now=NOW),
            store.idempotency_begin(**ids, payload_digest="sha256:p", now=NOW),
            store.idempotency_complete(**ids, response=answer, now=NOW),
            store.idempotency_begin(**ids, payload_digest="sha256:p", now=NOW),
            store.idempotency_begin(**ids, payload_digest="sha256:other", now=NOW),
            store.claim_grant("g", binding_digest="d", expires_at=NOW + 60, now=NOW),
            store.claim_grant("g", binding_digest="d", expires_at=NOW + 60, now=NOW),
            store.consume("ns", "c", binding={"b": 1}, now=NOW),
            store.consume("ns", "c", binding={"b": 1}, now=NOW),
        ],
    )
    assert counter.commits == 1
    assert results[:5] == [
        IdempotencyState(IdempotencyKind.NEW),
        IdempotencyState(IdempotencyKind.IN_PROGRESS),
        None,
        IdempotencyState(IdempotencyKind.REPLAY, response=answer),
        IdempotencyState(IdempotencyKind.CONFLICT),
    ]
    assert results[5:7] == [True, False]
    assert isinstance(results[7], ConsumptionRecord)
    assert results[8] is None
    assert await store.verify_consumption(results[7])


async def test_a_refused_or_failing_write_leaves_the_rest_of_its_group_alone(
    tmp_path: Path,
) -> None:
    state_dir = tmp_path / "state"
    store = await SQLiteUseStore.open(state_dir, clock=ManualClock(NOW))
    try:
        await store.approval_create(_request("req-1"))
        await store.approval_create(_request("req-2"))
        counter = CommitCounter(store)

        def fails_halfway(conn: sqlite3.Connection) -> None:
            """Test double: an operation that writes, then fails unexpectedly."""
            conn.execute(
                "INSERT INTO grant_claims VALUES ('g-halfway', 'd', ?, ?)", (NOW + 60, NOW)
            )
            raise RuntimeError("unexpected failure (test double)")

        def bad_sql_after_a_write(conn: sqlite3.Connection) -> None:
            """Test double: an operation whose second statement SQLite refuses."""
            conn.execute("INSERT INTO grant_claims VALUES ('g-sql', 'd', ?, ?)", (NOW + 60, NOW))
            conn.execute("INSERT INTO no_such_table VALUES (1)")

        results = await _one_group(
            store,
            lambda: [
                store.approval_decide(
                    "req-1", decision="APPROVE", approver="lead-a", reason="ok", now=NOW
                ),
                store.approval_decide(
                    "req-1", decision="DENY", approver="lead-b", reason="no", now=NOW
                ),
                store.claim_grant("g-1", binding_digest="d", expires_at=NOW + 60, now=NOW),
                store.idempotency_complete(
                    tenant="t", principal="p", key="absent", response={"x": 1}, now=NOW
                ),
                store._write(fails_halfway),
                store.consume("ns", "c", binding={"b": 1}, now=NOW),
                store.approval_create(_request("req-2")),
                store._write(bad_sql_after_a_write),
                store.idempotency_begin(
                    tenant="t", principal="p", key="k", payload_digest="sha256:p", now=NOW
                ),
                store.approval_decide(
                    "req-2", decision="DENY", approver="agent-1", reason="", now=NOW
                ),
            ],
        )
        assert counter.commits == 1
        assert results[0].stored_state is ApprovalState.APPROVED
        assert _code(results[1]) == "APPROVAL_ALREADY_DECIDED"
        assert results[2] is True
        assert _code(results[3]) == "IDEMPOTENCY_RECORD_MISSING"
        assert isinstance(results[4], RuntimeError)
        assert isinstance(results[5], ConsumptionRecord)
        assert _code(results[6]) == "APPROVAL_EXISTS"
        assert _code(results[7]) == "STORE_UNAVAILABLE"
        assert results[8].kind is IdempotencyKind.NEW
        assert _code(results[9]) == "APPROVAL_NOT_PERMITTED"

        assert _rows(state_dir, "SELECT grant_id FROM grant_claims") == [("g-1",)]
        assert _rows(state_dir, "SELECT request_id, state, approver FROM approvals") == [
            ("req-1", "APPROVED", "lead-a"),
            ("req-2", "PENDING", None),
        ]
        assert await store.verify_consumption(results[5])
        again = await store.idempotency_begin(
            tenant="t", principal="p", key="k", payload_digest="sha256:p", now=NOW
        )
        assert again.kind is IdempotencyKind.IN_PROGRESS
    finally:
        await store.close()


async def test_a_write_that_loses_the_transaction_fails_alone(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    store = await SQLiteUseStore.open(state_dir, clock=ManualClock(NOW))
    try:
        counter = CommitCounter(store)

        def abandons_the_transaction(conn: sqlite3.Connection) -> None:
            """Test double: SQLite rolls the whole transaction back under this operation (as it
            does on some I/O and memory errors)."""
            conn.execute("ROLLBACK")
            raise sqlite3.OperationalError("disk I/O error (test double)")

        def claim(grant_id: str) -> Awaitable[bool]:
            return store.claim_grant(grant_id, binding_digest="d", expires_at=NOW + 60, now=NOW)

        results = await _one_group(
            store,
            lambda: [
                claim("before"),
                claim("before"),
                store._write(abandons_the_transaction),
                claim("after"),
            ],
        )
        assert results[0:2] == [True, False]
        assert _code(results[2]) == "STORE_UNAVAILABLE"
        assert results[3] is True
        assert counter.commits == 1
        assert _rows(state_dir, "SELECT grant_id FROM grant_claims ORDER BY grant_id") == [
            ("after",),
            ("before",),
        ]
    finally:
        await store.close()


async def test_a_failed_commit_acknowledges_no_write_of_its_group(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    store = await SQLiteUseStore.open(state_dir, clock=ManualClock(NOW))
    try:
        await store.approval_create(_request("req-1"))
        failing = FailingCommit(store)
        results = await _one_group(
            store,
            lambda: [
                store.claim_grant("g", binding_digest="d", expires_at=NOW + 60, now=NOW),
                store.idempotency_begin(
                    tenant="t", principal="p", key="k", payload_digest="sha256:p", now=NOW
                ),
                store.idempotency_complete(
                    tenant="t", principal="p", key="absent", response={"x": 1}, now=NOW
                ),
                store.consume("ns", "c", binding={"b": 1}, now=NOW),
                store.approval_decide(
                    "req-1", decision="APPROVE", approver="lead-a", reason="", now=NOW
                ),
            ],
        )
        assert failing.calls == 1
        assert [_code(r) for r in results] == ["STORE_UNAVAILABLE"] * 5
        failing.restore()

        assert _rows(state_dir, "SELECT count(*) FROM grant_claims") == [(0,)]
        assert _rows(state_dir, "SELECT count(*) FROM idempotency") == [(0,)]
        assert _rows(state_dir, "SELECT count(*) FROM consumptions") == [(0,)]
        assert _rows(state_dir, "SELECT state FROM approvals") == [("PENDING",)]
        # the store is usable afterwards and nothing of the failed group is remembered
        assert await store.claim_grant("g", binding_digest="d", expires_at=NOW + 60, now=NOW)
        begun = await store.idempotency_begin(
            tenant="t", principal="p", key="k", payload_digest="sha256:p", now=NOW
        )
        assert begun.kind is IdempotencyKind.NEW
    finally:
        await store.close()


async def test_a_group_that_cannot_take_the_lock_fails_every_write(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    store = await SQLiteUseStore.open(state_dir, clock=ManualClock(NOW), busy_timeout_s=0.05)
    other = sqlite3.connect(state_dir / DATABASE_NAME, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        results = await _one_group(
            store,
            lambda: [
                store.claim_grant(f"g-{i}", binding_digest="d", expires_at=NOW + 60, now=NOW)
                for i in range(3)
            ],
        )
        assert [_code(r) for r in results] == ["STORE_UNAVAILABLE"] * 3
        other.execute("ROLLBACK")
        assert await store.claim_grant("g-0", binding_digest="d", expires_at=NOW + 60, now=NOW)
    finally:
        other.close()
        await store.close()


async def test_a_write_cancelled_while_queued_never_runs(sqlite_store: SQLiteUseStore) -> None:
    store = sqlite_store

    def begin(key: str) -> Awaitable[IdempotencyState]:
        return store.idempotency_begin(
            tenant="t", principal="p", key=key, payload_digest="sha256:p", now=NOW
        )

    async with held_worker(store):
        cancelled = asyncio.ensure_future(begin("cancelled"))
        kept = asyncio.ensure_future(begin("kept"))
        await _queued(store, 2)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert store._pending[0].waiter.cancelled()  # what the store's thread reads
    assert (await kept).kind is IdempotencyKind.NEW
    assert (await begin("cancelled")).kind is IdempotencyKind.NEW


async def test_close_commits_the_writes_it_accepted_first(tmp_path: Path) -> None:
    """More writes than one group holds: close commits the rest before the connection closes."""
    state_dir = tmp_path / "state"
    store = await SQLiteUseStore.open(state_dir, clock=ManualClock(NOW))
    counter = CommitCounter(store)
    async with held_worker(store):
        claims = [
            asyncio.ensure_future(
                store.claim_grant(f"g-{i}", binding_digest="d", expires_at=NOW + 60, now=NOW)
            )
            for i in range(300)
        ]
        await _queued(store, 300)
        closing = asyncio.ensure_future(store.close())
        await asyncio.sleep(0)  # one loop step: close queues its work behind the first group
        assert store._closed
    await closing
    assert await asyncio.gather(*claims) == [True] * 300
    assert counter.commits == 2  # groups are bounded
    assert _rows(state_dir, "SELECT count(*) FROM grant_claims") == [(300,)]


def test_grouped_claims_in_five_processes_yield_one_success(tmp_path: Path) -> None:
    """Each process commits its ten claims of one grant as one group (the racer checks that);
    across processes exactly one claim wins."""
    results = _race(tmp_path / "state", "claim-grouped", "grant-raced", processes=5, count=10)
    assert len(results) == 50
    assert results.count(True) == 1
    assert results.count(False) == 49


class StatementLog:
    """Every statement the store's connection runs (SQLite's trace callback, set and unset on the
    store's own thread, where the connection lives)."""

    def __init__(self, store: SQLiteUseStore) -> None:
        self.statements: list[str] = []
        self._store = store

    async def __aenter__(self) -> StatementLog:
        await self._store._run(lambda conn: conn.set_trace_callback(self.statements.append))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._store._run(lambda conn: conn.set_trace_callback(None))


async def test_a_group_without_a_failing_write_runs_no_savepoint(tmp_path: Path) -> None:
    """Issue 34: the savepoints are for a write that fails; a group where none does is run
    without them, and a new key's begin and an in-flight key's completion are one statement each
    (every statement is a release and a retaking of the GIL on the store's thread)."""
    store = await SQLiteUseStore.open(tmp_path / "state", clock=ManualClock(NOW))
    try:
        ids = [{"tenant": "acme", "principal": "p", "key": f"k-{i}"} for i in range(3)]
        async with StatementLog(store) as log:
            begun = await _one_group(
                store,
                lambda: [
                    store.idempotency_begin(**i, payload_digest="sha256:p", now=NOW) for i in ids
                ],
            )
            completed = await _one_group(
                store,
                lambda: [store.idempotency_complete(**i, response={"n": 1}, now=NOW) for i in ids],
            )
        assert [b.kind for b in begun] == [IdempotencyKind.NEW] * 3
        assert completed == [None] * 3
        verbs = [statement.split()[0].upper() for statement in log.statements]
        begin_group = ["BEGIN", "INSERT", "INSERT", "INSERT", "COMMIT"]
        complete_group = ["BEGIN", "UPDATE", "UPDATE", "UPDATE", "COMMIT"]
        assert verbs == begin_group + complete_group
        replay = await store.idempotency_begin(**ids[0], payload_digest="sha256:p", now=NOW)
        assert replay == IdempotencyState(IdempotencyKind.REPLAY, response={"n": 1})
    finally:
        await store.close()


async def test_a_failing_write_sends_its_group_through_savepoints(tmp_path: Path) -> None:
    """The first pass is rolled back when a write raises; the group then runs write by write in
    savepoints, and what commits is what the savepoints alone would have committed."""
    state_dir = tmp_path / "state"
    store = await SQLiteUseStore.open(state_dir, clock=ManualClock(NOW))
    try:
        counter = CommitCounter(store)

        def fails_after_a_write(conn: sqlite3.Connection) -> None:
            """Test double: an operation that writes, then fails unexpectedly."""
            conn.execute("INSERT INTO grant_claims VALUES ('g-half', 'd', ?, ?)", (NOW + 60, NOW))
            raise RuntimeError("unexpected failure (test double)")

        async with StatementLog(store) as log:
            results = await _one_group(
                store,
                lambda: [
                    store.claim_grant("g-1", binding_digest="d", expires_at=NOW + 60, now=NOW),
                    store._write(fails_after_a_write),
                    store.claim_grant("g-2", binding_digest="d", expires_at=NOW + 60, now=NOW),
                ],
            )
        assert results[0] is True
        assert results[2] is True
        assert isinstance(results[1], RuntimeError)
        assert counter.commits == 1
        verbs = [statement.split()[0].upper() for statement in log.statements]
        assert verbs[verbs.index("ROLLBACK") + 1 :].count("SAVEPOINT") == 3
        assert _rows(state_dir, "SELECT grant_id FROM grant_claims ORDER BY grant_id") == [
            ("g-1",),
            ("g-2",),
        ]
    finally:
        await store.close()
