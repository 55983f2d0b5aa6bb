"""Secrets: read from mounted files into handles, checked, followed through rotation.

Callers: ``serve`` (loads the store after the posture check, re-reads it on SIGHUP and on
``POST /v1/control/secrets/reload``, runs :meth:`SecretStore.watch`), the caller authentication
(reads ``EXECUTOR_CALLER_TOKEN`` at each request), the TLS listener, the grant signer and verifier,
the downstream credential, the redactor (through :meth:`SecretStore.digests` and
:meth:`SecretStore.on_change`) and the posture check (through :func:`inspect_sources`).
Also imported by ``assembly.py``, ``egress/credentials.py``, ``posture.py``, ``plane.py``,
``tools/doctor.py``, ``tools/store_cli.py``.
Also imported by ``state/backend.py``.

Each secret is given as ``<NAME>_FILE`` (the path of a mounted file) or, outside production, as the
variable ``<NAME>``; never both, and in production only the file. A file must resolve (symlinks
followed, as Kubernetes mounts Secrets through ``..data`` links) to a regular file inside
``EXECUTOR_SECRETS_DIR`` and be either private to this process's user, or owned by root and
readable by one of this process's groups alone (a Secret volume mounted with ``fsGroup``).
Outside production with no ``EXECUTOR_SECRETS_DIR`` the containment check is skipped; the file's
type, owner and mode are still checked.

A value lives in a :class:`SecretHandle`: a ``bytearray`` that :meth:`SecretHandle.reveal` copies
out for the duration of one ``with`` block (the copy is zeroed when the block ends) and that
:meth:`SecretHandle.dispose` zeroes. A handle never becomes its value through ``str``, ``repr``,
``format``, pickling, copying, logging or JSON encoding.

Every error and event names the variable, the file and the check, never the value.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import stat
import threading
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, NoReturn, final

from ..codes import Code
from ..config import SECRET_NAMES
from ..errors import AgentSafeError, ConfigError
from ..events import EventSink

__all__ = [
    "DEFAULT_GRACE_SECONDS",
    "MAX_SECRET_BYTES",
    "SECRET_NAMES",
    "RefusedSecret",
    "ReloadReport",
    "SecretFinding",
    "SecretHandle",
    "SecretSource",
    "SecretStore",
    "SecretUnavailable",
    "inspect_sources",
    "unsafe_secrets_dir",
]


SECRETS_DIR_VARIABLE: Final = "EXECUTOR_SECRETS_DIR"
DEFAULT_GRACE_SECONDS: Final = 30.0
MAX_SECRET_BYTES: Final = 1024 * 1024
_READ_ATTEMPTS: Final = 3

# Finding codes. The first four are posture checks of the same name.
SECRET_IN_ENV: Final = Code.SECRET_IN_ENV
SECRET_FILE_OUTSIDE_DIR: Final = Code.SECRET_FILE_OUTSIDE_DIR
SECRET_FILE_MODE: Final = Code.SECRET_FILE_MODE
SECRET_FILE_OWNER: Final = Code.SECRET_FILE_OWNER
SECRET_BOTH_GIVEN: Final = Code.SECRET_BOTH_GIVEN
SECRET_DIR_REQUIRED: Final = Code.SECRET_DIR_REQUIRED
SECRET_DIR_INVALID: Final = Code.SECRET_DIR_INVALID
SECRET_DIR_UNSAFE: Final = Code.SECRET_DIR_UNSAFE
SECRET_FILE_UNREADABLE: Final = Code.SECRET_FILE_UNREADABLE
SECRET_FILE_TOO_LARGE: Final = Code.SECRET_FILE_TOO_LARGE
SECRET_FILE_UNSTABLE: Final = Code.SECRET_FILE_UNSTABLE
SECRET_EMPTY: Final = Code.SECRET_EMPTY


class SecretUnavailable(AgentSafeError):
    """A handle was revealed after disposal (it was rotated out and its grace ran out)."""

    code = Code.SECRET_DISPOSED


@final
class SecretHandle:
    """One version of one secret. The value is reachable only through :meth:`reveal`."""

    __slots__ = ("__weakref__", "_disposed", "_lock", "_value", "name", "version")

    name: str
    version: int

    def __init__(self, name: str, value: bytearray, *, version: int = 1) -> None:
        self.name = name
        self.version = version
        self._value = value
        self._lock = threading.Lock()
        self._disposed = False

    @contextlib.contextmanager
    def reveal(self) -> Iterator[bytearray]:
        """Yield a copy of the value, valid only inside the ``with`` block, zeroed after it."""
        with self._lock:
            if self._disposed:
                raise SecretUnavailable(f"secret {self.name} version {self.version} was disposed")
            copy = bytearray(self._value)
        try:
            yield copy
        finally:
            _zero(copy)

    def dispose(self) -> None:
        """Zero the value; every later :meth:`reveal` raises :class:`SecretUnavailable`."""
        with self._lock:
            _zero(self._value)
            self._disposed = True

    @property
    def disposed(self) -> bool:
        return self._disposed

    def __repr__(self) -> str:
        return f"<secret {self.name}>"

    __str__ = __repr__

    def __format__(self, format_spec: str) -> str:
        return format(repr(self), format_spec)

    def __bytes__(self) -> NoReturn:
        raise TypeError("a secret handle has no bytes form; use reveal()")

    def __reduce_ex__(self, protocol: Any) -> NoReturn:
        raise TypeError("a secret handle cannot be pickled")

    def __reduce__(self) -> NoReturn:
        raise TypeError("a secret handle cannot be pickled")

    def __getstate__(self) -> NoReturn:
        raise TypeError("a secret handle cannot be serialised")

    def __copy__(self) -> NoReturn:
        raise TypeError("a secret handle cannot be copied")

    def __deepcopy__(self, memo: Any) -> NoReturn:
        raise TypeError("a secret handle cannot be copied")


def _zero(buffer: bytearray) -> None:
    buffer[:] = bytes(len(buffer))


@dataclass(frozen=True)
class SecretSource:
    """Where a secret comes from: its variable and, for a file, the path as given and resolved."""

    name: str
    variable: str
    path: Path | None = None
    resolved: Path | None = None

    @property
    def is_file(self) -> bool:
        return self.path is not None


@dataclass(frozen=True)
class SecretFinding:
    """One check a secret's source failed; ``code`` is stable, nothing here is a value."""

    secret: str
    variable: str
    code: Code
    problem: str

    def as_error(self) -> ConfigError:
        return ConfigError(self.variable, self.problem, code=self.code)


