"""The scenario on a real cluster with a kubelet (``--backend=kind``; ``e2e/kind/run.sh``).

Role: nothing here stands in for Kubernetes. ``run.sh`` has built the agentsafe image, loaded
it into the kind nodes and installed the chart with helm; this backend

* checks the chart's operator Deployment is rolled out (it is the operator: no local process)
  and reads the executor image the operator renders (the chart's
  ``AGENTSAFE_OPERATOR_EXECUTOR_IMAGE``), which must be the image run.sh loaded;
* deploys the test's downstream, ``e2e/kind/provider.yaml``: the SYNTHETIC provider bound to
  its pod's loopback behind a TLS front (``e2e/kind/tls_front.py``) with a CA and certificate
  made here, stored as a Secret; the AgentPolicy's ``downstream.cidrs`` is that pod's IP only,
  so the executor's egress NetworkPolicy is exercised for real;
* waits for the operator's StatefulSet to roll out (real pods, real probes, a real PVC) and
  reaches pod 0 through ``kubectl port-forward`` (:mod:`port_forward`);
* restarts the executor by deleting its pod: the StatefulSet controller recreates it from the
  same template, with the same volumes (the halt key arrives through the ConfigMap volume).

Leftovers of an earlier run on a kept cluster (``KEEP_CLUSTER=1``) are deleted first, so every
run starts from the same state. Caller: ``e2e/test_scenario.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from .control_plane import ControlPlane
from .pki import issue_serving_pair
from .polling import poll
from .port_forward import PortForward
from .scenario_backend import Deadlines, Provider

REPO = Path(__file__).resolve().parents[2]
KIND_DIR = REPO / "e2e" / "kind"
PROVIDER_MANIFEST = KIND_DIR / "provider.yaml"
TLS_FRONT = KIND_DIR / "tls_front.py"
PROVIDER_NAMESPACE = "agentsafe-e2e-provider"
PROVIDER = "synthetic-provider"
PROVIDER_PORT = 8443
OPERATOR_SELECTOR = "app.kubernetes.io/name=agentsafe-operator"
#: Set by run.sh: the image it built and loaded into the nodes.
IMAGE_ENV = "AGENTSAFE_E2E_IMAGE"

# Real pods: image start, PVC provisioning, probes, and a kubelet's ConfigMap volume sync
# (about a minute) before the halt file leaves a pod.
DEADLINES = Deadlines(policy_ready=300, executor_ready=300, listening=180, resume=240)


class KindBackend:
    name = "kind"
    deadlines = DEADLINES

    def __init__(
        self,
        *,
        plane: ControlPlane,
        workdir: Path,
        operator_namespace: str,
        operator: str,
        executor_image: str,
        provider: Provider,
    ) -> None:
        self.plane = plane
        self.workdir = workdir
        self.operator_namespace = operator_namespace
        self.operator = operator
        self.executor_image = executor_image
        self.provider = provider
        self._namespace: str | None = None
        self._pod_name: str | None = None
        self._forward: PortForward | None = None

    # --- the executor pod -------------------------------------------------------------------

    @property
    def pod_name(self) -> str:
        if self._pod_name is None:
            raise AssertionError("the executor pod is not reached yet (start_executor first)")
        return self._pod_name

    @property
    def namespace(self) -> str:
        if self._namespace is None:
            raise AssertionError("the executor pod is not reached yet (start_executor first)")
        return self._namespace

    @contextlib.contextmanager
    def start_executor(
        self, statefulset: Mapping[str, Any], *, ready: Callable[[], bool]
    ) -> Iterator[None]:
        name = str(statefulset["metadata"]["name"])
        self._namespace = str(statefulset["metadata"]["namespace"])
        self._pod_name = f"{name}-0"
        (container,) = statefulset["spec"]["template"]["spec"]["containers"]
        # The operator renders the chart's executor image: the one run.sh loaded into the nodes
        # (imagePullPolicy IfNotPresent never pulls it from a registry).
        assert container["image"] == self.executor_image, (container["image"], self.executor_image)
        port = int(container["ports"][0]["containerPort"])
        timeout = f"{int(self.deadlines.executor_ready)}s"
        rollout = self.plane.kubectl(
            "rollout",
            "status",
            f"statefulset/{name}",
            "-n",
            self.namespace,
            f"--timeout={timeout}",
            check=False,
            timeout=self.deadlines.executor_ready + 30,
        )
        if rollout.returncode != 0:
            print(self.describe_executor())
            raise AssertionError(f"statefulset/{name} did not roll out:\n{rollout.stderr}")
        forward = PortForward(
            plane=self.plane,
            namespace=self.namespace,
            target=f"pod/{self._pod_name}",
            remote_port=port,
            log_dir=self.workdir / "port-forward",
        )
        self._forward = forward
        try:
            try:
                poll(
                    "the executor's /ready through kubectl port-forward",
                    lambda: True if ready() else None,
                    deadline=60,
                )
            except BaseException:
                print(self.describe_executor())
                raise
            yield
        finally:
            self._forward = None
            forward.close()

    def executor_url(self) -> str:
        if self._forward is None:
            raise AssertionError("the executor pod is not reached yet (start_executor first)")
        return f"https://localhost:{self._forward.local_port()}"

    def reach_again(self) -> None:
        """Pod 0 was replaced (a rollout): the next :meth:`executor_url` forwards to the new
        one."""
        if self._forward is not None:
            self._forward.close()

    def _pod(self) -> dict[str, Any] | None:
        result = self.plane.kubectl(
            "get", "pod", self.pod_name, "-n", self.namespace, "-o", "json", check=False
        )
        if result.returncode != 0:
            return None
        pod: dict[str, Any] = json.loads(result.stdout)
        return pod

    def restart_executor(self, *, force: bool = False) -> None:
        """Delete pod 0 (``force``: at once, no grace period: the container is killed
        mid-whatever-it-does) and wait for the StatefulSet to run its replacement."""
        before = self._pod()
        assert before is not None, f"pod {self.pod_name} is gone before its restart"
        old_uid = before["metadata"]["uid"]
        if self._forward is not None:
            self._forward.close()  # the next executor_url() forwards to the new pod
        how = ["--force", "--grace-period=0"] if force else ["--wait=true", "--timeout=120s"]
        self.plane.kubectl("delete", "pod", self.pod_name, "-n", self.namespace, *how)

        def recreated_and_running() -> bool | None:
            pod = self._pod()
            if pod is None or pod["metadata"]["uid"] == old_uid:
                return None
            if pod["metadata"].get("deletionTimestamp"):
                return None
            statuses = (pod.get("status") or {}).get("containerStatuses") or []
            running = bool(statuses) and all("running" in (s.get("state") or {}) for s in statuses)
            return True if running else None

        try:
            poll(
                f"the StatefulSet to recreate {self.pod_name}",
                recreated_and_running,
                deadline=self.deadlines.listening,
                interval=0.5,
            )
        except BaseException:
            print(self.describe_executor())
            raise

    def executor_tail(self, lines: int = 40) -> str:
        if self._pod_name is None:
            return "(no executor reached yet)"
        result = self.plane.kubectl(
            "logs", self.pod_name, "-n", self.namespace, f"--tail={lines}", check=False
        )
        return result.stdout + result.stderr

    def describe_executor(self) -> str:
        """The pod as the cluster sees it (events, probe failures) and its log, for failures."""
        if self._pod_name is None:
            return "(no executor pod yet)"
        describe = self.plane.kubectl(
            "describe", "pod", self.pod_name, "-n", self.namespace, check=False
        )
        forward = self._forward.log() if self._forward is not None else "(none)"
        return (
            f"{describe.stdout}{describe.stderr}\n--- log\n{self.executor_tail(60)}"
            f"\n--- port-forward\n{forward}"
        )

    def operator_tail(self, lines: int = 40) -> str:
        result = self.plane.kubectl(
            "logs",
            f"deployment/{self.operator}",
            "-n",
            self.operator_namespace,
            f"--tail={lines}",
            check=False,
        )
        return result.stdout + result.stderr


# --- setting the stage ----------------------------------------------------------------------


def _operator(plane: ControlPlane, namespace: str) -> tuple[str, str]:
    """The chart's operator Deployment (rolled out) and the executor image it renders."""
    found = json.loads(
        plane.kubectl(
            "get", "deployment", "-n", namespace, "-l", OPERATOR_SELECTOR, "-o", "json"
        ).stdout
    )["items"]
    names = [item["metadata"]["name"] for item in found]
    assert len(names) == 1, f"expected the chart's one operator Deployment in {namespace}: {names}"
    (deployment,) = found
    name = str(deployment["metadata"]["name"])
    plane.kubectl(
        "rollout", "status", f"deployment/{name}", "-n", namespace, "--timeout=180s", timeout=210
    )
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    config_maps = [
        source["configMapRef"]["name"]
        for source in container.get("envFrom") or []
        if "configMapRef" in source
    ]
    image = ""
    for config_map in config_maps:
        data = (
            json.loads(
                plane.kubectl("get", "configmap", config_map, "-n", namespace, "-o", "json").stdout
            ).get("data")
            or {}
        )
        image = data.get("AGENTSAFE_OPERATOR_EXECUTOR_IMAGE", image)
    assert image, f"the operator's ConfigMap names no executor image: {config_maps}"
    loaded = os.environ.get(IMAGE_ENV)
    if loaded:
        assert image == loaded, f"the operator renders {image}, run.sh loaded {loaded}"
    return name, image


