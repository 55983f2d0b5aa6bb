"""What every render function takes and shares: the input record, names, labels, owners.

Rendering is pure: :class:`RenderInput` carries everything (the AgentPolicy's identity and spec,
the selected Principals with their bearer digests already resolved, the operator's settings, the
cluster JWKS, the operator's own bearer digest and the metrics principal's) and each ``render_*``
function returns plain manifests. A problem found while rendering is a :class:`RenderError` with
the condition reason the reconcile writes (``PolicyInvalid``, ``PrincipalsInvalid``,
``ConfigInvalid``, ``SpecInvalid``) and nothing is applied.

Callers: ``render/*``, ``reconcile.py`` and ``handlers.py`` (labels), the tests.
Also imported by ``__init__.py``, ``children.py``, ``config.py``, ``halt.py``, ``network.py``,
``workload.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ..errors import OperatorError
from ..models import API_VERSION, GROUP, AgentPolicySpec, ConditionReason, PrincipalSpec
from ..settings import OperatorSettings

__all__ = [
    "EXECUTOR_COMPONENT",
    "MANAGED_BY",
    "SPREAD_MIN_REPLICAS",
    "WATCH_LABEL",
    "WATCH_VALUE",
    "PolicyRef",
    "RenderError",
    "RenderInput",
    "SelectedPrincipal",
    "child_meta",
    "names",
    "owner_reference",
    "policy_labels",
    "selector_labels",
    "worker_count",
]

EXECUTOR_COMPONENT: Final = "agentsafe-executor"
MANAGED_BY: Final = "agentsafe-operator"
"""``app.kubernetes.io/managed-by`` of every child (the StatefulSet watch filters on it)."""
POLICY_LABEL: Final = f"{GROUP}/policy"
OWNER_LABEL: Final = f"{GROUP}/owner"
WATCH_LABEL: Final = f"{GROUP}/watch"
"""``agentsafe.io/watch: "true"`` on a Secret: the operator watches it, and a change re-renders
at once every AgentPolicy that uses it (docs/operator.md, "Secret changes"). The Secrets the
operator generates carry it; a referenced Secret gets it from whoever writes it (a
cert-manager Certificate's ``secretTemplate``, ``kubectl label``)."""
WATCH_VALUE: Final = "true"
SPREAD_MIN_REPLICAS: Final = 2
"""From this many replicas on, executors get a PodDisruptionBudget and topology spread; below it
neither is rendered (a budget over one pod would protect nothing or block every drain)."""


class RenderError(OperatorError):
    """Nothing can be rendered; ``reason`` is the Ready condition's reason."""

    def __init__(self, reason: ConditionReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class PolicyRef:
    """The identity of an AgentPolicy object."""

    name: str
    namespace: str
    uid: str
    generation: int = 1

    @property
    def owner_key(self) -> str:
        """A label value naming the policy across namespaces (``<namespace>.<name>``)."""
        return f"{self.namespace}.{self.name}"


@dataclass(frozen=True)
class SelectedPrincipal:
    """A Principal the policy selects; ``token_sha256`` is resolved for bearer principals."""

    name: str
    spec: PrincipalSpec
    token_sha256: str | None = None


@dataclass(frozen=True)
class RenderInput:
    policy: PolicyRef
    spec: AgentPolicySpec
    settings: OperatorSettings
    principals: tuple[SelectedPrincipal, ...] = ()
    operator_token_sha256: str = ""
    metrics_token_sha256: str = ""
    """The metrics principal's bearer digest; empty: no metrics principal is rendered."""
    jwks: Mapping[str, Any] = field(default_factory=lambda: {"keys": []})

    @property
    def audience(self) -> str:
        return self.spec.jwt_audience or f"{GROUP}/{self.policy.namespace}/{self.policy.name}"

    @property
    def image(self) -> str:
        return self.spec.image or self.settings.executor_image

    @property
    def workers(self) -> int:
        return worker_count(self.spec, self.settings)


def worker_count(spec: AgentPolicySpec, settings: OperatorSettings) -> int:
    """Worker processes per executor pod: ``spec.workers``, else the operator's default."""
    return spec.workers if spec.workers is not None else settings.executor_workers


@dataclass(frozen=True)
class Names:
    """The names of one policy's children."""

    executor: str
    service_account: str
    config: str
    service: str
    operator_token: str
    authority_key: str
    network_policy: str
    agent_network_policy: str


def names(policy: PolicyRef) -> Names:
    base = f"{policy.name}-executor"
    return Names(
        executor=base,
        service_account=base,
        config=f"{base}-config",
        service=base,
        operator_token=f"{policy.name}-operator-token",
        authority_key=f"{policy.name}-authority-key",
        network_policy=base,
        agent_network_policy=f"agentsafe-{policy.namespace}-{policy.name}-no-downstream"[:253],
    )


def selector_labels(policy: PolicyRef) -> dict[str, str]:
    """The labels that select a policy's executor pods (stable for the StatefulSet's life)."""
    return {"app.kubernetes.io/name": EXECUTOR_COMPONENT, POLICY_LABEL: policy.name}


def policy_labels(policy: PolicyRef) -> dict[str, str]:
    return {
        **selector_labels(policy),
        "app.kubernetes.io/instance": policy.name,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        "app.kubernetes.io/part-of": "agentsafe",
        OWNER_LABEL: policy.owner_key,
    }


def owner_reference(policy: PolicyRef) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "AgentPolicy",
        "name": policy.name,
        "uid": policy.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def child_meta(
    policy: PolicyRef, name: str, *, namespace: str | None = None, owned: bool = True
) -> dict[str, Any]:
    """Metadata of a child; ``owned=False`` for objects in another namespace (no owner refs
    can cross namespaces: those are found by the ``agentsafe.io/owner`` label and deleted by
    the operator's finalizer)."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace or policy.namespace,
        "labels": policy_labels(policy),
    }
    if owned:
        meta["ownerReferences"] = [owner_reference(policy)]
    return meta
