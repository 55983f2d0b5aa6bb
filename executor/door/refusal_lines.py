"""The door's ``AUTH_FAILED`` lines, summarised when the same refusal repeats.

A flood of refusals must not become a flood of security lines: each line is one more line in the
bounded window an incident bundle carries, and an anonymous peer could otherwise push what
matters (an operator's ``HALTED``, a ``PRINCIPAL_LOCKED``) out of it. :class:`RefusalLines`
writes one ``AUTH_FAILED`` line (``method`` and ``code``, nothing else) for each of the first
:data:`BURST` refusals of one kind — the same method and code — inside an interval of
:data:`INTERVAL_SECONDS`; further refusals of that kind in the interval are counted, and when the
interval is over one ``AUTH_FAILED_REPEATED`` line says how many were not written one by one
(``method``, ``code``, ``count``, ``seconds``). So the lines a flood writes are bounded by the
number of kinds, never by the number of requests; the metrics still count every refusal.

A closed interval is written out by the next refusal, by :meth:`RefusalLines.flush` (the control
plane calls it every few seconds and before an evidence export), and at shutdown.

Callers: ``door/door.py``; ``assembly.py`` (hands :class:`RefusalEvent` to the chained streams).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from enum import StrEnum

from ..clock import Clock
from ..codes import Code
from ..events import EventSink

__all__ = ["BURST", "INTERVAL_SECONDS", "REPEATED_EVENT", "RefusalEvent", "RefusalLines"]

BURST = 10
INTERVAL_SECONDS = 10.0


class RefusalEvent(StrEnum):
    """The security lines the door writes for refusals; anyone who reaches the listener can
    cause them, so the evidence window keeps them apart (``evidence/chain.py``)."""

    AUTH_FAILED = "AUTH_FAILED"
    AUTH_FAILED_REPEATED = "AUTH_FAILED_REPEATED"


REPEATED_EVENT = RefusalEvent.AUTH_FAILED_REPEATED
_MAX_KINDS = 256


@dataclass
class _Kind:
    started: float
    written: int = 0
    withheld: int = 0


class RefusalLines:
    """Writes ``AUTH_FAILED`` lines to the security stream, summarising repeats."""

    def __init__(
        self,
        security: EventSink,
        *,
        clock: Clock,
        burst: int = BURST,
        interval_seconds: float = INTERVAL_SECONDS,
    ) -> None:
        self._security = security
        self._clock = clock
        self._burst = burst
        self._interval = interval_seconds
        self._kinds: dict[tuple[str, str], _Kind] = {}
        self._lock = threading.Lock()

    def refused(self, method: str, code: Code) -> None:
        """One refusal: a line of its own, or one more in the interval's count."""
        now = self._clock.monotonic()
        closed = self._close_due(now)
        key = (method, str(code))
        with self._lock:
            kind = self._kinds.get(key)
            if kind is None:
                if len(self._kinds) >= _MAX_KINDS:  # unreachable with the fixed vocabularies
                    closed.extend(self._take_all())
                kind = self._kinds[key] = _Kind(started=now)
            write = kind.written < self._burst
            if write:
                kind.written += 1
            else:
                kind.withheld += 1
        self._write_summaries(closed)
        if write:
            self._security.emit(RefusalEvent.AUTH_FAILED, {"method": method, "code": code})

    def flush(self, *, everything: bool = False) -> None:
        """Write the summary of every closed interval (of every interval with ``everything``)."""
        if everything:
            with self._lock:
                closed = self._take_all()
        else:
            closed = self._close_due(self._clock.monotonic())
        self._write_summaries(closed)

    def _close_due(self, now: float) -> list[tuple[tuple[str, str], _Kind]]:
        with self._lock:
            due = [k for k, v in self._kinds.items() if now - v.started >= self._interval]
            return [(k, self._kinds.pop(k)) for k in due]

    def _take_all(self) -> list[tuple[tuple[str, str], _Kind]]:
        taken = list(self._kinds.items())
        self._kinds.clear()
        return taken

    def _write_summaries(self, closed: list[tuple[tuple[str, str], _Kind]]) -> None:
        for (method, code), kind in closed:
            if kind.withheld:
                self._security.emit(
                    REPEATED_EVENT,
                    {
                        "method": method,
                        "code": code,
                        "count": kind.withheld,
                        "seconds": int(self._interval),
                    },
                )
