"""``agentsafe doctor``: check an installation and a configuration before starting the executor.

Each check is one line: its status (``ok``, ``warn``, ``fail``, ``skip``), its name, what it found
and, when it is not ``ok``, what to do next. The checks, in the executor's own start order, and
each through the same code ``agentsafe serve`` runs (so doctor and serve cannot disagree):

``install``     the agentsafe version, the interpreter, the optional extras that are importable
``config``      every variable parses (``config.load_config``)
``handlers``    the registration functions load and register (``dispatch/registration.py``)
``policy``      the policy file parses and compiles against the registered handlers
``principals``  the principals file (mode, owner, schema, roles), or the legacy single caller
``jwks``        ``EXECUTOR_JWKS_FILE`` holds keys (workload tokens only)
``secrets``     where every secret comes from and the mode and owner of each secret file
``tls``         the listener's certificate and key load into a TLS context
``downstream``  ``DOWNSTREAM_URL`` answers through the egress guard (a ``HEAD``, which effects
                nothing)
``lookup``      ``DOWNSTREAM_LOOKUP_URL`` answers 404 for a key nobody used, through the guard
``posture``     the host posture checks (the audit hook's own three run only inside ``serve``)

A check that cannot run because an earlier one failed is ``skip``. ``-o json`` prints
``{"ok": bool, "checks": [{"check", "status", "detail", "next"}]}``. ``--env-file`` reads a
``KEY=VALUE`` file (``agentsafe init`` writes one; python-dotenv parses it) over the process
environment. Exit status 0 when nothing failed, 1 otherwise. Nothing printed is a secret value.

Callers: ``cli.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from importlib.util import find_spec
from pathlib import Path
from typing import Any

__all__ = ["Check", "add_parser", "read_environment", "run_checks"]

PROBE_KEY = "agentsafe-doctor-probe-never-used"


@dataclass(frozen=True)
class Check:
    check: str
    status: str  # ok | warn | fail | skip
    detail: str
    next: str = ""

    def line(self) -> str:
        text = f"{self.status:<5} {self.check:<11} {self.detail}"
        return f"{text} -> {self.next}" if self.next else text


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "doctor",
        help="check the install, configuration, policy, principals, secrets, TLS, egress, posture",
        description="Check everything agentsafe serve needs, in its start order, through the "
        "same code serve runs. Each check is one line that says what to do next. Reads the "
        "environment, or --env-file over it. Exit 1 if any check fails.",
    )
    parser.add_argument("--env-file", help="a KEY=VALUE file (as agentsafe init writes)")
    parser.add_argument("-o", "--output", choices=["text", "json"], default="text")
    parser.set_defaults(run=run)


def read_environment(env_file: str | None) -> dict[str, str]:
    """The process environment, with ``env_file``'s values over it."""
    environ = dict(os.environ)
    if env_file:
        from dotenv import dotenv_values

        values = dotenv_values(env_file, interpolate=False)
        environ.update({k: v for k, v in values.items() if v is not None})
    return environ


def _install() -> Check:
    try:
        installed = version("agentsafe")
    except PackageNotFoundError:
        installed = "unknown (not installed as a distribution)"
    extras = [name for name in ("mcp", "http_message_signatures", "kopf") if find_spec(name)]
    detail = (
        f"agentsafe {installed}, Python {platform.python_version()}; extras: "
        f"{', '.join(extras) or 'none'}"
    )
    return Check("install", "ok", detail)