def _delete_namespaces(plane: ControlPlane, namespaces: Sequence[str]) -> None:
    """Leftovers of an earlier run on a kept cluster; the operator still runs their finalizers."""
    plane.kubectl(
        "delete",
        "namespace",
        *namespaces,
        "--ignore-not-found",
        "--wait=true",
        "--timeout=300s",
        timeout=330,
    )


def _provider_objects(image: str, *, tls: Mapping[str, str]) -> list[dict[str, Any]]:
    objects = [doc for doc in yaml.safe_load_all(PROVIDER_MANIFEST.read_text()) if doc]
    for obj in objects:
        if obj["kind"] == "Deployment":
            for container in obj["spec"]["template"]["spec"]["containers"]:
                container["image"] = image
    namespace = [obj for obj in objects if obj["kind"] == "Namespace"]
    rest = [obj for obj in objects if obj["kind"] != "Namespace"]
    extra: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {"name": f"{PROVIDER}-tls", "namespace": PROVIDER_NAMESPACE},
            "stringData": dict(tls),
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"{PROVIDER}-front", "namespace": PROVIDER_NAMESPACE},
            "data": {TLS_FRONT.name: TLS_FRONT.read_text()},
        },
    ]
    return namespace + extra + rest


def _provider_pod(plane: ControlPlane) -> dict[str, Any] | None:
    pods = json.loads(
        plane.kubectl(
            "get",
            "pods",
            "-n",
            PROVIDER_NAMESPACE,
            "-l",
            f"app.kubernetes.io/name={PROVIDER}",
            "-o",
            "json",
        ).stdout
    )["items"]
    live = [
        pod
        for pod in pods
        if not pod["metadata"].get("deletionTimestamp")
        and (pod.get("status") or {}).get("phase") == "Running"
        and (pod.get("status") or {}).get("podIP")
    ]
    return live[0] if len(live) == 1 else None