@dataclass(frozen=True)
class SourceInspection:
    """The sources of every given secret, and what is wrong with them (never values)."""

    sources: Mapping[str, SecretSource]
    findings: tuple[SecretFinding, ...]
    secrets_dir: Path | None


@dataclass(frozen=True)
class RefusedSecret:
    secret: str
    variable: str
    file: str
    code: str


@dataclass(frozen=True)
class ReloadReport:
    """What a reload did; names secrets and files, never values."""

    rotated: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()
    refused: tuple[RefusedSecret, ...] = ()
    not_reloadable: tuple[str, ...] = ()
    files: Mapping[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "rotated": list(self.rotated),
            "unchanged": list(self.unchanged),
            "refused": [
                {"secret": r.secret, "variable": r.variable, "file": r.file, "code": r.code}
                for r in self.refused
            ],
            "not_reloadable": list(self.not_reloadable),
            "files": dict(self.files),
        }


@dataclass(frozen=True)
class _Identity:
    """Who this process is, for the owner and mode checks."""

    euid: int
    gids: frozenset[int]


def _identity(euid: int | None, gids: Collection[int] | None) -> _Identity:
    uid = os.geteuid() if euid is None else euid
    groups = (set(os.getgroups()) | {os.getegid()}) if gids is None else set(gids)
    return _Identity(uid, frozenset(groups))


