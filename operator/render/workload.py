"""The executor workload: its ServiceAccount, its environment and its StatefulSet.

The environment is rendered with the executor's own variable names (every one is checked to
be in :data:`~agentsafe.executor.config.CONFIG_KEYS`) and then parsed by the executor's
:func:`~agentsafe.executor.config.load_config`, so a rendered environment is exactly one the
executor accepts (``AGENTSAFE_ENV=production``, every secret as ``<NAME>_FILE``); a refusal is a
``RenderError`` with reason ``ConfigInvalid`` naming the variable.

Files inside the pod:

- ``/etc/agentsafe/config`` (projected, read-only, 0444): the policy ConfigMap (policy,
  principals, JWKS, the halt key when halted) and the CA bundles named by ``configMapKeyRef``.
- ``/var/run/agentsafe/secrets`` (projected, read-only, 0440, group = ``fsGroup``): the
  listener's certificate and key, the grant signing key, the downstream credential, and with
  ``spec.store`` the shared store's URL (``store-url``, ``EXECUTOR_STORE_URL_FILE``); this is
  ``EXECUTOR_SECRETS_DIR``.

With ``spec.store`` each pod is its own replica (``EXECUTOR_REPLICA_ID`` = the pod name, from the
downward API), and two or more replicas (:data:`~.common.SPREAD_MIN_REPLICAS`) spread over
nodes and zones (``topologySpreadConstraints``; ``network.py`` adds their PodDisruptionBudget).
``spec.pod`` of the AgentPolicy passes nodeSelector, tolerations, affinity, priorityClassName,
imagePullSecrets and the container's resources through to the pod template, and its
topologySpreadConstraints replace the default spread (a constraint without a labelSelector counts
this AgentPolicy's executor pods).

Workers: ``EXECUTOR_WORKERS`` is rendered when the count (:attr:`~.common.RenderInput.workers`:
``spec.workers``, else the operator's ``--executor-workers``) is not the executor's own default
(:data:`~agentsafe.executor.config.WORKERS_DEFAULT`), so a policy that asks for nothing keeps the
environment (and the pod template) it had. Without ``spec.pod.resources`` the default requests
and limits are :data:`~..models.RESOURCES_PER_WORKER` times the workers; with it,
:func:`worker_warnings` says what the workers would lack (a CPU limit below one core each, a
memory limit below :data:`~..models.WORKER_MEMORY` each), for the admission review, the
``Reconciled`` message and a Warning Event. Quantities are parsed here (:func:`quantity`): the
model's pattern already bounds their form to a number and one suffix, and no library the
operator depends on parses them (``kubernetes_asyncio`` has no quantity parser; the synchronous
``kubernetes`` client's would be a second Kubernetes client for ten lines).

- ``/var/lib/agentsafe`` (a PersistentVolumeClaim per replica, or emptyDir when the journal is
  ephemeral): ``journal/`` and ``state/`` (the use store).
- ``/tmp``: a small in-memory emptyDir; the root filesystem is read-only.

Callers: ``render/children.py``, the tests.
Also imported by ``admission.py``, ``handlers.py``, ``reconcile.py``, ``__init__.py``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Final

from agentsafe.executor import telemetry
from agentsafe.executor.canonical import canonical_json
from agentsafe.executor.config import (
    CONFIG_KEYS,
    WORKERS_DEFAULT,
    CredentialKind,
    ExecutorConfig,
    load_config,
)
from agentsafe.executor.errors import ConfigError

from ..models import (
    RESOURCE_QUANTITY_PATTERN,
    RESOURCES_PER_WORKER,
    WORKER_MEMORY,
    AgentPolicySpec,
    ConditionReason,
)
from ..settings import OperatorSettings
from .common import (
    SPREAD_MIN_REPLICAS,
    RenderError,
    RenderInput,
    child_meta,
    names,
    policy_labels,
    selector_labels,
    worker_count,
)
from .config import AUTHORITY_KEY_KEY, HALT_KEY, JWKS_KEY, POLICY_KEY, PRINCIPALS_KEY
from .network import downstream_networks

__all__ = [
    "CONFIG_DIR",
    "DATA_DIR",
    "SECRETS_DIR",
    "WORKERS_WARNING",
    "config_digest",
    "quantity",
    "render_environment",
    "render_service_account",
    "render_statefulset",
    "worker_warnings",
]

CONFIG_DIR: Final = "/etc/agentsafe/config"
SECRETS_DIR: Final = "/var/run/agentsafe/secrets"
DATA_DIR: Final = "/var/lib/agentsafe"
SECRET_MODE: Final = 0o440
CONFIG_MODE: Final = 0o444

_TLS_CERT = "tls.crt"
_TLS_KEY = "tls.key"
_AUTHORITY_KEY = "authority-signing-key.pem"
_STORE_URL = "store-url"
_DOWNSTREAM_CA = "downstream-ca.pem"
_CLIENT_CA = "client-ca.pem"
# The file the downstream credential is mounted as, and the variable naming it, per kind.
_CREDENTIAL_FILES: Final = {
    CredentialKind.STATIC_HEADER: ("downstream-credential", "DOWNSTREAM_CREDENTIAL_FILE"),
    CredentialKind.PRIVATE_KEY_JWT: ("downstream-private-key.pem", "DOWNSTREAM_PRIVATE_KEY_FILE"),
    CredentialKind.SIGNED_REQUEST: ("downstream-signing-key", "DOWNSTREAM_SIGNING_KEY_FILE"),
}


def render_service_account(inp: RenderInput) -> dict[str, Any]:
    """The executor's identity; it never needs the API, so no token is mounted."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": child_meta(inp.policy, names(inp.policy).service_account),
        "automountServiceAccountToken": False,
    }


