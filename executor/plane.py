"""The control plane: one assembled executor, what its control routes ask, and its lifecycle.

:class:`Executor` holds every component :func:`~agentsafe.executor.assembly.assemble` built and
answers what the operator's routes ask (status, open attempts, secret reload, evidence export,
readiness); it runs the listener and the background polls (halt file, secret files, posture
drift, TLS material, JWKS), and closes everything in reverse order. Start-up recovery and key
settlement are ``lifecycle/recovery.py``'s (:class:`Recovery`, built here); the work gate, the
store's health and the start-up state are ``host/workgate.py``'s.

Callers: ``assembly.py`` (builds it), tests; the process runs what ``assemble`` returns. The
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
from .host.halt import HaltCause, HaltState
from .host.metrics import ExecutorMetrics, StateSnapshot
from .host.posture import PostureMonitor, PostureReport
from .host.secrets import SecretStore
from .host.tlsctx import ReloadingTlsContext
from .host.workers import EXPORT_POLL_SECONDS, PUBLISH_SECONDS, WorkerLink
from .host.workgate import Startup, StoreHealth, WorkGate, watch_store
from .lifecycle.catalog import ActionReconciler, PolicyCatalog
from .lifecycle.escalations import Escalations
from .lifecycle.leases import LeaseKeeper
from .lifecycle.pipeline import Pipeline
from .lifecycle.reconcile import Resolution
from .lifecycle.reconciliations import Reconciliations
from .lifecycle.recovery import Recovery
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
from .state.journal import AttemptJournal
from .state.lostwrites import LostClaim, LostWritesGuard
from .state.protocol import UseStore
from .state.records import ApprovalState

__all__ = ["DRAIN_SECONDS", "Executor"]

log = logging.getLogger(__name__)

DRAIN_SECONDS = 20.0
HALT_FILE_POLL_SECONDS = 0.5
STREAMS = ("evidence", "security")
EXPORT_PEER_SECONDS = 5.0
"""How long an evidence export waits for the other workers' windows (``EXECUTOR_WORKERS``)."""
SECRETS_POLL_SECONDS = 5.0
REFUSAL_LINES_POLL_SECONDS = 2.0


JOURNAL_CHECK_SECONDS = 0.5
"""How often a failed journal is retried (recovery); the halt itself comes from the failing
append, at once."""
METRICS_STORE_SECONDS = 2.0
"""How long a scrape waits for the store's count of pending escalations (else: the last one)."""


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
    recovery: Recovery = field(init=False)
    escalations: Escalations = field(init=False)
    _pending_escalations: int = 0
    """The last count the store gave (kept while the store does not answer)."""
    _runner: web.AppRunner | None = None
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.recovery = Recovery(
            config=self.config,
            store=self.store,
            journal=self.journal,
            streams=self.streams,
            clock=self.clock,
            metrics=self.metrics,
            reconciler=ActionReconciler(PolicyCatalog(self.policy, self.registry), self.registry),
            unknown=self.pipeline.unknown,
            startup=self.startup,
        )
        self.escalations = Escalations(self.pipeline)
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
                cancel_escalation=self.escalations.cancel,
                origin=origin,
            )
        self.routes = route_table(
            pipeline=self.pipeline,
            reconciler=Reconciliations(self.pipeline),
            escalator=self.escalations,
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

    @property
    def leases(self) -> LeaseKeeper | None:
        """With a shared store: the lease keeper (``lifecycle/leases.py``), set by assembly."""
        return self.recovery.leases

    @leases.setter
    def leases(self, keeper: LeaseKeeper | None) -> None:
        self.recovery.leases = keeper

    @property
    def unresolved_keys(self) -> list[dict[str, Any]]:
        return self.recovery.unresolved_keys

    async def reconcile_at_start(self) -> list[Resolution]:
        """Resolve what the last process left (:meth:`Recovery.reconcile_at_start`)."""
        return await self.recovery.reconcile_at_start()

    async def open_attempts(self) -> list[dict[str, Any]]:
        return await self.recovery.open_attempts()

    async def decide_attempt(
        self, *, attempt_id: str, executed: bool, reason: str, principal: Principal
    ) -> dict[str, Any]:
        return await self.recovery.decide_attempt(
            attempt_id=attempt_id, executed=executed, reason=reason, principal=principal
        )

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
        return self.recovery.unknown_attempts

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
            self._spawn(self.recovery.recheck_loop())
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
            self._spawn(watch_store(self.backend.ping, self.store_health, self.streams.security))
        if self.leases is not None:
            self._spawn(self.leases.run())

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