def inspect_sources(
    environ: Mapping[str, str],
    *,
    production: bool,
    secrets_dir: Path | None = None,
    names: Collection[str] = SECRET_NAMES,
    euid: int | None = None,
    gids: Collection[int] | None = None,
) -> SourceInspection:
    """Check where every secret comes from without reading any value.

    The posture check maps the findings with codes SECRET_IN_ENV, SECRET_FILE_OUTSIDE_DIR,
    SECRET_FILE_MODE and SECRET_FILE_OWNER onto the checks of the same names; the store refuses
    to load on any finding. ``secrets_dir`` defaults to ``EXECUTOR_SECRETS_DIR`` in ``environ``.
    """
    ident = _identity(euid, gids)
    if secrets_dir is None and environ.get(SECRETS_DIR_VARIABLE):
        secrets_dir = Path(environ[SECRETS_DIR_VARIABLE])
    findings: list[SecretFinding] = []
    sources: dict[str, SecretSource] = {}
    dir_real: str | None = None
    if secrets_dir is not None:
        dir_real = os.path.realpath(secrets_dir)
        if not os.path.isdir(dir_real):
            findings.append(
                SecretFinding(
                    "", SECRETS_DIR_VARIABLE, SECRET_DIR_INVALID, "is not an existing directory"
                )
            )
        else:
            unsafe = unsafe_secrets_dir(dir_real, writable=_writable_dirs(environ))
            if unsafe is not None:
                findings.append(SecretFinding("", SECRETS_DIR_VARIABLE, SECRET_DIR_UNSAFE, unsafe))
    for name in names:
        file_var = f"{name}_FILE"
        in_env = name in environ
        in_file = file_var in environ
        if in_env and production:
            findings.append(
                SecretFinding(
                    name, name, SECRET_IN_ENV, f"refused in production; give {file_var} instead"
                )
            )
            continue
        if in_env and in_file:
            findings.append(
                SecretFinding(
                    name, name, SECRET_BOTH_GIVEN, f"give either {name} or {file_var}, not both"
                )
            )
            continue
        if in_env:
            sources[name] = SecretSource(name=name, variable=name)
            continue
        if not in_file:
            continue
        path = Path(environ[file_var])
        if secrets_dir is None and production:
            findings.append(
                SecretFinding(
                    name,
                    SECRETS_DIR_VARIABLE,
                    SECRET_DIR_REQUIRED,
                    f"required in production when {file_var} is given",
                )
            )
            continue
        source, finding = _check_file(name, file_var, path, dir_real, ident)
        if finding is not None:
            findings.append(finding)
        else:
            sources[name] = source
    return SourceInspection(sources=sources, findings=tuple(findings), secrets_dir=secrets_dir)


# Directories no secret mount may be: the root, the system's own trees (a containment check
# against them holds for every file of the system), and the kernel's pseudo-filesystems, which
# are unsafe at any depth.
_SYSTEM_DIRS: Final = frozenset(
    {
        "/",
        "/bin",
        "/boot",
        "/etc",
        "/home",
        "/lib",
        "/lib32",
        "/lib64",
        "/libx32",
        "/media",
        "/mnt",
        "/opt",
        "/root",
        "/run",
        "/sbin",
        "/srv",
        "/tmp",  # noqa: S108 - a directory refused, never a file written
        "/usr",
        "/usr/bin",
        "/usr/lib",
        "/usr/local",
        "/usr/sbin",
        "/usr/share",
        "/var",
        "/var/lib",
        "/var/run",
        "/var/tmp",  # noqa: S108
    }
)
_PSEUDO_TREES: Final = ("/proc", "/sys", "/dev")
# The directories the process writes (the same variables ``serve`` hands the audit hook).
_WRITABLE_VARIABLES: Final = ("EXECUTOR_STATE_DIR", "EXECUTOR_JOURNAL_DIR", "EXECUTOR_EVIDENCE_DIR")


