"""The operator's own configuration: what an AgentPolicy does not say for itself.

:class:`OperatorSettings` is built once by ``cli.py`` from flags and ``AGENTSAFE_OPERATOR_*``
variables and handed to every render function, so rendering stays a pure function of
(AgentPolicy, selected Principals, settings, cluster JWKS).

Callers: ``cli.py``, ``runtime.py``, ``kubeapi.py`` and ``halt.py`` (the field managers),
``render/common.py``, the tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

__all__ = ["FIELD_MANAGER", "HALT_FIELD_MANAGER", "OperatorSettings"]

FIELD_MANAGER: Final = "agentsafe-operator"
"""The one field manager every child of an AgentPolicy is applied with."""

HALT_FIELD_MANAGER: Final = "agentsafe-operator-halt"
"""Owns only the halt key of a policy's ConfigMap, so re-rendering never clears a halt."""


@dataclass(frozen=True)
class OperatorSettings:
    """Defaults and cluster facts the operator brings to every AgentPolicy."""

    executor_image: str = "ghcr.io/agentsafe/agentsafe:0.1.0"
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
    reconcile_interval_seconds: float = 60.0
    jwks_refresh_seconds: float = 300.0
    halt_retry_seconds: float = 5.0
    control_timeout_seconds: float = 2.0
