"""``agentsafe serve``: the executor process.

Start order, as the specification fixes it (each step refuses to start with one line naming the
variable or the check, never a value): the audit hook; configuration; posture; secrets; the
journal directory; the evidence chain heads; the use store; the listener (``/health`` answers,
``/ready`` waits); startup reconciliation; the background polls.
SIGTERM stops accepting, lets in-flight work finish and journal within a bound, persists the chain
heads and exits 0. SIGHUP re-reads the secret files.

The audit hook is installed here and nowhere else (it is permanent, so tests never install it in
their own process); :func:`~agentsafe.executor.assembly.assemble` builds the executor and
:class:`~agentsafe.executor.plane.Executor` runs it. This module is only the process around them:
signals, the chained standard streams, operational logs through the security stream's writer,
the start-up heap kept out of the collector's walks (:func:`freeze_startup_heap`), and the exit
status.

Under ``EXECUTOR_WORKERS`` above 1 this process is the supervisor of N workers instead
(``supervisor.py``): it parses the configuration (refusing as a single process would), installs
no audit hook, and starts the workers, each of which runs this module again as a single process
told its index (``host/workers.py``). With ``EXECUTOR_WORKERS=1`` (the default) nothing of that
runs: one process, exactly as before, which only first refuses to start over a ``worker-<k>``
journal directory an earlier, larger group left holding work.

Callers: ``cli.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import telemetry
from .assembly import assemble
from .codes import Code
from .config import ExecutorMode, load_config
from .errors import AgentSafeError, ConfigError
from .events import SECURITY_SCHEMA, DeferredSink, JsonLinesSink, JsonLogFormatter, Streams
from .evidence.chain import ChainedStreams, LineWriter, LineWriterHandler
from .evidence.redact import RedactingLogFilter, Redactor
from .host.audithook import Guard, install_guard
from .host.workers import INDEX_ENV, RUNTIME_ENV
from .lifecycle.shadow import closing_line
from .supervisor import refuse_unsettled, supervise

__all__ = ["freeze_startup_heap", "main"]


def _writable_dirs(environ: Mapping[str, str]) -> list[Path]:
    """The directories the audit hook lets this process write, read before configuration."""
    names = (
        "EXECUTOR_JOURNAL_DIR",
        "EXECUTOR_STATE_DIR",
        "EXECUTOR_EVIDENCE_DIR",
        RUNTIME_ENV,  # a worker's group files and its multiprocess metrics (host/workers.py)
    )
    return [Path(environ[n]) for n in names if environ.get(n, "").startswith("/")]


async def _run(environ: Mapping[str, str], guard: Guard) -> int:
    if INDEX_ENV not in environ:  # a single process: no journal left by a group goes unread
        await refuse_unsettled(load_config(environ))
    evidence, security = DeferredSink(), DeferredSink()
    writer = LineWriter.for_stream(sys.stderr)
    try:
        executor = await assemble(
            environ,
            streams=Streams(evidence=evidence, security=security),
            guard=guard,
            chain=(sys.stdout, writer),
        )
    except BaseException:
        if not security.attached:
            security.drain(JsonLinesSink(sys.stderr, schema=SECURITY_SCHEMA))
        raise
    if executor.chained is not None:
        _log_through(writer, executor.redactor, executor.chained)
    freeze_startup_heap()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    reloads: set[asyncio.Task[dict[str, Any]]] = set()

    def reload() -> None:
        task = asyncio.ensure_future(executor.reload_secrets())
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    loop.add_signal_handler(signal.SIGHUP, reload)
    try:
        # The listener opens first: /health answers (the liveness probe) while start-up
        # reconciliation runs; /ready is 503 and proposals get 503 EXECUTOR_RECONCILING.
        await executor.listen()
        # A SIGTERM during start-up reconciliation stops it at once: its lookups are read-only,
        # and an attempt left open is asked about again at the next start.
        starting = asyncio.ensure_future(executor.reconcile_at_start())
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if starting.done():
                starting.result()
                executor.start_background()
                await stopping
        finally:
            for task in (starting, stopping):
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
        executor.streams.security.emit("STOPPING", {"signal": "SIGTERM"})
    finally:
        if executor.config.executor_mode is ExecutorMode.SHADOW:
            # The report at stop, as a chained security line like everything else on stderr.
            with contextlib.suppress(AgentSafeError):
                executor.streams.security.emit(
                    "SHADOW_REPORT",
                    {**executor.shadow.as_dict(), "next": closing_line()},
                )
        await executor.close()
        # the spans still queued are exported, bounded by OTEL_EXPORTER_OTLP_TIMEOUT
        await asyncio.to_thread(telemetry.shutdown)
    return 0


def freeze_startup_heap() -> int:
    """Collect once, then keep what start-up built out of every later collection.

    The assembled executor (policy, schemas, CEL programs, keys, the routes) is about 120,000
    objects that live as long as the process. Left in the collector's oldest generation, each
    full collection walks all of them: about 70 ms with the event loop stopped, every few seconds
    under load, so every request in flight waited for it (a p99 cost, not a CPU one). Frozen
    (``gc.freeze``), a full collection walks only what requests allocate (about 1 ms). Garbage is
    collected first, so nothing unreachable is kept; reference counting still frees frozen objects
    that are not in cycles. Returns how many objects were frozen.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def _log_through(writer: LineWriter, redactor: Redactor, chained: ChainedStreams) -> None:
    """Operational logs share the security stream's writer (never a shared line) and redactor."""
    handler = LineWriterHandler(writer)
    handler.setFormatter(JsonLogFormatter())
    handler.addFilter(RedactingLogFilter(redactor, on_redaction=chained.report_log_redactions))
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)


def _refused(code: str, message: str) -> None:
    """A start-up refusal: one JSON line on stderr (never plain text), level ERROR."""
    JsonLinesSink(sys.stderr, schema=SECURITY_SCHEMA).emit(
        Code.REFUSED_TO_START,
        {"level": "ERROR", "code": code, "message": f"agentsafe: refused to start: {message}"},
    )


def _uncaught(kind: type[BaseException], value: BaseException, tb: Any) -> None:
    """An exception nothing handled: logged as one JSON line, not Python's plain traceback."""
    logging.getLogger("agentsafe.executor").critical(
        "unhandled %s", kind.__name__, exc_info=(kind, value, tb)
    )


def main() -> int:
    level = os.environ.get("AGENTSAFE_LOG_LEVEL", "WARNING")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLogFormatter())
    logging.basicConfig(level=level, handlers=[handler], force=True)
    logging.captureWarnings(True)  # warnings.warn becomes a JSON line too
    sys.excepthook = _uncaught
    environ = dict(os.environ)
    try:
        if INDEX_ENV not in environ:
            config = load_config(environ)
            if config.executor_workers > 1:
                return asyncio.run(supervise(environ, config))
        guard = install_guard(writable_dirs=_writable_dirs(environ))
        return asyncio.run(_run(environ, guard))
    except ConfigError as exc:
        _refused(exc.code, f"{exc.code}: {exc}")
        return exc.exit_status
    except AgentSafeError as exc:
        _refused(exc.code, f"{exc.code}: {exc.message}")
        return 78
