"""The shared store on PostgreSQL: what every replica must agree on, in one database.

Role: with ``EXECUTOR_STORE_URL`` (``postgresql://...``), every replica of an executor keeps here
the state that SQLite keeps per process otherwise: the use store (:class:`PostgresUseStore`
implements :class:`~agentsafe.executor.state.protocol.UseStore`: grant claims, idempotency,
consumptions, approvals), the host-ceiling window (:class:`PostgresWindow`) and the attempt
journal's open-attempt state with each attempt's owner and lease (:class:`PostgresAttempts`).
Connections come from one psycopg 3 async pool per process.

Every transaction runs at ``SERIALIZABLE`` and is re-run from the start when the database answers
a serialization failure (``40001``) or a deadlock (``40P01``), up to :data:`MAX_RETRIES` times, so
the same SQL is correct on PostgreSQL-compatible distributed engines. A step that is one
statement runs as that statement alone (:meth:`PostgresStore.statement`, autocommit): it is its
own transaction, at ``SERIALIZABLE`` too (every pooled session sets
``default_transaction_isolation``), and committed (durably, with ``synchronous_commit``) when its
answer arrives, without the ``BEGIN`` and ``COMMIT`` round trips. An ALLOW's durable steps are
four statements in the common case: ``idempotency_begin``, the mirror's ``opened``,
``claim_grant`` (which also records the mirror's GRANT_CLAIMED), and the mirror's close, which
also completes the key its request holds with the answer the caller is given
(``PostgresAttempts.close_answering``; ``idempotency_complete`` then sends nothing). A key found
already there, or one that cannot take its answer, goes on to the full transaction below. Which
guarantee rests on which statement:

===============================  ==================================================================
guarantee                        statement
===============================  ==================================================================
a grant is claimed once          ``INSERT INTO grant_claims ... ON CONFLICT DO NOTHING``: the
                                 primary key admits one row; ``rowcount`` says who won
a grant is claimed only by the   ``WITH fenced AS (UPDATE attempts SET grant_claimed = true ...
attempt's current owner, under   WHERE attempt_id AND owner AND epoch AND state <> 'CLOSED'
a live lease (issue 29)          AND NOT grant_claimed AND lease_until > now RETURNING ...)
                                 INSERT INTO grant_claims ... SELECT ... FROM fenced``: one
                                 statement (the row reached by its primary key); no
                                 claim, and no GRANT_CLAIMED, once the lease lapsed or the
                                 attempt was taken over (``ATTEMPT_FENCED``)
every takeover fences the old    ``UPDATE attempts SET owner, lease_until, epoch = epoch + 1`` in
owner off                        the transaction that locked the row
one request per idempotency key  ``INSERT INTO idempotency ... ON CONFLICT DO NOTHING`` (alone);
                                 the loser runs it again in a transaction that reads the winner's
                                 row (IN_PROGRESS, CONFLICT or REPLAY)
a key never stays held by a      ``SELECT ... FOR UPDATE`` on the key's row; it is taken over
request that died before its     (``UPDATE ... SET holder``) only when its lease lapsed with no
attempt opened                   attempt, or its attempt is CLOSED without a claimed grant
an attempt opens only under the  ``WITH fenced AS (UPDATE idempotency SET opened_attempt ... WHERE
key's current holder             holder = <its holder> RETURNING 1) INSERT INTO attempts ... SELECT
                                 ... FROM fenced``: one statement; the attempt's row exists only
                                 if the key's row was its holder's (or nothing opens)
the first final answer stays     ``UPDATE ... WHERE state <> 'DONE' AND holder`` is this request's
                                 (or none), alone or in the attempt's close (``WITH closed AS
                                 (UPDATE attempts ...) UPDATE idempotency ... AND opened_attempt``);
                                 when no row matches, ``SELECT ... FOR UPDATE`` on the key's row
                                 says why, or takes the answer, then ``UPDATE``
a consumption happens once       ``INSERT INTO consumptions ... ON CONFLICT DO NOTHING``
an approval is decided once      ``SELECT ... FOR UPDATE`` on the request, then ``UPDATE ... WHERE
                                 state = 'PENDING'``
the window never overflows       ``SELECT ... FROM ceiling_lock ... FOR UPDATE`` (one row per
                                 window) serialises reservations; count, sum and ``INSERT`` follow
an attempt has one reconciler    ``SELECT ... FOR UPDATE SKIP LOCKED`` of a lapsed attempt and the
                                 ``UPDATE`` of its owner and lease in the same transaction
===============================  ==================================================================

Idempotency keys and the database dropping: a request's key is IN_PROGRESS under its holder (a
random token, kept in a context variable of the request's task from ``idempotency_begin`` on,
and copied into the attempt's task, which the pipeline starts after the begin, for its
``opened``) and a lease of ``EXECUTOR_ATTEMPT_LEASE_SECONDS``. When
the database drops after the key was recorded and before the attempt opened, the holder cannot
free the key; a later request with the key gets 409 IDEMPOTENCY_IN_PROGRESS until the lease
lapses, then takes it over and runs (nothing had been sent: the attempt never opened, or closed
without claiming its grant). A key whose attempt opened belongs to that attempt: its answer comes
from it, or from reconciliation when it is unknown; it is never taken over. A holder whose key
was taken over cannot open its attempt or record its answer (``IDEMPOTENCY_TAKEN_OVER``). A key
whose attempt claimed its grant and closed, but whose answer was never recorded (the database
dropped in between), has its attempt opened again for a lease keeper to reconcile when a retry
finds it more than a lease later; reconciliation then settles the key.

Connections, the transaction discipline (SERIALIZABLE, re-run on ``40001``/``40P01``, a
statement alone never re-run once sent) and failover live in ``state/pgconn.py``; the attempts and
their mirror in ``state/pgattempts.py``.

Callers: ``state/backend.py`` (opens one :class:`PostgresStore` when ``EXECUTOR_STORE_URL`` is
set and hands its faces to the authority, the pipeline, the ceilings and the journal).
"""

