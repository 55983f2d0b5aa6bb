"""The executor's Service, PodDisruptionBudget and NetworkPolicies.

- Service: headless (the StatefulSet's governing Service; agents resolve it to ready pods).
- PodDisruptionBudget (only with ``replicas`` of 2 or more): at most one executor pod voluntarily
  down at a time. With one replica a budget of ``maxUnavailable: 1`` would protect nothing and
  one of 0 would block every node drain, so none is rendered (``reconcile.py`` deletes one left
  from an earlier, larger ``replicas``).
- NetworkPolicy ``<policy>-executor``: ingress only from the ``agentNamespaces``, the
  operator's pods and, when the operator is told where it runs, the metrics scraper
  (``--scraper-namespace-selector``, ``--scraper-pod-selector``), on the listener port; egress
  only to cluster DNS, to ``downstream.cidrs`` on the ports the downstream URLs name, and with
  ``spec.store`` to the database (its pods or its ``cidrs``) on the store's port, and, when the
  operator's tracing settings turn tracing on (the chart's ``tracing.endpoint``), to the OTLP
  collector on its port (:func:`collector_egress`).
- In each agent namespace, NetworkPolicy ``agentsafe-<ns>-<policy>-no-downstream``: every pod
  may send anywhere except ``downstream.cidrs``, so agents cannot go around the executor.
  These live in other namespaces, so they carry the ``agentsafe.io/owner`` label instead of an
  owner reference, and the operator's finalizer deletes them.

Callers: ``render/children.py``, the tests.
Also imported by ``__init__.py``, ``workload.py``.
"""

from __future__ import annotations

import ipaddress
from typing import Any
from urllib.parse import urlsplit

from agentsafe.executor import telemetry
from agentsafe.executor.errors import ConfigError

from ..models import ConditionReason
from .common import (
    SPREAD_MIN_REPLICAS,
    RenderError,
    RenderInput,
    child_meta,
    names,
    selector_labels,
)

__all__ = [
    "downstream_networks",
    "render_agent_network_policies",
    "render_executor_network_policy",
    "render_pdb",
    "render_service",
]

_NAMESPACE_LABEL = "kubernetes.io/metadata.name"


def render_service(inp: RenderInput) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_meta(inp.policy, names(inp.policy).service),
        "spec": {
            "clusterIP": "None",
            "selector": selector_labels(inp.policy),
            "ports": [
                {
                    "name": "https",
                    "port": inp.settings.port,
                    "targetPort": "https",
                    "protocol": "TCP",
                }
            ],
        },
    }


def render_pdb(inp: RenderInput) -> dict[str, Any] | None:
    """The executor's budget with two or more replicas; ``None`` with one."""
    if inp.spec.replicas < SPREAD_MIN_REPLICAS:
        return None
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": child_meta(inp.policy, names(inp.policy).executor),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector_labels(inp.policy)},
        },
    }


def downstream_networks(
    inp: RenderInput,
) -> tuple[list[ipaddress.IPv4Network], list[ipaddress.IPv6Network]]:
    """``downstream.cidrs`` parsed strictly (host bits clear, no /0); ``SpecInvalid`` if not."""
    v4: list[ipaddress.IPv4Network] = []
    v6: list[ipaddress.IPv6Network] = []
    for text in inp.spec.downstream.cidrs:
        try:
            network = ipaddress.ip_network(text, strict=True)
        except ValueError:
            raise RenderError(
                ConditionReason.SPEC_INVALID,
                "spec.downstream.cidrs: each entry must be a CIDR with host bits clear",
            ) from None
        if network.prefixlen == 0:
            raise RenderError(
                ConditionReason.SPEC_INVALID,
                "spec.downstream.cidrs: a /0 would put the whole internet off limits",
            )
        (v4 if isinstance(network, ipaddress.IPv4Network) else v6).append(network)  # type: ignore[arg-type]
    return v4, v6


def _downstream_ports(inp: RenderInput) -> list[int]:
    down = inp.spec.downstream
    urls = [down.url, down.lookup_url, down.lookup_by_reference_url, down.credential.token_url]
    ports: set[int] = set()
    for url in urls:
        if url is None:
            continue
        try:
            parts = urlsplit(url.replace("{", "").replace("}", ""))
            port = parts.port
        except ValueError:
            raise RenderError(
                ConditionReason.SPEC_INVALID, "spec.downstream: a URL has an invalid port"
            ) from None
        ports.add(port or (443 if parts.scheme == "https" else 80))
    return sorted(ports)


