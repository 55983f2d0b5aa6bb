"""Counting windows for the door and the halt: rate rules, lockouts and spike detectors.

Everything here counts events on the injected clock's *monotonic* time, so a wall-clock
correction can neither open nor close a window. Memory is bounded: every keyed structure keeps at
most ``max_keys`` keys (least recently touched evicted first) and at most ``count`` timestamps
per key, which is all a sliding window of ``count`` events needs.

Callers: ``door/door.py`` (the unauthenticated window ``EXECUTOR_RATE_LIMIT_UNAUTHENTICATED``,
the per-principal lockout ``EXECUTOR_AUTH_LOCKOUT`` and each principal's ``rate_limit``),
``host/halt.py`` (the spike detectors ``EXECUTOR_HALT_ON_AUTH_FAILURES`` /
``EXECUTOR_HALT_ON_EGRESS_REFUSALS``), ``door/principals_file.py`` (parsing a principal's
``rate_limit``), ``config/parsing.py`` (parsing the rules), ``assembly.py``.
:func:`ceiling_verdict`, the host ceilings' one rule, is applied by every window that keeps them:
``lifecycle/ceilings.py`` (memory), ``state/usestore.py`` (SQLite) and ``state/pgstore.py``
(PostgreSQL).
Also imported by ``config/__init__.py``, ``config/model.py``, ``config/table.py``,
``config/values.py``.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass

from .clock import Clock

__all__ = [
    "DEFAULT_MAX_KEYS",
    "DoorWindows",
    "KeyedWindow",
    "Lockout",
    "LockoutRule",
    "RateRule",
    "SpikeDetector",
    "ceiling_verdict",
]

DEFAULT_MAX_KEYS = 10_000
_RATE = re.compile(r"^([0-9]{1,9})/([0-9]{1,9})$")
_LOCKOUT = re.compile(r"^([0-9]{1,9})/([0-9]{1,9})/([0-9]{1,9})$")
_DISABLED_LOCKOUT = re.compile(r"^0(/[0-9]{1,9}){0,2}$")


def ceiling_verdict(
    count: int,
    total_minor: int,
    amount_minor: int,
    count_limit: int | None,
    sum_limit: int | None,
) -> str | None:
    """Whether one more action of ``amount_minor`` fits a ceiling window that holds ``count``
    actions summing ``total_minor`` now: ``None`` when it fits, else the bound it would pass,
    ``"COUNT"`` (checked first) or ``"SUM"``. A limit of ``None`` is no bound. The one rule of
    the host ceilings' sliding window, whichever store keeps the window."""
    if count_limit is not None and count + 1 > count_limit:
        return "COUNT"
    if sum_limit is not None and total_minor + amount_minor > sum_limit:
        return "SUM"
    return None


@dataclass(frozen=True)
class RateRule:
    """``<count>/<seconds>``: at most ``count`` events in any ``seconds``-long span."""

    count: int
    seconds: int

    @classmethod
    def parse(cls, text: str) -> RateRule:
        """Parse ``<count>/<seconds>`` (both positive integers); ``ValueError`` otherwise.

        The error message never contains the text itself.
        """
        match = _RATE.match(text) if isinstance(text, str) else None
        if match is None:
            raise ValueError("a rate rule is <count>/<seconds>")
        count, seconds = int(match.group(1)), int(match.group(2))
        if count < 1 or seconds < 1:
            raise ValueError("a rate rule needs a positive count and a positive number of seconds")
        return cls(count=count, seconds=seconds)

    def __str__(self) -> str:
        return f"{self.count}/{self.seconds}"


@dataclass(frozen=True)
class LockoutRule:
    """``<failures>/<seconds>/<lock seconds>``; ``failures == 0`` disables locking."""

    failures: int
    seconds: int
    lock_seconds: int

    @property
    def enabled(self) -> bool:
        return self.failures > 0

    @classmethod
    def parse(cls, text: str) -> LockoutRule:
        if isinstance(text, str) and _DISABLED_LOCKOUT.match(text):
            return cls(failures=0, seconds=0, lock_seconds=0)
        match = _LOCKOUT.match(text) if isinstance(text, str) else None
        if match is None:
            raise ValueError("a lockout rule is <failures>/<seconds>/<lock seconds>")
        failures, seconds, lock = (int(match.group(i)) for i in (1, 2, 3))
        if seconds < 1 or lock < 1:
            raise ValueError("a lockout rule needs positive seconds and lock seconds")
        return cls(failures=failures, seconds=seconds, lock_seconds=lock)


