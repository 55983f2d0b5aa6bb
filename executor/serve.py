"""``agentsafe serve``: assemble the executor from its configuration and run it.

Start order, as the specification fixes it (each step refuses to start with one line naming the
variable or the check, never a value): the audit hook; configuration; posture; secrets; the
journal directory; the evidence chain heads; the use store; startup reconciliation; the listener.
SIGTERM stops accepting, lets in-flight work finish and journal within a bound, persists the chain
heads and exits 0. SIGHUP re-reads the secret files.

:func:`assemble` builds an :class:`Executor` without a process around it and without the audit
hook (which is permanent, so tests never install it in their own process); :func:`main` is the
process.

Callers: ``cli.py``, tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from .assembly import build_credential, build_door, build_tls, build_transport, load_principals
from .clock import Clock, SystemClock
from .codes import Code
from .config import ExecutorConfig, load_config
from .dispatch.forward import ForwardRequestHandler
from .dispatch.seam import ReconcileResult, ReconcileStatus, Registry
from .door.workload import JwksSource
from .errors import AgentSafeError, ConfigError, RequestRejected
from .events import SECURITY_SCHEMA, DeferredSink, EventSink, JsonLinesSink, Streams
from .evidence.bundle import BundleError, export_bundle
from .evidence.chain import ChainedStreams, LineWriter, LineWriterHandler, open_chained_streams
from .evidence.plan_audit import DurablePlanAudit
from .evidence.redact import RedactingLogFilter, Redactor
from .grants import SigningKey
from .host.audithook import Guard, install_guard
from .host.halt import HaltState
from .host.metrics import ExecutorMetrics
from .host.posture import PostureInputs, PostureMonitor, PostureReport, check_posture
from .host.secrets import SecretStore, inspect_sources
from .host.tlsctx import ReloadingTlsContext
from .lifecycle.answers import reconciled_answer
from .lifecycle.ceilings import HostCeilings
from .lifecycle.leases import LeaseKeeper
from .lifecycle.pipeline import Pipeline
from .lifecycle.reconcile import Resolution, ResolutionStatus, reconcile_open_attempts
from .lifecycle.shadow import ShadowReport
from .plans.execute import StepExecutor
from .plans.service import ExecutorRegistry, PlanService
from .plans.signing import Ed25519Signer
from .policy.authority import LocalAuthority
from .policy.policy import CompiledPolicy, PolicyDocument, compile_policy, load_policy
from .principals import Principal
from .routes.app import ReadyState, build_app
from .routes.approvals import add_approval_routes
from .routes.control import add_control_routes
from .routes.door import HttpDoor
from .routes.plans import add_plan_routes
from .state.journal import AttemptJournal
from .state.pgstore import PostgresStore, SharedAttemptMirror, check_store_url
from .state.usestore import SQLiteUseStore, UseStore

__all__ = ["Executor", "assemble", "main"]

log = logging.getLogger("agentsafe.executor")

DRAIN_SECONDS = 20.0
HALT_FILE_POLL_SECONDS = 0.5
STORE_PING_SECONDS = 1.0
SECRETS_POLL_SECONDS = 5.0


class _PolicyCatalog:
    def __init__(self, policy: CompiledPolicy) -> None:
        self._policy = policy

    def handler_for(self, action: str) -> str | None:
        compiled = self._policy.actions.get(action)
        return compiled.handler if compiled is not None else None


class _ActionReconciler:
    """The read path for startup reconciliation: a policy action's handler, asked by key."""

    def __init__(self, catalog: _PolicyCatalog, registry: Registry) -> None:
        self._catalog = catalog
        self._registry = registry

    async def reconcile(self, action: str, idempotency_key: str) -> ReconcileResult:
        handler = self._catalog.handler_for(action)
        if handler is None:
            return ReconcileResult(ReconcileStatus.UNKNOWN, reason_code="ACTION_NOT_REGISTERED")
        return await self._registry.reconcile(handler, idempotency_key)


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
    chained: ChainedStreams | None = None
    plans: PlanService | None = None
    shared: PostgresStore | None = None  # EXECUTOR_STORE_URL: the store every replica shares
    leases: LeaseKeeper | None = None
    store_available: bool = True
    app: web.Application = field(init=False)
    reconciling: bool = True
    unknown_attempts: int = 0
    port: int = 0
    _runner: web.AppRunner | None = None
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.app = build_app(
            pipeline=self.pipeline,
            door=self.door,
            readiness=self.readiness,
            jwks=self.authority.jwks,
            extra_routes=self._routes,
        )

    def _routes(self, app: web.Application) -> None:
        add_control_routes(app, plane=self, door=self.door)
        if self.plans is not None:
            add_plan_routes(app, service=self.plans, door=self.door, streams=self.streams)
        if self.config.executor_escalation.value == "APPROVAL":
            add_approval_routes(
                app, door=self.door, store=self.store, streams=self.streams, clock=self.clock
            )

    # -------------------------------------------------------------- what routes ask

    def refusal(self) -> str | None:
        """Why new enforcement work is refused right now, or ``None``."""
        if self.posture_monitor.is_degraded():
            return "POSTURE_DEGRADED"
        if self.halt.halted:
            return "EXECUTOR_HALTED"
        if not self.store_available:
            return "STORE_UNAVAILABLE"
        return None

    def readiness(self) -> ReadyState:
        body: dict[str, Any] = {
            "mode": self.config.executor_mode.value,
            "actions": list(self.policy.actions),
            "unknown_attempts": self.unknown_attempts,
            "reconciling": self.reconciling,
            "halted": self.halt.halted,
            "store": "postgresql" if self.shared is not None else "sqlite",
            "store_available": self.store_available,
        }
        ready = not self.reconciling and not self.halt.halted and self.store_available
        if self.config.executor_ready_requires_no_unknown_attempts and self.unknown_attempts:
            ready = False
        body["ready"] = ready
        return ReadyState(ready=ready, body=body)

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
            "open_attempts": await self.open_attempts(),
            "policy_digest": self.policy.digest,
            "chain_heads": self._heads(),
        }
        if self.config.executor_mode.value == "SHADOW":
            out["shadow_report"] = self.shadow.as_dict()
        return out

    async def open_attempts(self) -> list[dict[str, Any]]:
        if self.journal is None:
            return []
        attempts = await self.journal.open_attempts()
        return [
            {
                "attempt_id": a.attempt_id,
                "intent_id": a.intent_id,
                "intent_hash": a.intent_hash,
                "action": a.action,
                "principal": a.principal,
                "grant_claimed": a.grant_claimed,
                "grant_id": a.grant_id,
                "state": "UNKNOWN" if a.grant_claimed else "UNCLAIMED",
            }
            for a in attempts
        ]

    async def reload_secrets(self) -> dict[str, Any]:
        report = await asyncio.to_thread(self.secrets.reload)
        out: dict[str, Any] = {"secrets": report.as_dict()}
        if self.config.executor_principals_file is not None:
            try:
                principals = load_principals(self.config, self.registry_actions())
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
            )
        except BundleError as exc:
            raise RequestRejected(exc.code, exc.message) from None
        self.streams.security.emit(
            "EVIDENCE_EXPORTED", {"principal": principal.id, "signed": signing_key is not None}
        )
        return dict(manifest.document)

    def registry_actions(self) -> list[str]:
        return list(self.policy.actions)

    # -------------------------------------------------------------- lifecycle

    async def reconcile_at_start(self) -> list[Resolution]:
        resolutions: list[Resolution] = []
        if self.journal is not None:
            resolutions = await reconcile_open_attempts(
                self.journal,
                reconciler=_ActionReconciler(_PolicyCatalog(self.policy), self.registry),
                streams=self.streams,
                gate=self.leases.gate if self.leases is not None else None,
            )
            for resolution in resolutions:
                await self.settle_idempotency(resolution)
            self.unknown_attempts = sum(
                1
                for r in resolutions
                if r.resolution
                in (ResolutionStatus.STILL_UNKNOWN, ResolutionStatus.BINDING_MISMATCH)
            )
        self.reconciling = False
        return resolutions

    async def settle_idempotency(self, resolution: Resolution) -> None:
        """Give a reconciled key its final answer; a key that never reached the provider is freed.

        A key whose outcome is still unknown stays in flight (409 IDEMPOTENCY_IN_PROGRESS): the
        executor asks again at the next start, and the attempt is listed as open.
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
            await self.store.idempotency_settle(
                **scope, response={"status": 200, "body": body}, now=self.clock.now()
            )

    async def listen(self) -> None:
        self._runner = web.AppRunner(
            self.app, access_log=None, handle_signals=False, shutdown_timeout=DRAIN_SECONDS
        )
        await self._runner.setup()
        site = web.TCPSite(
            self._runner,
            host=self.config.executor_bind_address,
            port=self.config.port,
            ssl_context=self.tls.context if self.tls is not None else None,
            reuse_address=True,
        )
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        self.streams.security.emit(
            "LISTENING",
            {
                "address": self.config.executor_bind_address,
                "port": self.port,
                "tls": self.tls is not None,
            },
        )

    def start_background(self) -> None:
        """Halt file, secret files, posture drift, TLS material and JWKS, each polled."""
        self._spawn(self.halt.watch(interval=HALT_FILE_POLL_SECONDS))
        self._spawn(self.secrets.watch(SECRETS_POLL_SECONDS))
        self._spawn(self._posture_loop())
        if self.tls is not None:
            self._spawn(self.tls.watch())
        if self.jwks is not None and self.config.executor_jwks_url:
            self._spawn(self.jwks.run_refresh())
        if self.shared is not None:
            self._spawn(self._store_health_loop())
        if self.leases is not None:
            self._spawn(self.leases.run())

    async def _store_health_loop(self) -> None:
        """Ask the shared store once a second: while it does not answer, new proposals get 503
        STORE_UNAVAILABLE and ``/ready`` is 503; both resume by themselves when it answers."""
        assert self.shared is not None
        while True:
            available = await self.shared.ping()
            if available != self.store_available:
                self.store_available = available
                self.streams.security.emit(
                    "STORE_AVAILABLE" if available else "STORE_UNAVAILABLE", {}
                )
            await asyncio.sleep(STORE_PING_SECONDS)

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
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        await self.transport.close()
        if self.journal is not None:
            await self.journal.close()
        await self.store.close()
        self.secrets.close()
        if self.chained is not None:
            self.chained.close()


def _forward_schema(document: PolicyDocument) -> dict[str, Any]:
    """The forward handler accepts exactly what the policy's actions it runs accept."""
    schemas = [dict(a.parameters) for a in document.actions if a.handler == "forward_request"]
    if len(schemas) == 1:
        return schemas[0]
    return {"type": "object", "anyOf": schemas}


