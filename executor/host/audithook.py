"""The process guard: a PEP 578 audit hook that refuses egress, child processes and stray writes.

Callers: ``serve`` installs it first, before configuration is read (:func:`install_guard`), and
hands :meth:`Guard.self_test` to the posture check (SOCKET_GUARD_ABSENT, CHILD_PROCESS_ALLOWED,
FS_WRITE_OUTSIDE_STATE); the guarded egress client wraps its connects in :func:`allowed_egress`.
Also imported by ``assembly.py``, ``egress/guard.py``, ``posture.py``, ``proxy.py``, ``serve.py``,
``tools/doctor.py``.

Once installed the hook cannot be removed (``sys.addaudithook`` has no inverse) and it refuses,
by raising :class:`GuardRefused` (a ``PermissionError``) from the audited operation:

- ``socket.connect`` (and ``connect_ex``) anywhere outside :func:`allowed_egress`, whatever the
  address family or destination, and every send that names its own destination: ``sendto`` and
  ``sendmsg`` with an address (an unconnected UDP datagram, a TCP Fast Open ``sendto`` with
  ``MSG_FASTOPEN``, which connects and sends in one call). Accepting connections on the listener
  is not a connect and is never refused; neither is ``socket.socketpair`` (asyncio's self-pipe)
  nor a send on a connected socket.
- every way of starting a program: ``subprocess.Popen``, ``os.system``, ``os.exec*``,
  ``os.posix_spawn*``, ``os.spawn*``, ``os.fork``, ``os.forkpty``, ``pty.spawn``.
- opening a file for writing (``open``/``io.open`` with ``w``, ``a``, ``x`` or ``+``; ``os.open``
  with a write, create, append or truncate flag) and the path-changing calls (rename/replace,
  remove/unlink, rmdir, mkdir, link, symlink, truncate, chmod, chown, utime, mknod, mkfifo,
  set/removexattr, the ``shutil`` tree operations, ``sqlite3.connect``) whose target does not
  resolve inside one of the writable directories. ``/dev/null`` is always writable. A
  ``sqlite3.connect`` name is read as SQLite reads it: a ``file:`` URI by its decoded path and
  its last ``mode`` parameter (``?x=mode=memory`` is a parameter ``x``, not an in-memory
  database), a ``vfs`` parameter refused, and, where the library does not read every ``file:``
  name as a URI, the same name as a literal file in the working directory.

What a PEP 578 hook cannot stop is in docs/posture.md: native code calling libc directly (C
extensions, ``ctypes``, ``cffi``), and any in-process code that deliberately enters
:func:`allowed_egress`. The guard keeps the process's own libraries honest; the container's
seccomp profile, read-only root and network policy are what bind a hostile one.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import unquote

from ..codes import Code
from ..errors import AgentSafeError

__all__ = [
    "GUARD_CHECKS",
    "Guard",
    "GuardError",
    "GuardRefused",
    "allowed_egress",
    "install_guard",
    "installed_guard",
]

GUARD_CONNECT_REFUSED: Final = Code.GUARD_CONNECT_REFUSED
GUARD_CHILD_PROCESS_REFUSED: Final = Code.GUARD_CHILD_PROCESS_REFUSED
GUARD_FS_WRITE_REFUSED: Final = Code.GUARD_FS_WRITE_REFUSED

SOCKET_GUARD_ABSENT: Final = "SOCKET_GUARD_ABSENT"
CHILD_PROCESS_ALLOWED: Final = "CHILD_PROCESS_ALLOWED"
FS_WRITE_OUTSIDE_STATE: Final = "FS_WRITE_OUTSIDE_STATE"
GUARD_CHECKS: Final = (SOCKET_GUARD_ABSENT, CHILD_PROCESS_ALLOWED, FS_WRITE_OUTSIDE_STATE)

_EGRESS: contextvars.ContextVar[bool] = contextvars.ContextVar("agentsafe_egress", default=False)

_CHILD_EVENTS: Final = frozenset(
    {
        "subprocess.Popen",
        "os.system",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.fork",
        "os.forkpty",
        "pty.spawn",
        "os.startfile",
    }
)

# Path-changing events: the positions of the path arguments that must be inside a writable
# directory, and the position of their ``dir_fd`` argument (or None).
_PATH_EVENTS: Final[Mapping[str, tuple[tuple[int, ...], tuple[int | None, ...]]]] = {
    "os.rename": ((0, 1), (2, 3)),
    "os.remove": ((0,), (1,)),
    "os.rmdir": ((0,), (1,)),
    "os.mkdir": ((0,), (2,)),
    "os.link": ((1,), (3,)),
    "os.symlink": ((1,), (2,)),
    "os.truncate": ((0,), (None,)),
    "os.chmod": ((0,), (2,)),
    "os.chown": ((0,), (3,)),
    "os.utime": ((0,), (3,)),
    "os.mknod": ((0,), (3,)),
    "os.mkfifo": ((0,), (2,)),
    "os.setxattr": ((0,), (None,)),
    "os.removexattr": ((0,), (None,)),
    "os.chflags": ((0,), (None,)),
    "os.lchflags": ((0,), (None,)),
    "shutil.copyfile": ((1,), (None,)),
    "shutil.copymode": ((1,), (None,)),
    "shutil.copystat": ((1,), (None,)),
    "shutil.copytree": ((1,), (None,)),
    "shutil.move": ((0, 1), (None, None)),
    "shutil.rmtree": ((0,), (1,)),
    "shutil.chown": ((0,), (None,)),
}

_WRITE_FLAGS: Final = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_ALWAYS_WRITABLE: Final = frozenset({"/dev/null"})

# Sends that name their own destination (audited with the address; ``None`` on a connected
# socket, whose connect was checked).
_SEND_EVENTS: Final = frozenset({"socket.sendto", "socket.sendmsg"})

_WATCHED: Final = frozenset(
    {"socket.connect", "open", "sqlite3.connect"} | _CHILD_EVENTS | _SEND_EVENTS
) | frozenset(_PATH_EVENTS)


class GuardError(AgentSafeError):
    """The guard could not be installed (a second install, or bad writable directories)."""

    code = Code.GUARD_INVALID


class GuardRefused(AgentSafeError, PermissionError):
    """An operation the guard forbids; ``code`` says which kind, ``event`` the audit event.
    Also a ``PermissionError``, so the refused operation fails as the OS would refuse it."""

    def __init__(self, code: Code, event: str) -> None:
        super().__init__(f"{code}: {event} refused by the process guard", code=code)
        self.event = event


@contextlib.contextmanager
def allowed_egress() -> Iterator[None]:
    """Let connects made in this context (task, thread) through; only the egress client enters.

    asyncio tasks and ``asyncio.to_thread`` copy the context, so a connection opened by a task
    the egress client starts inside the block is allowed too.
    """
    token = _EGRESS.set(True)
    try:
        yield
    finally:
        _EGRESS.reset(token)


@dataclass(frozen=True)
class Guard:
    """An installed guard: its writable directories and its self-test."""

    writable_dirs: tuple[Path, ...]

    def self_test(self) -> dict[str, bool]:
        """Try each forbidden operation once; ``True`` for a check whose refusal was observed.

        The keys are the posture checks SOCKET_GUARD_ABSENT, CHILD_PROCESS_ALLOWED and
        FS_WRITE_OUTSIDE_STATE. An operation that succeeds, or fails for any other reason than
        the guard, fails its check (fail closed).
        """
        return run_self_test(self.writable_dirs)


_installed: Guard | None = None
_install_lock = threading.Lock()


def installed_guard() -> Guard | None:
    """The guard this process installed, if any."""
    return _installed


def install_guard(
    *,
    writable_dirs: Iterable[Path],
    allow_connect: Callable[[], bool] | None = None,
) -> Guard:
    """Install the audit hook for the rest of the process's life; a second call is refused.

    ``writable_dirs`` (journal, state, evidence) are resolved now: a write is allowed when its
    resolved target lies inside one of them. ``allow_connect``, if given, is consulted for a
    connect outside :func:`allowed_egress` and may allow it (tests, a future sidecar).
    """
    global _installed
    dirs: list[str] = []
    for d in writable_dirs:
        real = os.path.realpath(d)
        if not os.path.isabs(real) or real == os.sep:
            raise GuardError(f"writable directory {d} is not an absolute directory below /")
        dirs.append(real)
    with _install_lock:
        if _installed is not None:
            raise GuardError(
                "the process guard is already installed", code=Code.GUARD_ALREADY_INSTALLED
            )
        hook = _make_hook(tuple(dirs), allow_connect)
        sys.addaudithook(hook)
        _installed = Guard(writable_dirs=tuple(Path(d) for d in dirs))
        return _installed


def _make_hook(
    dirs: tuple[str, ...], allow_connect: Callable[[], bool] | None
) -> Callable[[str, tuple[Any, ...]], None]:
    prefixes = tuple(d + os.sep for d in dirs)
    dirset = frozenset(dirs)
    watched = _WATCHED
    child_events = _CHILD_EVENTS
    path_events = _PATH_EVENTS
    write_flags = _WRITE_FLAGS
    always = _ALWAYS_WRITABLE
    egress = _EGRESS
    send_events = _SEND_EVENTS
    uri_always = _sqlite_reads_uris_always()
    realpath = os.path.realpath
    fspath = os.fspath
    fsdecode = os.fsdecode

    def inside(path: Any, dir_fd: Any = None) -> bool:
        if isinstance(path, int):  # an already-open descriptor: its creation was checked
            return True
        text = fsdecode(fspath(path))
        if dir_fd is not None and not os.path.isabs(text):
            try:
                base = os.readlink(f"/proc/self/fd/{int(dir_fd)}")
            except (OSError, ValueError, TypeError):
                return False
            text = os.path.join(base, text)
        real = realpath(text)
        return real in always or real in dirset or real.startswith(prefixes)

    def refuse(code: Code, event: str) -> None:
        raise GuardRefused(code, event)

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event not in watched:
            return
        if event == "open":
            path, mode, flags = args[0], args[1], args[2]
            if isinstance(mode, str):
                writing = "w" in mode or "a" in mode or "x" in mode or "+" in mode
            else:
                writing = isinstance(flags, int) and bool(flags & write_flags)
            if writing and path is not None and not inside(path):
                refuse(GUARD_FS_WRITE_REFUSED, event)
        elif event == "socket.connect":
            if not egress.get() and not (allow_connect is not None and allow_connect()):
                refuse(GUARD_CONNECT_REFUSED, event)
        elif event in child_events:
            refuse(GUARD_CHILD_PROCESS_REFUSED, event)
        elif event == "sqlite3.connect":
            database = args[0] if args else None
            if not _sqlite_allowed(database, inside, uri_always=uri_always):
                refuse(GUARD_FS_WRITE_REFUSED, event)
        elif event in send_events:
            # An unconnected datagram (UDP sendto/sendmsg) or TCP Fast Open (sendto with
            # MSG_FASTOPEN) reaches an address without a connect: the same rule as connect.
            address = args[1] if len(args) > 1 else None
            allowed = egress.get() or (allow_connect is not None and allow_connect())
            if address is not None and not allowed:
                refuse(GUARD_CONNECT_REFUSED, event)
        else:
            positions, fds = path_events[event]
            for pos, fd_pos in zip(positions, fds, strict=True):
                if pos >= len(args) or args[pos] is None:
                    continue
                dir_fd = args[fd_pos] if fd_pos is not None and fd_pos < len(args) else None
                if not inside(args[pos], dir_fd):
                    refuse(GUARD_FS_WRITE_REFUSED, event)

    return hook


def _sqlite_reads_uris_always() -> bool:
    """True when this SQLite library reads a ``file:`` name as a URI whatever ``uri=`` says
    (compiled with ``SQLITE_USE_URI``); asked once, before the hook is installed."""
    try:
        connection = sqlite3.connect(":memory:")
        try:
            options = {row[0] for row in connection.execute("PRAGMA compile_options")}
        finally:
            connection.close()
    except sqlite3.Error:
        return False
    return "USE_URI" in options or "USE_URI=1" in options


def _sqlite_allowed(database: Any, inside: Callable[[Any], bool], *, uri_always: bool) -> bool:
    """Whether ``sqlite3.connect(database)`` can write only inside the writable directories.

    The audit event does not say whether ``uri=True`` was passed, so a ``file:`` name must be
    safe both ways: as a URI (SQLite's own reading: percent-decoded, parameters split on ``&``
    and ``=``, the last ``mode`` wins, a ``vfs`` is refused since it decides where bytes go) and,
    unless this library reads every ``file:`` name as a URI, as a literal file name relative to
    the working directory. ``""`` and ``:memory:`` are private databases SQLite itself keeps.
    """
    if database is None:
        return True
    text = os.fsdecode(os.fspath(database))
    if text in ("", ":memory:"):
        return True
    if not text.startswith("file:"):
        return inside(text)
    if not uri_always and not inside(text):
        return False
    return _sqlite_uri_allowed(text[5:], inside)


def _sqlite_uri_allowed(rest: str, inside: Callable[[Any], bool]) -> bool:
    rest = rest.split("#", 1)[0]
    raw_path, _, query = rest.partition("?")
    mode: str | None = None
    for parameter in query.split("&") if query else ():
        key, _, value = parameter.partition("=")
        key, value = unquote(key), unquote(value)
        if key == "vfs":
            return False
        if key == "mode":
            mode = value
    if mode == "memory":
        return True
    path = unquote(raw_path)
    if path.startswith("//"):
        authority, slash, remainder = path[2:].partition("/")
        if authority not in ("", "localhost") or not slash:
            return False
        path = "/" + remainder
    return path not in ("", ":memory:") and inside(path)


def run_self_test(writable_dirs: Sequence[Path]) -> dict[str, bool]:
    """Try a raw connect and an unconnected datagram, a child process and a stray write; ``True``
    where the guard refused."""
    return {
        SOCKET_GUARD_ABSENT: _probe_connect(),
        CHILD_PROCESS_ALLOWED: _probe_child(),
        FS_WRITE_OUTSIDE_STATE: _probe_write(writable_dirs),
    }


def _refused_by_guard(exc: BaseException) -> bool:
    return isinstance(exc, GuardRefused)


def _probe_connect() -> bool:
    return _probe_stream_connect() and _probe_datagram()


def _probe_stream_connect() -> bool:
    # A loopback port that is bound but not listening: without the guard the kernel refuses.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        try:
            probe = socket.create_connection(("127.0.0.1", port), timeout=2)
        except OSError as exc:
            return _refused_by_guard(exc)
        probe.close()
        return False


def _probe_datagram() -> bool:
    # A datagram to a loopback socket of our own: without the guard it is simply delivered.
    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sink,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe,
    ):
        sink.bind(("127.0.0.1", 0))
        try:
            probe.sendto(b"agentsafe-guard-probe", sink.getsockname())
        except OSError as exc:
            return _refused_by_guard(exc)
        return False


def _probe_child() -> bool:
    try:
        subprocess.run(["true"], check=False, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        return _refused_by_guard(exc)
    return False


def _probe_write(writable_dirs: Sequence[Path]) -> bool:
    allowed = [os.path.realpath(d) for d in writable_dirs]
    # Not tempfile.gettempdir(): under the guard its own write probe is refused.
    candidates = [
        tempfile.tempdir,
        os.environ.get("TMPDIR"),
        "/tmp",  # noqa: S108 - a probe location, never a temporary file
        "/var/tmp",  # noqa: S108
        os.getcwd(),
        os.sep,
    ]
    for base in candidates:
        if not base or not os.path.isdir(base):
            continue
        real = os.path.realpath(base)
        if any(real == d or real.startswith(d + os.sep) for d in allowed):
            continue
        target = os.path.join(real, f".agentsafe-guard-probe-{uuid.uuid4().hex}")
        try:
            with open(target, "xb"):
                pass
        except OSError as exc:
            return _refused_by_guard(exc)
        with contextlib.suppress(OSError):
            os.remove(target)
        return False
    return False
