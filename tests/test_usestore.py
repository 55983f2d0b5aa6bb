"""The SQLite use store: single claims across processes, idempotency, consumptions, approvals."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sqlite3
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentsafe.executor.canonical import sha256_digest
from agentsafe.executor.clock import ManualClock
from agentsafe.executor.errors import StoreError
from agentsafe.executor.usestore import (
    DATABASE_NAME,
    RETENTION_SECONDS,
    ApprovalError,
    ApprovalRequest,
    ApprovalState,
    IdempotencyKind,
    SQLiteUseStore,
)

NOW = 1_800_000_000.0
RACE_SCRIPT = Path(__file__).parent / "support" / "usestore_race.py"


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteUseStore]:
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
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    conn.close()


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


# -- grant claims ------------------------------------------------------------------------------


async def test_a_grant_is_claimed_once(store: SQLiteUseStore) -> None:
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


async def test_idempotency_state_machine(store: SQLiteUseStore) -> None:
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


async def test_idempotency_keys_are_scoped_by_tenant_and_principal(store: SQLiteUseStore) -> None:
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
    store: SQLiteUseStore,
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


async def test_complete_keeps_the_first_final_answer(store: SQLiteUseStore) -> None:
    ids = {"tenant": "acme", "principal": "agent-1", "key": "k"}
    with pytest.raises(StoreError) as missing:
        await store.idempotency_complete(**ids, response={"x": 1}, now=NOW)
    assert missing.value.code == "IDEMPOTENCY_RECORD_MISSING"

    await store.idempotency_begin(**ids, payload_digest="sha256:p", now=NOW)
    await store.idempotency_complete(**ids, response={"x": 1}, now=NOW)
    await store.idempotency_complete(**ids, response={"x": 1}, now=NOW + 5)  # same: accepted
    with pytest.raises(StoreError) as changed:
        await store.idempotency_complete(**ids, response={"x": 2}, now=NOW + 5)
    assert changed.value.code == "IDEMPOTENCY_ALREADY_COMPLETE"
    replay = await store.idempotency_begin(**ids, payload_digest="sha256:p", now=NOW)
    assert replay.response == {"x": 1}


async def test_complete_refuses_a_response_without_canonical_form(store: SQLiteUseStore) -> None:
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


async def test_purge_deletes_only_old_finished_records(store: SQLiteUseStore) -> None:
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


async def test_consume_once_and_verify(store: SQLiteUseStore) -> None:
    binding = {"plan": "p-1", "digest": "sha256:abc"}
    record = await store.consume("plan-approval", "a-1", binding=binding, now=NOW)
    assert record is not None
    assert record.binding_digest == sha256_digest(binding)
    assert await store.verify_consumption(record)
    assert await store.consume("plan-approval", "a-1", binding=binding, now=NOW + 1) is None
    other = await store.consume("other-namespace", "a-1", binding=binding, now=NOW)
    assert other is not None
    assert other.nonce != record.nonce


async def test_verify_refuses_tampered_or_unknown_records(store: SQLiteUseStore) -> None:
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
    ]
    for candidate in tampered:
        assert not await store.verify_consumption(candidate), candidate


async def test_verify_refuses_a_forged_token_for_a_row_that_exists(
    store: SQLiteUseStore, tmp_path: Path
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


async def test_a_record_whose_row_was_removed_no_longer_verifies(store: SQLiteUseStore) -> None:
    record = await store.consume("ns", "k", binding={"x": 1}, now=NOW)
    assert record is not None
    await store._run(lambda c: c.execute("DELETE FROM consumptions"))
    assert not await store.verify_consumption(record)


# -- approvals ---------------------------------------------------------------------------------


async def test_approval_lifecycle(store: SQLiteUseStore) -> None:
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


async def test_a_second_decision_is_refused(store: SQLiteUseStore) -> None:
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
    store: SQLiteUseStore, request_id: str, decision: str, approver: str, now: float, code: str
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


async def test_the_proposer_cannot_approve_even_when_listed(store: SQLiteUseStore) -> None:
    request = dataclasses.replace(_request(), approvers=("agent-1", "lead-a"))
    await store.approval_create(request)
    with pytest.raises(ApprovalError) as caught:
        await store.approval_decide(
            "req-1", decision="APPROVE", approver="agent-1", reason="", now=NOW
        )
    assert caught.value.code == "APPROVAL_NOT_PERMITTED"


async def test_expired_requests_list_as_expired(store: SQLiteUseStore) -> None:
    await store.approval_create(_request("old", expires_at=NOW + 10))
    await store.approval_create(_request("new", expires_at=NOW + 100))
    later = NOW + 10
    pending = await store.approval_list(state=ApprovalState.PENDING, now=later)
    expired = await store.approval_list(state=ApprovalState.EXPIRED, now=later)
    assert [r.request.request_id for r in pending] == ["new"]
    assert [r.request.request_id for r in expired] == ["old"]
    assert expired[0].state_at(later) is ApprovalState.EXPIRED


async def test_create_refuses_duplicates_and_rebound_intents(store: SQLiteUseStore) -> None:
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


async def test_settle_replaces_only_an_unknown_answer(tmp_path: Path) -> None:
    clock = ManualClock()
    store = await SQLiteUseStore.open(tmp_path / "state", clock=clock)
    scope = {"tenant": "t", "principal": "p"}
    unknown = {"status": 200, "body": {"outcome": "UNKNOWN_AFTER_DISPATCH"}}
    settled = {"status": 200, "body": {"outcome": "DEFINITELY_NOT_EXECUTED"}}
    for key, first in (
        ("unknown", unknown),
        ("done", {"status": 200, "body": {"outcome": "COMPLETED"}}),
    ):
        await store.idempotency_begin(**scope, key=key, payload_digest="d", now=clock.now())
        await store.idempotency_complete(**scope, key=key, response=first, now=clock.now())
    assert await store.idempotency_settle(**scope, key="unknown", response=settled, now=clock.now())
    assert not await store.idempotency_settle(
        **scope, key="done", response=settled, now=clock.now()
    )
    assert not await store.idempotency_settle(
        **scope, key="absent", response=settled, now=clock.now()
    )
    await store.idempotency_begin(**scope, key="flight", payload_digest="d", now=clock.now())
    assert await store.idempotency_settle(**scope, key="flight", response=settled, now=clock.now())
    for key, outcome in (
        ("unknown", "DEFINITELY_NOT_EXECUTED"),
        ("done", "COMPLETED"),
        ("flight", "DEFINITELY_NOT_EXECUTED"),
    ):
        state = await store.idempotency_begin(**scope, key=key, payload_digest="d", now=clock.now())
        assert state.kind == "REPLAY"
        assert state.response is not None
        assert state.response["body"]["outcome"] == outcome
    await store.close()