async def run_checks(environ: Mapping[str, str]) -> list[Check]:
    from .. import telemetry
    from ..assembly import build_credential, build_tls, build_transport, load_principals
    from ..clock import SystemClock
    from ..codes import Code
    from ..config import load_config
    from ..dispatch.effects import EffectRegister
    from ..dispatch.forward import ForwardRequestHandler
    from ..dispatch.registration import compose_seam, load_registrations, run_registrations
    from ..dispatch.seam import Outcome, Registry
    from ..door.workload import JwksSource
    from ..errors import AgentSafeError, ConfigError
    from ..events import MemorySink, Streams
    from ..host.audithook import GUARD_CHECKS
    from ..host.metrics import ExecutorMetrics
    from ..host.posture import ALL_CHECKS, PostureInputs, evaluate_posture
    from ..host.secrets import SecretStore, inspect_sources
    from ..policy.policy import Verdict, compile_policy, load_policy

    checks = [_install()]
    try:
        config = load_config(environ)
        telemetry.settings_from(config.tracing_environment())  # the OTEL_* rows' values
    except ConfigError as exc:
        checks.append(
            Check("config", "fail", str(exc), f"fix {exc.variable} (docs/configuration.md)")
        )
        for name in (
            "handlers",
            "policy",
            "principals",
            "secrets",
            "tls",
            "downstream",
            "lookup",
            "posture",
        ):
            checks.append(Check(name, "skip", "needs a valid configuration"))
        return checks
    checks.append(
        Check("config", "ok", f"every variable parses; {config.executor_mode.value} mode")
    )
    streams = Streams(evidence=MemorySink(), security=MemorySink())
    secrets_dir = Path(config.executor_secrets_dir) if config.executor_secrets_dir else None

    # secrets: where each comes from, and each file's mode and owner, before any value is read
    findings = inspect_sources(environ, production=config.production, secrets_dir=secrets_dir)
    secrets: SecretStore | None = None
    if findings.findings:
        for finding in findings.findings:
            missing = finding.code == Code.SECRET_FILE_UNREADABLE
            checks.append(
                Check(
                    "secrets",
                    "fail",
                    f"{finding.variable}: {finding.problem} ({finding.code})",
                    f"put the value in the file {finding.variable} names, mode 0600"
                    if missing
                    else "make the file a regular file owned by this user, mode 0600 or 0400, "
                    "inside EXECUTOR_SECRETS_DIR (docs/posture.md#secrets)",
                )
            )
    else:
        try:
            secrets = SecretStore.load(
                environ,
                production=config.production,
                secrets_dir=secrets_dir,
                security=streams.security,
            )
            given = ", ".join(secrets.names()) or "none"
            checks.append(Check("secrets", "ok", f"secret files hold their modes; given: {given}"))
        except AgentSafeError as exc:
            checks.append(
                Check("secrets", "fail", f"{exc.message} ({exc.code})", "fix the named secret")
            )

    transport = build_transport(config, streams, on_refusal=lambda code: None)
    try:
        # handlers and policy
        names: list[str] = []
        document = None
        try:
            document = load_policy(config.executor_policy_file)
        except AgentSafeError as exc:
            checks.append(
                Check(
                    "policy",
                    "fail",
                    f"{exc.message} ({exc.code})",
                    "run: agentsafe policy lint EXECUTOR_POLICY_FILE",
                )
            )
        if secrets is None:
            checks.append(Check("handlers", "skip", "needs the secrets (the credential)"))
        else:
            try:
                registry = Registry(security=streams.security)
                credential = build_credential(config, secrets, transport, SystemClock())
                registry.register(
                    "forward_request",
                    ForwardRequestHandler(
                        url=config.downstream_url,
                        lookup_url=config.downstream_lookup_url,
                        timeout_ms=config.downstream_timeout_ms,
                        transport=transport,
                        credential=credential,
                        parameters_schema={"type": "object", "additionalProperties": False},
                    ),
                )
                seam = compose_seam(
                    config,
                    registry,
                    credential=credential,
                    transport=transport,
                    effects=EffectRegister(),
                )
                loaded = load_registrations(config.executor_handlers)
                steps = await run_registrations(loaded, seam, security=streams.security)
                for close in reversed(seam.closers):
                    with contextlib.suppress(Exception):
                        await close()
                names = list(registry.names())
                detail = f"handlers: {', '.join(names)}; plan step executors: {len(steps)}"
                if loaded:
                    detail += f"; registrations: {', '.join(n for n, _ in loaded)}"
                checks.append(Check("handlers", "ok", detail))
            except ConfigError as exc:
                checks.append(
                    Check(
                        "handlers",
                        "fail",
                        str(exc),
                        f"fix {exc.variable} (docs/handlers.md, docs/configuration.md)",
                    )
                )
        if document is not None:
            try:
                policy = compile_policy(document, registered_handlers=set(names) if names else None)
                plans = " and a plans section" if document.plans is not None else ""
                checks.append(
                    Check(
                        "policy",
                        "ok",
                        f"{len(policy.actions)} action(s): {', '.join(policy.actions)}{plans}",
                    )
                )
            except AgentSafeError as exc:
                checks.append(
                    Check(
                        "policy",
                        "fail",
                        f"{exc.message} ({exc.code})",
                        "name a registered handler in each action, or register one "
                        "(docs/handlers.md); agentsafe policy lint explains the rest",
                    )
                )

        # principals
        if config.executor_principals_file is None:
            checks.append(
                Check(
                    "principals",
                    "warn",
                    "the legacy single caller (EXECUTOR_CALLER_TOKEN): one proposer, no "
                    "operator or approver",
                    "write a principals file: agentsafe init --shape mtls (or workload)",
                )
            )
        elif document is None:
            checks.append(Check("principals", "skip", "needs the policy (its actions)"))
        else:
            try:
                actions = [a.name for a in document.actions]
                principals = load_principals(config, actions)
                roles = sorted({r.principal.role.value for r in principals.records})
                checks.append(
                    Check(
                        "principals",
                        "ok",
                        f"{len(principals)} principal(s), roles {', '.join(roles)}; file mode "
                        "and owner hold",
                    )
                )
            except ConfigError as exc:
                checks.append(
                    Check(
                        "principals",
                        "fail",
                        f"{exc.message} ({exc.code})",
                        "chmod 0600 the file and fix the named principal (docs/configuration.md)",
                    )
                )

        if config.executor_jwks_file is not None:
            try:
                JwksSource(config.executor_jwks_file)
                checks.append(Check("jwks", "ok", "EXECUTOR_JWKS_FILE holds signing keys"))
            except ConfigError as exc:
                checks.append(
                    Check(
                        "jwks",
                        "fail",
                        f"{exc.message} ({exc.code})",
                        "kubectl get --raw /openid/v1/jwks > the file EXECUTOR_JWKS_FILE names",
                    )
                )

        # TLS
        if config.executor_allow_plaintext_listener:
            checks.append(
                Check(
                    "tls",
                    "warn",
                    "the listener is plaintext (EXECUTOR_ALLOW_PLAINTEXT_LISTENER=true)",
                    "set EXECUTOR_TLS_CERT_FILE and EXECUTOR_TLS_KEY_FILE outside a laptop",
                )
            )
        elif secrets is None:
            checks.append(Check("tls", "skip", "needs the secrets (the TLS key)"))
        else:
            try:
                build_tls(
                    config, secrets, streams, ExecutorMetrics(verdicts=Verdict, outcomes=Outcome)
                )
                client = (
                    "; client certificates required (mTLS)"
                    if config.executor_tls_client_ca_file
                    else ""
                )
                checks.append(
                    Check(
                        "tls",
                        "ok",
                        f"certificate and key load (TLS >= "
                        f"{config.executor_tls_min_version.value}){client}",
                    )
                )
            except (AgentSafeError, OSError, ValueError) as exc:
                code = getattr(exc, "code", type(exc).__name__)
                checks.append(
                    Check(
                        "tls",
                        "fail",
                        f"the certificate or key does not load ({code})",
                        "check EXECUTOR_TLS_CERT_FILE and EXECUTOR_TLS_KEY_FILE are a matching "
                        "PEM pair",
                    )
                )

        # downstream and lookup through the egress guard
        checks.append(await _reach(transport, "downstream", "HEAD", config.downstream_url))
        lookup = config.downstream_lookup_url
        if lookup is None:
            checks.append(
                Check(
                    "lookup",
                    "warn",
                    "DOWNSTREAM_LOOKUP_URL is not set: a lost outcome cannot be reconciled",
                    "set DOWNSTREAM_LOOKUP_URL to the provider's read-by-idempotency-key URL",
                )
            )
        else:
            checks.append(
                await _reach(
                    transport, "lookup", "GET", lookup.replace("{idempotency_key}", PROBE_KEY)
                )
            )
    finally:
        await transport.close()
        if secrets is not None:
            secrets.close()

    # posture (the guard's own checks need the audit hook, which only serve installs)
    inputs = PostureInputs(
        mode=config.executor_posture,
        production=config.production,
        environ=environ,
        principals_file=config.executor_principals_file,
        secret_findings=findings.findings,
    )
    report = evaluate_posture(inputs, only=[c for c in ALL_CHECKS if c not in GUARD_CHECKS])
    failed = [r for r in report.results if not r.holds]
    waived = [r.name for r in report.results if r.waived]
    if failed:
        for result in failed:
            checks.append(
                Check(
                    "posture",
                    "fail",
                    f"{result.name} does not hold{': ' + result.detail if result.detail else ''}",
                    f"see docs/posture.md ({result.name})",
                )
            )
    elif waived:
        checks.append(
            Check(
                "posture",
                "warn",
                f"{config.executor_posture.value}: waived {', '.join(waived)}",
                "run under EXECUTOR_POSTURE=ENFORCED in a hardened pod",
            )
        )
    else:
        checks.append(Check("posture", "ok", f"{config.executor_posture.value}: every check holds"))
    return checks


