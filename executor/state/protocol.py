"""The use store's protocol: what every backend answers, in values only.

Role: :class:`UseStore` is the durable single-use and idempotency state every executor process on
one store shares (grant claims, idempotency records, consumptions, approvals, passkeys). It speaks
only in the records of ``state/records.py``, with timestamps passed in by the caller, so the SQLite
backend (``state/usestore.py``) and the PostgreSQL backend (``state/pgstore.py``) implement it with
the same semantics. ``state/backend.py`` opens the one the configuration names.

Callers: ``state/backend.py``, ``assembly.py``, ``plane.py``, ``lifecycle/pipeline.py``,
``policy/authority.py``, ``routes/approvals.py``, ``routes/table.py``, ``door/passkeys.py``.
Also imported by ``lifecycle/approval_requests.py``, ``lifecycle/recovery.py``.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Protocol

from ..principals import Verification
from .records import (
    ApprovalRecord,
    ApprovalRequest,
    ApprovalState,
    AttemptFence,
    ConsumptionRecord,
    EnrolmentToken,
    IdempotencyState,
    OrphanKey,
    PasskeyRecord,
)

__all__ = ["UseStore"]


class UseStore(Protocol):
    """Durable single-use and idempotency state shared by every executor process on a store.

    :meth:`claim_grant`, :meth:`idempotency_begin`, :meth:`idempotency_record` and
    :meth:`idempotency_complete` return an awaitable: a coroutine (PostgreSQL) or the write's
    own future (SQLite, so the request's await chain holds no frame of the store while the
    write commits; issue 32). Callers await what they get at once."""

    def claim_grant(
        self,
        grant_id: str,
        *,
        binding_digest: str,
        expires_at: float,
        now: float,
        fence: AttemptFence | None = None,
        payload_digest: str | None = None,
    ) -> Awaitable[bool]:
        """True exactly once per ``grant_id``, across every process sharing the store.

        With ``fence`` (a shared store, an attempt journaled), the claim is made only while the
        attempt is still ``fence.owner``'s at ``fence.epoch``, open, unclaimed and under a live
        lease, in the same statement that records GRANT_CLAIMED (with ``payload_digest``) in the
        attempt's row and extends its lease; otherwise nothing is claimed and ``StoreError``
        (``ATTEMPT_FENCED``) is raised. A store with no leases (SQLite: one journal per process,
        no takeover while its process lives) ignores it."""
        ...

    async def grant_claimed(self, grant_id: str) -> bool:
        """Whether ``grant_id`` was claimed (and its claim not yet purged)."""
        ...

    def idempotency_begin(
        self,
        *,
        tenant: str,
        principal: str,
        key: str,
        payload_digest: str,
        now: float,
        attempt_id: str | None = None,
        owner: str | None = None,
    ) -> Awaitable[IdempotencyState]:
        """Claim the key IN_PROGRESS for ``attempt_id`` (the id it will journal), by ``owner``."""
        ...

    def idempotency_record(
        self,
        *,
        tenant: str,
        principal: str,
        key: str,
        payload_digest: str,
        response: dict[str, Any],
        now: float,
    ) -> Awaitable[IdempotencyState]:
        """A key and its final answer in one write, for a request that starts nothing (a BLOCK
        decided before its key was claimed): NEW when the key was not kept and now holds
        ``response``; otherwise what :meth:`idempotency_begin` would report (CONFLICT,
        IN_PROGRESS, REPLAY with the kept answer), and nothing is written."""
        ...

    async def idempotency_orphans(self, *, owner: str, before: float) -> list[OrphanKey]:
        """IN_PROGRESS records ``owner`` created before ``before`` (a previous process)."""
        ...

    async def idempotency_for_attempt(self, attempt_id: str) -> OrphanKey | None:
        """The record that began ``attempt_id`` (whatever its state), if it is still kept."""
        ...

    def idempotency_complete(
        self, *, tenant: str, principal: str, key: str, response: dict[str, Any], now: float
    ) -> Awaitable[None]: ...

    async def idempotency_release(
        self, *, tenant: str, principal: str, key: str, owner: str | None = None
    ) -> None:
        """Forget an in-flight record whose request never reached execution. ``owner``: start-up
        settling a key the previous process of this journal left (that process is gone)."""
        ...

    async def idempotency_settle(
        self, *, tenant: str, principal: str, key: str, response: dict[str, Any], now: float
    ) -> bool:
        """Record a reconciled answer for a key whose outcome was in flight or unknown."""
        ...

    async def idempotency_settle_attempt(
        self, attempt_id: str, *, response: dict[str, Any], now: float
    ) -> int:
        """Give the reconciled answer to every key IN_PROGRESS whose attempt is ``attempt_id``
        (an approval's key, ``approval:<request id>``, is not the one its intent names); how many
        were settled."""
        ...

    async def consume(
        self, namespace: str, key: str, *, binding: dict[str, Any], now: float
    ) -> ConsumptionRecord | None:
        """Consume ``(namespace, key)`` once; ``None`` if it was consumed before."""
        ...

    async def verify_consumption(self, record: ConsumptionRecord) -> bool: ...

    async def approval_create(self, request: ApprovalRequest) -> None: ...

    async def approval_get(self, request_id: str) -> ApprovalRecord | None: ...

    async def approval_list(
        self, *, state: ApprovalState, now: float, approver: str | None = None
    ) -> list[ApprovalRecord]: ...

    async def approval_decide(
        self,
        request_id: str,
        *,
        decision: str,
        approver: str,
        reason: str,
        now: float,
        verification: Verification = Verification.CREDENTIAL,
    ) -> ApprovalRecord: ...

    async def approval_cancel(
        self, request_id: str, *, by: str, reason: str, now: float
    ) -> ApprovalRecord:
        """Cancel a PENDING request (who may is the caller's rule); APPROVAL_NOT_CANCELLABLE
        once it is decided, expired or cancelled."""
        ...

    async def enrolment_issue(self, token: EnrolmentToken) -> None: ...

    async def enrolment_get(self, token_digest: str, *, now: float) -> EnrolmentToken | None:
        """The unexpired, unused enrolment token with this digest, or ``None``."""
        ...

    async def passkey_enrol(self, token_digest: str, passkey: PasskeyRecord, *, now: float) -> None:
        """Use the enrolment token (once) and store the passkey for its principal, in one
        transaction; ENROLMENT_TOKEN_INVALID if the token is unknown, expired, used or issued for
        another principal."""
        ...

    async def passkey_list(self, principal: str) -> list[PasskeyRecord]: ...

    async def passkey_used(
        self, principal: str, credential_id: str, *, sign_count: int, now: float
    ) -> None:
        """Record a verified assertion's counter (see :func:`check_sign_count`)."""
        ...

    async def purge(self, now: float) -> int: ...

    async def close(self) -> None: ...
