"""The end-to-end scenario: what a platform team and an agent do, against a real API server.

One sequence of steps on a cluster with a real kubelet, two backends sharing one
implementation (:mod:`cluster.kind_backend`; :mod:`cluster.scenario_backend` says what a backend
answers): ``--backend=node``, the one-node cluster of :mod:`cluster.node` on this machine
(``make e2e`` and ``make e2e-node``; what CI runs), and ``--backend=kind`` (``e2e/kind/run.sh``,
for machines with Docker). Nothing is stood in: the chart is installed with ``helm --wait``
from ``agentsafe:dev``, the operator is that pod, the executors are the StatefulSet's pods
under the ENFORCED posture, the provider is a pod (``e2e/kind/provider.yaml``), and every
NetworkPolicy check is traffic between pods. The loopback control plane (``--backend=local``)
has no kubelet, so this module skips there.

The steps: the examples in ``examples/k8s/`` applied with kubectl, plus the executor's TLS
Secret and the downstream's CA bundle they name, and a patch pointing the downstream at the
provider in ENFORCEMENT mode; every child checked for its owner reference and field manager;
an agent's TokenRequest token, and then an agent pod's projected token, execute once; the
posture proved both ways (ROOT_WRITABLE); NetworkPolicies proved by traffic, each check
failing once while its policy is deleted; a HaltSwitch stops the executor and a restart
while halted starts halted; a pod force-deleted mid-dispatch reconciles on its own volume;
a halt reaches every pod (latency recorded); deleting the AgentPolicy removes its children.

The tests run in file order and share one module-scoped scenario: each step starts from where
the previous one left the cluster, as a person following the README would.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cluster import pods
from cluster.chart_install import MONITORING
from cluster.control_plane import ControlPlane
from cluster.kind_backend import KindBackend, kind_backend
from cluster.pki import ServingPair, issue_serving_pair
from cluster.polling import poll
from cluster.scenario_backend import ScenarioBackend

from agentsafe.executor.tools.harness import free_port
from agentsafe.executor.tools.pgserver import PostgresServer, PostgresUnavailable, postgres_server

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples" / "k8s"
OPERATOR_NAMESPACE_ENV = "AGENTSAFE_E2E_NAMESPACE"
NAMESPACE = "payments"
AGENTS = "agents"
POLICY = "payouts"
EXECUTOR = f"{POLICY}-executor"
HALT_SWITCH = "stop-payouts"
AGENT_SA = "payout-agent"
STORE_SECRET = "payouts-store"
REAL_POD_BACKENDS = ("node", "kind")

pytestmark = pytest.mark.slow


@dataclass
class Scenario:
    plane: ControlPlane
    workdir: Path
    backend: ScenarioBackend
    executor_tls: ServingPair
    audience: str = ""

    def get(self, kind: str, name: str, namespace: str = NAMESPACE) -> dict[str, Any] | None:
        result = self.plane.kubectl(
            "get", kind, name, "-n", namespace, "-o", "json", "--show-managed-fields", check=False
        )
        if result.returncode != 0:
            if "NotFound" in result.stderr:
                return None
            raise AssertionError(result.stderr)
        found: dict[str, Any] = json.loads(result.stdout)
        return found

    def condition(self, kind: str, name: str, type_: str = "Ready") -> dict[str, Any] | None:
        obj = self.get(kind, name) or {}
        for condition in (obj.get("status") or {}).get("conditions") or []:
            if condition.get("type") == type_:
                return dict(condition)
        return None

    def received(self) -> list[str]:
        return self.backend.provider.received()

    def post_proposal(self, token: str, key: str, amount: int = 1200) -> tuple[int, dict[str, Any]]:
        body = {
            "proposal": {
                "action": "create_payout",
                "target": "payout:beneficiary-1",
                "parameters": {"amountMinor": amount, "currency": "EUR"},
            },
            "idempotency_key": key,
        }
        return _post(self, "/v1/actions", body, token=token)


def _executor_context(scenario: Scenario) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=scenario.executor_tls.ca_pem.decode())
    context.check_hostname = True
    return context


def _post(
    scenario: Scenario, path: str, body: dict[str, Any], *, token: str
) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"{scenario.backend.executor_url()}{path}",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "authorization": f"Bearer {token}"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(
            request, context=_executor_context(scenario), timeout=15
        ) as reply:
            return int(reply.status), json.loads(reply.read() or b"{}")
    except urllib.error.HTTPError as error:
        with error:
            return int(error.code), json.loads(error.read() or b"{}")


def _ready(scenario: Scenario) -> bool:
    return _ready_status(scenario) == 200


def _apply_json(plane: ControlPlane, obj: dict[str, Any]) -> None:
    plane.kubectl("apply", "-f", "-", input=json.dumps(obj))


@contextlib.contextmanager
def _backend(
    plane: ControlPlane, name: str, workdir: Path, operator_namespace: str
) -> Iterator[ScenarioBackend]:
    if name not in REAL_POD_BACKENDS:
        pytest.skip(
            "the scenario needs a kubelet: --backend=node (make e2e runs it) or --backend=kind"
        )
    with kind_backend(
        plane,
        workdir=workdir,
        operator_namespace=operator_namespace,
        scenario_namespaces=[NAMESPACE, AGENTS],
    ) as kind:
        yield kind


@pytest.fixture(autouse=True)
def _the_operator_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a scenario test fails, print the operator's last log lines and its peering's
    status (shown with the failure): the pod that was asked to act, and whether kopf had
    paused it for a peer (two runs on 2026-12-04 failed waiting for the operator, with no
    trace of it left after the node went down)."""
    yield
    report = getattr(request.node, "rep_call", None)
    if report is None or not report.failed or "scenario" not in request.fixturenames:
        return
    chosen: Scenario = request.getfixturevalue("scenario")
    print("--- the operator's last log lines ---")
    print(chosen.backend.operator_tail(80))
    peering = chosen.plane.kubectl(
        "get", "clusterkopfpeerings,kopfpeerings", "-A", "-o", "yaml", check=False
    )
    print("--- kopf's peerings ---")
    print(peering.stdout + peering.stderr)


@pytest.fixture(scope="module")
def scenario(
    control_plane: ControlPlane, backend: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Scenario]:
    plane = control_plane
    workdir = tmp_path_factory.mktemp("scenario")
    # run.sh installs the chart into $AGENTSAFE_E2E_NAMESPACE; the node fixture into this one.
    operator_namespace = os.environ.get(OPERATOR_NAMESPACE_ENV) or "agentsafe-system"
    with _backend(plane, backend, workdir, operator_namespace) as chosen:
        provider = chosen.provider
        # What the examples expect to exist already: the executor's TLS Secret (cert-manager's
        # job in a cluster) and the downstream's CA bundle.
        plane.kubectl("apply", "-f", str(EXAMPLES / "00-namespaces.yaml"))
        executor_tls = issue_serving_pair(
            common_name=EXECUTOR,
            dns_names=[f"{EXECUTOR}.{NAMESPACE}.svc", "localhost"],
            ip_addresses=["127.0.0.1"],
        )
        _apply_json(
            plane,
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": "kubernetes.io/tls",
                "metadata": {"name": f"{EXECUTOR}-tls", "namespace": NAMESPACE},
                "stringData": {
                    "tls.crt": executor_tls.cert_pem.decode(),
                    "tls.key": executor_tls.key_pem.decode(),
                    "ca.crt": executor_tls.ca_pem.decode(),
                },
            },
        )
        _apply_json(
            plane,
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "payouts-downstream-ca", "namespace": NAMESPACE},
                "data": {"ca.pem": provider.ca_pem},
            },
        )
        plane.kubectl("apply", "-f", str(EXAMPLES))
        patch = {
            "spec": {
                "mode": "ENFORCEMENT",
                "downstream": {
                    "url": f"{provider.url}/payouts",
                    "lookupUrl": f"{provider.url}/payouts/{{idempotency_key}}",
                    "ca": {"name": "payouts-downstream-ca", "key": "ca.pem"},
                    "cidrs": list(provider.cidrs),
                },
            }
        }
        plane.kubectl(
            "patch", "agentpolicy", POLICY, "-n", NAMESPACE, "--type=merge", "-p", json.dumps(patch)
        )
        yield Scenario(plane=plane, workdir=workdir, backend=chosen, executor_tls=executor_tls)