def _optional(env: dict[str, str], key: str, value: object) -> None:
    if value is None:
        return
    env[key] = str(value)


def render_environment(inp: RenderInput) -> dict[str, str]:
    """The executor's environment, checked by the executor's own configuration loader."""
    spec = inp.spec
    down = spec.downstream
    cred = down.credential
    env: dict[str, str] = {
        "AGENTSAFE_ENV": "production",
        "EXECUTOR_MODE": spec.mode.value,
        "EXECUTOR_POLICY_FILE": f"{CONFIG_DIR}/{POLICY_KEY}",
        "EXECUTOR_STATE_DIR": f"{DATA_DIR}/state",
        "EXECUTOR_BIND_ADDRESS": "0.0.0.0",  # noqa: S104 - a pod's own network namespace
        "PORT": str(inp.settings.port),
        "EXECUTOR_INTENT_TTL_SECONDS": str(spec.intent_ttl_seconds),
        "EXECUTOR_AUTHORITY_SIGNING_KEY_FILE": f"{SECRETS_DIR}/{_AUTHORITY_KEY}",
        "EXECUTOR_PRINCIPALS_FILE": f"{CONFIG_DIR}/{PRINCIPALS_KEY}",
        "EXECUTOR_JWT_AUDIENCE": inp.audience,
        "EXECUTOR_JWKS_FILE": f"{CONFIG_DIR}/{JWKS_KEY}",
        "EXECUTOR_ESCALATION": spec.escalation.value,
        "EXECUTOR_SECRETS_DIR": SECRETS_DIR,
        "EXECUTOR_TLS_CERT_FILE": f"{SECRETS_DIR}/{_TLS_CERT}",
        "EXECUTOR_TLS_KEY_FILE": f"{SECRETS_DIR}/{_TLS_KEY}",
        "EXECUTOR_TLS_MIN_VERSION": spec.tls.min_version.value,
        "EXECUTOR_JOURNAL_DIR": f"{DATA_DIR}/journal",
        # Evidence bundles (POST /v1/control/evidence-export) on the same writable data volume
        # as the journal they are cut from; the executor creates the directory on first export.
        "EXECUTOR_EVIDENCE_DIR": f"{DATA_DIR}/evidence",
        "EXECUTOR_HALT_FILE": f"{CONFIG_DIR}/{HALT_KEY}",
        "DOWNSTREAM_URL": down.url,
        "DOWNSTREAM_SYSTEM": down.system,
        "DOWNSTREAM_OPERATION": down.operation,
        "DOWNSTREAM_TIMEOUT_MS": str(down.timeout_ms),
        "DOWNSTREAM_CREDENTIAL_KIND": cred.kind.value,
    }
    # The networks the NetworkPolicy lets the executor reach are the deliberate private
    # destinations its egress guard may connect to (it refuses private-use blocks otherwise).
    v4, v6 = downstream_networks(inp)
    env["EXECUTOR_EGRESS_ALLOW_CIDRS"] = ",".join(str(n) for n in [*v4, *v6])
    if spec.approval_origin is not None:
        env["EXECUTOR_APPROVAL_ORIGIN"] = spec.approval_origin
    if spec.tls.client_ca is not None:
        env["EXECUTOR_TLS_CLIENT_CA_FILE"] = f"{CONFIG_DIR}/{_CLIENT_CA}"
    if "@" in inp.image:
        env["EXECUTOR_IMAGE_DIGEST"] = inp.image
    ceilings = spec.host_ceilings
    if ceilings is not None:
        if ceilings.single:
            env["EXECUTOR_HARD_LIMIT_SINGLE_MINOR"] = ",".join(
                f"{currency}:{amount}" for currency, amount in sorted(ceilings.single.items())
            )
        _optional(env, "EXECUTOR_HARD_LIMIT_WINDOW_SECONDS", ceilings.window_seconds)
        _optional(env, "EXECUTOR_HARD_LIMIT_WINDOW_COUNT", ceilings.window_count)
        _optional(env, "EXECUTOR_HARD_LIMIT_WINDOW_SUM_MINOR", ceilings.window_sum_minor)
    _optional(env, "DOWNSTREAM_LOOKUP_URL", down.lookup_url)
    _optional(env, "DOWNSTREAM_LOOKUP_BY_REFERENCE_URL", down.lookup_by_reference_url)
    if down.ca is not None:
        env["DOWNSTREAM_CA_FILE"] = f"{CONFIG_DIR}/{_DOWNSTREAM_CA}"
    if down.spki_pins:
        env["DOWNSTREAM_SPKI_PINS"] = ",".join(down.spki_pins)
    filename, variable = _CREDENTIAL_FILES[cred.kind]
    env[variable] = f"{SECRETS_DIR}/{filename}"
    if spec.store is not None:
        env["EXECUTOR_STORE_URL_FILE"] = f"{SECRETS_DIR}/{_STORE_URL}"
    if inp.workers != WORKERS_DEFAULT:
        env["EXECUTOR_WORKERS"] = str(inp.workers)
    if cred.kind is CredentialKind.STATIC_HEADER:
        _optional(env, "DOWNSTREAM_CREDENTIAL_HEADER", cred.header)
    elif cred.kind is CredentialKind.PRIVATE_KEY_JWT:
        _optional(env, "DOWNSTREAM_TOKEN_URL", cred.token_url)
        _optional(env, "DOWNSTREAM_CLIENT_ID", cred.client_id)
        _optional(env, "DOWNSTREAM_PRIVATE_KEY_ID", cred.key_id)
        if cred.private_key_algorithm is not None:
            env["DOWNSTREAM_PRIVATE_KEY_ALGORITHM"] = cred.private_key_algorithm.value
        _optional(env, "DOWNSTREAM_TOKEN_AUDIENCE", cred.token_audience)
        _optional(env, "DOWNSTREAM_TOKEN_SCOPE", cred.token_scope)
    else:
        _optional(env, "DOWNSTREAM_SIGNING_KEY_ID", cred.key_id)
        if cred.signing_algorithm is not None:
            env["DOWNSTREAM_SIGNING_ALGORITHM"] = cred.signing_algorithm.value
    unknown = sorted(set(env) - set(CONFIG_KEYS))
    if unknown:  # a programming error: the executor would refuse to start
        raise AssertionError(f"rendered variables the executor does not know: {unknown}")
    env.update(tracing_environment(inp.settings))
    check_environment(env)
    return env