async def _reach(transport: Any, name: str, method: str, url: str) -> Check:
    from ..egress.transport import TransportError

    try:
        response = await transport.request(method, url, headers={}, body=None, timeout=5.0)
    except TransportError as exc:
        return Check(
            name,
            "fail",
            f"not reachable through the egress guard ({exc.code})",
            "check the URL, its CA (DOWNSTREAM_CA_FILE) and pins, and that the name resolves "
            "(docs/egress.md)",
        )
    if name == "lookup":
        if response.status == 404:
            return Check(name, "ok", "answers 404 for a key nobody used, through the egress guard")
        return Check(
            name,
            "warn",
            f"answered {response.status} for a key nobody used (404 expected)",
            "the lookup must answer 404 for an unknown key, or reconciliation cannot tell",
        )
    return Check(name, "ok", f"answers through the egress guard ({method} -> {response.status})")


def run(args: argparse.Namespace) -> int:
    environ = read_environment(args.env_file)
    checks = asyncio.run(run_checks(environ))
    failed = any(c.status == "fail" for c in checks)
    if args.output == "json":
        body = {"ok": not failed, "checks": [asdict(c) for c in checks]}
        sys.stdout.write(json.dumps(body, indent=2) + "\n")
    else:
        for check in checks:
            sys.stdout.write(check.line() + "\n")
        verdict = "some checks failed" if failed else "ready for agentsafe serve"
        sys.stdout.write(f"\n{verdict}\n")
    return 1 if failed else 0