def _policy_condition(
    scenario: Scenario, type_: str, *, deadline: float = 120, current: bool = True
) -> dict[str, Any]:
    """Wait for ``type_=True``; with ``current``, set for the AgentPolicy's latest generation
    (so a condition of the render before the scenario's patch does not count)."""

    def true() -> dict[str, Any] | None:
        policy = scenario.get("agentpolicy", POLICY) or {}
        generation = (policy.get("metadata") or {}).get("generation")
        for condition in (policy.get("status") or {}).get("conditions") or []:
            if condition.get("type") != type_ or condition.get("status") != "True":
                continue
            if current and condition.get("observedGeneration") not in (None, generation):
                return None
            return dict(condition)
        return None

    try:
        return poll(f"AgentPolicy payouts {type_}=True", true, deadline=deadline)
    except BaseException:
        print(scenario.backend.operator_tail(60))
        policy = scenario.get("agentpolicy", POLICY) or {}
        print(json.dumps(policy.get("status"), indent=1)[:4000])
        raise


def test_the_operator_renders_every_child_with_owner_references(scenario: Scenario) -> None:
    _policy_condition(scenario, "Reconciled")
    # The executor pod is starting: until it is ready the policy is honestly not ready (on a
    # fast node the pod may already be ready by now; then Ready is True).
    ready = scenario.condition("agentpolicy", POLICY)
    assert ready is not None
    if ready["status"] != "True":
        assert (ready["status"], ready["reason"]) == ("False", "ExecutorsNotReady")
    policy = scenario.get("agentpolicy", POLICY)
    assert policy is not None
    uid = policy["metadata"]["uid"]
    scenario.audience = str(policy["status"]["audience"])
    assert scenario.audience == f"agentsafe.io/{NAMESPACE}/{POLICY}"
    children = {
        "serviceaccount": EXECUTOR,
        "configmap": f"{EXECUTOR}-config",
        "statefulset": EXECUTOR,
        "service": EXECUTOR,
        "networkpolicy": EXECUTOR,
    }  # one replica: no PodDisruptionBudget (from two: test_a_halt_switch_stops_every_...)
    for kind, name in children.items():
        child = scenario.get(kind, name)
        assert child is not None, f"{kind}/{name} was not rendered"
        owners = child["metadata"].get("ownerReferences") or []
        assert [(o["kind"], o["name"], o["uid"], o.get("controller")) for o in owners] == [
            ("AgentPolicy", POLICY, uid, True)
        ], f"{kind}/{name}"
        managers = {entry["manager"] for entry in child["metadata"].get("managedFields") or []}
        assert "agentsafe-operator" in managers, f"{kind}/{name}: {managers}"
    # The agents' egress policy lives in the agents' namespace (no cross-namespace owner).
    agent_policies = json.loads(
        scenario.plane.kubectl("get", "networkpolicy", "-n", AGENTS, "-o", "json").stdout
    )["items"]
    assert any(p["metadata"]["name"].endswith(f"{POLICY}-no-downstream") for p in agent_policies)
    assert scenario.get("poddisruptionbudget", EXECUTOR) is None
    sa = scenario.get("serviceaccount", EXECUTOR)
    assert sa is not None
    assert sa["automountServiceAccountToken"] is False


def test_printer_columns_show_mode_ready_halted(scenario: Scenario, executor_pod: None) -> None:
    # The pod is ready (the kubelet's probe passed); the operator's StatefulSet watch moves
    # Ready without waiting for its timer.
    _policy_condition(scenario, "Ready", deadline=scenario.backend.deadlines.policy_ready)
    table = scenario.plane.kubectl("get", "agentpolicies", "-n", NAMESPACE).stdout.splitlines()
    header = table[0].split()
    assert header[:4] == ["NAME", "MODE", "READY", "HALTED"], table[0]
    row = dict(zip(header, table[1].split(), strict=False))
    assert row["NAME"] == POLICY
    assert row["MODE"] == "ENFORCEMENT"
    assert row["READY"] == "True"
    assert row["HALTED"] == "false"


@pytest.fixture(scope="module")
def executor_pod(scenario: Scenario) -> Iterator[None]:
    """Pod 0 of the operator's StatefulSet, running and answering /ready."""
    _policy_condition(scenario, "Reconciled")
    statefulset = scenario.get("statefulset", EXECUTOR)
    assert statefulset is not None
    with scenario.backend.start_executor(statefulset, ready=lambda: _ready(scenario)):
        yield


def _agent_token(scenario: Scenario, service_account: str = AGENT_SA) -> str:
    policy = scenario.get("agentpolicy", POLICY)
    assert policy is not None
    audience = str(policy["status"]["audience"])
    return scenario.plane.create_token(service_account, namespace=AGENTS, audience=audience)


def test_an_agent_proposal_executes_once(scenario: Scenario, executor_pod: None) -> None:
    token = _agent_token(scenario)
    key = f"e2e-{uuid.uuid4().hex[:8]}"
    status, body = scenario.post_proposal(token, key)
    assert status == 200, (body, scenario.backend.executor_tail())
    assert body["outcome"] == "COMPLETED"
    assert body["executed"] is True
    again_status, again = scenario.post_proposal(token, key)
    assert again_status == 200
    assert again["outcome"] == "COMPLETED"
    assert scenario.received().count(key) == 1


def test_another_service_account_is_refused(scenario: Scenario, executor_pod: None) -> None:
    scenario.plane.kubectl("create", "serviceaccount", "intruder", "-n", AGENTS, check=False)
    token = _agent_token(scenario, "intruder")
    status, body = scenario.post_proposal(token, f"intruder-{uuid.uuid4().hex[:8]}")
    assert status == 401, body
    assert "intruder" not in json.dumps(body)


# --- what only real pods can show -------------------------------------------------------------

OUTSIDER = "agentsafe-e2e-outsider"
AGENT_SCRIPT = """\
import json, os, ssl, urllib.error, urllib.request
token = open("/var/run/agent/token").read().strip()
context = ssl.create_default_context(cafile="/var/run/executor-ca/ca.pem")
body = {
    "proposal": {
        "action": "create_payout",
        "target": "payout:beneficiary-1",
        "parameters": {"amountMinor": 1200, "currency": "EUR"},
    },
    "idempotency_key": os.environ["KEY"],
}
request = urllib.request.Request(
    os.environ["URL"] + "/v1/actions",
    data=json.dumps(body).encode(),
    headers={"content-type": "application/json", "authorization": "Bearer " + token},
    method="POST",
)
try:
    with urllib.request.urlopen(request, context=context, timeout=30) as reply:
        print(json.dumps({"status": reply.status, "body": json.loads(reply.read())}))
except urllib.error.HTTPError as error:
    print(json.dumps({"status": error.code, "body": json.loads(error.read() or b"{}")}))
"""


