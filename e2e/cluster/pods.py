"""Pods the scenario starts itself on a real cluster: agents, probes and posture checks.

Role: the steps of ``e2e/test_scenario.py`` that need real pods (``--backend=node`` and
``--backend=kind``; the loopback backend has no kubelet) start them through these helpers:

* :func:`run_to_completion`: a pod that runs one Python program from the agentsafe image and
  exits; its log is the result (an agent proposing with its projected token, the halt-latency
  probe);
* :class:`Prober`: a long-running pod that ``kubectl exec`` runs TCP connection attempts in, so
  each NetworkPolicy check is traffic from a real pod in the namespace the policy names;
* :func:`pod_from_template`: a standalone pod from the operator's rendered executor template
  with one change (the posture proof).

Every pod runs as the image's non-root user with the restricted Pod Security settings unless
a step changes exactly that, and every wait is a poll with a deadline.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from .control_plane import ControlPlane
from .polling import poll

NONROOT = 65532

#: Attempts a TCP connection; prints ``open`` or ``blocked <error>`` (argv: host port timeout).
CONNECT = """\
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
    print("open")
except OSError as error:
    print("blocked", type(error).__name__)
"""


def restricted_container(name: str, image: str, command: Sequence[str]) -> dict[str, Any]:
    return {
        "name": name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": list(command),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "96Mi"}},
    }


def pod_manifest(
    name: str,
    namespace: str,
    container: Mapping[str, Any],
    *,
    service_account: str | None = None,
    volumes: Sequence[Mapping[str, Any]] = (),
    labels: Mapping[str, str] | None = None,
    restart: str = "Never",
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": restart,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 1,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": NONROOT,
            "runAsGroup": NONROOT,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [dict(container)],
        "volumes": [dict(v) for v in volumes],
    }
    if service_account:
        spec["serviceAccountName"] = service_account
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(labels or {"app.kubernetes.io/part-of": "agentsafe-e2e"}),
        },
        "spec": spec,
    }


def _pod(plane: ControlPlane, name: str, namespace: str) -> dict[str, Any] | None:
    result = plane.kubectl("get", "pod", name, "-n", namespace, "-o", "json", check=False)
    if result.returncode != 0:
        return None
    found: dict[str, Any] = json.loads(result.stdout)
    return found


def describe(plane: ControlPlane, name: str, namespace: str) -> str:
    described = plane.kubectl("describe", "pod", name, "-n", namespace, check=False)
    logs = plane.kubectl("logs", name, "-n", namespace, "--all-containers", check=False)
    return f"{described.stdout}{described.stderr}\n--- log\n{logs.stdout}{logs.stderr}"


def create(plane: ControlPlane, manifest: Mapping[str, Any]) -> None:
    name = manifest["metadata"]["name"]
    namespace = manifest["metadata"]["namespace"]
    plane.kubectl(
        "delete", "pod", name, "-n", namespace, "--ignore-not-found", "--wait=true", "--timeout=60s"
    )
    plane.kubectl("create", "-f", "-", input=json.dumps(manifest))


def wait_finished(plane: ControlPlane, name: str, namespace: str, *, deadline: float) -> str:
    """Wait until the pod's phase is Succeeded or Failed; return that phase."""

    def finished() -> str | None:
        pod = _pod(plane, name, namespace) or {}
        phase = (pod.get("status") or {}).get("phase")
        return str(phase) if phase in ("Succeeded", "Failed") else None

    try:
        return poll(f"pod {namespace}/{name} to finish", finished, deadline=deadline, interval=0.5)
    except BaseException:
        print(describe(plane, name, namespace))
        raise


def logs(plane: ControlPlane, name: str, namespace: str) -> str:
    return plane.kubectl("logs", name, "-n", namespace, "--all-containers").stdout


def run_to_completion(
    plane: ControlPlane, manifest: Mapping[str, Any], *, deadline: float = 120
) -> tuple[str, str]:
    """Create the pod, wait for it to exit, delete it; return its phase and its log."""
    create(plane, manifest)
    name = manifest["metadata"]["name"]
    namespace = manifest["metadata"]["namespace"]
    phase = wait_finished(plane, name, namespace, deadline=deadline)
    text = logs(plane, name, namespace)
    plane.kubectl("delete", "pod", name, "-n", namespace, "--wait=false", check=False)
    return phase, text


def wait_running(plane: ControlPlane, name: str, namespace: str, *, deadline: float = 120) -> str:
    """Wait until every container of the pod runs; return the pod's IP."""

    def running() -> str | None:
        pod = _pod(plane, name, namespace) or {}
        status = pod.get("status") or {}
        containers = status.get("containerStatuses") or []
        if containers and all(c.get("ready") for c in containers) and status.get("podIP"):
            return str(status["podIP"])
        return None

    try:
        return poll(f"pod {namespace}/{name} to run", running, deadline=deadline, interval=0.5)
    except BaseException:
        print(describe(plane, name, namespace))
        raise


def pod_ip(plane: ControlPlane, name: str, namespace: str) -> str:
    return wait_running(plane, name, namespace)


@dataclasses.dataclass
class Prober:
    """A pod that sleeps, so that connection attempts can be run inside it (``kubectl exec``)."""

    plane: ControlPlane
    name: str
    namespace: str
    container: str = "probe"

    @classmethod
    def start(cls, plane: ControlPlane, *, name: str, namespace: str, image: str) -> Prober:
        command = ["python", "-c", "import time\nwhile True: time.sleep(3600)"]
        manifest = pod_manifest(
            name, namespace, restricted_container("probe", image, command), restart="Always"
        )
        create(plane, manifest)
        wait_running(plane, name, namespace)
        return cls(plane=plane, name=name, namespace=namespace)

    def connect(self, host: str, port: int, *, timeout: float = 2.0) -> str:
        """``open`` or ``blocked``: one TCP connection attempt from this pod."""
        return exec_connect(
            self.plane,
            self.name,
            self.namespace,
            host,
            port,
            timeout=timeout,
            container=self.container,
        )

    def stop(self) -> None:
        self.plane.kubectl(
            "delete", "pod", self.name, "-n", self.namespace, "--wait=false", check=False
        )


def exec_connect(
    plane: ControlPlane,
    pod: str,
    namespace: str,
    host: str,
    port: int,
    *,
    timeout: float = 2.0,
    container: str | None = None,
) -> str:
    argv = ["exec", pod, "-n", namespace]
    if container:
        argv += ["-c", container]
    argv += ["--", "python", "-c", CONNECT, host, str(port), str(timeout)]
    result = plane.kubectl(*argv, timeout=timeout + 60)
    return result.stdout.strip().split()[0]


def pod_from_template(
    template: Mapping[str, Any], *, name: str, namespace: str, labels: Mapping[str, str]
) -> dict[str, Any]:
    """A standalone pod from a StatefulSet's pod template: its claims become emptyDirs (the
    StatefulSet's PVCs stay its own) and its labels are ``labels`` (no Service selects it)."""
    spec = copy.deepcopy(dict(template["spec"]))
    claimed = {v["name"] for v in spec.get("volumes") or []}
    for container in spec["containers"]:
        for mount in container.get("volumeMounts") or []:
            if mount["name"] not in claimed:
                spec.setdefault("volumes", []).append({"name": mount["name"], "emptyDir": {}})
                claimed.add(mount["name"])
    spec["restartPolicy"] = "Never"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": spec,
    }