def tracing_environment(settings: OperatorSettings) -> dict[str, str]:
    """The operator's ``OTEL_*`` settings for the executor pods (docs/tracing.md)."""
    return {k: v for k, v in settings.executor_tracing.items() if k in telemetry.RENDERED_VARIABLES}


def check_environment(env: dict[str, str]) -> ExecutorConfig:
    """Parse a rendered environment exactly as the executor will; ``ConfigInvalid`` if not."""
    try:
        telemetry.settings_from(env)
        return load_config(env)
    except ConfigError as exc:
        raise RenderError(ConditionReason.CONFIG_INVALID, str(exc)) from None


def config_digest(inp: RenderInput, configmap: dict[str, Any]) -> str:
    """What rolls the pods: the policy and principals (not the JWKS, which the executor
    re-reads, nor the halt key, which it watches)."""
    data = configmap["data"]
    material = {"policy": data[POLICY_KEY], "principals": data[PRINCIPALS_KEY]}
    return hashlib.sha256(canonical_json(material)).hexdigest()


def _secret_sources(inp: RenderInput) -> list[dict[str, Any]]:
    spec = inp.spec
    cred = spec.downstream.credential
    filename, _ = _CREDENTIAL_FILES[cred.kind]
    sources = [
        {
            "secret": {
                "name": spec.tls.secret_name,
                "items": [
                    {"key": "tls.crt", "path": _TLS_CERT},
                    {"key": "tls.key", "path": _TLS_KEY},
                ],
            }
        },
        {
            "secret": {
                "name": names(inp.policy).authority_key,
                "items": [{"key": AUTHORITY_KEY_KEY, "path": _AUTHORITY_KEY}],
            }
        },
        {
            "secret": {
                "name": cred.secret_key_ref.name,
                "items": [{"key": cred.secret_key_ref.key, "path": filename}],
            }
        },
    ]
    if spec.store is not None:
        ref = spec.store.secret_key_ref
        sources.append(
            {"secret": {"name": ref.name, "items": [{"key": ref.key, "path": _STORE_URL}]}}
        )
    return sources


