"""The shared store's connections: one pool, the transaction discipline, failover.

Role: :class:`PostgresPool` is one psycopg 3 async pool per process and the rules every
statement on the shared database follows. Every transaction runs at ``SERIALIZABLE`` and is
re-run from the start when the database answers a serialization failure (``40001``) or a
deadlock (``40P01``), up to :data:`MAX_RETRIES` times, so the same SQL is correct on
PostgreSQL-compatible distributed engines. A step that is one statement runs as that statement
alone (:meth:`PostgresPool.statement`, autocommit): it is its own transaction, at
``SERIALIZABLE`` too (every pooled session sets ``default_transaction_isolation``), and committed
(durably, with ``synchronous_commit``) when its answer arrives, without the ``BEGIN`` and
``COMMIT`` round trips.

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
runs once more on a new one. ``PostgresPool.open(server_watch=...)`` awaits a check with every
new connection before it is used (``state/lostwrites.py``: a server that went back in time).

Callers: ``state/pgstore.py`` (:class:`~agentsafe.executor.state.pgstore.PostgresStore` is a
pool with its three faces), ``state/pgattempts.py``, ``state/backend.py`` (``check_store_url``),
``tools/store_cli.py`` (``migrate_url``).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import select
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Final, Self, TypeVar

import psycopg
from psycopg import errors as pgerrors
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from ..codes import Code
from ..errors import ConfigError, StoreError
from .pgschema import SCHEMA_VERSION, migrate
from .records import consumption_token

__all__ = [
    "HELD_KEY",
    "MAX_RETRIES",
    "NOW",
    "Conn",
    "HeldKey",
    "PostgresPool",
    "Scope",
    "ServerWatch",
    "cancelled",
    "check_store_url",
    "db_now",
    "migrate_url",
    "unavailable",
]

_T = TypeVar("_T")
Conn = psycopg.AsyncConnection[TupleRow]

MAX_RETRIES: Final = 20
"""Serialization failures re-run a transaction at most this many times before STORE_CONTENDED."""
_RETRY_STATES: Final = frozenset({"40001", "40P01"})
_WRONG_SERVER: Final = frozenset({"25006"})
"""A server that is not (or no longer) the primary: ``read_only_sql_transaction``, what a standby
or a server set read-only answers a write. Never a domain error: the connection is dropped and
the store is unavailable until the host list leads to a primary."""
ServerWatch = Callable[["psycopg.AsyncConnection[TupleRow]"], Awaitable[None]]
"""Awaited with every new connection before it is used (``state/lostwrites.py``)."""
NOW: Final = "extract(epoch from clock_timestamp())::double precision"
STILL_OPEN: Final = "state <> 'CLOSED'"
"""An attempt's row is open (the column holds only OPEN or CLOSED), said so that no index can
serve it. A statement about one attempt then reaches its row by the primary key alone. Said as
``state = 'OPEN'``, the planner scanned every open attempt through ``attempts_open`` (it judged
that range smaller than one primary-key probe), so each such statement took SERIALIZABLE read
locks on every open attempt, and under load nearly every concurrent attempt's write conflicted
with it: about one serialization failure per ALLOW at concurrency 16 (issue 34)."""

Scope = tuple[str, str, str]  # (tenant, principal, key)


@dataclass(slots=True, eq=False)
class HeldKey:
    """The key a request began (``idempotency_begin`` NEW), its holder token, and the answer the
    key took with its attempt's close, if it did.

    One object, shared by the request's task and its attempt's (the attempt's context is a copy
    of the request's, so both see the same object): the attempt's ATTEMPT_CLOSED, when it carries
    the answer, closes the attempt and completes the key in one statement
    (``SharedAttemptMirror``) and notes the response here; the request's
    ``idempotency_complete`` then has nothing left to send for that same response."""

    scope: Scope
    holder: str
    recorded: dict[str, Any] | None = None
    """The response the key took with the attempt's close (``None``: it has not)."""


HELD_KEY: ContextVar[HeldKey | None] = ContextVar("agentsafe_key_holder", default=None)
"""The key this task's request began and its holder token: the attempt it opens, in the task the
pipeline starts for it after the begin (which copies this context), is fenced by it, and only the
request's own task completes or frees the key."""


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


def cancelled() -> None:
    """Re-raise a cancellation psycopg turned into an error: a task cancelled mid-query (a
    SIGTERM's close) has psycopg cancel the query and raise ``QueryCanceled`` or an
    ``OperationalError``; reported as ``StoreError`` the cancellation was lost, and a loop
    that treats the store as unavailable (``Executor._store_health_loop``) ran on for ever."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def unavailable(exc: BaseException) -> StoreError:
    """The store's failure as ``StoreError``; a failure of a task being cancelled is re-raised
    as the cancellation (every conversion of a psycopg error passes here)."""
    cancelled()
    return StoreError(f"the shared store failed: {type(exc).__name__}", code=Code.STORE_UNAVAILABLE)


async def _connect(url: str, *, connect_timeout: float) -> Conn:
    try:
        return await psycopg.AsyncConnection.connect(
            url, autocommit=True, connect_timeout=max(1, int(connect_timeout))
        )
    except psycopg.Error as exc:
        raise unavailable(exc) from None


async def migrate_url(url: str, *, connect_timeout: float = 10.0) -> tuple[int, int]:
    """Apply the migrations to the database at ``url`` (``agentsafe store migrate``)."""
    conn = await _connect(url, connect_timeout=connect_timeout)
    try:
        try:
            return await migrate(conn)
        except psycopg.Error as exc:
            raise unavailable(exc) from None
    finally:
        await conn.close()


class PostgresPool:
    """One pool and the transaction discipline every face shares. Construct with :meth:`open`."""

    def __init__(
        self,
        pool: AsyncConnectionPool[Conn],
        secret: bytes,
        timeout: float,
        *,
        url: str,
        lease_seconds: float = 30.0,
    ) -> None:
        self._pool = pool
        self._secret = secret
        self._timeout = timeout
        self._url = url
        self._ping_conn: Conn | None = None
        """The ping's own connection, outside the pool (:meth:`ping`)."""
        self.lease_seconds = lease_seconds
        """How long a key's holder has to open its attempt before a retry may take the key."""
        self._closed = False

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        max_connections: int = 10,
        connect_timeout: float = 5.0,
        lease_seconds: float = 30.0,
        server_watch: ServerWatch | None = None,
    ) -> Self:
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
                raise unavailable(exc) from None
        finally:
            await conn.close()
        secret = bytes(row[0]) if row is not None else b""
        if len(secret) < 32:
            raise StoreError("the shared store's key is damaged", code=Code.STORE_UNAVAILABLE)

        async def configure(conn: Conn) -> None:
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

        pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
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
        return cls(pool, secret, connect_timeout, url=url, lease_seconds=lease_seconds)

    @property
    def schema_version(self) -> int:
        return SCHEMA_VERSION

    async def _checkout(self) -> Conn:
        """A pooled connection the server has not dropped while it idled in the pool: one that
        is closed or has input waiting (a restart sends its FATAL and closes; nothing else
        speaks unasked on these sessions) is closed, so the pool drops it, and another taken.
        Nothing was sent on it, so this changes nothing. One ``poll``, no round trip. The caller
        hands it back with :meth:`_checkin`."""
        for _ in range(_MAX_STALE):
            conn = await self._pool.getconn(timeout=self._timeout)
            if not _spoke_while_idle(conn):
                return conn
            await conn.close()
            await self._pool.putconn(conn)
        raise StoreError("the shared store keeps dropping connections", code=Code.STORE_UNAVAILABLE)

    async def _checkin(self, conn: Conn, exc: BaseException | None) -> None:
        """Hand ``conn`` back to the pool (which resets or replaces one left in a transaction or
        broken). After a refusal from a server that is no longer the primary (read-only, or in
        recovery), this connection and every other pooled one lead to it, so all are dropped
        and the next are opened through the host list (``target_session_attrs=read-write``) to
        the new primary."""
        try:
            if isinstance(exc, psycopg.Error) and exc.sqlstate in _WRONG_SERVER:
                await conn.close()
                await self._pool.drain()
        finally:
            await self._pool.putconn(conn)

    @contextlib.asynccontextmanager
    async def _checked_out(self) -> AsyncIterator[Conn]:
        """:meth:`_checkout`, and :meth:`_checkin` after, told of any error. A statement on its
        own uses it as it stands: an autocommit statement leaves no transaction to commit or roll
        back (the pool resets a connection that is not idle), so the connection's own context,
        whose exit checks for a COMMIT under the connection's lock, would be one more wait per
        statement for nothing."""
        conn = await self._checkout()
        failure: BaseException | None = None
        try:
            yield conn
        except BaseException as exc:
            failure = exc
            raise
        finally:
            await self._checkin(conn, failure)

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[Conn]:
        """:meth:`_checked_out` for a transaction: the connection's own context (commit, or roll
        back on an error) inside."""
        async with self._checked_out() as conn, conn:
            yield conn

    async def transaction(self, fn: Callable[[Conn], Awaitable[_T]]) -> _T:
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
                cancelled()
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
                raise unavailable(exc) from None
            except PoolTimeout as exc:
                cancelled()
                raise unavailable(exc) from None
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
                async with self._checked_out() as conn:  # not the connection's context
                    cur = await conn.execute(sql, params)
                    row = await cur.fetchone() if cur.description is not None else None
                    return cur.rowcount, row
            except psycopg.Error as exc:
                cancelled()
                if exc.sqlstate in _RETRY_STATES:
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 0.1)
                    continue
                if exc.sqlstate in _WRONG_SERVER and not refused_retried:
                    # Refused before it ran (the server is not the primary): nothing committed,
                    # so it runs once more, on a connection to the new primary.
                    refused_retried = True
                    continue
                raise unavailable(exc) from None
            except PoolTimeout as exc:
                cancelled()
                raise unavailable(exc) from None
        raise StoreError(
            "the shared store stayed contended; try again", code=Code.STORE_UNAVAILABLE
        )

    async def ping(self) -> bool:
        """True when the primary answers now (``GET /ready``, the store-health loop).

        The ping has one connection of its own, outside the pool: a pool whose connections are
        all busy with a burst is backpressure (requests wait their turn), never "the store is
        down". A pooled ping queued behind a burst of 300 proposals outlived the health loop's
        one-second deadline, and the next proposal was answered 503 STORE_UNAVAILABLE. The
        connection goes through the same host list as the pool's, so after a failover it reaches
        the new primary; a server in recovery (a standby, a demoted primary) is not an answer."""
        try:
            return await self._ping_once()
        except StoreError:
            cancelled()  # a cancelled ping is a cancellation, never "the store is down"
            return False

    async def _ping_once(self) -> bool:
        conn = self._ping_conn
        if conn is None or conn.closed:
            conn = self._ping_conn = await _connect(self._url, connect_timeout=self._timeout)
        try:
            cur = await conn.execute("SELECT pg_is_in_recovery()")
            row = await cur.fetchone()
        except BaseException as exc:  # a failed or cut-short ping leaves no connection behind
            await self._drop_ping()
            if isinstance(exc, psycopg.Error):
                raise unavailable(exc) from None
            raise
        if row is None or row[0]:
            await self._drop_ping()
            return False
        return True

    async def _drop_ping(self) -> None:
        conn, self._ping_conn = self._ping_conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    async def now(self) -> float:
        """The database's clock, the one every replica's leases and windows are measured on."""

        async def work(conn: Conn) -> float:
            return await db_now(conn)

        return await self.transaction(work)

    def token(
        self, namespace: str, key: str, nonce: str, consumed_at: float, binding_digest: str
    ) -> str:
        return consumption_token(self._secret, namespace, key, nonce, consumed_at, binding_digest)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._drop_ping()
        await self._pool.close()


_MAX_STALE: Final = 64
"""Dropped pooled connections discarded for one transaction before STORE_UNAVAILABLE."""


def _spoke_while_idle(conn: Conn) -> bool:
    """True when an idle connection is closed or has input waiting."""
    pgconn = conn.pgconn
    if conn.closed or pgconn.status != psycopg.pq.ConnStatus.OK:
        return True
    poller = select.poll()
    poller.register(pgconn.socket, select.POLLIN)
    return bool(poller.poll(0))


async def db_now(conn: Conn) -> float:
    cur = await conn.execute(f"SELECT {NOW}")
    row = await cur.fetchone()
    assert row is not None
    return float(row[0])
