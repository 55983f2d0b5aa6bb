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

Callers: ``state/backend.py`` (opens it without ``EXECUTOR_STORE_URL``); through the
:class:`~agentsafe.executor.state.protocol.UseStore` protocol, the authority (grant claims), the
pipeline (idempotency), plan approvals (consumptions), the approval routes and
``POST /v1/escalations`` (approvals), and the executor (close).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import secrets
import sqlite3
from typing import Any

from ..codes import Code
from ..errors import StoreError
from ..principals import Verification
from ..windows import ceiling_verdict
from .records import (
    RETENTION_SECONDS,
    ApprovalError,
    ApprovalRecord,
    ApprovalRequest,
    ApprovalState,
    AttemptFence,
    ConsumptionRecord,
    EnrolmentToken,
    IdempotencyKind,
    IdempotencyState,
    OrphanKey,
    PasskeyRecord,
    check_cancellable,
    check_decidable,
    check_sign_count,
    consumption_token,
    decision_state,
    settles,
)
from .sqlitedb import DATABASE_NAME, SCHEMA_VERSION, SQLiteDatabase
from .statements import (
    APPROVAL_COLUMNS,
    APPROVAL_DECIDE,
    APPROVAL_INSERT,
    CONSUMPTION_ROW,
    PASSKEY_COLUMNS,
    PASSKEY_INSERT,
    approval_from_row,
    approval_insert_args,
    approval_listing,
    canonical_or_store_error,
    completed_already,
    consumption_matches,
    decided,
    digest_or_store_error,
    load_object,
    passkey_from_row,
    passkey_insert_args,
    token_matches,
    visible_to,
)

__all__ = ["DATABASE_NAME", "SCHEMA_VERSION", "SQLiteUseStore", "SQLiteWindow"]