from __future__ import annotations

import dataclasses
import enum
import hmac
import json
import secrets
from typing import Any

from psycopg.rows import TupleRow

from ..clock import format_ms
from ..codes import Code
from ..errors import StoreError
from ..principals import Verification
from ..windows import ceiling_verdict
from .pgattempts import PostgresAttempts
from .pgconn import HELD_KEY, NOW, STILL_OPEN, Conn, HeldKey, PostgresPool, Scope
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
    decision_state,
    settles,
)
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
    pg,
    token_matches,
    visible_to,
)

__all__ = ["PostgresStore", "PostgresUseStore", "PostgresWindow"]


class PostgresStore(PostgresPool):
    """The shared store: one pool (``state/pgconn.py``) and its three faces, the use store, the
    host-ceiling window and the attempts. Construct with :meth:`open`."""

    def __init__(
        self,
        pool: Any,
        secret: bytes,
        timeout: float,
        *,
        url: str,
        lease_seconds: float = 30.0,
    ) -> None:
        super().__init__(pool, secret, timeout, url=url, lease_seconds=lease_seconds)
        self.use_store = PostgresUseStore(self)
        self.window = PostgresWindow(self)
        self.attempts = PostgresAttempts(self)


class PostgresUseStore:
    """:class:`UseStore` on the shared database (see the module docstring for the statements)."""

    def __init__(self, store: PostgresPool) -> None:
        self._store = store

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
        """As :meth:`UseStore.claim_grant`. With ``fence``, one statement: the attempt's row is
        updated (GRANT_CLAIMED, its lease extended) only where it is still ``fence.owner``'s at
        ``fence.epoch``, open, unclaimed and under a live lease on the database's clock, and the
        ``grant_claims`` row is inserted only from that update's row. A fenced-out claim claims
        nothing and raises ``StoreError(ATTEMPT_FENCED)``."""
        if fence is None:
            rowcount, _ = await self._store.statement(
                "INSERT INTO grant_claims (grant_id, binding_digest, expires_at, claimed_at)"
                " VALUES (%s, %s, %s, %s) ON CONFLICT (grant_id) DO NOTHING",
                (grant_id, binding_digest, expires_at, now),
            )
            return rowcount == 1
        if payload_digest is None:
            raise ValueError("a fenced claim records the payload digest in the attempt's row")
        sent_at = fence.monotonic()
        _, row = await self._store.statement(
            "WITH fenced AS (UPDATE attempts SET grant_claimed = true, grant_id = %s,"  # noqa: S608
            f" grant_expires_at = %s, payload_digest = %s, lease_until = {NOW} + %s"
            f" WHERE attempt_id = %s AND owner = %s AND epoch = %s AND {STILL_OPEN}"
            f" AND NOT grant_claimed AND lease_until > {NOW} RETURNING attempt_id),"
            " claimed AS (INSERT INTO grant_claims (grant_id, binding_digest, expires_at,"
            " claimed_at) SELECT %s, %s, %s, %s FROM fenced ON CONFLICT (grant_id) DO NOTHING"
            " RETURNING grant_id)"
            " SELECT (SELECT count(*) FROM fenced), (SELECT count(*) FROM claimed)",
            (
                grant_id,
                format_ms(expires_at),
                payload_digest,
                fence.lease_seconds,
                fence.attempt_id,
                fence.owner,
                fence.epoch,
                grant_id,
                binding_digest,
                expires_at,
                now,
            ),
        )
        if row is None or int(row[0]) != 1:
            raise StoreError(
                "the attempt is no longer this replica's (its lease lapsed or it was taken"
                " over): nothing was claimed",
                code=Code.ATTEMPT_FENCED,
            )
        fence.renewed(sent_at)
        if int(row[1]) != 1:
            return False  # claimed before (the attempt's row now says claimed: asked, never run)
        fence.claimed = True
        return True

    async def grant_claimed(self, grant_id: str) -> bool:
        _, row = await self._store.statement(
            "SELECT 1 FROM grant_claims WHERE grant_id = %s", (grant_id,)
        )
        return row is not None

    async def idempotency_orphans(self, *, owner: str, before: float) -> list[OrphanKey]:
        async def work(conn: Conn) -> list[OrphanKey]:
            cur = await conn.execute(
                "SELECT tenant, principal, key, attempt_id, created_at FROM idempotency"
                " WHERE owner = %s AND state = 'IN_PROGRESS' AND created_at < %s"
                " ORDER BY created_at",
                (owner, before),
            )
            rows = await cur.fetchall()
            return [OrphanKey(r[0], r[1], r[2], r[3], float(r[4])) for r in rows]

        return await self._store.transaction(work)

    async def idempotency_for_attempt(self, attempt_id: str) -> OrphanKey | None:
        async def work(conn: Conn) -> OrphanKey | None:
            cur = await conn.execute(
                "SELECT tenant, principal, key, attempt_id, created_at FROM idempotency"
                " WHERE attempt_id = %s",
                (attempt_id,),
            )
            r = await cur.fetchone()
            return None if r is None else OrphanKey(r[0], r[1], r[2], r[3], float(r[4]))

        return await self._store.transaction(work)

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
        """As :meth:`SQLiteUseStore.idempotency_begin`; a key IN_PROGRESS whose holder can no
        longer have sent anything (see the module docstring) is taken over: NEW."""
        holder = secrets.token_hex(16)
        lease = self._store.lease_seconds
        HELD_KEY.set(None)
        insert = (
            "INSERT INTO idempotency (tenant, principal, key, payload_digest, state,"  # noqa: S608
            " created_at, holder, lease_until, attempt_id, owner)"
            f" VALUES (%s, %s, %s, %s, 'IN_PROGRESS', %s, %s, {NOW} + %s, %s, %s)"
            " ON CONFLICT (tenant, principal, key) DO NOTHING"
        )
        values = (tenant, principal, key, payload_digest, now, holder, lease, attempt_id, owner)

        async def work(conn: Conn) -> IdempotencyState:
            cur = await conn.execute(insert, values)
            if cur.rowcount == 1:
                return IdempotencyState(IdempotencyKind.NEW)
            # Read without a lock (a key in flight is the common case, many retries at once);
            # only a key that looks stale is read again under its row lock and acted on.
            for locked in (False, True):
                cur = await conn.execute(
                    f"SELECT payload_digest, state, response, lease_until < {NOW}, opened_attempt"  # noqa: S608
                    " FROM idempotency WHERE tenant = %s AND principal = %s AND key = %s"
                    + (" FOR UPDATE" if locked else ""),
                    (tenant, principal, key),
                )
                row = await cur.fetchone()
                if row is None:  # released between the two statements: the caller may try again
                    return IdempotencyState(IdempotencyKind.IN_PROGRESS)
                stored_digest, state, response, lapsed, opened = row
                if not hmac.compare_digest(str(stored_digest), payload_digest):
                    return IdempotencyState(IdempotencyKind.CONFLICT)
                if state != "IN_PROGRESS":
                    return IdempotencyState(IdempotencyKind.REPLAY, response=load_object(response))
                stale = await _stale_key(
                    conn, lapsed=bool(lapsed), attempt_id=opened, lease=lease, lock=locked
                )
                if stale is None:
                    return IdempotencyState(IdempotencyKind.IN_PROGRESS)
            if stale is _Stale.UNANSWERED:
                await _reopen_unanswered(conn, str(opened))
                return IdempotencyState(IdempotencyKind.IN_PROGRESS)
            await conn.execute(
                f"UPDATE idempotency SET holder = %s, lease_until = {NOW} + %s,"  # noqa: S608
                " opened_attempt = NULL, created_at = %s, attempt_id = %s, owner = %s"
                " WHERE tenant = %s AND principal = %s AND key = %s",
                (holder, lease, now, attempt_id, owner, tenant, principal, key),
            )
            return IdempotencyState(IdempotencyKind.NEW)

        # A new key (the common case) is the INSERT alone, its own transaction; a key already
        # there is read and, when stale, taken over in one transaction that starts again from
        # the INSERT (the key may have been freed in between).
        inserted, _ = await self._store.statement(insert, values)
        if inserted == 1:
            state = IdempotencyState(IdempotencyKind.NEW)
        else:
            state = await self._store.transaction(work)
        if state.kind is IdempotencyKind.NEW:
            HELD_KEY.set(HeldKey((tenant, principal, key), holder))
        return state

    async def idempotency_record(
        self,
        *,
        tenant: str,
        principal: str,
        key: str,
        payload_digest: str,
        response: dict[str, Any],
        now: float,
    ) -> IdempotencyState:
        """As :meth:`SQLiteUseStore.idempotency_record`. A new key is one INSERT of its final
        answer, its own transaction, with no holder (nothing runs under it). A key already
        there is the rare case: it goes through :meth:`idempotency_begin`, which may take a
        stale key over (NEW), and such a key then takes the answer through
        :meth:`idempotency_complete` under the holder the begin set."""
        text = canonical_or_store_error(response)
        HELD_KEY.set(None)
        inserted, _ = await self._store.statement(
            "INSERT INTO idempotency (tenant, principal, key, payload_digest, state,"
            " created_at, response, completed_at) VALUES (%s, %s, %s, %s, 'DONE', %s, %s, %s)"
            " ON CONFLICT (tenant, principal, key) DO NOTHING",
            (tenant, principal, key, payload_digest, now, text, now),
        )
        if inserted == 1:
            return IdempotencyState(IdempotencyKind.NEW)
        scope = {"tenant": tenant, "principal": principal, "key": key}
        state = await self.idempotency_begin(**scope, payload_digest=payload_digest, now=now)
        if state.kind is IdempotencyKind.NEW:
            await self.idempotency_complete(**scope, response=response, now=now)
        return state

    async def idempotency_complete(
        self, *, tenant: str, principal: str, key: str, response: dict[str, Any], now: float
    ) -> None:
        """As :meth:`SQLiteUseStore.idempotency_complete`: the first final answer stays.

        A key that already took this response with its attempt's close (the mirror's one
        statement, :class:`~agentsafe.executor.state.pgconn.HeldKey`) sends nothing more."""
        scope = (tenant, principal, key)
        begun = _begun(scope)
        if begun is not None and begun.recorded is not None and begun.recorded == response:
            _let_go(scope)
            return
        text = canonical_or_store_error(response)
        held = begun.holder if begun is not None else None

        async def work(conn: Conn) -> None:
            # Read again under the row lock: say why the key cannot take this answer, or take it
            # (the key changed since the statement below found it would not).
            row = await _locked_key(conn, tenant, principal, key)
            if completed_already(row, text):
                return
            assert row is not None  # completed_already refused a missing record
            if row[2] is not None and held is not None and row[2] != held:
                raise StoreError(
                    "a later request took this key over", code=Code.IDEMPOTENCY_TAKEN_OVER
                )
            await conn.execute(
                "UPDATE idempotency SET state = 'DONE', response = %s, completed_at = %s"
                " WHERE tenant = %s AND principal = %s AND key = %s",
                (text, now, tenant, principal, key),
            )

        try:
            # The common case, a key IN_PROGRESS under this request's holder (or a key with no
            # holder to fence), is one UPDATE, its own transaction; any other key is read under
            # its row lock and answered for in one transaction.
            done, _ = await self._store.statement(
                "UPDATE idempotency SET state = 'DONE', response = %s, completed_at = %s"
                " WHERE tenant = %s AND principal = %s AND key = %s AND state <> 'DONE'"
                " AND (holder IS NULL OR %s::text IS NULL OR holder = %s)",
                (text, now, tenant, principal, key, held, held),
            )
            if done != 1:
                await self._store.transaction(work)
        finally:
            _let_go((tenant, principal, key))

    async def idempotency_settle(
        self, *, tenant: str, principal: str, key: str, response: dict[str, Any], now: float
    ) -> bool:
        text = canonical_or_store_error(response)

        async def work(conn: Conn) -> bool:
            row = await _locked_key(conn, tenant, principal, key)
            if row is None:
                return False
            if row[0] == "DONE" and not settles(json.loads(row[1]) if row[1] else {}):
                return False
            await conn.execute(
                "UPDATE idempotency SET state = 'DONE', response = %s, completed_at = %s"
                " WHERE tenant = %s AND principal = %s AND key = %s",
                (text, now, tenant, principal, key),
            )
            return True

        return await self._store.transaction(work)

    async def idempotency_settle_attempt(
        self, attempt_id: str, *, response: dict[str, Any], now: float
    ) -> int:
        """Give the reconciled answer to every key IN_PROGRESS whose attempt is ``attempt_id``
        (an approval's key, ``approval:<request id>``, is not the one its intent names); how many
        were settled."""
        text = canonical_or_store_error(response)

        async def work(conn: Conn) -> int:
            cur = await conn.execute(
                "UPDATE idempotency SET state = 'DONE', response = %s, completed_at = %s"
                " WHERE opened_attempt = %s AND state = 'IN_PROGRESS'",
                (text, now, attempt_id),
            )
            return cur.rowcount

        return await self._store.transaction(work)

    async def idempotency_release(
        self, *, tenant: str, principal: str, key: str, owner: str | None = None
    ) -> None:
        """Free a key IN_PROGRESS: its own holder's (the request that began it, in this task),
        or, from reconciliation, one whose holder can no longer have sent anything, or one
        whose recorded ``owner`` is the journal start-up is settling (its previous process is
        gone: one process per journal directory); a key a later request holds is left to it."""
        held = _holder_of((tenant, principal, key))
        lease = self._store.lease_seconds

        async def work(conn: Conn) -> None:
            cur = await conn.execute(
                f"SELECT holder, lease_until < {NOW}, opened_attempt, owner"  # noqa: S608
                " FROM idempotency"
                " WHERE tenant = %s AND principal = %s AND key = %s AND state = 'IN_PROGRESS'"
                " FOR UPDATE",
                (tenant, principal, key),
            )
            row = await cur.fetchone()
            if row is None:
                return
            holder, lapsed, attempt_id, recorded_owner = row
            if not (
                holder is None
                or holder == held
                or (owner is not None and recorded_owner == owner)
                or await _stale_key(
                    conn, lapsed=bool(lapsed), attempt_id=attempt_id, lease=lease, lock=True
                )
                is _Stale.ABANDONED
            ):
                return
            await conn.execute(
                "DELETE FROM idempotency WHERE tenant = %s AND principal = %s AND key = %s"
                " AND state = 'IN_PROGRESS'",
                (tenant, principal, key),
            )

        try:
            await self._store.transaction(work)
        finally:
            _let_go((tenant, principal, key))

    async def consume(
        self, namespace: str, key: str, *, binding: dict[str, Any], now: float
    ) -> ConsumptionRecord | None:
        binding_digest = digest_or_store_error(binding)
        nonce = secrets.token_hex(16)

        async def work(conn: Conn) -> bool:
            cur = await conn.execute(
                "INSERT INTO consumptions (namespace, key, nonce, consumed_at, binding_digest)"
                " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (namespace, key) DO NOTHING",
                (namespace, key, nonce, now, binding_digest),
            )
            return cur.rowcount == 1

        if not await self._store.transaction(work):
            return None
        token = self._store.token(namespace, key, nonce, now, binding_digest)
        return ConsumptionRecord(namespace, key, nonce, now, binding_digest, token)

    async def verify_consumption(self, record: ConsumptionRecord) -> bool:
        if not token_matches(record, self._store.token):
            return False

        async def work(conn: Conn) -> bool:
            cur = await conn.execute(pg(CONSUMPTION_ROW), (record.namespace, record.key))
            return consumption_matches(await cur.fetchone(), record)

        return await self._store.transaction(work)

    async def approval_create(self, request: ApprovalRequest) -> None:
        args = approval_insert_args(request)

        async def work(conn: Conn) -> None:
            cur = await conn.execute(pg(APPROVAL_INSERT), args)
            if cur.rowcount != 1:
                raise ApprovalError("the request id is taken", code=Code.APPROVAL_EXISTS)

        await self._store.transaction(work)

    async def approval_get(self, request_id: str) -> ApprovalRecord | None:
        async def work(conn: Conn) -> ApprovalRecord | None:
            cur = await conn.execute(
                f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE request_id = %s",  # noqa: S608
                (request_id,),
            )
            row = await cur.fetchone()
            return None if row is None else approval_from_row(tuple(row))

        return await self._store.transaction(work)

    async def approval_list(
        self, *, state: ApprovalState, now: float, approver: str | None = None
    ) -> list[ApprovalRecord]:
        async def work(conn: Conn) -> list[ApprovalRecord]:
            where, args = approval_listing(state, now, "%s")
            cur = await conn.execute(
                f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE {where}"  # noqa: S608
                " ORDER BY created_at, request_id",
                args,
            )
            return [approval_from_row(tuple(row)) for row in await cur.fetchall()]

        return visible_to(await self._store.transaction(work), approver)

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
        new_state = decision_state(decision, reason)

        async def work(conn: Conn) -> ApprovalRecord:
            record = await _locked_approval(conn, request_id)
            check_decidable(record, approver=approver, now=now)
            updated, args = decided(record, new_state, approver, reason, now, verification)
            await conn.execute(pg(APPROVAL_DECIDE), args)
            return updated

        return await self._store.transaction(work)

    async def approval_cancel(
        self, request_id: str, *, by: str, reason: str, now: float
    ) -> ApprovalRecord:
        async def work(conn: Conn) -> ApprovalRecord:
            record = await _locked_approval(conn, request_id)
            check_cancellable(record, reason=reason, now=now)
            await conn.execute(
                "UPDATE approvals SET cancelled_by = %s, cancel_reason = %s, cancelled_at = %s"
                " WHERE request_id = %s AND state = 'PENDING' AND cancelled_at IS NULL",
                (by, reason, now, request_id),
            )
            return dataclasses.replace(
                record, cancelled_by=by, cancel_reason=reason, cancelled_at=now
            )

        return await self._store.transaction(work)

    # -- passkeys and enrolment tokens (issue 21) ------------------------------------------------

    async def enrolment_issue(self, token: EnrolmentToken) -> None:
        async def work(conn: Conn) -> None:
            await conn.execute(
                "INSERT INTO enrolment_tokens (token_digest, principal, issued_by, issued_at,"
                " expires_at) VALUES (%s, %s, %s, %s, %s)",
                (
                    token.token_digest,
                    token.principal,
                    token.issued_by,
                    token.issued_at,
                    token.expires_at,
                ),
            )

        await self._store.transaction(work)

    async def enrolment_get(self, token_digest: str, *, now: float) -> EnrolmentToken | None:
        async def work(conn: Conn) -> EnrolmentToken | None:
            cur = await conn.execute(
                "SELECT token_digest, principal, issued_by, issued_at, expires_at"
                " FROM enrolment_tokens"
                " WHERE token_digest = %s AND used_at IS NULL AND expires_at > %s",
                (token_digest, now),
            )
            row = await cur.fetchone()
            return None if row is None else EnrolmentToken(*tuple(row))

        return await self._store.transaction(work)

    async def passkey_enrol(self, token_digest: str, passkey: PasskeyRecord, *, now: float) -> None:
        async def work(conn: Conn) -> None:
            used = await conn.execute(
                "UPDATE enrolment_tokens SET used_at = %s WHERE token_digest = %s"
                " AND principal = %s AND used_at IS NULL AND expires_at > %s",
                (now, token_digest, passkey.principal, now),
            )
            if used.rowcount != 1:
                raise StoreError(
                    "the enrolment token is not usable", code=Code.ENROLMENT_TOKEN_INVALID
                )
            inserted = await conn.execute(pg(PASSKEY_INSERT), passkey_insert_args(passkey))
            if inserted.rowcount != 1:
                raise StoreError(
                    "this passkey is already registered", code=Code.WEBAUTHN_REGISTRATION_INVALID
                )

        await self._store.transaction(work)

    async def passkey_list(self, principal: str) -> list[PasskeyRecord]:
        async def work(conn: Conn) -> list[PasskeyRecord]:
            cur = await conn.execute(
                f"SELECT {PASSKEY_COLUMNS} FROM passkeys WHERE principal = %s"  # noqa: S608
                " ORDER BY created_at, credential_id",
                (principal,),
            )
            return [passkey_from_row(tuple(row)) for row in await cur.fetchall()]

        return await self._store.transaction(work)

    async def passkey_used(
        self, principal: str, credential_id: str, *, sign_count: int, now: float
    ) -> None:
        async def work(conn: Conn) -> None:
            cur = await conn.execute(
                "SELECT sign_count FROM passkeys WHERE credential_id = %s AND principal = %s"
                " FOR UPDATE",
                (credential_id, principal),
            )
            row = await cur.fetchone()
            if row is None:
                raise StoreError("no such passkey", code=Code.WEBAUTHN_ASSERTION_INVALID)
            check_sign_count(int(row[0]), sign_count)
            await conn.execute(
                "UPDATE passkeys SET sign_count = %s, last_used_at = %s WHERE credential_id = %s",
                (sign_count, now, credential_id),
            )

        await self._store.transaction(work)

    async def purge(self, now: float) -> int:
        cutoff = now - RETENTION_SECONDS

        async def work(conn: Conn) -> int:
            deleted = 0
            for statement in (
                "DELETE FROM idempotency WHERE state = 'DONE' AND completed_at < %s",
                "DELETE FROM idempotency WHERE state = 'IN_PROGRESS' AND owner = ''"
                " AND created_at < %s",
                "DELETE FROM grant_claims WHERE expires_at < %s",
                "DELETE FROM approvals WHERE expires_at < %s",
                "DELETE FROM enrolment_tokens WHERE expires_at < %s",
                "DELETE FROM attempts WHERE state = 'CLOSED' AND closed_at < %s",
            ):
                cur = await conn.execute(statement, (cutoff,))
                deleted += cur.rowcount
            return deleted

        return await self._store.transaction(work)

    async def close(self) -> None:
        await self._store.close()