def _writable_dirs(environ: Mapping[str, str]) -> tuple[str, ...]:
    return tuple(
        os.path.realpath(environ[name])
        for name in _WRITABLE_VARIABLES
        if environ.get(name, "").startswith("/")
    )


def _within(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def unsafe_secrets_dir(dir_real: str, *, writable: Collection[str] = ()) -> str | None:
    """Why the resolved directory ``dir_real`` may not be ``EXECUTOR_SECRETS_DIR`` (a short
    problem, ``SECRET_DIR_UNSAFE``), or ``None`` when it may.

    Refused: the root and the system's own top-level trees (``/etc``, ``/usr``, ``/var``,
    ``/tmp``, ...), where "inside the directory" would hold for files that were never mounted
    as secrets; anything under ``/proc``, ``/sys`` or ``/dev``; a directory other users may
    write (world- or group-writable on a writable mount); and a directory that is, holds or lies
    inside one the process itself writes (``writable``: state, journal, evidence), whose files
    the executor wrote and which would pass the owner check.
    """
    if dir_real in _SYSTEM_DIRS:
        return "is the root or a system directory; name the directory the secrets are mounted in"
    if any(_within(dir_real, tree) for tree in _PSEUDO_TREES):
        return "is inside /proc, /sys or /dev; name the directory the secrets are mounted in"
    try:
        mode = stat.S_IMODE(os.stat(dir_real).st_mode)
        read_only = bool(os.statvfs(dir_real).f_flag & os.ST_RDONLY)
    except OSError:
        return "cannot be inspected"
    # A Secret volume's directory is group- and world-writable (``drwxrwsrwt``) on a mount that
    # is read-only: nobody can write it, so only a writable mount is refused.
    if mode & (stat.S_IWOTH | stat.S_IWGRP) and not read_only:
        return "is writable by other users; mount the secrets read-only or make it private"
    for directory in writable:
        if _within(dir_real, directory) or _within(directory, dir_real):
            return "overlaps a directory the executor writes (state, journal or evidence)"
    return None


def _check_file(
    name: str, variable: str, path: Path, dir_real: str | None, ident: _Identity
) -> tuple[SecretSource, SecretFinding | None]:
    try:
        resolved = os.path.realpath(path, strict=True)
    except OSError:
        return _fail(name, variable, path, SECRET_FILE_UNREADABLE, "file does not exist")
    source = SecretSource(name=name, variable=variable, path=path, resolved=Path(resolved))
    if dir_real is not None and (
        resolved == dir_real or os.path.commonpath([dir_real, resolved]) != dir_real
    ):
        return source, SecretFinding(
            name, variable, SECRET_FILE_OUTSIDE_DIR, f"resolves outside {SECRETS_DIR_VARIABLE}"
        )
    try:
        st = os.stat(resolved)
    except OSError:
        return source, SecretFinding(name, variable, SECRET_FILE_UNREADABLE, "cannot stat file")
    problem = _stat_problem(st, ident)
    if problem is not None:
        return source, SecretFinding(name, variable, problem[0], problem[1])
    return source, None


def _fail(
    name: str, variable: str, path: Path, code: Code, problem: str
) -> tuple[SecretSource, SecretFinding]:
    return SecretSource(name, variable, path), SecretFinding(name, variable, code, problem)


def _stat_problem(st: os.stat_result, ident: _Identity) -> tuple[Code, str] | None:
    """Why a file's type, owner or mode make it unfit to hold a secret; ``None`` if it is fit."""
    if not stat.S_ISREG(st.st_mode):
        return SECRET_FILE_MODE, "is not a regular file"
    mode = stat.S_IMODE(st.st_mode)
    private = st.st_uid == ident.euid and mode & 0o077 == 0
    group_only = st.st_uid == 0 and st.st_gid in ident.gids and mode & 0o037 == 0
    if private or group_only:
        return None
    if st.st_uid not in (ident.euid, 0):
        return SECRET_FILE_OWNER, "owned by another user"
    if st.st_uid != ident.euid and st.st_gid not in ident.gids:
        return SECRET_FILE_OWNER, "owned by root with a group this process is not in"
    return SECRET_FILE_MODE, "readable or writable beyond this process's user or group"


@dataclass(frozen=True)
class _Fingerprint:
    resolved: str
    dev: int
    ino: int
    size: int
    mtime_ns: int
    mode: int
    uid: int
    gid: int


def _fingerprint(path: Path) -> _Fingerprint | None:
    try:
        resolved = os.path.realpath(path, strict=True)
        st = os.stat(resolved)
    except OSError:
        return None
    return _Fingerprint(
        resolved, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode, st.st_uid, st.st_gid
    )


class _ReadRefused(Exception):
    def __init__(self, code: Code, problem: str) -> None:
        super().__init__(problem)
        self.code = code
        self.problem = problem


def _read_file(resolved: Path, ident: _Identity) -> bytearray:
    """Read a checked file into a fresh ``bytearray``; the checks run again on the open file."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW
    for _ in range(_READ_ATTEMPTS):
        try:
            fd = os.open(resolved, flags)
        except OSError as exc:
            raise _ReadRefused(SECRET_FILE_UNREADABLE, "cannot open file") from exc
        try:
            before = os.fstat(fd)
            problem = _stat_problem(before, ident)
            if problem is not None:
                raise _ReadRefused(*problem)
            if before.st_size > MAX_SECRET_BYTES:
                raise _ReadRefused(SECRET_FILE_TOO_LARGE, "file is larger than 1 MiB")
            buf = bytearray(before.st_size + 1)
            view = memoryview(buf)
            filled = 0
            while filled < len(buf):
                n = os.readv(fd, [view[filled:]])
                if n == 0:
                    break
                filled += n
            view.release()
            after = os.fstat(fd)
        finally:
            os.close(fd)
        stable = filled == before.st_size and (after.st_size, after.st_mtime_ns) == (
            before.st_size,
            before.st_mtime_ns,
        )
        if stable:
            del buf[filled:]
            _strip_newline(buf)
            if not buf:
                raise _ReadRefused(SECRET_EMPTY, "file is empty")
            return buf
        _zero(buf)
    raise _ReadRefused(SECRET_FILE_UNSTABLE, "file kept changing while being read")


def _strip_newline(buf: bytearray) -> None:
    """Drop one trailing line ending (``echo`` leaves one); the bytes dropped are not secret."""
    if buf.endswith(b"\r\n"):
        del buf[-2:]
    elif buf.endswith(b"\n"):
        del buf[-1:]


def _digest(value: bytearray) -> str:
    return "sha256:" + hashlib.sha256(value).hexdigest()


ChangeListener = Callable[[str, SecretHandle], None]


class CurrentSecret:
    """The current version of one secret, looked up at every :meth:`reveal` (see
    :meth:`SecretStore.current`). Like a handle, it never turns into its value."""

    __slots__ = ("_store", "name")

    def __init__(self, name: str, store: SecretStore) -> None:
        self.name = name
        self._store = store

    @contextlib.contextmanager
    def reveal(self) -> Iterator[bytearray]:
        handle = self._store.get(self.name)
        if handle is None:
            raise SecretUnavailable(f"secret {self.name} is not configured")
        with handle.reveal() as value:
            yield value

    def __repr__(self) -> str:
        return f"<secret {self.name}>"

    __str__ = __repr__

    def __format__(self, format_spec: str) -> str:
        return format(repr(self), format_spec)

    def __reduce__(self) -> NoReturn:
        raise TypeError("a secret cannot be pickled")


class SecretStore:
    """The process's secrets: current handles by name, rotation, and the redactor's digests."""

    def __init__(
        self,
        handles: Mapping[str, SecretHandle],
        sources: Mapping[str, SecretSource],
        digests: Mapping[str, str],
        fingerprints: Mapping[str, _Fingerprint | None],
        *,
        identity: _Identity,
        dir_real: str | None,
        security: EventSink | None,
        grace_seconds: float,
    ) -> None:
        self._handles = dict(handles)
        self._sources = dict(sources)
        self._digests = dict(digests)
        self._fingerprints = dict(fingerprints)
        self._rotations = dict.fromkeys(handles, 0)
        self._identity = identity
        self._dir_real = dir_real
        self._security = security
        self._grace = grace_seconds
        self._lock = threading.Lock()
        self._reload_lock = threading.Lock()
        self._listeners: list[ChangeListener] = []
        self._timers: set[threading.Timer] = set()
        self._closed = False

    @classmethod
    def load(
        cls,
        environ: Mapping[str, str],
        *,
        production: bool,
        secrets_dir: Path | None = None,
        names: Collection[str] = SECRET_NAMES,
        security: EventSink | None = None,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
        euid: int | None = None,
        gids: Collection[int] | None = None,
    ) -> SecretStore:
        """Check every source and read every given secret; the first problem is a ConfigError.

        ``euid``/``gids`` default to this process's (tests inject others). Secrets not given are
        simply absent (``get`` answers ``None``); which ones are required is the configuration's
        decision.
        """
        ident = _identity(euid, gids)
        inspection = inspect_sources(
            environ,
            production=production,
            secrets_dir=secrets_dir,
            names=names,
            euid=ident.euid,
            gids=ident.gids,
        )
        if inspection.findings:
            raise inspection.findings[0].as_error()
        handles: dict[str, SecretHandle] = {}
        digests: dict[str, str] = {}
        fingerprints: dict[str, _Fingerprint | None] = {}
        try:
            for name, source in inspection.sources.items():
                if source.resolved is None:
                    value = bytearray(environ[name].encode())
                    if not value:
                        raise ConfigError(name, "is empty", code=SECRET_EMPTY)
                else:
                    fingerprints[name] = _fingerprint(source.path or source.resolved)
                    try:
                        value = _read_file(source.resolved, ident)
                    except _ReadRefused as exc:
                        raise ConfigError(source.variable, exc.problem, code=exc.code) from None
                digests[name] = _digest(value)
                handles[name] = SecretHandle(name, value)
        except BaseException:
            for handle in handles.values():
                handle.dispose()
            raise
        dir_real = (
            os.path.realpath(inspection.secrets_dir) if inspection.secrets_dir is not None else None
        )
        return cls(
            handles,
            inspection.sources,
            digests,
            fingerprints,
            identity=ident,
            dir_real=dir_real,
            security=security,
            grace_seconds=grace_seconds,
        )

    # -- reading ---------------------------------------------------------------------------

    def get(self, name: str) -> SecretHandle | None:
        """The current handle for ``name``; read it at each request, never keep it."""
        with self._lock:
            return self._handles.get(name)

    def current(self, name: str) -> CurrentSecret:
        """A handle that is always the current version of ``name``: each :meth:`reveal` looks
        the secret up anew, so a component built once follows every rotation."""
        return CurrentSecret(name, self)

    def names(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._handles)

    def source(self, name: str) -> SecretSource | None:
        """Where ``name`` comes from (the TLS listener needs the key file's path)."""
        return self._sources.get(name)

    def rotation_counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._rotations)

    def digests(self) -> dict[str, str]:
        """``sha256:`` digests of the current values, for the redactor; never the values."""
        with self._lock:
            return dict(self._digests)

    def on_change(self, listener: ChangeListener) -> None:
        """Call ``listener(name, new_handle)`` after each rotation (outside the store's lock)."""
        self._listeners.append(listener)

    # -- rotation --------------------------------------------------------------------------

    def reload(self) -> ReloadReport:
        """Re-read every secret file now; a changed one becomes current, a bad one is refused."""
        with self._reload_lock:
            return self._reload()

    def _reload(self) -> ReloadReport:
        rotated: list[str] = []
        unchanged: list[str] = []
        refused: list[RefusedSecret] = []
        static: list[str] = []
        files: dict[str, str] = {}
        changes: list[tuple[str, SecretHandle]] = []
        for name, source in self._sources.items():
            if source.path is None:
                static.append(name)
                continue
            files[name] = str(source.path)
            fingerprint = _fingerprint(source.path)
            try:
                resolved = self._recheck(source)
                value = _read_file(resolved, self._identity)
            except _ReadRefused as exc:
                refused.append(RefusedSecret(name, source.variable, str(source.path), exc.code))
                self._fingerprints[name] = fingerprint
                self._emit(
                    "SECRET_RELOAD_REFUSED",
                    {
                        "secret": name,
                        "variable": source.variable,
                        "file": str(source.path),
                        "code": exc.code,
                    },
                )
                continue
            digest = _digest(value)
            with self._lock:
                current = self._handles[name]
                if digest == self._digests[name]:
                    self._fingerprints[name] = fingerprint
                    _zero(value)
                    unchanged.append(name)
                    continue
                handle = SecretHandle(name, value, version=current.version + 1)
                self._handles[name] = handle
                self._digests[name] = digest
                self._rotations[name] += 1
                self._fingerprints[name] = fingerprint
            self._retire(current)
            rotated.append(name)
            changes.append((name, handle))
            self._emit("SECRET_ROTATED", {"secret": name, "version": handle.version})
        for name, handle in changes:
            for listener in list(self._listeners):
                listener(name, handle)
        return ReloadReport(
            rotated=tuple(rotated),
            unchanged=tuple(unchanged),
            refused=tuple(refused),
            not_reloadable=tuple(static),
            files=files,
        )

    def _recheck(self, source: SecretSource) -> Path:
        assert source.path is not None
        try:
            resolved = os.path.realpath(source.path, strict=True)
        except OSError:
            raise _ReadRefused(SECRET_FILE_UNREADABLE, "file does not exist") from None
        if self._dir_real is not None and (
            resolved == self._dir_real
            or os.path.commonpath([self._dir_real, resolved]) != self._dir_real
        ):
            raise _ReadRefused(SECRET_FILE_OUTSIDE_DIR, f"resolves outside {SECRETS_DIR_VARIABLE}")
        return Path(resolved)

    def _retire(self, handle: SecretHandle) -> None:
        """Zero ``handle`` after the grace, so a request that just took it can still use it."""
        if self._grace <= 0 or self._closed:
            handle.dispose()
            return
        timer: threading.Timer

        def expire() -> None:
            handle.dispose()
            with self._lock:
                self._timers.discard(timer)

        timer = threading.Timer(self._grace, expire)
        timer.daemon = True
        with self._lock:
            self._timers.add(timer)
        timer.start()

    def changed_files(self) -> tuple[str, ...]:
        """Secrets whose file changed (target, inode, size, mtime, owner or mode) since read."""
        changed = []
        for name, source in self._sources.items():
            if source.path is not None and _fingerprint(source.path) != self._fingerprints.get(
                name
            ):
                changed.append(name)
        return tuple(changed)

    async def watch(self, interval: float) -> None:
        """Poll the secret files every ``interval`` seconds and reload when one changed.

        Run it as a task; cancel it to stop. The reload runs in a thread (file reads).
        """
        while True:
            await asyncio.sleep(interval)
            if self.changed_files():
                await asyncio.to_thread(self.reload)

    def close(self) -> None:
        """Zero every handle now, current and retiring; the store is unusable afterwards."""
        with self._lock:
            self._closed = True
            timers = list(self._timers)
            self._timers.clear()
            handles = list(self._handles.values())
        for timer in timers:
            timer.cancel()
            timer.function()
        for handle in handles:
            handle.dispose()

    def _emit(self, event: str, fields: Mapping[str, Any]) -> None:
        if self._security is not None:
            self._security.emit(event, fields)
