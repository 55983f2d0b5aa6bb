"""Poll with a deadline: the suite's one way to wait for something to become true.

Role: every wait in the end-to-end suite (a process listening, a condition set, a pod
recreated) is a probe repeated until it answers or a deadline passes — never a fixed sleep.
Callers: ``e2e/test_scenario.py`` and the scenario backends in this package.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def poll(
    what: str, probe: Callable[[], T | None], *, deadline: float = 60.0, interval: float = 0.2
) -> T:
    """``probe()`` until it returns something other than None; AssertionError after
    ``deadline`` seconds, naming ``what`` was awaited."""
    end = time.monotonic() + deadline
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline:.0f} s waiting for {what}")
        time.sleep(interval)  # polling interval, not synchronisation