async def assemble(
    environ: Mapping[str, str],
    *,
    streams: Streams | None = None,
    clock: Clock | None = None,
    guard: Guard | None = None,
    chain: tuple[TextIO | LineWriter, TextIO | LineWriter] | None = None,
    plan_executors: Sequence[StepExecutor] = (),
) -> Executor:
    """Build an executor from ``environ`` in the start order; raises on any refusal.

    With ``chain`` (where the evidence and security lines go), the two streams are chained and
    their heads persisted under the journal directory; ``streams`` must then be a pair of
    :class:`DeferredSink` that hold what start-up says until the chain is open.

    ``plan_executors`` are the host's step executors for the plan routes (each bound to one tool
    and effect); the routes exist when the policy has a ``plans`` section.
    """
    config = load_config(environ)
    streams = streams or Streams.standard()
    clock = clock or SystemClock()
    secrets_dir = Path(config.executor_secrets_dir) if config.executor_secrets_dir else None

    # Posture: what this process can see of its host, before any secret is read.
    findings = inspect_sources(environ, production=config.production, secrets_dir=secrets_dir)
    inputs = PostureInputs(
        mode=config.executor_posture,
        production=config.production,
        environ=environ,
        principals_file=config.executor_principals_file,
        secret_findings=findings.findings,
        guard_results=guard.self_test() if guard is not None else None,
    )
    posture = check_posture(inputs, security=streams.security)
    monitor = PostureMonitor(
        inputs, security=streams.security, interval=config.executor_posture_interval_seconds
    )

    secrets = SecretStore.load(
        environ, production=config.production, secrets_dir=secrets_dir, security=streams.security
    )
    metrics = ExecutorMetrics()
    redactor = Redactor(
        credential_headers=[config.downstream_credential_header]
        if config.downstream_credential_header
        else []
    )
    for name in secrets.names():
        handle_ = secrets.get(name)
        if handle_ is not None:
            with handle_.reveal() as value:
                redactor.set_secret(name, value)

    def rotated(name: str, handle: Any) -> None:
        metrics.secret_rotations.inc(name=name)
        with handle.reveal() as value:
            redactor.set_secret(name, value)

    secrets.on_change(rotated)
    journal: AttemptJournal | None = None
    chained: ChainedStreams | None = None
    store: UseStore | None = None
    shared: PostgresStore | None = None
    mirror: SharedAttemptMirror | None = None
    try:
        if config.executor_store_url.given:
            shared = await open_shared_store(secrets)
            streams.security.emit(
                "STORE_OPENED",
                {"backend": "postgresql", "schema_version": shared.schema_version},
            )
            mirror = SharedAttemptMirror(
                shared.attempts,
                owner=config.replica_id,
                lease_seconds=config.executor_attempt_lease_seconds,
            )
        if config.executor_journal_dir is not None:
            try:
                journal = await AttemptJournal.open(
                    Path(config.executor_journal_dir),
                    retain_days=config.executor_journal_retain_days,
                    clock=clock,
                    mirror=mirror,
                )
            except (OSError, AgentSafeError) as exc:
                raise ConfigError(
                    "EXECUTOR_JOURNAL_DIR",
                    "cannot be opened for appending",
                    code=Code.JOURNAL_UNAVAILABLE,
                ) from exc
        if chain is not None:
            chained = open_chained_streams(
                evidence_out=chain[0],
                security_out=chain[1],
                clock=clock,
                journal_dir=config.executor_journal_dir,
                checkpoint_lines=config.executor_audit_checkpoint_lines,
                window_lines=config.executor_evidence_window_lines,
                redactor=redactor,
            )
            _count_chained(chained, metrics)
            for deferred, sink, name in (
                (streams.evidence, chained.evidence, "evidence"),
                (streams.security, chained.security, "security"),
            ):
                if not isinstance(deferred, DeferredSink):
                    raise TypeError("chained streams need DeferredSink placeholders")
                deferred.attach(_CountingSink(sink, metrics, name))
        if shared is not None:
            store = shared.use_store
        else:
            assert config.executor_state_dir is not None  # the configuration requires it
            store = await SQLiteUseStore.open(Path(config.executor_state_dir), clock=clock)

        halt = HaltState(
            clock=clock,
            security=streams.security,
            halt_file=config.executor_halt_file,
            metrics=metrics,
            auth_spike=config.executor_halt_on_auth_failures,
            egress_spike=config.executor_halt_on_egress_refusals,
        )

        def egress_refused(code: str) -> None:
            metrics.egress_refusals.inc(code=code)
            halt.record_egress_refusal()

        transport = build_transport(config, streams, on_refusal=egress_refused)
        document = load_policy(config.executor_policy_file)
        registry = Registry(security=streams.security)
        registry.register(
            "forward_request",
            ForwardRequestHandler(
                url=config.downstream_url,
                lookup_url=config.downstream_lookup_url,
                timeout_ms=config.downstream_timeout_ms,
                transport=transport,
                credential=build_credential(config, secrets, transport, clock),
                parameters_schema=_forward_schema(document),
            ),
        )
        registry.seal()
        policy = compile_policy(document, registered_handlers=set(registry.names()))

        key_handle = secrets.get("EXECUTOR_AUTHORITY_SIGNING_KEY")
        if key_handle is not None:
            with key_handle.reveal() as pem:
                key = SigningKey.from_pem(pem)
        else:
            key = SigningKey.generate()
            streams.security.emit("AUTHORITY_KEY_EPHEMERAL", {"kid": key.kid})
        authority = LocalAuthority(policy, keys=key, store=store, clock=clock)

        def authority_key_rotated(name: str, handle: Any) -> None:
            if name != "EXECUTOR_AUTHORITY_SIGNING_KEY":
                return
            try:
                with handle.reveal() as pem:
                    fresh = SigningKey.from_pem(pem)
            except (AgentSafeError, ValueError):
                streams.security.emit("AUTHORITY_KEY_ROTATION_REFUSED", {"code": Code.KEY_INVALID})
                return
            authority.rotate_key(fresh)
            streams.security.emit("AUTHORITY_KEY_ROTATED", {"kid": fresh.kid})

        secrets.on_change(authority_key_rotated)

        door, jwks = build_door(
            config,
            secrets=secrets,
            actions=list(policy.actions),
            streams=streams,
            metrics=metrics,
            clock=clock,
            halt=halt,
            jwks_fetch=_jwks_fetch(config, transport),
        )
        tls = build_tls(config, secrets, streams, metrics)

        ceilings = HostCeilings(
            single=config.executor_hard_limit_single_minor,
            window_seconds=config.executor_hard_limit_window_seconds,
            window_count=config.executor_hard_limit_window_count,
            window_sum_minor=config.executor_hard_limit_window_sum_minor,
            clock=clock,
            window=shared.window if shared is not None else None,
        )
        shadow = ShadowReport()
        holder: dict[str, Executor] = {}
        pipeline = Pipeline(
            mode=config.executor_mode.value,
            authority=authority,
            signer=authority,
            catalog=_PolicyCatalog(policy),
            registry=registry,
            store=store,
            journal=journal,
            ceilings=ceilings if ceilings.configured else None,
            streams=streams,
            clock=clock,
            target=config.downstream_target(),
            intent_ttl_seconds=config.executor_intent_ttl_seconds,
            max_clock_skew_ms=config.executor_max_clock_skew_ms,
            shadow=shadow,
            refusal=lambda: holder["executor"].refusal(),
            on_clock_skew=lambda skew: halt.clock_skew(skew * 1000),
            metrics=metrics,
            escalation=config.executor_escalation.value,
            on_forbidden=door.record_refusal,
        )
        executor = Executor(
            config=config,
            environ=environ,
            streams=streams,
            clock=clock,
            secrets=secrets,
            store=store,
            journal=journal,
            authority=authority,
            registry=registry,
            transport=transport,
            pipeline=pipeline,
            policy=policy,
            shadow=shadow,
            metrics=metrics,
            halt=halt,
            door=HttpDoor(door),
            jwks=jwks,
            tls=tls,
            posture=posture,
            posture_monitor=monitor,
            redactor=redactor,
            chained=chained,
            plans=_plan_service(
                config,
                policy,
                key,
                store,
                streams,
                clock,
                journal_dir=config.executor_journal_dir,
                executors=plan_executors,
            ),
            shared=shared,
        )
        if mirror is not None and journal is not None:
            executor.leases = LeaseKeeper(
                mirror,
                journal,
                reconciler=_ActionReconciler(_PolicyCatalog(policy), registry),
                streams=streams,
                on_resolution=executor.settle_idempotency,
            )
        holder["executor"] = executor
        return executor
    except BaseException:
        # Nothing half-built survives a refusal: close what was opened, in reverse order.
        if store is not None:
            await store.close()
        if shared is not None:
            await shared.close()
        if journal is not None:
            await journal.close()
        secrets.close()
        if chained is not None:
            chained.close()
        raise