def _config_sources(inp: RenderInput) -> list[dict[str, Any]]:
    sources: list[dict[str, Any]] = [{"configMap": {"name": names(inp.policy).config}}]
    if inp.spec.downstream.ca is not None:
        ref = inp.spec.downstream.ca
        sources.append(
            {"configMap": {"name": ref.name, "items": [{"key": ref.key, "path": _DOWNSTREAM_CA}]}}
        )
    if inp.spec.tls.client_ca is not None:
        ref = inp.spec.tls.client_ca
        sources.append(
            {"configMap": {"name": ref.name, "items": [{"key": ref.key, "path": _CLIENT_CA}]}}
        )
    return sources


_QUANTITY: Final = re.compile(RESOURCE_QUANTITY_PATTERN)
_SUFFIXES: Final[Mapping[str, Decimal]] = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    **{suffix: Decimal(1000) ** (i + 1) for i, suffix in enumerate("kMGTPE")},
    **{f"{suffix}i": Decimal(1024) ** (i + 1) for i, suffix in enumerate("KMGTPE")},
}

WORKERS_WARNING: Final = "WorkersOverResources"
"""The reason of the Warning Event that carries a :func:`worker_warnings` message."""


_EXPONENT_LIMIT: Final = 64
"""Exponents beyond this are clamped (``1e999`` is read as ``1e64``): Kubernetes saturates a
quantity at 2^63-1 anyway, and a comparison with a worker count needs no more."""


