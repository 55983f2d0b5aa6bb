"""The shared store on PostgreSQL: what every replica must agree on, in one database.

Role: with ``EXECUTOR_STORE_URL`` (``postgresql://...``), every replica of an executor keeps here
the state that SQLite keeps per process otherwise: the use store (:class:`PostgresUseStore`
implements :class:`~agentsafe.executor.state.usestore.UseStore`: grant claims, idempotency,
consumptions, approvals), the host-ceiling window (:class:`PostgresWindow`) and the attempt
journal's open-attempt state with each attempt's owner and lease (:class:`PostgresAttempts`).
Connections come from one psycopg 3 async pool per process.

Every transaction runs at ``SERIALIZABLE`` and is re-run from the start when the database answers
a serialization failure (``40001``) or a deadlock (``40P01``), up to :data:`MAX_RETRIES` times, so
the same SQL is correct on PostgreSQL-compatible distributed engines. A step that is one
statement runs as that statement alone (:meth:`PostgresStore.statement`, autocommit): it is its
own transaction, at ``SERIALIZABLE`` too (every pooled session sets
``default_transaction_isolation``), and committed (durably, with ``synchronous_commit``) when its
answer arrives, without the ``BEGIN`` and ``COMMIT`` round trips. Each of the five durable steps of
an ALLOW (``idempotency_begin``, the mirror's ``opened``, ``claim_grant`` -- which also records
the mirror's GRANT_CLAIMED --, ``settle``, ``idempotency_complete``) is one statement in the
common case; a key found already
there, or one that cannot take its answer, goes on to the full transaction below. Which
guarantee rests on which statement:

===============================  ==================================================================
guarantee                        statement
===============================  ==================================================================
a grant is claimed once          ``INSERT INTO grant_claims ... ON CONFLICT DO NOTHING``: the
                                 primary key admits one row; ``rowcount`` says who won
a grant is claimed only by the   ``WITH fenced AS (UPDATE attempts SET grant_claimed = true ...
attempt's current owner, under   WHERE attempt_id AND owner AND epoch AND state = 'OPEN' AND NOT
a live lease (issue 29)          grant_claimed AND lease_until > now RETURNING ...) INSERT INTO
                                 grant_claims ... SELECT ... FROM fenced``: one statement; no
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
                                 (or none); when no row matches, ``SELECT ... FOR UPDATE`` on the
                                 key's row says why, or takes the answer, then ``UPDATE``
a consumption happens once       ``INSERT INTO consumptions ... ON CONFLICT DO NOTHING``
an approval is decided once      ``SELECT ... FOR UPDATE`` on the request, then ``UPDATE ... WHERE
                                 state = 'PENDING'``
the window never overflows       ``SELECT ... FROM ceiling_lock ... FOR UPDATE`` (one row per
                                 window) serialises reservations; count, sum and ``INSERT`` follow
an attempt has one reconciler    ``SELECT ... FOR UPDATE SKIP LOCKED`` of a lapsed attempt and the
                                 ``UPDATE`` of its owner and lease in the same transaction
===============================  ==================================================================

Idempotency keys and the database dropping: a request's key is IN_PROGRESS under its holder (a
random token, kept in a context variable of the request's task between ``idempotency_begin`` and
the attempt's ``opened`` in the same task) and a lease of ``EXECUTOR_ATTEMPT_LEASE_SECONDS``. When
the database drops after the key was recorded and before the attempt opened, the holder cannot
free the key; a later request with the key gets 409 IDEMPOTENCY_IN_PROGRESS until the lease
lapses, then takes it over and runs (nothing had been sent: the attempt never opened, or closed
without claiming its grant). A key whose attempt opened belongs to that attempt: its answer comes
from it, or from reconciliation when it is unknown; it is never taken over. A holder whose key
was taken over cannot open its attempt or record its answer (``IDEMPOTENCY_TAKEN_OVER``). A key
whose attempt claimed its grant and closed, but whose answer was never recorded (the database
dropped in between), has its attempt opened again for a lease keeper to reconcile when a retry
finds it more than a lease later; reconciliation then settles the key.

The database failing is its own state: a connection that cannot be had within
``connect_timeout`` seconds, a dropped connection or a failed COMMIT raise
``StoreError(STORE_UNAVAILABLE)``; nothing is retried that might have committed: a statement
alone that fails once sent may have committed, so it is never re-run. A pooled connection the
server closed while it idled (a restart: the server sends its FATAL and closes) has input
waiting, found by one ``poll`` before anything is sent on it, and is replaced (no round trip per
checkout); a transaction whose connection fails before COMMIT runs once more on a fresh one; and
the pool reconnects for ever, so service resumes by itself when the database returns.

Failover: the connection string may name several hosts with ``target_session_attrs=read-write``
(:func:`check_store_url` refuses several without it); every connection the pool opens goes
through that list, so after a promotion the next one reaches the new primary, without a restart.
A server that answers ``25006`` (read-only: a demoted or fenced primary, a standby) is never a
domain error: the pool drops every connection it holds and the statement, refused before it ran,
runs once more on a new one. ``PostgresStore.open(server_watch=...)`` awaits a check with every
new connection before it is used (``state/lostwrites.py``: a server that went back in time).

Callers: ``assembly.py`` (opens one :class:`PostgresStore` when ``EXECUTOR_STORE_URL`` is set and
hands its three faces to the authority, the pipeline, the ceilings and the journal),
``tools/store_cli.py`` (``agentsafe store migrate``), ``lifecycle/leases.py`` (the mirror).
Also imported by ``plane.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import hmac
import json
import secrets
import select
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import psycopg
from psycopg import errors as pgerrors
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from ..canonical import canonical_text
from ..clock import format_ms
from ..codes import Code
from ..config import LEASE_MARGIN_SECONDS
from ..errors import AgentSafeError, ConfigError, StoreError
from ..principals import Verification, same_actor
from .journal import CLOSING_STATUSES, ReconciledStatus, RecordType
from .pgschema import SCHEMA_VERSION, migrate
from .usestore import _APPROVAL_COLUMNS as _APPROVAL_COLUMNS
from .usestore import _PASSKEY_COLUMNS as _PASSKEY_COLUMNS
from .usestore import (
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
    _approval_from_row,
    _canonical_or_store_error,
    _digest_or_store_error,
    _listing,
    _load_object,
    check_cancellable,
    check_decidable,
    check_sign_count,
    consumption_token,
    decision_state,
    passkey_from_row,
    settles,
)

__all__ = [
    "MAX_RETRIES",
    "OPENING_EPOCH",
    "AttemptRow",
    "PostgresAttempts",
    "PostgresStore",
    "PostgresUseStore",
    "PostgresWindow",
    "SharedAttemptMirror",
    "check_store_url",
    "migrate_url",
]

_T = TypeVar("_T")
_Conn = psycopg.AsyncConnection[TupleRow]

MAX_RETRIES: Final = 20
"""Serialization failures re-run a transaction at most this many times before STORE_CONTENDED."""
_RETRY_STATES: Final = frozenset({"40001", "40P01"})
_WRONG_SERVER: Final = frozenset({"25006"})
"""A server that is not (or no longer) the primary: ``read_only_sql_transaction``, what a standby
or a server set read-only answers a write. Never a domain error: the connection is dropped and
the store is unavailable until the host list leads to a primary."""
ServerWatch = Callable[["psycopg.AsyncConnection[TupleRow]"], Awaitable[None]]
"""Awaited with every new connection before it is used (``state/lostwrites.py``)."""
_NOW: Final = "extract(epoch from clock_timestamp())::double precision"
OPENING_EPOCH: Final = 1
"""An attempt's fencing token when it opens; every takeover increments it (issue 29)."""