async def open_shared_store(secrets: SecretStore) -> PostgresStore:
    """Open (and migrate) the shared store named by ``EXECUTOR_STORE_URL``; ``ConfigError``
    naming the variable, never the URL, when it is not a PostgreSQL URL; ``StoreError`` when the
    database does not answer or its schema is newer than this agentsafe."""
    handle = secrets.get("EXECUTOR_STORE_URL")
    if handle is None:
        raise ConfigError("EXECUTOR_STORE_URL", "is set but could not be read")
    with handle.reveal() as value:
        url = bytes(value).decode("utf-8", errors="replace").strip()
    return await PostgresStore.open(check_store_url(url))


class _CountingSink:
    """Counts the chained lines each stream writes (``agentsafe_chained_lines_total``)."""

    def __init__(self, sink: EventSink, metrics: ExecutorMetrics, stream: str) -> None:
        self._sink = sink
        self._metrics = metrics
        self._stream = stream

    def emit(self, event: str, fields: Mapping[str, Any] | None = None) -> None:
        self._sink.emit(event, fields)
        self._metrics.chained_lines.inc(stream=self._stream)


def _count_chained(chained: ChainedStreams, metrics: ExecutorMetrics) -> None:
    """Every redaction a chained stream makes is counted before LEAK_SUSPECTED is raised."""
    for sink in (chained.evidence, chained.security):
        report = sink.on_redaction

        def counted(stream: str, leaks: Any, report: Any = report) -> None:
            metrics.redactions.inc()
            if report is not None:
                report(stream, leaks)

        sink.on_redaction = counted


