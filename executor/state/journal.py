"""The attempt journal: what this process was about to do, on disk before it does it.

Role: an execution nobody can reconcile afterwards is worse than a refusal, so every attempt is
written down at each step and flushed to the device before the step continues:

=================  =============================================================================
ATTEMPT_OPENED     after the authority allows, before execution: identifiers, the caller, action,
                   the grant's id and expiry, and the captured intent binding verbatim
GRANT_CLAIMED      after the grant is consumed, before the provider is touched: grant id, expiry,
                   digest of what is about to be sent (written by the attempt between the
                   seam's prepare and run)
ATTEMPT_CLOSED     once the outcome is known: outcome, executed, finalization, and the answer the
                   caller was given (replayed to a retry whose key the crash left in flight)
RECONCILED         when a lost outcome is resolved: status, and RESTART, LEASE, RECHECK,
                   CALLER or OPERATOR
=================  =============================================================================

Layout: ``<EXECUTOR_JOURNAL_DIR>/attempts/YYYY-MM-DD.jsonl`` (UTC day of the record), one line of
RFC 8785 canonical JSON per record, directory 0700, files 0600, append-only. One writer thread
drains a queue: it writes every pending line, fsyncs once and only then resolves the appends it
wrote (group commit), so an ``await journal.opened(...)`` that returned is on the device. A record
over 256 KiB is refused, never truncated. A directory lock keeps a second process out
(JOURNAL_LOCKED). ``attempts/.identity`` names this journal (the owner recorded with each
idempotency key it starts), and ``attempts/.days`` lists every day file the writer created, so a
day file deleted behind the journal's back is found (``missing_days``) rather than silently lost.

A write or fsync that fails leaves the journal failed (:attr:`AttemptJournal.failed`): every
later append is refused JOURNAL_UNAVAILABLE until :meth:`AttemptJournal.recover` proves the
directory takes a synced write again. The failing append calls :attr:`AttemptJournal.on_failure`
before its caller sees the refusal, so the control plane halts at once (cause JOURNAL) and stays
halted meanwhile.

Reading back (:func:`scan_journal`) lists the attempts still open: opened, and neither closed nor
resolved by a closing RECONCILED (COMPLETED, NOT_EXECUTED, UNCLAIMED). An ATTEMPT_CLOSED whose
outcome is UNKNOWN_AFTER_DISPATCH does not close: an unknown outcome must be asked again. A torn
last line (a crash mid-write; never acknowledged) is tolerated and reported, and cut off before
the file is appended to again; any other damaged line is an error naming the file and line.
Every day file present is read, one line at a time (never a whole file in memory): retention
decides only what :meth:`AttemptJournal.prune` may delete, and a day file past retention that
still holds an open attempt is kept.

With a shared store (``EXECUTOR_STORE_URL``), an :class:`AttemptMirror` is handed in: after each
record is on the device, the same step is written to the shared store's open-attempt state (owner
and lease there), and the append returns only once both hold; a mirror that fails fails the append
(JOURNAL_UNAVAILABLE), so a GRANT_CLAIMED that cannot be made durable in the shared store stops the
attempt before dispatch. The mirror also keeps each held attempt's fencing token (issue 29),
handed to the attempt as the value of its ATTEMPT_OPENED append (:meth:`AttemptJournal.opened`).
Without a mirror an append hands back the writer's future itself (no journal frame waits on the
fsync, issue 32); the record is on the device all the same when it is done.

The records' vocabulary lives in ``state/journalrecords.py``, the reader in
``state/journalscan.py`` and the writer thread (group fsync) in ``state/journalwriter.py``; this
module writes through it, and re-exports the public names of the first two.

Callers: ``lifecycle/attempt.py`` (opened, which hands back the fence, grant_claimed, closed),
``lifecycle/pipeline.py`` (``POST /v1/reconciliations`` records reconciled by CALLER),
``lifecycle/reconcile.py`` (scan, reconciled), ``assembly.py`` (open), ``plane.py`` (close,
``GET /v1/control/open-attempts``).
Also imported by ``lifecycle/leases.py``, ``lostwrites.py``, ``pgattempts.py``, ``supervisor.py``.
Also imported by ``lifecycle/recovery.py``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import fcntl
import os
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractContextManager
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..canonical import canonical_json, sha256_digest
from ..clock import Clock, format_ms, utc_day
from ..codes import Code
from ..errors import AgentSafeError, JournalError
from ..host.durable import fsync_directory, write_all
from .journalrecords import (
    ATTEMPTS_DIR,
    CLOSING_STATUSES,
    DAY_FILE,
    DAYS_FILE,
    IDENTITY_FILE,
    LOCK_FILE,
    MAX_RECORD_BYTES,
    OPTIONAL,
    REQUIRED,
    SHARED_STORE,
    UNKNOWN_OUTCOME,
    AttemptMirror,
    JournalScan,
    OpenAttempt,
    ReconciledBy,
    ReconciledStatus,
    RecordType,
    Settled,
    TornLine,
)
from .journalscan import read_days, scan_journal
from .journalwriter import STOP, JournalWriter, Pending, Recover

if TYPE_CHECKING:
    from .records import AttemptFence

__all__ = [
    "ATTEMPTS_DIR",
    "CLOSING_STATUSES",
    "MAX_RECORD_BYTES",
    "SHARED_STORE",
    "AttemptJournal",
    "AttemptMirror",
    "JournalScan",
    "OpenAttempt",
    "ReconciledBy",
    "ReconciledStatus",
    "RecordType",
    "Settled",
    "TornLine",
    "scan_journal",
]


# -- writing -----------------------------------------------------------------------------------


class AttemptJournal:
    """The append side of the journal, plus reading back. Construct with :meth:`open`."""

    def __init__(
        self,
        root: Path,
        *,
        retain_days: int,
        clock: Clock,
        lock_fd: int,
        writer: JournalWriter,
        mirror: AttemptMirror | None = None,
        identity: str = "",
    ) -> None:
        self._root = root
        self.identity = identity
        """This journal's name: the owner recorded with every idempotency key it starts."""
        self._retain_days = retain_days
        self._clock = clock
        self._lock_fd = lock_fd
        self._writer = writer
        self._closed = False
        self._submitted = 0
        self._mirror = mirror
        self._live_open: set[str] = set()
        self._seeded = False
        self.on_failure: Callable[[], None] | None = None
        """Called (on the event loop) by the append whose write or fsync failed, the moment it
        fails: the control plane halts then, not at its next poll."""
        self.span: SpanFactory = _no_span
        """The span of each append (``assembly.py`` sets ``telemetry.span``): given, not
        imported, so that the supervisor, which reads the journal, never loads the SDK."""

    @classmethod
    async def open(
        cls,
        directory: Path,
        *,
        retain_days: int,
        clock: Clock,
        mirror: AttemptMirror | None = None,
    ) -> AttemptJournal:
        """Create ``directory/attempts`` (0700) if needed, take its lock, start the writer."""
        if retain_days < 1:
            raise JournalError("retain_days must be at least 1", code=Code.JOURNAL_CONFIG_INVALID)
        root = directory / ATTEMPTS_DIR
        lock_fd, identity = await asyncio.to_thread(_prepare_directory, directory, root)
        writer = JournalWriter(root, settle)
        writer.start()
        return cls(
            root,
            retain_days=retain_days,
            clock=clock,
            lock_fd=lock_fd,
            writer=writer,
            mirror=mirror,
            identity=identity,
        )

    @property
    def path(self) -> Path:
        """The ``attempts/`` directory."""
        return self._root

    @property
    def submitted(self) -> int:
        """How many records were handed to the writer (monitoring and tests)."""
        return self._submitted

    @property
    def open_count(self) -> int:
        """How many attempts are open now, kept live from this process's own appends over the
        open set its first :meth:`scan` read (start-up reconciliation scans before any work):
        the metrics gauge, without reading the day files at every scrape."""
        return len(self._live_open)

    def size_bytes(self) -> int:
        """The bytes of every day file (blocking: call it in a thread)."""
        total = 0
        with os.scandir(self._root) as entries:
            for entry in entries:
                if DAY_FILE.match(entry.name):
                    with contextlib.suppress(OSError):
                        total += entry.stat(follow_symlinks=False).st_size
        return total

    @property
    def failed(self) -> bool:
        """A write or fsync failed and no later :meth:`recover` succeeded: appends are refused."""
        return self._writer.failed

    async def recover(self) -> bool:
        """Try the directory again: a synced probe write, then the day file reopened (its torn
        tail cut). True when the journal takes records again."""
        if not self._writer.failed:
            return True
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._writer.submit(Recover(done))
        try:
            await asyncio.wrap_future(done)
        except OSError:
            return False
        return True

    @property
    def repaired_torn_lines(self) -> tuple[TornLine, ...]:
        """Torn last lines this process cut off before appending to their file."""
        return tuple(self._writer.repaired)

    def opened(
        self,
        *,
        attempt_id: str,
        intent_id: str,
        intent_hash: str,
        decision_id: str,
        dossier_id: str,
        caller: str,
        action: str,
        binding: Mapping[str, Any],
        grant_id: str | None = None,
        grant_expires_at: float | None = None,
    ) -> Awaitable[AttemptFence | None]:
        """ATTEMPT_OPENED, with the grant the attempt will claim (so a journal that lost its
        GRANT_CLAIMED can still be checked against the use store). ``binding`` must hash to
        ``intent_hash`` (refused otherwise, so the journal never holds an attempt that
        reconciliation would call a mismatch).

        Awaited, the record is durable (see :meth:`_append`) and the value is the attempt's
        fencing token: the shared store's (issue 29: the grant claim is made under it), ``None``
        without a mirror."""
        try:
            consistent = sha256_digest(binding) == intent_hash
        except AgentSafeError:
            consistent = False
        if not consistent:
            return _refused(
                JournalError(
                    "the binding does not hash to the intent hash",
                    code=Code.JOURNAL_RECORD_INVALID,
                )
            )
        fields: dict[str, Any] = {
            "attempt_id": attempt_id,
            "intent_id": intent_id,
            "intent_hash": intent_hash,
            "decision_id": decision_id,
            "dossier_id": dossier_id,
            "caller": caller,
            "action": action,
            "intent": binding,
        }
        if grant_id is not None:
            fields["grant_id"] = grant_id
        if grant_expires_at is not None:
            fields["grant_expires_at"] = format_ms(grant_expires_at)
        appended = self._append(RecordType.ATTEMPT_OPENED, fields)
        if self._mirror is None:
            return appended  # no fence without a shared store
        return _then_fence(appended, self._mirror, attempt_id)

    def grant_claimed(
        self, *, attempt_id: str, grant_id: str, expires_at: float, payload_digest: str
    ) -> Awaitable[None]:
        """GRANT_CLAIMED: written by the attempt after the seam prepared the execution and
        before the handler runs; durable once awaited."""
        return self._append(
            RecordType.GRANT_CLAIMED,
            {
                "attempt_id": attempt_id,
                "grant_id": grant_id,
                "grant_expires_at": format_ms(expires_at),
                "payload_digest": payload_digest,
                **({"store": SHARED_STORE} if self._mirror is not None else {}),
            },
        )

    def closed(
        self,
        *,
        attempt_id: str,
        outcome: str,
        executed: bool | None,
        finalization: str | None,
        answer: Mapping[str, Any] | None = None,
    ) -> Awaitable[None]:
        """Record the outcome, and the answer the caller is given (so a retry after a crash gets
        exactly it); durable once awaited. UNKNOWN_AFTER_DISPATCH is recorded but leaves the
        attempt open."""
        given: object = executed  # as given: a caller need not be type-checked
        if not isinstance(given, bool | None):
            return _refused(
                JournalError(
                    "field executed must be a boolean or null", code=Code.JOURNAL_RECORD_INVALID
                )
            )
        fields: dict[str, Any] = {
            "attempt_id": attempt_id,
            "outcome": outcome,
            "executed": executed,
            "finalization": finalization,
        }
        if answer is not None:
            fields["answer"] = dict(answer)
        return self._append(RecordType.ATTEMPT_CLOSED, fields)

    async def reconciled(
        self,
        *,
        attempt_id: str,
        status: str,
        by: str,
        reason: str | None = None,
        decided_by: str | None = None,
    ) -> None:
        try:
            status, by = ReconciledStatus(status).value, ReconciledBy(by).value
        except ValueError:
            raise JournalError(
                "unknown reconciliation status or source", code=Code.JOURNAL_RECORD_INVALID
            ) from None
        fields: dict[str, Any] = {"attempt_id": attempt_id, "status": status, "by": by}
        if reason is not None or decided_by is not None:
            fields.update(reason=reason, decided_by=decided_by)
        await self._append(RecordType.RECONCILED, fields)

    async def scan(self, wanted: frozenset[str] = frozenset()) -> JournalScan:
        """Read every day file back (see :func:`scan_journal`); for the attempt ids in
        ``wanted``, also whether they were opened and how they were settled."""
        scan = await asyncio.to_thread(
            scan_journal,
            self._root.parent,
            retain_days=self._retain_days,
            now=self._clock.now(),
            wanted=wanted,
        )
        if not self._seeded:
            self._seeded = True
            self._live_open.update(a.attempt_id for a in scan.open_attempts)
        return scan

    async def prune(self, scan: JournalScan | None = None) -> tuple[str, ...]:
        """Delete day files older than the retention window that hold no open attempt (an old
        file that still does is kept until the attempt closes). Returns the files deleted."""
        scan = scan if scan is not None else await self.scan()
        return await asyncio.to_thread(
            _prune_days,
            self._root,
            scan,
            retain_days=self._retain_days,
            now=self._clock.now(),
        )

    async def open_attempts(self) -> list[OpenAttempt]:
        return list((await self.scan()).open_attempts)

    async def close(self) -> None:
        """Finish every append already submitted, stop the writer and release the lock."""
        if self._closed:
            return
        self._closed = True
        self._writer.submit(STOP)
        await asyncio.to_thread(self._writer.join)
        os.close(self._lock_fd)

    def _append(self, kind: RecordType, fields: Mapping[str, Any]) -> Awaitable[None]:
        """One record, durable (and mirrored) once the returned awaitable is done; a span
        ``agentsafe.journal.append`` over it inside a traced request or reconciliation (never a
        trace of its own).

        Without a mirror and with no span recording, the awaitable is the writer's future
        itself: no frame of the journal stands between its caller and the fsync, so the caller
        is the first frame resumed once the record is on the device (issue 32). A record
        refused before it is written (a closed or failed journal, a field the reader would
        refuse) is a future already failed: the refusal surfaces where the caller awaits, as it
        did when every append was a coroutine. With a span (current over the append, as before)
        or a mirror (a second await), it is a coroutine, to be awaited at once: the span is
        entered here and ends in it."""
        manager = self.span(
            "agentsafe.journal.append", {"agentsafe.record": kind.value}, child_only=True
        )
        current = manager.__enter__()
        if current is not None or self._mirror is not None:
            span = contextlib.ExitStack()
            span.push(manager)  # the coroutine leaves it
            return self._append_spanned(span, current, kind, fields)
        manager.__exit__(None, None, None)  # nothing records this append
        try:
            _, written = self._submit(kind, fields)
        except JournalError as exc:
            return _refused(exc)
        return written

    async def _append_spanned(
        self, span: contextlib.ExitStack, current: Any, kind: RecordType, fields: Mapping[str, Any]
    ) -> None:
        """The append as a coroutine, inside the span :meth:`_append` entered (``current``, or
        ``None`` when nothing records it), the mirror's write after the record's fsync."""
        with span:
            try:
                record, written = self._submit(kind, fields)
                await written
                if self._mirror is not None:
                    try:
                        await self._mirror.record(kind, record)
                    except AgentSafeError as exc:
                        if exc.code == Code.IDEMPOTENCY_TAKEN_OVER:
                            raise  # the key is another request's now: the attempt must say so
                        raise JournalError(
                            f"the shared store did not take the record ({exc.code})",
                            code=Code.JOURNAL_UNAVAILABLE,
                        ) from None
            except AgentSafeError as exc:
                if current is not None:  # the span drops what its allow-list does not take
                    current.set_attribute("agentsafe.code", str(exc.code))
                raise
        if self._mirror is not None:
            self._note(kind, fields)

    def _submit(
        self, kind: RecordType, fields: Mapping[str, Any]
    ) -> tuple[dict[str, Any], asyncio.Future[None]]:
        """Check the record and hand its line to the writer: the record and the future the
        writer answers once the line is fsynced (raises ``JournalError`` for a record refused
        before it is written)."""
        if self._closed:
            raise JournalError("the journal is closed", code=Code.JOURNAL_CLOSED)
        if self._writer.failed:
            raise JournalError(
                "the journal failed and takes no records until its storage recovers",
                code=Code.JOURNAL_UNAVAILABLE,
            )
        for name in REQUIRED[kind]:
            if not isinstance(fields.get(name), str) or not fields[name]:
                raise JournalError(
                    f"field {name} must be a non-empty string", code=Code.JOURNAL_RECORD_INVALID
                )
        for name in OPTIONAL[kind]:
            if not isinstance(fields.get(name), str | None):
                raise JournalError(
                    f"field {name} must be a string or null", code=Code.JOURNAL_RECORD_INVALID
                )
        now = self._clock.now()
        record = {"record": kind.value, "at": format_ms(now), **fields}
        try:
            data = canonical_json(record)
        except AgentSafeError:
            raise JournalError(
                "the record has no canonical JSON form", code=Code.JOURNAL_RECORD_INVALID
            ) from None
        if len(data) > MAX_RECORD_BYTES:
            raise JournalError(
                f"a journal record may not exceed {MAX_RECORD_BYTES} bytes",
                code=Code.JOURNAL_RECORD_TOO_LARGE,
            )
        day = utc_day(now)
        loop = asyncio.get_running_loop()
        written: asyncio.Future[None] = loop.create_future()
        # Added before the caller awaits it, so it runs before the caller is resumed.
        written.add_done_callback(lambda done: self._answered(kind, fields, done))
        self._writer.submit(Pending(day, data + b"\n", loop, written))
        self._submitted += 1
        return record, written

    def _answered(
        self, kind: RecordType, fields: Mapping[str, Any], written: asyncio.Future[None]
    ) -> None:
        """On the event loop, once the writer answered an append whose caller still waits:
        the write or fsync that failed the journal calls :attr:`on_failure` (the control plane
        halts before the refusal reaches the caller); without a mirror, a durable record is
        noted in the open set (with one, once the mirror holds it too)."""
        if written.cancelled():
            return
        if written.exception() is not None:
            if self.failed and self.on_failure is not None:  # this write failed it
                self.on_failure()
        elif self._mirror is None:
            self._note(kind, fields)

    def _note(self, kind: RecordType, fields: Mapping[str, Any]) -> None:
        """A record now durable: the live open set (:attr:`open_count`) follows it."""
        if kind is RecordType.ATTEMPT_OPENED:
            self._live_open.add(fields["attempt_id"])
        elif (kind is RecordType.ATTEMPT_CLOSED and fields["outcome"] != UNKNOWN_OUTCOME) or (
            kind is RecordType.RECONCILED and fields["status"] in CLOSING_STATUSES
        ):
            self._live_open.discard(fields["attempt_id"])


