"""``agentsafe proxy --upstream URL --port N``: the HTTP-interception gateway, as a process.

It is ``agentsafe serve``'s executor (the same assembly: posture, secrets, journal, chained
evidence, use store, policy, authority, startup reconciliation) with the gateway's listener in
front of an upstream instead of the proposal routes (``gateway/listener.py``), and the gateway's
``gateway_forward`` handler registered through the seam (``gateway/forward.py``).

Configuration: with ``EXECUTOR_POLICY_FILE`` set, the environment is an executor configuration
like serve's (``DOWNSTREAM_URL`` defaults to the upstream and must name it; ``EXECUTOR_MODE``
defaults to SHADOW), and the policy must have an ``http_request`` action run by
``gateway_forward``. With nothing configured it runs the demo authority (``gateway/demo.py``) on
loopback and says so on every line it writes (``"authority": "demo"``). The gateway proposes as
the legacy caller, or as ``--principal`` from the principals file.

The gateway's traffic (forwarding, lookups, pass-through reads) goes through a guarded client of
its own, with the same egress policy, whose refusals count towards the egress halt only when they
are about where the connection goes (:data:`HALTING_REFUSALS`): a path, a header or an answer of
the upstream is the client's choice, and no client may halt the gateway. The executor's background
polls run as in ``serve`` (the store's health among them: 503 ``STORE_UNAVAILABLE`` while it does
not answer).

Output: JSON lines, as every other process writes (``LOG_SCHEMA``: ``schema``, ``event``, ``at``,
``level``, ``message``): on standard output ``GATEWAY_LISTENING`` (address, port, upstream, mode,
evidence directory), ``GATEWAY_ROUTES`` with ``--serve-routes``, one ``GATEWAY_REQUEST`` per
request, ``STOPPING`` and, in shadow, ``SHADOW_REPORT``; a refusal to start is one
``REFUSED_TO_START`` line on standard error, as serve's. The chained evidence and security streams
go to ``gateway-evidence.jsonl`` and ``gateway-security.jsonl`` in the journal directory (the state
directory without one). The process guard (``host/audithook.py``) is installed as ``serve``
installs it, and the posture is checked with its self-test. SIGTERM or Ctrl-C stops it; in
shadow it then prints the shadow report, ending with the switch that turns enforcement on
(``--enforce`` for the demo). With ``--serve-routes`` (configured only) the executor's own routes
are served as well on ``EXECUTOR_BIND_ADDRESS:PORT``, so ``agentsafe status`` asks a running
gateway what it is doing, its shadow report included.

Callers: ``cli.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

from aiohttp import web

from . import telemetry
from .assembly import assemble, build_transport
from .codes import Code
from .config import ExecutorConfig, ExecutorMode, load_config
from .dispatch.registration import Seam
from .door.door import LegacyCaller
from .egress.guard import GuardedClient
from .errors import AgentSafeError, ConfigError
from .events import LOG_SCHEMA, SECURITY_SCHEMA, DeferredSink, JsonLinesSink, Streams
from .gateway.demo import BANNER, demo_environment
from .gateway.forward import HANDLER, Exchanges, GatewayForwardHandler
from .gateway.listener import Gateway
from .host.audithook import Guard, install_guard
from .plane import Executor
from .routes.app import SERVER_HEADER
from .routes.listener import GuardedSite, handler_settings

__all__ = ["add_parser", "main"]


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "proxy",
        help="the HTTP-interception gateway in front of an upstream",
        description="Put agentsafe in front of an API: every POST, PUT, PATCH and DELETE is an "
        "intent, decided by the policy, and forwarded byte for byte only on ALLOW, once, under "
        "a claimed single-use grant; BLOCK is 403 GATEWAY_BLOCKED, ESCALATE is held (202). It "
        "starts in shadow. With no EXECUTOR_* configuration it runs a local DEMO authority with "
        "a synthetic policy and says so on every line.",
    )
    parser.add_argument("--upstream", required=True, help="the upstream's base URL")
    parser.add_argument("--port", type=int, required=True, help="the port to listen on")
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    parser.add_argument(
        "--enforce",
        action="store_true",
        help="demo only: enforce instead of shadow (configured: set EXECUTOR_MODE)",
    )
    parser.add_argument("--principal", help="the PROPOSER the gateway proposes as (principals)")
    parser.add_argument(
        "--serve-routes",
        action="store_true",
        help="configured only: also serve the executor's routes (control, status) on "
        "EXECUTOR_BIND_ADDRESS:PORT, so agentsafe status can ask this gateway",
    )
    parser.set_defaults(run=main)


def _environment(
    args: argparse.Namespace, environ: Mapping[str, str], workdir: Path
) -> tuple[dict[str, str], bool]:
    """The executor configuration and whether it is the demo authority's."""
    upstream = args.upstream.rstrip("/")
    parts = urlsplit(upstream)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
        raise ConfigError("--upstream", "must be an http(s) origin such as http://127.0.0.1:3000")
    if not environ.get("EXECUTOR_POLICY_FILE"):
        return demo_environment(upstream, workdir, enforce=args.enforce, base=dict(environ)), True
    env = dict(environ)
    env.setdefault("EXECUTOR_MODE", "SHADOW")
    if env.setdefault("DOWNSTREAM_URL", upstream).rstrip("/") != upstream:
        raise ConfigError("DOWNSTREAM_URL", "must be the --upstream origin for agentsafe proxy")
    return env, False


