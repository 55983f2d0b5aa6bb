"""The statements and row shapes both store dialects share, written once.

Role: the column lists and row decoders of approvals and passkeys, the listing filter of approval
requests, and the value checks (canonical JSON, digests) every backend applies before it writes.
A statement's text takes the driver's placeholder as ``mark`` (``?`` for SQLite, ``%s`` for
psycopg), so the SQLite backend and the PostgreSQL backend run the same SQL.

Callers: ``state/usestore.py`` and ``state/pgstore.py`` (the two backends),
``state/pgattempts.py`` (``load_object``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..canonical import canonical_text, sha256_digest
from ..codes import Code
from ..errors import AgentSafeError, StoreError
from ..principals import Verification
from .records import ApprovalRecord, ApprovalRequest, ApprovalState, PasskeyRecord

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