_Scope = tuple[str, str, str]  # (tenant, principal, key)
_HELD: ContextVar[tuple[_Scope, str] | None] = ContextVar("agentsafe_key_holder", default=None)
"""The key this task's request began (``idempotency_begin`` NEW) and its holder token: the
attempt it opens in the same task is fenced by it, and only it completes or frees the key."""


def check_store_url(url: str) -> str:
    """``url`` if libpq would take it as a connection string: a ``postgresql://`` (or
    ``postgres://``) URL or ``key=value`` pairs, with one host or several (``host=a,b`` or
    ``postgresql://a:5432,b:5432/db``). Several hosts need ``target_session_attrs`` of
    ``read-write`` or ``primary``: without it libpq takes the first host that answers, which
    may be a standby that refuses every write. ``ConfigError`` naming ``EXECUTOR_STORE_URL``
    otherwise (the value is never echoed)."""
    if any(c in url for c in "\r\n\x00"):
        raise ConfigError("EXECUTOR_STORE_URL", "must be a PostgreSQL connection string")
    try:
        params = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        raise ConfigError(
            "EXECUTOR_STORE_URL", "must be a PostgreSQL connection string (URL or key=value)"
        ) from None
    if not url.startswith(("postgresql://", "postgres://")) and "=" not in url:
        raise ConfigError("EXECUTOR_STORE_URL", "must be a PostgreSQL connection string")
    hosts = [h for h in str(params.get("host") or "").split(",") if h]
    addresses = [h for h in str(params.get("hostaddr") or "").split(",") if h]
    if max(len(hosts), len(addresses)) > 1 and params.get("target_session_attrs") not in (
        "read-write",
        "primary",
    ):
        raise ConfigError(
            "EXECUTOR_STORE_URL",
            "names several hosts: add target_session_attrs=read-write, so only the primary is used",
        )
    return url


