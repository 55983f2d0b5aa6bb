"""Which directory may hold the secrets (``EXECUTOR_SECRETS_DIR``): never the root or a system
tree, never a pseudo-filesystem, never a directory other users may write on a writable mount, never
one that overlaps a directory the process itself writes.

Callers: ``host/secrets.py`` (the inspection of every secret's source, which re-exports
:func:`unsafe_secrets_dir`).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Collection, Mapping
from typing import Final

__all__ = ["unsafe_secrets_dir", "within", "writable_dirs"]

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


def writable_dirs(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The resolved directories the process writes (state, journal, evidence)."""
    return tuple(
        os.path.realpath(environ[name])
        for name in _WRITABLE_VARIABLES
        if environ.get(name, "").startswith("/")
    )


def within(path: str, directory: str) -> bool:
    """``path`` is ``directory`` or lies inside it."""
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
    if any(within(dir_real, tree) for tree in _PSEUDO_TREES):
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
        if within(dir_real, directory) or within(directory, dir_real):
            return "overlaps a directory the executor writes (state, journal or evidence)"
    return None
