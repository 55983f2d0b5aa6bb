"""What the worker processes of one ``EXECUTOR_WORKERS`` group share on the local disk.

Under ``EXECUTOR_WORKERS`` above 1 the supervisor (``supervisor.py``) starts N workers and hands
each, in its environment, its index (:data:`INDEX_ENV`) and a private runtime directory
(:data:`RUNTIME_ENV`, 0700, made fresh by the supervisor at every start, so nothing in it
outlives the group; it lives at :data:`RUNTIME_DIR_NAME` under ``EXECUTOR_JOURNAL_DIR``). A
worker is told nothing else: its journal directory and replica id arrive as the ordinary
variables, already made its own.

The runtime directory holds, each file replaced atomically (temp, rename):

- ``supervisor.json``: the supervisor's view, one entry per worker (pid, state, restarts);
- ``worker-<i>.json``: what worker ``i`` publishes about itself every second and at each
  change (pid, ready, halted, reconciling, open attempts);
- ``halt.json``: the operator's halt or resume from the control route of any worker, with a
  generation number taken under ``halt.lock`` (``flock``), so two racing operators are ordered.
  The acting worker writes it before its control route answers, and every worker checks it at
  its work gate before starting new work (:meth:`SharedHalt.stamp`, one ``stat``), so a halt
  that was answered holds on every worker; ``HaltState.follow`` also applies it within
  :data:`HALT_POLL_SECONDS` for what is not work (``/ready``, the roster).
- ``metrics/``: ``PROMETHEUS_MULTIPROC_DIR`` (prometheus_client's multiprocess files);
- ``exports/<id>/``: an evidence export asking every other worker for the window of its chains
  (:meth:`WorkerLink.request_windows`); each answers ``worker-<j>.json`` within
  :data:`EXPORT_POLL_SECONDS` (chained lines, already redacted, and their heads).

Nothing here is a secret or a request's data. Reading is tolerant: a file half-written by a
worker that died is never seen (rename is atomic), and a missing file is a worker that has not
published yet.

Callers: ``supervisor.py`` (writes ``supervisor.json``, makes the directory), ``plane.py``
(publishes, reads the roster for ``GET /v1/control/status``), ``host/halt.py`` (the shared
halt), ``serve.py`` (:meth:`WorkerLink.from_environ`).
Also imported by ``assembly.py``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "EXPORT_POLL_SECONDS",
    "HALT_POLL_SECONDS",
    "INDEX_ENV",
    "METRICS_DIR_NAME",
    "PUBLISH_SECONDS",
    "RUNTIME_DIR_NAME",
    "RUNTIME_ENV",
    "SUPERVISOR_FILE",
    "SharedHalt",
    "WorkerLink",
    "read_json",
    "write_json",
]

INDEX_ENV = "AGENTSAFE_WORKER_INDEX"
RUNTIME_ENV = "AGENTSAFE_WORKER_RUNTIME_DIR"
RUNTIME_DIR_NAME = ".workers"
METRICS_DIR_NAME = "metrics"
PUBLISH_SECONDS = 1.0
HALT_POLL_SECONDS = 0.2
EXPORT_POLL_SECONDS = 0.2
EXPORTS_DIR = "exports"
SUPERVISOR_FILE = "supervisor.json"
HALT_FILE = "halt.json"


def write_json(path: Path, value: Mapping[str, Any]) -> None:
    """Replace ``path`` atomically with ``value`` as JSON (no fsync: nothing here outlives
    the group, and a torn file is never visible)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        json.dump(dict(value), out, sort_keys=True)
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    """``path`` as a JSON object, or ``None`` when it is absent or not one."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


@dataclass(frozen=True)
class WorkerLink:
    """This worker's place in its group: its index and the group's runtime directory."""

    index: int
    count: int
    runtime: Path

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], *, count: int) -> WorkerLink | None:
        """The link the supervisor handed this process; ``None`` for a single process."""
        raw, runtime = environ.get(INDEX_ENV), environ.get(RUNTIME_ENV)
        if raw is None or runtime is None or not raw.isdigit() or not runtime.startswith("/"):
            return None
        index = int(raw)
        return cls(index=index, count=count, runtime=Path(runtime)) if index < count else None

    def publish(self, state: Mapping[str, Any]) -> None:
        """Replace this worker's entry (``worker-<i>.json``)."""
        write_json(self.runtime / f"worker-{self.index}.json", {**state, "index": self.index})

    def roster(self) -> list[dict[str, Any]]:
        """Every worker of the group, by index: the supervisor's view (pid, state, restarts)
        merged with what the worker itself last published (``published`` false: nothing yet)."""
        supervisor = read_json(self.runtime / SUPERVISOR_FILE) or {}
        entries = supervisor.get("workers")
        by_index = {
            int(e["index"]): e
            for e in (entries if isinstance(entries, list) else [])
            if isinstance(e, dict) and isinstance(e.get("index"), int)
        }
        out: list[dict[str, Any]] = []
        for index in range(self.count):
            seen = by_index.get(index, {})
            own = read_json(self.runtime / f"worker-{index}.json")
            row: dict[str, Any] = {
                "index": index,
                "pid": seen.get("pid"),
                "state": seen.get("state", "unknown"),
                "restarts": seen.get("restarts", 0),
                "this_worker": index == self.index,
                "published": own is not None and own.get("pid") == seen.get("pid"),
            }
            if row["published"] and own is not None:
                for name in ("ready", "halted", "reconciling", "open_attempts", "updated_at"):
                    row[name] = own.get(name)
            out.append(row)
        return out

    def request_windows(self, request_id: str) -> Path:
        """Ask every other worker for its chains' windows (an evidence export); the directory
        their answers arrive in."""
        directory = self.runtime / EXPORTS_DIR / request_id
        directory.mkdir(mode=0o700, parents=True)
        write_json(directory / "request.json", {"from_worker": self.index})
        return directory

    def pending_requests(self) -> list[Path]:
        """Requests of other workers this worker has not answered yet."""
        try:
            entries = list((self.runtime / EXPORTS_DIR).iterdir())
        except OSError:
            return []
        pending: list[Path] = []
        for directory in entries:
            request = read_json(directory / "request.json")
            if (
                request is not None
                and request.get("from_worker") != self.index
                and not (directory / f"worker-{self.index}.json").exists()
            ):
                pending.append(directory)
        return pending

    def answer(self, request: Path, windows: Mapping[str, Any]) -> None:
        with contextlib.suppress(OSError):  # the requester may have given up and removed it
            write_json(request / f"worker-{self.index}.json", windows)

    def answers(self, request: Path) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        for index in range(self.count):
            if index != self.index:
                found = read_json(request / f"worker-{index}.json")
                if found is not None:
                    out[index] = found
        return out

    def shared_halt(self) -> SharedHalt:
        return SharedHalt(self.runtime, worker=self.index)


class SharedHalt:
    """The operator's halt and resume, as the whole group follows them (``halt.json``)."""

    def __init__(self, runtime: Path, *, worker: int) -> None:
        self._path = runtime / HALT_FILE
        self._lock = runtime / "halt.lock"
        self.worker = worker

    def publish(self, *, halted: bool, reason: str, by: str | None) -> int:
        """Record an operator's halt (or resume) for every worker; its generation."""
        fd = os.open(self._lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            current = self.read()
            generation = int(current["generation"]) + 1 if current is not None else 1
            write_json(
                self._path,
                {
                    "generation": generation,
                    "halted": halted,
                    "reason": reason,
                    "by": by,
                    "worker": self.worker,
                },
            )
            return generation
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def stamp(self) -> tuple[int, int, int] | None:
        """A cheap identity of ``halt.json`` as it stands (inode, size, mtime): every publish
        replaces the file (a new inode), so a changed stamp means a record to read. ``None``
        while nothing was published."""
        try:
            found = os.stat(self._path)
        except OSError:
            return None
        return (found.st_ino, found.st_size, found.st_mtime_ns)

    def read(self) -> dict[str, Any] | None:
        record = read_json(self._path)
        if record is None or not isinstance(record.get("generation"), int):
            return None
        return record