def _cancelled() -> None:
    """Re-raise a cancellation psycopg turned into an error: a task cancelled mid-query (a
    SIGTERM's close) has psycopg cancel the query and raise ``QueryCanceled`` or an
    ``OperationalError``; reported as ``StoreError`` the cancellation was lost, and a loop
    that treats the store as unavailable (``Executor._store_health_loop``) ran on for ever."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _unavailable(exc: BaseException) -> StoreError:
    """The store's failure as ``StoreError``; a failure of a task being cancelled is re-raised
    as the cancellation (every conversion of a psycopg error passes here)."""
    _cancelled()
    return StoreError(f"the shared store failed: {type(exc).__name__}", code=Code.STORE_UNAVAILABLE)


async def _connect(url: str, *, connect_timeout: float) -> _Conn:
    try:
        return await psycopg.AsyncConnection.connect(
            url, autocommit=True, connect_timeout=max(1, int(connect_timeout))
        )
    except psycopg.Error as exc:
        raise _unavailable(exc) from None


async def migrate_url(url: str, *, connect_timeout: float = 10.0) -> tuple[int, int]:
    """Apply the migrations to the database at ``url`` (``agentsafe store migrate``)."""
    conn = await _connect(url, connect_timeout=connect_timeout)
    try:
        try:
            return await migrate(conn)
        except psycopg.Error as exc:
            raise _unavailable(exc) from None
    finally:
        await conn.close()


class PostgresStore:
    """One pool and the transaction discipline every face shares. Construct with :meth:`open`."""

    def __init__(
        self,
        pool: AsyncConnectionPool[_Conn],
        secret: bytes,
        timeout: float,
        *,
        lease_seconds: float = 30.0,
    ) -> None:
        self._pool = pool
        self._secret = secret
        self._timeout = timeout
        self.lease_seconds = lease_seconds
        """How long a key's holder has to open its attempt before a retry may take the key."""
        self._closed = False
        self.use_store = PostgresUseStore(self)
        self.window = PostgresWindow(self)
        self.attempts = PostgresAttempts(self)

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        max_connections: int = 10,
        connect_timeout: float = 5.0,
        lease_seconds: float = 30.0,
        server_watch: ServerWatch | None = None,
    ) -> PostgresStore:
        """Migrate (under the advisory lock), read the consumption key, open the pool.

        ``server_watch`` (``state/lostwrites.py``) is awaited with every new connection before
        it is used (the migration's first, then each the pool opens): a server that went back
        in time is found before any work reaches it. If it raises, the connection is not used
        (``STORE_UNAVAILABLE``)."""
        conn = await _connect(url, connect_timeout=connect_timeout)
        try:
            try:
                await migrate(conn)
                if server_watch is not None:
                    await server_watch(conn)
                async with conn.transaction():
                    await conn.execute(
                        "INSERT INTO agentsafe_meta (name, value) VALUES ('consumption_key', %s)"
                        " ON CONFLICT (name) DO NOTHING",
                        (secrets.token_bytes(32),),
                    )
                    cur = await conn.execute(
                        "SELECT value FROM agentsafe_meta WHERE name = 'consumption_key'"
                    )
                    row = await cur.fetchone()
            except psycopg.Error as exc:
                raise _unavailable(exc) from None
        finally:
            await conn.close()
        secret = bytes(row[0]) if row is not None else b""
        if len(secret) < 32:
            raise StoreError("the shared store's key is damaged", code=Code.STORE_UNAVAILABLE)

        async def configure(conn: _Conn) -> None:
            try:
                await conn.set_autocommit(True)
                await conn.set_isolation_level(psycopg.IsolationLevel.SERIALIZABLE)
                # A statement run on its own (``statement``) is its own transaction: this level.
                await conn.execute("SET default_transaction_isolation = 'serializable'")
                if server_watch is not None:
                    await server_watch(conn)
            except BaseException:
                await conn.close()  # the pool discards it; closed here, not left to the GC
                raise

        pool: AsyncConnectionPool[_Conn] = AsyncConnectionPool(
            url,
            min_size=1,
            max_size=max_connections,
            open=False,
            configure=configure,
            kwargs={"connect_timeout": max(1, int(connect_timeout))},
            timeout=connect_timeout,
            # A failed connect is not retried in the background: the next request that needs a
            # connection tries again, so a returning database is used at once.
            reconnect_timeout=0,
            name="agentsafe-store",
        )
        await pool.open(wait=False)
        return cls(pool, secret, connect_timeout, lease_seconds=lease_seconds)

    @property
    def schema_version(self) -> int:
        return SCHEMA_VERSION

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[_Conn]:
        """A pooled connection the server has not dropped while it idled in the pool: one that
        is closed or has input waiting (a restart sends its FATAL and closes; nothing else
        speaks unasked on these sessions) is closed, so the pool drops it, and another taken.
        Nothing was sent on it, so this changes nothing. One ``poll``, no round trip."""
        for _ in range(_MAX_STALE):
            async with self._pool.connection(timeout=self._timeout) as conn:
                if not _spoke_while_idle(conn):
                    try:
                        yield conn
                    except psycopg.Error as exc:
                        if exc.sqlstate in _WRONG_SERVER:
                            # A server that is no longer the primary (read-only, or in
                            # recovery): this connection and every other pooled one lead to it,
                            # so all are dropped and the next are opened through the host list
                            # (target_session_attrs=read-write) to the new primary.
                            await conn.close()
                            await self._pool.drain()
                        raise
                    return
                await conn.close()
        raise StoreError("the shared store keeps dropping connections", code=Code.STORE_UNAVAILABLE)

    async def transaction(self, fn: Callable[[_Conn], Awaitable[_T]]) -> _T:
        """Run ``fn`` in one SERIALIZABLE transaction, re-run on 40001/40P01."""
        if self._closed:
            raise StoreError("the shared store is closed", code=Code.STORE_CLOSED)
        delay = 0.002
        stale_retried = False
        for _ in range(MAX_RETRIES):
            committing = False
            try:
                async with self._connection() as conn:
                    async with conn.transaction():
                        result = await fn(conn)
                        committing = True
                    return result
            except (pgerrors.SerializationFailure, pgerrors.DeadlockDetected):
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.1)
            except psycopg.Error as exc:
                _cancelled()
                if exc.sqlstate in _RETRY_STATES:
                    await asyncio.sleep(delay)
                    continue
                if (
                    isinstance(exc, psycopg.OperationalError) or exc.sqlstate in _WRONG_SERVER
                ) and (not committing and not stale_retried):
                    # A pooled connection the server dropped (a restart) fails before COMMIT:
                    # nothing was committed, so the work runs once more on a fresh connection.
                    stale_retried = True
                    continue
                raise _unavailable(exc) from None
            except PoolTimeout as exc:
                _cancelled()
                raise _unavailable(exc) from None
        raise StoreError(
            "the shared store stayed contended; try again", code=Code.STORE_UNAVAILABLE
        )

    async def statement(
        self, sql: str, params: Sequence[object] = ()
    ) -> tuple[int, TupleRow | None]:
        """Run one statement as its own SERIALIZABLE transaction (autocommit: no ``BEGIN`` and
        ``COMMIT`` round trips; its answer arrives once it committed); its row count and first
        row. Re-run on 40001/40P01 (the statement rolled back). A statement that failed once it
        was sent may have committed, so it is never re-run: ``StoreError(STORE_UNAVAILABLE)``.
        A pooled connection the server dropped or spoke on while it idled is discarded before
        anything is sent on it (a server restart), and the statement runs on another."""
        if self._closed:
            raise StoreError("the shared store is closed", code=Code.STORE_CLOSED)
        delay = 0.002
        refused_retried = False
        for _ in range(MAX_RETRIES):
            try:
                async with self._connection() as conn:
                    cur = await conn.execute(sql, params)
                    row = await cur.fetchone() if cur.description is not None else None
                    return cur.rowcount, row
            except psycopg.Error as exc:
                _cancelled()
                if exc.sqlstate in _RETRY_STATES:
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 0.1)
                    continue
                if exc.sqlstate in _WRONG_SERVER and not refused_retried:
                    # Refused before it ran (the server is not the primary): nothing committed,
                    # so it runs once more, on a connection to the new primary.
                    refused_retried = True
                    continue
                raise _unavailable(exc) from None
            except PoolTimeout as exc:
                _cancelled()
                raise _unavailable(exc) from None
        raise StoreError(
            "the shared store stayed contended; try again", code=Code.STORE_UNAVAILABLE
        )

    async def ping(self) -> bool:
        """True when a connection answers now (``GET /ready``)."""

        async def work(conn: _Conn) -> bool:
            await conn.execute("SELECT 1")
            return True

        try:
            return await self.transaction(work)
        except StoreError:
            _cancelled()  # a cancelled ping is a cancellation, never "the store is down"
            return False

    async def now(self) -> float:
        """The database's clock, the one every replica's leases and windows are measured on."""

        async def work(conn: _Conn) -> float:
            return await _db_now(conn)

        return await self.transaction(work)

    def token(
        self, namespace: str, key: str, nonce: str, consumed_at: float, binding_digest: str
    ) -> str:
        return consumption_token(self._secret, namespace, key, nonce, consumed_at, binding_digest)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._pool.close()


