"""The SQLite engine under the embedded use store: one connection, one thread, group commits.

Role: :class:`SQLiteDatabase` owns one SQLite database in WAL mode with ``synchronous=FULL``
under ``EXECUTOR_STATE_DIR`` and the one thread that uses its connection. Writes are committed in
groups (one ``BEGIN IMMEDIATE ... COMMIT``, one fsync, a ``SAVEPOINT`` per write); reads run one at
a time between groups. Also the schema, its migrations and the store's secret. The domain lives
in ``state/usestore.py``, which builds on this class.

Callers: ``state/usestore.py`` (:class:`~agentsafe.executor.state.usestore.SQLiteUseStore`
and its window).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import secrets
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self, TypeVar

from ..clock import Clock
from ..codes import Code
from ..errors import StoreError

DATABASE_NAME = "usestore.sqlite3"
SCHEMA_VERSION = 2

_T = TypeVar("_T")
_log = logging.getLogger(__name__)

_MAX_GROUP = 256
"""At most this many writes share one transaction, so a group never holds the lock for long."""


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


_CEILING_WINDOW_TABLE = """CREATE TABLE IF NOT EXISTS ceiling_window (
    id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, amount_minor INTEGER NOT NULL)"""
"""The host ceilings' window shared by ``EXECUTOR_WORKERS`` workers (:class:`SQLiteWindow`);
created where missing on every open, whatever the schema version."""


class _StoreThread:
    """The one thread that uses the connection: it runs the jobs it is handed, one at a time, in
    the order they were handed over.

    A ``ThreadPoolExecutor`` of one worker did this before (issue 34): its ``submit`` made a
    ``concurrent.futures.Future``, a work item and a semaphore round on both threads for every
    group commit, about 8 us of Python a group, and at the concurrency a BLOCK sees most groups
    hold one write. A job is a plain callable on a ``queue.SimpleQueue``; what must answer the
    event loop (:meth:`call`) answers it itself. :meth:`submit` raises ``RuntimeError`` once
    :meth:`shutdown` began, as the executor's did."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._stopping = False
        self._thread = threading.Thread(target=self._serve, name="agentsafe-usestore", daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            if self._stopping:
                raise RuntimeError("the use store's thread is stopping")
            self._jobs.put(job)

    def call(self, fn: Callable[..., _T], *args: Any) -> asyncio.Future[_T]:
        """``fn(*args)`` on the thread, its result or exception in a future of the running loop
        (a future cancelled meanwhile keeps its cancellation)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_T] = loop.create_future()

        def job() -> None:
            try:
                outcome: tuple[bool, Any] = (True, fn(*args))
            except BaseException as exc:  # handed to the caller, as the executor's future did
                outcome = (False, exc)
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
                loop.call_soon_threadsafe(_answer, future, outcome)

        self.submit(job)
        return future

    def shutdown(self) -> None:
        """Let the jobs already handed over run, then end the thread and wait for it."""
        with self._lock:
            if not self._stopping:
                self._stopping = True
                self._jobs.put(None)
        self._thread.join()

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                job()
            except BaseException:  # a job's own failure never ends the thread
                _log.exception("a use store job failed")


def _answer(future: asyncio.Future[Any], outcome: tuple[bool, Any]) -> None:
    if future.done():
        return
    if outcome[0]:
        future.set_result(outcome[1])
    else:
        future.set_exception(outcome[1])


class SQLiteDatabase:
    """One SQLite database, its thread and its group commits; see the module docstring.

    Construct with :meth:`open`. One dedicated thread owns the connection; :meth:`_run` and
    :meth:`_write` hand it their work. Writes queue up and are committed in groups (one
    transaction, one fsync, a savepoint per write); processes serialise on the database's write
    lock (``BEGIN IMMEDIATE`` with a busy timeout).
    """

    def __init__(
        self,
        path: Path,
        connection: sqlite3.Connection,
        worker: _StoreThread,
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
    async def open(cls, state_dir: Path, *, clock: Clock, busy_timeout_s: float = 30.0) -> Self:
        """Open (creating if needed) the store under ``state_dir``, private to this user."""
        worker = _StoreThread()
        try:
            path, conn, secret = await worker.call(_open_database, state_dir, busy_timeout_s)
        except BaseException:
            worker.shutdown()
            raise
        return cls(path, conn, worker, secret, clock)

    async def _run(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        if self._closed:
            raise StoreError("the use store is closed", code=Code.STORE_CLOSED)
        return await self._worker.call(_guarded, self._conn, fn)

    def _write(self, fn: Callable[[sqlite3.Connection], _T]) -> asyncio.Future[_T]:
        """Queue ``fn`` for the next group commit; the future of its result, settled once that
        commit has returned.

        ``fn`` runs on the store's thread inside the group's transaction and its own savepoint;
        it must not begin, commit or roll back a transaction itself. A plain function that hands
        back the write's own future, not a coroutine: the caller awaits the future, so no frame
        of the store stands in its await chain while the commit runs (issue 32). A closed store
        is refused at the call (``STORE_CLOSED``); cancelling the future abandons the write
        unless its group already took it.
        """
        if self._closed:
            raise StoreError("the use store is closed", code=Code.STORE_CLOSED)
        loop = asyncio.get_running_loop()
        write = _Write(fn, loop, loop.create_future())
        with self._pending_lock:
            self._pending.append(write)
            if not self._drain_scheduled:
                try:
                    self._worker.submit(self._drain)
                except RuntimeError:  # the executor is shutting down
                    self._pending.remove(write)
                    raise StoreError("the use store is closed", code=Code.STORE_CLOSED) from None
                self._drain_scheduled = True
        return write.waiter

    def _take(self) -> list[_Write]:
        with self._pending_lock:
            batch = self._pending[:_MAX_GROUP]
            del self._pending[:_MAX_GROUP]
        return [write for write in batch if not write.waiter.cancelled()]

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
            stranded = [w for w in stranded if not w.waiter.cancelled()]
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

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._worker.call(self._close_connection)
        finally:
            self._worker.shutdown()


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


@dataclass(eq=False, slots=True)
class _Write:
    """One queued write: the work, the future its caller awaits on the event loop (``waiter``)
    and its outcome (``outcome``: ``(True, result)`` or ``(False, exception)``, set on the
    store's thread; ``None`` until then).

    The store's thread sets the outcome of every write of a group only after the group's
    COMMIT returned, then hands the whole group to each waiting loop in one
    ``call_soon_threadsafe`` (:func:`_deliver`): one cross-thread wakeup per group, not per
    write. A caller that gives up (``waiter`` cancelled) is seen by the store's thread when it
    takes the next group (:meth:`SQLiteDatabase._take` reads the waiter's state, which the GIL
    keeps whole), so a write not yet taken into a group is never applied; one already taken
    commits as it would have. A plain slot rather than a ``concurrent.futures.Future`` per write
    (issue 34): that future's condition variable, taken on every call, and the done callback
    that cancelled it cost about 10 us a write on the loop and the store's thread together."""

    fn: Callable[[sqlite3.Connection], Any]
    loop: asyncio.AbstractEventLoop
    waiter: asyncio.Future[Any]
    outcome: tuple[bool, Any] | None = None


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
        waiter = write.waiter
        if waiter.done():
            continue
        outcome = write.outcome
        if outcome is None:  # never settled (cannot happen): fail closed, never hang
            waiter.set_exception(StoreError("the use store failed", code=Code.STORE_UNAVAILABLE))
        elif outcome[0]:
            waiter.set_result(outcome[1])
        else:
            waiter.set_exception(outcome[1])


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
    COMMIT fails every write of the group.

    The first pass runs the writes without a savepoint each (:func:`_apply_plainly`): when no
    write raises, that is the same transaction with three statements fewer a write, each a
    release and a retaking of the GIL on this thread (issue 34). When one raises (or loses the
    transaction), the pass is rolled back and the group runs again, each write in its own
    savepoint (:func:`_apply`), so a write that fails leaves the others alone as before
    (nothing was acknowledged yet)."""
    remaining = list(group)
    apply = _apply_plainly
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
                    outcomes.append(apply(conn, write))
            except _SavepointsNeeded:
                _rollback_quietly(conn)
                apply = _apply
                continue
            except _TransactionLost as lost:
                _rollback_quietly(conn)
                culprit = remaining[len(outcomes)]
                culprit.outcome = (False, _unavailable(lost.cause))
                remaining = [w for w in remaining if w is not culprit]
                continue
            try:
                commit(conn)
            except Exception as exc:  # nothing of this group is durable
                _rollback_quietly(conn)
                _fail(remaining, _unavailable(exc))
                return
            for write, outcome in zip(remaining, outcomes, strict=True):
                write.outcome = outcome
            return
    except BaseException as exc:
        _rollback_quietly(conn)
        _fail([w for w in remaining if w.outcome is None], _unavailable(exc))
        raise


class _SavepointsNeeded(Exception):
    """A write of the first pass raised or lost the transaction: run the group in savepoints."""


def _apply_plainly(conn: sqlite3.Connection, write: _Write) -> tuple[bool, Any]:
    """Run one write in the group's transaction with no savepoint of its own: ``(True, result)``,
    or :class:`_SavepointsNeeded` when it raised an ``Exception`` or the transaction is gone."""
    try:
        value = write.fn(conn)
    except Exception:
        raise _SavepointsNeeded from None
    if not conn.in_transaction:  # lost under a write that did not raise
        raise _SavepointsNeeded
    return True, value


def _fail(writes: list[_Write], error: StoreError) -> None:
    for write in writes:
        write.outcome = (False, error)


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
