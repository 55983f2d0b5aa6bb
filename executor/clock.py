"""Clocks: wall time for timestamps, monotonic time for deadlines, both injectable for tests.

Callers: intent capture, grants, the use store, host ceilings, rate windows, the journal.
These are the main callers: it is imported across the wings, and its other importers are not
listed.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol

__all__ = ["Clock", "ManualClock", "SystemClock", "format_ms", "parse_ms", "utc_day"]


class Clock(Protocol):
    def now(self) -> float:
        """Wall-clock seconds since the epoch."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (deadlines)."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock a test moves by hand."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = start
        self._mono = 1000.0

    def now(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        self._now += seconds
        self._mono += seconds


def format_ms(epoch_seconds: float) -> str:
    """Millisecond-precision UTC timestamp with ``Z``: ``2026-08-14T10:00:00.000Z``."""
    millis = round(epoch_seconds * 1000)
    dt = datetime.fromtimestamp(millis // 1000, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S") + f".{millis % 1000:03d}Z"


def utc_day(epoch_seconds: float) -> str:
    """The UTC day an instant falls on, ``2026-08-14``: the name of a day's journal file."""
    return datetime.fromtimestamp(epoch_seconds, tz=UTC).date().isoformat()


def parse_ms(text: str) -> float:
    """Parse a timestamp written by :func:`format_ms`; anything else raises ``ValueError``."""
    if len(text) != 24 or text[-1] != "Z" or text[19] != ".":
        raise ValueError("not a millisecond UTC timestamp")
    dt = datetime.strptime(text[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    return dt.timestamp() + int(text[20:23]) / 1000
