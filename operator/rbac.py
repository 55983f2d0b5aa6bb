"""The operator's RBAC, generated from the table of resources it touches (``resources.py``).

:func:`render_rbac` returns a ClusterRole (every resource verb in :data:`~.resources.RESOURCES`,
grouped by API group and verb set, plus ``get`` on the issuer's discovery URLs) and a
ClusterRoleBinding to the operator's ServiceAccount. Cluster-scoped because AgentPolicies may
live in any watched namespace and agent-namespace NetworkPolicies land in other namespaces.
Nothing is granted that the table does not name: no ``update`` (everything is server-side
apply, i.e. ``patch``), no ``delete`` on Secrets, no Pods, no ``*``.

Callers: the tests and ``e2e/test_chart.py``, which checks that the chart's rules (generated
from the same table) equal these.
"""

from __future__ import annotations

from typing import Any

from .resources import NON_RESOURCE_URLS, RESOURCES

__all__ = ["render_rbac"]


def render_rbac(
    *,
    service_account: str = "agentsafe-operator",
    namespace: str = "agentsafe-system",
    name: str = "agentsafe-operator",
) -> list[dict[str, Any]]:
    grouped: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for resource in RESOURCES:
        verbs = tuple(sorted(set(resource.verbs)))
        grouped.setdefault((resource.group, verbs), []).append(resource.plural)
    rules: list[dict[str, Any]] = [
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
