"""Writing files that survive a crash: every byte written, and the directory entry made durable.

``os.write`` may write fewer bytes than it was given (a signal, a nearly full disk), and a new or
renamed file is durable only once its directory is fsync'd. :func:`write_all` loops until every
byte is written and releases its view of the buffer (so a ``bytearray`` holding key material can
be wiped afterwards); :func:`fsync_directory` syncs a directory. The callers fsync the file itself
where they need to.

Callers: ``state/journal.py`` (the lock, the identity), ``state/journalwriter.py`` (records, new
day files), ``evidence/chain.py`` (chain heads), ``evidence/plan_audit.py`` (plan audit lines),
``evidence/bundle.py`` (bundle files), ``host/tlsctx.py`` (the fallback key file).
Also imported by ``supervisor.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_directory", "write_all"]


def write_all(fd: int, data: bytes | bytearray) -> None:
    """Write every byte of ``data`` to ``fd``; raises ``OSError`` as ``os.write`` does."""
    view = memoryview(data)
    try:
        while view:
            written = os.write(fd, view)
            view = view[written:]
    finally:
        view.release()


def fsync_directory(path: Path) -> None:
    """Make the entries of directory ``path`` (a file created or renamed in it) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
