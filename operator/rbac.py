"""The operator's RBAC, generated from the table of resources it touches (``resources.py``).

:func:`render_rbac` returns a ClusterRole (every resource verb in :data:`~.resources.RESOURCES`,
grouped by API group and verb set, plus ``get`` on the issuer's discovery URLs) and a
ClusterRoleBinding to the operator's ServiceAccount. Cluster-scoped because AgentPolicies may
live in any watched namespace and agent-namespace NetworkPolicies land in other namespaces.
Nothing is granted that the table does not name, and what the table marks ``only_named``
(the webhook's ValidatingWebhookConfiguration) only on that object (``resourceNames``): no
``update`` (everything is server-side apply, i.e. ``patch``), no ``delete`` on Secrets, no
Pods, no ``*``.

Callers: the tests and ``e2e/test_chart.py``, which checks that the chart's rules (generated
from the same table) equal these.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .resources import NON_RESOURCE_URLS, RESOURCES

__all__ = ["render_rbac"]


def render_rbac(
    *,
    service_account: str = "agentsafe-operator",
    namespace: str = "agentsafe-system",
    name: str = "agentsafe-operator",
    named: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """``named``: the object names of the resources granted only by name
    (:attr:`~.resources.Resource.only_named`; default: ``name``)."""
    grouped: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    rules: list[dict[str, Any]] = []
    for resource in RESOURCES:
        verbs = tuple(sorted(set(resource.verbs)))
        if resource.only_named is not None:
            rules.append(
                {
                    "apiGroups": [resource.group],
                    "resources": [resource.plural],
                    "resourceNames": [(named or {}).get(resource.only_named, name)],
                    "verbs": list(verbs),
                }
            )
            continue
        grouped.setdefault((resource.group, verbs), []).append(resource.plural)
    rules[:0] = [
        {"apiGroups": [group], "resources": sorted(set(plurals)), "verbs": list(verbs)}
        for (group, verbs), plurals in sorted(grouped.items())
    ]
    rules.append({"nonResourceURLs": list(NON_RESOURCE_URLS), "verbs": ["get"]})
    labels = {
        "app.kubernetes.io/name": "agentsafe-operator",
        "app.kubernetes.io/part-of": "agentsafe",
    }
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name, "labels": labels},
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name, "labels": labels},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": name,
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": service_account, "namespace": namespace}
            ],
        },
    ]
