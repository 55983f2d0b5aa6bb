"""``agentsafe operator`` and ``agentsafe crds generate|check``.

:func:`register` adds both subcommands to the ``agentsafe`` console script (it is the
``agentsafe.commands`` entry point; the executor's ``cli.py`` calls it with its subparsers).
``agentsafe operator`` runs kopf in this process with its own event loop (``kopf.operator``),
never inside the executor's.

Peering: every replica joins the peering ``agentsafe`` with a *distinct* priority (``--priority``,
default derived from ``POD_UID``/the host name and the process id), and peering is mandatory, so
two replicas never both act: kopf pauses the lower priority while a higher one is alive, and
would pause both on equal priorities.

Callers: the ``agentsafe`` console script.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

__all__ = ["register"]


def _positive_seconds(text: str) -> float:
    """An argparse type: seconds, a number above zero."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError("must be > 0 seconds")
    return value


def _worker_count(text: str) -> int:
    """An argparse type: a worker count the executor accepts (1..WORKERS_MAX)."""
    from agentsafe.executor.config import WORKERS_MAX

    text = text.strip()
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= WORKERS_MAX:
        raise argparse.ArgumentTypeError(
            f"must be a whole number 1..{WORKERS_MAX} (--executor-workers, "
            "AGENTSAFE_OPERATOR_EXECUTOR_WORKERS)"
        )
    return int(text)


def register(subparsers: Any) -> None:
    from agentsafe.executor.config import WORKERS_DEFAULT, WORKERS_MAX

    op = subparsers.add_parser("operator", help="run the Kubernetes operator (kopf)")
    op.add_argument(
        "--namespace",
        action="append",
        default=[],
        help="watch this namespace (repeatable); default: the whole cluster",
    )
    op.add_argument(
        "--priority",
        type=int,
        default=None,
        help="peering priority (distinct per replica; default derived from the pod)",
    )
    op.add_argument(
        "--executor-image",
        default=os.environ.get("AGENTSAFE_OPERATOR_EXECUTOR_IMAGE"),
        help="default executor image for AgentPolicies that name none",
    )
    op.add_argument(
        "--executor-workers",
        type=_worker_count,
        default=os.environ.get("AGENTSAFE_OPERATOR_EXECUTOR_WORKERS", str(WORKERS_DEFAULT)),
        help=f"worker processes per executor pod (EXECUTOR_WORKERS, 1..{WORKERS_MAX}) for "
        f"AgentPolicies whose spec.workers is unset (default {WORKERS_DEFAULT}); each worker "
        "is a process wanting up to a CPU core and its own memory",
    )
    op.add_argument(
        "--executor-port",
        type=int,
        default=int(os.environ.get("AGENTSAFE_OPERATOR_EXECUTOR_PORT", "8443")),
        help="the port rendered executors listen on (and the operator calls for halts)",
    )
    op.add_argument(
        "--operator-namespace",
        default=os.environ.get("AGENTSAFE_OPERATOR_NAMESPACE", "agentsafe-system"),
    )
    op.add_argument(
        "--issuer",
        default=os.environ.get("AGENTSAFE_OPERATOR_ISSUER"),
        help="service-account issuer (default: discovered from the API server)",
    )
    op.add_argument(
        "--reconcile-interval",
        type=_positive_seconds,
        default=os.environ.get("AGENTSAFE_OPERATOR_RECONCILE_INTERVAL", "60"),
        help="seconds between drift repairs of every AgentPolicy (default 60; changes of the "
        "objects and watched Secrets reconcile at once regardless)",
    )
    op.add_argument(
        "--liveness", default="http://0.0.0.0:8080/healthz", help="kopf's liveness endpoint"
    )
    op.add_argument(
        "--metrics-port",
        type=int,
        default=int(os.environ.get("AGENTSAFE_OPERATOR_METRICS_PORT", "9090")),
        help="serve the operator's own /metrics (reconciles, errors, durations) on this port;"
        " 0: do not serve",
    )
    op.add_argument(
        "--metrics-address",
        default=os.environ.get("AGENTSAFE_OPERATOR_METRICS_ADDRESS", "0.0.0.0"),  # noqa: S104
        help="the address /metrics binds (default every address of the pod)",
    )
    op.add_argument(
        "--metrics-token-secret",
        default=os.environ.get(
            "AGENTSAFE_OPERATOR_METRICS_TOKEN_SECRET", "agentsafe-metrics-token"
        ),
        help="Secret in the operator's namespace holding the metrics principal's bearer token"
        " (created once when absent); every executor admits it for GET /metrics only."
        " Empty: no metrics principal",
    )
    op.add_argument(
        "--scraper-namespace-selector",
        default=os.environ.get("AGENTSAFE_OPERATOR_SCRAPER_NAMESPACE_SELECTOR", ""),
        help="key=value[,...]: labels of the namespace Prometheus runs in; executor"
        " NetworkPolicies admit it to the listener port. Empty: no scraper admitted",
    )
    op.add_argument(
        "--scraper-pod-selector",
        default=os.environ.get("AGENTSAFE_OPERATOR_SCRAPER_POD_SELECTOR", ""),
        help="key=value[,...]: labels of the scraper's pods in that namespace (empty: any pod)",
    )
    hook = op.add_argument_group(
        "admission webhook",
        "refuse an AgentPolicy whose CEL `when` rules or parameter schemas do not compile "
        "before it is stored (docs/operator.md, 'Admission webhook'); the chart sets these",
    )
    hook.add_argument(
        "--webhook-port",
        type=int,
        default=int(os.environ.get("AGENTSAFE_OPERATOR_WEBHOOK_PORT", "0")),
        help="serve the validating webhook (HTTPS) on this port; 0 (default): no webhook",
    )
    hook.add_argument(
        "--webhook-address",
        default="0.0.0.0",  # noqa: S104 -- in a pod the API server dials the pod's address
        help="the address the webhook listens on",
    )
    tls = hook.add_mutually_exclusive_group()
    tls.add_argument(
        "--webhook-cert-dir",
        type=Path,
        default=None,
        help="a directory with tls.crt, tls.key and ca.crt (cert-manager's Secret, mounted); "
        "re-read when they change",
    )
    tls.add_argument(
        "--webhook-ca-secret",
        default=None,
        help="the operator keeps its own CA in this Secret of its namespace (created once) and "
        "signs each replica's serving certificate from it",
    )
    hook.add_argument(
        "--webhook-dns-name",
        action="append",
        default=[],
        help="a name (DNS or IP) of the serving certificate (repeatable; --webhook-ca-secret)",
    )
    hook.add_argument(
        "--webhook-configuration",
        default=None,
        help="the ValidatingWebhookConfiguration whose caBundle the operator sets "
        "(--webhook-ca-secret)",
    )
    op.set_defaults(run=_run_operator)

    crds = subparsers.add_parser("crds", help="generate or check the CRD manifests")
    csub = crds.add_subparsers(dest="crds_command", required=True)
    gen = csub.add_parser("generate", help="write crds/*.yaml and the chart's CRD templates")
    gen.add_argument("--root", type=Path, default=Path.cwd())
    gen.set_defaults(run=_crds_generate)
    chk = csub.add_parser("check", help="fail when the checked-in CRDs are stale")
    chk.add_argument("--root", type=Path, default=Path.cwd())
    chk.set_defaults(run=_crds_check)


