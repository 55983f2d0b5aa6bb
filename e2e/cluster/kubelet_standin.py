"""The one stand-in for a kubelet: run an executor exactly as its rendered pod would run.

Role: there is no kubelet (and no container runtime) on the local backend, so this module does
the kubelet's part for one pod of an operator-rendered StatefulSet, and nothing else:

* reads the StatefulSet the operator applied and takes its container's ``command`` and ``env``;
* materialises the pod's projected ConfigMap and Secret volumes into a temporary directory in
  the kubelet's own layout (a timestamped directory, an atomically swapped ``..data`` symlink,
  one symlink per key) with the volume's ``defaultMode``, and keeps them in sync with the API
  (so the operator's halt key appears and disappears as it would in a pod);
* gives ``emptyDir``/PVC mounts a fresh directory;
* rewrites the environment's mount paths to those directories and runs the command;
* publishes an EndpointSlice for the policy's Service so the operator's control calls reach the
  process, and reports the pod's readiness in the StatefulSet's status, as the endpoint-slice
  and StatefulSet controllers would (:meth:`StandInPod.publish`).

Differences from a real pod, each forced by this machine and named here:

* The process runs as root in the host's network namespace: ``AGENTSAFE_ENV`` is unset and
  ``EXECUTOR_POSTURE=DEVELOPMENT`` waives the non-root/read-only posture checks.
* It binds ``127.0.0.1`` instead of the pod IP. The API server refuses loopback IPs in
  EndpointSlices, so the slice is of ``addressType: FQDN`` naming ``<pod>`` under a reserved
  ``.test`` domain, which the operator process alone resolves to 127.0.0.1
  (``podnet/sitecustomize.py``: the stand-in for pod networking).
* The only downstream reachable here is a loopback one, which the egress guard refuses unless
  ``DOWNSTREAM_ALLOW_INSECURE_LOOPBACK=true`` (a development allowance).

Caller: ``e2e/test_scenario.py``.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from .control_plane import ControlPlane
from .podnet.sitecustomize import POD_DOMAIN

#: Environment the stand-in changes, and why (see the module docstring).
DEVELOPMENT_OVERRIDES: Mapping[str, str | None] = {
    "AGENTSAFE_ENV": None,
    "EXECUTOR_POSTURE": "DEVELOPMENT",
    "EXECUTOR_BIND_ADDRESS": "127.0.0.1",
    "DOWNSTREAM_ALLOW_INSECURE_LOOPBACK": "true",
}
SYNC_INTERVAL_SECONDS = 0.1


@dataclasses.dataclass(frozen=True)
class PodPlan:
    """What the kubelet would run for one pod: command, environment and volumes."""

    namespace: str
    statefulset: str
    pod_name: str
    service: str
    command: list[str]
    env: dict[str, str]
    mounts: dict[str, str]  # volume name -> mount path
    volumes: list[dict[str, Any]]
    port: int


def plan_from_statefulset(statefulset: Mapping[str, Any], *, ordinal: int = 0) -> PodPlan:
    meta = statefulset["metadata"]
    spec = statefulset["spec"]
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    env = {item["name"]: item["value"] for item in container.get("env", []) if "value" in item}
    mounts = {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}
    ports = [p["containerPort"] for p in container.get("ports", [])]
    return PodPlan(
        namespace=str(meta["namespace"]),
        statefulset=str(meta["name"]),
        pod_name=f"{meta['name']}-{ordinal}",
        service=str(spec.get("serviceName") or meta["name"]),
        command=list(container.get("command") or []) + list(container.get("args") or []),
        env=env,
        mounts=mounts,
        volumes=list(pod.get("volumes", [])),
        port=int(ports[0]) if ports else 8443,
    )


def _projected_files(
    plane: ControlPlane, namespace: str, volume: Mapping[str, Any]
) -> tuple[dict[str, bytes], int]:
    """Key path -> bytes for a projected (or plain configMap/secret) volume, and its mode."""
    if "projected" in volume:
        sources = volume["projected"].get("sources", [])
        mode = int(volume["projected"].get("defaultMode", 0o644))
    elif "configMap" in volume:
        sources, mode = (
            [{"configMap": volume["configMap"]}],
            int(volume["configMap"].get("defaultMode", 0o644)),
        )
    else:
        sources, mode = (
            [{"secret": volume["secret"]}],
            int(volume["secret"].get("defaultMode", 0o644)),
        )
    files: dict[str, bytes] = {}
    for source in sources:
        kind = "configmaps" if "configMap" in source else "secrets"
        ref = source.get("configMap") or source.get("secret") or {}
        name = ref.get("name") if "configMap" in source else ref.get("name", ref.get("secretName"))
        status, body = plane.get(f"/api/v1/namespaces/{namespace}/{kind}/{name}")
        if status == 404 and ref.get("optional"):
            continue
        if status != 200:
            raise RuntimeError(f"kubelet stand-in: {kind}/{name} -> HTTP {status}")
        obj = json.loads(body)
        data: dict[str, bytes] = {}
        if kind == "configmaps":
            data.update({k: v.encode() for k, v in (obj.get("data") or {}).items()})
            data.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
        else:
            data.update({k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()})
        items = ref.get("items")
        if items:
            for item in items:
                if item["key"] in data:
                    files[item["path"]] = data[item["key"]]
        else:
            files.update(data)
    return files, mode


def write_atomic_volume(target: Path, files: Mapping[str, bytes], mode: int) -> None:
    """The kubelet's atomic writer: a new timestamped dir, ``..data`` swapped, key symlinks."""
    target.mkdir(parents=True, exist_ok=True)
    stamp = target / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{time.monotonic_ns()}"
    stamp.mkdir()
    for relative, content in files.items():
        path = stamp / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        path.chmod(mode)
    old = os.readlink(target / "..data") if (target / "..data").is_symlink() else None
    temporary = target / "..data_tmp"
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()
    temporary.symlink_to(stamp.name)
    temporary.replace(target / "..data")
    tops = {relative.split("/", 1)[0] for relative in files}
    for top in tops:
        link = target / top
        if not link.is_symlink():
            link.symlink_to(f"..data/{top}")
    for entry in target.iterdir():
        if entry.name.startswith(".."):
            continue
        if entry.name not in tops:
            entry.unlink()
    if old and old != stamp.name:
        shutil.rmtree(target / old, ignore_errors=True)


