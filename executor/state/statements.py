"""The statements and row shapes both store dialects share, written once.

Role: the column lists and row decoders of approvals and passkeys, the listing filter of approval
requests, and the value checks (canonical JSON, digests) every backend applies before it writes.
A statement's text takes the driver's placeholder as ``mark`` (``?`` for SQLite, ``%s`` for
psycopg), so the SQLite backend and the PostgreSQL backend run the same SQL.

Callers: ``state/usestore.py`` and ``state/pgstore.py`` (the two backends),
``state/pgattempts.py`` (``load_object``).
"""

from __future__ import annotations

import dataclasses
import hmac
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..canonical import canonical_text, sha256_digest
from ..codes import Code
from ..errors import AgentSafeError, StoreError
from ..principals import Verification, same_actor
from .records import (
    ApprovalError,
    ApprovalRecord,
    ApprovalRequest,
    ApprovalState,
    ConsumptionRecord,
    PasskeyRecord,
)

APPROVAL_COLUMNS = (
    "request_id, intent, intent_hash, approvers, proposer_principal, proposer_actor,"
    " expires_at, created_at, state, approver, reason, decided_at, rule, reason_codes,"
    " required_verification, verification, cancelled_by, cancel_reason, cancelled_at"
)
PASSKEY_COLUMNS = "principal, credential_id, public_key, sign_count, created_at, transports"


def approval_listing(state: ApprovalState, now: float, mark: str) -> tuple[str, tuple[object, ...]]:
    """The WHERE clause (and its arguments) of the requests in ``state`` as of ``now``; ``mark``
    is the driver's placeholder (every store)."""
    pending = "state = 'PENDING' AND cancelled_at IS NULL"
    if state is ApprovalState.PENDING:
        return f"{pending} AND expires_at > {mark}", (now,)
    if state is ApprovalState.EXPIRED:
        return f"{pending} AND expires_at <= {mark}", (now,)
    if state is ApprovalState.CANCELLED:
        return "state = 'PENDING' AND cancelled_at IS NOT NULL", ()
    return f"state = {mark}", (state.value,)


def passkey_from_row(row: tuple[Any, ...]) -> PasskeyRecord:
    return PasskeyRecord(
        principal=str(row[0]),
        credential_id=str(row[1]),
        public_key=bytes(row[2]),
        sign_count=int(row[3]),
        created_at=float(row[4]),
        transports=tuple(str(t) for t in json.loads(row[5])),
    )


def approval_from_row(row: tuple[Any, ...]) -> ApprovalRecord:
    intent = load_object(row[1])
    approvers = json.loads(row[3])
    request = ApprovalRequest(
        request_id=row[0],
        intent=intent,
        intent_hash=row[2],
        approvers=tuple(str(a) for a in approvers),
        proposer_principal=row[4],
        proposer_actor=row[5],
        expires_at=float(row[6]),
        created_at=float(row[7]),
        rule=row[12],
        reason_codes=tuple(str(code) for code in json.loads(row[13])),
        verification=Verification(row[14]),
    )
    return ApprovalRecord(
        request=request,
        stored_state=ApprovalState(row[8]),
        approver=row[9],
        reason=row[10],
        decided_at=None if row[11] is None else float(row[11]),
        verification=None if row[15] is None else Verification(row[15]),
        cancelled_by=row[16],
        cancel_reason=row[17],
        cancelled_at=None if row[18] is None else float(row[18]),
    )


def load_object(text: Any) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        raise StoreError("a stored record is damaged", code=Code.STORE_RECORD_DAMAGED) from None
    if not isinstance(value, dict):
        raise StoreError("a stored record is damaged", code=Code.STORE_RECORD_DAMAGED)
    return value


def canonical_or_store_error(value: Mapping[str, Any]) -> str:
    try:
        return canonical_text(value)
    except AgentSafeError:
        raise StoreError(
            "the value has no canonical JSON form", code=Code.STORE_VALUE_INVALID
        ) from None


def digest_or_store_error(value: Mapping[str, Any]) -> str:
    try:
        return sha256_digest(value)
    except AgentSafeError:
        raise StoreError(
            "the value has no canonical JSON form", code=Code.STORE_VALUE_INVALID
        ) from None


def pg(sql: str) -> str:
    """``sql``, written once with SQLite's ``?`` placeholders, for psycopg (``%s``). The shared
    statements hold no literal question mark."""
    return sql.replace("?", "%s")


# -- idempotency -------------------------------------------------------------------------------


