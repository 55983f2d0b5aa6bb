"""The end-to-end scenario: what a platform team and an agent do, against a real API server.

Local backend (CI): the chart is installed with helm (CRDs, RBAC, the operator's
ServiceAccount); the operator runs as a process authorized only by that ServiceAccount's RBAC;
the examples in ``examples/k8s/`` are applied with kubectl (plus the TLS Secret they name, and a
patch pointing the downstream at a loopback TLS provider and switching to ENFORCEMENT); the
executor runs exactly as the rendered pod would, through the one kubelet stand-in
(``cluster/kubelet_standin.py``, whose docstring lists its differences from a pod). An agent's
TokenRequest token drives it; a HaltSwitch stops it; deleting the AgentPolicy removes its
children (garbage-collected by kube-controller-manager, or — when it was not built — asserted
through their owner references).

The tests run in file order and share one module-scoped scenario: each step starts from where
the previous one left the cluster, as a person following the README would.
"""

from __future__ import annotations

import contextlib
import json
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from cluster.control_plane import ControlPlane
from cluster.kubelet_standin import StandInPod, standin_pod
from cluster.operator_process import OperatorProcess, running_operator
from cluster.pki import ServingPair, issue_serving_pair

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "agentsafe"
EXAMPLES = REPO / "examples" / "k8s"
RELEASE = "scenario"
OPERATOR_NAMESPACE = "agentsafe-system"
OPERATOR_SA = f"{RELEASE}-agentsafe-operator"
NAMESPACE = "payments"
AGENTS = "agents"
POLICY = "payouts"
EXECUTOR = f"{POLICY}-executor"
HALT_SWITCH = "stop-payouts"
AGENT_SA = "payout-agent"

T = TypeVar("T")

pytestmark = pytest.mark.slow


def poll(
    what: str, probe: Callable[[], T | None], *, deadline: float = 60.0, interval: float = 0.2
) -> T:
    """``probe()`` until it returns something other than None; fail after ``deadline``."""
    end = time.monotonic() + deadline
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > end:
            pytest.fail(f"timed out after {deadline:.0f} s waiting for {what}")
        time.sleep(interval)  # polling interval, not synchronisation


