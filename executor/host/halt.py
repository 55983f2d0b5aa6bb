"""The halt: easy to reach, hard to leave.

:class:`HaltState` is one flag with the causes that set it. Any cause halts; only an operator's
:meth:`HaltState.resume` (with a reason) clears it, and that is refused with
``409 HALT_CAUSE_PERSISTS`` while the halt file still exists or a posture drift still stands.

Causes: ``OPERATOR`` (with a reason and the principal), ``FILE`` (``EXECUTOR_HALT_FILE`` exists;
:meth:`watch` polls it and a state built while it exists starts halted), ``AUTH_SPIKE``
(``EXECUTOR_HALT_ON_AUTH_FAILURES`` door refusals inside the window), ``EGRESS_SPIKE``
(``EXECUTOR_HALT_ON_EGRESS_REFUSALS``), ``POSTURE_DRIFT`` (stands until
:meth:`posture_restored`), ``CLOCK_SKEW``, ``JOURNAL`` (the attempt journal failed a write; the
only cause lifted without an operator, by :meth:`journal_recovered` once it writes again),
``EFFECT_MISMATCH`` (an observed effect, or a provider's receipt, that is not the authorised
one, under ``EXECUTOR_ON_EFFECT_MISMATCH=HALT``), ``CHAIN_HEADS`` (the evidence chains' heads
cannot be persisted, a full disk; lifted like ``JOURNAL``, by :meth:`chain_heads_recovered` once
a synced probe write lands), ``STORE_LOST_WRITES`` (the shared database lacks grant claims this
replica acknowledged, ``state/lostwrites.py``; lifted only by an operator's resume, after
reconciling the listed keys with the provider, docs/playbooks/store-lost-writes.md).

Each new cause is one ``HALTED`` line on the security stream (cause, reason, by) and each resume
one ``RESUMED`` line; an operator's reason is their own words, kept but bounded in length and
stripped of control characters. Listeners are called with the new halted flag on every change.
A ``HALTED`` line the security stream cannot take (its own chain is failing) is logged and the
halt stands all the same: it never depends on the line.

Under ``EXECUTOR_WORKERS`` above 1 an operator's halt and resume (the control route, on whichever
worker a connection reached) are the group's: :meth:`HaltState.share` links the state to the
group's :class:`~.workers.SharedHalt`, the acting worker records the change there after making it
its own (before the route answers), and every worker's work gate reads it synchronously
(:meth:`HaltState.sync_shared`, one ``stat`` while nothing changed; the gate asks only when
:attr:`HaltState.shared` is set) before it starts new work, so
once a halt is answered no worker starts anything; :meth:`HaltState.follow` also applies every
worker's change within ``HALT_POLL_SECONDS`` for what is not work (``/ready``, the roster; a
worker starting while the group is halted starts halted). The automatic
causes, and the spike detectors that feed them, stay each worker's own: a door refusal spike is
counted per worker, and halts that worker (docs/configuration.md, ``EXECUTOR_WORKERS``).

Callers: ``assembly.py`` builds it and wires what feeds it (the door's
refusal spikes, the egress guard, the posture monitor, the authority client's skew) and what
reads it (503 EXECUTOR_HALTED while halted, ``/ready`` 503); ``routes/control.py`` (the control
routes).
Also imported by ``plane.py``, ``operator/control.py``, ``operator/models.py``.
Also imported by ``workgate.py``, ``lifecycle/recovery.py``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from ..clock import Clock, format_ms
from ..codes import Code
from ..errors import AgentSafeError, RequestRejected
from ..events import EventSink
from ..windows import RateRule, SpikeDetector
from .metrics import ExecutorMetrics
from .workers import HALT_POLL_SECONDS, SharedHalt

__all__ = ["MAX_REASON_CHARS", "HaltCause", "HaltRecord", "HaltState", "bound_reason"]

MAX_REASON_CHARS = 500

_log = logging.getLogger(__name__)


class HaltCause(StrEnum):
    OPERATOR = "OPERATOR"
    FILE = "FILE"
    AUTH_SPIKE = "AUTH_SPIKE"
    EGRESS_SPIKE = "EGRESS_SPIKE"
    POSTURE_DRIFT = "POSTURE_DRIFT"
    CLOCK_SKEW = "CLOCK_SKEW"
    JOURNAL = "JOURNAL"  # the attempt journal cannot write; lifted by itself when it can again
    EFFECT_MISMATCH = "EFFECT_MISMATCH"
    CHAIN_HEADS = "CHAIN_HEADS"  # the chain heads cannot be persisted; lifted like JOURNAL
    STORE_LOST_WRITES = "STORE_LOST_WRITES"  # the database forgot acknowledged claims


@dataclass(frozen=True)
class HaltRecord:
    cause: HaltCause
    reason: str
    by: str | None
    at: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "cause": self.cause.value,
            "reason": self.reason,
            "by": self.by,
            "at": format_ms(self.at),
        }


def bound_reason(text: object) -> str:
    """An operator's reason kept in their words: control characters dropped, length bounded."""
    if not isinstance(text, str):
        return ""
    cleaned = "".join(ch if ch.isprintable() else " " for ch in text).strip()
    return cleaned[:MAX_REASON_CHARS]


