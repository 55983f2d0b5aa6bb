"""Assembly: turn a checked configuration into a running executor's components, in start order.

:func:`assemble` builds an :class:`~agentsafe.executor.plane.Executor` from an environment without a
process around it and without the audit hook (``serve.py`` installs that): posture, secrets, the
journal, the chained evidence streams, the use store, the halt state, egress, the handler registry
(the built-in ``forward_request`` and every registration function, ``dispatch/registration.py``),
the compiled policy and the authority, the door, TLS, the host ceilings, the pipeline and the plan
service. Anything it opened is closed again if a later step refuses.

The builders it calls are small and pure-ish: each takes the configuration and what it needs, and
returns one component or raises :class:`~agentsafe.executor.errors.ConfigError` naming the variable.

Callers: ``serve.py`` (the process), tests.
Also imported by ``proxy.py``, ``tools/doctor.py``, ``tools/selftest.py``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from . import telemetry
from .banking.registration import HANDLER_PREFIX, banking_handlers
from .clock import Clock, SystemClock
from .codes import Code
from .config import (
    CredentialKind,
    EffectMismatchAction,
    ExecutorConfig,
    load_config,
)
from .dispatch.effects import EffectRegister
from .dispatch.forward import ForwardRequestHandler
from .dispatch.registration import (
    Registration,
    compose_seam,
    load_registrations,
    run_registrations,
)
from .dispatch.seam import Outcome, Registry
from .door.door import Door, LegacyCaller
from .door.principals_file import PrincipalSet, load_principals_file
from .door.refusal_lines import RefusalEvent
from .door.workload import JwksSource, WorkloadVerifier
from .effects.receipts import ProviderKeys
from .egress.credentials import (
    DownstreamCredential,
    PrivateKeyJwtCredential,
    SignedRequestCredential,
    StaticHeaderCredential,
)
from .egress.destinations import build_transport, destinations
from .egress.guard import GuardedClient
from .egress.webhook import ApprovalWebhook
from .errors import AgentSafeError, ConfigError, JournalError
from .events import DeferredSink, Streams
from .evidence.chain import ChainedStreams, LineWriter, open_chained_streams
from .evidence.plan_audit import DurablePlanAudit
from .evidence.redact import Redactor
from .grants import SigningKey
from .host.audithook import Guard, allowed_egress
from .host.halt import HaltState
from .host.metrics import CountingSink, ExecutorMetrics
from .host.posture import PostureInputs, PostureMonitor, check_posture
from .host.secrets import SecretStore, inspect_sources
from .host.tlsctx import ReloadingTlsContext, TlsSettings
from .host.workers import WorkerLink
from .host.workgate import Startup, StoreHealth, WorkGate
from .lifecycle.catalog import ActionReconciler, PolicyCatalog
from .lifecycle.ceilings import HostCeilings
from .lifecycle.leases import LeaseKeeper
from .lifecycle.outcomes import ignore_mismatch
from .lifecycle.pipeline import Pipeline
from .lifecycle.shadow import ShadowReport
from .plane import Executor
from .plans.execute import StepExecutor
from .plans.service import ExecutorRegistry, PlanService
from .plans.signing import Ed25519Signer
from .policy.authority import LocalAuthority
from .policy.policy import (
    FORWARD_HANDLER,
    CompiledPolicy,
    PolicyDocument,
    Verdict,
    check_strict_schemas,
    compile_policy,
    load_policy,
)
from .principals import legacy_principal
from .routes.door import HttpDoor
from .state.backend import Backend, open_backend
from .state.journal import AttemptJournal
from .state.protocol import UseStore
from .windows import DoorWindows

__all__ = [
    "assemble",
    "build_credential",
    "build_door",
    "build_tls",
    "build_transport",
    "destinations",
    "load_principals",
]


def build_credential(
    config: ExecutorConfig,
    secrets: SecretStore,
    transport: GuardedClient,
    clock: Clock,
    *,
    on_token: Callable[[bytes], None] | None = None,
) -> DownstreamCredential:
    kind = config.downstream_credential_kind
    if kind is CredentialKind.STATIC_HEADER:
        if secrets.get("DOWNSTREAM_CREDENTIAL") is None or not config.downstream_credential_header:
            raise ConfigError("DOWNSTREAM_CREDENTIAL", "is required for STATIC_HEADER")
        return StaticHeaderCredential(
            config.downstream_credential_header, secrets.current("DOWNSTREAM_CREDENTIAL")
        )
    if kind is CredentialKind.PRIVATE_KEY_JWT:
        handle = secrets.current("DOWNSTREAM_PRIVATE_KEY")
        if (
            secrets.get("DOWNSTREAM_PRIVATE_KEY") is None
            or not config.downstream_token_url
            or not config.downstream_client_id
        ):
            raise ConfigError("DOWNSTREAM_PRIVATE_KEY", "is required for PRIVATE_KEY_JWT")
        algorithm = config.downstream_private_key_algorithm
        return PrivateKeyJwtCredential(
            client_id=config.downstream_client_id,
            token_url=config.downstream_token_url,
            private_key=handle,
            transport=transport,
            algorithm="PS256" if algorithm is not None and algorithm.value == "PS256" else "ES256",
            audience=config.downstream_token_audience,
            key_id=config.downstream_private_key_id,
            scope=config.downstream_token_scope,
            clock=clock,
            on_token=on_token,
        )
    handle = secrets.current("DOWNSTREAM_SIGNING_KEY")
    if secrets.get("DOWNSTREAM_SIGNING_KEY") is None or not config.downstream_signing_key_id:
        raise ConfigError("DOWNSTREAM_SIGNING_KEY", "is required for SIGNED_REQUEST")
    algorithm_name = config.downstream_signing_algorithm
    return SignedRequestCredential(
        key_id=config.downstream_signing_key_id,
        signing_key=handle,
        algorithm=(
            "hmac-sha256"
            if algorithm_name is not None and algorithm_name.value == "hmac-sha256"
            else "ed25519"
        ),
        clock=clock,
    )


def load_principals(
    config: ExecutorConfig, actions: Sequence[str], *, jwks: JwksSource | None = None
) -> PrincipalSet:
    """``EXECUTOR_PRINCIPALS_FILE``, checked against the policy's actions, the credential
    methods this process can verify and the issuers its key sets are bound to (at start, and
    again on every reload)."""
    assert config.executor_principals_file is not None
    principals = load_principals_file(
        config.executor_principals_file,
        registered_actions=actions,
        jwt_configured=bool(config.executor_jwt_audience and config.executor_jwks_file),
        client_ca_configured=config.executor_tls_client_ca_file is not None,
    )
    if jwks is not None:
        jwks.check_binding(principals.workload_issuers)
    return principals


def build_door(
    config: ExecutorConfig,
    *,
    secrets: SecretStore,
    actions: Sequence[str],
    streams: Streams,
    metrics: ExecutorMetrics,
    clock: Clock,
    halt: HaltState,
    jwks_fetch: Any = None,
) -> tuple[Door, JwksSource | None]:
    """The door for a principals file, or for the one legacy caller."""
    windows = DoorWindows(
        clock=clock,
        unauthenticated=config.executor_rate_limit_unauthenticated,
        lockout=config.executor_auth_lockout,
    )
    jwks: JwksSource | None = None
    workload: WorkloadVerifier | None = None
    if config.executor_jwks_file is not None and config.executor_jwt_audience:
        jwks = JwksSource(
            config.executor_jwks_file,
            security=streams.security,
            fetch=jwks_fetch,
            refresh_seconds=config.executor_jwks_refresh_seconds,
        )
        workload = WorkloadVerifier(
            jwks,
            audience=config.executor_jwt_audience,
            clock=clock,
            clock_tolerance_seconds=config.executor_jwt_clock_tolerance_seconds,
        )
    principals: PrincipalSet | LegacyCaller
    if config.executor_principals_file is not None:
        principals = load_principals(config, actions, jwks=jwks)
        for principal_id in principals.bearer_principal_ids():
            streams.security.emit("BEARER_PRINCIPAL_CONFIGURED", {"principal": principal_id})
    else:
        token = secrets.current("EXECUTOR_CALLER_TOKEN")
        actor = config.legacy_actor
        if (
            secrets.get("EXECUTOR_CALLER_TOKEN") is None
            or actor is None
            or config.executor_tenant_id is None
        ):
            raise ConfigError("EXECUTOR_CALLER_TOKEN", "legacy mode needs the caller token")
        principals = LegacyCaller(
            legacy_principal(tenant_id=config.executor_tenant_id, actor=actor),
            token,
            require_client_certificate=config.executor_tls_client_ca_file is not None,
        )
        streams.security.emit("LEGACY_PRINCIPAL_MODE", {"principal": principals.principal.id})
    door = Door(
        principals,
        windows=windows,
        clock=clock,
        security=streams.security,
        workload=workload,
        metrics=metrics,
        on_refusal=halt.record_auth_refusal,
    )
    return door, jwks


def build_tls(
    config: ExecutorConfig, secrets: SecretStore, streams: Streams, metrics: ExecutorMetrics
) -> ReloadingTlsContext | None:
    if config.executor_allow_plaintext_listener:
        return None
    if config.executor_tls_cert_file is None:
        raise ConfigError("EXECUTOR_TLS_CERT_FILE", "is required unless the listener is plaintext")

    def key() -> Any:
        handle = secrets.get("EXECUTOR_TLS_KEY")
        if handle is None:
            raise ConfigError("EXECUTOR_TLS_KEY", "is required with a certificate")
        return handle

    settings = TlsSettings(
        cert_file=Path(config.executor_tls_cert_file),
        key=key,
        min_version="1.2" if config.executor_tls_min_version.value == "1.2" else "1.3",
        client_ca_file=(
            Path(config.executor_tls_client_ca_file) if config.executor_tls_client_ca_file else None
        ),
        key_dir=Path(config.executor_state_dir) if config.executor_state_dir else None,
    )
    return ReloadingTlsContext(settings, security=streams.security, metrics=metrics)


def _forward_schema(document: PolicyDocument) -> dict[str, Any]:
    """The forward handler accepts exactly what the policy's actions it runs accept."""
    schemas = [dict(a.parameters) for a in document.actions if a.handler == FORWARD_HANDLER]
    if not schemas:  # no action runs it (agentsafe proxy's policy): it accepts nothing
        return {"type": "object", "additionalProperties": False, "maxProperties": 0}
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
    registrations: Sequence[tuple[str, Registration]] = (),
) -> Executor:
    """Build an executor from ``environ`` in the start order; raises on any refusal.

    With ``chain`` (where the evidence and security lines go), the two streams are chained and
    their heads persisted under the journal directory; ``streams`` must then be a pair of
    :class:`DeferredSink` that hold what start-up says until the chain is open.

    ``plan_executors`` are the host's step executors for the plan routes (each bound to one tool
    and effect); the routes exist when the policy has a ``plans`` section. ``registrations`` run
    against the seam before those ``EXECUTOR_HANDLERS`` names (``proxy.py`` registers the
    gateway's handler this way).
    """
    config = load_config(environ)
    # EXECUTOR_WORKERS: the supervisor made the journal directory and replica id this worker's
    worker = WorkerLink.from_environ(environ, count=config.executor_workers)
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
    metrics = ExecutorMetrics(verdicts=Verdict, outcomes=Outcome)
    # OTEL_*: off by default; the exporter's thread connects only inside allowed_egress
    telemetry.configure(
        {  # the OTEL_* rows of the configuration, and the headers, which are no row (a secret)
            **config.tracing_environment(),
            **{k: v for k in ("OTEL_EXPORTER_OTLP_HEADERS",) if (v := environ.get(k))},
        },
        on_drop=lambda reason, count: metrics.trace_spans_dropped.inc(count, reason=reason),
        around_export=allowed_egress,
    )
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
    closers: list[Callable[[], Awaitable[None]]] = []
    chained: ChainedStreams | None = None
    backend: Backend | None = None
    try:
        backend = await open_backend(config, secrets, clock=clock, shared_window=worker is not None)
        if backend.opened is not None:
            streams.security.emit("STORE_OPENED", dict(backend.opened))
        mirror = backend.attempts
        store = backend.store
        if config.executor_journal_dir is not None:
            try:
                journal = await AttemptJournal.open(
                    Path(config.executor_journal_dir),
                    retain_days=config.executor_journal_retain_days,
                    clock=clock,
                    mirror=mirror,
                )
                journal.span = telemetry.span  # each append, inside a traced request
            except JournalError as exc:
                raise ConfigError(
                    "EXECUTOR_JOURNAL_DIR", _journal_refusal(exc), code=exc.code
                ) from exc
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
                routine_security_events=frozenset(RefusalEvent),
                worker=worker.index if worker is not None else None,
            )
            _count_chained(chained, metrics)
            for resumed in (chained.evidence.resumption, chained.security.resumption):
                if resumed is not None and resumed.gap:
                    metrics.integrity_findings.inc(finding="CHAIN_GAP")
            for deferred, sink, name in (
                (streams.evidence, chained.evidence, "evidence"),
                (streams.security, chained.security, "security"),
            ):
                if not isinstance(deferred, DeferredSink):
                    raise TypeError("chained streams need DeferredSink placeholders")
                deferred.attach(CountingSink(sink, metrics, name))
        halt = HaltState(
            clock=clock,
            security=streams.security,
            halt_file=config.executor_halt_file,
            metrics=metrics,
            auth_spike=config.executor_halt_on_auth_failures,
            egress_spike=config.executor_halt_on_egress_refusals,
        )
        if worker is not None:
            halt.share(worker.shared_halt())  # an operator's halt is the whole group's

        def egress_refused(code: str) -> None:
            metrics.egress_refusals.inc(code=code)
            halt.record_egress_refusal()

        transport = build_transport(config, streams, on_refusal=egress_refused)
        closers.append(transport.close)  # its kept-alive connections, on a refused build too
        webhook = (
            ApprovalWebhook(
                url=config.executor_approval_webhook_url, transport=transport, streams=streams
            )
            if config.executor_approval_webhook_url
            else None
        )
        document = load_policy(config.executor_policy_file)
        # What a provider chose is screened against every current secret before it reaches
        # the agent or the evidence (a provider that reflects the credential, issue 16).
        registry = Registry(
            security=streams.security,
            screen=redactor.screen,
        )
        credential = build_credential(
            config,
            secrets,
            transport,
            clock,
            on_token=lambda token: redactor.set_secret("DOWNSTREAM_ACCESS_TOKEN", token),
        )
        check_strict_schemas(document)  # the policy's words (action, path) before the seam's
        forward = ForwardRequestHandler(
            url=config.downstream_url,
            lookup_url=config.downstream_lookup_url,
            timeout_ms=config.downstream_timeout_ms,
            transport=transport,
            credential=credential,
            parameters_schema=_forward_schema(document),
        )
        registry.register(FORWARD_HANDLER, forward)
        effects = EffectRegister()  # one per process: handlers put, attempts take
        receipts = ProviderKeys.from_entries(
            entry.model_dump(by_alias=True) for entry in document.provider_keys or ()
        )
        if any(action.handler.startswith(HANDLER_PREFIX) for action in document.actions):
            banking_handlers(
                registry,
                forward=forward,
                transport=transport,
                credential=credential,
                lookup_by_reference_url=config.downstream_lookup_by_reference_url,
                timeout_ms=config.downstream_timeout_ms,
                adapter_id=config.banking_adapter_id,
                adapter_version=config.banking_adapter_version,
                register=effects,
                receipts=receipts,
                security=streams.security,
            )
        seam = compose_seam(
            config,
            registry,
            credential=credential,
            transport=transport,
            effects=effects,
            closers=closers,
        )
        registered_steps = await run_registrations(
            [*registrations, *load_registrations(config.executor_handlers)],
            seam,
            security=streams.security,
        )
        registry.seal()
        plan_executors = (*plan_executors, *registered_steps)
        policy = compile_policy(document, registered_handlers=set(registry.names()))

        key_handle = secrets.get("EXECUTOR_AUTHORITY_SIGNING_KEY")
        if key_handle is not None:
            with key_handle.reveal() as pem:
                key = SigningKey.from_pem(pem)
        else:
            key = SigningKey.generate()
            streams.security.emit("AUTHORITY_KEY_EPHEMERAL", {"kid": key.kid})
        authority = LocalAuthority(policy, keys=key, store=store, clock=clock, receipts=receipts)

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
            window=backend.window,
        )
        shadow = ShadowReport()
        store_health = StoreHealth()
        startup = Startup(reconciling=True)
        pipeline = Pipeline(
            mode=config.executor_mode,
            authority=authority,
            signer=authority,
            catalog=PolicyCatalog(policy, registry),
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
            refusal=WorkGate(halt, monitor, store_health, startup).refusal,
            on_clock_skew=lambda skew: halt.clock_skew(skew * 1000),
            metrics=metrics,
            escalation=config.executor_escalation,
            on_forbidden=door.record_refusal,
            settle_margin_s=config.downstream_timeout_ms / 1000.0,
            approval_origin=config.executor_approval_origin,
            on_approval_requested=(
                webhook.notify if webhook is not None else lambda request, url: None
            ),
            effects=effects,
            on_effect_mismatch=(
                halt.effect_mismatch
                if config.executor_on_effect_mismatch is EffectMismatchAction.HALT
                else ignore_mismatch
            ),
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
            load_principals=functools.partial(
                load_principals, config, list(policy.actions), jwks=jwks
            ),
            chained=chained,
            webhook=webhook,
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
            backend=backend,
            lost_writes=backend.lost_writes,
            store_health=store_health,
            closers=closers,
            startup=startup,
            worker=worker,
        )
        if mirror is not None and journal is not None:
            executor.leases = LeaseKeeper(
                mirror,
                journal,
                reconciler=ActionReconciler(PolicyCatalog(policy, registry), registry),
                streams=streams,
                on_resolution=executor.recovery.lease_resolved,
                checks=executor.recovery.reconcile_checks(),
            )
        return executor
    except BaseException:
        # Nothing half-built survives a refusal: close what was opened, in reverse order.
        for close in reversed(closers):
            with contextlib.suppress(Exception):
                await close()
        if backend is not None:
            await backend.close()
        if journal is not None:
            await journal.close()
        secrets.close()
        if chained is not None:
            chained.close()
        raise


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


def _journal_refusal(exc: JournalError) -> str:
    """Why the journal directory refused, in words that name the real cause."""
    if exc.code == Code.JOURNAL_LOCKED:
        return (
            "is locked by another agentsafe process (one process per journal directory): stop"
            " it, or give this process its own EXECUTOR_JOURNAL_DIR"
        )
    return "cannot be opened for appending"