def _executor_container(scenario: Scenario) -> dict[str, Any]:
    statefulset = scenario.get("statefulset", EXECUTOR)
    assert statefulset is not None
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    return dict(container)


def _executor_port(scenario: Scenario) -> int:
    return int(_executor_container(scenario)["ports"][0]["containerPort"])


SCRAPE = """
import json, ssl, sys, urllib.error, urllib.request
url, token, ca = sys.argv[1], sys.argv[2], sys.argv[3]
context = ssl.create_default_context(cadata=ca)
request = urllib.request.Request(url, headers={"Authorization": "Bearer " + token})
try:
    with urllib.request.urlopen(request, context=context, timeout=30) as r:
        print(json.dumps({"status": r.status, "body": r.read().decode()}))
except urllib.error.HTTPError as e:
    print(json.dumps({"status": e.code, "body": e.read().decode()}))
"""


def _secret_token(scenario: Scenario, namespace: str, name: str) -> str:
    encoded = scenario.plane.kubectl(
        "get", "secret", name, "-n", namespace, "-o", "jsonpath={.data.token}"
    ).stdout
    return base64.b64decode(encoded).decode()


def test_the_scraper_reads_metrics_with_the_metrics_token_and_nothing_else(
    scenario: Scenario, executor_pod: None
) -> None:
    """Issue 22: Prometheus can scrape an operator-deployed executor. The executor NetworkPolicy
    admits the scraper's namespace (the chart's metrics.scraper) and nobody else's; the metrics
    principal the operator renders reads /metrics and nothing more; the operator's own token
    cannot read /metrics."""
    plane = scenario.plane
    image = str(_executor_container(scenario)["image"])
    port = _executor_port(scenario)
    operator_namespace = os.environ.get(OPERATOR_NAMESPACE_ENV) or "agentsafe-system"
    for namespace in (MONITORING, OUTSIDER):
        plane.kubectl("create", "namespace", namespace, check=False)
    scraper = pods.Prober.start(plane, name="probe-scraper", namespace=MONITORING, image=image)
    outsider = pods.Prober.start(plane, name="probe-outsider", namespace=OUTSIDER, image=image)
    try:
        executor_ip = pods.pod_ip(plane, f"{EXECUTOR}-0", NAMESPACE)
        assert scraper.connect(executor_ip, port) == "open"
        assert outsider.connect(executor_ip, port) == "blocked"
        metrics_token = _secret_token(scenario, operator_namespace, "agentsafe-metrics-token")
        operator_token = _secret_token(scenario, NAMESPACE, f"{POLICY}-operator-token")
        base = f"https://{EXECUTOR}.{NAMESPACE}.svc:{port}"
        ca = scenario.executor_tls.ca_pem.decode()

        def scrape(path: str, token: str) -> dict[str, Any]:
            argv = ["exec", scraper.name, "-n", MONITORING, "-c", scraper.container, "--"]
            argv += ["python", "-c", SCRAPE, base + path, token, ca]
            answer: dict[str, Any] = json.loads(plane.kubectl(*argv, timeout=90).stdout)
            return answer

        scraped = scrape("/metrics", metrics_token)
        assert scraped["status"] == 200, scraped
        assert "agentsafe_build_info{" in scraped["body"]
        assert "agentsafe_request_duration_seconds_bucket{" in scraped["body"]
        assert "\nagentsafe_halted " in scraped["body"]
        # The metrics principal reads metrics only; the operator's principal has no metrics.
        status = scrape("/v1/control/status", metrics_token)
        assert status["status"] == 403, status
        assert json.loads(status["body"])["error"]["code"] == "SCOPE_FORBIDDEN"
        refused = scrape("/metrics", operator_token)
        assert refused["status"] == 403, refused
    finally:
        scraper.stop()
        outsider.stop()
        for namespace in (MONITORING, OUTSIDER):
            plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def _agent_pod(scenario: Scenario, name: str, script: str, env: dict[str, str]) -> dict[str, Any]:
    """A pod in the agents' namespace, as the agent's ServiceAccount, with a projected token
    of the AgentPolicy's audience (and the executor's CA), running ``script``."""
    _apply_json(
        scenario.plane,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "executor-ca", "namespace": AGENTS},
            "data": {"ca.pem": scenario.executor_tls.ca_pem.decode()},
        },
    )
    container = pods.restricted_container(
        "agent", str(_executor_container(scenario)["image"]), ["python", "-c", script]
    )
    container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    container["volumeMounts"] = [
        {"name": "token", "mountPath": "/var/run/agent", "readOnly": True},
        {"name": "executor-ca", "mountPath": "/var/run/executor-ca", "readOnly": True},
    ]
    volumes = [
        {
            "name": "token",
            "projected": {
                "sources": [
                    {
                        "serviceAccountToken": {
                            "audience": scenario.audience,
                            "expirationSeconds": 600,
                            "path": "token",
                        }
                    }
                ]
            },
        },
        {"name": "executor-ca", "configMap": {"name": "executor-ca"}},
    ]
    return pods.pod_manifest(name, AGENTS, container, service_account=AGENT_SA, volumes=volumes)