HALTING_REFUSALS = frozenset(
    {
        Code.EGRESS_ADDRESS_REFUSED,
        Code.EGRESS_ORIGIN_NOT_ALLOWED,
        Code.EGRESS_SCHEME_NOT_ALLOWED,
        Code.EGRESS_TLS_REJECTED,
        Code.EGRESS_TLS_PIN_MISMATCH,
    }
)
"""The egress refusals of the gateway's traffic that count towards the egress halt: where the
connection would go (the upstream's address, origin, scheme, certificate), which no client of
the gateway chooses. A path, a header, or what the upstream answers a path the client chose (a
redirect, an oversize body, a timeout, a malformed answer) are the client's choice: each is
still refused, counted in the metrics and on the security stream, but never halts the gateway
(an anonymous peer is never handed a way to stop the boundary)."""


def _register(exchanges: Exchanges, timeout_ms: int, transport: Any = None) -> Any:
    """The ``gateway_forward`` registration; ``transport`` is the gateway's own guarded client
    (``None``: the seam's, for tests that build a gateway in process)."""

    def register(seam: Seam) -> list[str]:
        seam.registry.register(
            HANDLER,
            GatewayForwardHandler(
                upstream=seam.downstream.url,
                lookup_url=seam.downstream.lookup_url,
                timeout_ms=timeout_ms,
                transport=transport if transport is not None else seam.fetch,
                credential=seam.credential,
                exchanges=exchanges,
            ),
        )
        return [HANDLER]

    return register


def gateway_transport(
    config: ExecutorConfig, streams: Streams, executor: list[Executor]
) -> GuardedClient:
    """The guarded client for the gateway's traffic: the same policy as the process's, with
    only :data:`HALTING_REFUSALS` counted towards the halt (``executor`` holds the executor
    once it is assembled; a refusal before that is counted nowhere, and none can happen)."""

    def refused(code: str) -> None:
        for running in executor:
            running.metrics.egress_refusals.inc(code=code)
            if code in HALTING_REFUSALS:
                running.halt.record_egress_refusal()

    return build_transport(config, streams, on_refusal=refused)


def _principal(executor: Executor, principal_id: str | None) -> Any:
    principals = executor.door.door.principals
    if isinstance(principals, LegacyCaller):
        return principals.principal
    record = principals.get(principal_id or "")
    if record is None or not record.principal.may_propose("http_request"):
        raise ConfigError(
            "--principal", "must name a PROPOSER of the principals file allowed http_request"
        )
    return record.principal


async def listen(
    gateway: Gateway, executor: Executor, host: str, port: int
) -> tuple[web.ServerRunner, GuardedSite]:
    """The gateway behind the executor's own hardened listener (``routes/listener.py``): the
    same header and body deadlines, connection caps, parser refusals (400 ``HTTP_MALFORMED``)
    and ``Server: agentsafe`` as ``serve``'s routes."""
    limits = executor.listener_limits

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        response = await gateway.handle(request)
        response.headers.setdefault("Server", SERVER_HEADER)
        return response

    runner = web.ServerRunner(web.Server(handle, **handler_settings(limits)), handle_signals=False)
    await runner.setup()
    site = GuardedSite(runner, host, port, limits=limits, security=executor.streams.security)
    await site.start()
    return runner, site