@dataclasses.dataclass
class StandInPod:
    plan: PodPlan
    root: Path
    paths: dict[str, Path]
    env: dict[str, str]
    log: Path
    generation: int = 1
    popen: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.plan.port}"

    def tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def publish(self, plane: ControlPlane, *, ready: bool) -> None:
        """Report the pod's readiness as the endpoint-slice and StatefulSet controllers would:
        the EndpointSlice condition and the StatefulSet's status replica counts."""
        plane.kubectl("apply", "-f", "-", input=json.dumps(_endpoint_slice(self.plan, ready=ready)))
        count = 1 if ready else 0
        status = {
            "status": {
                "observedGeneration": self.generation,
                "replicas": 1,
                "currentReplicas": 1,
                "updatedReplicas": 1,
                "readyReplicas": count,
                "availableReplicas": count,
            }
        }
        plane.kubectl(
            "patch",
            "statefulset",
            self.plan.statefulset,
            "-n",
            self.plan.namespace,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps(status),
        )

    def start(self) -> None:
        script = Path(sys.executable).with_name(self.plan.command[0])
        argv = [str(script) if script.exists() else self.plan.command[0], *self.plan.command[1:]]
        with self.log.open("ab") as sink:
            self.popen = subprocess.Popen(
                argv,
                env=self.env,
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def stop(self, *, grace: float = 15.0) -> None:
        popen, self.popen = self.popen, None
        if popen is None or popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGTERM)
        try:
            popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGKILL)
            popen.wait(timeout=grace)


