"""The Helm chart ``charts/agentsafe``: lint, render, validate, and install for real.

Rendered objects are validated against the Kubernetes OpenAPI schema of the release the local
control plane runs (``kubernetes-validate``), checked against Pod Security "restricted" by the
real API server's PodSecurity admission (server-side dry run in an enforcing namespace), and
installed with ``helm install`` into the local control plane. There is no kubelet here, so the
install does not ``--wait`` for the Deployment; the operator's permissions are checked with
``kubectl auth can-i`` as its ServiceAccount instead.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from cluster.build import KUBERNETES_VERSION, Tools
from cluster.control_plane import ControlPlane

from agentsafe.executor.config import WORKERS_DEFAULT, WORKERS_MAX
from agentsafe.operator.admission import ADMISSION_WEBHOOK_ID
from agentsafe.operator.cli import register
from agentsafe.operator.models import WORKER_MEMORY
from agentsafe.operator.rbac import render_rbac
from agentsafe.operator.settings import parse_labels

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "agentsafe"
SCHEMA_VERSION = KUBERNETES_VERSION.lstrip("v").rsplit(".", 1)[0] + ".0"
# Kinds with no upstream schema: kopf's peering objects (their CRDs ship in the chart).
CUSTOM_KINDS = {
    "ClusterKopfPeering",
    "KopfPeering",
    "Certificate",
    "Issuer",
    "ServiceMonitor",
    "PrometheusRule",
}
VARIANTS: dict[str, list[str]] = {
    "defaults": [],
    "namespaced": [
        "--set",
        "operator.watchNamespaces={team-a,team-b}",
        "--set",
        "operator.agentNamespaces={agents,team-a}",
        "--set",
        "operator.replicas=2",
    ],
    "minimal": ["--set", "peering.installCRDs=false", "--set", "tests.enabled=false"],
    "digest": ["--set", f"image.digest=sha256:{'a' * 64}", "--set", "executor.image=x/y:1"],
    "monitoring": [
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.prometheusRule.enabled=true",
        "--set",
        "metrics.scraper.namespaceSelector.kubernetes\\.io/metadata\\.name=monitoring",
    ],
    "certManager": ["--set", "webhook.tls.mode=certManager"],
    "noWebhook": ["--set", "webhook.enabled=false"],
    "workers": ["--set", "executor.workers=4"],
}


def _helm(tools: Tools, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(tools.helm), *args], capture_output=True, text=True, timeout=120, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)}: {result.stdout}\n{result.stderr}")
    return result


def _render(
    tools: Tools, extra: Sequence[str], *, crds: bool = False, kube_version: bool = True
) -> list[dict[str, Any]]:
    args = ["template", "agentsafe", str(CHART), "--namespace", "agentsafe-system"]
    if kube_version:
        args += ["--kube-version", KUBERNETES_VERSION]
    args += extra
    if crds:
        args.append("--include-crds")
    text = _helm(tools, *args).stdout
    return [doc for doc in yaml.safe_load_all(text) if doc]


def test_rbac_rules_are_generated_from_the_operator_table() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "charts" / "generate_rbac.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_secrets_are_granted_per_watched_namespace_only(k8s_tools: Tools) -> None:
    """With operator.watchNamespaces, the Secret watch's list/watch lands in a Role per watched
    namespace, never in a ClusterRole nor in the operator's own unwatched namespace
    (docs/operator.md, "Secret changes")."""

    def secret_verbs(obj: Mapping[str, Any]) -> set[str]:
        return {
            verb
            for rule in obj.get("rules") or []
            if "secrets" in rule.get("resources", []) and "" in rule.get("apiGroups", [])
            for verb in rule["verbs"]
        }

    objects = _render(k8s_tools, VARIANTS["namespaced"])
    roles = {
        (o["kind"], o["metadata"].get("namespace")): secret_verbs(o)
        for o in objects
        if o["kind"] in ("Role", "ClusterRole") and secret_verbs(o)
    }
    assert roles == {
        ("Role", "team-a"): {"get", "list", "watch", "create"},
        ("Role", "team-b"): {"get", "list", "watch", "create"},
        # The operator's own namespace, not watched: the webhook CA's Secret, never watched.
        ("Role", "agentsafe-system"): {"get", "create"},
    }
    cluster_wide = _render(k8s_tools, [])
    assert [
        secret_verbs(o) for o in cluster_wide if o["kind"] == "ClusterRole" and secret_verbs(o)
    ] == [{"get", "list", "watch", "create"}]


def test_helm_lint_passes(k8s_tools: Tools) -> None:
    for extra in ([], VARIANTS["workers"]):
        result = _helm(k8s_tools, "lint", "--strict", str(CHART), *extra)
        assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_rendered_object_is_schema_valid(k8s_tools: Tools, variant: str) -> None:
    objects = _render(k8s_tools, VARIANTS[variant], crds=True)
    kinds = {obj["kind"] for obj in objects}
    assert {"Deployment", "ConfigMap", "CustomResourceDefinition"} <= kinds
    for obj in objects:
        if obj["kind"] in CUSTOM_KINDS:
            continue
        # strict: unknown fields are errors, not silently dropped.
        kubernetes_validate.validate(obj, SCHEMA_VERSION, strict=True)


def _crd_names(objects: Iterable[Mapping[str, Any]]) -> set[str]:
    return {o["metadata"]["name"] for o in objects if o["kind"] == "CustomResourceDefinition"}


AGENTSAFE_CRDS = {
    "agentpolicies.agentsafe.io",
    "principals.agentsafe.io",
    "haltswitches.agentsafe.io",
}
PEERING_CRDS = {"clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"}


def test_helm_template_needs_no_kube_version(k8s_tools: Tools) -> None:
    objects = _render(k8s_tools, [], kube_version=False)
    assert {"Deployment", "NetworkPolicy", "CustomResourceDefinition"} <= {
        o["kind"] for o in objects
    }


def test_agentsafe_crds_are_templates_gated_and_kept(k8s_tools: Tools) -> None:
    # Templates, not crds/: rendered without --include-crds, so `helm upgrade` upgrades them.
    objects = _render(k8s_tools, [])
    assert _crd_names(objects) == AGENTSAFE_CRDS
    for obj in objects:
        if obj["kind"] == "CustomResourceDefinition":
            assert obj["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    unkept = _render(k8s_tools, ["--set", "crds.keep=false"])
    assert all(
        "annotations" not in o["metadata"]
        for o in unkept
        if o["kind"] == "CustomResourceDefinition"
    )
    assert _crd_names(_render(k8s_tools, ["--set", "crds.enabled=false"])) == set()


def test_peering_install_crds_false_is_honoured(k8s_tools: Tools) -> None:
    assert _crd_names(_render(k8s_tools, [], crds=True)) == AGENTSAFE_CRDS | PEERING_CRDS
    minimal = _render(k8s_tools, ["--set", "peering.installCRDs=false"], crds=True)
    assert _crd_names(minimal) == AGENTSAFE_CRDS


def test_notes_name_nothing_a_chart_user_lacks(control_plane: ControlPlane) -> None:
    # helm renders NOTES only on install; a dry run still maps every kind, so kopf's CRDs first.
    for name in sorted(PEERING_CRDS):
        control_plane.kubectl("apply", "-f", str(REPO / "crds" / f"{name}.yaml"))
    args = ["install", "agentsafe", str(CHART), "--dry-run=client", "--namespace", "x"]
    notes = control_plane.helm(*args).stdout.split("NOTES:", 1)[1]
    # A chart user has the chart, not this repository: no repository paths.
    assert "examples/" not in notes
    assert ".yaml" not in notes
    assert "kubectl explain agentpolicies.spec" in notes


def test_security_contexts_are_overridable_for_openshift(k8s_tools: Tools) -> None:
    unset = ",".join(
        f"operator.podSecurityContext.{key}=null" for key in ("runAsUser", "runAsGroup", "fsGroup")
    )
    objects = _render(
        k8s_tools, ["--set", unset, "--set", "operator.securityContext.runAsUser=1001"]
    )
    deployment = _deployment(objects)
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert pod["containers"][0]["securityContext"]["runAsUser"] == 1001
    (test_pod,) = [o for o in objects if o["kind"] == "Pod"]
    assert test_pod["spec"]["securityContext"] == pod["securityContext"]


def test_the_test_pod_has_its_own_labels(k8s_tools: Tools) -> None:
    objects = _render(k8s_tools, ["--set", "tests.podLabels.team=platform"])
    (test_pod,) = [o for o in objects if o["kind"] == "Pod"]
    labels = test_pod["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == "agentsafe-test"
    assert labels["app.kubernetes.io/component"] == "test"
    assert labels["team"] == "platform"
    # The operator's Service must never select the test pod.
    (service,) = [o for o in objects if o["kind"] == "Service"]
    selector = service["spec"]["selector"]
    assert not all(labels.get(key) == value for key, value in selector.items())


def _operator_policy(obj: Mapping[str, Any]) -> bool:
    """The operator's NetworkPolicy (not the `helm test` pod's own)."""
    return bool(obj["kind"] == "NetworkPolicy" and obj["metadata"]["name"] == "agentsafe-operator")


def test_operator_network_policy(k8s_tools: Tools) -> None:
    objects = _render(k8s_tools, [])
    (policy,) = [o for o in objects if _operator_policy(o)]
    deployment = _deployment(objects)
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert all(pod_labels[key] == value for key, value in selector.items())
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    rule, webhook = policy["spec"]["ingress"]
    # The API server reaches the webhook from an address no selector names: any source, on
    # that port only (webhook.ingressFrom narrows it).
    assert webhook == {"ports": [{"port": "webhook", "protocol": "TCP"}]}
    narrowed = _render_values(
        k8s_tools, {"webhook": {"ingressFrom": [{"ipBlock": {"cidr": "10.0.0.1/32"}}]}}
    )
    (narrow,) = [o for o in narrowed if _operator_policy(o)]
    assert narrow["spec"]["ingress"][1]["from"] == [{"ipBlock": {"cidr": "10.0.0.1/32"}}]
    (no_webhook,) = [
        o for o in _render(k8s_tools, ["--set", "webhook.enabled=false"]) if _operator_policy(o)
    ]
    assert len(no_webhook["spec"]["ingress"]) == 1
    assert rule["ports"] == [{"port": "health", "protocol": "TCP"}]
    assert rule["from"] == [
        {
            "podSelector": {
                "matchLabels": {
                    "app.kubernetes.io/name": "agentsafe-test",
                    "app.kubernetes.io/instance": "agentsafe",
                }
            }
        }
    ]
    egress = [{"to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}], "ports": [{"port": 6443}]}]
    values = {"networkPolicy": {"egress": egress, "ingressFrom": [{"namespaceSelector": {}}]}}
    restricted = _render_values(k8s_tools, values)
    (policy,) = [o for o in restricted if _operator_policy(o)]
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert policy["spec"]["egress"] == egress
    assert policy["spec"]["ingress"][0]["from"][1] == {"namespaceSelector": {}}
    assert not [
        o
        for o in _render(k8s_tools, ["--set", "networkPolicy.enabled=false"])
        if _operator_policy(o)
    ]


def _render_values(tools: Tools, values: Mapping[str, Any]) -> list[dict[str, Any]]:
    args = ["template", "agentsafe", str(CHART), "--namespace", "agentsafe-system", "-f", "-"]
    result = subprocess.run(
        [str(tools.helm), *args],
        input=json.dumps(values),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def test_what_an_admission_policy_asks_of_the_chart_is_there(k8s_tools: Tools) -> None:
    """Issue 31, item 17 (kube-score, checkov): every container requests and limits
    ephemeral-storage; the operator's readiness asks another question than its liveness; the
    `helm test` pod runs under a NetworkPolicy of its own (no ingress; egress to DNS and the
    operator's health port only); the image is pinned by `image.digest` when given."""
    for variant in ("defaults", "noWebhook"):
        objects = _render(k8s_tools, VARIANTS[variant])
        pods = [_deployment(objects)["spec"]["template"]["spec"]]
        pods += [o["spec"] for o in objects if o["kind"] == "Pod"]
        assert len(pods) == 2, variant
        for pod in pods:
            for container in pod["containers"]:
                resources = container["resources"]
                assert "ephemeral-storage" in resources["requests"], container["name"]
                assert "ephemeral-storage" in resources["limits"], container["name"]
        (operator,) = pods[0]["containers"]
        assert operator["readinessProbe"] != operator["livenessProbe"]
        port = "webhook" if variant == "defaults" else "health"
        assert operator["readinessProbe"]["tcpSocket"] == {"port": port}
    objects = _render(k8s_tools, [])
    (test_pod,) = [o for o in objects if o["kind"] == "Pod"]
    (guard,) = [o for o in objects if o["kind"] == "NetworkPolicy" and not _operator_policy(o)]
    selector = guard["spec"]["podSelector"]["matchLabels"]
    assert all(test_pod["metadata"]["labels"][k] == v for k, v in selector.items())
    assert guard["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert int(guard["metadata"]["annotations"]["helm.sh/hook-weight"]) < 0  # before the pod
    assert guard["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert "ingress" not in guard["spec"]
    dns, operator_health = guard["spec"]["egress"]
    assert {p["port"] for p in dns["ports"]} == {53}
    assert operator_health["ports"] == [{"port": 8080, "protocol": "TCP"}]
    labels = _deployment(objects)["spec"]["template"]["metadata"]["labels"]
    target = operator_health["to"][0]["podSelector"]["matchLabels"]
    assert all(labels[k] == v for k, v in target.items())
    assert not [
        o
        for o in _render(k8s_tools, ["--set", "networkPolicy.enabled=false"])
        if o["kind"] == "NetworkPolicy"
    ]
    pinned = _deployment(_render(k8s_tools, VARIANTS["digest"]))
    image = pinned["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image.endswith("@sha256:" + "a" * 64)


def test_values_schema_refuses_bad_values(k8s_tools: Tools) -> None:
    bad = [
        ["--set", "image.pullPolicy=Sometimes"],
        ["--set", "operator.watchNamespaces={Not_A_Namespace}"],
        ["--set", "operator.replicas=0"],
        ["--set", "image.digest=latest"],
        ["--set", "unknownKey=1"],
        ["--set", "webhook.failurePolicy=Sometimes"],
        ["--set", "webhook.timeoutSeconds=31"],
        ["--set", "webhook.tls.mode=helm"],
        ["--set", "executor.workers=0"],
        ["--set", f"executor.workers={WORKERS_MAX + 1}"],
        ["--set", "executor.workers=two"],
        ["--set", "executor.workers=1.5"],
    ]
    for extra in bad:
        args = ["template", "x", str(CHART), "--kube-version", KUBERNETES_VERSION, *extra]
        result = _helm(k8s_tools, *args, check=False)
        assert result.returncode != 0, extra
        assert "schema" in result.stderr, result.stderr


def _deployment(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return next(obj for obj in objects if obj["kind"] == "Deployment")


def test_operator_deployment_posture(k8s_tools: Tools) -> None:
    deployment = _deployment(_render(k8s_tools, []))
    spec = deployment["spec"]
    # kopf's rollout freeze: never run an old and a new operator pod side by side.
    assert spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    assert container["args"][0] == "operator"
    assert container["args"][:2] == ["operator", "--liveness=http://0.0.0.0:8080/healthz"]
    env = {item["name"]: item for item in container["env"]}
    # kopf's identity and the operator's distinct peering priority both come from the pod.
    assert env["POD_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    context = container["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    # The executors' NetworkPolicies admit the operator by this label.
    labels = spec["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == "agentsafe-operator"
    namespaced = _deployment(_render(k8s_tools, VARIANTS["namespaced"]))
    args = namespaced["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[2:4] == ["--namespace=team-a", "--namespace=team-b"]
    # The arguments parse as `agentsafe operator` parses them (its own registration).
    parser = argparse.ArgumentParser(prog="agentsafe")
    register(parser.add_subparsers(dest="command", required=True))
    parsed = parser.parse_args(args)
    assert parsed.namespace == ["team-a", "team-b"]
    assert parsed.liveness == "http://0.0.0.0:8080/healthz"
    assert parsed.webhook_port == 9443
    assert parsed.webhook_ca_secret == "agentsafe-operator-webhook-ca"
    assert parsed.webhook_configuration == "agentsafe-operator"
    assert parsed.webhook_dns_name == [
        "agentsafe-operator.agentsafe-system.svc",
        "agentsafe-operator.agentsafe-system.svc.cluster.local",
    ]


def _webhook(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (configuration,) = [o for o in objects if o["kind"] == "ValidatingWebhookConfiguration"]
    return configuration


def test_webhook_configuration_reaches_the_operators_handler(k8s_tools: Tools) -> None:
    objects = _render(k8s_tools, [])
    configuration = _webhook(objects)
    (hook,) = configuration["webhooks"]
    # kopf routes POST /<handler id>: another path would reach no handler (and be admitted).
    assert hook["name"] == ADMISSION_WEBHOOK_ID
    service = hook["clientConfig"]["service"]
    assert service["path"] == f"/{ADMISSION_WEBHOOK_ID}"
    assert "caBundle" not in hook["clientConfig"]  # the operator or cert-manager sets it
    assert hook["failurePolicy"] == "Fail"
    assert hook["timeoutSeconds"] == 5
    assert hook["sideEffects"] == "None"
    assert hook["rules"] == [
        {
            "apiGroups": ["agentsafe.io"],
            "apiVersions": ["*"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["agentpolicies"],
            "scope": "Namespaced",
        }
    ]
    assert {c["name"] for c in hook["matchConditions"]} == {"spec-changed", "not-deleting"}
    # The Service it names exists and answers 443 on the operator's webhook port.
    (svc,) = [o for o in objects if o["kind"] == "Service"]
    assert svc["metadata"]["name"] == service["name"]
    assert {"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"} in svc[
        "spec"
    ]["ports"]
    assert service["port"] == 443
    container = _deployment(objects)["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "webhook", "containerPort": 9443, "protocol": "TCP"} in container["ports"]
    # Only the watched namespaces; values reach the object.
    namespaced = _webhook(
        _render(
            k8s_tools,
            [*VARIANTS["namespaced"], "--set", "webhook.failurePolicy=Ignore"],
        )
    )["webhooks"][0]
    assert namespaced["failurePolicy"] == "Ignore"
    assert namespaced["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}
    ]
    assert not [
        o
        for o in _render(k8s_tools, VARIANTS["noWebhook"])
        if o["kind"] == "ValidatingWebhookConfiguration"
    ]


def test_webhook_tls_from_cert_manager(k8s_tools: Tools) -> None:
    objects = _render(k8s_tools, VARIANTS["certManager"])
    configuration = _webhook(objects)
    (certificate,) = [o for o in objects if o["kind"] == "Certificate"]
    (issuer,) = [o for o in objects if o["kind"] == "Issuer"]
    assert issuer["spec"] == {"selfSigned": {}}
    assert configuration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
        f"agentsafe-system/{certificate['metadata']['name']}"
    )
    assert certificate["spec"]["dnsNames"] == [
        "agentsafe-operator.agentsafe-system.svc",
        "agentsafe-operator.agentsafe-system.svc.cluster.local",
    ]
    pod = _deployment(objects)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert "--webhook-cert-dir=/etc/agentsafe/webhook-tls" in container["args"]
    assert not [a for a in container["args"] if a.startswith("--webhook-ca-secret")]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["webhook-tls"]["secret"]["secretName"] == certificate["spec"]["secretName"]
    # No operator CA: no by-name grant on the webhook configuration.
    rules = [r for o in objects if o["kind"] == "ClusterRole" for r in o["rules"]]
    assert not [r for r in rules if "validatingwebhookconfigurations" in r.get("resources", [])]
    # A chosen issuer replaces the self-signed one.
    issued = _render(
        k8s_tools,
        [
            *VARIANTS["certManager"],
            "--set",
            "webhook.tls.certManager.issuerRef.name=bank-ca",
            "--set",
            "webhook.tls.certManager.issuerRef.kind=ClusterIssuer",
        ],
    )
    assert not [o for o in issued if o["kind"] == "Issuer"]
    (certificate,) = [o for o in issued if o["kind"] == "Certificate"]
    assert certificate["spec"]["issuerRef"] == {"name": "bank-ca", "kind": "ClusterIssuer"}


def test_monitoring_is_off_by_default_and_each_toggle_renders_its_object(
    k8s_tools: Tools,
) -> None:
    defaults = _render(k8s_tools, [])
    assert not {"ServiceMonitor", "PrometheusRule"} & {o["kind"] for o in defaults}
    only_rules = _render(k8s_tools, ["--set", "metrics.prometheusRule.enabled=true"])
    assert "ServiceMonitor" not in {o["kind"] for o in only_rules}
    assert "PrometheusRule" in {o["kind"] for o in only_rules}
    only_monitors = _render(k8s_tools, ["--set", "metrics.serviceMonitor.enabled=true"])
    assert "PrometheusRule" not in {o["kind"] for o in only_monitors}
    assert len([o for o in only_monitors if o["kind"] == "ServiceMonitor"]) == 2


def test_the_prometheus_rule_is_the_alert_file_with_runbook_urls(k8s_tools: Tools) -> None:
    base = "https://runbooks.bank.example/agentsafe"
    objects = _render(
        k8s_tools,
        [
            "--set",
            "metrics.prometheusRule.enabled=true",
            "--set",
            f"metrics.prometheusRule.runbookBaseUrl={base}/",
            "--set",
            "metrics.prometheusRule.labels.release=kube-prometheus",
        ],
    )
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus"
    source = yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())
    assert [g["name"] for g in rule["spec"]["groups"]] == [g["name"] for g in source["groups"]]
    rendered = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    expected = [r for g in source["groups"] for r in g["rules"]]
    assert len(rendered) == len(expected) >= 6
    for got, want in zip(rendered, expected, strict=True):
        assert got["alert"] == want["alert"]
        assert got["expr"] == want["expr"]
        assert got.get("for") == want.get("for")
        assert got["labels"] == want["labels"]
        playbook = want["annotations"]["playbook"]
        assert got["annotations"]["runbook_url"] == f"{base}/{playbook}.md"
        assert (REPO / "docs" / "playbooks" / f"{playbook}.md").is_file()
        assert "playbook" not in got["annotations"]
        # Prometheus's own templates reach it verbatim (helm does not evaluate them).
        assert got["annotations"]["description"] == want["annotations"]["description"]


def test_service_monitors_scrape_executors_with_the_metrics_token_and_the_operator(
    k8s_tools: Tools,
) -> None:
    values = {
        "operator": {"watchNamespaces": ["payments"]},
        "metrics": {
            "serviceMonitor": {
                "enabled": True,
                "interval": "15s",
                "labels": {"release": "kube-prometheus"},
                "executorTlsConfig": {
                    "ca": {"secret": {"name": "executor-ca", "key": "ca.crt"}},
                    "serverName": "payouts-executor.payments.svc",
                },
            },
            "scraper": {
                "namespaceSelector": {"kubernetes.io/metadata.name": "monitoring"},
                "podSelector": {"app.kubernetes.io/name": "prometheus"},
            },
        },
    }
    objects = _render_values(k8s_tools, values)
    monitors = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ServiceMonitor"}
    executors = monitors["agentsafe-executors"]["spec"]
    assert executors["namespaceSelector"] == {"matchNames": ["payments"]}
    assert executors["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "agentsafe-executor",
        "app.kubernetes.io/managed-by": "agentsafe-operator",
    }
    (endpoint,) = executors["endpoints"]
    assert (endpoint["port"], endpoint["scheme"], endpoint["path"]) == (
        "https",
        "https",
        "/metrics",
    )
    assert endpoint["interval"] == "15s"
    assert endpoint["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": "agentsafe-metrics-token", "key": "token"},
    }
    assert endpoint["tlsConfig"]["serverName"] == "payouts-executor.payments.svc"
    operator = monitors["agentsafe-operator"]["spec"]
    assert operator["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "15s"}]
    service = next(o for o in objects if o["kind"] == "Service")
    assert {"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"} in (
        service["spec"]["ports"]
    )
    assert all(o["metadata"]["labels"]["release"] == "kube-prometheus" for o in monitors.values())
    container = _deployment(objects)["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "metrics", "containerPort": 9090, "protocol": "TCP"} in container["ports"]
    # The operator's metrics port admits only the scraper.
    (policy,) = [o for o in objects if _operator_policy(o)]
    by_port = {rule["ports"][0]["port"]: rule for rule in policy["spec"]["ingress"]}
    health, metrics = by_port["health"], by_port["metrics"]
    assert metrics == {
        "ports": [{"port": "metrics", "protocol": "TCP"}],
        "from": [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
            }
        ],
    }
    assert health["ports"] == [{"port": "health", "protocol": "TCP"}]


def test_the_operator_reads_the_monitoring_values_as_the_chart_renders_them(
    k8s_tools: Tools, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = {
        "metrics": {
            "operatorPort": 9191,
            "tokenSecretName": "scrape-token",
            "scraper": {
                "namespaceSelector": {"kubernetes.io/metadata.name": "monitoring", "team": "sre"},
                "podSelector": {"app.kubernetes.io/name": "prometheus"},
            },
        }
    }
    objects = _render_values(k8s_tools, values)
    (configmap,) = [o for o in objects if o["kind"] == "ConfigMap"]
    for name, value in configmap["data"].items():
        monkeypatch.setenv(name, value)
    parser = argparse.ArgumentParser(prog="agentsafe")
    register(parser.add_subparsers(dest="command", required=True))
    parsed = parser.parse_args(["operator"])
    assert parsed.metrics_port == 9191
    assert parsed.metrics_token_secret == "scrape-token"
    assert parse_labels(parsed.scraper_namespace_selector, what="ns") == {
        "kubernetes.io/metadata.name": "monitoring",
        "team": "sre",
    }
    assert parse_labels(parsed.scraper_pod_selector, what="pod") == {
        "app.kubernetes.io/name": "prometheus"
    }
    off = _render_values(k8s_tools, {"metrics": {"operatorPort": 0}})
    container = _deployment(off)["spec"]["template"]["spec"]["containers"][0]
    assert "metrics" not in [p["name"] for p in container["ports"]]
    service = next(o for o in off if o["kind"] == "Service")
    assert "metrics" not in [p["name"] for p in service["spec"]["ports"]]


def test_the_operator_reads_the_default_worker_count_as_the_chart_renders_it(
    k8s_tools: Tools, monkeypatch: pytest.MonkeyPatch
) -> None:
    for values, expected in (({}, WORKERS_DEFAULT), ({"executor": {"workers": 4}}, 4)):
        (configmap,) = [o for o in _render_values(k8s_tools, values) if o["kind"] == "ConfigMap"]
        assert configmap["data"]["AGENTSAFE_OPERATOR_EXECUTOR_WORKERS"] == str(expected)
        for name, value in configmap["data"].items():
            monkeypatch.setenv(name, value)
        parser = argparse.ArgumentParser(prog="agentsafe")
        register(parser.add_subparsers(dest="command", required=True))
        assert parser.parse_args(["operator"]).executor_workers == expected


def test_the_worker_count_value_is_bounded_as_the_executor_bounds_it() -> None:
    """values.schema.json and values.yaml cannot import the executor's constants: this is
    where a copy that drifts from agentsafe.executor.config fails."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    workers = schema["properties"]["executor"]["properties"]["workers"]
    assert workers == {"type": "integer", "minimum": 1, "maximum": WORKERS_MAX}
    values_text = (CHART / "values.yaml").read_text()
    assert yaml.safe_load(values_text)["executor"]["workers"] == WORKERS_DEFAULT
    assert f"(EXECUTOR_WORKERS, 1-{WORKERS_MAX})" in values_text
    assert f"about {WORKER_MEMORY}" in values_text


def test_monitoring_values_that_cannot_work_are_refused(k8s_tools: Tools) -> None:
    refused = [
        (["--set", "metrics.serviceMonitor.interval=soon"], "schema"),
        (["--set", "metrics.prometheusRule.runbookBaseUrl=ftp://x"], "schema"),
        (["--set", "metrics.operatorPort=70000"], "schema"),
        (["--set", "metrics.tokenSecretName=Not_A_Name"], "schema"),
        (
            ["--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.tokenSecretName="],
            "metrics.tokenSecretName",
        ),
        (
            ["--set", "metrics.scraper.podSelector.app=prometheus"],
            "metrics.scraper.namespaceSelector",
        ),
    ]
    for extra, said in refused:
        args = ["template", "x", str(CHART), "--kube-version", KUBERNETES_VERSION, *extra]
        result = _helm(k8s_tools, *args, check=False)
        assert result.returncode != 0, extra
        assert said in result.stderr, result.stderr


def _permissions(rules: Iterable[Mapping[str, Any]]) -> set[tuple[str, ...]]:
    """(group, resource, verb) and (url, verb) triples: rule grouping does not matter."""
    found: set[tuple[str, ...]] = set()
    for rule in rules:
        for verb in rule["verbs"]:
            for url in rule.get("nonResourceURLs", []):
                found.add(("url", url, verb))
            for group in rule.get("apiGroups", []):
                for resource in rule.get("resources", []):
                    found.add((group, resource, verb))
    return found


def test_chart_rbac_equals_the_operators_render_rbac(k8s_tools: Tools) -> None:
    objects = _render(k8s_tools, [])
    chart_rules = [rule for obj in objects if obj["kind"] == "ClusterRole" for rule in obj["rules"]]
    (operator_role,) = [obj for obj in render_rbac() if obj["kind"] == "ClusterRole"]
    assert _permissions(chart_rules) == _permissions(operator_role["rules"])


def test_namespaced_variant_grants_nothing_cluster_wide(k8s_tools: Tools) -> None:
    objects = _render(k8s_tools, VARIANTS["namespaced"])
    cluster_roles = [obj for obj in objects if obj["kind"] == "ClusterRole"]
    assert len(cluster_roles) == 1
    cluster_resources = {
        resource for rule in cluster_roles[0]["rules"] for resource in rule.get("resources", [])
    }
    assert cluster_resources == {
        "namespaces",
        "customresourcedefinitions",
        "clusterkopfpeerings",
        "validatingwebhookconfigurations",  # its own, by name (test_webhook_*)
    }
    roles = {obj["metadata"]["namespace"]: obj for obj in objects if obj["kind"] == "Role"}
    # The operator's own Secrets (the webhook CA, the metrics token): in the release namespace,
    # which is not watched.
    assert set(roles) == {"team-a", "team-b", "agents", "agentsafe-system"}
    assert roles["agentsafe-system"]["metadata"]["name"].endswith("-own-namespace")
    assert {r for rule in roles["agentsafe-system"]["rules"] for r in rule["resources"]} == {
        "secrets"
    }
    agent_resources = {r for rule in roles["agents"]["rules"] for r in rule["resources"]}
    assert agent_resources == {"networkpolicies"}
    assert roles["agentsafe-system"]["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create", "get"]}
    ]
    bindings = [o for o in objects if o["kind"] == "RoleBinding"]
    assert any(b["metadata"]["namespace"] == "agentsafe-system" for b in bindings)
    # Neither Secret wanted there: no Role there.
    without = _render(
        k8s_tools,
        [*VARIANTS["namespaced"], *VARIANTS["noWebhook"], "--set", "metrics.tokenSecretName="],
    )
    assert "agentsafe-system" not in {
        o["metadata"]["namespace"] for o in without if o["kind"] == "Role"
    }
    only_metrics = _render(k8s_tools, [*VARIANTS["namespaced"], *VARIANTS["noWebhook"]])
    assert "agentsafe-system" in {
        o["metadata"]["namespace"] for o in only_metrics if o["kind"] == "Role"
    }


# --- against the real API server --------------------------------------------------------------


def _restricted_namespace(plane: ControlPlane, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    plane.kubectl("create", "namespace", name)
    plane.kubectl(
        "label",
        "namespace",
        name,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/warn=restricted",
    )
    # Admission looks up the namespace's default ServiceAccount for pods; without
    # kube-controller-manager nobody else creates it (apply: idempotent if it did).
    default_sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}
    plane.kubectl("apply", "-n", name, "-f", "-", input=json.dumps(default_sa))
    return name


def test_rendered_workloads_pass_pod_security_restricted(
    control_plane: ControlPlane, k8s_tools: Tools
) -> None:
    namespace = _restricted_namespace(control_plane, "pss")
    objects = _render(k8s_tools, ["--namespace", namespace])
    workloads = [obj for obj in objects if obj["kind"] in {"Deployment", "Pod"}]
    assert {obj["kind"] for obj in workloads} == {"Deployment", "Pod"}
    for obj in workloads:
        obj["metadata"]["namespace"] = namespace
        result = control_plane.kubectl(
            "create", "--dry-run=server", "-f", "-", input=json.dumps(obj), check=False
        )
        # Pods are refused and workloads warned about by PodSecurity admission on violations.
        assert result.returncode == 0, result.stderr
        assert "PodSecurity" not in result.stderr, result.stderr


def test_helm_install_into_the_local_control_plane(
    control_plane: ControlPlane, backend: str
) -> None:
    if backend != "local":
        pytest.skip("e2e/kind/run.sh installs the chart (and runs helm test) on kind")
    namespace = _restricted_namespace(control_plane, "agentsafe-system")
    release = "agentsafe"
    _adopt_existing_crds(control_plane, release, namespace)
    control_plane.helm("install", release, str(CHART), "--namespace", namespace)
    try:
        # The CRDs belong to the release, so `helm upgrade` changes them (here: the keep
        # annotation comes and goes), and crds.keep leaves them through `helm uninstall`.
        assert _crd_annotations(control_plane)["meta.helm.sh/release-name"] == release
        assert _crd_annotations(control_plane)["helm.sh/resource-policy"] == "keep"
        upgrade = ["upgrade", release, str(CHART), "--namespace", namespace, "--reuse-values"]
        control_plane.helm(*upgrade, "--set", "crds.keep=false")
        assert "helm.sh/resource-policy" not in _crd_annotations(control_plane)
        control_plane.helm(*upgrade, "--set", "crds.keep=true")
        assert _crd_annotations(control_plane)["helm.sh/resource-policy"] == "keep"
        status = json.loads(
            control_plane.helm("status", release, "-n", namespace, "-o", "json").stdout
        )
        assert status["info"]["status"] == "deployed"
        crds = json.loads(control_plane.kubectl("get", "crd", "-o", "json").stdout)["items"]
        groups = {crd["spec"]["group"] for crd in crds}
        assert "kopf.dev" in groups
        for crd in crds:
            if crd["spec"]["group"] in {"kopf.dev", "agentsafe.io"}:
                control_plane.kubectl(
                    "wait", "--for=condition=Established", f"crd/{crd['metadata']['name']}"
                )
        control_plane.kubectl("get", "clusterkopfpeering", "agentsafe")
        deployment = json.loads(
            control_plane.kubectl("get", "deploy", "-n", namespace, "-o", "json").stdout
        )["items"]
        assert [d["metadata"]["name"] for d in deployment] == ["agentsafe-operator"]

        who = f"system:serviceaccount:{namespace}:agentsafe-operator"

        def can(verb: str, resource: str, where: str | None = "default") -> bool:
            args = ["auth", "can-i", verb, resource, "--as", who]
            args += ["-n", where] if where else []
            return control_plane.kubectl(*args, check=False).stdout.strip() == "yes"

        assert can("watch", "agentpolicies.agentsafe.io")
        assert can("patch", "haltswitches.agentsafe.io/status")
        assert can("create", "statefulsets.apps")
        assert can("patch", "networkpolicies.networking.k8s.io")
        assert can("get", "secrets")
        assert can("patch", "clusterkopfpeerings.kopf.dev", None)
        # The Secret watch (docs/operator.md, "Secret changes"): list and watch, no more.
        assert can("list", "secrets")
        assert can("watch", "secrets")
        # Least privilege: no changing Secrets, no pods, no RBAC, no deleting CRDs.
        assert not can("update", "secrets")
        assert not can("patch", "secrets")
        assert not can("delete", "secrets")
        assert not can("create", "pods")
        assert not can("create", "rolebindings.rbac.authorization.k8s.io")
        assert not can("delete", "customresourcedefinitions.apiextensions.k8s.io", None)
        # Its own webhook configuration's caBundle, by name; never another admission control.
        webhooks = "validatingwebhookconfigurations.admissionregistration.k8s.io"
        assert can("patch", f"{webhooks}/agentsafe-operator", None)
        assert not can("patch", f"{webhooks}/another-webhook", None)
        assert not can("delete", f"{webhooks}/agentsafe-operator", None)
    finally:
        # Always: the scenario installs its own release, which shares the peering object.
        control_plane.helm("uninstall", release, "-n", namespace, check=False)
    remaining = control_plane.kubectl("get", "deploy", "-n", namespace, "-o", "name").stdout
    assert remaining.strip() == ""
    # crds.keep: the CRDs (and every AgentPolicy) outlive the release.
    for name in sorted(AGENTSAFE_CRDS):
        control_plane.kubectl("get", "crd", name)


def _crd_annotations(plane: ControlPlane) -> dict[str, str]:
    crd = json.loads(plane.kubectl("get", "crd", "agentpolicies.agentsafe.io", "-o", "json").stdout)
    annotations: dict[str, str] = crd["metadata"].get("annotations", {})
    return annotations


def _adopt_existing_crds(plane: ControlPlane, release: str, namespace: str) -> None:
    """The documented step for CRDs applied by kubectl or the 0.1 chart's crds/ directory
    (docs/operator.md, "Upgrading the CRDs"): hand them to the release, as cert-manager's
    upgrade notes do. Other tests here may have applied crds/*.yaml first."""
    for name in sorted(AGENTSAFE_CRDS):
        if plane.kubectl("get", "crd", name, check=False).returncode != 0:
            continue
        plane.kubectl("label", "--overwrite", "crd", name, "app.kubernetes.io/managed-by=Helm")
        plane.kubectl(
            "annotate",
            "--overwrite",
            "crd",
            name,
            f"meta.helm.sh/release-name={release}",
            f"meta.helm.sh/release-namespace={namespace}",
        )
