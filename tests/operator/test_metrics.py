"""Monitoring from the operator's side: the metrics principal it renders into every executor,
the scraper the executor NetworkPolicy admits, and the operator's own ``/metrics``.

The handlers run against the in-memory API stand-in (``FakeKube``); the operator's exposition is
served by :meth:`OperatorMetrics.serve` on a loopback port and read over a real socket.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import urllib.request
from typing import Any

import kopf
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from agentsafe.executor import __version__
from agentsafe.executor.door.principals_file import parse_principals
from agentsafe.operator.handlers import policy_delete_handler, policy_handler
from agentsafe.operator.metrics import HANDLERS, RESULTS, OperatorMetrics
from agentsafe.operator.render import RenderInput, render_executor_network_policy
from agentsafe.operator.runtime import Runtime
from agentsafe.operator.settings import parse_labels

from .conftest import NS, memo_for
from .fakekube import FakeKube

METRICS_SECRET = ("Secret", "agentsafe-system", "agentsafe-metrics-token")
CONFIG = ("ConfigMap", NS, "payouts-executor-config")


async def _reconcile(rt: Runtime, body: dict[str, Any]) -> None:
    await policy_handler(body=kopf.Body(body), patch=kopf.Patch(), memo=memo_for(rt))


async def test_every_executor_admits_the_metrics_principal_for_metrics_only(
    runtime: Runtime, kube: FakeKube, policy_body: dict[str, Any]
) -> None:
    await _reconcile(runtime, policy_body)
    created = kube.objects[METRICS_SECRET]
    assert created["metadata"]["namespace"] == "agentsafe-system"
    token = base64.b64decode(created["data"]["token"]).decode()
    assert len(token) >= 32
    text = kube.objects[CONFIG]["data"]["principals.json"]
    assert token not in text
    principals = parse_principals(
        text, registered_actions={"create_payout"}, jwt_configured=True, client_ca_configured=False
    )
    record = principals.match_bearer(token)
    assert record is not None
    assert record.id == "agentsafe-metrics"
    assert record.principal.role.value == "OPERATOR"
    assert record.principal.scopes == frozenset({"metrics"})  # no status, halt or evidence
    # Created once: a second reconcile reuses it; a token someone rotated in the Secret is what
    # the next render admits.
    await _reconcile(runtime, policy_body)
    assert kube.objects[METRICS_SECRET] == created
    rotated = json.loads(json.dumps(created))
    rotated["data"]["token"] = base64.b64encode(b"rotated-metrics-token-0123456789").decode()
    kube.put(rotated)
    await _reconcile(runtime, policy_body)
    again = parse_principals(
        kube.objects[CONFIG]["data"]["principals.json"],
        registered_actions={"create_payout"},
        jwt_configured=True,
        client_ca_configured=False,
    )
    assert again.match_bearer("rotated-metrics-token-0123456789") is not None
    assert again.match_bearer(token) is None


async def test_no_metrics_principal_when_none_is_configured(
    runtime: Runtime, kube: FakeKube, policy_body: dict[str, Any]
) -> None:
    rt = dataclasses.replace(
        runtime, settings=dataclasses.replace(runtime.settings, metrics_token_secret="")
    )
    await _reconcile(rt, policy_body)
    assert METRICS_SECRET not in kube.objects
    ids = [
        p["id"] for p in json.loads(kube.objects[CONFIG]["data"]["principals.json"])["principals"]
    ]
    assert "agentsafe-metrics" not in ids


def test_the_scraper_is_admitted_only_when_configured(render_input: RenderInput) -> None:
    (ingress,) = render_executor_network_policy(render_input)["spec"]["ingress"]
    assert len(ingress["from"]) == 2  # the agents and the operator: no scraper by default
    settings = dataclasses.replace(
        render_input.settings,
        scraper_namespace_labels={"kubernetes.io/metadata.name": "monitoring"},
        scraper_pod_labels={"app.kubernetes.io/name": "prometheus"},
    )
    policy = render_executor_network_policy(dataclasses.replace(render_input, settings=settings))
    (ingress,) = policy["spec"]["ingress"]
    assert ingress["ports"] == [{"protocol": "TCP", "port": 8443}]
    assert ingress["from"][-1] == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
    }


def test_scraper_selectors_are_kubernetes_labels() -> None:
    assert parse_labels("", what="x") == {}
    assert parse_labels("a=b, example.com/team=ops,empty=", what="x") == {
        "a": "b",
        "example.com/team": "ops",
        "empty": "",
    }
    for bad in ("novalue", "a=b c", "-a=b", "a=" + "x" * 64, "UPPER.example/a=b"):
        with pytest.raises(ValueError, match="--scraper"):
            parse_labels(bad, what="--scraper-namespace-selector")


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/metrics",
        headers={"Accept": "application/openmetrics-text; version=1.0.0"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.headers["Content-Type"].startswith("application/openmetrics-text")
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_the_operator_serves_its_reconciles_on_its_own_metrics_port(
    runtime: Runtime, kube: FakeKube, policy_body: dict[str, Any]
) -> None:
    metrics = OperatorMetrics()
    rt = dataclasses.replace(runtime, metrics=metrics)
    server = metrics.serve("127.0.0.1", 0)
    try:
        await _served(rt, policy_body, server.server_port)
    finally:
        server.shutdown()
        server.server_close()


async def _served(rt: Runtime, policy_body: dict[str, Any], port: int) -> None:
    await _reconcile(rt, policy_body)  # applied; Ready is False (no kubelet: no ready pods)
    broken = json.loads(json.dumps(policy_body))
    broken["metadata"]["generation"] = 2
    broken["spec"]["tls"]["secretName"] = "no-such-secret"
    await _reconcile(rt, broken)  # a render refusal: SecretMissing
    samples = _scrape(port)

    runs = "agentsafe_operator_reconciles_total"
    assert samples[(runs, (("handler", "agentpolicy"), ("result", "applied")))] == 1
    assert samples[(runs, (("handler", "agentpolicy"), ("result", "not_ready")))] == 1
    # Every handler and result is a series from the start (a rate over zero is zero, not absent).
    for handler in HANDLERS:
        for result in RESULTS:
            assert (runs, (("handler", handler), ("result", result))) in samples
    count = "agentsafe_operator_reconcile_duration_seconds_count"
    assert samples[(count, (("handler", "agentpolicy"),))] == 2
    policies = "agentsafe_operator_policies"
    assert samples[(policies, (("ready", "false"),))] == 1
    assert samples[(policies, (("ready", "true"),))] == 0
    info = [k for k in samples if k[0] == "agentsafe_operator_build_info"]
    assert dict(info[0][1])["version"] == __version__

    await policy_delete_handler(body=kopf.Body(policy_body), memo=memo_for(rt))
    samples = _scrape(port)
    assert samples[(policies, (("ready", "false"),))] == 0
    assert samples[(runs, (("handler", "agentpolicy.delete"), ("result", "applied")))] == 1


def test_an_unknown_handler_is_refused_and_an_escaping_error_counts_as_error() -> None:
    metrics = OperatorMetrics()
    with pytest.raises(ValueError, match="unknown handler"), metrics.timed("typo"):
        pass
    with pytest.raises(RuntimeError), metrics.timed("haltswitch"):
        raise RuntimeError("boom")
    assert metrics.runs("haltswitch", "error") == 1