def test_executor_pods_run_from_the_image_under_the_enforced_posture(
    scenario: Scenario, executor_pod: None
) -> None:
    container = _executor_container(scenario)
    env = {item["name"]: item.get("value") for item in container.get("env") or []}
    assert env.get("EXECUTOR_POSTURE", "ENFORCED") == "ENFORCED", env
    pod = scenario.get("pod", f"{EXECUTOR}-0")
    assert pod is not None
    (status,) = pod["status"]["containerStatuses"]
    assert status["ready"] is True
    security = pod["spec"]["containers"][0]["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["runAsNonRoot"] is True
    assert pod["spec"]["automountServiceAccountToken"] is False
    # DEVELOPMENT appears nowhere on the cluster path: no pod spec and no executor log has it.
    everything = scenario.plane.kubectl("get", "pods", "-A", "-o", "json").stdout
    assert "DEVELOPMENT" not in everything
    assert "DEVELOPMENT" not in scenario.backend.executor_tail(400)


def test_a_writable_root_filesystem_refuses_to_start(
    scenario: Scenario, executor_pod: None
) -> None:
    """Both sides of ROOT_WRITABLE on a real container root. A non-root process cannot write
    to the image's root-owned ``/`` even when the filesystem is writable, so both pods run as
    uid 0 (refused as ROOT_UID in any case); the one difference between them is
    ``readOnlyRootFilesystem``, and only the writable one is refused naming ROOT_WRITABLE."""
    statefulset = scenario.get("statefulset", EXECUTOR)
    assert statefulset is not None
    results = {}
    for name, read_only in (("posture-writable-root", False), ("posture-readonly-root", True)):
        manifest = pods.pod_from_template(
            statefulset["spec"]["template"],
            name=name,
            namespace=NAMESPACE,
            labels={"app.kubernetes.io/part-of": "agentsafe-e2e"},
        )
        spec = manifest["spec"]
        spec["securityContext"].update({"runAsNonRoot": False, "runAsUser": 0, "runAsGroup": 0})
        (container,) = spec["containers"]
        container["securityContext"].update(
            {"readOnlyRootFilesystem": read_only, "runAsNonRoot": False, "runAsUser": 0}
        )
        container.pop("readinessProbe", None)
        container.pop("livenessProbe", None)
        container.pop("startupProbe", None)
        phase, log = pods.run_to_completion(scenario.plane, manifest, deadline=120)
        results[name] = (phase, log)
    phase, log = results["posture-writable-root"]
    assert phase == "Failed", log
    assert "REFUSED_TO_START" in log, log
    assert "ROOT_WRITABLE" in log, log
    phase, log = results["posture-readonly-root"]
    assert phase == "Failed", log
    assert "REFUSED_TO_START" in log, log
    assert "ROOT_UID" in log, log
    assert "ROOT_WRITABLE" not in log, log


def test_an_agent_pod_with_a_projected_token_executes_once(
    scenario: Scenario, executor_pod: None
) -> None:
    key = f"agent-pod-{uuid.uuid4().hex[:8]}"
    url = f"https://{EXECUTOR}.{NAMESPACE}.svc:{_executor_port(scenario)}"
    manifest = _agent_pod(scenario, "agent-proposes", AGENT_SCRIPT, {"URL": url, "KEY": key})
    phase, log = pods.run_to_completion(scenario.plane, manifest)
    assert phase == "Succeeded", log
    answer = json.loads(log.strip().splitlines()[-1])
    assert answer["status"] == 200, answer
    assert answer["body"]["outcome"] == "COMPLETED"
    assert answer["body"]["executed"] is True
    assert scenario.received().count(key) == 1


@contextlib.contextmanager
def _operator_paused(scenario: Scenario) -> Iterator[None]:
    """Scale the operator to zero, so a NetworkPolicy the test deletes stays deleted until the
    test puts it back (the operator would re-render it)."""
    from cluster.chart_install import NAMESPACE as OPERATOR_NAMESPACE

    deployment = "deployment/agentsafe-operator"
    plane = scenario.plane
    plane.kubectl("scale", deployment, "-n", OPERATOR_NAMESPACE, "--replicas=0")
    poll(
        "the operator's pods to stop",
        lambda: (
            True
            if not json.loads(
                plane.kubectl(
                    "get",
                    "pods",
                    "-n",
                    OPERATOR_NAMESPACE,
                    "-l",
                    "app.kubernetes.io/name=agentsafe-operator",
                    "-o",
                    "json",
                ).stdout
            )["items"]
            else None
        ),
        deadline=60,
    )
    try:
        yield
    finally:
        plane.kubectl("scale", deployment, "-n", OPERATOR_NAMESPACE, "--replicas=1")
        plane.kubectl(
            "rollout",
            "status",
            deployment,
            "-n",
            OPERATOR_NAMESPACE,
            "--timeout=120s",
            timeout=150,
        )


def _without_policy(scenario: Scenario, namespace: str, name: str, check: Callable[[], str]) -> str:
    """Delete NetworkPolicy ``name``, wait for ``check`` to see the traffic pass, put the
    policy back exactly as it was, and wait for ``check`` to be blocked again."""
    plane = scenario.plane
    saved = json.loads(
        plane.kubectl("get", "networkpolicy", name, "-n", namespace, "-o", "json").stdout
    )
    metadata = saved["metadata"]
    restored = {
        "apiVersion": saved["apiVersion"],
        "kind": saved["kind"],
        "metadata": {
            key: metadata[key]
            for key in ("name", "namespace", "labels", "annotations", "ownerReferences")
            if key in metadata
        },
        "spec": saved["spec"],
    }
    plane.kubectl("delete", "networkpolicy", name, "-n", namespace)
    try:
        opened = poll(
            f"traffic to pass without NetworkPolicy {namespace}/{name}",
            lambda: "open" if check() == "open" else None,
            deadline=30,
            interval=0.5,
        )
    finally:
        plane.kubectl("create", "-f", "-", input=json.dumps(restored))
    poll(
        f"traffic to be blocked again with NetworkPolicy {namespace}/{name}",
        lambda: True if check() == "blocked" else None,
        deadline=30,
        interval=0.5,
    )
    return opened


def test_network_policies_hold_by_traffic(
    scenario: Scenario, executor_pod: None, capsys: pytest.CaptureFixture[str]
) -> None:
    plane = scenario.plane
    image = str(_executor_container(scenario)["image"])
    port = _executor_port(scenario)
    plane.kubectl("create", "namespace", OUTSIDER, check=False)
    agent = pods.Prober.start(plane, name="probe-agent", namespace=AGENTS, image=image)
    outsider = pods.Prober.start(plane, name="probe-outsider", namespace=OUTSIDER, image=image)
    try:
        executor_ip = pods.pod_ip(plane, f"{EXECUTOR}-0", NAMESPACE)
        provider_ip = scenario.backend.provider.cidrs[0].split("/")[0]
        provider_port = int(scenario.backend.provider.url.rsplit(":", 1)[1])
        dns = json.loads(
            plane.kubectl(
                "get", "pods", "-n", "kube-system", "-l", "k8s-app=kube-dns", "-o", "json"
            ).stdout
        )["items"]
        dns_ip = next(p["status"]["podIP"] for p in dns if p["status"].get("podIP"))

        def from_executor(host: str, port_: int) -> str:
            return pods.exec_connect(plane, f"{EXECUTOR}-0", NAMESPACE, host, port_)

        # What must pass (so a "blocked" below is the policy, not a dead network).
        assert agent.connect(executor_ip, port) == "open"
        assert outsider.connect(provider_ip, provider_port) == "open"
        assert from_executor(provider_ip, provider_port) == "open"
        resolved = plane.kubectl(
            "exec",
            f"{EXECUTOR}-0",
            "-n",
            NAMESPACE,
            "--",
            "python",
            "-c",
            "import socket,sys; print(socket.gethostbyname(sys.argv[1]))",
            scenario.backend.provider.url.split("//")[1].split(":")[0],
        ).stdout.strip()
        assert resolved == provider_ip
        agent_policy = next(
            p["metadata"]["name"]
            for p in json.loads(
                plane.kubectl("get", "networkpolicy", "-n", AGENTS, "-o", "json").stdout
            )["items"]
            if p["metadata"]["name"].endswith(f"{POLICY}-no-downstream")
        )
        checks = [
            (
                "an agent pod connects straight to the downstream",
                AGENTS,
                agent_policy,
                lambda: agent.connect(provider_ip, provider_port),
            ),
            (
                "a pod in a namespace no policy names connects to the executor",
                NAMESPACE,
                EXECUTOR,
                lambda: outsider.connect(executor_ip, port),
            ),
            (
                "the executor connects to CoreDNS on a port that is not DNS",
                NAMESPACE,
                EXECUTOR,
                lambda: from_executor(dns_ip, 8080),
            ),
            (
                "the executor connects to the API server (it does not need it)",
                NAMESPACE,
                EXECUTOR,
                lambda: from_executor("10.96.0.1", 443),
            ),
        ]
        for what, _, _, check in checks:
            assert check() == "blocked", what
        with _operator_paused(scenario):
            for what, namespace, name, check in checks:
                assert _without_policy(scenario, namespace, name, check) == "open"
                with capsys.disabled():
                    print(f"\nNetworkPolicy {namespace}/{name}: {what}: blocked; open without it")
    finally:
        agent.stop()
        outsider.stop()
        plane.kubectl("delete", "namespace", OUTSIDER, "--wait=false", check=False)


def _set_halt(scenario: Scenario, halted: bool, reason: str = "") -> None:
    spec: dict[str, Any] = {"halted": halted}
    if halted:
        spec["reason"] = reason
    scenario.plane.kubectl(
        "patch",
        "haltswitch",
        HALT_SWITCH,
        "-n",
        NAMESPACE,
        "--type=merge",
        "-p",
        json.dumps({"spec": spec}),
    )


def _diagnose(scenario: Scenario) -> None:
    switch = scenario.get("haltswitch", HALT_SWITCH) or {}
    config = scenario.get("configmap", f"{EXECUTOR}-config") or {}
    print("HaltSwitch status:", json.dumps(switch.get("status"), indent=1))
    print("ConfigMap keys:", sorted(config.get("data") or {}))
    print("executor:", scenario.backend.executor_tail(20))
    print("operator:", scenario.backend.operator_tail(40))


def _refusal_code(body: dict[str, Any]) -> str | None:
    """The code of a refusal: an error body's code, or a BLOCK answer's first reason code."""
    error = body.get("error") or {}
    if error.get("code"):
        return str(error["code"])
    codes = body.get("reason_codes") or []
    return str(codes[0]) if codes else None


def _ready_status(scenario: Scenario) -> int | None:
    """The executor's /ready status (503 while halted); None when it does not answer."""
    try:
        with urllib.request.urlopen(
            f"{scenario.backend.executor_url()}/ready",
            context=_executor_context(scenario),
            timeout=2,
        ) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as error:
        with error:
            return int(error.code)
    except (urllib.error.URLError, OSError):
        return None


def _wait_halted(scenario: Scenario, token: str) -> float:
    """Poll /ready (not proposals: those count against the agent's rate limit) until the
    executor reports halted, then check a proposal gets 503 EXECUTOR_HALTED."""
    started = time.monotonic()
    try:
        poll(
            "the executor to report halted",
            lambda: True if _ready_status(scenario) == 503 else None,
            deadline=10,
            interval=0.05,
        )
        elapsed = time.monotonic() - started
        status, body = scenario.post_proposal(token, f"halt-{uuid.uuid4().hex[:8]}")
        assert (status, _refusal_code(body)) == (503, "EXECUTOR_HALTED"), body
        assert body["executed"] is False
    except BaseException:
        _diagnose(scenario)
        raise
    return elapsed


def _resumed(scenario: Scenario) -> None:
    try:
        poll(
            "the executor to resume",
            lambda: True if _ready(scenario) else None,
            deadline=scenario.backend.deadlines.resume,
            interval=0.5,
        )
    except BaseException:
        _diagnose(scenario)
        raise


def test_halt_switch_stops_the_executor_and_is_acknowledged(
    scenario: Scenario, executor_pod: None
) -> None:
    token = _agent_token(scenario)
    before = len(scenario.received())
    _set_halt(scenario, True, "e2e: incident drill")
    elapsed = _wait_halted(scenario, token)
    # The issue asks for one second; measured and reported here, not asserted (no timed
    # assertions on a shared machine): see docs/testing.md.
    print(f"halt observed {elapsed:.2f} s after kubectl patch returned")
    assert len(scenario.received()) == before
    pod_name = scenario.backend.pod_name

    def acknowledged() -> dict[str, Any] | None:
        switch = scenario.get("haltswitch", HALT_SWITCH) or {}
        pods = (switch.get("status") or {}).get("pods") or []
        for pod in pods:
            if pod.get("pod") == pod_name and pod.get("acknowledged"):
                return dict(pod)
        return None

    ack = poll("the HaltSwitch acknowledgement", acknowledged, deadline=30)
    assert ack["policy"] == POLICY
    assert ack.get("at")
    switch = scenario.get("haltswitch", HALT_SWITCH)
    assert switch is not None
    assert switch["status"]["acknowledged"] == "1/1"
    table = scenario.plane.kubectl("get", "agentpolicies", "-n", NAMESPACE).stdout.splitlines()
    row = dict(zip(table[0].split(), table[1].split(), strict=False))
    poll(
        "the AgentPolicy's Halted column",
        lambda: True if _policy_column(scenario, "HALTED") == "true" else None,
        deadline=30,  # the HaltSwitch handler writes it (the 60 s timer is the backstop)
    )
    assert row["NAME"] == POLICY


def _policy_column(scenario: Scenario, column: str) -> str | None:
    table = scenario.plane.kubectl("get", "agentpolicies", "-n", NAMESPACE).stdout.splitlines()
    return dict(zip(table[0].split(), table[1].split(), strict=False)).get(column)


def test_unhalt_works_again(scenario: Scenario, executor_pod: None) -> None:
    token = _agent_token(scenario)
    _set_halt(scenario, False)
    _resumed(scenario)
    status, body = scenario.post_proposal(token, f"resume-{uuid.uuid4().hex[:8]}")
    assert status == 200, body
    assert body["outcome"] == "COMPLETED"


def test_a_restart_while_halted_starts_halted(scenario: Scenario, executor_pod: None) -> None:
    with _halt_lifted_on_failure(scenario):
        _restart_while_halted(scenario)


def _restart_while_halted(scenario: Scenario) -> None:
    token = _agent_token(scenario)
    _set_halt(scenario, True, "e2e: restart drill")
    _wait_halted(scenario, token)
    # The halt key is in the policy's ConfigMap, materialised as the halt file.
    config = scenario.get("configmap", f"{EXECUTOR}-config")
    assert config is not None
    assert "halt" in config["data"]
    # Local: the process is stopped and started again. kind: the pod is deleted and the
    # StatefulSet controller recreates it from the same template.
    scenario.backend.restart_executor()
    poll(
        "the restarted executor to listen",
        lambda: _ready_status(scenario),
        deadline=scenario.backend.deadlines.listening,
    )
    # Its very first answers: not ready, and proposals refused as halted.
    assert _ready_status(scenario) == 503
    first = _first_answer(scenario, token)
    assert first == (503, "EXECUTOR_HALTED"), scenario.backend.executor_tail()
    _set_halt(scenario, False)
    _resumed(scenario)


def test_a_pod_killed_mid_dispatch_reconciles_and_sends_nothing_twice(
    scenario: Scenario, executor_pod: None
) -> None:
    """The provider acts on the request and holds the answer; the pod is force-deleted
    meanwhile. Its replacement mounts the same claim, reconciles the open attempt at start
    (the provider's lookup says it acted: RECONCILED_COMPLETED) and never sends it again."""
    backend = scenario.backend
    assert isinstance(backend, KindBackend)
    provider = backend.provider
    assert provider.set_mode is not None
    token = _agent_token(scenario)
    claims = json.loads(scenario.plane.kubectl("get", "pvc", "-n", NAMESPACE, "-o", "json").stdout)[
        "items"
    ]
    (before,) = [c for c in claims if c["metadata"]["name"].endswith(f"{EXECUTOR}-0")]
    claim = before["metadata"]["name"]
    key = f"killed-{uuid.uuid4().hex[:8]}"
    provider.set_mode("hang")
    answers: list[Any] = []

    def propose() -> None:
        try:
            answers.append(scenario.post_proposal(token, key))
        except (urllib.error.URLError, OSError) as error:
            answers.append(error)  # the pod vanished under the request: no answer at all

    thread = threading.Thread(target=propose, daemon=True)
    try:
        thread.start()
        poll(
            "the provider to hold the request",
            lambda: True if key in provider.received() else None,
            deadline=30,
        )
        backend.restart_executor(force=True)
    finally:
        provider.set_mode("normal")
    thread.join(timeout=60)
    poll(
        "the replacement to answer /ready",
        lambda: True if _ready(scenario) else None,
        deadline=scenario.backend.deadlines.executor_ready,
    )
    after = scenario.get("pvc", claim)
    assert after is not None
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["spec"]["volumeName"] == before["spec"]["volumeName"]
    events = [
        json.loads(line)
        for line in backend.executor_tail(400).splitlines()
        if line.startswith("{") and "RECONCILIATION" in line
    ]
    assert any(e.get("resolution") == "RECONCILED_COMPLETED" for e in events), events
    status, body = scenario.post_proposal(token, key)
    assert status == 200, body
    assert body["outcome"] == "COMPLETED"
    assert provider.received().count(key) == 1


HALT_PROBE = """\
import json, os, ssl, sys, time, urllib.error, urllib.request
context = ssl.create_default_context(cafile="/var/run/executor-ca/ca.pem")
context.check_hostname = False  # pods by IP; the chain is still verified
ips = os.environ["IPS"].split(",")
port = os.environ["PORT"]
token = open("/var/run/agent/token").read().strip()

def ready(ip):
    try:
        with urllib.request.urlopen(f"https://{ip}:{port}/ready", context=context, timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return None

def propose(ip, key):
    body = {"proposal": {"action": "create_payout", "target": "payout:beneficiary-1",
            "parameters": {"amountMinor": 1200, "currency": "EUR"}}, "idempotency_key": key}
    request = urllib.request.Request(f"https://{ip}:{port}/v1/actions",
        data=json.dumps(body).encode(), method="POST",
        headers={"content-type": "application/json", "authorization": "Bearer " + token})
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as reply:
            return [reply.status, json.loads(reply.read())]
    except urllib.error.HTTPError as error:
        return [error.code, json.loads(error.read() or b"{}")]

deadline = time.time() + 60
while not all(ready(ip) == 200 for ip in ips):
    if time.time() > deadline:
        sys.exit("executors not ready")
    time.sleep(0.2)
# One idempotency key sent to every pod in turn: with a shared store, one execution.
shared = {ip: propose(ip, os.environ["SHARED_KEY"]) for ip in ips}
print(json.dumps({"shared": shared}), flush=True)
print("polling", flush=True)
first = {}
deadline = time.time() + 60
while len(first) < len(ips) and time.time() < deadline:
    for ip in ips:
        if ip not in first and ready(ip) == 503:
            first[ip] = time.time()
    time.sleep(0.01)
refusals = {ip: propose(ip, "halted-" + ip.replace(".", "-") + "-" + str(int(time.time())))
            for ip in ips}
print(json.dumps({"first_503": first, "refusals": refusals}), flush=True)
"""


@dataclass(frozen=True)
class SharedStore:
    """A PostgreSQL on the node's host, as the executor pods reach it."""

    server: PostgresServer
    database: str
    address: str
    port: int


@contextlib.contextmanager
def _host_postgres(scenario: Scenario, backend: str) -> Iterator[SharedStore | None]:
    """On the node: a real PostgreSQL started here, listening on the node's bridge address
    (``cluster.node.NODE_IP``, the pods' gateway) and admitting the pod network with a
    password; its URL in the Secret ``payouts-store`` that ``spec.store`` names. ``None`` on
    kind, whose pods reach no address of this host."""
    if backend != "node":
        yield None
        return
    from cluster.node import NODE_IP, NODE_PORTS, POD_CIDR

    password = uuid.uuid4().hex
    try:
        with postgres_server(listen=(NODE_IP,), port=free_port(avoid=NODE_PORTS)) as server:
            server.allow_network(POD_CIDR, password)
            database = "agentsafe_e2e"
            server.psql("postgres", f"CREATE DATABASE {database}")
            _apply_json(
                scenario.plane,
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": STORE_SECRET, "namespace": NAMESPACE},
                    "stringData": {
                        "url": f"postgresql://agentsafe:{password}@{NODE_IP}:{server.port}/"
                        f"{database}?connect_timeout=5"
                    },
                },
            )
            try:
                yield SharedStore(server, database, NODE_IP, server.port)
            finally:
                scenario.plane.kubectl(
                    "delete", "secret", STORE_SECRET, "-n", NAMESPACE, check=False
                )
    except PostgresUnavailable as exc:
        pytest.fail(f"the node's halt test needs PostgreSQL on the host: {exc}")


