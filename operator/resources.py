"""Every Kubernetes resource the operator touches, and what it does to each.

One table (:data:`RESOURCES`) drives both the API client's paths (``kubeapi.py``) and the
operator's RBAC (``rbac.py``): a resource the operator uses without listing it here has no path
and no permission, so the two cannot drift apart.

Callers: ``kubeapi.py``, ``rbac.py``, ``charts/generate_rbac.py``, the tests.
Also imported by ``cli.py``, ``handlers.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from .models import GROUP, VERSION

__all__ = [
    "FINALIZER",
    "LEGACY_FINALIZER",
    "NON_RESOURCE_URLS",
    "RESOURCES",
    "Resource",
    "migrated_finalizers",
    "resource_for",
]

FINALIZER: Final = "agentsafe.io/finalizer"
"""The finalizer the operator puts on AgentPolicies, Principals and HaltSwitches (kopf's
``settings.persistence.finalizer``), so that a delete waits for its clean-up handlers."""
LEGACY_FINALIZER: Final = "kopf.zalando.org/KopfFinalizerMarker"
"""kopf's default name, which operators before issue 22 put on the same objects."""


def migrated_finalizers(finalizers: Sequence[str], *, deleting: bool) -> list[str] | None:
    """The finalizer list with :data:`LEGACY_FINALIZER` renamed to :data:`FINALIZER`, or
    ``None`` when there is nothing to migrate. On an object being deleted the old name is only
    dropped: its clean-up has run under the new name or will not run under the old one, which no
    current operator removes, so keeping it would hold the object forever."""
    if LEGACY_FINALIZER not in finalizers:
        return None
    kept = [name for name in finalizers if name != LEGACY_FINALIZER]
    if not deleting and FINALIZER not in kept:
        kept.append(FINALIZER)
    return kept


@dataclass(frozen=True)
class Resource:
    """A resource type, where it lives in the API, and the verbs the operator needs on it."""

    kind: str
    group: str
    version: str
    plural: str
    verbs: tuple[str, ...]
    namespaced: bool = True
    why: str = ""
    where_watched: tuple[str, ...] = ()
    """Of ``verbs``, the ones needed only in the namespaces the operator watches (the Secret
    watch's ``list`` and ``watch``): ``charts/generate_rbac.py`` leaves them out of the rules
    for the operator's own namespace when that one is not watched (the webhook CA's Secret)."""
    only_named: str | None = None
    """Granted only on one object the chart names (RBAC ``resourceNames``): the key of that
    name (the chart's ``agentsafe.<key>Name`` template; ``rbac.render_rbac`` takes it as an
    argument)."""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace is not None:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{name}"
        return base


_WATCH = ("get", "list", "watch")
_OWN = ("get", "list", "watch", "create", "patch", "delete")  # applied children (server-side)

RESOURCES: Final[tuple[Resource, ...]] = (
    # Our own resources: watched, status and finalizers patched.
    Resource(
        "AgentPolicy",
        GROUP,
        VERSION,
        "agentpolicies",
        (*_WATCH, "patch"),
        why="reconciled; finalizer and progress annotations",
    ),
    Resource(
        "Principal",
        GROUP,
        VERSION,
        "principals",
        (*_WATCH, "patch"),
        why="rendered into principals files; finalizer",
    ),
    Resource(
        "HaltSwitch",
        GROUP,
        VERSION,
        "haltswitches",
        (*_WATCH, "patch"),
        why="halts executors; finalizer",
    ),
    # Status subresources of the same (kopf writes status through them).
    Resource("AgentPolicy/status", GROUP, VERSION, "agentpolicies/status", ("get", "patch")),
    Resource("Principal/status", GROUP, VERSION, "principals/status", ("get", "patch")),
    Resource("HaltSwitch/status", GROUP, VERSION, "haltswitches/status", ("get", "patch")),
    # Children of an AgentPolicy (server-side apply).
    Resource("ServiceAccount", "", "v1", "serviceaccounts", _OWN, why="the executor's identity"),
    Resource(
        "ConfigMap", "", "v1", "configmaps", _OWN, why="policy, principals, JWKS and the halt file"
    ),
    Resource("Service", "", "v1", "services", _OWN, why="the executor's address"),
    Resource(
        "StatefulSet",
        "apps",
        "v1",
        "statefulsets",
        _OWN,
        why="the executor pods; watched for the policy's Ready",
    ),
    Resource(
        "PodDisruptionBudget",
        "policy",
        "v1",
        "poddisruptionbudgets",
        _OWN,
        why="with replicas >= 2; deleted when scaled below",
    ),
    Resource(
        "NetworkPolicy",
        "networking.k8s.io",
        "v1",
        "networkpolicies",
        _OWN,
        why="executor ingress/egress; agents' egress in agent namespaces",
    ),
    # Secrets: referenced ones are read (existence, bearer digests, the listener's CA);
    # generated ones (the operator's bearer, the grant signing key) are created once; the
    # labelled ones (agentsafe.io/watch) are watched so that a change reconciles at once.
    # Bounded by namespace in the chart (a Role per watched namespace when
    # operator.watchNamespaces is set); never update, patch or delete.
    Resource(
        "Secret",
        "",
        "v1",
        "secrets",
        ("get", "list", "watch", "create"),
        why="read referenced Secrets; watch the labelled ones; create the generated ones",
        where_watched=("list", "watch"),
    ),
    # Where executor pods answer: the halt reaches every endpoint.
    Resource(
        "EndpointSlice",
        "discovery.k8s.io",
        "v1",
        "endpointslices",
        ("list",),
        why="executor pod addresses for halt and resume",
    ),
    Resource("Event", "", "v1", "events", ("create", "patch"), why="what the operator did"),
    Resource("Event.events.k8s.io", "events.k8s.io", "v1", "events", ("create", "patch")),
    # The admission webhook's own CA (operator TLS mode, webhook_tls.py): caBundle of the one
    # ValidatingWebhookConfiguration the chart renders, by name.
    Resource(
        "ValidatingWebhookConfiguration",
        "admissionregistration.k8s.io",
        "v1",
        "validatingwebhookconfigurations",
        ("patch",),
        namespaced=False,
        why="caBundle of the operator's own webhook (server-side apply of that field)",
        only_named="webhookConfiguration",
    ),
    # kopf itself: CRD discovery, namespaces, peering.
    Resource(
        "CustomResourceDefinition",
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        ("get", "list", "watch"),
        namespaced=False,
        why="kopf resource discovery",
    ),
    Resource(
        "Namespace",
        "",
        "v1",
        "namespaces",
        ("get", "list", "watch"),
        namespaced=False,
        why="kopf namespace discovery",
    ),
    Resource(
        "ClusterKopfPeering",
        "kopf.dev",
        "v1",
        "clusterkopfpeerings",
        ("get", "list", "watch", "patch"),
        namespaced=False,
        why="peering",
    ),
    Resource(
        "KopfPeering",
        "kopf.dev",
        "v1",
        "kopfpeerings",
        ("get", "list", "watch", "patch"),
        why="peering",
    ),
)

NON_RESOURCE_URLS: Final[tuple[str, ...]] = (
    "/openid/v1/jwks",
    "/.well-known/openid-configuration",
)
"""The service-account issuer's discovery documents (the cluster's JWKS)."""


def resource_for(kind: str) -> Resource:
    for resource in RESOURCES:
        if resource.kind == kind:
            return resource
    raise KeyError(kind)
