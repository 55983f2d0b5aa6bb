"""Issue 21 in the use store, on SQLite and on a real PostgreSQL alike: what escalated and how it
was decided, cancellations, the approvers' passkeys and their one-time enrolment tokens."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from agentsafe.executor.clock import ManualClock
from agentsafe.executor.errors import StoreError
from agentsafe.executor.principals import Verification
from agentsafe.executor.state.protocol import UseStore
from agentsafe.executor.state.records import (
    ApprovalError,
    ApprovalRequest,
    ApprovalState,
    EnrolmentToken,
    PasskeyRecord,
)
from agentsafe.executor.state.sqlitedb import _SCHEMA
from agentsafe.executor.state.usestore import DATABASE_NAME, SQLiteUseStore
from tests.support.intents import make_intent

NOW = 1_800_000_000.0


def pending(request_id: str = "req-1", **overrides: Any) -> ApprovalRequest:
    intent = make_intent(now=NOW)
    fields: dict[str, Any] = {
        "request_id": request_id,
        "intent": intent.binding,
        "intent_hash": intent.intent_hash,
        "approvers": ("treasury-lead",),
        "proposer_principal": "treasury-workflow",
        "proposer_actor": "agent-1",
        "expires_at": NOW + 60,
        "created_at": NOW,
        "rule": "medium",
        "reason_codes": ("APPROVAL_REQUIRED",),
        "verification": Verification.WEBAUTHN,
    }
    fields.update(overrides)
    return ApprovalRequest(**fields)


async def test_the_request_keeps_what_escalated_it_and_how_it_was_decided(store: UseStore) -> None:
    await store.approval_create(pending())
    record = await store.approval_get("req-1")
    assert record is not None
    assert (record.request.rule, record.request.reason_codes) == ("medium", ("APPROVAL_REQUIRED",))
    assert record.request.verification is Verification.WEBAUTHN
    assert record.verification is None
    decided = await store.approval_decide(
        "req-1",
        decision="APPROVE",
        approver="treasury-lead",
        reason="ok",
        now=NOW + 1,
        verification=Verification.WEBAUTHN,
    )
    assert decided.verification is Verification.WEBAUTHN
    again = await store.approval_get("req-1")
    assert again is not None
    assert (again.stored_state, again.verification) == (
        ApprovalState.APPROVED,
        Verification.WEBAUTHN,
    )


async def test_a_pending_request_is_cancelled_once_and_then_never_decided(store: UseStore) -> None:
    await store.approval_create(pending("req-c"))
    await store.approval_create(pending("req-d"))
    cancelled = await store.approval_cancel(
        "req-c", by="treasury-workflow", reason="withdrawn", now=NOW + 1
    )
    assert cancelled.state_at(NOW + 1) is ApprovalState.CANCELLED
    assert (cancelled.cancelled_by, cancelled.cancel_reason) == ("treasury-workflow", "withdrawn")
    with pytest.raises(ApprovalError) as twice:
        await store.approval_cancel("req-c", by="ops", reason="again", now=NOW + 2)
    assert twice.value.code == "APPROVAL_NOT_CANCELLABLE"
    with pytest.raises(ApprovalError) as decided:
        await store.approval_decide(
            "req-c", decision="APPROVE", approver="treasury-lead", reason="late", now=NOW + 2
        )
    assert decided.value.code == "APPROVAL_CANCELLED"
    listed = await store.approval_list(state=ApprovalState.PENDING, now=NOW + 2)
    assert [r.request.request_id for r in listed] == ["req-d"]
    listed = await store.approval_list(state=ApprovalState.CANCELLED, now=NOW + 2)
    assert [r.request.request_id for r in listed] == ["req-c"]
    # Decided or expired requests are no longer cancellable.
    await store.approval_decide(
        "req-d", decision="DENY", approver="treasury-lead", reason="no", now=NOW + 3
    )
    await store.approval_create(pending("req-e"))
    for request_id, at in (("req-d", NOW + 4), ("req-e", NOW + 61)):
        with pytest.raises(ApprovalError) as refused:
            await store.approval_cancel(request_id, by="ops", reason="x", now=at)
        assert refused.value.code == "APPROVAL_NOT_CANCELLABLE"
    with pytest.raises(ApprovalError) as missing:
        await store.approval_cancel("nope", by="ops", reason="x", now=NOW)
    assert missing.value.code == "APPROVAL_NOT_FOUND"


def token(
    digest: str = "d" * 64, principal: str = "treasury-lead", ttl: float = 900
) -> EnrolmentToken:
    return EnrolmentToken(
        token_digest=digest,
        principal=principal,
        issued_by="approvals-admin",
        issued_at=NOW,
        expires_at=NOW + ttl,
    )


def passkey(credential_id: str = "cred-1", principal: str = "treasury-lead") -> PasskeyRecord:
    return PasskeyRecord(
        principal=principal,
        credential_id=credential_id,
        public_key=b"\xa5\x01\x02",
        sign_count=0,
        created_at=NOW,
        transports=("internal",),
    )


async def test_an_enrolment_token_registers_one_passkey_once(store: UseStore) -> None:
    await store.enrolment_issue(token())
    found = await store.enrolment_get("d" * 64, now=NOW + 1)
    assert found == token()
    assert await store.passkey_list("treasury-lead") == []
    await store.passkey_enrol("d" * 64, passkey(), now=NOW + 1)
    assert await store.passkey_list("treasury-lead") == [passkey()]
    assert await store.enrolment_get("d" * 64, now=NOW + 2) is None
    with pytest.raises(StoreError) as used:
        await store.passkey_enrol("d" * 64, passkey("cred-2"), now=NOW + 2)
    assert used.value.code == "ENROLMENT_TOKEN_INVALID"
    assert [p.credential_id for p in await store.passkey_list("treasury-lead")] == ["cred-1"]


async def test_an_expired_or_foreign_enrolment_token_registers_nothing(store: UseStore) -> None:
    await store.enrolment_issue(token("e" * 64, ttl=60))
    assert await store.enrolment_get("e" * 64, now=NOW + 60) is None
    with pytest.raises(StoreError) as expired:
        await store.passkey_enrol("e" * 64, passkey(), now=NOW + 61)
    assert expired.value.code == "ENROLMENT_TOKEN_INVALID"
    await store.enrolment_issue(token("f" * 64, principal="risk-officer"))
    with pytest.raises(StoreError) as foreign:
        await store.passkey_enrol("f" * 64, passkey(), now=NOW + 1)
    assert foreign.value.code == "ENROLMENT_TOKEN_INVALID"
    # The failed attempt did not use the token up for its own approver.
    await store.passkey_enrol("f" * 64, passkey("cred-r", "risk-officer"), now=NOW + 1)
    await store.enrolment_issue(token("g" * 64))
    with pytest.raises(StoreError) as duplicate:
        await store.passkey_enrol("g" * 64, passkey("cred-r"), now=NOW + 1)
    assert duplicate.value.code == "WEBAUTHN_REGISTRATION_INVALID"
    # ... and that refusal rolled back the token's use.
    assert await store.enrolment_get("g" * 64, now=NOW + 1) is not None
    assert await store.passkey_list("treasury-lead") == []


async def test_a_passkey_counter_must_grow(store: UseStore) -> None:
    await store.enrolment_issue(token())
    await store.passkey_enrol("d" * 64, passkey(), now=NOW)
    await store.passkey_used("treasury-lead", "cred-1", sign_count=0, now=NOW + 1)  # no counter
    await store.passkey_used("treasury-lead", "cred-1", sign_count=5, now=NOW + 2)
    for replayed in (5, 4):
        with pytest.raises(StoreError) as cloned:
            await store.passkey_used("treasury-lead", "cred-1", sign_count=replayed, now=NOW + 3)
        assert cloned.value.code == "WEBAUTHN_ASSERTION_INVALID"
    [stored] = await store.passkey_list("treasury-lead")
    assert stored.sign_count == 5
    with pytest.raises(StoreError) as other:
        await store.passkey_used("risk-officer", "cred-1", sign_count=9, now=NOW + 3)
    assert other.value.code == "WEBAUTHN_ASSERTION_INVALID"


async def test_a_store_without_the_approver_schema_gains_it_in_place(tmp_path: Path) -> None:
    intent = make_intent(now=NOW)
    with sqlite3.connect(tmp_path / DATABASE_NAME) as conn:
        for statement in _SCHEMA:
            conn.execute(statement)
        conn.execute(
            "INSERT INTO approvals (request_id, intent, intent_hash, approvers,"
            " proposer_principal, proposer_actor, expires_at, created_at, state)"
            " VALUES ('old', ?, ?, '[\"treasury-lead\"]', 'p', 'a', ?, ?, 'PENDING')",
            (
                json.dumps(dict(intent.binding)),
                intent.intent_hash,
                NOW + 60,
                NOW,
            ),
        )
        conn.execute("PRAGMA user_version = 1")
    conn.close()
    store = await SQLiteUseStore.open(tmp_path, clock=ManualClock(NOW))
    try:
        record = await store.approval_get("old")
        assert record is not None
        assert (record.request.rule, record.request.reason_codes) == (None, ())
        assert record.request.verification is Verification.CREDENTIAL
        assert record.state_at(NOW) is ApprovalState.PENDING
        await store.enrolment_issue(token())
    finally:
        await store.close()


async def test_the_proposer_in_other_capitals_neither_lists_nor_decides(store: UseStore) -> None:
    """Issue 30, item 13: separation of duties compares principal ids folded (actor_key), in
    both stores: ``Treasury-Workflow`` is the proposer ``treasury-workflow``."""
    listed = ("Treasury-Workflow", "treasury-lead")
    await store.approval_create(pending(approvers=listed))
    mine = await store.approval_list(
        state=ApprovalState.PENDING, now=NOW, approver="Treasury-Workflow"
    )
    assert mine == []
    with pytest.raises(ApprovalError) as caught:
        await store.approval_decide(
            "req-1", decision="APPROVE", approver="Treasury-Workflow", reason="", now=NOW
        )
    assert caught.value.code == "APPROVAL_NOT_PERMITTED"
    record = await store.approval_get("req-1")
    assert record is not None
    assert record.stored_state is ApprovalState.PENDING
    lead = await store.approval_list(state=ApprovalState.PENDING, now=NOW, approver="treasury-lead")
    assert [r.request.request_id for r in lead] == ["req-1"]
