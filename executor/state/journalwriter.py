"""The journal's writer: the one thread that appends records to the day files.

:class:`JournalWriter` drains what :class:`~.journal.AttemptJournal` submits (a :class:`Pending`
line, a :class:`Recover` request, :data:`STOP`), writes each day's lines of a batch with one
``write`` and one ``fsync``, and only then answers their futures, one wakeup per event loop
(group fsync), through the ``settle`` the journal hands it (:data:`Settle`, run on the loop). A
write or fsync that fails leaves the writer failed: it refuses every later line until a
:class:`Recover` proves the directory takes a synced write again. Opening a day file it did not
create cuts a torn last line (a crash mid-write) and reports it (:attr:`repaired`); creating one
records the day in ``.days``, synced. Carved out of ``journal.py`` (issue 32: no
module over 800 lines); the records, the rules and the reading stay there and in
``journalrecords.py`` / ``journalscan.py``.

Callers: ``state/journal.py`` (the only one: it makes the writer, submits to it and joins it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..host.durable import fsync_directory, write_all
from .journalrecords import ATTEMPTS_DIR, DAYS_FILE, TornLine

__all__ = ["STOP", "JournalWriter", "Pending", "Recover", "Settle"]


@dataclass(frozen=True)
class Pending:
    """One append: its line and the future its caller awaits on ``loop``.

    The writer settles a whole fsynced segment with one ``call_soon_threadsafe`` per loop
    (:func:`_acknowledge`), not one wakeup per record; a caller that stopped waiting leaves its
    record written all the same (it was submitted, so it is journaled)."""

    day: str
    data: bytes  # the line, newline included
    loop: asyncio.AbstractEventLoop
    waiter: asyncio.Future[None]


@dataclass(frozen=True)
class Recover:
    """Prove the directory takes a synced write again (``AttemptJournal.recover``)."""

    done: concurrent.futures.Future[None]


STOP = object()
"""Submitted last: the writer finishes what it holds, closes its file and ends."""


class JournalWriter(threading.Thread):
    """The one thread that touches the day files: drain, write, fsync once, acknowledge."""

    def __init__(self, root: Path, settle: Settle) -> None:
        super().__init__(name="agentsafe-journal", daemon=True)
        self._root = root
        self._settle = settle
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self.submit: Callable[[object], None] = self._queue.put
        """Hand the writer a :class:`Pending` line, a :class:`Recover` or :data:`STOP`: the
        queue's own ``put``, so an append makes no call into this module."""
        self._fd: int | None = None
        self._day: str | None = None
        self.failed = False
        """Whether a write or fsync failed (set on this thread; read by the journal before every
        append, as a plain attribute: no call into this module per record)."""
        self.repaired: list[TornLine] = []

    def run(self) -> None:
        stopping = False
        while not stopping:
            batch: list[Pending] = []
            item = self._queue.get()
            while True:
                if item is STOP:
                    stopping = True
                elif isinstance(item, Pending):
                    batch.append(item)
                elif isinstance(item, Recover):
                    if batch:
                        self._commit(batch)
                        batch = []
                    self._recover(item)
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            if batch:
                self._commit(batch)
        self._close_file()

    def _commit(self, batch: list[Pending]) -> None:
        index = 0
        while index < len(batch):
            day = batch[index].day
            end = index
            while end < len(batch) and batch[end].day == day:
                end += 1
            segment = batch[index:end]
            index = end
            if self.failed:
                _acknowledge(
                    segment, "the journal failed earlier and takes no more records", self._settle
                )
                continue
            try:
                fd = self._file_for(day)
                write_all(fd, b"".join(p.data for p in segment))
                os.fsync(fd)
            except OSError:
                # After a failed write or fsync the file's state is unknowable: stop for good.
                self.failed = True
                _acknowledge(segment, "the journal could not write a record", self._settle)
                continue
            _acknowledge(segment, None, self._settle)

    def _recover(self, item: Recover) -> None:
        """Prove the directory takes a synced write again; then the day file is reopened (and its
        torn tail cut) by the next append. A caller that already gave up is skipped (its future
        is cancelled; setting it would raise here and end this thread); once taken, it cannot be
        cancelled."""
        if not item.done.set_running_or_notify_cancel():
            return
        if not self.failed:
            item.done.set_result(None)
            return
        self._close_file()
        probe = self._root / ".probe"
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                write_all(fd, b"\0" * 4096)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.unlink(probe)
            fsync_directory(self._root)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(probe)
            item.done.set_exception(exc)
            return
        self.failed = False
        item.done.set_result(None)

    def _file_for(self, day: str) -> int:
        if self._fd is not None and self._day == day:
            return self._fd
        self._close_file()
        path = self._root / f"{day}.jsonl"
        created = not path.exists()
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(path, flags, 0o600)
        try:
            os.fchmod(fd, 0o600)
            if created:
                _note_day(self._root, day)
                fsync_directory(self._root)
            else:
                torn = _cut_torn_tail(fd, f"{ATTEMPTS_DIR}/{path.name}")
                if torn is not None:
                    self.repaired.append(torn)
        except BaseException:
            os.close(fd)
            raise
        self._fd, self._day = fd, day
        return fd

    def _close_file(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd, self._day = None, None


Settle = Callable[[list[asyncio.Future[None]], str | None], None]
"""Run on an event loop with the futures of one segment's appends made on it, and ``None`` (the
lines are written and fsynced) or the refusal's message (``journal.py``'s ``settle``)."""


def _acknowledge(segment: list[Pending], error: str | None, settle: Settle) -> None:
    """On the writer's thread: answer every append of ``segment`` (written and fsynced when
    ``error`` is None, else refused with that message), one wakeup per event loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
    for pending in segment:
        by_loop.setdefault(pending.loop, []).append(pending.waiter)
    for loop, waiters in by_loop.items():
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
            loop.call_soon_threadsafe(settle, waiters, error)


def _cut_torn_tail(fd: int, name: str) -> TornLine | None:
    """If the file does not end with a newline, truncate it after its last complete line."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return None
    content = os.pread(fd, size, 0)
    keep = content.rfind(b"\n") + 1
    line = content.count(b"\n", 0, keep) + 1
    os.ftruncate(fd, keep)
    os.fsync(fd)
    return TornLine(file=name, line=line, length=size - keep)


def _note_day(root: Path, day: str) -> None:
    """Append ``day`` to ``.days`` (synced): the list of day files the writer created."""
    fd = os.open(root / DAYS_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        write_all(fd, day.encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