def _rolled_out(scenario: Scenario, replicas: int) -> None:
    """The StatefulSet at ``replicas``, every pod of its current revision ready."""

    def done() -> bool | None:
        sts = scenario.get("statefulset", EXECUTOR) or {}
        status = sts.get("status") or {}
        return (
            True
            if sts.get("spec", {}).get("replicas") == replicas
            and status.get("readyReplicas") == replicas
            and status.get("updatedReplicas") == replicas
            and status.get("currentRevision") == status.get("updateRevision")
            and status.get("observedGeneration") == sts["metadata"]["generation"]
            else None
        )

    try:
        poll(f"{replicas} executor pods of the new revision ready", done, deadline=300)
    except BaseException:
        print(scenario.backend.executor_tail(60))
        print(scenario.backend.operator_tail(40))
        raise
    scenario.backend.reach_again()  # pod 0 was replaced: forward to the new one


def _firewall_said(scenario: Scenario, egress: list[dict[str, Any]]) -> str:
    """For a NetworkPolicy change that traffic did not show: the egress the API holds against
    the one written, and what the node's firewall holds for executor pod 0
    (:func:`cluster.node.firewall_report`). Never raises: it is printed beside a failure."""
    from cluster.node import firewall_report

    try:
        policy = scenario.get("networkpolicy", EXECUTOR) or {}
        held = policy.get("spec", {}).get("egress")
        pod = scenario.get("pod", f"{EXECUTOR}-0") or {}
        address = str(pod.get("status", {}).get("podIP", ""))
        return "\n".join(
            [
                f"--- the API holds the egress written: {held == egress} "
                f"(resourceVersion {policy.get('metadata', {}).get('resourceVersion')})",
                f"--- the node's firewall for {EXECUTOR}-0 at {address or '(no IP)'} ---",
                firewall_report(address) if address else "(no pod IP)",
            ]
        )
    except Exception as exc:  # a report must not hide the failure it explains
        return f"(no firewall report: {exc!r})"


