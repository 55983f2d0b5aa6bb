"""The control plane: one assembled executor, what its control routes ask, and its lifecycle.

:class:`Executor` holds every component :func:`~agentsafe.executor.assembly.assemble` built and
answers what the operator's routes ask (status, open attempts, secret reload, evidence export,
readiness); it runs startup reconciliation, the listener and the background polls (halt file,
secret files, posture drift, TLS material, JWKS), and closes everything in reverse order.
:class:`WorkGate` is why new enforcement work is refused right now (a posture regression, a halt):
the pipeline asks it before anything else, without knowing the control plane.

Callers: ``assembly.py`` (builds both), tests; the process runs what ``assemble`` returns. The
control routes know it only through their ``ControlPlane`` protocol.
Also imported by ``proxy.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from .clock import Clock, format_ms
from .codes import Code
from .config import EscalationMode, ExecutorConfig, ExecutorMode
from .dispatch.seam import Registry
from .door.door import LegacyCaller
from .door.passkeys import Passkeys
from .door.principals_file import PrincipalSet
from .door.workload import JwksSource
from .egress.webhook import ApprovalWebhook
from .errors import AgentSafeError, ConfigError, RequestRejected, StoreError
from .events import Streams
from .evidence.bundle import BundleError, export_bundle
from .evidence.chain import ChainedStreams, ChainHead, ChainSnapshot
from .evidence.redact import Redactor
from .host.halt import HaltCause, HaltState, bound_reason
from .host.metrics import ExecutorMetrics, StateSnapshot
from .host.posture import PostureMonitor, PostureReport
from .host.secrets import SecretStore
from .host.tlsctx import ReloadingTlsContext
from .host.workers import EXPORT_POLL_SECONDS, PUBLISH_SECONDS, WorkerLink
from .lifecycle.answers import reconciled_answer
from .lifecycle.catalog import ActionReconciler, PolicyCatalog
from .lifecycle.leases import LeaseKeeper
from .lifecycle.pipeline import Pipeline
from .lifecycle.reconcile import (
    Checks,
    Resolution,
    ResolutionStatus,
    reconcile_attempt,
    reconcile_open_attempts,
    report_scan,
)
from .lifecycle.shadow import ShadowReport
from .plans.service import PlanService
from .policy.authority import LocalAuthority
from .policy.policy import CompiledPolicy
from .principals import Principal
from .routes.app import ReadyState, Route, build_app
from .routes.door import HttpDoor
from .routes.listener import GuardedSite, ListenerLimits, handler_settings
from .routes.table import Approvals, route_table
from .state.backend import Backend
from .state.journal import AttemptJournal, JournalScan, ReconciledBy, Settled
from .state.lostwrites import LostClaim, LostWritesGuard
from .state.protocol import UseStore
from .state.records import ApprovalState, OrphanKey

__all__ = ["DRAIN_SECONDS", "Executor", "Startup", "WorkGate"]

_STILL_OPEN = (ResolutionStatus.STILL_UNKNOWN, ResolutionStatus.BINDING_MISMATCH)

log = logging.getLogger(__name__)

DRAIN_SECONDS = 20.0
HALT_FILE_POLL_SECONDS = 0.5
STREAMS = ("evidence", "security")
EXPORT_PEER_SECONDS = 5.0
"""How long an evidence export waits for the other workers' windows (``EXECUTOR_WORKERS``)."""
SECRETS_POLL_SECONDS = 5.0
REFUSAL_LINES_POLL_SECONDS = 2.0


STORE_PING_SECONDS = 1.0
"""How often each replica asks the shared store whether it answers."""
STORE_PING_TIMEOUT_SECONDS = 1.0
"""How long one ping may take before the store counts as not answering (issue 31, item 3)."""
READY_FOLLOWS_STORE_SECONDS = STORE_PING_SECONDS + STORE_PING_TIMEOUT_SECONDS
"""The documented bound (docs/high-availability.md): ``/ready`` follows the store within it."""
JOURNAL_CHECK_SECONDS = 0.5
"""How often a failed journal is retried (recovery); the halt itself comes from the failing
append, at once."""
METRICS_STORE_SECONDS = 2.0
"""How long a scrape waits for the store's count of pending escalations (else: the last one)."""
RECHECK_SECONDS = 15.0
"""How often attempts whose outcome is unknown are asked about again."""