async def _locked_approval(conn: Conn, request_id: str) -> ApprovalRecord:
    cur = await conn.execute(
        f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE request_id = %s"  # noqa: S608
        " FOR UPDATE",
        (request_id,),
    )
    row = await cur.fetchone()
    if row is None:
        raise ApprovalError("no such approval request", code=Code.APPROVAL_NOT_FOUND)
    return approval_from_row(tuple(row))


async def _locked_key(conn: Conn, tenant: str, principal: str, key: str) -> TupleRow | None:
    cur = await conn.execute(
        "SELECT state, response, holder FROM idempotency"
        " WHERE tenant = %s AND principal = %s AND key = %s FOR UPDATE",
        (tenant, principal, key),
    )
    return await cur.fetchone()


def _begun(scope: Scope) -> HeldKey | None:
    """This task's hold on ``scope``, if this task's request began it."""
    held = HELD_KEY.get()
    return held if held is not None and held.scope == scope else None


def _holder_of(scope: Scope) -> str | None:
    """This task's holder token for ``scope``, if this task's request began it."""
    held = _begun(scope)
    return held.holder if held is not None else None


def _let_go(scope: Scope) -> None:
    if _begun(scope) is not None:
        HELD_KEY.set(None)


class _Stale(enum.Enum):
    ABANDONED = "ABANDONED"  # nothing can have been sent: free, or take over
    UNANSWERED = "UNANSWERED"  # sent and closed, but the key never got its answer