def completed_already(row: tuple[Any, ...] | None, text: str) -> bool:
    """Whether a key whose row is ``(state, response, ...)`` already holds the answer ``text``
    (nothing to do); ``False`` while it is in flight. ``StoreError`` when there is no record
    (IDEMPOTENCY_RECORD_MISSING) or it holds another final answer
    (IDEMPOTENCY_ALREADY_COMPLETE): the first final answer stays, on every backend."""
    if row is None:
        raise StoreError("no idempotency record for this key", code=Code.IDEMPOTENCY_RECORD_MISSING)
    if row[0] == "DONE":
        if row[1] == text:
            return True
        raise StoreError(
            "this key already has a final answer", code=Code.IDEMPOTENCY_ALREADY_COMPLETE
        )
    return False


# -- consumptions ------------------------------------------------------------------------------

CONSUMPTION_ROW = (
    "SELECT nonce, consumed_at, binding_digest FROM consumptions WHERE namespace = ? AND key = ?"
)


def token_matches(record: ConsumptionRecord, token: Callable[..., str]) -> bool:
    """Whether ``record``'s token is the one this store's secret makes (``token`` is the
    store's :func:`~agentsafe.executor.state.records.consumption_token` with its secret)."""
    try:
        expected = token(
            record.namespace, record.key, record.nonce, record.consumed_at, record.binding_digest
        )
    except AgentSafeError:
        return False
    return isinstance(record.token, str) and hmac.compare_digest(
        expected.encode(), record.token.encode()
    )


def consumption_matches(row: Sequence[Any] | None, record: ConsumptionRecord) -> bool:
    """Whether the stored row (:data:`CONSUMPTION_ROW`) is the one ``record`` describes."""
    return row is not None and (row[0], float(row[1]), row[2]) == (
        record.nonce,
        record.consumed_at,
        record.binding_digest,
    )


# -- approvals ---------------------------------------------------------------------------------

APPROVAL_INSERT = (
    "INSERT INTO approvals (request_id, intent, intent_hash, approvers,"
    " proposer_principal, proposer_actor, expires_at, created_at, state,"
    " rule, reason_codes, required_verification)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'PENDING', ?, ?, ?)"
    " ON CONFLICT (request_id) DO NOTHING"
)


def approval_insert_args(request: ApprovalRequest) -> tuple[object, ...]:
    """The arguments of :data:`APPROVAL_INSERT`; APPROVAL_BINDING_MISMATCH when the intent does
    not hash to the request's ``intent_hash``."""
    if digest_or_store_error(request.intent) != request.intent_hash:
        raise ApprovalError(
            "the intent does not hash to its intent_hash", code=Code.APPROVAL_BINDING_MISMATCH
        )
    return (
        request.request_id,
        canonical_text(dict(request.intent)),
        request.intent_hash,
        canonical_text(list(request.approvers)),
        request.proposer_principal,
        request.proposer_actor,
        request.expires_at,
        request.created_at,
        request.rule,
        canonical_text(list(request.reason_codes)),
        request.verification.value,
    )


def visible_to(records: list[ApprovalRecord], approver: str | None) -> list[ApprovalRecord]:
    """The requests ``approver`` may decide (named, and never the proposer); all without one."""
    if approver is None:
        return records
    return [
        r
        for r in records
        if approver in r.request.approvers
        and not same_actor(approver, r.request.proposer_principal)
    ]


APPROVAL_DECIDE = (
    "UPDATE approvals SET state = ?, approver = ?, reason = ?, decided_at = ?,"
    " verification = ? WHERE request_id = ? AND state = 'PENDING'"
)


def decided(
    record: ApprovalRecord,
    state: ApprovalState,
    approver: str,
    reason: str,
    now: float,
    verification: Verification,
) -> tuple[ApprovalRecord, tuple[object, ...]]:
    """The record as :data:`APPROVAL_DECIDE` leaves it, and that statement's arguments."""
    args = (state.value, approver, reason, now, verification.value, record.request.request_id)
    return dataclasses.replace(
        record,
        stored_state=state,
        approver=approver,
        reason=reason,
        decided_at=now,
        verification=verification,
    ), args


# -- passkeys ----------------------------------------------------------------------------------

PASSKEY_INSERT = (
    "INSERT INTO passkeys (credential_id, principal, public_key, sign_count,"
    " transports, created_at) VALUES (?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (credential_id) DO NOTHING"
)


def passkey_insert_args(passkey: PasskeyRecord) -> tuple[object, ...]:
    return (
        passkey.credential_id,
        passkey.principal,
        passkey.public_key,
        passkey.sign_count,
        canonical_text(list(passkey.transports)),
        passkey.created_at,
    )
