"""``agentsafe serve`` under ``EXECUTOR_WORKERS`` above 1: a small supervisor of N workers.

Role: one process per core behind one listener. The supervisor serves nothing itself; it

- refuses to start (exit 78, one JSON line) on a configuration the workers would refuse, and
  on a journal directory that no worker of this ``EXECUTOR_WORKERS`` will open but that still
  holds work (:func:`unsettled_journals`: ``worker-<k>`` for ``k >= N`` left by a larger N, or
  the single process's own journal in ``EXECUTOR_JOURNAL_DIR`` itself): nothing accepted is
  ever lost, so it names the directory and the ``EXECUTOR_WORKERS`` that settles it;
- makes the group's private runtime directory fresh (``host/workers.py``: the roster, the
  shared operator halt, ``PROMETHEUS_MULTIPROC_DIR``);
- resolves ``PORT=0`` once to a free port and holds a bound, never listening,
  ``SO_REUSEPORT`` socket on it for its whole life, so a restarted worker binds the same port;
- starts worker ``i`` as ``python -I -m agentsafe.executor.cli serve`` (isolated: neither the
  working directory nor ``PYTHON*`` variables reach its ``sys.path``) with
  ``EXECUTOR_JOURNAL_DIR=<dir>/worker-<i>``, ``EXECUTOR_REPLICA_ID=<id>-w<i>`` (its open
  attempts' owner in a shared store) and the runtime variables; each worker binds the same
  address with ``SO_REUSEPORT``, journals, reconciles and chains on its own;
- reads each worker's stdout and stderr through its own pipes and forwards whole lines only
  (lines longer than ``PIPE_BUF`` from two writers to one pipe could interleave otherwise); a
  last line torn by a dying worker is never forwarded (it was never acknowledged; the worker's
  chain resumes past it with ``gap: true``), and is reported as ``WORKER_TORN_LINE``. Each pipe
  has its own pump thread (:func:`_pump`: a blocking ``read``, then every whole line of it in
  one ``write`` under the stream's lock), off the event loop: the forwarding sits on every
  request's output, and a thread costs a fraction of an asyncio stream per line;
- restarts a worker that dies, with backoff (:data:`RESTART_BACKOFF_SECONDS` doubling up to
  :data:`RESTART_BACKOFF_MAX_SECONDS`, reset once it has run :data:`HEALTHY_SECONDS`); its
  start-up reconciliation resolves what it left open;
- stops every worker and exits 78 (``WORKER_REFUSED_TO_START``) when one exits 78 (a
  configuration or posture refusal): fail closed, never a group with a hole in it;
- on SIGTERM (or SIGINT) forwards SIGTERM to every worker, waits for each to drain and exit
  (each finishes its in-flight work and journals it), then exits 0 (1 when a worker did not
  exit 0, or had to be killed after :data:`STOP_GRACE_SECONDS`); SIGHUP is forwarded (each
  worker re-reads its secret files).

Its own lines (worker started, exited, restarted, torn line, refusal) are ``agent-safe.log/1``
JSON lines on stderr: never chained, so the chain verifier lists them as foreign lines.

The supervisor installs no audit hook (it starts processes, which the hook refuses); it reads
no secret, opens no store and answers no connection. Callers: ``serve.py`` (:func:`supervise`,
and :func:`unsettled_journals` at a single process's start too).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .clock import SystemClock, format_ms
from .codes import Code
from .config import ExecutorConfig
from .errors import AgentSafeError, ConfigError
from .events import LOG_SCHEMA
from .host.durable import write_all
from .host.workers import (
    INDEX_ENV,
    METRICS_DIR_NAME,
    RUNTIME_DIR_NAME,
    RUNTIME_ENV,
    SUPERVISOR_FILE,
    write_json,
)
from .state.journal import ATTEMPTS_DIR, AttemptJournal

__all__ = [
    "HEALTHY_SECONDS",
    "RESTART_BACKOFF_MAX_SECONDS",
    "RESTART_BACKOFF_SECONDS",
    "WORKER_ARGV",
    "supervise",
    "unsettled_journals",
    "worker_dir",
]

WORKER_ARGV = (sys.executable, "-I", "-m", "agentsafe.executor.cli", "serve")
RESTART_BACKOFF_SECONDS = 0.5
RESTART_BACKOFF_MAX_SECONDS = 30.0
HEALTHY_SECONDS = 30.0
STOP_GRACE_SECONDS = 60.0
"""How long SIGTERM waits for a worker beyond its own drain before SIGKILL."""
_READ_CHUNK = 65536
_MAX_LINE = 16 * 1024 * 1024
REFUSED = 78


def worker_dir(journal_dir: Path, index: int) -> Path:
    return journal_dir / f"worker-{index}"


# --------------------------------------------------------------------------------------------
# journals no worker will open


async def unsettled_journals(config: ExecutorConfig) -> list[tuple[Path, int]]:
    """Journal directories this ``EXECUTOR_WORKERS`` leaves unopened that still hold work, each
    with the ``EXECUTOR_WORKERS`` that would open (and so reconcile) it.

    Under N workers those are ``worker-<k>`` for ``k >= N`` and the single process's journal in
    ``EXECUTOR_JOURNAL_DIR`` itself; under one process every ``worker-<k>``. A directory holds
    work unless its journal has no open attempt and its chains were closed cleanly (a process
    that did not stop cleanly may have left an idempotency key in flight that only its own
    start-up reconciliation settles). Raises ``JOURNAL_LOCKED`` while a process holds one.
    """
    if config.executor_journal_dir is None:
        return []
    base = Path(config.executor_journal_dir)
    count = config.executor_workers
    candidates: list[tuple[Path, int]] = [(base, 1)] if count > 1 else []
    for entry in await asyncio.to_thread(_worker_dirs, base):
        index = int(entry.name.removeprefix("worker-"))
        if count == 1 or index >= count:
            candidates.append((entry, max(index + 1, 2)))  # one process never opens worker-0
    unsettled: list[tuple[Path, int]] = []
    for directory, settles_with in candidates:
        if await _holds_work(directory, retain_days=config.executor_journal_retain_days):
            unsettled.append((directory, settles_with))
    return unsettled


def _worker_dirs(base: Path) -> list[Path]:
    try:
        entries = sorted(base.iterdir())
    except OSError:
        return []
    return [
        e for e in entries if e.name.startswith("worker-") and e.name[7:].isdigit() and e.is_dir()
    ]


def _took_records(directory: Path) -> bool:
    attempts = directory / ATTEMPTS_DIR
    try:
        return any(p.suffix == ".jsonl" for p in attempts.iterdir())
    except OSError:
        return False


async def _holds_work(directory: Path, *, retain_days: int) -> bool:
    if not await asyncio.to_thread(_took_records, directory):
        return False  # never took a record
    journal = await AttemptJournal.open(directory, retain_days=retain_days, clock=SystemClock())
    try:
        scan = await journal.scan()
    finally:
        await journal.close()
    if scan.open_attempts or scan.missing_days:
        return True
    for stream in ("evidence", "security"):
        head = _read_head(directory / "chain" / f"{stream}.head.json")
        if head is None or head.get("clean") is not True:
            return True
    return False


def _read_head(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


# --------------------------------------------------------------------------------------------
# the supervisor


class _Out:
    """Whole lines to one of this process's standard streams. Its writers are the pump threads
    and the event loop: each write of whole lines is made under :attr:`lock`, so two never
    interleave inside a line whatever the line's length."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.lock = threading.Lock()

    def line(self, data: bytes) -> None:
        self.lines(data if data.endswith(b"\n") else data + b"\n")

    def lines(self, data: bytes) -> None:
        """``data``: one or more whole lines, each ending in a newline."""
        with self.lock, contextlib.suppress(OSError):
            write_all(self.fd, data)