async def _stale_key(
    conn: Conn, *, lapsed: bool, attempt_id: str | None, lease: float, lock: bool
) -> _Stale | None:
    """What a key IN_PROGRESS that its holder may have left behind is, or ``None`` for a key
    in flight:

    - ABANDONED: it has no attempt and its holder's lease lapsed (the holder died, or the
      database dropped before the attempt opened), or its attempt is CLOSED without a claimed
      grant. Nothing was sent; someone other than the holder may free it or take it over.
    - UNANSWERED: its attempt claimed its grant and closed more than a lease ago, and the key
      never got its answer (the database dropped between the two).

    A key whose attempt is open, or no longer known, is neither. ``lock`` reads the attempt
    ``FOR UPDATE`` (before acting on the answer)."""
    if attempt_id is None:
        return _Stale.ABANDONED if lapsed else None
    cur = await conn.execute(
        f"SELECT state, grant_claimed, closed_at < {NOW} - %s FROM attempts"  # noqa: S608
        " WHERE attempt_id = %s" + (" FOR UPDATE" if lock else ""),
        (lease, attempt_id),
    )
    row = await cur.fetchone()
    if row is None or row[0] != "CLOSED":
        return None
    if not row[1]:
        return _Stale.ABANDONED
    return _Stale.UNANSWERED if row[2] else None