async def run(
    args: argparse.Namespace,
    env: Mapping[str, str],
    *,
    demo: bool,
    streams_dir: Path,
    outputs: tuple[TextIO, TextIO],
    guard: Guard | None = None,
) -> int:
    out = JsonLinesSink(sys.stdout, schema=LOG_SCHEMA)
    # The demo says so on every line (``authority``, and the banner's words in ``notice``).
    marks: dict[str, Any] = {"authority": "demo", "notice": BANNER.rstrip(" |")} if demo else {}

    def say(message: str, event: str = "GATEWAY_REQUEST", **fields: Any) -> None:
        out.emit(event, {"level": "INFO", "message": message, **fields, **marks})

    config = load_config(env)
    if config.executor_workers > 1:  # never a setting that is read and then does nothing
        raise ConfigError(
            "EXECUTOR_WORKERS", "is for agentsafe serve; agentsafe proxy runs one process"
        )
    exchanges = Exchanges()
    evidence, security = DeferredSink(), DeferredSink()
    streams = Streams(evidence=evidence, security=security)
    evidence_out, security_out = outputs
    assembled: list[Executor] = []
    transport = gateway_transport(config, streams, assembled)
    try:
        executor = await assemble(
            env,
            streams=streams,
            chain=(evidence_out, security_out),
            guard=guard,
            registrations=[
                ("gateway", _register(exchanges, config.downstream_timeout_ms, transport))
            ],
        )
    except BaseException:
        await transport.close()
        if not security.attached:
            security.drain(JsonLinesSink(security_out, schema=SECURITY_SCHEMA))
        raise
    assembled.append(executor)
    executor.closers.append(transport.close)
    try:
        if "http_request" not in executor.policy.actions:
            raise ConfigError(
                "EXECUTOR_POLICY_FILE", "needs an http_request action run by gateway_forward"
            )
        gateway = Gateway(
            pipeline=executor.pipeline,
            principal=_principal(executor, args.principal),
            upstream=args.upstream.rstrip("/"),
            transport=transport,
            exchanges=exchanges,
            read_action="http_read" in executor.policy.actions,
            authority="demo" if demo else "local",
            timeout=config.downstream_timeout_ms / 1000,
            log=say,
            screen=lambda text: executor.redactor.redact(text, jws=False)[0],
            security=executor.streams.security,
            body_timeout=float(config.executor_body_timeout_seconds),
        )
        await executor.reconcile_at_start()
        # As serve: the halt file, the store's health (503 STORE_UNAVAILABLE at once while it
        # does not answer), secrets, posture and the journal, each polled.
        executor.start_background()
        if args.serve_routes:
            if demo:
                raise ConfigError("--serve-routes", "needs a configuration (principals)")
            await executor.listen()
            where = f"{config.executor_bind_address}:{executor.port}"
            say(
                f"executor routes (control, status) on {where}",
                "GATEWAY_ROUTES",
                address=config.executor_bind_address,
                port=executor.port,
            )
        runner, _site = await listen(gateway, executor, args.host, args.port)
        mode = config.executor_mode.value
        say(
            f"agentsafe proxy: http://{args.host}:{args.port} -> {gateway.upstream} "
            f"({mode}; evidence in {streams_dir})",
            "GATEWAY_LISTENING",
            address=args.host,
            port=args.port,
            upstream=gateway.upstream,
            mode=mode,
            evidence_dir=str(streams_dir),
        )
        if demo:
            say(
                "no EXECUTOR_* configuration: the built-in authority decides with a synthetic"
                " policy in this process; set EXECUTOR_POLICY_FILE and the rest to configure."
                " agentsafe status has no control routes to ask here: the shadow report is"
                " written when this stops (Ctrl-C); configure it and use --serve-routes for status",
                "GATEWAY_DEMO",
            )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        say("stopping", "STOPPING")
        await runner.cleanup()
    finally:
        await executor.close()
        # as serve: the spans still queued are exported, bounded by OTEL_EXPORTER_OTLP_TIMEOUT
        await asyncio.to_thread(telemetry.shutdown)
        if executor.config.executor_mode is ExecutorMode.SHADOW:
            report = executor.shadow.render()
            if demo:
                report += "\n(for the demo authority: restart with --enforce)"
            say(report, "SHADOW_REPORT", **executor.shadow.as_dict())
    return 0


def main(args: argparse.Namespace) -> int:
    try:
        with tempfile.TemporaryDirectory(prefix="agentsafe-proxy-") as tmp:
            env, demo = _environment(args, os.environ, Path(tmp))
            config = load_config(env)
            streams_dir = Path(config.executor_journal_dir or config.executor_state_dir or tmp)
            writable = [Path(tmp), streams_dir]
            writable += [
                Path(d)
                for d in (config.executor_state_dir, config.executor_evidence_dir)
                if d is not None
            ]
            # The same process guard as serve: no egress outside the guarded client, no child
            # processes, no writes outside these directories (host/audithook.py).
            guard = install_guard(writable_dirs=writable)
            with (
                open(streams_dir / "gateway-evidence.jsonl", "a", encoding="utf-8") as evidence,
                open(streams_dir / "gateway-security.jsonl", "a", encoding="utf-8") as security,
            ):
                return asyncio.run(
                    run(
                        args,
                        env,
                        demo=demo,
                        streams_dir=streams_dir,
                        outputs=(evidence, security),
                        guard=guard,
                    )
                )
    except ConfigError as exc:
        _refused(exc.code, f"{exc.code}: {exc}")
        return exc.exit_status
    except AgentSafeError as exc:
        _refused(exc.code, f"{exc.code}: {exc.message}")
        return 78
    except OSError as exc:
        _refused(None, f"cannot listen: {exc.strerror}")
        return 1


def _refused(code: str | None, message: str) -> None:
    """A start-up refusal: one JSON line on stderr (never plain text), level ERROR, as serve's
    (``serve._refused``); a port that cannot be bound carries no code, as no setting is wrong."""
    fields = {"level": "ERROR", "message": f"agentsafe proxy: refused to start: {message}"}
    JsonLinesSink(sys.stderr, schema=SECURITY_SCHEMA).emit(
        Code.REFUSED_TO_START, fields if code is None else {**fields, "code": code}
    )
