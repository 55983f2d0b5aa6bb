"""Start-up recovery and key settlement: what the last process left, settled before new work.

:class:`Recovery` resolves, once the listener is open (``/health`` answers, ``/ready`` and
proposals wait on :class:`~agentsafe.executor.host.workgate.Startup`), every attempt the journal
left open (asked about concurrently) and every in-flight idempotency key the last process of this
journal owned (:meth:`Recovery.settle_orphan_keys`: from what its journal recorded). While the
process runs it asks again about attempts whose outcome is unknown (:meth:`Recovery.recheck_loop`),
settles the keys the lease keeper resolves (:meth:`Recovery.lease_resolved`), lists the open
attempts and the keys it could not settle, and records an operator's decision for one
(:meth:`Recovery.decide_attempt`, ``POST /v1/control/open-attempts/decision``).

Callers: ``plane.py`` (builds and holds it; its control answers and background tasks delegate
here); assembly hands the lease keeper its resolutions and checks through the plane.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from .. import telemetry
from ..clock import Clock
from ..codes import Code
from ..config import ExecutorConfig
from ..errors import AgentSafeError, RequestRejected
from ..events import Streams
from ..host.halt import bound_reason
from ..host.metrics import ExecutorMetrics
from ..host.workgate import Startup
from ..principals import Principal
from ..state.journal import AttemptJournal, JournalScan, ReconciledBy, Settled
from ..state.protocol import UseStore
from ..state.records import OrphanKey, closing_response
from .answers import reconciled_answer
from .attempt import UnknownAttempts
from .catalog import ActionReconciler
from .leases import LeaseKeeper
from .reconcile import (
    Checks,
    Resolution,
    ResolutionStatus,
    reconcile_attempt,
    reconcile_open_attempts,
    report_scan,
)

__all__ = ["RECHECK_SECONDS", "Recovery"]

log = logging.getLogger(__name__)

RECHECK_SECONDS = 15.0
"""How often attempts whose outcome is unknown are asked about again."""

_STILL_OPEN = (ResolutionStatus.STILL_UNKNOWN, ResolutionStatus.BINDING_MISMATCH)


@dataclass
class Recovery:
    """What the last process left and what stays unknown: resolved, settled, listed, decided."""

    config: ExecutorConfig
    store: UseStore
    journal: AttemptJournal | None
    streams: Streams
    clock: Clock
    metrics: ExecutorMetrics
    reconciler: ActionReconciler
    unknown: UnknownAttempts
    """Attempts whose outcome nobody knows now (the pipeline's own set: it adds, this lowers)."""
    startup: Startup
    leases: LeaseKeeper | None = None
    unresolved_keys: list[dict[str, Any]] = field(default_factory=list)
    """In-flight keys start-up could not settle (their attempt is in no journal day file it can
    read): listed by ``open-attempts``, counted as unknown, settled by an operator's decision."""
    decided_keys: dict[str, str] = field(default_factory=dict)
    """Listed keys whose operator decision is journaled but whose use store settle failed: the
    status decided (a second decision must agree)."""

    @property
    def unknown_attempts(self) -> int:
        """Live: attempts nobody knows the outcome of now, plus keys start-up could not settle."""
        return len(self.unknown) + len(self.unresolved_keys)

    async def open_attempts(self) -> list[dict[str, Any]]:
        if self.journal is None:
            return []
        attempts = await self.journal.open_attempts()
        listed = [
            {
                "attempt_id": a.attempt_id,
                "intent_id": a.intent_id,
                "intent_hash": a.intent_hash,
                "action": a.action,
                "principal": a.principal,
                "grant_claimed": a.grant_claimed,
                "grant_id": a.grant_id,
                "state": (
                    a.last_status
                    if a.last_status == "BINDING_MISMATCH"
                    else "UNKNOWN"
                    if a.grant_claimed
                    else "UNCLAIMED"
                ),
            }
            for a in attempts
        ]
        return listed + [dict(key) for key in self.unresolved_keys]

    async def decide_attempt(
        self, *, attempt_id: str, executed: bool, reason: str, principal: Principal
    ) -> dict[str, Any]:
        """An operator's decision for an open attempt nobody else can resolve (a
        BINDING_MISMATCH, a provider that cannot say): RECONCILED by OPERATOR in the journal,
        the key's answer settled from the use store's own record of it, the live count lowered.
        """
        if self.journal is None:
            raise RequestRejected(Code.ATTEMPT_NOT_OPEN, "no open attempt has this id")
        attempt = next(
            (a for a in await self.journal.open_attempts() if a.attempt_id == attempt_id), None
        )
        if attempt is None:
            listed = next((k for k in self.unresolved_keys if k["attempt_id"] == attempt_id), None)
            if listed is None:
                raise RequestRejected(Code.ATTEMPT_NOT_OPEN, "no open attempt has this id")
            return await self._decide_key(
                listed, executed=executed, reason=reason, principal=principal
            )
        status = "COMPLETED" if executed else "NOT_EXECUTED"
        await self.journal.reconciled(
            attempt_id=attempt_id,
            status=status,
            by="OPERATOR",
            reason=reason,
            decided_by=principal.id,
        )
        self.unknown.discard(attempt_id)
        record = await self.store.idempotency_for_attempt(attempt_id)
        if record is not None:
            body = reconciled_answer(
                mode=self.config.executor_mode.value,
                intent_id=attempt.intent_id,
                intent_hash=attempt.intent_hash,
                status=status,
            )
            if body is not None:
                await self.store.idempotency_settle(
                    **record.scope, response={"status": 200, "body": body}, now=self.clock.now()
                )
        self.streams.security.emit(
            "ATTEMPT_DECIDED",
            {
                "attempt_id": attempt_id,
                "intent_hash": attempt.intent_hash,
                "status": status,
                "by": principal.id,
            },
        )
        return {"attempt_id": attempt_id, "status": status, "by": "OPERATOR"}

    async def _decide_key(
        self, listed: dict[str, Any], *, executed: bool, reason: str, principal: Principal
    ) -> dict[str, Any]:
        """An operator's decision for an in-flight key start-up could not settle (its
        attempt is in no journal day file it can read: ``JOURNAL_RECORD_MISSING``), named by
        the attempt id it is listed under. RECONCILED by OPERATOR is journaled first (so the
        next start settles the key from it even if the use store refuses now), then the key
        gets the reconciled answer and leaves the list. A decision, once journaled, is the
        key's: a second one that says otherwise is refused, so "executed" never turns into
        "not executed" (the use store itself never rewrites a settled answer)."""
        assert self.journal is not None
        attempt_id = str(listed["attempt_id"])
        status = "COMPLETED" if executed else "NOT_EXECUTED"
        journaled = self.decided_keys.get(attempt_id)
        if journaled is None:
            await self.journal.reconciled(
                attempt_id=attempt_id,
                status=status,
                by="OPERATOR",
                reason=reason,
                decided_by=principal.id,
            )
            self.decided_keys[attempt_id] = status
        elif journaled != status:
            raise RequestRejected(
                Code.ATTEMPT_ALREADY_DECIDED, "an operator already decided this key otherwise"
            )
        record = await self.store.idempotency_for_attempt(attempt_id)
        body = reconciled_answer(
            mode=self.config.executor_mode.value, intent_id=None, intent_hash="", status=status
        )
        if record is not None and body is not None:
            await self.store.idempotency_settle(
                **record.scope, response={"status": 200, "body": body}, now=self.clock.now()
            )
        self.unresolved_keys.remove(listed)
        self.decided_keys.pop(attempt_id, None)
        decided = {
            "attempt_id": attempt_id,
            "status": status,
            "by": principal.id,
            "record": "JOURNAL_RECORD_MISSING",
            "reason": bound_reason(reason),
        }
        try:
            self.streams.evidence.emit(
                "IDEMPOTENCY_KEY_SETTLED",
                {"attempt_id": attempt_id, "resolution": status, "by": "OPERATOR"},
            )
            self.streams.security.emit("ATTEMPT_DECIDED", decided)
        except AgentSafeError as exc:  # the journal's RECONCILED is the durable record
            log.error("the decision for a key was not chained (%s)", exc.code)
        return {"attempt_id": attempt_id, "status": status, "by": "OPERATOR"}

    def journal_identity(self) -> str | None:
        """The owner this journal records on the keys it begins (``attempts/.identity``)."""
        return None if self.journal is None else self.journal.identity

    def reconcile_checks(self) -> Checks:
        """The cross-checks every reconciliation applies (the use store's claims, the rule
        of when "not executed" may be concluded)."""
        return Checks(
            store=self.store,
            now=self.clock.now,
            settle_margin_s=self.config.downstream_timeout_ms / 1000.0,
        )

    async def reconcile_at_start(self) -> list[Resolution]:
        """Resolve what the last process left (the listener is already open: ``/health``
        answers, ``/ready`` and proposals wait): the journal is read once, its open attempts
        are asked about concurrently, and every in-flight key the last process owned is settled
        from what its journal recorded (see :meth:`settle_orphan_keys`). One trace of its own,
        ``agentsafe.reconcile.start``: the journal appends and the lookups are its children."""
        with telemetry.span("agentsafe.reconcile.start"):
            return await self._reconcile_at_start()

    async def _reconcile_at_start(self) -> list[Resolution]:
        resolutions: list[Resolution] = []
        try:
            if self.journal is not None:
                started = self.clock.now()
                orphans = await self.store.idempotency_orphans(
                    owner=self.journal.identity, before=started
                )
                wanted = frozenset(o.attempt_id for o in orphans if o.attempt_id is not None)
                scan = await self.journal.scan(wanted)
                report_scan(scan, self.streams)
                findings = self.metrics.integrity_findings
                findings.inc(len(scan.torn_lines), finding="JOURNAL_TORN_LINE")
                findings.inc(len(scan.missing_days), finding="JOURNAL_DAY_FILE_MISSING")
                resolutions = await reconcile_open_attempts(
                    self.journal,
                    reconciler=self.reconciler,
                    streams=self.streams,
                    gate=self.leases.gate if self.leases is not None else None,
                    checks=self.reconcile_checks(),
                    scan=scan,
                )
                for resolution in resolutions:
                    await self.settle_idempotency(resolution)
                    if resolution.resolution in _STILL_OPEN:
                        self.unknown.add(resolution.attempt_id)
                await self.settle_orphan_keys(orphans, scan)
        finally:
            self.startup.reconciling = False
        return resolutions

    async def lease_resolved(self, resolution: Resolution) -> None:
        """A resolution by the lease keeper (a taken-over attempt, or one still unknown asked
        again): settle its key; an attempt counted unknown that is now closed no longer keeps
        ``/ready`` from saying ready."""
        await self.settle_idempotency(resolution)
        if resolution.closed:
            self.unknown.discard(resolution.attempt_id)

    async def settle_orphan_keys(self, orphans: list[OrphanKey], scan: JournalScan) -> None:
        """Settle each in-flight key a previous process of this journal left behind.

        ==============================  ================================================
        what the journal says            the key
        ==============================  ================================================
        the attempt is open              left to reconciliation (listed, asked again)
        ATTEMPT_CLOSED with its answer   that answer, replayed to every retry
        RECONCILED COMPLETED / NOT_EX.   the reconciled answer
        RECONCILED UNCLAIMED, or closed  freed (nothing reached the provider)
        before dispatch without answer
        never opened, journal intact     freed (the crash came before ATTEMPT_OPENED)
        never opened, a day file gone    kept in flight, listed, counted, reported
        ==============================  ================================================
        """
        open_ids = {a.attempt_id for a in scan.open_attempts}
        open_scopes = {(a.tenant, a.principal, a.idempotency_key) for a in scan.open_attempts}
        for orphan in orphans:
            if orphan.attempt_id is None or orphan.attempt_id in open_ids:
                continue
            settled = scan.settled.get(orphan.attempt_id)
            if settled is not None:
                await self._settle_from_journal(orphan, settled)
                continue
            if orphan.attempt_id in scan.opened:
                continue  # opened, neither open nor settled: cannot happen; leave it
            if scan.missing_days or (orphan.tenant, orphan.principal, orphan.key) in open_scopes:
                # A day file is gone (or an open attempt with another id claims this key):
                # nothing proves the attempt never started. Keep the key, and say so.
                self.unresolved_keys.append(
                    {
                        "attempt_id": orphan.attempt_id,
                        "principal": orphan.principal,
                        "grant_claimed": None,
                        "state": "JOURNAL_RECORD_MISSING",
                    }
                )
                self.streams.security.emit(
                    "IDEMPOTENCY_KEY_UNRESOLVED",
                    {"attempt_id": orphan.attempt_id, "principal": orphan.principal},
                )
                continue
            await self.store.idempotency_release(**orphan.scope, owner=self.journal_identity())
            self.streams.evidence.emit(
                "IDEMPOTENCY_KEY_SETTLED",
                {"attempt_id": orphan.attempt_id, "resolution": "NEVER_STARTED"},
            )

    async def _settle_from_journal(self, orphan: OrphanKey, settled: Settled) -> None:
        mode = self.config.executor_mode.value
        body: dict[str, Any] | None = None
        if settled.answer is not None:
            body = dict(settled.answer)
        elif settled.status in ("COMPLETED", "NOT_EXECUTED"):
            body = reconciled_answer(
                mode=mode, intent_id=None, intent_hash="", status=str(settled.status)
            )
        elif settled.outcome == "COMPLETED":
            body = reconciled_answer(mode=mode, intent_id=None, intent_hash="", status="COMPLETED")
        if body is None:
            await self.store.idempotency_release(**orphan.scope, owner=self.journal_identity())
            resolution = "NOT_DISPATCHED"
        else:
            await self.store.idempotency_settle(
                **orphan.scope, response=closing_response(body), now=self.clock.now()
            )
            resolution = str(body.get("outcome"))
        self.streams.evidence.emit(
            "IDEMPOTENCY_KEY_SETTLED", {"attempt_id": orphan.attempt_id, "resolution": resolution}
        )

    async def recheck_unknown(self) -> int:
        """Ask the provider again about every attempt counted unknown (a lookup that lagged, a
        provider that was down); settle those it can now resolve. Returns how many closed."""
        if self.journal is None or not len(self.unknown):
            return 0
        with telemetry.span("agentsafe.reconcile.recheck"):
            return await self._recheck_unknown(self.journal)

    async def _recheck_unknown(self, journal: AttemptJournal) -> int:
        wanted = self.unknown.ids()
        closed = 0
        for attempt in await journal.open_attempts():
            if attempt.attempt_id not in wanted or attempt.last_status == "BINDING_MISMATCH":
                continue
            # With a shared store the lease keeper asks again about the attempts this replica
            # owns that a reconciliation left STILL_UNKNOWN (``lifecycle/leases.py``); this loop
            # asks only about those never reconciled, under the lease: one asker per attempt.
            if self.leases is not None and (
                attempt.last_status == "STILL_UNKNOWN" or not await self.leases.gate(attempt)
            ):
                continue
            resolution = await reconcile_attempt(
                attempt,
                journal,
                reconciler=self.reconciler,
                streams=self.streams,
                checks=self.reconcile_checks(),
                by=ReconciledBy.RECHECK,  # a running process asks again: no restart (issue 31)
            )
            if resolution.closed:
                await self.settle_idempotency(resolution)
                self.unknown.discard(attempt.attempt_id)
                closed += 1
        return closed

    async def settle_idempotency(self, resolution: Resolution) -> None:
        """Give a reconciled key its final answer; a key that never reached the provider is freed.

        A key whose outcome is still unknown stays in flight (409 IDEMPOTENCY_IN_PROGRESS): the
        executor asks again at the next start (with a shared store, the lease keeper asks again
        at most once per lease while this replica lives), and the attempt is listed as open.
        """
        key, tenant, principal = (
            resolution.idempotency_key,
            resolution.tenant,
            resolution.principal,
        )
        if key is None or tenant is None or principal is None:
            return
        scope = {"tenant": tenant, "principal": principal, "key": key}
        if resolution.resolution is ResolutionStatus.UNCLAIMED:
            await self.store.idempotency_release(**scope)
            return
        status = {
            ResolutionStatus.RECONCILED_COMPLETED: "COMPLETED",
            ResolutionStatus.RECONCILED_NOT_EXECUTED: "NOT_EXECUTED",
        }.get(resolution.resolution)
        if status is None:
            return
        body = reconciled_answer(
            mode=self.config.executor_mode.value,
            intent_id=resolution.intent_binding.get("intent_id"),
            intent_hash=resolution.intent_hash,
            status=status,
        )
        if body is not None:
            response = {"status": 200, "body": body}
            await self.store.idempotency_settle(**scope, response=response, now=self.clock.now())
            # a key the attempt holds under another name (approvals)
            await self.store.idempotency_settle_attempt(
                resolution.attempt_id, response=response, now=self.clock.now()
            )

    async def recheck_loop(self) -> None:
        """Every :data:`RECHECK_SECONDS`, :meth:`recheck_unknown`."""
        while True:
            await asyncio.sleep(RECHECK_SECONDS)
            try:
                await self.recheck_unknown()
            except AgentSafeError as exc:
                self.streams.security.emit("RECHECK_FAILED", {"code": exc.code})
