"""The operator's own configuration: what an AgentPolicy does not say for itself.

:class:`OperatorSettings` is built once by ``cli.py`` from flags and ``AGENTSAFE_OPERATOR_*``
variables and handed to every render function, so rendering stays a pure function of
(AgentPolicy, selected Principals, settings, cluster JWKS).

Callers: ``cli.py``, ``runtime.py``, ``kubeapi.py`` and ``halt.py`` (the field managers),
``render/common.py``, the tests.
Also imported by ``admission.py``, ``render/config.py``, ``render/workload.py``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from agentsafe.executor.config import WORKERS_DEFAULT

__all__ = ["FIELD_MANAGER", "HALT_FIELD_MANAGER", "OperatorSettings", "parse_labels"]

_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


def parse_labels(text: str, *, what: str) -> dict[str, str]:
    """``key=value,key=value`` (a label selector's matchLabels); ``""`` is none. Raises
    ``ValueError`` naming ``what`` and the rule when an entry is not a Kubernetes label."""
    out: dict[str, str] = {}
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        key, sep, value = entry.partition("=")
        if not sep or not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value):
            raise ValueError(
                f"{what}: each entry must be key=value with a Kubernetes label key and value"
            )
        out[key] = value
    return out


FIELD_MANAGER: Final = "agentsafe-operator"
"""The one field manager every child of an AgentPolicy is applied with."""

HALT_FIELD_MANAGER: Final = "agentsafe-operator-halt"
"""Owns only the halt key of a policy's ConfigMap, so re-rendering never clears a halt."""


@dataclass(frozen=True)
class OperatorSettings:
    """Defaults and cluster facts the operator brings to every AgentPolicy."""

    executor_image: str = "ghcr.io/agentsafe/agentsafe:0.1.0"
    executor_workers: int = WORKERS_DEFAULT
    """Worker processes per executor pod for AgentPolicies whose ``spec.workers`` is unset
    (``--executor-workers``, the chart's ``executor.workers``)."""
    executor_tracing: Mapping[str, str] = field(default_factory=dict)
    """The ``OTEL_*`` variables rendered into every executor pod (the operator's own, from the
    chart's ``tracing`` values; ``telemetry.RENDERED_VARIABLES``). Empty: tracing off."""
    issuer: str = "https://kubernetes.default.svc.cluster.local"
    """The cluster's service-account token issuer (``iss`` of projected tokens)."""
    operator_namespace: str = "agentsafe-system"
    operator_pod_labels: Mapping[str, str] = field(
        default_factory=lambda: {"app.kubernetes.io/name": "agentsafe-operator"}
    )
    executor_uid: int = 65532
    executor_gid: int = 65532
    port: int = 8443
    dns_namespace: str = "kube-system"
    dns_pod_labels: Mapping[str, str] = field(default_factory=lambda: {"k8s-app": "kube-dns"})
    operator_principal_id: str = "agentsafe-operator"
    metrics_principal_id: str = "agentsafe-metrics"
    metrics_token_secret: str = "agentsafe-metrics-token"
    """The Secret in the operator's namespace (key ``token``) whose SHA-256 every executor
    admits as the metrics principal (OPERATOR, scope ``metrics`` only: a scraper's identity,
    never the operator's). The operator creates it once when absent and never updates it; the
    chart's ServiceMonitor presents it. Empty: no metrics principal is rendered."""
    scraper_namespace_labels: Mapping[str, str] = field(default_factory=dict)
    """Labels of the namespace the scraper (Prometheus) runs in: the executor NetworkPolicy
    admits its pods to the listener port. Empty: no scraper is admitted."""
    scraper_pod_labels: Mapping[str, str] = field(default_factory=dict)
    """Labels of the scraper's pods in that namespace. Empty: every pod there."""
    reconcile_interval_seconds: float = 60.0
    jwks_refresh_seconds: float = 300.0
    halt_retry_seconds: float = 5.0
    control_timeout_seconds: float = 2.0