_MAX_STALE: Final = 64
"""Dropped pooled connections discarded for one transaction before STORE_UNAVAILABLE."""


def _spoke_while_idle(conn: _Conn) -> bool:
    """True when an idle connection is closed or has input waiting."""
    pgconn = conn.pgconn
    if conn.closed or pgconn.status != psycopg.pq.ConnStatus.OK:
        return True
    poller = select.poll()
    poller.register(pgconn.socket, select.POLLIN)
    return bool(poller.poll(0))


async def _db_now(conn: _Conn) -> float:
    cur = await conn.execute(f"SELECT {_NOW}")
    row = await cur.fetchone()
    assert row is not None
    return float(row[0])


class PostgresUseStore:
    """:class:`UseStore` on the shared database (see the module docstring for the statements)."""

    def __init__(self, store: PostgresStore) -> None:
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
            f" grant_expires_at = %s, payload_digest = %s, lease_until = {_NOW} + %s"
            " WHERE attempt_id = %s AND owner = %s AND epoch = %s AND state = 'OPEN'"
            f" AND NOT grant_claimed AND lease_until > {_NOW} RETURNING attempt_id),"
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
        async def work(conn: _Conn) -> list[OrphanKey]:
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
        async def work(conn: _Conn) -> OrphanKey | None:
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
        _HELD.set(None)
        insert = (
            "INSERT INTO idempotency (tenant, principal, key, payload_digest, state,"  # noqa: S608
            " created_at, holder, lease_until, attempt_id, owner)"
            f" VALUES (%s, %s, %s, %s, 'IN_PROGRESS', %s, %s, {_NOW} + %s, %s, %s)"
            " ON CONFLICT (tenant, principal, key) DO NOTHING"
        )
        values = (tenant, principal, key, payload_digest, now, holder, lease, attempt_id, owner)

        async def work(conn: _Conn) -> IdempotencyState:
            cur = await conn.execute(insert, values)
            if cur.rowcount == 1:
                return IdempotencyState(IdempotencyKind.NEW)
            # Read without a lock (a key in flight is the common case, many retries at once);
            # only a key that looks stale is read again under its row lock and acted on.
            for locked in (False, True):
                cur = await conn.execute(
                    f"SELECT payload_digest, state, response, lease_until < {_NOW}, opened_attempt"  # noqa: S608
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
                    return IdempotencyState(IdempotencyKind.REPLAY, response=_load_object(response))
                stale = await _stale_key(
                    conn, lapsed=bool(lapsed), attempt_id=opened, lease=lease, lock=locked
                )
                if stale is None:
                    return IdempotencyState(IdempotencyKind.IN_PROGRESS)
            if stale is _Stale.UNANSWERED:
                await _reopen_unanswered(conn, str(opened))
                return IdempotencyState(IdempotencyKind.IN_PROGRESS)
            await conn.execute(
                f"UPDATE idempotency SET holder = %s, lease_until = {_NOW} + %s,"  # noqa: S608
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
            _HELD.set(((tenant, principal, key), holder))
        return state

    async def idempotency_complete(
        self, *, tenant: str, principal: str, key: str, response: dict[str, Any], now: float
    ) -> None:
        """As :meth:`SQLiteUseStore.idempotency_complete`: the first final answer stays."""
        text = _canonical_or_store_error(response)

        held = _holder_of((tenant, principal, key))

        async def work(conn: _Conn) -> None:
            # Read again under the row lock: say why the key cannot take this answer, or take it
            # (the key changed since the statement below found it would not).
            row = await _locked_key(conn, tenant, principal, key)
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
        text = _canonical_or_store_error(response)

        async def work(conn: _Conn) -> bool:
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
        text = _canonical_or_store_error(response)

        async def work(conn: _Conn) -> int:
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

        async def work(conn: _Conn) -> None:
            cur = await conn.execute(
                f"SELECT holder, lease_until < {_NOW}, opened_attempt, owner"  # noqa: S608
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
        binding_digest = _digest_or_store_error(binding)
        nonce = secrets.token_hex(16)

        async def work(conn: _Conn) -> bool:
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
        try:
            expected = self._store.token(
                record.namespace, record.key, record.nonce, record.consumed_at,
                record.binding_digest,
            )  # fmt: skip
        except AgentSafeError:
            return False
        if not isinstance(record.token, str) or not hmac.compare_digest(
            expected.encode(), record.token.encode()
        ):
            return False

        async def work(conn: _Conn) -> bool:
            cur = await conn.execute(
                "SELECT nonce, consumed_at, binding_digest FROM consumptions"
                " WHERE namespace = %s AND key = %s",
                (record.namespace, record.key),
            )
            row = await cur.fetchone()
            return row is not None and (row[0], float(row[1]), row[2]) == (
                record.nonce,
                record.consumed_at,
                record.binding_digest,
            )

        return await self._store.transaction(work)

    async def approval_create(self, request: ApprovalRequest) -> None:
        if _digest_or_store_error(request.intent) != request.intent_hash:
            raise ApprovalError(
                "the intent does not hash to its intent_hash", code=Code.APPROVAL_BINDING_MISMATCH
            )
        intent_text = canonical_text(dict(request.intent))
        approvers_text = canonical_text(list(request.approvers))
        reasons_text = canonical_text(list(request.reason_codes))

        async def work(conn: _Conn) -> None:
            cur = await conn.execute(
                "INSERT INTO approvals (request_id, intent, intent_hash, approvers,"
                " proposer_principal, proposer_actor, expires_at, created_at, state,"
                " rule, reason_codes, required_verification)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, 'PENDING', %s, %s, %s)"
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

        await self._store.transaction(work)

    async def approval_get(self, request_id: str) -> ApprovalRecord | None:
        async def work(conn: _Conn) -> ApprovalRecord | None:
            cur = await conn.execute(
                f"SELECT {_APPROVAL_COLUMNS} FROM approvals WHERE request_id = %s",  # noqa: S608
                (request_id,),
            )
            row = await cur.fetchone()
            return None if row is None else _approval_from_row(tuple(row))

        return await self._store.transaction(work)

    async def approval_list(
        self, *, state: ApprovalState, now: float, approver: str | None = None
    ) -> list[ApprovalRecord]:
        async def work(conn: _Conn) -> list[ApprovalRecord]:
            where, args = _listing(state, now, "%s")
            cur = await conn.execute(
                f"SELECT {_APPROVAL_COLUMNS} FROM approvals WHERE {where}"  # noqa: S608
                " ORDER BY created_at, request_id",
                args,
            )
            return [_approval_from_row(tuple(row)) for row in await cur.fetchall()]

        records = await self._store.transaction(work)
        if approver is not None:
            records = [
                r
                for r in records
                if approver in r.request.approvers
                and not same_actor(approver, r.request.proposer_principal)
            ]
        return records

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

        async def work(conn: _Conn) -> ApprovalRecord:
            record = await _locked_approval(conn, request_id)
            check_decidable(record, approver=approver, now=now)
            await conn.execute(
                "UPDATE approvals SET state = %s, approver = %s, reason = %s, decided_at = %s,"
                " verification = %s WHERE request_id = %s AND state = 'PENDING'",
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

        return await self._store.transaction(work)

    async def approval_cancel(
        self, request_id: str, *, by: str, reason: str, now: float
    ) -> ApprovalRecord:
        async def work(conn: _Conn) -> ApprovalRecord:
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
        async def work(conn: _Conn) -> None:
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
        async def work(conn: _Conn) -> EnrolmentToken | None:
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
        async def work(conn: _Conn) -> None:
            used = await conn.execute(
                "UPDATE enrolment_tokens SET used_at = %s WHERE token_digest = %s"
                " AND principal = %s AND used_at IS NULL AND expires_at > %s",
                (now, token_digest, passkey.principal, now),
            )
            if used.rowcount != 1:
                raise StoreError(
                    "the enrolment token is not usable", code=Code.ENROLMENT_TOKEN_INVALID
                )
            inserted = await conn.execute(
                "INSERT INTO passkeys (credential_id, principal, public_key, sign_count,"
                " transports, created_at) VALUES (%s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (credential_id) DO NOTHING",
                (
                    passkey.credential_id,
                    passkey.principal,
                    passkey.public_key,
                    passkey.sign_count,
                    canonical_text(list(passkey.transports)),
                    passkey.created_at,
                ),
            )
            if inserted.rowcount != 1:
                raise StoreError(
                    "this passkey is already registered", code=Code.WEBAUTHN_REGISTRATION_INVALID
                )

        await self._store.transaction(work)

    async def passkey_list(self, principal: str) -> list[PasskeyRecord]:
        async def work(conn: _Conn) -> list[PasskeyRecord]:
            cur = await conn.execute(
                f"SELECT {_PASSKEY_COLUMNS} FROM passkeys WHERE principal = %s"  # noqa: S608
                " ORDER BY created_at, credential_id",
                (principal,),
            )
            return [passkey_from_row(tuple(row)) for row in await cur.fetchall()]

        return await self._store.transaction(work)

    async def passkey_used(
        self, principal: str, credential_id: str, *, sign_count: int, now: float
    ) -> None:
        async def work(conn: _Conn) -> None:
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

        async def work(conn: _Conn) -> int:
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


async def _locked_approval(conn: _Conn, request_id: str) -> ApprovalRecord:
    cur = await conn.execute(
        f"SELECT {_APPROVAL_COLUMNS} FROM approvals WHERE request_id = %s"  # noqa: S608
        " FOR UPDATE",
        (request_id,),
    )
    row = await cur.fetchone()
    if row is None:
        raise ApprovalError("no such approval request", code=Code.APPROVAL_NOT_FOUND)
    return _approval_from_row(tuple(row))


async def _locked_key(conn: _Conn, tenant: str, principal: str, key: str) -> TupleRow | None:
    cur = await conn.execute(
        "SELECT state, response, holder FROM idempotency"
        " WHERE tenant = %s AND principal = %s AND key = %s FOR UPDATE",
        (tenant, principal, key),
    )
    return await cur.fetchone()


def _holder_of(scope: _Scope) -> str | None:
    """This task's holder token for ``scope``, if this task's request began it."""
    held = _HELD.get()
    return held[1] if held is not None and held[0] == scope else None


def _let_go(scope: _Scope) -> None:
    held = _HELD.get()
    if held is not None and held[0] == scope:
        _HELD.set(None)


class _Stale(enum.Enum):
    ABANDONED = "ABANDONED"  # nothing can have been sent: free, or take over
    UNANSWERED = "UNANSWERED"  # sent and closed, but the key never got its answer


async def _stale_key(
    conn: _Conn, *, lapsed: bool, attempt_id: str | None, lease: float, lock: bool
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
        f"SELECT state, grant_claimed, closed_at < {_NOW} - %s FROM attempts"  # noqa: S608
        " WHERE attempt_id = %s" + (" FOR UPDATE" if lock else ""),
        (lease, attempt_id),
    )
    row = await cur.fetchone()
    if row is None or row[0] != "CLOSED":
        return None
    if not row[1]:
        return _Stale.ABANDONED
    return _Stale.UNANSWERED if row[2] else None


async def _reopen_unanswered(conn: _Conn, attempt_id: str) -> None:
    """Open an UNANSWERED key's attempt again with its lease lapsed, so a lease keeper takes it
    and reconciles it read-only, and that settles the key."""
    await conn.execute(
        f"UPDATE attempts SET state = 'OPEN', lease_until = {_NOW} - 1,"  # noqa: S608
        " last_status = 'ANSWER_NOT_RECORDED', closed_at = NULL, epoch = epoch + 1"
        " WHERE attempt_id = %s AND state = 'CLOSED' AND grant_claimed",
        (attempt_id,),
    )


class PostgresWindow:
    """The host-ceiling window shared by every replica, on the database's clock.

    Implements ``lifecycle/ceilings.py``'s ``CeilingWindow``: every reservation locks the one
    ``ceiling_lock`` row, so N allowed means N in total, never N per replica.
    """

    def __init__(self, store: PostgresStore) -> None:
        self._store = store

    async def usage(self, window_seconds: float) -> tuple[int, int]:
        async def work(conn: _Conn) -> tuple[int, int]:
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

        async def work(conn: _Conn) -> tuple[str | None, object]:
            await conn.execute("SELECT name FROM ceiling_lock WHERE name = 'window' FOR UPDATE")
            count, total = await _window_usage(conn, window_seconds)
            if count_limit is not None and count + 1 > count_limit:
                return "COUNT", None
            if sum_limit is not None and total + amount_minor > sum_limit:
                return "SUM", None
            cur = await conn.execute(
                f"INSERT INTO ceiling_window (at, amount_minor) VALUES ({_NOW}, %s)"  # noqa: S608
                " RETURNING id",
                (amount_minor,),
            )
            row = await cur.fetchone()
            assert row is not None
            return None, int(row[0])

        return await self._store.transaction(work)

    async def release(self, token: object) -> None:
        async def work(conn: _Conn) -> None:
            await conn.execute("DELETE FROM ceiling_window WHERE id = %s", (token,))

        await self._store.transaction(work)


async def _window_usage(conn: _Conn, window_seconds: float) -> tuple[int, int]:
    await conn.execute(
        f"DELETE FROM ceiling_window WHERE at <= {_NOW} - %s",  # noqa: S608
        (window_seconds,),
    )
    cur = await conn.execute("SELECT count(*), coalesce(sum(amount_minor), 0) FROM ceiling_window")
    row = await cur.fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


@dataclass(frozen=True)
class AttemptRow:
    """An open attempt as the shared store holds it (the fields of ATTEMPT_OPENED and after)."""

    attempt_id: str
    owner: str
    lease_until: float
    intent_id: str | None
    intent_hash: str
    decision_id: str | None
    dossier_id: str | None
    principal: str | None
    action: str | None
    binding: Mapping[str, Any]
    opened_at: str
    grant_claimed: bool
    grant_id: str | None
    grant_expires_at: str | None
    payload_digest: str | None
    last_status: str | None
    epoch: int = OPENING_EPOCH
    """The fencing token: incremented by every takeover, with the owner."""


_ATTEMPT_COLUMNS = (
    "attempt_id, owner, lease_until, intent_id, intent_hash, decision_id, dossier_id, principal,"
    " action, binding, opened_at, grant_claimed, grant_id, grant_expires_at, payload_digest,"
    " last_status, epoch"
)


def _attempt_from_row(row: TupleRow) -> AttemptRow:
    values = list(row)
    values[2] = float(values[2])
    values[9] = _load_object(values[9])
    values[11] = bool(values[11])
    values[16] = int(values[16])
    return AttemptRow(*values)


class PostgresAttempts:
    """The journal's open-attempt state, owned by replicas under leases.

    ``opened`` inserts the attempt owned by this replica at :data:`OPENING_EPOCH` (and, in the
    same statement, makes the key its request holds the attempt's, or refuses if that key was
    taken over); ``grant_claimed`` and ``settle`` update it, fenced by its owner and epoch when
    given; ``renew`` extends every lease this replica holds; ``take_lapsed`` moves one attempt
    whose lease ran out to this replica (one row lock); ``take`` does the same for a named
    attempt. Every move increments the attempt's ``epoch`` in the transaction that changes its
    owner, so whatever the previous owner still holds is fenced off.
    """

    def __init__(self, store: PostgresStore) -> None:
        self._store = store

    async def opened(
        self,
        *,
        owner: str,
        lease_seconds: float,
        attempt_id: str,
        fields: Mapping[str, Any],
        binding: Mapping[str, Any],
        opened_at: str,
    ) -> None:
        binding_text = canonical_text(dict(binding))
        held = _HELD.get()
        row = (
            attempt_id,
            owner,
            lease_seconds,
            fields.get("intent_id"),
            fields["intent_hash"],
            fields.get("decision_id"),
            fields.get("dossier_id"),
            fields.get("caller"),
            fields.get("action"),
            binding_text,
            opened_at,
        )
        columns = (
            "INSERT INTO attempts (attempt_id, owner, lease_until, state, intent_id,"
            " intent_hash, decision_id, dossier_id, principal, action, binding, opened_at)"
        )
        if held is None:
            await self._store.statement(
                f"{columns} VALUES (%s, %s, {_NOW} + %s, 'OPEN', %s, %s, %s, %s, %s, %s, %s, %s)",
                row,
            )
            return
        # The key this request holds becomes the attempt's, and the attempt is inserted, in one
        # statement (one transaction): the INSERT takes its row only from the UPDATE's, so
        # nothing opens unless the key's holder is still this request's.
        (tenant, principal, key), holder = held
        inserted, _ = await self._store.statement(
            "WITH fenced AS (UPDATE idempotency SET opened_attempt = %s WHERE tenant = %s"  # noqa: S608
            " AND principal = %s AND key = %s AND holder = %s AND state = 'IN_PROGRESS'"
            f" RETURNING 1) {columns} SELECT %s, %s, {_NOW} + %s, 'OPEN', %s, %s, %s, %s, %s,"
            " %s, %s, %s FROM fenced",
            (attempt_id, tenant, principal, key, holder, *row),
        )
        if inserted != 1:
            raise StoreError("a later request took this key over", code=Code.IDEMPOTENCY_TAKEN_OVER)

    async def grant_claimed(
        self,
        *,
        attempt_id: str,
        grant_id: str,
        grant_expires_at: str,
        payload_digest: str,
        owner: str | None = None,
        epoch: int | None = None,
    ) -> None:
        """Record GRANT_CLAIMED (when the claim itself did not: an unfenced claim). With
        ``owner`` (and ``epoch``), only on the row still theirs and open: ``ATTEMPT_FENCED``
        otherwise."""
        updated, _ = await self._store.statement(
            "UPDATE attempts SET grant_claimed = true, grant_id = %s, grant_expires_at = %s,"
            " payload_digest = %s WHERE attempt_id = %s AND (%s::text IS NULL OR (owner = %s"
            " AND state = 'OPEN')) AND (%s::bigint IS NULL OR epoch = %s)",
            (grant_id, grant_expires_at, payload_digest, attempt_id, owner, owner, epoch, epoch),
        )
        if updated != 1:
            if owner is not None:
                raise StoreError(
                    "the attempt is no longer this replica's", code=Code.ATTEMPT_FENCED
                )
            raise StoreError("the attempt is not in the shared store", code=Code.STORE_UNAVAILABLE)

    async def settle(
        self,
        *,
        attempt_id: str,
        closed: bool,
        status: str,
        owner: str | None = None,
        epoch: int | None = None,
    ) -> int:
        """Close the attempt, or record the status that leaves it open. With ``owner`` and
        ``epoch``, only while the row is still theirs (a close from a holder that was taken over
        changes nothing: the new owner resolves it). How many rows changed."""
        fence = " AND (%s::text IS NULL OR owner = %s) AND (%s::bigint IS NULL OR epoch = %s)"
        if closed:
            updated, _ = await self._store.statement(
                f"UPDATE attempts SET state = 'CLOSED', last_status = %s, closed_at = {_NOW}"  # noqa: S608
                " WHERE attempt_id = %s" + fence,
                (status, attempt_id, owner, owner, epoch, epoch),
            )
        else:
            updated, _ = await self._store.statement(
                "UPDATE attempts SET last_status = %s WHERE attempt_id = %s" + fence,  # noqa: S608
                (status, attempt_id, owner, owner, epoch, epoch),
            )
        return updated

    async def renew(
        self, *, owner: str, lease_seconds: float, held: Mapping[str, int]
    ) -> list[tuple[str, int]]:
        """Extend the lease of each open attempt in ``held`` (attempt id -> epoch) that
        ``owner`` still holds at that epoch; the ``(attempt_id, epoch)`` of each one renewed.

        Only the attempts this process holds a fence for: an attempt of the same
        ``EXECUTOR_REPLICA_ID`` that this process knows nothing of (its predecessor's, after a
        restart, or one taken over and not resolved before a crash) is left to lapse, so another
        replica takes it and reconciles it, rather than being renewed for ever with nobody to
        resolve it (found by the protocol model, docs/protocol.md, GAP_RENEW_ALL)."""
        if not held:
            return []
        ids, epochs = list(held), [held[attempt_id] for attempt_id in held]

        async def work(conn: _Conn) -> list[tuple[str, int]]:
            cur = await conn.execute(
                f"UPDATE attempts a SET lease_until = {_NOW} + %s"  # noqa: S608
                " FROM unnest(%s::text[], %s::bigint[]) AS h(attempt_id, epoch)"
                " WHERE a.attempt_id = h.attempt_id AND a.epoch = h.epoch AND a.owner = %s"
                " AND a.state = 'OPEN' RETURNING a.attempt_id, a.epoch",
                (lease_seconds, ids, epochs, owner),
            )
            return [(str(r[0]), int(r[1])) for r in await cur.fetchall()]

        return await self._store.transaction(work)

    async def take_lapsed(self, *, owner: str, lease_seconds: float) -> AttemptRow | None:
        """Take the oldest open attempt whose lease lapsed, if any: its row is locked (others
        skip it) and its owner and lease changed in one transaction."""

        async def work(conn: _Conn) -> AttemptRow | None:
            cur = await conn.execute(
                f"SELECT attempt_id FROM attempts WHERE state = 'OPEN' AND lease_until < {_NOW}"  # noqa: S608
                " ORDER BY opened_at, attempt_id LIMIT 1 FOR UPDATE SKIP LOCKED"
            )
            row = await cur.fetchone()
            if row is None:
                return None
            return await _move(conn, str(row[0]), owner, lease_seconds)

        return await self._store.transaction(work)

    async def take(
        self, attempt_id: str, *, owner: str, lease_seconds: float
    ) -> tuple[str, AttemptRow | None]:
        """Take a named attempt for reconciliation: ``("TAKEN", row)`` when it is open and its
        lease is this replica's or lapsed; ``("HELD", None)`` when another replica's lease is
        live; ``("CLOSED", None)`` when it was resolved; ``("ABSENT", None)``."""

        async def work(conn: _Conn) -> tuple[str, AttemptRow | None]:
            cur = await conn.execute(
                f"SELECT state, owner, lease_until < {_NOW} FROM attempts"  # noqa: S608
                " WHERE attempt_id = %s FOR UPDATE",
                (attempt_id,),
            )
            row = await cur.fetchone()
            if row is None:
                return "ABSENT", None
            if row[0] == "CLOSED":
                return "CLOSED", None
            if row[1] != owner and not row[2]:
                return "HELD", None
            return "TAKEN", await _move(conn, attempt_id, owner, lease_seconds)

        return await self._store.transaction(work)

    async def owned_unknown(self, *, owner: str) -> list[AttemptRow]:
        """The open attempts ``owner`` holds whose last resolution was STILL_UNKNOWN (the lease
        keeper asks about them again)."""

        async def work(conn: _Conn) -> list[AttemptRow]:
            cur = await conn.execute(
                f"SELECT {_ATTEMPT_COLUMNS} FROM attempts WHERE state = 'OPEN'"  # noqa: S608
                " AND owner = %s AND last_status = %s ORDER BY opened_at, attempt_id",
                (owner, ReconciledStatus.STILL_UNKNOWN.value),
            )
            return [_attempt_from_row(row) for row in await cur.fetchall()]

        return await self._store.transaction(work)

    async def open_attempts(self) -> list[AttemptRow]:
        async def work(conn: _Conn) -> list[AttemptRow]:
            cur = await conn.execute(
                f"SELECT {_ATTEMPT_COLUMNS} FROM attempts WHERE state = 'OPEN'"  # noqa: S608
                " ORDER BY opened_at, attempt_id"
            )
            return [_attempt_from_row(row) for row in await cur.fetchall()]

        return await self._store.transaction(work)


async def _move(conn: _Conn, attempt_id: str, owner: str, lease_seconds: float) -> AttemptRow:
    """Make ``owner`` the attempt's owner under a new lease and increment its fencing token,
    in the caller's transaction (the row is already locked ``FOR UPDATE``)."""
    cur = await conn.execute(
        f"UPDATE attempts SET owner = %s, lease_until = {_NOW} + %s, epoch = epoch + 1"  # noqa: S608
        f" WHERE attempt_id = %s RETURNING {_ATTEMPT_COLUMNS}",
        (owner, lease_seconds, attempt_id),
    )
    row = await cur.fetchone()
    assert row is not None
    return _attempt_from_row(row)


class SharedAttemptMirror:
    """The journal's :class:`~agentsafe.executor.state.journal.AttemptMirror` on the shared
    store: every step of an attempt this replica journals, owned by ``owner`` under a lease.

    ATTEMPT_OPENED and GRANT_CLAIMED must reach the store (a failure fails the append, before
    dispatch). A close or reconciliation that cannot be written is never allowed to turn a known
    outcome into an error: it is kept and written again by :meth:`flush` (the lease keeper calls
    it), and until then the attempt stays open, renewed by this replica.

    Fencing (issue 29): for every attempt this replica opened (at :data:`OPENING_EPOCH`) or took
    over (:meth:`held`), the mirror keeps an :class:`AttemptFence`: :meth:`fence` hands it to the
    attempt, whose grant claim is fenced by it; :meth:`renew` moves its local lease deadline on
    only for the attempts the database renewed at the same epoch. GRANT_CLAIMED is written by the
    fenced claim itself (nothing more here); closes are fenced by owner and epoch.
    """

    def __init__(
        self,
        attempts: PostgresAttempts,
        *,
        owner: str,
        lease_seconds: float,
        dispatch_seconds: float = 0.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.attempts = attempts
        self.owner = owner
        self.lease_seconds = lease_seconds
        self.dispatch_seconds = dispatch_seconds
        """The dispatch deadline (``DOWNSTREAM_TIMEOUT_MS``): a send must end under the lease."""
        self._monotonic = monotonic
        self._backlog: list[tuple[str, bool, str]] = []
        self._fences: dict[str, AttemptFence] = {}

    @property
    def backlog(self) -> int:
        return len(self._backlog)

    def fence(self, attempt_id: str) -> AttemptFence | None:
        """The fencing token of an attempt this replica opened or took over, if it holds one."""
        return self._fences.get(attempt_id)

    def held(self, row: AttemptRow, *, sent_at: float) -> AttemptFence:
        """Remember the fence of an attempt this replica just took (``take``/``take_lapsed``,
        whose statement was sent at ``sent_at``)."""
        fence = self._new_fence(row.attempt_id, row.epoch, sent_at)
        fence.claimed = row.grant_claimed
        return fence

    def _new_fence(self, attempt_id: str, epoch: int, sent_at: float) -> AttemptFence:
        fence = AttemptFence(
            attempt_id=attempt_id,
            owner=self.owner,
            epoch=epoch,
            lease_seconds=self.lease_seconds,
            dispatch_seconds=self.dispatch_seconds,
            margin_seconds=LEASE_MARGIN_SECONDS,
            sent_at=sent_at,
            monotonic=self._monotonic,
        )
        self._fences[attempt_id] = fence
        return fence

    async def renew(self) -> int:
        """Extend every lease this replica holds; the local deadline of each attempt renewed at
        the epoch this replica holds moves on (one taken from it does not). How many."""
        sent_at = self._monotonic()
        held = {attempt_id: fence.epoch for attempt_id, fence in self._fences.items()}
        renewed = await self.attempts.renew(
            owner=self.owner, lease_seconds=self.lease_seconds, held=held
        )
        for attempt_id, epoch in renewed:
            fence = self._fences.get(attempt_id)
            if fence is not None and fence.epoch == epoch:
                fence.renewed(sent_at)
        return len(renewed)

    async def record(self, kind: RecordType, record: Mapping[str, Any]) -> None:
        attempt_id = str(record["attempt_id"])
        if kind is RecordType.ATTEMPT_OPENED:
            sent_at = self._monotonic()
            await self.attempts.opened(
                owner=self.owner,
                lease_seconds=self.lease_seconds,
                attempt_id=attempt_id,
                fields=record,
                binding=record["intent"],
                opened_at=str(record["at"]),
            )
            self._new_fence(attempt_id, OPENING_EPOCH, sent_at)
        elif kind is RecordType.GRANT_CLAIMED:
            fence = self._fences.get(attempt_id)
            if fence is not None and fence.claimed:
                return  # the fenced claim wrote it, in the claim's own statement
            await self.attempts.grant_claimed(
                attempt_id=attempt_id,
                grant_id=str(record["grant_id"]),
                grant_expires_at=str(record["grant_expires_at"]),
                payload_digest=str(record["payload_digest"]),
                owner=self.owner,
                epoch=fence.epoch if fence is not None else None,
            )
            if fence is not None:
                fence.claimed = True
        elif kind is RecordType.ATTEMPT_CLOSED:
            outcome = str(record["outcome"])
            await self._settle(attempt_id, outcome != "UNKNOWN_AFTER_DISPATCH", outcome)
        else:
            status = str(record["status"])
            await self._settle(attempt_id, status in CLOSING_STATUSES, status)

    async def _settle(self, attempt_id: str, closed: bool, status: str) -> None:
        try:
            await self._write_settle(attempt_id, closed, status)
        except StoreError:
            self._backlog.append((attempt_id, closed, status))

    async def _write_settle(self, attempt_id: str, closed: bool, status: str) -> None:
        """A close of an attempt this replica holds a fence for is fenced by it: once another
        replica took the attempt, the close changes nothing (the new owner resolves it)."""
        fence = self._fences.get(attempt_id)
        await self.attempts.settle(
            attempt_id=attempt_id,
            closed=closed,
            status=status,
            owner=self.owner if fence is not None else None,
            epoch=fence.epoch if fence is not None else None,
        )
        if closed:
            self._fences.pop(attempt_id, None)

    async def flush(self) -> int:
        """Write the kept closes again, in order; returns how many are still kept."""
        while self._backlog:
            attempt_id, closed, status = self._backlog[0]
            try:
                await self._write_settle(attempt_id, closed, status)
            except StoreError:
                break
            self._backlog.pop(0)
        return len(self._backlog)