def _pump(fd: int, out: _Out) -> int:
    """On a pump thread: forward the whole lines read from ``fd`` until end of file, each
    read's whole lines in one write; the length of the torn last line left over (0: none).

    A line longer than :data:`_MAX_LINE` (no worker writes one) is forwarded as it stands
    rather than held in memory without bound."""
    parts: list[bytes] = []  # the current line's bytes so far (no newline among them)
    held = 0
    try:
        while True:
            try:
                chunk = os.read(fd, _READ_CHUNK)
            except InterruptedError:  # pragma: no cover - PEP 475 retries; kept for clarity
                continue
            if not chunk:
                return held
            cut = chunk.rfind(b"\n")
            if cut < 0:
                parts.append(chunk)
                held += len(chunk)
                if held > _MAX_LINE:
                    out.line(b"".join(parts))
                    parts, held = [], 0
                continue
            parts.append(chunk[: cut + 1])
            out.lines(b"".join(parts))
            rest = chunk[cut + 1 :]
            parts, held = ([rest], len(rest)) if rest else ([], 0)
    finally:
        os.close(fd)


@dataclass
class _Worker:
    index: int
    env: dict[str, str]
    process: asyncio.subprocess.Process | None = None
    state: str = "starting"
    restarts: int = 0
    started_at: float = 0.0
    stop_status: int | None = None
    pumps: list[asyncio.Future[None]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "pid": self.process.pid if self.process is not None else None,
            "state": self.state,
            "restarts": self.restarts,
        }