def _crds_generate(args: argparse.Namespace) -> int:
    from .crds import write_crds

    for path in write_crds(args.root):
        print(path)
    return 0


def _crds_check(args: argparse.Namespace) -> int:
    from .crds import stale_crds

    stale = stale_crds(args.root)
    for path in stale:
        print(f"stale: {path} (run `agentsafe crds generate`)", file=sys.stderr)
    return 1 if stale else 0


def default_priority() -> int:
    """A priority unlikely to equal another replica's: from the pod's identity and our pid."""
    identity = os.environ.get("POD_UID") or socket.gethostname()
    digest = hashlib.sha256(f"{identity}:{os.getpid()}".encode()).digest()
    return 1 + int.from_bytes(digest[:4], "big") % (2**30)


def credentials_source(
    environ: Mapping[str, str], *, token: Path | None = None, home: Path | None = None
) -> str | None:
    """Where the operator's Kubernetes credentials would come from, or ``None`` when nowhere:
    in a pod, the projected service-account token; elsewhere a kubeconfig (``KUBECONFIG``, else
    ``~/.kube/config``), as :class:`~.kubeapi.Login` looks for them (the one rule). Checked
    before kopf starts, so a missing credential is one line and exit 78, not a traceback from
    inside kopf's start-up."""
    from .kubeapi import Login

    env = dict(environ)
    if home is not None:
        env["HOME"] = str(home)
    login = Login.from_environment(env)
    if token is not None:
        login = replace(login, token_file=token)
    if login.in_cluster():
        return "service account"
    if login.kubeconfig:
        return "KUBECONFIG"
    return "~/.kube/config" if login.kubeconfig_paths() else None