def _jwks_fetch(config: ExecutorConfig, transport: Any) -> Any:
    """Refresh the JWKS from ``EXECUTOR_JWKS_URL`` through the guarded client, or nothing."""
    url = config.executor_jwks_url
    if not url:
        return None

    async def fetch() -> bytes:
        response = await transport.request(
            "GET", url, headers={"accept": "application/json"}, body=None, timeout=10.0
        )
        if response.status != 200:
            raise ValueError(f"the JWKS endpoint answered {response.status}")
        body: bytes = response.body
        return body

    return fetch


def _plan_service(
    config: ExecutorConfig,
    policy: CompiledPolicy,
    key: SigningKey,
    store: UseStore,
    streams: Streams,
    clock: Clock,
    *,
    journal_dir: Path | None,
    executors: Sequence[StepExecutor],
) -> PlanService | None:
    """The plan service when the policy has a ``plans`` section; it needs the journal for its
    durable audit."""
    plans = policy.document.plans
    if plans is None:
        return None
    if journal_dir is None:
        raise ConfigError("EXECUTOR_JOURNAL_DIR", "is required by the policy's plans section")
    registry = ExecutorRegistry()
    for step_executor in executors:
        registry.register(step_executor)
    registry.seal()
    signer = Ed25519Signer(key)
    return PlanService(
        policy=plans,
        approval_signer=signer,
        approval_verifier=signer.verifier(),
        receipt_signer=signer,
        receipt_verifier=signer.verifier(),
        use_store=store,
        audit_sink=DurablePlanAudit(Path(journal_dir), clock=clock, evidence=streams.evidence),
        executors=registry,
        clock=clock,
        max_clock_skew_ms=config.executor_max_clock_skew_ms,
    )


