"""The use store's domain records and their rules: what every backend stores and decides alike.

Role: the values the :class:`~agentsafe.executor.state.protocol.UseStore` protocol speaks in
(idempotency states, consumptions, approval requests and records, passkeys, enrolment tokens),
the rules a decision, a cancellation or a passkey's counter must obey, the consumption HMAC, and
the fencing token of an attempt (:class:`AttemptFence`). Pure: no SQL, no connection, no clock
but the one a fence reads. Both backends (``state/usestore.py`` on SQLite, ``state/pgstore.py``
on PostgreSQL) apply exactly these rules, so a behaviour never differs by backend.

Callers: ``state/usestore.py``, ``state/pgstore.py``, ``state/pgattempts.py``,
``state/pgconn.py``, ``state/statements.py``, ``state/protocol.py``, ``state/journal.py``,
``state/lostwrites.py``, ``lifecycle/pipeline.py``, ``lifecycle/reconcile.py``,
``policy/authority.py``, ``policy/records.py`` (the fence, typing only), ``plane.py``,
``routes/approvals.py``, ``door/passkeys.py``, ``egress/webhook.py``, ``plans/execute.py``,
``plans/receipts.py``.
Also imported by ``journalrecords.py``.
Also imported by ``lifecycle/escalations.py``, ``lifecycle/recovery.py``.
Also imported by ``lifecycle/approval_requests.py``.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ..canonical import canonical_text
from ..codes import Code
from ..errors import StoreError
from ..principals import Verification, same_actor

RETENTION_SECONDS = 24 * 60 * 60
"""Finished idempotency records, grant claims and approvals are kept at least this long."""


def consumption_token(
    secret: bytes,
    namespace: str,
    key: str,
    nonce: str,
    consumed_at: float,
    binding_digest: str,
) -> str:
    """The HMAC that proves a consumption was recorded by a store holding ``secret``; every
    store (SQLite here, PostgreSQL in :mod:`.pgstore`) computes it this one way."""
    message = canonical_text(
        {
            "namespace": namespace,
            "key": key,
            "nonce": nonce,
            "consumed_at": consumed_at,
            "binding_digest": binding_digest,
        }
    ).encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


class IdempotencyKind(StrEnum):
    NEW = "NEW"  # a record was created IN_PROGRESS and this call owns it
    IN_PROGRESS = "IN_PROGRESS"  # another request holds the key and has not finished
    CONFLICT = "CONFLICT"  # the key was used with a different payload
    REPLAY = "REPLAY"  # the key finished; ``response`` is the recorded final answer


@dataclass(frozen=True)
class IdempotencyState:
    kind: IdempotencyKind
    response: dict[str, Any] | None = None


@dataclass(frozen=True)
class OrphanKey:
    """An IN_PROGRESS idempotency record: its scope and the attempt it would journal."""

    tenant: str
    principal: str
    key: str
    attempt_id: str | None
    created_at: float

    @property
    def scope(self) -> dict[str, str]:
        return {"tenant": self.tenant, "principal": self.principal, "key": self.key}


@dataclass(frozen=True)
class ConsumptionRecord:
    """Proof that ``(namespace, key)`` was consumed once, bound to ``binding_digest``.

    ``token`` is an HMAC-SHA256 over the other fields under the store's secret; only the store
    that issued it can verify it (:meth:`UseStore.verify_consumption`).
    """

    namespace: str
    key: str
    nonce: str
    consumed_at: float
    binding_digest: str
    token: str


class ApprovalState(StrEnum):
    PENDING = "PENDING"
    APPROVED = "APPROVED"
    DENIED = "DENIED"
    EXPIRED = "EXPIRED"  # never stored: a PENDING request read at or after its expiry
    CANCELLED = "CANCELLED"  # never stored as a state: a PENDING request with a cancellation


@dataclass(frozen=True)
class ApprovalRequest:
    """An escalation waiting for a person: the intent, who may decide, and until when."""

    request_id: str
    intent: Mapping[str, Any]  # the intent binding exactly as hashed
    intent_hash: str
    approvers: tuple[str, ...]  # principal ids allowed to decide
    proposer_principal: str
    proposer_actor: str
    expires_at: float
    created_at: float
    rule: str | None = None  # the policy rule that escalated
    reason_codes: tuple[str, ...] = ()  # and the reason it gave
    verification: Verification = Verification.CREDENTIAL  # what the rule requires of a decision


@dataclass(frozen=True)
class ApprovalRecord:
    """An approval request and, once decided, its one decision."""

    request: ApprovalRequest
    stored_state: ApprovalState  # PENDING, APPROVED or DENIED
    approver: str | None = None
    reason: str | None = None
    decided_at: float | None = None
    verification: Verification | None = None  # how strongly the decider was verified
    cancelled_by: str | None = None
    cancel_reason: str | None = None
    cancelled_at: float | None = None

    def state_at(self, now: float) -> ApprovalState:
        """The state a caller should act on: a cancelled PENDING request is CANCELLED, and one
        past its expiry is EXPIRED."""
        if self.stored_state is ApprovalState.PENDING:
            if self.cancelled_at is not None:
                return ApprovalState.CANCELLED
            if now >= self.request.expires_at:
                return ApprovalState.EXPIRED
        return self.stored_state


@dataclass(frozen=True)
class PasskeyRecord:
    """One WebAuthn credential of an APPROVER principal (``door/passkeys.py`` verifies with it)."""

    principal: str
    credential_id: str  # base64url, as the authenticator names it
    public_key: bytes  # COSE
    sign_count: int
    created_at: float
    transports: tuple[str, ...] = ()


@dataclass(frozen=True)
class EnrolmentToken:
    """A one-time enrolment token an OPERATOR issued for an APPROVER (only its digest is kept)."""

    token_digest: str
    principal: str
    issued_by: str
    issued_at: float
    expires_at: float


class ApprovalError(StoreError):
    """An approval operation refused. Codes: APPROVAL_NOT_FOUND, APPROVAL_ALREADY_DECIDED,
    APPROVAL_EXPIRED, APPROVAL_NOT_PERMITTED, APPROVAL_DECISION_INVALID, APPROVAL_EXISTS,
    APPROVAL_BINDING_MISMATCH."""

    code: Code = Code.APPROVAL_INVALID

    def __init__(self, message: str, *, code: Code | None = None) -> None:
        super().__init__(message, code=code)


def decision_state(decision: str, reason: str) -> ApprovalState:
    """The state a valid decision records; APPROVAL_DECISION_INVALID otherwise (every store)."""
    new_state = _DECISIONS.get(decision)
    if new_state is None:
        raise ApprovalError("decision must be APPROVE or DENY", code=Code.APPROVAL_DECISION_INVALID)
    if not isinstance(reason, str) or len(reason) > _MAX_REASON:
        raise ApprovalError("the reason is too long", code=Code.APPROVAL_DECISION_INVALID)
    return new_state


def check_decidable(record: ApprovalRecord, *, approver: str, now: float) -> None:
    """Refuse a decision the request does not allow: an approver it does not name or its
    proposer (separation of duties), a decided request, an expired one (every store)."""
    if approver not in record.request.approvers or same_actor(  # separation of duties
        approver, record.request.proposer_principal
    ):
        raise ApprovalError(
            "this principal may not decide this request", code=Code.APPROVAL_NOT_PERMITTED
        )
    if record.stored_state is not ApprovalState.PENDING:
        raise ApprovalError("the request is already decided", code=Code.APPROVAL_ALREADY_DECIDED)
    state = record.state_at(now)
    if state is ApprovalState.CANCELLED:
        raise ApprovalError("the request was cancelled", code=Code.APPROVAL_CANCELLED)
    if state is ApprovalState.EXPIRED:
        raise ApprovalError("the request has expired", code=Code.APPROVAL_EXPIRED)


def check_cancellable(record: ApprovalRecord, *, reason: str, now: float) -> None:
    """Refuse a cancellation of a request that is no longer pending (every store)."""
    if not isinstance(reason, str) or len(reason) > _MAX_REASON:
        raise ApprovalError("the reason is too long", code=Code.APPROVAL_DECISION_INVALID)
    if record.state_at(now) is not ApprovalState.PENDING:
        raise ApprovalError("the request is no longer pending", code=Code.APPROVAL_NOT_CANCELLABLE)


def check_sign_count(stored: int, presented: int) -> None:
    """A passkey's counter must grow unless the authenticator keeps none (both zero): a counter
    that does not grow is a cloned credential (every store)."""
    if (stored or presented) and presented <= stored:
        raise StoreError(
            "the passkey's signature counter did not grow", code=Code.WEBAUTHN_ASSERTION_INVALID
        )


def closing_response(answer: Mapping[str, Any]) -> dict[str, Any]:
    """The key's response for an attempt's answer (the one its ATTEMPT_CLOSED carries, or a
    reconciled one): an attempt's answer is given with status 200 (``lifecycle/attempt.py``), so
    a key completed with the attempt's close (``state/pgattempts.py``) or settled from the
    journal after a restart (``lifecycle/recovery.py``) replays exactly what was given."""
    return {"status": 200, "body": dict(answer)}


def settles(recorded: object) -> bool:
    """Whether a finished idempotency answer may be replaced by a reconciled one: only an
    UNKNOWN_AFTER_DISPATCH answer ever is (every store)."""
    body = recorded.get("body") if isinstance(recorded, dict) else None
    return isinstance(body, dict) and body.get("outcome") == "UNKNOWN_AFTER_DISPATCH"


class AttemptFence:
    """The fencing token of one attempt this process opened or took over (issue 29).

    ``owner`` and ``epoch`` are the attempt's row in the shared store as this process last made
    it: every takeover increments ``epoch`` in the transaction that changes ``owner``, so a claim
    fenced by both (:meth:`UseStore.claim_grant`) is refused once anyone else took the attempt.
    ``deadline`` is the local view of the lease, on the monotonic clock: the moment the last
    statement that extended it was *sent*, plus the lease, minus ``margin_seconds``
    (``LEASE_MARGIN_SECONDS``, ``config.py``: the monotonic clocks of a replica and of the
    database may run at slightly different rates); the database's lease can only end later.
    :meth:`can_dispatch` says whether a dispatch of at most ``dispatch_seconds`` still ends under
    it. ``claimed`` is set once the fenced grant claim also recorded GRANT_CLAIMED in the
    attempt's row (one statement).

    Built by the shared store's attempt mirror (``state/pgstore.py``); read by the attempt
    (``lifecycle/attempt.py``, through the journal) and the claim (``policy/authority.py``).
    """

    __slots__ = ("attempt_id", "claimed", "deadline", "dispatch_seconds", "epoch", "lease_seconds",
                 "margin_seconds", "monotonic", "owner")  # fmt: skip

    def __init__(
        self,
        *,
        attempt_id: str,
        owner: str,
        epoch: int,
        lease_seconds: float,
        dispatch_seconds: float,
        margin_seconds: float,
        sent_at: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.attempt_id = attempt_id
        self.owner = owner
        self.epoch = epoch
        self.lease_seconds = lease_seconds
        self.dispatch_seconds = dispatch_seconds
        self.margin_seconds = margin_seconds
        self.monotonic = monotonic
        self.claimed = False
        self.deadline = sent_at + lease_seconds - margin_seconds

    def renewed(self, sent_at: float) -> None:
        """The lease was extended by a statement sent at ``sent_at`` (monotonic)."""
        self.deadline = max(self.deadline, sent_at + self.lease_seconds - self.margin_seconds)

    def remaining(self) -> float:
        """Seconds the lease surely still runs (negative once it may have lapsed)."""
        return self.deadline - self.monotonic()

    def can_dispatch(self) -> bool:
        """A dispatch bounded by ``dispatch_seconds`` would end before the lease may lapse."""
        return self.remaining() > self.dispatch_seconds


_DECISIONS = {"APPROVE": ApprovalState.APPROVED, "DENY": ApprovalState.DENIED}
_MAX_REASON = 1000