class Supervisor:
    """The N workers of one ``agentsafe serve`` (module docstring)."""

    def __init__(self, environ: Mapping[str, str], config: ExecutorConfig) -> None:
        assert config.executor_journal_dir is not None  # the configuration requires it
        self.config = config
        self.environ = dict(environ)
        self.base = Path(config.executor_journal_dir)
        self.runtime = self.base / RUNTIME_DIR_NAME
        self.stdout, self.stderr = _Out(1), _Out(2)
        self.stopping = asyncio.Event()
        self.refused: int | None = None
        self.workers: list[_Worker] = []
        self._reservation: socket.socket | None = None

    # -- output --------------------------------------------------------------------------------

    def say(self, event: str, level: str = "INFO", **fields: Any) -> None:
        line = {
            "schema": LOG_SCHEMA,
            "at": format_ms(time.time()),
            "level": level,
            "logger": "agentsafe.executor.supervisor",
            "event": event,
            **fields,
        }
        self.stderr.line(json.dumps(line, sort_keys=False).encode("utf-8"))

    def _start_pump(self, worker: _Worker, fd: int, out: _Out) -> asyncio.Future[None]:
        """A pump thread for one of ``worker``'s pipes; its future settles at end of file, once
        a torn last line (if any) was reported as ``WORKER_TORN_LINE``."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        stream = "stdout" if out is self.stdout else "stderr"

        def settle(error: BaseException | None) -> None:
            if done.done():
                return
            if error is not None:
                done.set_exception(error)
            else:
                done.set_result(None)

        def run() -> None:
            error: BaseException | None = None
            try:
                torn = _pump(fd, out)
                if torn:
                    self.say(
                        "WORKER_TORN_LINE",
                        "WARNING",
                        worker=worker.index,
                        bytes=torn,
                        stream=stream,
                    )
            except BaseException as exc:  # pragma: no cover - reported to the awaiting keeper
                error = exc
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
                loop.call_soon_threadsafe(settle, error)

        threading.Thread(
            target=run, name=f"agentsafe-pump-{worker.index}-{stream}", daemon=True
        ).start()
        return done

    # -- the runtime directory and the port ----------------------------------------------------

    def prepare(self) -> int:
        """A fresh runtime directory; the port every worker binds. Raises ``ConfigError``."""
        try:
            if self.runtime.exists():
                shutil.rmtree(self.runtime)
            self.runtime.mkdir(mode=0o700, parents=True)
            (self.runtime / METRICS_DIR_NAME).mkdir(mode=0o700)
            for index in range(self.config.executor_workers):
                worker_dir(self.base, index).mkdir(mode=0o700, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                "EXECUTOR_JOURNAL_DIR",
                f"the workers' directories cannot be made in it ({exc.strerror})",
                code=Code.JOURNAL_UNAVAILABLE,
            ) from None
        try:
            return self._port()
        except OSError as exc:
            raise ConfigError("PORT", f"cannot be bound ({exc.strerror})") from None

    def _port(self) -> int:
        port = self.config.port
        if port == 0:
            host = self.config.executor_bind_address
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, 0))
            self._reservation = sock  # bound, never listening: holds the port for restarts
            port = int(sock.getsockname()[1])
        return port

    def _environment(self, index: int, port: int) -> dict[str, str]:
        replica = self.config.replica_id[:240]
        env = dict(self.environ)
        env.update(
            {
                INDEX_ENV: str(index),
                RUNTIME_ENV: str(self.runtime),
                "PROMETHEUS_MULTIPROC_DIR": str(self.runtime / METRICS_DIR_NAME),
                "EXECUTOR_JOURNAL_DIR": str(worker_dir(self.base, index)),
                "EXECUTOR_REPLICA_ID": f"{replica}-w{index}",
                "PORT": str(port),
            }
        )
        return env

    def publish(self) -> None:
        with contextlib.suppress(OSError):
            write_json(
                self.runtime / SUPERVISOR_FILE,
                {"pid": os.getpid(), "workers": [w.as_dict() for w in self.workers]},
            )

    # -- workers -------------------------------------------------------------------------------

    async def _spawn(self, worker: _Worker) -> asyncio.subprocess.Process:
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        try:
            process = await asyncio.create_subprocess_exec(
                *WORKER_ARGV,
                env=worker.env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out_write,
                stderr=err_write,
            )
        except BaseException:
            for fd in (out_read, err_read):
                os.close(fd)
            raise
        finally:
            for fd in (out_write, err_write):  # the worker holds its own copies
                os.close(fd)
        worker.process = process
        worker.state = "running"
        worker.started_at = time.monotonic()
        worker.pumps = [
            self._start_pump(worker, out_read, self.stdout),
            self._start_pump(worker, err_read, self.stderr),
        ]
        self.publish()
        self.say("WORKER_STARTED", worker=worker.index, pid=process.pid)
        return process

    async def _keep(self, worker: _Worker) -> None:
        """Run one worker until the group stops: restart it when it dies, stop the group when
        it refuses to start."""
        failures = 0
        while not self.stopping.is_set():
            process = await self._spawn(worker)
            status = await process.wait()
            await asyncio.gather(*worker.pumps, return_exceptions=True)
            self._mark_dead(process.pid)
            ran = time.monotonic() - worker.started_at
            if self.stopping.is_set():
                worker.state = "stopped"
                worker.stop_status = status
                self.say("WORKER_STOPPED", worker=worker.index, pid=process.pid, status=status)
                break
            if status == REFUSED:
                worker.state = "refused"
                self.say(
                    "WORKER_REFUSED",
                    "ERROR",
                    worker=worker.index,
                    pid=process.pid,
                    status=status,
                    code=Code.WORKER_REFUSED_TO_START,
                )
                self.refused = status
                self.stopping.set()
                break
            failures = 0 if ran >= HEALTHY_SECONDS else failures + 1
            delay = min(
                RESTART_BACKOFF_MAX_SECONDS, RESTART_BACKOFF_SECONDS * 2 ** max(failures - 1, 0)
            )
            worker.state = "restarting"
            worker.restarts += 1
            self.publish()
            self.say(
                "WORKER_EXITED",
                "ERROR",
                worker=worker.index,
                pid=process.pid,
                status=status,
                restart_in_seconds=delay,
            )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self.stopping.wait()
        self.publish()

    def _mark_dead(self, pid: int) -> None:
        """A dead worker's live gauges leave the multiprocess files (its counters stay)."""
        from prometheus_client import multiprocess

        with contextlib.suppress(OSError):
            multiprocess.mark_process_dead(pid, str(self.runtime / METRICS_DIR_NAME))  # type: ignore[no-untyped-call]

    def signal_all(self, sig: signal.Signals) -> None:
        for worker in self.workers:
            process = worker.process
            if process is not None and process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(sig)

    async def run(self) -> int:
        port = self.prepare()
        count = self.config.executor_workers
        self.workers = [_Worker(i, self._environment(i, port)) for i in range(count)]
        self.say("SUPERVISOR_STARTED", workers=count, port=port, pid=os.getpid())
        loop = asyncio.get_running_loop()
        signalled: list[str] = []

        def stop(name: str) -> None:
            signalled.append(name)
            self.stopping.set()

        loop.add_signal_handler(signal.SIGTERM, stop, "SIGTERM")
        loop.add_signal_handler(signal.SIGINT, stop, "SIGINT")
        loop.add_signal_handler(signal.SIGHUP, self.signal_all, signal.SIGHUP)
        keepers = [asyncio.ensure_future(self._keep(w)) for w in self.workers]
        try:
            await self.stopping.wait()
            for worker in self.workers:
                if worker.state == "running":
                    worker.state = "stopping"
            self.publish()
            self.say("SUPERVISOR_STOPPING", reason=signalled[0] if signalled else "refused")
            self.signal_all(signal.SIGTERM)
            try:
                async with asyncio.timeout(STOP_GRACE_SECONDS):
                    await asyncio.gather(*keepers, return_exceptions=True)
            except TimeoutError:
                self.say("WORKER_KILLED", "ERROR", reason="no exit within the grace period")
                self.signal_all(signal.SIGKILL)
                await asyncio.gather(*keepers, return_exceptions=True)
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(sig)
            if self._reservation is not None:
                self._reservation.close()
        if self.refused is not None:
            self.say(
                Code.REFUSED_TO_START,
                "ERROR",
                code=Code.WORKER_REFUSED_TO_START,
                message=(
                    "agentsafe: refused to start: a worker refused to start (its own line above"
                    " names the variable or check); every worker was stopped"
                ),
            )
            return REFUSED
        unclean = [w.index for w in self.workers if w.stop_status not in (0, None)]
        if unclean:  # a worker killed, or one that failed its own stop: never "all drained"
            self.say("SUPERVISOR_STOPPED", "ERROR", workers_not_drained=unclean)
            return 1
        self.say("SUPERVISOR_STOPPED")
        return 0