def quantity(value: int | str) -> Decimal:
    """A Kubernetes resource quantity (``500m``, ``2``, ``1.5Gi``, ``.5``, ``1e9``, ``100u``, or
    an integer) as a number (cores, bytes); ``ValueError`` for what the model's pattern refuses."""
    if isinstance(value, int) and not isinstance(value, bool):
        return Decimal(value)
    match = _QUANTITY.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError("not a resource quantity")
    number, suffix = Decimal(match.group(1)), match.group(2) or ""
    if len(suffix) > 1 and suffix[0] in "eE" and suffix != "Ei":  # a decimal exponent
        exponent = max(-_EXPONENT_LIMIT, min(_EXPONENT_LIMIT, int(suffix[1:])))
        return number.scaleb(exponent)
    return number * _SUFFIXES[suffix]


def _times(value: int | str, factor: int) -> str:
    """A quantity multiplied by a whole number, in its own suffix (``128Mi`` x 4 = ``512Mi``,
    ``1e3`` x 2 = ``2e3``)."""
    if isinstance(value, int):
        return str(value * factor)
    match = _QUANTITY.fullmatch(value)
    if match is None:
        raise ValueError("not a resource quantity")
    return f"{Decimal(match.group(1)) * factor:f}{match.group(2) or ''}"


def worker_warnings(spec: AgentPolicySpec, settings: OperatorSettings) -> list[str]:
    """What more than one worker would lack under an explicit ``spec.pod.resources``: a CPU
    limit below one core per worker (they are throttled), a memory limit below
    :data:`~..models.WORKER_MEMORY` per worker (they are OOM-killed). Empty with one worker or
    with the default resources (which are per worker). For people: each message names the
    workers' source and what to change."""
    workers = worker_count(spec, settings)
    resources = spec.pod.resources
    if workers <= 1 or resources is None:
        return []
    source = "spec.workers" if spec.workers is not None else "the operator's --executor-workers"
    out: list[str] = []
    cpu = resources.limits.get("cpu")
    if cpu is not None and quantity(cpu) < workers:
        out.append(
            f"{workers} workers ({source}) share a CPU limit of {cpu}: each worker is a process "
            "that uses up to one core, so under load they are throttled; set "
            f"spec.pod.resources.limits.cpu to at least {workers} or lower the workers"
        )
    memory = resources.limits.get("memory")
    if memory is not None and quantity(memory) < workers * quantity(WORKER_MEMORY):
        out.append(
            f"{workers} workers ({source}) share a memory limit of {memory}: each worker is a "
            f"process that holds about {WORKER_MEMORY}, so the pod may be OOM-killed; set "
            f"spec.pod.resources.limits.memory to at least {_times(WORKER_MEMORY, workers)} or "
            "lower the workers"
        )
    return out


def _resources(inp: RenderInput) -> dict[str, Any]:
    """spec.pod.resources when given (as written), else the defaults per worker times the
    workers."""
    resources = inp.spec.pod.resources
    if resources is None:
        return {
            key: {name: _times(value, inp.workers) for name, value in values.items()}
            for key, values in RESOURCES_PER_WORKER.items()
        }
    out: dict[str, Any] = {}
    if resources.requests:
        out["requests"] = dict(resources.requests)
    if resources.limits:
        out["limits"] = dict(resources.limits)
    return out