async def _reopen_unanswered(conn: Conn, attempt_id: str) -> None:
    """Open an UNANSWERED key's attempt again with its lease lapsed, so a lease keeper takes it
    and reconciles it read-only, and that settles the key."""
    await conn.execute(
        f"UPDATE attempts SET state = 'OPEN', lease_until = {NOW} - 1,"  # noqa: S608
        " last_status = 'ANSWER_NOT_RECORDED', closed_at = NULL, epoch = epoch + 1"
        " WHERE attempt_id = %s AND state = 'CLOSED' AND grant_claimed",
        (attempt_id,),
    )


class PostgresWindow:
    """The host-ceiling window shared by every replica, on the database's clock.

    Implements ``lifecycle/ceilings.py``'s ``CeilingWindow``: every reservation locks the one
    ``ceiling_lock`` row, so N allowed means N in total, never N per replica.
    """

    def __init__(self, store: PostgresPool) -> None:
        self._store = store

    async def usage(self, window_seconds: float) -> tuple[int, int]:
        async def work(conn: Conn) -> tuple[int, int]:
            return await _window_usage(conn, window_seconds)

        return await self._store.transaction(work)

    async def reserve(
        self,
        *,
        window_seconds: float,
        amount_minor: int,
        count_limit: int | None,
        sum_limit: int | None,
    ) -> tuple[str | None, object]:
        """``(None, token)`` with a place taken, or ``("COUNT" | "SUM", None)``."""

        async def work(conn: Conn) -> tuple[str | None, object]:
            await conn.execute("SELECT name FROM ceiling_lock WHERE name = 'window' FOR UPDATE")
            count, total = await _window_usage(conn, window_seconds)
            full = ceiling_verdict(count, total, amount_minor, count_limit, sum_limit)
            if full is not None:
                return full, None
            cur = await conn.execute(
                f"INSERT INTO ceiling_window (at, amount_minor) VALUES ({NOW}, %s)"  # noqa: S608
                " RETURNING id",
                (amount_minor,),
            )
            row = await cur.fetchone()
            assert row is not None
            return None, int(row[0])

        return await self._store.transaction(work)

    async def release(self, token: object) -> None:
        async def work(conn: Conn) -> None:
            await conn.execute("DELETE FROM ceiling_window WHERE id = %s", (token,))

        await self._store.transaction(work)


async def _window_usage(conn: Conn, window_seconds: float) -> tuple[int, int]:
    await conn.execute(
        f"DELETE FROM ceiling_window WHERE at <= {NOW} - %s",  # noqa: S608
        (window_seconds,),
    )
    cur = await conn.execute("SELECT count(*), coalesce(sum(amount_minor), 0) FROM ceiling_window")
    row = await cur.fetchone()
    assert row is not None
    return int(row[0]), int(row[1])