async def supervise(environ: Mapping[str, str], config: ExecutorConfig) -> int:
    """Run the N workers until SIGTERM; the exit status (module docstring)."""
    await refuse_unsettled(config)
    return await Supervisor(environ, config).run()


async def refuse_unsettled(config: ExecutorConfig) -> None:
    """Raise ``WORKER_JOURNAL_UNSETTLED`` naming every journal no worker would settle."""
    try:
        unsettled = await unsettled_journals(config)
    except AgentSafeError as exc:
        raise ConfigError(
            "EXECUTOR_JOURNAL_DIR",
            f"a worker journal directory cannot be checked ({exc.code}: another process may hold"
            " it)",
            code=Code.JOURNAL_LOCKED
            if exc.code == Code.JOURNAL_LOCKED
            else Code.JOURNAL_UNAVAILABLE,
        ) from exc
    if unsettled:
        base = Path(str(config.executor_journal_dir))
        where = ", ".join(
            "EXECUTOR_JOURNAL_DIR itself" if d == base else f"EXECUTOR_JOURNAL_DIR/{d.name}"
            for d, _ in unsettled
        )
        settles_with = max(n for _, n in unsettled)
        raise ConfigError(
            "EXECUTOR_WORKERS",
            f"{where} holds work no worker of EXECUTOR_WORKERS={config.executor_workers} would"
            f" reconcile; start once with EXECUTOR_WORKERS={settles_with}, stop it cleanly"
            " (SIGTERM) once it is ready and its open attempts are resolved, then start again",
            code=Code.WORKER_JOURNAL_UNSETTLED,
        )