class KeyedWindow:
    """A sliding window per key: ``hit`` records an event, ``full`` says the next would exceed.

    Thread-safe; a key's history is at most ``rule.count`` timestamps and at most ``max_keys``
    keys are kept (the least recently touched is forgotten first).
    """

    def __init__(self, rule: RateRule, *, clock: Clock, max_keys: int = DEFAULT_MAX_KEYS) -> None:
        self.rule = rule
        self._clock = clock
        self._max_keys = max_keys
        self._keys: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def _live(self, key: str, now: float) -> deque[float] | None:
        stamps = self._keys.get(key)
        if stamps is None:
            return None
        horizon = now - self.rule.seconds
        while stamps and stamps[0] <= horizon:
            stamps.popleft()
        if not stamps:
            del self._keys[key]
            return None
        return stamps

    def full(self, key: str) -> bool:
        """True when ``rule.count`` events already sit inside the window for ``key``."""
        with self._lock:
            stamps = self._live(key, self._clock.monotonic())
            return stamps is not None and len(stamps) >= self.rule.count

    def count(self, key: str) -> int:
        with self._lock:
            stamps = self._live(key, self._clock.monotonic())
            return 0 if stamps is None else len(stamps)

    def hit(self, key: str) -> int:
        """Record one event for ``key``; returns how many events the window now holds."""
        with self._lock:
            now = self._clock.monotonic()
            stamps = self._live(key, now)
            if stamps is None:
                stamps = deque(maxlen=self.rule.count)
                self._keys[key] = stamps
                while len(self._keys) > self._max_keys:
                    self._keys.popitem(last=False)
            else:
                self._keys.move_to_end(key)
            stamps.append(now)
            return len(stamps)

    def admit(self, key: str) -> bool:
        """Record an event if the window has room; False (and nothing recorded) when full."""
        with self._lock:
            now = self._clock.monotonic()
            stamps = self._live(key, now)
            if stamps is not None and len(stamps) >= self.rule.count:
                return False
        self.hit(key)
        return True

    def retry_after(self, key: str) -> int:
        """Whole seconds until the oldest event of ``key`` leaves the window (at least 1)."""
        with self._lock:
            now = self._clock.monotonic()
            stamps = self._live(key, now)
            if not stamps:
                return 1
            return max(1, int(stamps[0] + self.rule.seconds - now + 0.999))

    def forget(self, key: str) -> None:
        with self._lock:
            self._keys.pop(key, None)

    def __len__(self) -> int:
        return len(self._keys)


class Lockout:
    """Locks a key after ``failures`` failures inside ``seconds``, for ``lock_seconds``.

    A lock ends only when it expires (or the process restarts); there is no unlock call.
    """

    def __init__(
        self, rule: LockoutRule, *, clock: Clock, max_keys: int = DEFAULT_MAX_KEYS
    ) -> None:
        self.rule = rule
        self._clock = clock
        self._max_keys = max_keys
        self._failures = (
            KeyedWindow(RateRule(rule.failures, rule.seconds), clock=clock, max_keys=max_keys)
            if rule.enabled
            else None
        )
        self._locked: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def locked(self, key: str) -> bool:
        with self._lock:
            until = self._locked.get(key)
            if until is None:
                return False
            if self._clock.monotonic() >= until:
                del self._locked[key]
                return False
            return True

    def record_failure(self, key: str) -> bool:
        """Count a proven failure for ``key``; True exactly when this failure placed a lock."""
        if self._failures is None or self.locked(key):
            return False
        if self._failures.hit(key) < self.rule.failures:
            return False
        self._failures.forget(key)
        with self._lock:
            self._locked[key] = self._clock.monotonic() + self.rule.lock_seconds
            self._locked.move_to_end(key)
            while len(self._locked) > self._max_keys:
                self._locked.popitem(last=False)
        return True

    def locked_keys(self) -> tuple[str, ...]:
        with self._lock:
            now = self._clock.monotonic()
            return tuple(k for k, until in self._locked.items() if until > now)


class SpikeDetector:
    """Fires once when ``count`` events fall inside ``seconds``; re-arms after ``reset()``."""

    def __init__(self, rule: RateRule, *, clock: Clock) -> None:
        self.rule = rule
        self._window = KeyedWindow(rule, clock=clock, max_keys=1)
        self._fired = False
        self._lock = threading.Lock()

    def hit(self) -> bool:
        """Record one event; True exactly once, on the event that reaches the threshold."""
        reached = self._window.hit("spike") >= self.rule.count
        with self._lock:
            if reached and not self._fired:
                self._fired = True
                return True
            return False

    def reset(self) -> None:
        with self._lock:
            self._fired = False
        self._window.forget("spike")


class DoorWindows:
    """The three windows the door consults, built from their configuration strings."""

    def __init__(
        self,
        *,
        clock: Clock,
        unauthenticated: RateRule | None = None,
        lockout: LockoutRule | None = None,
        max_keys: int = DEFAULT_MAX_KEYS,
    ) -> None:
        self._clock = clock
        self._max_keys = max_keys
        self.unauthenticated = KeyedWindow(
            unauthenticated or RateRule(20, 60), clock=clock, max_keys=max_keys
        )
        self.lockout = Lockout(lockout or LockoutRule(10, 60, 300), clock=clock, max_keys=max_keys)
        self._principal_windows: dict[str, KeyedWindow] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_config(
        cls,
        *,
        clock: Clock,
        rate_limit_unauthenticated: str = "20/60",
        auth_lockout: str = "10/60/300",
    ) -> DoorWindows:
        return cls(
            clock=clock,
            unauthenticated=RateRule.parse(rate_limit_unauthenticated),
            lockout=LockoutRule.parse(auth_lockout),
        )

    def principal_window(self, principal_id: str, rule: RateRule) -> KeyedWindow:
        """The window of one principal's ``rate_limit``; replaced when the rule changes."""
        with self._lock:
            window = self._principal_windows.get(principal_id)
            if window is None or window.rule != rule:
                window = KeyedWindow(rule, clock=self._clock, max_keys=1)
                self._principal_windows[principal_id] = window
                if len(self._principal_windows) > self._max_keys:
                    oldest = next(iter(self._principal_windows))
                    del self._principal_windows[oldest]
            return window
