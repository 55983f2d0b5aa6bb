"""The use store: the durable, shared memory of what may happen only once.

Role: everything the executor must remember across requests, restarts and sibling processes sits
behind :class:`UseStore`:

* **grant claims** -- a grant id is claimed exactly once, whichever process asks first;
* **idempotency records** keyed by ``(tenant, principal, idempotency_key)``: the request's payload
  digest while it is in flight, then its final answer, kept at least 24 hours. Each record names
  the attempt id it would journal and its owner (the journal's identity), so a key a crash left
  in flight is settled at the next start from what that journal says (:meth:`~UseStore.
  idempotency_orphans`), never left answering IN_PROGRESS forever;
* **consumptions** -- generic single-use markers (a plan approval, a presented escalation), each
  returned as a :class:`ConsumptionRecord` authenticated under a secret that never leaves the
  database;
* **approval requests** -- escalations waiting for a person (issue 3), decided exactly once, or
  cancelled by their proposer or an operator while still pending (issue 21);
* **passkeys** -- the WebAuthn credentials of APPROVER principals (public key, sign counter),
  and the one-time **enrolment tokens** (stored as SHA-256 digests) an OPERATOR issues so that a
  person can register one (issue 21). The principals file is read-only configuration; what a
  person registers lives here, with every replica that shares the store.

:class:`SQLiteUseStore` is the embedded default: one SQLite database in WAL mode with
``synchronous=FULL`` under ``EXECUTOR_STATE_DIR``. Every mutation is a ``BEGIN IMMEDIATE``
transaction with a busy timeout, so concurrent processes sharing the file serialise instead of
failing. Blocking work runs on one dedicated thread per store that owns the connection.

Writes are committed in groups, as the attempt journal groups its fsyncs: writes submitted while a
commit is in progress wait, and the next commit applies all of them, in submission order, in one
``BEGIN IMMEDIATE ... COMMIT`` -- one fsync for the group. Each write runs inside its own
``SAVEPOINT``, sees the effects of the writes before it, and when it fails (a refusal such as
APPROVAL_ALREADY_DECIDED, or an unexpected error) only its own savepoint is rolled back; the others
in its group commit. No caller is answered before the COMMIT that carries its write has returned,
and a failed COMMIT fails every write of its group. Reads run one at a time between groups. The
protocol speaks only in values (no SQL, no connections, timestamps passed in by the caller), so a
PostgreSQL store can implement it later with the same semantics (``INSERT ... ON CONFLICT DO
NOTHING`` for claims, ``SELECT ... FOR UPDATE`` for decisions).

Callers: the authority (grant claims), the pipeline (idempotency), plan approvals (consumptions),
the approval routes and ``POST /v1/escalations`` (approvals), ``assembly.py`` (open),
``plane.py`` (close).
These are the main callers: it is imported across the wings, and its other importers are not
listed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import hashlib
import hmac
import json
import os
import secrets
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol, TypeVar

from ..canonical import canonical_text, sha256_digest
from ..clock import Clock
from ..codes import Code
from ..errors import AgentSafeError, StoreError
from ..principals import Verification, same_actor

__all__ = [
    "DATABASE_NAME",
    "RETENTION_SECONDS",
    "SCHEMA_VERSION",
    "ApprovalError",
    "ApprovalRecord",
    "ApprovalRequest",
    "ApprovalState",
    "AttemptFence",
    "ConsumptionRecord",
    "EnrolmentToken",
    "IdempotencyKind",
    "IdempotencyState",
    "OrphanKey",
    "PasskeyRecord",
    "SQLiteUseStore",
    "SQLiteWindow",
    "UseStore",
]

DATABASE_NAME = "usestore.sqlite3"
SCHEMA_VERSION = 2
RETENTION_SECONDS = 24 * 60 * 60
"""Finished idempotency records, grant claims and approvals are kept at least this long."""

_T = TypeVar("_T")

_MAX_GROUP = 256
"""At most this many writes share one transaction, so a group never holds the lock for long."""


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


class UseStore(Protocol):
    """Durable single-use and idempotency state shared by every executor process on a store."""

    async def claim_grant(
        self,
        grant_id: str,
        *,
        binding_digest: str,
        expires_at: float,
        now: float,
        fence: AttemptFence | None = None,
        payload_digest: str | None = None,
    ) -> bool:
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

    async def idempotency_begin(
        self,
        *,
        tenant: str,
        principal: str,
        key: str,
        payload_digest: str,
        now: float,
        attempt_id: str | None = None,
        owner: str | None = None,
    ) -> IdempotencyState:
        """Claim the key IN_PROGRESS for ``attempt_id`` (the id it will journal), by ``owner``."""
        ...

    async def idempotency_orphans(self, *, owner: str, before: float) -> list[OrphanKey]:
        """IN_PROGRESS records ``owner`` created before ``before`` (a previous process)."""
        ...

    async def idempotency_for_attempt(self, attempt_id: str) -> OrphanKey | None:
        """The record that began ``attempt_id`` (whatever its state), if it is still kept."""
        ...

    async def idempotency_complete(
        self, *, tenant: str, principal: str, key: str, response: dict[str, Any], now: float
    ) -> None: ...

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


_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS meta (
        name TEXT PRIMARY KEY, value BLOB NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS grant_claims (
        grant_id TEXT PRIMARY KEY, binding_digest TEXT NOT NULL,
        expires_at REAL NOT NULL, claimed_at REAL NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS idempotency (
        tenant TEXT NOT NULL, principal TEXT NOT NULL, key TEXT NOT NULL,
        payload_digest TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('IN_PROGRESS', 'DONE')),
        response TEXT, created_at REAL NOT NULL, completed_at REAL,
        attempt_id TEXT, owner TEXT,
        PRIMARY KEY (tenant, principal, key))""",
    """CREATE INDEX IF NOT EXISTS idempotency_attempt ON idempotency (attempt_id)""",
    """CREATE INDEX IF NOT EXISTS idempotency_owner ON idempotency (owner, state)""",
    """CREATE TABLE IF NOT EXISTS consumptions (
        namespace TEXT NOT NULL, key TEXT NOT NULL, nonce TEXT NOT NULL,
        consumed_at REAL NOT NULL, binding_digest TEXT NOT NULL,
        PRIMARY KEY (namespace, key))""",
    """CREATE TABLE IF NOT EXISTS approvals (
        request_id TEXT PRIMARY KEY, intent TEXT NOT NULL, intent_hash TEXT NOT NULL,
        approvers TEXT NOT NULL, proposer_principal TEXT NOT NULL,
        proposer_actor TEXT NOT NULL, expires_at REAL NOT NULL, created_at REAL NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('PENDING', 'APPROVED', 'DENIED')),
        approver TEXT, reason TEXT, decided_at REAL)""",
)
_APPROVAL_TERMS = (
    # issue 21: what escalated, the verification asked and given, cancellations. Added to an
    # existing table where missing (``_ensure_approver_schema``), whatever the schema version.
    ("rule", "TEXT"),
    ("reason_codes", "TEXT NOT NULL DEFAULT '[]'"),
    ("required_verification", "TEXT NOT NULL DEFAULT 'CREDENTIAL'"),
    ("verification", "TEXT"),
    ("cancelled_by", "TEXT"),
    ("cancel_reason", "TEXT"),
    ("cancelled_at", "REAL"),
)
_APPROVER_TABLES = (
    # issue 21: the approvers' passkeys and their one-time enrolment tokens.
    """CREATE TABLE IF NOT EXISTS passkeys (
        credential_id TEXT PRIMARY KEY, principal TEXT NOT NULL, public_key BLOB NOT NULL,
        sign_count INTEGER NOT NULL, transports TEXT NOT NULL, created_at REAL NOT NULL,
        last_used_at REAL)""",
    "CREATE INDEX IF NOT EXISTS passkeys_principal ON passkeys (principal)",
    """CREATE TABLE IF NOT EXISTS enrolment_tokens (
        token_digest TEXT PRIMARY KEY, principal TEXT NOT NULL, issued_by TEXT NOT NULL,
        issued_at REAL NOT NULL, expires_at REAL NOT NULL, used_at REAL)""",
)