def _with_egress_replaced(
    scenario: Scenario,
    egress: list[dict[str, Any]],
    check: Callable[[], str],
    expect: str,
) -> None:
    """Replace the executor NetworkPolicy's egress with ``egress`` (the operator is paused),
    wait for ``check`` to say ``expect``, then put the policy back and wait for the opposite."""
    plane = scenario.plane
    saved = json.loads(
        plane.kubectl("get", "networkpolicy", EXECUTOR, "-n", NAMESPACE, "-o", "json").stdout
    )
    saved["metadata"].pop("resourceVersion", None)
    changed = json.loads(json.dumps(saved))
    changed["spec"]["egress"] = egress
    plane.kubectl("replace", "-f", "-", input=json.dumps(changed))
    other = "open" if expect == "blocked" else "blocked"
    try:
        poll(
            f"traffic {expect} with the executor's egress changed",
            lambda: True if check() == expect else None,
            deadline=30,
            interval=0.5,
        )
    except AssertionError:
        print(_firewall_said(scenario, egress))
        raise
    finally:
        plane.kubectl("replace", "-f", "-", input=json.dumps(saved))
    poll(
        f"traffic {other} again with the executor's own NetworkPolicy",
        lambda: True if check() == other else None,
        deadline=30,
        interval=0.5,
    )


