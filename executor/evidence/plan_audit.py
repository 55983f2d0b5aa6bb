"""The durable audit sink behind the plan routes.

``execute_agent_plan_step`` appends a *started* event before a step runs and a *completed* one
after; each append must be on the device before it returns. This sink writes one canonical JSON
line per event to ``<journal>/plans/audit-YYYY-MM-DD.jsonl`` (directory 0700, file 0600) with a
write, a flush and an ``fsync`` in a worker thread, then mirrors the event on the evidence stream.
The events carry only the pseudonymous digests the plan library puts in them.

Callers: ``assembly.py`` (the plan service).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..canonical import canonical_text
from ..clock import Clock, utc_day
from ..codes import Code
from ..errors import JournalError
from ..events import EventSink
from ..host.durable import fsync_directory, write_all

__all__ = ["DurablePlanAudit"]

MAX_EVENT_BYTES = 64 * 1024


class DurablePlanAudit:
    def __init__(self, directory: Path, *, clock: Clock, evidence: EventSink) -> None:
        self._dir = directory / "plans"
        self._dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self._dir, 0o700)
        self._clock = clock
        self._evidence = evidence
        self._lock = threading.Lock()

    async def append(self, event: Mapping[str, Any]) -> None:
        line = canonical_text(dict(event)) + "\n"
        if len(line.encode("utf-8")) > MAX_EVENT_BYTES:
            raise JournalError(
                "a plan audit event is too large", code=Code.JOURNAL_RECORD_TOO_LARGE
            )
        await asyncio.to_thread(self._write, line)
        self._evidence.emit("PLAN_AUDIT", {"plan_event": dict(event)})

    def _write(self, line: str) -> None:
        path = self._dir / ("audit-" + utc_day(self._clock.now()) + ".jsonl")
        with self._lock:
            created = not path.exists()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                write_all(fd, line.encode("utf-8"))
                os.fsync(fd)
            finally:
                os.close(fd)
            if created:
                fsync_directory(self._dir)