def _ensure_approver_schema(conn: sqlite3.Connection) -> None:
    """Issue 21's columns and tables, added where missing (idempotent, on every open), so they
    compose with any numbered migration of the store."""
    present = {str(row[1]) for row in conn.execute("PRAGMA table_info(approvals)")}
    for column, declaration in _APPROVAL_TERMS:
        if column not in present:
            conn.execute(f"ALTER TABLE approvals ADD COLUMN {column} {declaration}")
    for statement in _APPROVER_TABLES:
        conn.execute(statement)


_DECISIONS = {"APPROVE": ApprovalState.APPROVED, "DENY": ApprovalState.DENIED}
_MAX_REASON = 1000


class SQLiteUseStore:
    """:class:`UseStore` on one SQLite file (WAL, ``synchronous=FULL``); see the module docstring.

    Construct with :meth:`open`. One dedicated thread owns the connection; the async methods hand
    it their work. Writes queue up and are committed in groups (one transaction, one fsync, a
    savepoint per write); processes serialise on the database's write lock (``BEGIN IMMEDIATE``
    with a busy timeout).
    """

    def __init__(
        self,
        path: Path,
        connection: sqlite3.Connection,
        worker: ThreadPoolExecutor,
        secret: bytes,
        clock: Clock,
    ) -> None:
        self._path = path
        self._conn = connection
        self._worker = worker
        self._secret = secret
        self._clock = clock
        self._closed = False
        self._pending: list[_Write] = []
        self._pending_lock = threading.Lock()
        self._drain_scheduled = False
        # How a group is committed; tests wrap it to count commits or to make one fail.
        self._commit: Callable[[sqlite3.Connection], None] = _commit

    @property
    def path(self) -> Path:
        return self._path

    @classmethod
    async def open(
        cls, state_dir: Path, *, clock: Clock, busy_timeout_s: float = 30.0
    ) -> SQLiteUseStore:
        """Open (creating if needed) the store under ``state_dir``, private to this user."""
        worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentsafe-usestore")
        loop = asyncio.get_running_loop()
        try:
            path, conn, secret = await loop.run_in_executor(
                worker, _open_database, state_dir, busy_timeout_s
            )
        except BaseException:
            worker.shutdown(wait=True)
            raise
        return cls(path, conn, worker, secret, clock)

    async def _run(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        if self._closed:
            raise StoreError("the use store is closed", code=Code.STORE_CLOSED)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._worker, _guarded, self._conn, fn)

    async def _write(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        """Queue ``fn`` for the next group commit; its result once that commit has returned.

        ``fn`` runs on the store's thread inside the group's transaction and its own savepoint;
        it must not begin, commit or roll back a transaction itself.
        """
        if self._closed:
            raise StoreError("the use store is closed", code=Code.STORE_CLOSED)
        loop = asyncio.get_running_loop()
        write = _Write(fn, loop, loop.create_future())
        write.waiter.add_done_callback(write.abandoned)
        with self._pending_lock:
            self._pending.append(write)
            if not self._drain_scheduled:
                try:
                    self._worker.submit(self._drain)
                except RuntimeError:  # the executor is shutting down
                    self._pending.remove(write)
                    raise StoreError("the use store is closed", code=Code.STORE_CLOSED) from None
                self._drain_scheduled = True
        result: _T = await write.waiter
        return result

    def _take(self) -> list[_Write]:
        with self._pending_lock:
            batch = self._pending[:_MAX_GROUP]
            del self._pending[:_MAX_GROUP]
        return [write for write in batch if write.done.set_running_or_notify_cancel()]

    def _drain(self) -> None:
        """On the store's thread: commit what is pending now, then let queued reads run before
        the next group (the next drain is queued behind them)."""
        group: list[_Write] = []
        try:
            group = self._take()
            if group:
                _commit_group(self._conn, group, self._commit)
        finally:
            _deliver(group)
            with self._pending_lock:
                stranded: list[_Write] = []
                if self._pending:
                    try:
                        self._worker.submit(self._drain)
                    except RuntimeError:  # the executor is shutting down: nobody will drain
                        stranded, self._pending = self._pending, []
                        self._drain_scheduled = False
                else:
                    self._drain_scheduled = False
            closed = StoreError("the use store is closed", code=Code.STORE_CLOSED)
            stranded = [w for w in stranded if w.done.set_running_or_notify_cancel()]
            _fail(stranded, closed)
            _deliver(stranded)

    def _close_connection(self) -> None:
        """On the store's thread: commit every write accepted before :meth:`close`, then close."""
        try:
            while True:
                with self._pending_lock:
                    if not self._pending:
                        break
                group = self._take()
                try:
                    if group:
                        _commit_group(self._conn, group, self._commit)
                finally:
                    _deliver(group)
        finally:
            self._conn.close()

    # -- grant claims --------------------------------------------------------------------------

    async def claim_grant(
        self,
        grant_id: str,
        *,
        binding_digest: str,
        expires_at: float,
        now: float,
        fence: AttemptFence | None = None,
        payload_digest: str | None = None,
    ) -> bool:
        """As :meth:`UseStore.claim_grant`. ``fence`` is not needed here: no attempt of this
        store is ever taken over while the process that opened it lives (its journal's lock is
        held until it dies; docs/high-availability.md, "Fencing")."""
        del fence, payload_digest

        def work(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "INSERT INTO grant_claims (grant_id, binding_digest, expires_at, claimed_at)"
                " VALUES (?, ?, ?, ?) ON CONFLICT (grant_id) DO NOTHING",
                (grant_id, binding_digest, expires_at, now),
            )
            return cur.rowcount == 1

        return await self._write(work)

    async def grant_claimed(self, grant_id: str) -> bool:
        def work(conn: sqlite3.Connection) -> bool:
            row = conn.execute(
                "SELECT 1 FROM grant_claims WHERE grant_id = ?", (grant_id,)
            ).fetchone()
            return row is not None

        return await self._run(work)

    # -- idempotency ---------------------------------------------------------------------------

    async def idempotency_orphans(self, *, owner: str, before: float) -> list[OrphanKey]:
        def work(conn: sqlite3.Connection) -> list[OrphanKey]:
            rows = conn.execute(
                "SELECT tenant, principal, key, attempt_id, created_at FROM idempotency"
                " WHERE owner = ? AND state = 'IN_PROGRESS' AND created_at < ?"
                " ORDER BY created_at",
                (owner, before),
            ).fetchall()
            return [OrphanKey(r[0], r[1], r[2], r[3], float(r[4])) for r in rows]

        return await self._run(work)

    async def idempotency_for_attempt(self, attempt_id: str) -> OrphanKey | None:
        def work(conn: sqlite3.Connection) -> OrphanKey | None:
            r = conn.execute(
                "SELECT tenant, principal, key, attempt_id, created_at FROM idempotency"
                " WHERE attempt_id = ?",
                (attempt_id,),
            ).fetchone()
            return None if r is None else OrphanKey(r[0], r[1], r[2], r[3], float(r[4]))

        return await self._run(work)

    async def idempotency_begin(
        self,
        *,
        tenant: str,
        principal: str,
        key: str,
        payload_digest: str,
        now: float,
        attempt_id: str | None = None,
        owner: str | None = None,
    ) -> IdempotencyState:
        def work(conn: sqlite3.Connection) -> IdempotencyState:
            row = conn.execute(
                "SELECT payload_digest, state, response FROM idempotency"
                " WHERE tenant = ? AND principal = ? AND key = ?",
                (tenant, principal, key),
            ).fetchone()
            if row is None:
                conn.execute(
                    "INSERT INTO idempotency (tenant, principal, key, payload_digest, state,"
                    " created_at, attempt_id, owner) VALUES (?, ?, ?, ?, 'IN_PROGRESS', ?, ?, ?)",
                    (tenant, principal, key, payload_digest, now, attempt_id, owner),
                )
                return IdempotencyState(IdempotencyKind.NEW)
            stored_digest, state, response = row
            if not hmac.compare_digest(str(stored_digest), payload_digest):
                return IdempotencyState(IdempotencyKind.CONFLICT)
            if state == "IN_PROGRESS":
                return IdempotencyState(IdempotencyKind.IN_PROGRESS)
            return IdempotencyState(IdempotencyKind.REPLAY, response=_load_object(response))

        return await self._write(work)

    async def idempotency_complete(
        self, *, tenant: str, principal: str, key: str, response: dict[str, Any], now: float
    ) -> None:
        """Record the final answer of an in-flight key. The first final answer is never replaced:
        completing a finished key raises ``IDEMPOTENCY_ALREADY_COMPLETE`` unless the answer is
        identical, and a key with no record raises ``IDEMPOTENCY_RECORD_MISSING``."""
        text = _canonical_or_store_error(response)

        def work(conn: sqlite3.Connection) -> None:
            row = conn.execute(
                "SELECT state, response FROM idempotency"
                " WHERE tenant = ? AND principal = ? AND key = ?",
                (tenant, principal, key),
            ).fetchone()
            if row is None:
                raise StoreError(
                    "no idempotency record for this key", code=Code.IDEMPOTENCY_RECORD_MISSING
                )
            if row[0] == "DONE":
                if row[1] == text:
                    return
                raise StoreError(
                    "this key already has a final answer", code=Code.IDEMPOTENCY_ALREADY_COMPLETE
                )
            conn.execute(
                "UPDATE idempotency SET state = 'DONE', response = ?, completed_at = ?"
                " WHERE tenant = ? AND principal = ? AND key = ?",
                (text, now, tenant, principal, key),
            )

        await self._write(work)

    async def idempotency_settle(
        self, *, tenant: str, principal: str, key: str, response: dict[str, Any], now: float
    ) -> bool:
        """Record what reconciliation learned about a key whose outcome was unknown.

        An in-flight key gets ``response`` as its final answer; a finished key is replaced only
        when its recorded answer was UNKNOWN_AFTER_DISPATCH (nothing else is ever rewritten).
        True when the record changed.
        """
        text = _canonical_or_store_error(response)

        def work(conn: sqlite3.Connection) -> bool:
            row = conn.execute(
                "SELECT state, response FROM idempotency"
                " WHERE tenant = ? AND principal = ? AND key = ?",
                (tenant, principal, key),
            ).fetchone()
            if row is None:
                return False
            if row[0] == "DONE" and not settles(json.loads(row[1]) if row[1] else {}):
                return False
            conn.execute(
                "UPDATE idempotency SET state = 'DONE', response = ?, completed_at = ?"
                " WHERE tenant = ? AND principal = ? AND key = ?",
                (text, now, tenant, principal, key),
            )
            return True

        settled: bool = await self._write(work)
        return settled

    async def idempotency_release(
        self, *, tenant: str, principal: str, key: str, owner: str | None = None
    ) -> None:
        """Delete an IN_PROGRESS record; a finished record is never deleted here. ``owner`` is
        for the shared store's fence; one process owns this file, so it changes nothing here."""

        def work(conn: sqlite3.Connection) -> None:
            conn.execute(
                "DELETE FROM idempotency WHERE tenant = ? AND principal = ? AND key = ?"
                " AND state = 'IN_PROGRESS'",
                (tenant, principal, key),
            )

        await self._write(work)

    # -- consumptions --------------------------------------------------------------------------

    async def consume(
        self, namespace: str, key: str, *, binding: dict[str, Any], now: float
    ) -> ConsumptionRecord | None:
        binding_digest = _digest_or_store_error(binding)
        nonce = secrets.token_hex(16)

        def work(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "INSERT INTO consumptions (namespace, key, nonce, consumed_at, binding_digest)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (namespace, key) DO NOTHING",
                (namespace, key, nonce, now, binding_digest),
            )
            return cur.rowcount == 1

        if not await self._write(work):
            return None
        token = self._token(namespace, key, nonce, now, binding_digest)
        return ConsumptionRecord(namespace, key, nonce, now, binding_digest, token)

    async def verify_consumption(self, record: ConsumptionRecord) -> bool:
        """True if ``record`` was issued by this store and its row still says exactly that."""
        try:
            expected = self._token(
                record.namespace,
                record.key,
                record.nonce,
                record.consumed_at,
                record.binding_digest,
            )
        except AgentSafeError:
            return False
        if not isinstance(record.token, str) or not hmac.compare_digest(
            expected.encode(), record.token.encode()
        ):
            return False

        def work(conn: sqlite3.Connection) -> bool:
            row = conn.execute(
                "SELECT nonce, consumed_at, binding_digest FROM consumptions"
                " WHERE namespace = ? AND key = ?",
                (record.namespace, record.key),
            ).fetchone()
            return row is not None and (row[0], row[1], row[2]) == (
                record.nonce,
                record.consumed_at,
                record.binding_digest,
            )

        return await self._run(work)

    def _token(
        self, namespace: str, key: str, nonce: str, consumed_at: float, binding_digest: str
    ) -> str:
        return consumption_token(self._secret, namespace, key, nonce, consumed_at, binding_digest)

    # -- approvals -----------------------------------------------------------------------------

    async def approval_create(self, request: ApprovalRequest) -> None:
        """Store a new PENDING request; its ``intent_hash`` must be the hash of its intent."""
        if _digest_or_store_error(request.intent) != request.intent_hash:
            raise ApprovalError(
                "the intent does not hash to its intent_hash", code=Code.APPROVAL_BINDING_MISMATCH
            )
        intent_text = canonical_text(dict(request.intent))
        approvers_text = canonical_text(list(request.approvers))
        reasons_text = canonical_text(list(request.reason_codes))

        def work(conn: sqlite3.Connection) -> None:
            cur = conn.execute(
                "INSERT INTO approvals (request_id, intent, intent_hash, approvers,"
                " proposer_principal, proposer_actor, expires_at, created_at, state,"
                " rule, reason_codes, required_verification)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'PENDING', ?, ?, ?)"
                " ON CONFLICT (request_id) DO NOTHING",
                (
                    request.request_id,
                    intent_text,
                    request.intent_hash,
                    approvers_text,
                    request.proposer_principal,
                    request.proposer_actor,
                    request.expires_at,
                    request.created_at,
                    request.rule,
                    reasons_text,
                    request.verification.value,
                ),
            )
            if cur.rowcount != 1:
                raise ApprovalError("the request id is taken", code=Code.APPROVAL_EXISTS)

        await self._write(work)

    async def approval_get(self, request_id: str) -> ApprovalRecord | None:
        def work(conn: sqlite3.Connection) -> ApprovalRecord | None:
            row = conn.execute(
                f"SELECT {_APPROVAL_COLUMNS} FROM approvals WHERE request_id = ?",  # noqa: S608
                (request_id,),
            ).fetchone()
            return None if row is None else _approval_from_row(row)

        return await self._run(work)

    async def approval_list(
        self, *, state: ApprovalState, now: float, approver: str | None = None
    ) -> list[ApprovalRecord]:
        """Requests in ``state`` as of ``now`` (PENDING excludes expired ones, EXPIRED lists
        them), oldest first; with ``approver``, only those that principal may decide."""

        def work(conn: sqlite3.Connection) -> list[ApprovalRecord]:
            args: tuple[object, ...]
            where, args = _listing(state, now, "?")
            rows = conn.execute(
                f"SELECT {_APPROVAL_COLUMNS} FROM approvals WHERE {where}"  # noqa: S608
                " ORDER BY created_at, request_id",
                args,
            ).fetchall()
            records = [_approval_from_row(row) for row in rows]
            if approver is not None:
                records = [
                    r
                    for r in records
                    if approver in r.request.approvers
                    and not same_actor(approver, r.request.proposer_principal)
                ]
            return records

        return await self._run(work)

    async def approval_decide(
        self,
        request_id: str,
        *,
        decision: str,
        approver: str,
        reason: str,
        now: float,
        verification: Verification = Verification.CREDENTIAL,
    ) -> ApprovalRecord:
        """Record the one decision on a request. The approver must be one the request names and
        never its proposer (separation of duties); exactly one decider wins a race."""
        new_state = decision_state(decision, reason)

        def work(conn: sqlite3.Connection) -> ApprovalRecord:
            record = self._approval_row(conn, request_id)
            check_decidable(record, approver=approver, now=now)
            conn.execute(
                "UPDATE approvals SET state = ?, approver = ?, reason = ?, decided_at = ?,"
                " verification = ? WHERE request_id = ? AND state = 'PENDING'",
                (new_state.value, approver, reason, now, verification.value, request_id),
            )
            return dataclasses.replace(
                record,
                stored_state=new_state,
                approver=approver,
                reason=reason,
                decided_at=now,
                verification=verification,
            )

        return await self._write(work)

    @staticmethod
    def _approval_row(conn: sqlite3.Connection, request_id: str) -> ApprovalRecord:
        row = conn.execute(
            f"SELECT {_APPROVAL_COLUMNS} FROM approvals WHERE request_id = ?",  # noqa: S608
            (request_id,),
        ).fetchone()
        if row is None:
            raise ApprovalError("no such approval request", code=Code.APPROVAL_NOT_FOUND)
        return _approval_from_row(row)

    async def approval_cancel(
        self, request_id: str, *, by: str, reason: str, now: float
    ) -> ApprovalRecord:
        def work(conn: sqlite3.Connection) -> ApprovalRecord:
            record = self._approval_row(conn, request_id)
            check_cancellable(record, reason=reason, now=now)
            conn.execute(
                "UPDATE approvals SET cancelled_by = ?, cancel_reason = ?, cancelled_at = ?"
                " WHERE request_id = ? AND state = 'PENDING' AND cancelled_at IS NULL",
                (by, reason, now, request_id),
            )
            return dataclasses.replace(
                record, cancelled_by=by, cancel_reason=reason, cancelled_at=now
            )

        return await self._write(work)

    # -- passkeys and enrolment tokens (issue 21) ------------------------------------------------

    async def enrolment_issue(self, token: EnrolmentToken) -> None:
        def work(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO enrolment_tokens (token_digest, principal, issued_by, issued_at,"
                " expires_at) VALUES (?, ?, ?, ?, ?)",
                (
                    token.token_digest,
                    token.principal,
                    token.issued_by,
                    token.issued_at,
                    token.expires_at,
                ),
            )

        await self._write(work)

    async def enrolment_get(self, token_digest: str, *, now: float) -> EnrolmentToken | None:
        def work(conn: sqlite3.Connection) -> EnrolmentToken | None:
            row = conn.execute(
                "SELECT token_digest, principal, issued_by, issued_at, expires_at"
                " FROM enrolment_tokens"
                " WHERE token_digest = ? AND used_at IS NULL AND expires_at > ?",
                (token_digest, now),
            ).fetchone()
            return None if row is None else EnrolmentToken(*row)

        return await self._run(work)

    async def passkey_enrol(self, token_digest: str, passkey: PasskeyRecord, *, now: float) -> None:
        def work(conn: sqlite3.Connection) -> None:
            used = conn.execute(
                "UPDATE enrolment_tokens SET used_at = ? WHERE token_digest = ?"
                " AND principal = ? AND used_at IS NULL AND expires_at > ?",
                (now, token_digest, passkey.principal, now),
            ).rowcount
            if used != 1:
                raise StoreError(
                    "the enrolment token is not usable", code=Code.ENROLMENT_TOKEN_INVALID
                )
            inserted = conn.execute(
                "INSERT INTO passkeys (credential_id, principal, public_key, sign_count,"
                " transports, created_at) VALUES (?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (credential_id) DO NOTHING",
                (
                    passkey.credential_id,
                    passkey.principal,
                    passkey.public_key,
                    passkey.sign_count,
                    canonical_text(list(passkey.transports)),
                    passkey.created_at,
                ),
            ).rowcount
            if inserted != 1:
                raise StoreError(
                    "this passkey is already registered", code=Code.WEBAUTHN_REGISTRATION_INVALID
                )

        await self._write(work)

    async def passkey_list(self, principal: str) -> list[PasskeyRecord]:
        def work(conn: sqlite3.Connection) -> list[PasskeyRecord]:
            rows = conn.execute(
                f"SELECT {_PASSKEY_COLUMNS} FROM passkeys WHERE principal = ?"  # noqa: S608
                " ORDER BY created_at, credential_id",
                (principal,),
            ).fetchall()
            return [passkey_from_row(tuple(row)) for row in rows]

        return await self._run(work)

    async def passkey_used(
        self, principal: str, credential_id: str, *, sign_count: int, now: float
    ) -> None:
        def work(conn: sqlite3.Connection) -> None:
            row = conn.execute(
                "SELECT sign_count FROM passkeys WHERE credential_id = ? AND principal = ?",
                (credential_id, principal),
            ).fetchone()
            if row is None:
                raise StoreError("no such passkey", code=Code.WEBAUTHN_ASSERTION_INVALID)
            check_sign_count(int(row[0]), sign_count)
            conn.execute(
                "UPDATE passkeys SET sign_count = ?, last_used_at = ? WHERE credential_id = ?",
                (sign_count, now, credential_id),
            )

        await self._write(work)

    # -- housekeeping --------------------------------------------------------------------------

    async def purge(self, now: float) -> int:
        """Delete what is older than the retention: finished idempotency records, claims of
        grants expired that long ago, and approval requests expired that long ago; an in-flight
        record that names no owner (written where no journal runs, so nothing of it was
        dispatched) once it is that old. Other in-flight idempotency records (settled at start
        from their journal) and consumptions are never purged. Returns rows deleted."""
        cutoff = now - RETENTION_SECONDS

        def work(conn: sqlite3.Connection) -> int:
            deleted = conn.execute(
                "DELETE FROM idempotency WHERE state = 'DONE' AND completed_at < ?", (cutoff,)
            ).rowcount
            deleted += conn.execute(
                "DELETE FROM idempotency WHERE state = 'IN_PROGRESS' AND owner = ''"
                " AND created_at < ?",
                (cutoff,),
            ).rowcount
            deleted += conn.execute(
                "DELETE FROM grant_claims WHERE expires_at < ?", (cutoff,)
            ).rowcount
            deleted += conn.execute(
                "DELETE FROM approvals WHERE expires_at < ?", (cutoff,)
            ).rowcount
            deleted += conn.execute(
                "DELETE FROM enrolment_tokens WHERE expires_at < ?", (cutoff,)
            ).rowcount
            return deleted

        return await self._write(work)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._worker, self._close_connection)
        finally:
            self._worker.shutdown(wait=True)


# -- helpers (run on the store's thread) -----------------------------------------------------

_APPROVAL_COLUMNS = (
    "request_id, intent, intent_hash, approvers, proposer_principal, proposer_actor,"
    " expires_at, created_at, state, approver, reason, decided_at, rule, reason_codes,"
    " required_verification, verification, cancelled_by, cancel_reason, cancelled_at"
)
_PASSKEY_COLUMNS = "principal, credential_id, public_key, sign_count, created_at, transports"


def _listing(state: ApprovalState, now: float, mark: str) -> tuple[str, tuple[object, ...]]:
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


@contextlib.contextmanager
def _immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """A ``BEGIN IMMEDIATE`` transaction: the write lock is taken up front, so two processes
    never both read a row and then both try to write it."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


@dataclass(eq=False)
class _Write:
    """One queued write: the work, its outcome (``done``, settled on the store's thread) and
    the future its caller awaits on the event loop (``waiter``).

    The store's thread settles ``done`` for every write of a group only after the group's
    COMMIT returned, then hands the whole group to each waiting loop in one
    ``call_soon_threadsafe`` (:func:`_deliver`): one cross-thread wakeup per group, not per
    write. A caller that gives up (``waiter`` cancelled) cancels ``done``, so a write not yet
    taken into a group is never applied; one already taken commits as it would have."""

    fn: Callable[[sqlite3.Connection], Any]
    loop: asyncio.AbstractEventLoop
    waiter: asyncio.Future[Any]
    done: concurrent.futures.Future[Any] = field(default_factory=concurrent.futures.Future)

    def abandoned(self, waiter: asyncio.Future[Any]) -> None:
        if waiter.cancelled():
            self.done.cancel()


def _deliver(writes: list[_Write]) -> None:
    """On the store's thread: pass each settled write's outcome to its caller's loop, one
    wakeup per loop for the whole list."""
    by_loop: dict[asyncio.AbstractEventLoop, list[_Write]] = {}
    for write in writes:
        by_loop.setdefault(write.loop, []).append(write)
    for loop, batch in by_loop.items():
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
            loop.call_soon_threadsafe(_settle, batch)


def _settle(writes: list[_Write]) -> None:
    """On the event loop: each waiter takes its write's outcome (a waiter already cancelled
    keeps its cancellation)."""
    for write in writes:
        if write.waiter.done():
            continue
        done = write.done
        if not done.done():  # never settled (cannot happen): fail closed, never hang
            write.waiter.set_exception(
                StoreError("the use store failed", code=Code.STORE_UNAVAILABLE)
            )
        elif done.cancelled():
            write.waiter.cancel()
        elif (error := done.exception()) is not None:
            write.waiter.set_exception(error)
        else:
            write.waiter.set_result(done.result())


_SAVEPOINT = "agentsafe_write"


def _commit(conn: sqlite3.Connection) -> None:
    conn.execute("COMMIT")


def _unavailable(exc: BaseException) -> StoreError:
    return StoreError(f"the use store failed: {type(exc).__name__}", code=Code.STORE_UNAVAILABLE)


def _rollback_quietly(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


class _TransactionLost(Exception):
    """The group's transaction is gone (SQLite rolled it back, or a savepoint failed)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(type(cause).__name__)
        self.cause = cause


def _apply(conn: sqlite3.Connection, write: _Write) -> tuple[bool, Any]:
    """Run one write in its own savepoint: ``(True, result)`` or ``(False, exception)`` with
    only this write's changes undone. Raises :class:`_TransactionLost` when the transaction
    itself did not survive."""
    try:
        conn.execute(f"SAVEPOINT {_SAVEPOINT}")
    except sqlite3.Error as exc:
        raise _TransactionLost(exc) from None
    try:
        value = write.fn(conn)
    except Exception as exc:  # every failure belongs to this write alone
        failure: BaseException = _unavailable(exc) if isinstance(exc, sqlite3.Error) else exc
        if not conn.in_transaction:
            raise _TransactionLost(exc) from None
        try:
            conn.execute(f"ROLLBACK TO {_SAVEPOINT}")
            conn.execute(f"RELEASE {_SAVEPOINT}")
        except sqlite3.Error as rollback_error:
            raise _TransactionLost(rollback_error) from None
        return False, failure
    try:
        conn.execute(f"RELEASE {_SAVEPOINT}")
    except sqlite3.Error as exc:
        raise _TransactionLost(exc) from None
    return True, value


def _commit_group(
    conn: sqlite3.Connection, group: list[_Write], commit: Callable[[sqlite3.Connection], None]
) -> None:
    """Apply ``group`` in order in one ``BEGIN IMMEDIATE`` transaction and commit it once; only
    then resolve each write's future. A write during which the transaction is lost fails alone
    and the group is run again without it (nothing was acknowledged yet); a failed BEGIN or
    COMMIT fails every write of the group."""
    remaining = list(group)
    try:
        while remaining:
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                _rollback_quietly(conn)
                _fail(remaining, _unavailable(exc))
                return
            outcomes: list[tuple[bool, Any]] = []
            try:
                for write in remaining:
                    outcomes.append(_apply(conn, write))
            except _TransactionLost as lost:
                _rollback_quietly(conn)
                culprit = remaining[len(outcomes)]
                culprit.done.set_exception(_unavailable(lost.cause))
                remaining = [w for w in remaining if w is not culprit]
                continue
            try:
                commit(conn)
            except Exception as exc:  # nothing of this group is durable
                _rollback_quietly(conn)
                _fail(remaining, _unavailable(exc))
                return
            for write, (ok, value) in zip(remaining, outcomes, strict=True):
                if ok:
                    write.done.set_result(value)
                else:
                    write.done.set_exception(value)
            return
    except BaseException as exc:
        _rollback_quietly(conn)
        _fail([w for w in remaining if not w.done.done()], _unavailable(exc))
        raise


def _fail(writes: list[_Write], error: StoreError) -> None:
    for write in writes:
        write.done.set_exception(error)


def _guarded(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], _T]) -> _T:
    try:
        return fn(conn)
    except sqlite3.Error as exc:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise StoreError(
            f"the use store failed: {type(exc).__name__}", code=Code.STORE_UNAVAILABLE
        ) from None