def _run_operator(args: argparse.Namespace) -> int:
    import logging

    import kopf

    from agentsafe.executor.codes import Code

    # kopf's JSON lines (timestamp, severity, message, the object's reference) at INFO, on
    # stderr; every line the operator process writes there is one of them.
    kopf.configure(log_format=kopf.LogFormat.JSON)
    log = logging.getLogger("agentsafe.operator")
    if credentials_source(os.environ) is None:
        log.error(
            "no Kubernetes credentials: run in a pod with a service account, "
            "or set KUBECONFIG (or ~/.kube/config)",
            extra={"code": Code.KUBE_CREDENTIALS_MISSING},
        )
        return 78
    try:
        return _operate(args)
    except Exception as exc:  # kopf has logged the cause, with its traceback, as JSON
        cause = exc.__cause__ or exc
        log.error(
            f"the operator could not start: {type(cause).__name__}: {cause}",
            extra={"code": Code.OPERATOR_START_FAILED},
        )
        return 1


def _operate(args: argparse.Namespace) -> int:
    import kopf

    from .handlers import KopfEvents, build_registry, configure_watching
    from .kubeapi import ApiError, KubeClient, Login, LoginFailed, connection_fields
    from .metrics import OperatorMetrics
    from .resources import FINALIZER
    from .runtime import Runtime, refresh_jwks
    from .settings import OperatorSettings, parse_labels

    try:
        scraper_namespace = parse_labels(
            args.scraper_namespace_selector, what="--scraper-namespace-selector"
        )
        scraper_pods = parse_labels(args.scraper_pod_selector, what="--scraper-pod-selector")
    except ValueError as exc:
        raise SystemExit(f"agentsafe operator: {exc}") from None
    if scraper_pods and not scraper_namespace:
        raise SystemExit(
            "agentsafe operator: --scraper-pod-selector needs --scraper-namespace-selector"
            " (the namespace Prometheus runs in)"
        )
    if not 0 <= args.metrics_port <= 65535:
        raise SystemExit("agentsafe operator: --metrics-port must be 0..65535")
    settings = OperatorSettings(
        operator_namespace=args.operator_namespace,
        metrics_token_secret=args.metrics_token_secret,
        scraper_namespace_labels=scraper_namespace,
        scraper_pod_labels=scraper_pods,
    )
    if args.executor_image:
        settings = replace(settings, executor_image=args.executor_image)
    if not 1 <= args.executor_port <= 65535:
        raise SystemExit("agentsafe operator: --executor-port must be 1..65535")
    settings = replace(settings, port=args.executor_port, executor_workers=args.executor_workers)
    settings = replace(settings, reconcile_interval_seconds=args.reconcile_interval)
    from agentsafe.executor import telemetry

    tracing = {k: v for k in telemetry.RENDERED_VARIABLES if (v := os.environ.get(k, ""))}
    settings = replace(settings, executor_tracing=tracing)
    _check_webhook_args(args)
    registry = build_registry(
        reconcile_interval=settings.reconcile_interval_seconds,
        halt_retry=settings.halt_retry_seconds,
        admission=args.webhook_port != 0,
    )
    memo = kopf.Memo()
    credentials = Login.from_environment()

    @kopf.on.login(registry=registry)
    async def login(**_: Any) -> kopf.ConnectionInfo:
        """kopf's own connection, from the credentials the operator's client loads: in a pod
        the projected service-account token, elsewhere the kubeconfig (exec plugins and OIDC
        included). Loaded afresh each time: kopf logs in again after a 401 and before an exec
        plugin's token expires, so a rotated token is picked up."""
        try:
            loaded = await credentials.load()
        except LoginFailed as exc:
            raise kopf.LoginError(str(exc)) from None
        return kopf.ConnectionInfo(**connection_fields(loaded))

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.peering.name = "agentsafe"
        settings.peering.mandatory = True
        settings.peering.priority = (
            args.priority if args.priority is not None else default_priority()
        )
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
            prefix="agentsafe.io"
        )
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix="agentsafe.io", key="last-handled-configuration"
        )
        settings.posting.level = 20  # INFO and up become Events
        settings.posting.reporting_component = "agentsafe"  # Events say agentsafe, not kopf
        settings.posting.reporting_instance = socket.gethostname()
        settings.persistence.finalizer = FINALIZER
        configure_watching(settings)
        try:
            kube = await KubeClient.connect(credentials)
        except LoginFailed as exc:
            raise kopf.PermanentError(str(exc)) from None
        operator_settings = settings_holder["settings"]
        if args.issuer:
            operator_settings = replace(operator_settings, issuer=args.issuer)
        else:
            try:
                discovery = await kube.get_json("/.well-known/openid-configuration")
                operator_settings = replace(operator_settings, issuer=str(discovery["issuer"]))
            except (ApiError, KeyError, TypeError):
                print(
                    "agentsafe operator: issuer discovery failed; using the default",
                    file=sys.stderr,
                )
        runtime = Runtime(
            kube=kube, settings=operator_settings, events=KopfEvents(), metrics=metrics
        )
        await refresh_jwks(runtime)
        memo["runtime"] = runtime
        memo["jwks_task"] = asyncio.create_task(_jwks_loop(runtime))
        if args.webhook_port:
            await _start_webhook(args, settings, kube, operator_settings.operator_namespace, memo)

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        for name in ("jwks_task", "webhook_tls_task"):
            task = memo.get(name)
            if task is not None:
                task.cancel()
        runtime = memo.get("runtime")
        if runtime is not None:
            await runtime.kube.close()

    settings_holder = {"settings": settings}
    namespaces = list(args.namespace)
    # OTEL_*: off by default; on, every reconcile is a span (handlers.traced)
    telemetry.configure(os.environ, default_service_name="agentsafe-operator")
    metrics = OperatorMetrics()
    if args.metrics_port:
        metrics.serve(args.metrics_address, args.metrics_port)
    asyncio.run(
        kopf.operator(
            registry=registry,
            memo=memo,
            clusterwide=not namespaces,
            namespaces=namespaces,
            liveness_endpoint=args.liveness,
        )
    )
    return 0