def _prove_store_egress(
    scenario: Scenario, store: SharedStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """The executor NetworkPolicy's database rule is what lets pods reach PostgreSQL, and it
    lets nothing else through: another port on the same host address stays blocked."""
    plane = scenario.plane
    policy = scenario.get("networkpolicy", EXECUTOR) or {}
    egress = policy["spec"]["egress"]
    database_rule = {
        "to": [{"ipBlock": {"cidr": f"{store.address}/32"}}],
        "ports": [{"protocol": "TCP", "port": store.port}],
    }
    assert egress[-1] == database_rule, egress
    from cluster.node import NODE_PORTS

    # Off the NodePort range, which kube-router opens to pods on node addresses whatever the
    # policy (cluster.node.NODE_PORTS): there "blocked" could never be seen.
    assert store.port not in NODE_PORTS, store.port
    with contextlib.closing(socket.socket()) as other:
        # A listener beside the database on the same address.
        other.bind((store.address, free_port(avoid=NODE_PORTS)))
        other.listen(16)
        other_port = int(other.getsockname()[1])

        def database() -> str:
            return pods.exec_connect(plane, f"{EXECUTOR}-0", NAMESPACE, store.address, store.port)

        def beside() -> str:
            return pods.exec_connect(plane, f"{EXECUTOR}-0", NAMESPACE, store.address, other_port)

        assert database() == "open"
        assert beside() == "blocked"
        with _operator_paused(scenario):
            _with_egress_replaced(scenario, egress[:-1], database, "blocked")
            # The same address on another port is the policy's doing, not a dead listener.
            _with_egress_replaced(
                scenario,
                [*egress, {"to": database_rule["to"]}],
                beside,
                "open",
            )
    with capsys.disabled():
        print(
            f"\nNetworkPolicy {NAMESPACE}/{EXECUTOR}: the executor reaches PostgreSQL at "
            f"{store.address}:{store.port}; blocked without the store rule; port {other_port} "
            "on the same address blocked"
        )


def _patch_policy(
    plane: ControlPlane, spec: dict[str, Any], *, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """``kubectl patch`` the AgentPolicy's spec (a merge patch: ``None`` removes a field)."""
    return plane.kubectl(
        "patch",
        "agentpolicy",
        POLICY,
        "-n",
        NAMESPACE,
        "--type=merge",
        "-p",
        json.dumps({"spec": spec}),
        check=check,
    )


ONE_REPLICA_WITHOUT_STORE: dict[str, Any] = {"replicas": 1, "store": None}


@contextlib.contextmanager
def _off_the_store_on_failure(plane: ControlPlane, store: SharedStore | None) -> Iterator[None]:
    """On a failure with a shared store, the policy back at one replica without ``spec.store``
    before ``_host_postgres`` deletes the Secret the store names (entered after it, so left
    before it): a spec naming a missing Secret gets nothing rendered, and the next test would
    wait for the operator in vain. A failed restore is said, never raised over the failure."""
    try:
        yield
    except BaseException:
        if store is not None:
            try:
                restored = _patch_policy(plane, ONE_REPLICA_WITHOUT_STORE, check=False)
                error = restored.stderr.strip() if restored.returncode != 0 else ""
            except Exception as exc:  # kubectl timed out, or could not be run
                error = repr(exc)
            if error:
                print(f"[e2e] could not put {POLICY} back at one replica without a store: {error}")
        raise


def test_a_halt_switch_stops_every_executor_pod(
    scenario: Scenario, backend: str, executor_pod: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every executor pod of the selected policies; a probe pod beside the agent polls each every
    10 ms. The latency is from just before ``kubectl patch`` starts to the last pod's first 503
    (host and pods share one clock: it is one machine). Recorded, not asserted
    (docs/testing.md).

    Admission refuses ``replicas > 1`` without a shared store (replicas with their own stores
    would execute a retried idempotency key twice). On the node the policy then runs two
    replicas on a real PostgreSQL on the host (``spec.store``): the PodDisruptionBudget and the
    topology spread appear, the executor NetworkPolicy's database egress is proved by traffic,
    one idempotency key sent to both pods executes once, the halt stops both, and scaling back
    to one replica without the store removes the budget. On kind (no host address its pods
    reach) the policy stays at one replica."""
    plane = scenario.plane
    refused = _patch_policy(plane, {"replicas": 2}, check=False)
    assert refused.returncode != 0, "admission let replicas > 1 through without a shared store"
    assert "replicas > 1 needs store" in refused.stderr, refused.stderr
    with _host_postgres(scenario, backend) as store, _off_the_store_on_failure(plane, store):
        replicas = 1
        if store is not None:
            replicas = 2
            spec = {
                "replicas": replicas,
                "store": {
                    "secretKeyRef": {"name": STORE_SECRET, "key": "url"},
                    "cidrs": [f"{store.address}/32"],
                    "port": store.port,
                },
            }
            _patch_policy(plane, spec)
        _rolled_out(scenario, replicas)
        pdb = scenario.get("poddisruptionbudget", EXECUTOR)
        template = (scenario.get("statefulset", EXECUTOR) or {})["spec"]["template"]["spec"]
        if store is not None:
            assert pdb is not None, "two replicas get a PodDisruptionBudget"
            assert pdb["spec"]["maxUnavailable"] == 1, pdb
            assert len(template["topologySpreadConstraints"]) == 2, template
            for i in range(replicas):
                log = plane.kubectl("logs", f"{EXECUTOR}-{i}", "-n", NAMESPACE).stdout
                opened = [
                    json.loads(line)
                    for line in log.splitlines()
                    if line.startswith("{") and '"STORE_OPENED"' in line
                ]
                assert opened, log[-2000:]
                assert opened[-1]["backend"] == "postgresql", opened
            _prove_store_egress(scenario, store, capsys)
        else:
            assert pdb is None, "one replica needs no PodDisruptionBudget"
            assert "topologySpreadConstraints" not in template
        _halt_every_pod(scenario, replicas, capsys, store)
        if store is not None:
            _patch_policy(plane, ONE_REPLICA_WITHOUT_STORE)
            _rolled_out(scenario, 1)
            poll(
                "the PodDisruptionBudget to go with the second replica",
                lambda: True if scenario.get("poddisruptionbudget", EXECUTOR) is None else None,
                deadline=60,
            )


@contextlib.contextmanager
def _halt_lifted_on_failure(scenario: Scenario) -> Iterator[None]:
    """On a failure inside, the HaltSwitch lifted again (a no-op if it was never engaged): a
    halt left on would fail every test after this one for this one's cause. A failed lift is
    said, never raised over the failure."""
    try:
        yield
    except BaseException:
        try:
            _set_halt(scenario, False)
        except Exception as exc:  # kubectl failed or timed out
            print(f"[e2e] could not lift the HaltSwitch after the failure: {exc!r}")
        raise


def _halt_every_pod(
    scenario: Scenario,
    replicas: int,
    capsys: pytest.CaptureFixture[str],
    store: SharedStore | None,
) -> None:
    """:func:`_halt_and_check`, the HaltSwitch lifted again if it fails."""
    with _halt_lifted_on_failure(scenario):
        _halt_and_check(scenario, replicas, capsys, store)


def _halt_and_check(
    scenario: Scenario,
    replicas: int,
    capsys: pytest.CaptureFixture[str],
    store: SharedStore | None,
) -> None:
    plane = scenario.plane
    ips = [pods.pod_ip(plane, f"{EXECUTOR}-{i}", NAMESPACE) for i in range(replicas)]
    shared_key = f"shared-{uuid.uuid4().hex[:8]}"
    manifest = _agent_pod(
        scenario,
        "halt-probe",
        HALT_PROBE,
        {"IPS": ",".join(ips), "PORT": str(_executor_port(scenario)), "SHARED_KEY": shared_key},
    )
    pods.create(plane, manifest)
    try:
        poll(
            "the halt probe to see every pod ready",
            lambda: (
                True
                if "polling"
                in plane.kubectl("logs", "halt-probe", "-n", AGENTS, check=False).stdout
                else None
            ),
            deadline=120,
            interval=0.5,
        )
        started = time.time()
        _set_halt(scenario, True, "e2e: every pod")
        patched = time.time()
        phase = pods.wait_finished(plane, "halt-probe", AGENTS, deadline=120)
        log = pods.logs(plane, "halt-probe", AGENTS)
    finally:
        plane.kubectl("delete", "pod", "halt-probe", "-n", AGENTS, "--wait=false", check=False)
    assert phase == "Succeeded", log
    lines = [json.loads(line) for line in log.strip().splitlines() if line.startswith("{")]
    shared = lines[0]["shared"]
    result = lines[-1]
    # The one key: executed by the first pod, replayed by every other, sent once.
    answers = [shared[ip] for ip in ips]
    assert all(status == 200 for status, _ in answers), answers
    assert [body["outcome"] for _, body in answers] == ["COMPLETED"] * replicas, answers
    assert [bool(body.get("replayed")) for _, body in answers] == [False] + [True] * (
        replicas - 1
    ), answers
    assert scenario.received().count(shared_key) == 1
    if store is not None:
        rows = store.server.psql(
            store.database,
            f"SELECT state FROM idempotency WHERE key = '{shared_key}'",
        )
        assert rows.split() == ["DONE"], rows
    assert sorted(result["first_503"]) == sorted(ips), result
    for ip in ips:
        status, body = result["refusals"][ip]
        assert (status, _refusal_code(body)) == (503, "EXECUTOR_HALTED"), (ip, body)
        assert body["executed"] is False
    latency = max(result["first_503"].values()) - started
    record = {
        "pods": len(ips),
        "store": "postgresql" if store is not None else "sqlite",
        "patch_to_last_refusal_seconds": round(latency, 3),
        "kubectl_patch_seconds": round(patched - started, 3),
    }
    (scenario.workdir / "halt-latency.json").write_text(json.dumps(record))
    with capsys.disabled():
        print(f"\nhalt: every executor pod refused {latency:.3f} s after kubectl patch started")
        print(f"halt: {json.dumps(record)}")
    _set_halt(scenario, False)
    _resumed(scenario)


def _first_answer(scenario: Scenario, token: str) -> tuple[int, str] | None:
    try:
        status, body = scenario.post_proposal(token, f"restart-{uuid.uuid4().hex[:8]}")
    except (urllib.error.URLError, OSError):
        return None
    return status, str(_refusal_code(body))


def _gone(scenario: Scenario, kind: str, name: str) -> Callable[[], bool | None]:
    return lambda: True if scenario.get(kind, name) is None else None


def _get(scenario: Scenario, path: str, *, token: str) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"{scenario.backend.executor_url()}{path}",
        headers={"authorization": f"Bearer {token}"},
    )
    try:
        with urllib.request.urlopen(
            request, context=_executor_context(scenario), timeout=15
        ) as reply:
            return int(reply.status), json.loads(reply.read() or b"{}")
    except urllib.error.HTTPError as error:
        with error:
            return int(error.code), json.loads(error.read() or b"{}")


def test_two_workers_in_one_pod_share_the_port_and_execute_once(
    scenario: Scenario, executor_pod: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 18: ``spec.workers: 2`` reaches the pod as ``EXECUTOR_WORKERS=2``; from our image,
    under the enforced posture and the restricted profile, the supervisor runs two worker
    processes on one port. The control status names both; proposals over new connections reach
    both (their evidence lines say which worker wrote them) and each executes once; the
    rollout back to one worker (SIGTERM drains both) starts cleanly."""
    plane = scenario.plane
    _patch_policy(plane, {"workers": 2})
    try:

        def rendered() -> bool | None:
            env = {e["name"]: e.get("value") for e in _executor_container(scenario).get("env", [])}
            return True if env.get("EXECUTOR_WORKERS") == "2" else None

        # The patch is the AgentPolicy's: until the operator renders the StatefulSet anew, the
        # old one looks rolled out, and a forward to pod 0 would meet it being replaced.
        poll("the operator to render EXECUTOR_WORKERS=2", rendered, deadline=120)
        _rolled_out(scenario, 1)
        env = {e["name"]: e.get("value") for e in _executor_container(scenario).get("env", [])}
        assert env.get("EXECUTOR_WORKERS") == "2", env
        operator_token = _secret_token(scenario, NAMESPACE, f"{POLICY}-operator-token")

        def both_published() -> dict[str, Any] | None:
            try:  # the forward to the new pod may drop a connection or two as it settles
                status, body = _get(scenario, "/v1/control/status", token=operator_token)
            except (urllib.error.URLError, OSError):
                return None
            workers = body.get("workers") or []
            if status == 200 and len(workers) == 2 and all(w.get("ready") for w in workers):
                return body
            return None

        status = poll("both workers ready in the control status", both_published, deadline=60)
        pids = {w["pid"] for w in status["workers"]}
        assert len(pids) == 2, status["workers"]
        token = _agent_token(scenario)
        keys: list[str] = []
        intents: set[str] = set()

        def seen_by_both() -> bool | None:
            key = f"workers-{uuid.uuid4().hex[:8]}"
            try:
                answer, body = scenario.post_proposal(token, key)
            except (urllib.error.URLError, OSError):
                return None  # a dropped forward: no answer to check (its key is not counted)
            keys.append(key)
            assert answer == 200, (body, scenario.backend.executor_tail())
            assert body["outcome"] == "COMPLETED", body
            intents.add(str(body["intent_id"]))
            log = plane.kubectl("logs", f"{EXECUTOR}-0", "-n", NAMESPACE).stdout
            lines = [json.loads(x) for x in log.splitlines() if x.startswith("{")]
            # Whose OUTCOME line each of these proposals has: the worker that executed it.
            writers = {
                line.get("worker")
                for line in lines
                if line.get("event") == "OUTCOME" and line.get("intent_id") in intents
            }
            return True if writers == {0, 1} else None

        poll("proposals answered by both workers", seen_by_both, deadline=120, interval=0.2)
        received = scenario.received()
        assert all(received.count(key) == 1 for key in keys), keys
        with capsys.disabled():
            print(f"\nworkers: 2 worker processes (pids {sorted(pids)}), {len(keys)} proposals")
    finally:
        _patch_policy(plane, {"workers": None})

    def one_worker() -> bool | None:
        env = {e["name"]: e.get("value") for e in _executor_container(scenario).get("env", [])}
        return True if "EXECUTOR_WORKERS" not in env else None

    # As on the way there: until the operator renders the StatefulSet anew, the two-worker one
    # looks rolled out (a run on 2026-12-04 read its env before the operator had).
    poll("the operator to render one worker", one_worker, deadline=120)
    _rolled_out(scenario, 1)  # and the one-worker pod passed its readiness probe


def test_deleting_the_agent_policy_removes_its_children(scenario: Scenario) -> None:
    policy = scenario.get("agentpolicy", POLICY)
    assert policy is not None
    uid = policy["metadata"]["uid"]
    scenario.plane.kubectl(
        "delete", "agentpolicy", POLICY, "-n", NAMESPACE, "--wait=true", timeout=120
    )
    kinds = [
        "configmap",
        "statefulset",
        "service",
        "serviceaccount",
        "networkpolicy",
        "poddisruptionbudget",
    ]
    names = {"configmap": f"{EXECUTOR}-config"}
    if scenario.plane.garbage_collection:
        for kind in kinds:
            name = names.get(kind, EXECUTOR)
            poll(f"{kind}/{name} to be garbage-collected", _gone(scenario, kind, name), deadline=60)
    else:
        # No kube-controller-manager: the owner references are what a cluster's collector uses.
        for kind in kinds:
            child = scenario.get(kind, names.get(kind, EXECUTOR))
            if child is not None:
                assert any(o["uid"] == uid for o in child["metadata"]["ownerReferences"])