def _open_database(
    state_dir: Path, busy_timeout_s: float
) -> tuple[Path, sqlite3.Connection, bytes]:
    try:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(state_dir, 0o700)
        path = state_dir / DATABASE_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            os.fchmod(fd, 0o600)
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise StoreError("the store path is not a file", code=Code.STORE_UNAVAILABLE)
        finally:
            os.close(fd)
    except OSError as exc:
        raise StoreError(
            f"the state directory is unusable: {exc.strerror}", code=Code.STORE_UNAVAILABLE
        ) from None
    try:
        conn = sqlite3.connect(
            path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=True
        )
    except sqlite3.Error:
        raise StoreError("the use store cannot be opened", code=Code.STORE_UNAVAILABLE) from None
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        _set_wal(conn, busy_timeout_s)
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA foreign_keys = ON")
        secret = _migrate(conn)
    except BaseException as exc:
        conn.close()
        if isinstance(exc, sqlite3.Error):
            raise StoreError(
                "the use store cannot be opened", code=Code.STORE_UNAVAILABLE
            ) from None
        raise
    return path, conn, secret


def _set_wal(conn: sqlite3.Connection, busy_timeout_s: float) -> None:
    # Switching a fresh database to WAL needs a moment of exclusive access; a sibling process
    # opening at the same instant can make it report "locked" without the busy handler.
    deadline = time.monotonic() + busy_timeout_s
    while True:
        try:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        except sqlite3.OperationalError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.01)
            continue
        if str(mode).lower() != "wal":
            raise StoreError("the use store cannot use WAL", code=Code.STORE_UNAVAILABLE)
        return


