"""A short write that cannot wait, made without releasing the GIL.

Every system call the standard library makes releases the GIL around it, ``os.write`` and the
flush of a file object included. For a write that takes microseconds that release is a handoff:
while the event loop writes an evidence line, a thread waiting for the GIL (the use store's,
between its SQLite calls) takes it, and the loop then waits to get it back. Three lines per BLOCK
made three such handoffs. Writing them with the GIL held took the median CPU per BLOCK from 1.30
to 1.08 ms, and the use store thread's context switches from 4.9 to 2.5 per request (six
alternating pairs at concurrency 16; docs/performance.md, 2026-12-03 08:00-09:10).

No library writes without releasing the GIL, so this module is hand-written: ``ctypes.PyDLL`` is
the standard library's documented way to call a C function with the GIL held, and it calls
``poll(2)`` and ``write(2)`` of the C library the interpreter runs on. Each call raises the
``ctypes.call_function`` audit event, which the process guard (``host/audithook.py``) lets pass.

Only a write that cannot wait is made this way: at most ``PIPE_BUF`` bytes, to a pipe or a
regular file (:meth:`HeldDescriptor.open` refuses every other kind: a terminal's or a socket's
room can be smaller than a line when ``poll`` says writable) that ``poll(2)`` with no timeout
reports writable and not in error. Linux then takes the whole of it at once, without sleeping for
a reader: a writable pipe has a free page (this process being its only writer, as a container's
standard output is), and a regular file is always writable. Anything else writes nothing here and
returns 0: a longer line, a full pipe, an error, a signal, a non-blocking descriptor that would
wait, a C library that cannot be loaded. The caller then writes what is left the ordinary way,
which waits, or raises, as it always did.

Each call costs about 2.5 us more than ``os.write`` (measured: 4.2 against 1.7 us for a line of
540 bytes to a file), far less than the handoff it saves on a busy process.

Callers: ``evidence/chain.py`` (``LineWriter``: each line on the interpreter's standard output and
error).
"""

from __future__ import annotations

import ctypes
import os
import select
import stat
from collections.abc import Callable
from typing import Any, Final

__all__ = ["PIPE_BUF", "HeldDescriptor"]

PIPE_BUF: Final = select.PIPE_BUF
"""The longest write made here: what POSIX makes atomic on a pipe (4096 bytes on Linux)."""

_POLLOUT: Final = select.POLLOUT
_POLL_TROUBLE: Final = select.POLLERR | select.POLLHUP | select.POLLNVAL


class _PollFd(ctypes.Structure):
    _fields_ = (("fd", ctypes.c_int), ("events", ctypes.c_short), ("revents", ctypes.c_short))


def _bind() -> tuple[Callable[..., int], Callable[..., int]] | None:
    """``write`` and ``poll`` from the process's C library, called with the GIL held; None when
    they cannot be loaded (every write then takes the ordinary path)."""
    try:
        libc: Any = ctypes.PyDLL(None)
        write, poll = libc.write, libc.poll
    except (OSError, AttributeError):  # pragma: no cover - a platform without them
        return None
    write.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t)
    write.restype = ctypes.c_ssize_t
    poll.argtypes = (ctypes.c_void_p, ctypes.c_ulong, ctypes.c_int)
    poll.restype = ctypes.c_int
    return write, poll


_LIBC: Final = _bind()


class HeldDescriptor:
    """Held writes to one descriptor. Not thread-safe: its owner makes one write at a time
    (``LineWriter`` under its lock), since the ``pollfd`` it asks with is its own, made once."""

    __slots__ = ("_address", "_ready", "fd")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._ready = _PollFd(fd, _POLLOUT, 0)
        self._address = ctypes.addressof(self._ready)

    @classmethod
    def open(cls, fd: int) -> HeldDescriptor | None:
        """Held writes to ``fd`` if it is a pipe or a regular file and the C library could be
        loaded, else None (write the ordinary way)."""
        if _LIBC is None:
            return None
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            return None
        if stat.S_ISFIFO(mode) or stat.S_ISREG(mode):
            return cls(fd)
        return None

    def write(self, data: bytes) -> int:
        """Write ``data`` with the GIL held if that cannot wait; the bytes written.

        0 means nothing was written: the caller writes ``data`` the ordinary way. A count below
        ``len(data)`` (a regular file filling up) means the caller writes the rest that way."""
        if _LIBC is None or not data or len(data) > PIPE_BUF:
            return 0
        write, poll = _LIBC
        ready = self._ready
        if poll(self._address, 1, 0) != 1:
            return 0
        if ready.revents & _POLL_TROUBLE or not ready.revents & _POLLOUT:
            return 0
        written = write(self.fd, data, len(data))
        return written if written > 0 else 0