def render_executor_network_policy(inp: RenderInput) -> dict[str, Any]:
    settings = inp.settings
    v4, v6 = downstream_networks(inp)
    sources: list[dict[str, Any]] = [
        {
            "namespaceSelector": {"matchLabels": {_NAMESPACE_LABEL: settings.operator_namespace}},
            "podSelector": {"matchLabels": dict(settings.operator_pod_labels)},
        }
    ]
    if settings.scraper_namespace_labels:
        scraper: dict[str, Any] = {
            "namespaceSelector": {"matchLabels": dict(settings.scraper_namespace_labels)}
        }
        if settings.scraper_pod_labels:
            scraper["podSelector"] = {"matchLabels": dict(settings.scraper_pod_labels)}
        sources.append(scraper)
    if inp.spec.agent_namespaces:
        sources.insert(
            0,
            {
                "namespaceSelector": {
                    "matchExpressions": [
                        {
                            "key": _NAMESPACE_LABEL,
                            "operator": "In",
                            "values": sorted(inp.spec.agent_namespaces),
                        }
                    ]
                }
            },
        )
    dns = {
        "to": [
            {
                "namespaceSelector": {"matchLabels": {_NAMESPACE_LABEL: settings.dns_namespace}},
                "podSelector": {"matchLabels": dict(settings.dns_pod_labels)},
            }
        ],
        "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
    }
    downstream = {
        "to": [{"ipBlock": {"cidr": str(network)}} for network in [*v4, *v6]],
        "ports": [{"protocol": "TCP", "port": port} for port in _downstream_ports(inp)],
    }
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": child_meta(inp.policy, names(inp.policy).network_policy),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(inp.policy)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {
                    "from": sources,
                    "ports": [{"protocol": "TCP", "port": settings.port}],
                }
            ],
            "egress": [dns, downstream, *_store_egress(inp), *collector_egress(inp)],
        },
    }


def collector_egress(inp: RenderInput) -> list[dict[str, Any]]:
    """The rule that admits the OTLP collector the executor pods export to, when tracing is on.

    The collector's host decides the peer: an IP address is that address (``/32`` or
    ``/128``); a cluster Service name (``collector``, ``collector.<ns>``,
    ``collector.<ns>.svc[.<cluster domain>]``) is every pod of its namespace (the policy's own
    for a bare name), since a Service's pods have no selector the operator knows; the port is
    the endpoint's. ``localhost`` (a sidecar) needs no rule, and any other name (outside the
    cluster) gets none: give the collector an IP address or a Service name (docs/tracing.md)."""
    try:
        tracing = telemetry.settings_from(dict(inp.settings.executor_tracing))
    except ConfigError as exc:
        raise RenderError(ConditionReason.CONFIG_INVALID, str(exc)) from None
    if tracing is None:
        return []
    parts = urlsplit(tracing.endpoint)
    host = (parts.hostname or "").lower().rstrip(".")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    peer: dict[str, Any]
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        labels = host.split(".")
        if host == "localhost":
            return []
        if len(labels) == 1:
            namespace = inp.policy.namespace
        elif len(labels) == 2 or labels[2] == "svc":
            namespace = labels[1]
        else:
            return []
        peer = {"namespaceSelector": {"matchLabels": {_NAMESPACE_LABEL: namespace}}}
    else:
        if address.is_loopback:
            return []
        peer = {"ipBlock": {"cidr": f"{address}/{address.max_prefixlen}"}}
    return [{"to": [peer], "ports": [{"protocol": "TCP", "port": port}]}]


def _store_egress(inp: RenderInput) -> list[dict[str, Any]]:
    store = inp.spec.store
    if store is None:
        return []
    peers: list[dict[str, Any]] = []
    if store.pod_selector is not None:
        namespace = store.namespace or inp.policy.namespace
        peers.append(
            {
                "namespaceSelector": {"matchLabels": {_NAMESPACE_LABEL: namespace}},
                "podSelector": {k: v for k, v in store.pod_selector.wire().items() if v},
            }
        )
    for cidr in store.cidrs or []:
        try:
            network = ipaddress.ip_network(cidr, strict=True)
        except ValueError:
            raise RenderError(
                ConditionReason.SPEC_INVALID,
                "spec.store.cidrs: each entry must be a CIDR with host bits clear",
            ) from None
        peers.append({"ipBlock": {"cidr": str(network)}})
    return [{"to": peers, "ports": [{"protocol": "TCP", "port": store.port}]}]


def render_agent_network_policies(inp: RenderInput) -> list[dict[str, Any]]:
    """One egress policy per agent namespace: anything but the downstream."""
    v4, v6 = downstream_networks(inp)
    peers = [
        {"ipBlock": {"cidr": "0.0.0.0/0", "except": [str(n) for n in v4]}}
        if v4
        else {"ipBlock": {"cidr": "0.0.0.0/0"}},
        {"ipBlock": {"cidr": "::/0", "except": [str(n) for n in v6]}}
        if v6
        else {"ipBlock": {"cidr": "::/0"}},
    ]
    out: list[dict[str, Any]] = []
    for namespace in sorted(set(inp.spec.agent_namespaces)):
        owned = namespace == inp.policy.namespace
        out.append(
            {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": child_meta(
                    inp.policy,
                    names(inp.policy).agent_network_policy,
                    namespace=namespace,
                    owned=owned,
                ),
                "spec": {
                    "podSelector": {},
                    "policyTypes": ["Egress"],
                    "egress": [{"to": peers}],
                },
            }
        )
    return out