def _migrate(conn: sqlite3.Connection) -> bytes:
    with _immediate(conn):
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise StoreError(
                "the use store was written by a newer agentsafe", code=Code.STORE_SCHEMA_UNSUPPORTED
            )
        if version == 1:  # version 2 names each key's attempt and owner (added if missing)
            have = {str(r[1]) for r in conn.execute("PRAGMA table_info(idempotency)")}
            for column in ("attempt_id", "owner"):
                if column not in have:
                    conn.execute(f"ALTER TABLE idempotency ADD COLUMN {column} TEXT")
        if version < SCHEMA_VERSION:
            for statement in _SCHEMA:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        _ensure_approver_schema(conn)
        conn.execute(_CEILING_WINDOW_TABLE)
        conn.execute(
            "INSERT INTO meta (name, value) VALUES ('consumption_key', ?)"
            " ON CONFLICT (name) DO NOTHING",
            (secrets.token_bytes(32),),
        )
        row = conn.execute("SELECT value FROM meta WHERE name = 'consumption_key'").fetchone()
    secret = bytes(row[0])
    if len(secret) < 32:
        raise StoreError("the use store's key is damaged", code=Code.STORE_UNAVAILABLE)
    return secret


_CEILING_WINDOW_TABLE = """CREATE TABLE IF NOT EXISTS ceiling_window (
    id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, amount_minor INTEGER NOT NULL)"""
