"""The work gate: why new enforcement work is refused right now, and the two states it reads
beside the halt and the posture (the shared store's health, start-up reconciliation).

:class:`WorkGate` answers, in this order: a posture regression (``POSTURE_DEGRADED``), a halt
(``EXECUTOR_HALTED``, the group's halt synced first under ``EXECUTOR_WORKERS``), a shared store
that does not answer (``STORE_UNAVAILABLE``), start-up reconciliation still running
(``EXECUTOR_RECONCILING``); ``None`` when work may start. It sits below the pipeline, which is
given its ``refusal`` as a callable and asks it before anything else. The posture monitor and
the halt keep their verdicts in attributes the gate reads (``degraded``, ``halted``); under
``EXECUTOR_WORKERS`` the gate also syncs the group's halt first, on every request.

:class:`StoreHealth` is whether the shared store answered its last ping; :func:`watch_store`
pings it once a second, each ping under its own deadline. :class:`Startup` says whether start-up
reconciliation is still running (the listener is already open).

Callers: ``assembly.py`` (builds the gate and hands its ``refusal`` to the pipeline),
``plane.py`` (readiness, the store's health loop, the plan routes' gate),
``lifecycle/recovery.py`` (ends start-up).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ..codes import Code
from ..events import EventSink
from .halt import HaltState
from .posture import PostureMonitor

__all__ = [
    "READY_FOLLOWS_STORE_SECONDS",
    "STORE_PING_SECONDS",
    "STORE_PING_TIMEOUT_SECONDS",
    "Startup",
    "StoreHealth",
    "WorkGate",
    "watch_store",
]

STORE_PING_SECONDS = 1.0
"""How often each replica asks the shared store whether it answers."""
STORE_PING_TIMEOUT_SECONDS = 1.0
"""How long one ping may take before the store counts as not answering (issue 31, item 3)."""
READY_FOLLOWS_STORE_SECONDS = STORE_PING_SECONDS + STORE_PING_TIMEOUT_SECONDS
"""The documented bound (docs/high-availability.md): ``/ready`` follows the store within it."""


@dataclass
class StoreHealth:
    """Whether the shared store answered its last ping (:func:`watch_store`)."""

    available: bool = True


@dataclass
class Startup:
    """Whether start-up reconciliation is still running (the listener is already open)."""

    reconciling: bool = False


@dataclass(frozen=True)
class WorkGate:
    """Why new enforcement work is refused right now: a posture regression, a halt, a shared
    store that does not answer, then start-up reconciliation still running."""

    halt: HaltState
    posture_monitor: PostureMonitor
    store: StoreHealth = field(default_factory=StoreHealth)
    startup: Startup = field(default_factory=Startup)

    def refusal(self) -> Code | None:
        # The monitors keep their verdicts in plain attributes (set as they change), read here
        # without a call; only the group's halt is read from its file, on every request.
        if self.posture_monitor.degraded:
            return Code.POSTURE_DEGRADED
        halt = self.halt
        if halt.shared is not None:  # the group's halt, as answered on any worker
            halt.sync_shared()  # (EXECUTOR_WORKERS): one stat while it did not change
        if halt.halted:
            return Code.EXECUTOR_HALTED
        if not self.store.available:
            return Code.STORE_UNAVAILABLE
        if self.startup.reconciling:
            return Code.EXECUTOR_RECONCILING
        return None


async def watch_store(
    ping: Callable[[], Awaitable[bool]], health: StoreHealth, security: EventSink
) -> None:
    """Ask the shared store once a second: while it does not answer, new proposals get 503
    STORE_UNAVAILABLE and ``/ready`` is 503; both resume by themselves when it answers.

    A ping has its own deadline (:data:`STORE_PING_TIMEOUT_SECONDS`): left to the pool, a
    stopped server made it wait for the connect timeout (5 s), twice (a stale connection,
    then a new one), so ``/ready`` stayed 200 for about 11 s. Within
    :data:`READY_FOLLOWS_STORE_SECONDS` now."""
    while True:
        try:
            async with asyncio.timeout(STORE_PING_TIMEOUT_SECONDS):
                available = await ping()
        except TimeoutError:
            available = False
        if available != health.available:
            health.available = available
            security.emit("STORE_AVAILABLE" if available else "STORE_UNAVAILABLE", {})
        await asyncio.sleep(STORE_PING_SECONDS)
