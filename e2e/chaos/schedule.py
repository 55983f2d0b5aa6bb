"""The seeded fault schedule: which fault, on which replica, at which lifecycle point, for how long.

Role: everything the nemesis will do is decided here from the seed alone (``random.Random(seed)``),
so a failing seed replays the same schedule (``make chaos SEED=n``). The timing of real processes
is not replayed to the microsecond; each point-targeted fault waits for an observable sign of its
point (the database row, the provider's record) before it strikes, and the history notes what was
observed.

Fault classes: ``pause`` and ``kill`` (SIGSTOP/SIGCONT; SIGKILL and a restart) at each of
:data:`POINTS`, ``partition-db`` and ``partition-provider`` (toxiproxy), ``failover-sync`` and
``failover-async`` (a crashed primary, a promoted standby), ``clock-step`` (libfaketime on ``r2``).
The short run has every class once, in a seeded order; the long run draws classes until its time
budget is spent.

Callers: ``chaos/run.py``.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "FAULT_CLASSES",
    "POINTS",
    "Episode",
    "long_schedule",
    "short_schedule",
]

POINTS = ("before-open", "after-open", "after-claim", "during-send", "after-send")
FAULT_CLASSES: tuple[str, ...] = (
    *(f"pause@{p}" for p in POINTS),
    *(f"kill@{p}" for p in POINTS),
    "partition-db",
    "partition-provider",
    "failover-sync",
    "failover-async",
    "clock-step",
)
#: What one episode of each kind costs, roughly, in seconds (the long run's budget).
_COST = {"pause": 16, "kill": 14, "partition": 14, "failover": 20, "clock": 12}


@dataclass(frozen=True)
class Episode:
    index: int
    fault: str  # one of FAULT_CLASSES
    replica: int
    key: str
    amount: int
    hold_seconds: float
    clock_offset: int = 0

    @property
    def kind(self) -> str:
        return self.fault.split("@")[0]

    @property
    def point(self) -> str | None:
        return self.fault.split("@")[1] if "@" in self.fault else None

    def describe(self) -> str:
        extra = f" offset {self.clock_offset:+d} s" if self.fault == "clock-step" else ""
        return (
            f"#{self.index} {self.fault} r{self.replica} key {self.key}"
            f" hold {self.hold_seconds:.1f} s{extra}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "describe": self.describe()}


def _episode(rng: random.Random, seed: int, index: int, fault: str) -> Episode:
    replica = 2 if fault == "clock-step" else rng.randrange(3)
    return Episode(
        index=index,
        fault=fault,
        replica=replica,
        key=f"s{seed}-e{index}-{fault.replace('@', '-')}",
        amount=100 + rng.randrange(900),
        hold_seconds=round(rng.uniform(1.5, 3.0), 1),
        clock_offset=rng.choice((-120, -45, 45, 120)) if fault == "clock-step" else 0,
    )


def short_schedule(seed: int, only: tuple[str, ...] = ()) -> list[Episode]:
    """Every fault class once (or only those in ``only``), in an order drawn from ``seed``."""
    rng = random.Random(seed)
    classes = list(only or FAULT_CLASSES)
    rng.shuffle(classes)
    return [_episode(rng, seed, index, fault) for index, fault in enumerate(classes)]


def long_schedule(seed: int, seconds: float) -> list[Episode]:
    """Every class once, then classes drawn at random until about ``seconds`` are spent."""
    rng = random.Random(seed)
    episodes = short_schedule(seed)
    budget = sum(_cost(e.fault) for e in episodes)
    while budget < seconds:
        fault = rng.choice(FAULT_CLASSES)
        episodes.append(_episode(rng, seed, len(episodes), fault))
        budget += _cost(fault)
    return episodes


def _cost(fault: str) -> float:
    kind = fault.split("@")[0].split("-")[0]
    return _COST.get(kind, 15)