def _rewrite(value: str, mounts: Mapping[str, Path]) -> str:
    for mount_path in sorted(mounts, key=len, reverse=True):
        if value == mount_path or value.startswith(mount_path.rstrip("/") + "/"):
            return str(mounts[mount_path]) + value[len(mount_path) :]
    return value


def _endpoint_slice(plan: PodPlan, *, ready: bool) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{plan.service}-e2e-standin",
            "namespace": plan.namespace,
            "labels": {
                "kubernetes.io/service-name": plan.service,
                "endpointslice.kubernetes.io/managed-by": "e2e-kubelet-standin",
            },
        },
        "addressType": "FQDN",
        "endpoints": [
            {
                "addresses": [f"{plan.pod_name}{POD_DOMAIN}"],
                "conditions": {"ready": ready},
                "targetRef": {"kind": "Pod", "name": plan.pod_name, "namespace": plan.namespace},
            }
        ],
        "ports": [{"name": "https", "port": plan.port, "protocol": "TCP"}],
    }


@contextlib.contextmanager
def standin_pod(
    plane: ControlPlane, statefulset: Mapping[str, Any], *, root: Path
) -> Iterator[StandInPod]:
    """Materialise, sync and run one executor pod; publish its endpoint; stop it after."""
    plan = plan_from_statefulset(statefulset)
    root.mkdir(parents=True, exist_ok=True)
    volume_dirs: dict[str, Path] = {}
    synced: list[dict[str, Any]] = []
    for volume in plan.volumes:
        name = volume["name"]
        if name not in plan.mounts:
            continue
        directory = root / "volumes" / name
        volume_dirs[plan.mounts[name]] = directory
        if {"projected", "configMap", "secret"} & set(volume):
            files, mode = _projected_files(plane, plan.namespace, volume)
            write_atomic_volume(directory, files, mode)
            synced.append({"volume": volume, "dir": directory, "files": files, "mode": mode})
        else:  # emptyDir, or a PVC from volumeClaimTemplates: a fresh directory
            directory.mkdir(parents=True, exist_ok=True)
    for claim in statefulset["spec"].get("volumeClaimTemplates", []):
        name = claim["metadata"]["name"]
        if name in plan.mounts and plan.mounts[name] not in volume_dirs:
            directory = root / "volumes" / name
            directory.mkdir(parents=True, exist_ok=True)
            volume_dirs[plan.mounts[name]] = directory
    env = {key: _rewrite(value, volume_dirs) for key, value in plan.env.items()}
    for key, override in DEVELOPMENT_OVERRIDES.items():
        if override is None:
            env.pop(key, None)
        else:
            env[key] = override
    env["PATH"] = os.environ.get("PATH", "/usr/bin:/bin")
    pod = StandInPod(
        plan=plan,
        root=root,
        paths=volume_dirs,
        env=env,
        log=root / "executor.log",
        generation=int(statefulset["metadata"].get("generation") or 1),
    )

    stop = threading.Event()

    def sync() -> None:  # the kubelet's periodic volume refresh
        while not stop.wait(SYNC_INTERVAL_SECONDS):
            for entry in synced:
                try:
                    files, mode = _projected_files(plane, plan.namespace, entry["volume"])
                except (RuntimeError, OSError):
                    continue
                if files != entry["files"]:
                    write_atomic_volume(entry["dir"], files, mode)
                    entry["files"] = files

    syncer = threading.Thread(target=sync, name="kubelet-standin-sync", daemon=True)
    syncer.start()
    try:
        pod.publish(plane, ready=False)
        pod.start()
        yield pod
    finally:
        pod.stop()
        stop.set()
        syncer.join(timeout=5)
        plane.kubectl(
            "delete",
            "endpointslice",
            f"{plan.service}-e2e-standin",
            "-n",
            plan.namespace,
            "--ignore-not-found",
            check=False,
        )