@dataclass
class Scenario:
    plane: ControlPlane
    workdir: Path
    operator: OperatorProcess
    executor_tls: ServingPair
    provider_url: str
    audience: str = ""
    pod: StandInPod | None = None

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
        context = ssl.create_default_context(cafile=str(self.workdir / "provider-ca.crt"))
        url = f"{self.provider_url}/_control/received"
        with urllib.request.urlopen(url, context=context, timeout=5) as reply:
            body = json.loads(reply.read())
        return list(body.get("keys") or [])

    def post_proposal(self, token: str, key: str, amount: int = 1200) -> tuple[int, dict[str, Any]]:
        assert self.pod is not None
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
    assert scenario.pod is not None
    request = urllib.request.Request(
        f"https://localhost:{scenario.pod.plan.port}{path}",
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
    assert scenario.pod is not None
    try:
        with urllib.request.urlopen(
            f"https://localhost:{scenario.pod.plan.port}/ready",
            context=_executor_context(scenario),
            timeout=2,
        ) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def _tls_provider(workdir: Path) -> Iterator[str]:
    pair = issue_serving_pair(
        common_name="provider", dns_names=["localhost"], ip_addresses=["127.0.0.1"]
    )
    _, cert, key = pair.write(workdir, "provider")
    port_file = workdir / "provider.port"
    log = (workdir / "provider.log").open("wb")
    script = Path(__file__).parent / "cluster" / "tls_provider.py"
    process = subprocess.Popen(
        [
            sys.executable,
            str(script),
            "--cert",
            str(cert),
            "--key",
            str(key),
            "--port-file",
            str(port_file),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    try:
        port = poll(
            "the TLS provider",
            lambda: port_file.read_text() if port_file.exists() else None,
            deadline=30,
        )
        yield f"https://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        log.close()


def _apply_json(plane: ControlPlane, obj: dict[str, Any]) -> None:
    plane.kubectl("apply", "-f", "-", input=json.dumps(obj))


@pytest.fixture(scope="module")
def scenario(
    control_plane: ControlPlane, backend: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Scenario]:
    if backend != "local":
        # Not written yet for kind: the operator would be the chart's Deployment, the executor a
        # real pod reached by port-forward, and the downstream an in-cluster TLS provider.
        pytest.skip("the scenario's kind variant is not written yet (docs/testing.md)")
    plane = control_plane
    workdir = tmp_path_factory.mktemp("scenario")
    plane.kubectl("create", "namespace", OPERATOR_NAMESPACE, check=False)
    plane.helm("install", RELEASE, str(CHART), "--namespace", OPERATOR_NAMESPACE)
    with contextlib.ExitStack() as stack:
        provider_url = stack.enter_context(_tls_provider(workdir))
        operator = stack.enter_context(
            running_operator(
                plane,
                namespace=OPERATOR_NAMESPACE,
                service_account=OPERATOR_SA,
                workdir=workdir / "operator",
            )
        )
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
                "data": {"ca.pem": (workdir / "provider-ca.crt").read_text()},
            },
        )
        plane.kubectl("apply", "-f", str(EXAMPLES))
        patch = {
            "spec": {
                "mode": "ENFORCEMENT",
                "downstream": {
                    "url": f"{provider_url}/payouts",
                    "lookupUrl": f"{provider_url}/payouts/{{idempotency_key}}",
                    "ca": {"name": "payouts-downstream-ca", "key": "ca.pem"},
                    "cidrs": ["127.0.0.1/32"],
                },
            }
        }
        plane.kubectl(
            "patch", "agentpolicy", POLICY, "-n", NAMESPACE, "--type=merge", "-p", json.dumps(patch)
        )
        yield Scenario(
            plane=plane,
            workdir=workdir,
            operator=operator,
            executor_tls=executor_tls,
            provider_url=provider_url,
        )


def _policy_condition(scenario: Scenario, type_: str, *, deadline: float = 120) -> dict[str, Any]:
    def true() -> dict[str, Any] | None:
        condition = scenario.condition("agentpolicy", POLICY, type_)
        if condition and condition["status"] == "True":
            return condition
        return None

    try:
        return poll(f"AgentPolicy payouts {type_}=True", true, deadline=deadline)
    except BaseException:
        print(scenario.operator.tail())
        policy = scenario.get("agentpolicy", POLICY) or {}
        print(json.dumps(policy.get("status"), indent=1)[:4000])
        raise


def test_the_operator_renders_every_child_with_owner_references(scenario: Scenario) -> None:
    _policy_condition(scenario, "Reconciled")
    # No executor pod runs yet, so the policy is honestly not ready.
    ready = scenario.condition("agentpolicy", POLICY)
    assert ready is not None
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
        "poddisruptionbudget": EXECUTOR,
        "networkpolicy": EXECUTOR,
    }
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
    sa = scenario.get("serviceaccount", EXECUTOR)
    assert sa is not None
    assert sa["automountServiceAccountToken"] is False


def test_printer_columns_show_mode_ready_halted(
    scenario: Scenario, executor_pod: StandInPod
) -> None:
    # The stand-in reported its pod ready; the operator's reconcile (timer) sees it.
    _policy_condition(scenario, "Ready", deadline=150)
    table = scenario.plane.kubectl("get", "agentpolicies", "-n", NAMESPACE).stdout.splitlines()
    header = table[0].split()
    assert header[:4] == ["NAME", "MODE", "READY", "HALTED"], table[0]
    row = dict(zip(header, table[1].split(), strict=False))
    assert row["NAME"] == POLICY
    assert row["MODE"] == "ENFORCEMENT"
    assert row["READY"] == "True"
    assert row["HALTED"] == "false"


def _start_pod(scenario: Scenario, root: Path) -> contextlib.AbstractContextManager[StandInPod]:
    statefulset = scenario.get("statefulset", EXECUTOR)
    assert statefulset is not None
    return standin_pod(scenario.plane, statefulset, root=root)


@pytest.fixture(scope="module")
def executor_pod(scenario: Scenario) -> Iterator[StandInPod]:
    _policy_condition(scenario, "Reconciled")
    with _start_pod(scenario, scenario.workdir / "pod-0") as pod:
        scenario.pod = pod
        try:
            poll("the executor's /ready", lambda: True if _ready(scenario) else None, deadline=60)
        except BaseException:
            print(pod.tail())
            raise
        pod.publish(scenario.plane, ready=True)
        yield pod
        scenario.pod = None


def _agent_token(scenario: Scenario, service_account: str = AGENT_SA) -> str:
    policy = scenario.get("agentpolicy", POLICY)
    assert policy is not None
    audience = str(policy["status"]["audience"])
    return scenario.plane.create_token(service_account, namespace=AGENTS, audience=audience)