def render_statefulset(inp: RenderInput, *, digest: str) -> dict[str, Any]:
    """The executor pods: restricted Pod Security, one journal volume per replica."""
    n = names(inp.policy)
    env = render_environment(inp)
    settings = inp.settings
    probe = {"scheme": "HTTPS", "port": "https"}
    container: dict[str, Any] = {
        "name": "executor",
        "image": inp.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["agentsafe", "serve"],
        "env": [{"name": key, "value": value} for key, value in env.items()]
        + [
            {
                "name": "EXECUTOR_REPLICA_ID",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
            }
        ],
        "ports": [{"name": "https", "containerPort": settings.port, "protocol": "TCP"}],
        # Start-up (the store, the journal scan) runs before /health answers: the startup
        # probe gives it up to 5 minutes before the liveness probe's ~30 s budget applies.
        # Reconciliation itself runs after the listener opens, so /health answers through it.
        "startupProbe": {
            "httpGet": {"path": "/health", **probe},
            "periodSeconds": 5,
            "timeoutSeconds": 2,
            "failureThreshold": 60,
        },
        "livenessProbe": {
            "httpGet": {"path": "/health", **probe},
            "periodSeconds": 10,
            "timeoutSeconds": 2,
            "failureThreshold": 3,
        },
        "readinessProbe": {
            "httpGet": {"path": "/ready", **probe},
            "periodSeconds": 2,
            "timeoutSeconds": 2,
            "failureThreshold": 1,
        },
        "resources": _resources(inp),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "privileged": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "secrets", "mountPath": SECRETS_DIR, "readOnly": True},
            {"name": "data", "mountPath": DATA_DIR},
            {"name": "tmp", "mountPath": "/tmp"},  # noqa: S108 - an emptyDir of its own
        ],
    }
    volumes: list[dict[str, Any]] = [
        {
            "name": "config",
            "projected": {"defaultMode": CONFIG_MODE, "sources": _config_sources(inp)},
        },
        {
            "name": "secrets",
            "projected": {"defaultMode": SECRET_MODE, "sources": _secret_sources(inp)},
        },
        {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
    ]
    journal = inp.spec.journal
    claims: list[dict[str, Any]] = []
    if journal.ephemeral:
        volumes.append({"name": "data", "emptyDir": {"sizeLimit": "1Gi"}})
    else:
        claim_spec: dict[str, Any] = {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": journal.size}},
        }
        if journal.storage_class_name is not None:
            claim_spec["storageClassName"] = journal.storage_class_name
        claims.append(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": "data", "labels": selector_labels(inp.policy)},
                "spec": claim_spec,
            }
        )
    pod_spec: dict[str, Any] = {
        "serviceAccountName": n.service_account,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 30,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": settings.executor_uid,
            "runAsGroup": settings.executor_gid,
            "fsGroup": settings.executor_gid,
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": volumes,
    }
    pod = inp.spec.pod
    if pod.node_selector:
        pod_spec["nodeSelector"] = dict(pod.node_selector)
    if pod.tolerations:
        pod_spec["tolerations"] = [t.wire() for t in pod.tolerations]
    if pod.affinity:
        pod_spec["affinity"] = pod.affinity
    if pod.priority_class_name is not None:
        pod_spec["priorityClassName"] = pod.priority_class_name
    if pod.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [ref.wire() for ref in pod.image_pull_secrets]
    if pod.topology_spread_constraints is not None:
        if pod.topology_spread_constraints:
            pod_spec["topologySpreadConstraints"] = [
                {
                    **constraint.wire(),
                    "labelSelector": constraint.label_selector.wire()
                    if constraint.label_selector is not None
                    else {"matchLabels": selector_labels(inp.policy)},
                }
                for constraint in pod.topology_spread_constraints
            ]
    elif inp.spec.replicas >= SPREAD_MIN_REPLICAS:
        pod_spec["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": key,
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": selector_labels(inp.policy)},
            }
            for key in ("kubernetes.io/hostname", "topology.kubernetes.io/zone")
        ]
    spec: dict[str, Any] = {
        "replicas": inp.spec.replicas,
        "serviceName": n.service,
        "podManagementPolicy": "Parallel",
        "updateStrategy": {"type": "RollingUpdate"},
        "selector": {"matchLabels": selector_labels(inp.policy)},
        "template": {
            "metadata": {
                "labels": policy_labels(inp.policy),
                "annotations": {"agentsafe.io/config-digest": digest},
            },
            "spec": pod_spec,
        },
    }
    if claims:
        spec["volumeClaimTemplates"] = claims
        spec["persistentVolumeClaimRetentionPolicy"] = {
            "whenDeleted": "Retain",
            "whenScaled": "Retain",
        }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": child_meta(inp.policy, n.executor),
        "spec": spec,
    }