class SQLiteUseStore(SQLiteDatabase):
    """:class:`~agentsafe.executor.state.protocol.UseStore` on one SQLite file (WAL,
    ``synchronous=FULL``; ``state/sqlitedb.py``); see the module docstring.

    The three writes of every ALLOW (:meth:`idempotency_begin`, :meth:`claim_grant`,
    :meth:`idempotency_complete`) and the one write of a BLOCK (:meth:`idempotency_record`)
    are plain methods that hand back the write's own future
    (``SQLiteDatabase._write``): the request awaits it directly, so no frame of the store stands
    in its await chain while the group commit runs (issue 32). A closed store is refused at the
    call; every other refusal arrives through the future."""

    # -- grant claims --------------------------------------------------------------------------

    def claim_grant(
        self,
        grant_id: str,
        *,
        binding_digest: str,
        expires_at: float,
        now: float,
        fence: AttemptFence | None = None,
        payload_digest: str | None = None,
    ) -> asyncio.Future[bool]:
        """As :meth:`UseStore.claim_grant`: the write's future (see the class docstring).
        ``fence`` is not needed here: no attempt of this store is ever taken over while the
        process that opened it lives (its journal's lock is held until it dies;
        docs/high-availability.md, "Fencing")."""
        del fence, payload_digest

        def work(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "INSERT INTO grant_claims (grant_id, binding_digest, expires_at, claimed_at)"
                " VALUES (?, ?, ?, ?) ON CONFLICT (grant_id) DO NOTHING",
                (grant_id, binding_digest, expires_at, now),
            )
            return cur.rowcount == 1

        return self._write(work)

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
    ) -> asyncio.Future[IdempotencyState]:
        def work(conn: sqlite3.Connection) -> IdempotencyState:
            # The insert first: a new key (nearly every call) costs one statement, not a read
            # and then an insert (issue 34; the group's transaction holds the write lock, so
            # nothing changes the row between the two statements either way).
            if conn.execute(
                "INSERT INTO idempotency (tenant, principal, key, payload_digest, state,"
                " created_at, attempt_id, owner) VALUES (?, ?, ?, ?, 'IN_PROGRESS', ?, ?, ?)"
                " ON CONFLICT (tenant, principal, key) DO NOTHING",
                (tenant, principal, key, payload_digest, now, attempt_id, owner),
            ).rowcount:
                return IdempotencyState(IdempotencyKind.NEW)
            return _key_kept(conn, tenant, principal, key, payload_digest)

        return self._write(work)

    def idempotency_record(
        self,
        *,
        tenant: str,
        principal: str,
        key: str,
        payload_digest: str,
        response: dict[str, Any],
        now: float,
    ) -> asyncio.Future[IdempotencyState]:
        """As :meth:`UseStore.idempotency_record`: a new key takes its final answer in one
        write (one statement in the group's commit); a key already kept is reported as
        :meth:`idempotency_begin` would report it, and nothing changes."""

        def work(conn: sqlite3.Connection) -> IdempotencyState:
            text = canonical_or_store_error(response)
            if conn.execute(
                "INSERT INTO idempotency (tenant, principal, key, payload_digest, state,"
                " created_at, response, completed_at) VALUES (?, ?, ?, ?, 'DONE', ?, ?, ?)"
                " ON CONFLICT (tenant, principal, key) DO NOTHING",
                (tenant, principal, key, payload_digest, now, text, now),
            ).rowcount:
                return IdempotencyState(IdempotencyKind.NEW)
            return _key_kept(conn, tenant, principal, key, payload_digest)

        return self._write(work)

    def idempotency_complete(
        self, *, tenant: str, principal: str, key: str, response: dict[str, Any], now: float
    ) -> asyncio.Future[None]:
        """Record the final answer of an in-flight key. The first final answer is never replaced:
        completing a finished key raises ``IDEMPOTENCY_ALREADY_COMPLETE`` unless the answer is
        identical, and a key with no record raises ``IDEMPOTENCY_RECORD_MISSING``. The answer's
        canonical text is made inside the write, on the store's thread (``STORE_VALUE_INVALID``
        arrives through the future, as every refusal of the write does)."""

        def work(conn: sqlite3.Connection) -> None:
            text = canonical_or_store_error(response)
            # An in-flight key (nearly every call) is completed by one statement; only when it
            # changed nothing is the row read, to tell a missing key and a finished one apart
            # (issue 34; the same answers as reading first, under the group's write lock).
            if conn.execute(
                "UPDATE idempotency SET state = 'DONE', response = ?, completed_at = ?"
                " WHERE tenant = ? AND principal = ? AND key = ? AND state = 'IN_PROGRESS'",
                (text, now, tenant, principal, key),
            ).rowcount:
                return
            row = conn.execute(
                "SELECT state, response FROM idempotency"
                " WHERE tenant = ? AND principal = ? AND key = ?",
                (tenant, principal, key),
            ).fetchone()
            if completed_already(row, text):
                return
            raise AssertionError("an in-flight key the update did not find")  # pragma: no cover

        return self._write(work)

    async def idempotency_settle(
        self, *, tenant: str, principal: str, key: str, response: dict[str, Any], now: float
    ) -> bool:
        """Record what reconciliation learned about a key whose outcome was unknown.

        An in-flight key gets ``response`` as its final answer; a finished key is replaced only
        when its recorded answer was UNKNOWN_AFTER_DISPATCH (nothing else is ever rewritten).
        True when the record changed.
        """
        text = canonical_or_store_error(response)

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

    async def idempotency_settle_attempt(
        self, attempt_id: str, *, response: dict[str, Any], now: float
    ) -> int:
        """As :meth:`UseStore.idempotency_settle_attempt`: every key IN_PROGRESS that names
        ``attempt_id`` takes ``response``."""
        text = canonical_or_store_error(response)

        def work(conn: sqlite3.Connection) -> int:
            return conn.execute(
                "UPDATE idempotency SET state = 'DONE', response = ?, completed_at = ?"
                " WHERE attempt_id = ? AND state = 'IN_PROGRESS'",
                (text, now, attempt_id),
            ).rowcount

        settled: int = await self._write(work)
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
        binding_digest = digest_or_store_error(binding)
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
        if not token_matches(record, self._token):
            return False

        def work(conn: sqlite3.Connection) -> bool:
            row = conn.execute(CONSUMPTION_ROW, (record.namespace, record.key)).fetchone()
            return consumption_matches(row, record)

        return await self._run(work)

    def _token(
        self, namespace: str, key: str, nonce: str, consumed_at: float, binding_digest: str
    ) -> str:
        return consumption_token(self._secret, namespace, key, nonce, consumed_at, binding_digest)

    # -- approvals -----------------------------------------------------------------------------

    async def approval_create(self, request: ApprovalRequest) -> None:
        """Store a new PENDING request; its ``intent_hash`` must be the hash of its intent."""
        args = approval_insert_args(request)

        def work(conn: sqlite3.Connection) -> None:
            cur = conn.execute(APPROVAL_INSERT, args)
            if cur.rowcount != 1:
                raise ApprovalError("the request id is taken", code=Code.APPROVAL_EXISTS)

        await self._write(work)

    async def approval_get(self, request_id: str) -> ApprovalRecord | None:
        def work(conn: sqlite3.Connection) -> ApprovalRecord | None:
            row = conn.execute(
                f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE request_id = ?",  # noqa: S608
                (request_id,),
            ).fetchone()
            return None if row is None else approval_from_row(row)

        return await self._run(work)

    async def approval_list(
        self, *, state: ApprovalState, now: float, approver: str | None = None
    ) -> list[ApprovalRecord]:
        """Requests in ``state`` as of ``now`` (PENDING excludes expired ones, EXPIRED lists
        them), oldest first; with ``approver``, only those that principal may decide."""

        def work(conn: sqlite3.Connection) -> list[ApprovalRecord]:
            args: tuple[object, ...]
            where, args = approval_listing(state, now, "?")
            rows = conn.execute(
                f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE {where}"  # noqa: S608
                " ORDER BY created_at, request_id",
                args,
            ).fetchall()
            return visible_to([approval_from_row(row) for row in rows], approver)

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
            updated, args = decided(record, new_state, approver, reason, now, verification)
            conn.execute(APPROVAL_DECIDE, args)
            return updated

        return await self._write(work)

    @staticmethod
    def _approval_row(conn: sqlite3.Connection, request_id: str) -> ApprovalRecord:
        row = conn.execute(
            f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE request_id = ?",  # noqa: S608
            (request_id,),
        ).fetchone()
        if row is None:
            raise ApprovalError("no such approval request", code=Code.APPROVAL_NOT_FOUND)
        return approval_from_row(row)

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
            inserted = conn.execute(PASSKEY_INSERT, passkey_insert_args(passkey)).rowcount
            if inserted != 1:
                raise StoreError(
                    "this passkey is already registered", code=Code.WEBAUTHN_REGISTRATION_INVALID
                )

        await self._write(work)

    async def passkey_list(self, principal: str) -> list[PasskeyRecord]:
        def work(conn: sqlite3.Connection) -> list[PasskeyRecord]:
            rows = conn.execute(
                f"SELECT {PASSKEY_COLUMNS} FROM passkeys WHERE principal = ?"  # noqa: S608
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
            full = ceiling_verdict(count, total, amount_minor, count_limit, sum_limit)
            if full is not None:
                return full, None
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


def _key_kept(
    conn: sqlite3.Connection, tenant: str, principal: str, key: str, payload_digest: str
) -> IdempotencyState:
    """What a key already kept means to a request that brings ``payload_digest``: CONFLICT for
    another payload, IN_PROGRESS while in flight, else REPLAY of its answer."""
    stored_digest, state, response = conn.execute(
        "SELECT payload_digest, state, response FROM idempotency"
        " WHERE tenant = ? AND principal = ? AND key = ?",
        (tenant, principal, key),
    ).fetchone()
    if not hmac.compare_digest(str(stored_digest), payload_digest):
        return IdempotencyState(IdempotencyKind.CONFLICT)
    if state == "IN_PROGRESS":
        return IdempotencyState(IdempotencyKind.IN_PROGRESS)
    return IdempotencyState(IdempotencyKind.REPLAY, response=load_object(response))


def _window_usage(conn: sqlite3.Connection, horizon: float) -> tuple[int, int]:
    conn.execute("DELETE FROM ceiling_window WHERE at <= ?", (horizon,))
    row = conn.execute(
        "SELECT count(*), coalesce(sum(amount_minor), 0) FROM ceiling_window"
    ).fetchone()
    return int(row[0]), int(row[1])