@contextlib.contextmanager
def _in_cluster_provider(plane: ControlPlane, *, workdir: Path, image: str) -> Iterator[Provider]:
    host = f"{PROVIDER}.{PROVIDER_NAMESPACE}.svc"
    pair = issue_serving_pair(
        common_name=PROVIDER,
        dns_names=[host, f"{host}.cluster.local", "localhost"],
        ip_addresses=["127.0.0.1"],
    )
    tls = {
        "tls.crt": pair.cert_pem.decode(),
        "tls.key": pair.key_pem.decode(),
        "ca.crt": pair.ca_pem.decode(),
    }
    for obj in _provider_objects(image, tls=tls):
        plane.kubectl("apply", "-f", "-", input=json.dumps(obj))
    rollout = plane.kubectl(
        "rollout",
        "status",
        f"deployment/{PROVIDER}",
        "-n",
        PROVIDER_NAMESPACE,
        "--timeout=180s",
        check=False,
        timeout=210,
    )
    if rollout.returncode != 0:
        described = plane.kubectl(
            "describe", "pods", "-n", PROVIDER_NAMESPACE, "-l", f"app.kubernetes.io/name={PROVIDER}"
        )
        raise AssertionError(
            f"the provider did not roll out:\n{rollout.stderr}\n{described.stdout}"
        )
    pod = poll("the provider pod's IP", lambda: _provider_pod(plane), deadline=60)
    forward = PortForward(
        plane=plane,
        namespace=PROVIDER_NAMESPACE,
        target=f"pod/{pod['metadata']['name']}",
        remote_port=PROVIDER_PORT,
        log_dir=workdir / "port-forward",
    )
    context = ssl.create_default_context(cadata=pair.ca_pem.decode())

    def read_received() -> list[str] | None:
        url = f"https://localhost:{forward.local_port()}/_control/received"
        try:
            with urllib.request.urlopen(url, context=context, timeout=5) as reply:
                body = json.loads(reply.read())
        except (urllib.error.URLError, OSError):
            return None  # the forward heals on the next attempt
        return list(body.get("keys") or [])

    def received() -> list[str]:
        return poll("the provider's /_control/received", read_received, deadline=30)

    def post_mode(mode: str) -> bool | None:
        request = urllib.request.Request(
            f"https://localhost:{forward.local_port()}/_control/mode",
            data=json.dumps({"mode": mode}).encode(),
            headers={"content-type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, context=context, timeout=5) as reply:
                return True if reply.status == 200 else None
        except (urllib.error.URLError, OSError):
            return None  # the forward heals on the next attempt

    def set_mode(mode: str) -> None:
        poll(f"the provider's mode to become {mode}", lambda: post_mode(mode), deadline=30)

    try:
        yield Provider(
            url=f"https://{host}:{PROVIDER_PORT}",
            cidrs=(f"{pod['status']['podIP']}/32",),
            ca_pem=pair.ca_pem.decode(),
            received=received,
            set_mode=set_mode,
        )
    finally:
        forward.close()


@contextlib.contextmanager
def kind_backend(
    plane: ControlPlane,
    *,
    workdir: Path,
    operator_namespace: str,
    scenario_namespaces: Sequence[str],
) -> Iterator[KindBackend]:
    """The chart's operator, a fresh in-cluster provider; nothing to stop after but forwards."""
    _delete_namespaces(plane, [*scenario_namespaces, PROVIDER_NAMESPACE])
    operator, image = _operator(plane, operator_namespace)
    with _in_cluster_provider(plane, workdir=workdir, image=image) as provider:
        yield KindBackend(
            plane=plane,
            workdir=workdir,
            operator_namespace=operator_namespace,
            operator=operator,
            executor_image=image,
            provider=provider,
        )