def _refused(error: JournalError) -> asyncio.Future[Any]:
    """An append refused before it was written, as a future already failed (it raises where
    the caller awaits it)."""
    refused: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    refused.set_exception(error)
    return refused


async def _then_fence(
    appended: Awaitable[None], mirror: AttemptMirror, attempt_id: str
) -> AttemptFence | None:
    """ATTEMPT_OPENED with a mirror: once it holds, the fencing token the mirror keeps."""
    await appended
    return mirror.fence(attempt_id)


class SpanFactory(Protocol):
    """``telemetry.span``'s shape: a context manager yielding a span or None."""

    def __call__(
        self, name: str, attributes: Mapping[str, object], *, child_only: bool
    ) -> AbstractContextManager[Any]: ...


def _no_span(
    name: str, attributes: Mapping[str, object], *, child_only: bool
) -> AbstractContextManager[None]:
    del name, attributes, child_only
    return contextlib.nullcontext()


def _identity(root: Path) -> str:
    """This journal's name, created once (``attempts/.identity``)."""
    path = root / IDENTITY_FILE
    try:
        value = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        value = ""
    if re.fullmatch(r"[0-9a-f]{32}", value):
        return value
    value = uuid.uuid4().hex
    tmp = root / (IDENTITY_FILE + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        write_all(fd, value.encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_directory(root)
    return value


def _prepare_directory(directory: Path, root: Path) -> tuple[int, str]:
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        root.mkdir(mode=0o700, exist_ok=True)
        os.chmod(root, 0o700)
        lock_fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise JournalError(
            f"the journal directory is unusable: {exc.strerror}", code=Code.JOURNAL_UNAVAILABLE
        ) from None
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(lock_fd)
        raise JournalError("another process holds this journal", code=Code.JOURNAL_LOCKED) from None
    with contextlib.suppress(OSError):
        fsync_directory(directory)
    try:
        identity = _identity(root)
    except OSError as exc:
        os.close(lock_fd)
        raise JournalError(
            f"the journal directory is unusable: {exc.strerror}", code=Code.JOURNAL_UNAVAILABLE
        ) from None
    return lock_fd, identity


# -- reading -----------------------------------------------------------------------------------


def _prune_days(root: Path, scan: JournalScan, *, retain_days: int, now: float) -> tuple[str, ...]:
    """Delete day files before the retention window that hold no open attempt; ``.days`` is
    rewritten without them first, so a pruned file is never reported missing."""
    first_day = datetime.fromtimestamp(now, tz=UTC).date() - timedelta(days=retain_days - 1)
    holding = {attempt.file for attempt in scan.open_attempts}
    doomed = [
        label
        for label in scan.day_files
        if label not in holding and _day_of(Path(label).name[: -len(".jsonl")]) < first_day
    ]
    if not doomed:
        return ()
    gone = {Path(label).name[: -len(".jsonl")] for label in doomed}
    kept = [day for day in read_days(root) if day not in gone]
    tmp = root / (DAYS_FILE + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        write_all(fd, "".join(day + "\n" for day in kept).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, root / DAYS_FILE)
    fsync_directory(root)
    for label in doomed:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(root / Path(label).name)
    fsync_directory(root)
    return tuple(doomed)


def _day_of(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        return date.min


def settle(waiters: list[asyncio.Future[None]], error: str | None) -> None:
    """On the event loop: each append of a segment the writer answered, still waiting, takes the
    segment's outcome (the writer's :data:`~.journalwriter.Settle`; here, so that answering an
    append makes no call into the writer's module)."""
    for waiter in waiters:
        if waiter.done():
            continue
        if error is None:
            waiter.set_result(None)
        else:
            waiter.set_exception(JournalError(error, code=Code.JOURNAL_UNAVAILABLE))