"""The host ceilings' window shared by ``EXECUTOR_WORKERS`` workers (:class:`SQLiteWindow`);
created where missing on every open, whatever the schema version."""


class SQLiteWindow:
    """The host-ceiling window shared by every worker process of one SQLite store.

    Implements ``lifecycle/ceilings.py``'s ``CeilingWindow`` on the wall clock: every
    reservation re-counts the window and takes its place inside one write transaction (SQLite's
    write lock, across processes), so N allowed means N in total, never N per worker. Used only
    under ``EXECUTOR_WORKERS`` above 1 (one process keeps its window in memory).
    """

    def __init__(self, store: SQLiteUseStore) -> None:
        self._store = store

    async def usage(self, window_seconds: float) -> tuple[int, int]:
        horizon = self._store._clock.now() - window_seconds
        return await self._store._write(lambda conn: _window_usage(conn, horizon))

    async def reserve(
        self,
        *,
        window_seconds: float,
        amount_minor: int,
        count_limit: int | None,
        sum_limit: int | None,
    ) -> tuple[str | None, object]:
        """``(None, token)`` with a place taken, or ``("COUNT" | "SUM", None)``."""
        now = self._store._clock.now()

        def work(conn: sqlite3.Connection) -> tuple[str | None, object]:
            count, total = _window_usage(conn, now - window_seconds)
            if count_limit is not None and count + 1 > count_limit:
                return "COUNT", None
            if sum_limit is not None and total + amount_minor > sum_limit:
                return "SUM", None
            cur = conn.execute(
                "INSERT INTO ceiling_window (at, amount_minor) VALUES (?, ?)", (now, amount_minor)
            )
            return None, int(cur.lastrowid or 0)

        return await self._store._write(work)

    async def release(self, token: object) -> None:
        if not isinstance(token, int):
            return

        def work(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM ceiling_window WHERE id = ?", (token,))

        await self._store._write(work)


def _window_usage(conn: sqlite3.Connection, horizon: float) -> tuple[int, int]:
    conn.execute("DELETE FROM ceiling_window WHERE at <= ?", (horizon,))
    row = conn.execute(
        "SELECT count(*), coalesce(sum(amount_minor), 0) FROM ceiling_window"
    ).fetchone()
    return int(row[0]), int(row[1])


def _approval_from_row(row: tuple[Any, ...]) -> ApprovalRecord:
    intent = _load_object(row[1])
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


def _load_object(text: Any) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        raise StoreError("a stored record is damaged", code=Code.STORE_RECORD_DAMAGED) from None
    if not isinstance(value, dict):
        raise StoreError("a stored record is damaged", code=Code.STORE_RECORD_DAMAGED)
    return value


def _canonical_or_store_error(value: Mapping[str, Any]) -> str:
    try:
        return canonical_text(value)
    except AgentSafeError:
        raise StoreError(
            "the value has no canonical JSON form", code=Code.STORE_VALUE_INVALID
        ) from None


def _digest_or_store_error(value: Mapping[str, Any]) -> str:
    try:
        return sha256_digest(value)
    except AgentSafeError:
        raise StoreError(
            "the value has no canonical JSON form", code=Code.STORE_VALUE_INVALID
        ) from None