def _check_webhook_args(args: argparse.Namespace) -> None:
    if not args.webhook_port:
        return
    if not 1 <= args.webhook_port <= 65535:
        raise SystemExit("agentsafe operator: --webhook-port must be 1..65535 (or 0: no webhook)")
    if args.webhook_cert_dir is None and args.webhook_ca_secret is None:
        raise SystemExit(
            "agentsafe operator: --webhook-port needs --webhook-cert-dir (cert-manager's files) "
            "or --webhook-ca-secret (the operator's own CA)"
        )
    if args.webhook_ca_secret is not None and not (
        args.webhook_dns_name and args.webhook_configuration
    ):
        raise SystemExit(
            "agentsafe operator: --webhook-ca-secret needs --webhook-dns-name (the Service's "
            "name) and --webhook-configuration (the ValidatingWebhookConfiguration to trust it)"
        )


WEBHOOK_TLS_CHECK_SECONDS = 3600.0


async def _start_webhook(
    args: argparse.Namespace, settings: Any, kube: Any, namespace: str, memo: Any
) -> None:
    """Configure kopf's webhook server (TLS from cert-manager's files, or the operator's CA);
    the chart renders the ValidatingWebhookConfiguration, so kopf manages none."""
    import tempfile

    import kopf

    from .admission import ADMISSION_WEBHOOK_ID
    from .webhook_tls import WebhookTlsError, ensure_ca, publish_ca_bundle, write_serving

    if args.webhook_cert_dir is not None:
        directory = Path(args.webhook_cert_dir)
    else:
        try:
            ca = await ensure_ca(kube, namespace, args.webhook_ca_secret)
        except WebhookTlsError as exc:
            raise kopf.PermanentError(str(exc)) from None
        directory = Path(tempfile.mkdtemp(prefix="agentsafe-webhook-"))
        files = write_serving(directory, ca, args.webhook_dns_name)
        await publish_ca_bundle(kube, args.webhook_configuration, [ADMISSION_WEBHOOK_ID], ca)
        memo["webhook_tls_task"] = asyncio.create_task(
            _webhook_tls_loop(args, kube, ca, directory, files)
        )
    settings.admission.managed = None
    settings.admission.server = kopf.WebhookServer(
        addr=args.webhook_address,
        port=args.webhook_port,
        certfile=directory / "tls.crt",
        pkeyfile=directory / "tls.key",
        cafile=directory / "ca.crt",
    )


async def _webhook_tls_loop(
    args: argparse.Namespace, kube: Any, ca: Any, directory: Path, files: Any
) -> None:
    """Sign a new serving certificate before the old one expires (kopf's server notices the
    files within a minute) and set caBundle again (a re-installed chart clears it)."""
    from .admission import ADMISSION_WEBHOOK_ID
    from .kubeapi import ApiError
    from .webhook_tls import needs_renewal, publish_ca_bundle, write_serving

    while True:
        await asyncio.sleep(WEBHOOK_TLS_CHECK_SECONDS)
        if needs_renewal(files):
            files = write_serving(directory, ca, args.webhook_dns_name)
        try:
            await publish_ca_bundle(kube, args.webhook_configuration, [ADMISSION_WEBHOOK_ID], ca)
        except ApiError as exc:
            print(
                f"agentsafe operator: setting the webhook caBundle failed: {exc}", file=sys.stderr
            )


async def _jwks_loop(runtime: Any) -> None:
    from .runtime import refresh_jwks

    while True:
        await asyncio.sleep(runtime.settings.jwks_refresh_seconds)
        await refresh_jwks(runtime)