class HaltState:
    """Whether the executor takes new work, and why not."""

    def __init__(
        self,
        *,
        clock: Clock,
        security: EventSink,
        halt_file: str | Path | None = None,
        metrics: ExecutorMetrics | None = None,
        auth_spike: RateRule | None = RateRule(50, 60),
        egress_spike: RateRule | None = RateRule(5, 60),
    ) -> None:
        self._clock = clock
        self._security = security
        self._metrics = metrics
        self.halt_file = Path(halt_file) if halt_file is not None else None
        self._auth_spike = SpikeDetector(auth_spike, clock=clock) if auth_spike else None
        self._egress_spike = SpikeDetector(egress_spike, clock=clock) if egress_spike else None
        self._causes: dict[HaltCause, HaltRecord] = {}
        self._posture_checks: set[str] = set()
        self._listeners: list[Callable[[bool], None]] = []
        self._lock = threading.RLock()
        self.shared: SharedHalt | None = None
        """The group's shared halt (:meth:`share`); ``None`` in a single process."""
        self.halted = False
        """Whether any cause stands: set with the causes, under the lock, so the work gate
        reads it before every piece of new work without calling in."""
        self._shared_generation = 0
        self._shared_stamp: tuple[int, int, int] | None = None
        self.check_file()

    # -- reading ------------------------------------------------------------------------------

    @property
    def causes(self) -> tuple[HaltRecord, ...]:
        with self._lock:
            return tuple(self._causes.values())

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {
                "halted": bool(self._causes),
                "causes": [r.as_dict() for r in self._causes.values()],
                "halt_file_present": self._file_present(),
                "posture_drift": sorted(self._posture_checks),
            }

    def add_listener(self, listener: Callable[[bool], None]) -> None:
        with self._lock:
            self._listeners.append(listener)

    # -- halting ------------------------------------------------------------------------------

    def halt(
        self,
        cause: HaltCause,
        *,
        reason: str,
        by: str | None = None,
        _from_worker: int | None = None,
    ) -> bool:
        """Add a cause; True when it is new. An operator's halt needs a non-empty reason (and
        is the whole group's under ``EXECUTOR_WORKERS``, see :meth:`share`)."""
        text = bound_reason(reason)
        if cause is HaltCause.OPERATOR and not text:
            raise RequestRejected(Code.REASON_REQUIRED, "a halt needs a reason")
        with self._lock:
            if cause in self._causes:
                return False
            was_halted = bool(self._causes)
            self._causes[cause] = HaltRecord(cause=cause, reason=text, by=by, at=self._clock.now())
            self.halted = True
            listeners = list(self._listeners)
        line: dict[str, Any] = {"cause": cause.value, "reason": text, "by": by}
        if _from_worker is not None:
            line["from_worker"] = _from_worker
        try:
            self._security.emit("HALTED", line)
        except AgentSafeError as exc:  # a failing chain: the halt stands without its line
            _log.error("HALTED (cause %s) was not recorded (%s)", cause.value, exc.code)
        if cause is HaltCause.OPERATOR and _from_worker is None:
            self._share(halted=True, reason=text, by=by)
        if self._metrics is not None:
            self._metrics.halts.inc(cause=cause.value)
        if not was_halted:
            for listener in listeners:
                listener(True)
        return True

    def resume(self, *, reason: str, by: str | None, _from_worker: int | None = None) -> None:
        """An operator takes work again; refused while the halt file or a posture drift stands.
        Under ``EXECUTOR_WORKERS`` every worker follows it (each refuses it while a cause of
        its own stands)."""
        text = bound_reason(reason)
        if not text:
            raise RequestRejected(Code.REASON_REQUIRED, "a resume needs a reason")
        with self._lock:
            if self._file_present() or self._posture_checks:
                raise RequestRejected(
                    Code.HALT_CAUSE_PERSISTS, "the cause of the halt still stands"
                )
            if not self._causes:
                if _from_worker is None:
                    self._share(halted=False, reason=text, by=by)
                return
            cleared = [c.value for c in self._causes]
            self._causes.clear()
            self.halted = False
            if self._auth_spike is not None:
                self._auth_spike.reset()
            if self._egress_spike is not None:
                self._egress_spike.reset()
            listeners = list(self._listeners)
        line: dict[str, Any] = {"reason": text, "by": by, "causes": cleared}
        if _from_worker is not None:
            line["from_worker"] = _from_worker
        self._security.emit("RESUMED", line)
        if _from_worker is None:
            self._share(halted=False, reason=text, by=by)
        for listener in listeners:
            listener(False)

    # -- the group (EXECUTOR_WORKERS) ---------------------------------------------------------

    def share(self, shared: SharedHalt) -> None:
        """Follow the group's operator halts from now on; halts at once if the group is."""
        self.shared = shared
        record = shared.read()
        if record is not None:
            self._shared_generation = int(record["generation"])
            if record.get("halted") is True:
                self.halt(
                    HaltCause.OPERATOR,
                    reason=str(record.get("reason") or "halted by another worker"),
                    by=record.get("by") if isinstance(record.get("by"), str) else None,
                    _from_worker=int(record.get("worker", -1)),
                )

    def _share(self, *, halted: bool, reason: str, by: str | None) -> None:
        if self.shared is not None:
            generation = self.shared.publish(halted=halted, reason=reason, by=by)
            with self._lock:
                self._shared_generation = max(self._shared_generation, generation)

    def sync_shared(self) -> None:
        """Apply the group's shared halt now if it changed since it was last read: one ``stat``
        when it did not. The work gate calls this before every piece of new work, so an
        operator's halt answered on any worker holds here at once, not at the next poll."""
        shared = self.shared
        if shared is None:
            return
        stamp = shared.stamp()
        if stamp is None or stamp == self._shared_stamp:
            return
        self._shared_stamp = stamp
        self.apply_shared(shared.read())

    def check_shared(self) -> bool:
        """Apply the group's latest operator halt or resume once; True when one was new."""
        return self.apply_shared(self.shared.read() if self.shared is not None else None)

    def apply_shared(self, record: dict[str, Any] | None) -> bool:
        """Apply a record read from the group's shared halt; True when it was new."""
        if record is None:
            return False
        generation = int(record["generation"])
        with self._lock:
            if generation <= self._shared_generation:
                return False
            self._shared_generation = generation
        origin = record.get("worker")
        worker = origin if isinstance(origin, int) else -1
        by = record.get("by") if isinstance(record.get("by"), str) else None
        reason = str(record.get("reason") or "")
        if record.get("halted") is True:
            self.halt(HaltCause.OPERATOR, reason=reason or "halted", by=by, _from_worker=worker)
        else:
            try:
                self.resume(reason=reason or "resumed", by=by, _from_worker=worker)
            except RequestRejected:  # a cause of this worker's own still stands: stay halted
                self._security.emit(
                    "RESUME_NOT_FOLLOWED",
                    {"code": Code.HALT_CAUSE_PERSISTS, "from_worker": worker},
                )
        return True

    async def follow(self, *, interval: float = HALT_POLL_SECONDS) -> None:
        """Poll the group's shared halt every ``interval`` seconds until cancelled: read in a
        thread, applied on the event loop (its listeners run there)."""
        shared = self.shared
        if shared is None:
            return
        while True:
            self.apply_shared(await asyncio.to_thread(shared.read))
            await asyncio.sleep(interval)

    # -- automatic causes ---------------------------------------------------------------------

    def record_auth_refusal(self) -> None:
        """One refusal at the door; a spike halts (``AUTH_SPIKE``)."""
        if self._auth_spike is not None and self._auth_spike.hit():
            self.halt(HaltCause.AUTH_SPIKE, reason="door refusals crossed the threshold")

    def record_egress_refusal(self) -> None:
        """One refused outbound request; a spike halts (``EGRESS_SPIKE``)."""
        if self._egress_spike is not None and self._egress_spike.hit():
            self.halt(HaltCause.EGRESS_SPIKE, reason="egress refusals crossed the threshold")

    def posture_drift(self, check: str) -> None:
        """A posture check regressed; halts, and resume is refused until it is restored."""
        with self._lock:
            self._posture_checks.add(check)
        self.halt(HaltCause.POSTURE_DRIFT, reason=f"posture check {check} drifted")

    def posture_restored(self, check: str | None = None) -> None:
        """A drifted check (or, with None, every check) holds again; the halt itself stays."""
        with self._lock:
            if check is None:
                self._posture_checks.clear()
            else:
                self._posture_checks.discard(check)

    def journal_failed(self) -> bool:
        """The attempt journal stopped taking records (``JOURNAL``); True when newly halted."""
        return self.halt(HaltCause.JOURNAL, reason="the attempt journal cannot write")

    def journal_recovered(self) -> None:
        """The journal's storage takes synced writes again: its own cause is lifted (one of the
        two causes that lift themselves: nothing was executed while it stood, and nothing else
        halted is cleared). One ``RESUMED`` line when no other cause remains."""
        self._lift(HaltCause.JOURNAL, "journal recovered", "the attempt journal recovered")

    def chain_heads_failed(self) -> bool:
        """The evidence chains' heads cannot be persisted (``CHAIN_HEADS``); True when newly
        halted."""
        return self.halt(HaltCause.CHAIN_HEADS, reason="the chain heads cannot be persisted")

    def chain_heads_recovered(self) -> None:
        """A synced probe write of the chain heads landed: their own cause is lifted, as
        :meth:`journal_recovered` lifts ``JOURNAL``."""
        self._lift(HaltCause.CHAIN_HEADS, "chain heads recovered", "the chain heads recovered")

    def has_cause(self, cause: HaltCause) -> bool:
        with self._lock:
            return cause in self._causes

    def _lift(self, cause: HaltCause, reason: str, resumed_reason: str) -> None:
        with self._lock:
            if self._causes.pop(cause, None) is None:
                return
            resumed = not self._causes
            self.halted = not resumed
            listeners = list(self._listeners) if resumed else []
        try:
            self._security.emit("HALT_CAUSE_LIFTED", {"cause": cause.value, "reason": reason})
            if resumed:
                self._security.emit(
                    "RESUMED", {"reason": resumed_reason, "by": None, "causes": [cause.value]}
                )
        except AgentSafeError as exc:  # the cause is lifted all the same
            _log.error("the lift of cause %s was not recorded (%s)", cause.value, exc.code)
        for listener in listeners:
            listener(False)

    def effect_mismatch(self, grant_id: str) -> None:
        """An observed effect that is not the authorised one (``EXECUTOR_ON_EFFECT_MISMATCH=HALT``):
        an operator reconciles it, then resumes."""
        self.halt(HaltCause.EFFECT_MISMATCH, reason=f"effect mismatch under grant {grant_id}")

    def store_lost_writes(self, count: int) -> bool:
        """The shared database lacks ``count`` grant claims this replica acknowledged
        (``STORE_LOST_WRITES``): an operator reconciles the listed keys with the provider, then
        resumes. True when newly halted."""
        return self.halt(
            HaltCause.STORE_LOST_WRITES,
            reason=f"the shared store lacks {count} acknowledged grant claim(s)",
        )

    def clock_skew(self, skew_ms: float) -> None:
        self.halt(HaltCause.CLOCK_SKEW, reason=f"authority clock skew of {int(skew_ms)} ms")

    # -- the halt file ------------------------------------------------------------------------

    def _file_present(self) -> bool:
        return self.halt_file is not None and self.halt_file.exists()

    def check_file(self) -> bool:
        """Poll the halt file once; halts (``FILE``) when it exists. True when newly halted."""
        if self._file_present():
            return self.halt(HaltCause.FILE, reason="the halt file exists")
        return False

    async def watch(self, *, interval: float = 1.0) -> None:
        """Poll the halt file every ``interval`` seconds until cancelled."""
        while True:
            await asyncio.to_thread(self.check_file)
            await asyncio.sleep(interval)
