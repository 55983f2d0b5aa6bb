"""Clocks: wall time for timestamps, monotonic time for deadlines, both injectable for tests.

Callers: intent capture, grants, the use store, host ceilings, rate windows, the journal.
These are the main callers: it is imported across the wings, and its other importers are not
listed.
"""

from __future__ import annotations

import functools
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


# The text of each whole second :func:`format_ms` wrote lately, by the second. A request
# writes timestamps of more than one second (its lines and records are "now", its intent's and
# its grant's expiry are later), so one remembered second was replaced on nearly every call:
# 9 of an ALLOW's 13 calls formatted again (issue 34). At most ``_SECONDS_KEPT`` are kept (the
# dict is emptied when full); a dict's ``get`` and item assignment are each atomic, so threads
# that format at once at worst each format the same second.
_seconds: dict[int, str] = {}
_SECONDS_KEPT = 64


def format_ms(epoch_seconds: float) -> str:
    """Millisecond-precision UTC timestamp with ``Z``: ``2026-08-14T10:00:00.000Z``.

    A request writes about a dozen timestamps (its evidence lines, journal records, intent,
    grant), of a few distinct seconds, and a ``datetime`` and a ``strftime`` per call were 4% of
    a request's CPU (issue 34): the text of each recent second is kept, so a call in a kept
    second formats only its milliseconds. The text of a second is a pure function of the second
    (``strftime`` as before), so the output is the same for every input, and so is every
    exception (the same ``round`` and ``fromtimestamp`` raise it);
    ``tests/test_clock.py`` holds it to the former code."""
    second, millis = divmod(round(epoch_seconds * 1000), 1000)
    text = _seconds.get(second)
    if text is None:
        text = datetime.fromtimestamp(second, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
        if len(_seconds) >= _SECONDS_KEPT:
            _seconds.clear()
        _seconds[second] = text
    return f"{text}.{millis:03d}Z"


def utc_day(epoch_seconds: float) -> str:
    """The UTC day an instant falls on, ``2026-08-14``: the name of a day's journal file."""
    return datetime.fromtimestamp(epoch_seconds, tz=UTC).date().isoformat()


def parse_ms(text: str) -> float:
    """Parse a timestamp written by :func:`format_ms`; anything else raises ``ValueError``.

    A request reads the same few seconds again and again (its intent's capture and expiry, its
    grant's), and a ``strptime`` per call was 7 µs (issue 34): the epoch of each whole second is
    kept (:func:`_epoch_of_second`, a bounded cache of a pure function; a text it refuses is
    refused again each time, never cached), so the value and every exception are those of the
    former code; ``tests/test_clock.py`` holds it to that code."""
    if len(text) != 24 or text[-1] != "Z" or text[19] != ".":
        raise ValueError("not a millisecond UTC timestamp")
    return _epoch_of_second(text[:19]) + int(text[20:23]) / 1000


@functools.lru_cache(maxsize=1024)
def _epoch_of_second(head: str) -> float:
    """The epoch seconds of ``2026-08-14T10:00:00`` (UTC); raises ``ValueError`` as
    ``strptime`` does."""
    return datetime.strptime(head, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC).timestamp()