def test_an_agent_proposal_executes_once(scenario: Scenario, executor_pod: StandInPod) -> None:
    token = _agent_token(scenario)
    key = f"e2e-{uuid.uuid4().hex[:8]}"
    status, body = scenario.post_proposal(token, key)
    assert status == 200, (body, executor_pod.tail())
    assert body["outcome"] == "COMPLETED"
    assert body["executed"] is True
    again_status, again = scenario.post_proposal(token, key)
    assert again_status == 200
    assert again["outcome"] == "COMPLETED"
    assert scenario.received().count(key) == 1


def test_another_service_account_is_refused(scenario: Scenario, executor_pod: StandInPod) -> None:
    scenario.plane.kubectl("create", "serviceaccount", "intruder", "-n", AGENTS, check=False)
    token = _agent_token(scenario, "intruder")
    status, body = scenario.post_proposal(token, f"intruder-{uuid.uuid4().hex[:8]}")
    assert status == 401, body
    assert "intruder" not in json.dumps(body)


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
    if scenario.pod is not None:
        print("executor:", scenario.pod.tail(20))
    print("operator:", scenario.operator.tail(40))


def _refusal_code(body: dict[str, Any]) -> str | None:
    """The code of a refusal: an error body's code, or a BLOCK answer's first reason code."""
    error = body.get("error") or {}
    if error.get("code"):
        return str(error["code"])
    codes = body.get("reason_codes") or []
    return str(codes[0]) if codes else None


def _ready_status(scenario: Scenario) -> int | None:
    """The executor's /ready status (503 while halted); None when it does not answer."""
    assert scenario.pod is not None
    try:
        with urllib.request.urlopen(
            f"https://localhost:{scenario.pod.plan.port}/ready",
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


def test_halt_switch_stops_the_executor_and_is_acknowledged(
    scenario: Scenario, executor_pod: StandInPod
) -> None:
    token = _agent_token(scenario)
    before = len(scenario.received())
    _set_halt(scenario, True, "e2e: incident drill")
    elapsed = _wait_halted(scenario, token)
    # The issue asks for one second; measured and reported here, not asserted (no timed
    # assertions on a shared machine): see docs/testing.md.
    print(f"halt observed {elapsed:.2f} s after kubectl patch returned")
    assert len(scenario.received()) == before

    def acknowledged() -> dict[str, Any] | None:
        switch = scenario.get("haltswitch", HALT_SWITCH) or {}
        pods = (switch.get("status") or {}).get("pods") or []
        for pod in pods:
            if pod.get("pod") == executor_pod.plan.pod_name and pod.get("acknowledged"):
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
        deadline=90,
    )
    assert row["NAME"] == POLICY


def _policy_column(scenario: Scenario, column: str) -> str | None:
    table = scenario.plane.kubectl("get", "agentpolicies", "-n", NAMESPACE).stdout.splitlines()
    return dict(zip(table[0].split(), table[1].split(), strict=False)).get(column)


def test_unhalt_works_again(scenario: Scenario, executor_pod: StandInPod) -> None:
    token = _agent_token(scenario)
    _set_halt(scenario, False)
    poll("the executor to resume", lambda: True if _ready(scenario) else None, deadline=30)
    status, body = scenario.post_proposal(token, f"resume-{uuid.uuid4().hex[:8]}")
    assert status == 200, body
    assert body["outcome"] == "COMPLETED"


def test_a_restart_while_halted_starts_halted(scenario: Scenario, executor_pod: StandInPod) -> None:
    token = _agent_token(scenario)
    _set_halt(scenario, True, "e2e: restart drill")
    _wait_halted(scenario, token)
    # The halt key is in the policy's ConfigMap, materialised as the halt file.
    config = scenario.get("configmap", f"{EXECUTOR}-config")
    assert config is not None
    assert "halt" in config["data"]
    executor_pod.stop()
    executor_pod.start()
    poll("the restarted executor to listen", lambda: _ready_status(scenario), deadline=60)
    # Its very first answers: not ready, and proposals refused as halted.
    assert _ready_status(scenario) == 503
    assert _first_answer(scenario, token) == (503, "EXECUTOR_HALTED"), executor_pod.tail()
    _set_halt(scenario, False)
    poll("the executor to resume", lambda: True if _ready(scenario) else None, deadline=30)


def _first_answer(scenario: Scenario, token: str) -> tuple[int, str] | None:
    try:
        status, body = scenario.post_proposal(token, f"restart-{uuid.uuid4().hex[:8]}")
    except (urllib.error.URLError, OSError):
        return None
    return status, str(_refusal_code(body))


def _gone(scenario: Scenario, kind: str, name: str) -> Callable[[], bool | None]:
    return lambda: True if scenario.get(kind, name) is None else None


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