@dataclass
class StoreHealth:
    """Whether the shared store answered its last ping (:meth:`Executor._store_health_loop`)."""

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
        if self.posture_monitor.is_degraded():
            return Code.POSTURE_DEGRADED
        self.halt.sync_shared()  # the group's halt, as answered on any worker (EXECUTOR_WORKERS)
        if self.halt.halted:
            return Code.EXECUTOR_HALTED
        if not self.store.available:
            return Code.STORE_UNAVAILABLE
        if self.startup.reconciling:
            return Code.EXECUTOR_RECONCILING
        return None


@dataclass
class Executor:
    """Everything one executor process holds, and its lifecycle."""

    config: ExecutorConfig
    environ: Mapping[str, str]
    streams: Streams
    clock: Clock
    secrets: SecretStore
    store: UseStore
    journal: AttemptJournal | None
    authority: LocalAuthority
    registry: Registry
    transport: Any
    pipeline: Pipeline
    policy: CompiledPolicy
    shadow: ShadowReport
    metrics: ExecutorMetrics
    halt: HaltState
    door: HttpDoor
    jwks: JwksSource | None
    tls: ReloadingTlsContext | None
    posture: PostureReport
    posture_monitor: PostureMonitor
    redactor: Redactor
    load_principals: Callable[[], PrincipalSet]
    """Re-reads ``EXECUTOR_PRINCIPALS_FILE`` (``assembly.load_principals``, bound at start)."""
    backend: Backend
    """The store the configuration names (``state/backend.py``); ``store`` is its use store."""
    chained: ChainedStreams | None = None
    plans: PlanService | None = None
    leases: LeaseKeeper | None = None
    lost_writes: LostWritesGuard | None = None
    """With a shared store: checks each new database server against this replica's journal."""
    webhook: ApprovalWebhook | None = None  # EXECUTOR_APPROVAL_WEBHOOK_URL
    store_health: StoreHealth = field(default_factory=StoreHealth)  # the WorkGate's too
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    """What registration functions asked to close at stop (``seam.on_close``), run in reverse."""
    startup: Startup = field(default_factory=lambda: Startup(reconciling=True))  # and this
    worker: WorkerLink | None = None
    """Under ``EXECUTOR_WORKERS`` above 1: this worker's index and its group's runtime files."""
    routes: tuple[Route, ...] = field(init=False)
    app: web.Application = field(init=False)
    port: int = 0
    site: GuardedSite | None = None
    unresolved_keys: list[dict[str, Any]] = field(default_factory=list)
    """In-flight keys start-up could not settle (their attempt is in no journal day file it can
    read): listed by ``open-attempts``, counted as unknown, settled by an operator's decision."""
    _decided_keys: dict[str, str] = field(default_factory=dict)
    """Listed keys whose operator decision is journaled but whose use store settle failed: the
    status decided (a second decision must agree)."""
    _pending_escalations: int = 0
    """The last count the store gave (kept while the store does not answer)."""
    _runner: web.AppRunner | None = None
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        approvals = None
        if self.config.executor_escalation is EscalationMode.APPROVAL:
            origin = self.config.executor_approval_origin
            approvals = Approvals(
                store=self.store,
                streams=self.streams,
                clock=self.clock,
                passkeys=Passkeys(
                    store=self.store, signer=self.authority, clock=self.clock, origin=origin
                ),
                principal_named=self.principal_named,
                cancel_escalation=self.pipeline.cancel_escalation,
                origin=origin,
            )
        self.routes = route_table(
            pipeline=self.pipeline,
            readiness=self.readiness,
            jwks=self.authority.jwks,
            plane=self,
            plans=self.plans,
            approvals=approvals,
        )
        self.app = build_app(
            self.routes,
            door=self.door,
            body_timeout=float(self.config.executor_body_timeout_seconds),
            metrics=self.metrics,
        )
        if self.journal is not None:
            self.journal.on_failure = self._journal_failed
        if self.chained is not None:
            self.chained.on_failure(self._chain_heads_failed)
        if self.lost_writes is not None:
            guard = self.lost_writes
            guard.on_lost = self._store_lost_writes
            if guard.lost:  # found at start, before this plane existed
                self._store_lost_writes(list(guard.lost.values()))
            # An operator's resume is the acknowledgement: the list (and the operator's
            # StoreLostWrites condition) clears; the claims stay reasserted in the database.
            self.halt.add_listener(lambda halted: None if halted else guard.lost.clear())
        if self.worker is not None:  # the roster shows a halt at once, not at the next second
            self.halt.add_listener(lambda halted: self.publish_worker())

    @property
    def reconciling(self) -> bool:
        return self.startup.reconciling

    def _store_lost_writes(self, found: list[LostClaim]) -> None:
        """The shared database lacks grant claims this replica acknowledged (a failover that
        lost writes): one ``STORE_LOST_WRITES`` line naming them, and the halt (cause
        ``STORE_LOST_WRITES``) an operator lifts after reconciling them with the provider."""
        self.streams.security.emit(
            "STORE_LOST_WRITES",
            {
                "code": Code.STORE_LOST_WRITES,
                "count": len(found),
                "claims": [claim.as_dict() for claim in found],
            },
        )
        total = len(self.lost_writes.lost) if self.lost_writes is not None else len(found)
        self.halt.store_lost_writes(total)

    def store_lost_writes(self) -> list[dict[str, Any]]:
        """The claims the shared database lost (``GET /v1/control/status``)."""
        if self.lost_writes is None:
            return []
        return [claim.as_dict() for claim in self.lost_writes.lost.values()]

    @property
    def unknown_attempts(self) -> int:
        """Live: attempts nobody knows the outcome of now, plus keys start-up could not settle."""
        return len(self.pipeline.unknown) + len(self.unresolved_keys)

    # -------------------------------------------------------------- what routes ask

    def work_refusal(self) -> Code | None:
        """The work gate the pipeline asks, for the routes that execute outside it (a plan
        step): why new work is refused right now, ``None`` when it is not."""
        return WorkGate(self.halt, self.posture_monitor, self.store_health).refusal()

    def principal_named(self, principal_id: str) -> Principal | None:
        """The principal of the current principals file with this id (``None``: none)."""
        principals = self.door.door.principals
        if isinstance(principals, LegacyCaller):
            return None
        record = principals.get(principal_id)
        return None if record is None else record.principal

    def readiness(self) -> ReadyState:
        """Ready or not, the one code that says why (anonymous ``GET /ready`` answers only
        these two), and the details an OPERATOR reads in ``GET /v1/control/status``."""
        details: dict[str, Any] = {
            "mode": self.config.executor_mode.value,
            "actions": list(self.policy.actions),
            "unknown_attempts": self.unknown_attempts,
            "reconciling": self.reconciling,
            "halted": self.halt.halted,
            "store": self.backend.name,
            "store_available": self.store_health.available,
        }
        if self.lost_writes is not None:
            details["store_lost_writes"] = len(self.lost_writes.lost)
        if self.halt.halted:
            code = Code.EXECUTOR_HALTED
        elif not self.store_health.available:
            code = Code.STORE_UNAVAILABLE
        elif self.reconciling:
            code = Code.RECONCILING
        elif self.config.executor_ready_requires_no_unknown_attempts and self.unknown_attempts:
            code = Code.UNKNOWN_ATTEMPTS_OPEN
        else:
            code = Code.READY
        ready = code is Code.READY
        details["ready"] = ready
        details["code"] = code
        return ReadyState(ready=ready, code=code, details=details)

    async def status(self) -> dict[str, Any]:
        door = self.door.door.principals
        summary = door.summary() if hasattr(door, "summary") else []
        out: dict[str, Any] = {
            "mode": self.config.executor_mode.value,
            "actions": list(self.policy.actions),
            "principals": summary,
            "halt": self.halt.status(),
            "posture": self.posture.as_status(),
            "posture_drift": list(self.posture_monitor.drifted_checks()),
            "unknown_attempts": self.unknown_attempts,
            "readiness": dict(self.readiness().details),
            "open_attempts": await self.open_attempts(),
            "policy_digest": self.policy.digest,
            "chain_heads": self._heads(),
        }
        if self.lost_writes is not None:
            out["store_lost_writes"] = self.store_lost_writes()
        if self.config.executor_mode is ExecutorMode.SHADOW:
            out["shadow_report"] = self.shadow.as_dict()
        if self.worker is not None:
            self.publish_worker()  # this worker's own entry is never a second old
            out["worker"] = self.worker.index
            out["workers"] = await asyncio.to_thread(self.worker.roster)
        return out

    def publish_worker(self) -> None:
        """This worker's entry in its group's roster (``host/workers.py``)."""
        if self.worker is None:
            return
        with contextlib.suppress(OSError):
            self.worker.publish(
                {
                    "pid": os.getpid(),
                    "ready": self.readiness().ready,
                    "halted": self.halt.halted,
                    "reconciling": self.reconciling,
                    "open_attempts": (self.journal.open_count if self.journal is not None else 0)
                    + len(self.unresolved_keys),
                    "updated_at": format_ms(self.clock.now()),
                }
            )

    async def _worker_loop(self) -> None:
        """Publish this worker's entry every second; refresh its multiprocess state gauges
        every few (a scrape on another worker reads them)."""
        turns, parent = 0, os.getppid()
        while True:
            if os.getppid() != parent:  # the supervisor is gone: never serve unsupervised
                log.error("the supervisor exited; this worker stops")
                signal.raise_signal(signal.SIGTERM)
            self.publish_worker()
            if turns % 5 == 0 and self.metrics.multiprocess_dir is not None:
                with contextlib.suppress(AgentSafeError, OSError):
                    self.metrics.set_state(await self.metrics_state())
            turns += 1
            await asyncio.sleep(PUBLISH_SECONDS)

    async def metrics_state(self) -> StateSnapshot:
        """What the state gauges show at a scrape. Nothing here reads the journal's day files
        (the open count is kept live) or waits on a store that does not answer."""
        now = self.clock.now()
        if (
            self.config.executor_escalation is EscalationMode.APPROVAL
            and self.store_health.available
        ):
            with contextlib.suppress(StoreError, TimeoutError):
                async with asyncio.timeout(METRICS_STORE_SECONDS):
                    pending = await self.store.approval_list(state=ApprovalState.PENDING, now=now)
                self._pending_escalations = len(pending)
        journal_bytes = 0
        if self.journal is not None:
            with contextlib.suppress(OSError):
                journal_bytes = await asyncio.to_thread(self.journal.size_bytes)
        expiry: dict[str, float] = {}
        if self.tls is not None:
            expiry = await asyncio.to_thread(self.tls.certificate_expiry, now)
        return StateSnapshot(
            halted=self.halt.halted,
            open_attempts=(self.journal.open_count if self.journal is not None else 0)
            + len(self.unresolved_keys),
            unknown_attempts=self.unknown_attempts,
            pending_escalations=self._pending_escalations,
            journal_bytes=journal_bytes,
            store_available=self.store_health.available,
            certificate_expiry_seconds=expiry,
        )

    def action_catalog(self, principal: Principal) -> list[dict[str, Any]]:
        """``GET /v1/actions``: what ``principal`` may propose here (``lifecycle/catalog.py``)."""
        return PolicyCatalog(self.policy, self.registry).describe(principal)

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
        self.pipeline.unknown.discard(attempt_id)
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
        journaled = self._decided_keys.get(attempt_id)
        if journaled is None:
            await self.journal.reconciled(
                attempt_id=attempt_id,
                status=status,
                by="OPERATOR",
                reason=reason,
                decided_by=principal.id,
            )
            self._decided_keys[attempt_id] = status
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
        self._decided_keys.pop(attempt_id, None)
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

    async def reload_secrets(self) -> dict[str, Any]:
        report = await asyncio.to_thread(self.secrets.reload)
        out: dict[str, Any] = {"secrets": report.as_dict()}
        if self.config.executor_principals_file is not None:
            try:
                principals = self.load_principals()
            except ConfigError as exc:
                self.streams.security.emit(
                    "PRINCIPALS_RELOAD_REFUSED", {"code": exc.code, "variable": exc.variable}
                )
                out["principals"] = {"file": str(self.config.executor_principals_file), "ok": False}
            else:
                self.door.door.replace_principals(principals)
                out["principals"] = {"file": str(self.config.executor_principals_file), "ok": True}
        if self.jwks is not None:
            self.jwks.check_file()
            out["jwks"] = {
                "file": str(self.config.executor_jwks_file),
                "ok": self.jwks.is_current(),
            }
        if self.tls is not None:
            out["tls"] = {
                "file": str(self.config.executor_tls_cert_file),
                "rotated": self.tls.maybe_reload(),
            }
        return out

    def _heads(self) -> dict[str, Any] | None:
        if self.chained is None:
            return None
        return {
            name: head.as_dict() if head is not None else None
            for name, head in self.chained.heads().items()
        }

    async def export_evidence(self, *, reason: str, principal: Principal) -> dict[str, Any]:
        if self.config.executor_evidence_dir is None:
            raise RequestRejected(
                Code.EVIDENCE_NOT_CONFIGURED, "evidence export needs EXECUTOR_EVIDENCE_DIR"
            )
        if self.chained is None:
            raise RequestRejected(
                Code.EVIDENCE_NOT_CHAINED, "this process writes no chained evidence streams"
            )
        signing_key: Ed25519PrivateKey | None = None
        handle = self.secrets.get("EXECUTOR_EVIDENCE_SIGNING_KEY")
        if handle is not None:
            with handle.reveal() as pem:
                loaded = load_pem_private_key(bytes(pem), password=None)
            if not isinstance(loaded, Ed25519PrivateKey):
                raise RequestRejected(
                    Code.EVIDENCE_KEY_INVALID, "EXECUTOR_EVIDENCE_SIGNING_KEY is not Ed25519"
                )
            signing_key = loaded
        attempts = await self.open_attempts()
        self.door.door.flush_lines()  # the summaries of repeated refusals that are due
        peers, workers = await self._peer_windows()
        try:
            manifest = await asyncio.to_thread(
                export_bundle,
                evidence_dir=self.config.executor_evidence_dir,
                reason=reason,
                streams=self.chained.sinks(),
                open_attempts=attempts,
                posture=self.posture.as_status(),
                config_digest=self.config.digest(),
                image_digest=self.config.executor_image_digest,
                secret_rotations=self.secrets.rotation_counts(),
                signing_key=signing_key,
                clock=self.clock,
                redactor=self.redactor,
                peers=peers,
                workers=workers,
            )
        except BundleError as exc:
            raise RequestRejected(exc.code, exc.message) from None
        self.streams.security.emit(
            "EVIDENCE_EXPORTED", {"principal": principal.id, "signed": signing_key is not None}
        )
        return dict(manifest.document)

    async def _peer_windows(
        self,
    ) -> tuple[dict[int, dict[str, ChainSnapshot]], dict[str, Any] | None]:
        """``EXECUTOR_WORKERS``: every other running worker's chain windows, asked for through
        the group's files and awaited for at most :data:`EXPORT_PEER_SECONDS`; and the
        manifest's ``workers`` entry (who exported, who did not answer)."""
        if self.worker is None:
            return {}, None
        link = self.worker
        request = await asyncio.to_thread(link.request_windows, uuid.uuid4().hex)
        roster = await asyncio.to_thread(link.roster)
        wanted = {w["index"] for w in roster if not w["this_worker"] and w["published"]}
        answers: dict[int, dict[str, Any]] = {}
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(EXPORT_PEER_SECONDS):
                while not wanted <= set(answers):
                    answers = await asyncio.to_thread(link.answers, request)
                    if not wanted <= set(answers):
                        await asyncio.sleep(EXPORT_POLL_SECONDS)
        with contextlib.suppress(OSError):
            await asyncio.to_thread(shutil.rmtree, request)
        peers: dict[int, dict[str, ChainSnapshot]] = {}
        for index, answer in answers.items():
            with contextlib.suppress(KeyError, TypeError, ValueError):
                peers[index] = {
                    name: _snapshot(name, answer[name]) for name in ("evidence", "security")
                }
        missing = sorted(i for i in range(link.count) if i != link.index and i not in peers)
        return peers, {"exported_by": link.index, "count": link.count, "not_answered": missing}

    def _windows(self) -> dict[str, Any]:
        """This worker's chain windows, for another worker's export (``host/workers.py``)."""
        assert self.chained is not None
        out: dict[str, Any] = {}
        for name, sink in self.chained.sinks().items():
            snapshot = sink.snapshot()
            out[name] = {
                "lines": list(snapshot.lines),
                "head": snapshot.head.as_dict() if snapshot.head is not None else None,
                "elided": [list(r) for r in snapshot.elided],
            }
        return out

    async def _export_answer_loop(self) -> None:
        """Answer other workers' evidence exports with this worker's windows."""
        assert self.worker is not None
        link = self.worker
        while True:
            for request in await asyncio.to_thread(link.pending_requests):
                windows = self._windows()
                await asyncio.to_thread(link.answer, request, windows)
            await asyncio.sleep(EXPORT_POLL_SECONDS)

    # -------------------------------------------------------------- lifecycle

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

    def _reconciler(self) -> ActionReconciler:
        return ActionReconciler(PolicyCatalog(self.policy, self.registry), self.registry)

    async def reconcile_at_start(self) -> list[Resolution]:
        """Resolve what the last process left (the listener is already open: ``/health``
        answers, ``/ready`` and proposals wait): the journal is read once, its open attempts
        are asked about concurrently, and every in-flight key the last process owned is settled
        from what its journal recorded (see :meth:`settle_orphan_keys`)."""
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
                    reconciler=self._reconciler(),
                    streams=self.streams,
                    gate=self.leases.gate if self.leases is not None else None,
                    checks=self.reconcile_checks(),
                    scan=scan,
                )
                for resolution in resolutions:
                    await self.settle_idempotency(resolution)
                    if resolution.resolution in _STILL_OPEN:
                        self.pipeline.unknown.add(resolution.attempt_id)
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
            self.pipeline.unknown.discard(resolution.attempt_id)

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
                **orphan.scope, response={"status": 200, "body": body}, now=self.clock.now()
            )
            resolution = str(body.get("outcome"))
        self.streams.evidence.emit(
            "IDEMPOTENCY_KEY_SETTLED", {"attempt_id": orphan.attempt_id, "resolution": resolution}
        )

    async def recheck_unknown(self) -> int:
        """Ask the provider again about every attempt counted unknown (a lookup that lagged, a
        provider that was down); settle those it can now resolve. Returns how many closed."""
        if self.journal is None or not len(self.pipeline.unknown):
            return 0
        wanted = self.pipeline.unknown.ids()
        closed = 0
        for attempt in await self.journal.open_attempts():
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
                self.journal,
                reconciler=self._reconciler(),
                streams=self.streams,
                checks=self.reconcile_checks(),
                by=ReconciledBy.RECHECK,  # a running process asks again: no restart (issue 31)
            )
            if resolution.closed:
                await self.settle_idempotency(resolution)
                self.pipeline.unknown.discard(attempt.attempt_id)
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

    @property
    def listener_limits(self) -> ListenerLimits:
        """The listener's read deadlines and connection caps, from the configuration."""
        config = self.config
        return ListenerLimits(
            header_timeout=float(config.executor_header_timeout_seconds),
            body_timeout=float(config.executor_body_timeout_seconds),
            max_connections=config.executor_max_connections,
            max_connections_per_source=config.executor_max_connections_per_source,
        )

    async def listen(self) -> None:
        limits = self.listener_limits
        self._runner = web.AppRunner(
            self.app,
            handle_signals=False,
            shutdown_timeout=DRAIN_SECONDS,
            **handler_settings(limits),
        )
        await self._runner.setup()
        self.site = GuardedSite(
            self._runner,
            self.config.executor_bind_address,
            self.config.port,
            limits=limits,
            ssl_context=self.tls.context if self.tls is not None else None,
            security=self.streams.security,
            reuse_port=self.worker is not None,
        )
        await self.site.start()
        self.port = self.site.port
        self.streams.security.emit(
            "LISTENING",
            {
                "address": self.config.executor_bind_address,
                "port": self.port,
                "tls": self.tls is not None,
                "header_timeout_seconds": limits.header_timeout,
                "body_timeout_seconds": limits.body_timeout,
                "max_connections": limits.max_connections,
                "max_connections_per_source": limits.max_connections_per_source,
            },
        )
        self.publish_worker()

    def start_background(self) -> None:
        """Halt file, secret files, posture drift, TLS material and JWKS, each polled; the
        journal's health, housekeeping (purge and prune) and the re-ask of unknown attempts."""
        self._spawn(self.halt.watch(interval=HALT_FILE_POLL_SECONDS))
        if self.worker is not None:
            self._spawn(self.halt.follow())
            self._spawn(self._worker_loop())
            if self.chained is not None:
                self._spawn(self._export_answer_loop())
        if self.journal is not None:
            self._spawn(self._journal_health_loop())
            self._spawn(self._recheck_loop())
        if self.chained is not None:
            self._spawn(self._chain_heads_health_loop())
        self._spawn(self._housekeeping_loop())
        self._spawn(self.secrets.watch(SECRETS_POLL_SECONDS))
        self._spawn(self._posture_loop())
        self._spawn(self._refusal_lines_loop())
        if self.tls is not None:
            self._spawn(self.tls.watch())
        if self.jwks is not None and self.config.executor_jwks_url:
            self._spawn(self.jwks.run_refresh())
        if self.backend.watched:
            self._spawn(self._store_health_loop())
        if self.leases is not None:
            self._spawn(self.leases.run())

    async def _store_health_loop(self) -> None:
        """Ask the shared store once a second: while it does not answer, new proposals get 503
        STORE_UNAVAILABLE and ``/ready`` is 503; both resume by themselves when it answers.

        A ping has its own deadline (:data:`STORE_PING_TIMEOUT_SECONDS`): left to the pool, a
        stopped server made it wait for the connect timeout (5 s), twice (a stale connection,
        then a new one), so ``/ready`` stayed 200 for about 11 s. Within
        :data:`READY_FOLLOWS_STORE_SECONDS` now."""
        while True:
            try:
                async with asyncio.timeout(STORE_PING_TIMEOUT_SECONDS):
                    available = await self.backend.ping()
            except TimeoutError:
                available = False
            if available != self.store_health.available:
                self.store_health.available = available
                self.streams.security.emit(
                    "STORE_AVAILABLE" if available else "STORE_UNAVAILABLE", {}
                )
            await asyncio.sleep(STORE_PING_SECONDS)

    def _journal_failed(self) -> None:
        """The journal failed a write: halt now (cause JOURNAL, one JOURNAL_FAILED line, ``/ready``
        503). Called by the failing append itself, and by the health loop as a backstop."""
        # The chained streams keep their heads beside the journal: on the same full disk
        # their lines may be refused too, so the halt never depends on them.
        try:
            if self.halt.journal_failed():
                log.error("the attempt journal failed a write: halted (cause JOURNAL)")
                self.streams.security.emit("JOURNAL_FAILED", {"code": Code.JOURNAL_UNAVAILABLE})
        except AgentSafeError as exc:
            log.error("JOURNAL_FAILED was not recorded (%s)", exc.code)

    async def _journal_health_loop(self) -> None:
        """While the journal is failed (halted by the failing append, see
        :meth:`_journal_failed`), retry it every interval; the cause lifts itself once the
        storage takes a synced write again (JOURNAL_RECOVERED)."""
        assert self.journal is not None
        while True:
            await asyncio.sleep(JOURNAL_CHECK_SECONDS)
            if not self.journal.failed:
                continue
            self._journal_failed()
            if await self.journal.recover():
                log.warning("the attempt journal writes again: the JOURNAL halt lifts")
                with contextlib.suppress(AgentSafeError):
                    self.streams.security.emit("JOURNAL_RECOVERED", {})
                with contextlib.suppress(AgentSafeError):
                    self.halt.journal_recovered()

    def _chain_heads_failed(self) -> None:
        """A chain head could not be persisted (a full disk under the journal directory's
        ``chain/``): halt now (cause CHAIN_HEADS, one CHAIN_HEADS_FAILED line, ``/ready`` 503).
        Called after each line a stream writes or refuses while its head is unpersisted, and
        by the health loop as a backstop. The first failed checkpoint comes a quarter of the
        chain's bound before it refuses lines, so these lines still fit; the halt never
        depends on them."""
        try:
            if self.halt.chain_heads_failed():
                log.error("a chain head could not be persisted: halted (cause CHAIN_HEADS)")
                self.streams.security.emit(
                    "CHAIN_HEADS_FAILED", {"code": Code.CHAIN_HEADS_UNAVAILABLE}
                )
        except AgentSafeError as exc:
            log.error("CHAIN_HEADS_FAILED was not recorded (%s)", exc.code)

    async def _chain_heads_health_loop(self) -> None:
        """While a head is unpersisted or the CHAIN_HEADS cause stands, probe every interval
        (both heads persisted: a synced write each); the cause lifts itself once the probe
        lands (CHAIN_HEADS_RECOVERED)."""
        assert self.chained is not None
        while True:
            await asyncio.sleep(JOURNAL_CHECK_SECONDS)
            if not self.chained.failed and not self.halt.has_cause(HaltCause.CHAIN_HEADS):
                continue
            if self.chained.failed:
                self._chain_heads_failed()
            if await asyncio.to_thread(self.chained.recover):
                log.warning("the chain heads persist again: the CHAIN_HEADS halt lifts")
                with contextlib.suppress(AgentSafeError):
                    self.streams.security.emit("CHAIN_HEADS_RECOVERED", {})
                with contextlib.suppress(AgentSafeError):
                    self.halt.chain_heads_recovered()

    async def housekeeping(self) -> dict[str, Any]:
        """Record the final answers the use store refused earlier (a full disk); purge the use
        store past its retention; prune journal day files past theirs that hold no open attempt.
        Returns what was removed."""
        await self.pipeline.record_unrecorded()
        purged = await self.store.purge(self.clock.now())
        pruned: tuple[str, ...] = ()
        if self.journal is not None and not self.journal.failed:
            pruned = await self.journal.prune()
        if purged or pruned:
            self.streams.evidence.emit(
                "HOUSEKEEPING", {"purged_rows": purged, "pruned_files": list(pruned)}
            )
        return {"purged_rows": purged, "pruned_files": list(pruned)}

    async def _housekeeping_loop(self) -> None:
        while True:
            try:
                await self.housekeeping()
            except (AgentSafeError, OSError) as exc:
                code = exc.code if isinstance(exc, AgentSafeError) else Code.JOURNAL_UNAVAILABLE
                log.warning("housekeeping failed (%s); it runs again next interval", code)
                with contextlib.suppress(AgentSafeError):
                    self.streams.security.emit("HOUSEKEEPING_FAILED", {"code": code})
            await asyncio.sleep(self.config.executor_housekeeping_interval_seconds)

    async def _recheck_loop(self) -> None:
        while True:
            await asyncio.sleep(RECHECK_SECONDS)
            try:
                await self.recheck_unknown()
            except AgentSafeError as exc:
                self.streams.security.emit("RECHECK_FAILED", {"code": exc.code})

    async def _refusal_lines_loop(self) -> None:
        """Write the door's summaries of repeated refusals once their interval is over."""
        while True:
            await asyncio.sleep(REFUSAL_LINES_POLL_SECONDS)
            self.door.door.flush_lines()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self._tasks.append(asyncio.create_task(coro))

    async def _posture_loop(self) -> None:
        interval = self.config.executor_posture_interval_seconds
        while True:
            await asyncio.sleep(interval)
            await self.check_posture_now()

    async def check_posture_now(self) -> tuple[str, ...]:
        """Re-run the drift checks once: a regression halts (POSTURE_DRIFT) and new enforcement
        work is refused 503 POSTURE_DEGRADED until it holds again (POSTURE_RESTORED); resume is
        refused while it stands. Returns the checks that drifted."""
        known = set(self.halt.status()["posture_drift"])
        await asyncio.to_thread(self.posture_monitor.check_now)
        drifted = set(self.posture_monitor.drifted_checks())
        for check in sorted(drifted - known):
            self.halt.posture_drift(check)
            self.metrics.posture_drift.inc(check=check)
        for check in sorted(known - drifted):
            self.halt.posture_restored(check)
        return tuple(sorted(drifted))

    async def close(self) -> None:
        """Stop accepting, drain in-flight work (bounded), then close every store."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            # Bounded: a task that swallowed its cancellation never holds the stop (SIGTERM).
            await asyncio.wait(self._tasks, timeout=DRAIN_SECONDS)
        for task in self._tasks:
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: a loop's last error is not re-reported at exit
        self._tasks.clear()
        for close in reversed(self.closers):
            with contextlib.suppress(Exception):
                await close()
        self.closers.clear()
        if self.webhook is not None:
            await self.webhook.aclose()
        await self.transport.close()
        if self.journal is not None:
            await self.journal.close()
        await self.store.close()
        self.secrets.close()
        self.door.door.flush_lines(everything=True)
        if self.chained is not None:
            self.chained.close()


def _snapshot(stream: str, window: dict[str, Any]) -> ChainSnapshot:
    """Another worker's window as it answered (``Executor._windows``); the bundle's verifier
    re-walks its lines, so nothing here is trusted beyond its shape."""
    head = window["head"]
    return ChainSnapshot(
        lines=tuple(str(line) for line in window["lines"]),
        head=(
            ChainHead(stream, str(head["schema"]), int(head["seq"]), str(head["hash"]))
            if head is not None
            else None
        ),
        elided=tuple((int(a), int(b)) for a, b in window["elided"]),
    )