def _writable_dirs(environ: Mapping[str, str]) -> list[Path]:
    """The directories the audit hook lets this process write, read before configuration."""
    names = ("EXECUTOR_JOURNAL_DIR", "EXECUTOR_STATE_DIR", "EXECUTOR_EVIDENCE_DIR")
    return [Path(environ[n]) for n in names if environ.get(n, "").startswith("/")]


async def _run(environ: Mapping[str, str], guard: Guard) -> int:
    evidence, security = DeferredSink(), DeferredSink()
    writer = LineWriter.for_stream(sys.stderr)
    try:
        executor = await assemble(
            environ,
            streams=Streams(evidence=evidence, security=security),
            guard=guard,
            chain=(sys.stdout, writer),
        )
    except BaseException:
        if not security.attached:
            security.drain(JsonLinesSink(sys.stderr, schema=SECURITY_SCHEMA))
        raise
    if executor.chained is not None:
        _log_through(writer, executor.redactor, executor.chained)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    reloads: set[asyncio.Task[dict[str, Any]]] = set()

    def reload() -> None:
        task = asyncio.ensure_future(executor.reload_secrets())
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    loop.add_signal_handler(signal.SIGHUP, reload)
    try:
        await executor.reconcile_at_start()
        await executor.listen()
        executor.start_background()
        await stop.wait()
        executor.streams.security.emit("STOPPING", {"signal": "SIGTERM"})
    finally:
        await executor.close()
        if executor.config.executor_mode.value == "SHADOW":
            sys.stderr.write(executor.shadow.render() + "\n")
    return 0


def _log_through(writer: LineWriter, redactor: Redactor, chained: ChainedStreams) -> None:
    """Operational logs share the security stream's writer (never a shared line) and redactor."""
    handler = LineWriterHandler(writer)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactingLogFilter(redactor, on_redaction=chained.report_log_redactions))
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)


def main() -> int:
    logging.basicConfig(
        level=os.environ.get("AGENTSAFE_LOG_LEVEL", "WARNING"),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    environ = dict(os.environ)
    try:
        guard = install_guard(writable_dirs=_writable_dirs(environ))
        return asyncio.run(_run(environ, guard))
    except ConfigError as exc:
        sys.stderr.write(f"agentsafe: refused to start: {exc.code}: {exc}\n")
        return exc.exit_status
    except AgentSafeError as exc:
        sys.stderr.write(f"agentsafe: refused to start: {exc.code}: {exc.message}\n")
        return 78
