"""Run ``agentsafe operator`` as its own process against a control plane, as its ServiceAccount.

Role: the local backend's stand-in for the chart's Deployment. The process gets a kubeconfig
holding a TokenRequest token of the ServiceAccount the chart created, so every API call it makes
is authorized by the chart's RBAC — a permission the chart forgot fails the scenario. Caller:
``e2e/test_scenario.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import yaml

from .control_plane import ControlPlane, free_port


def operator_command() -> list[str]:
    """``agentsafe operator`` from this interpreter's environment (the chart's command)."""
    return [str(Path(sys.executable).with_name("agentsafe")), "operator"]


@dataclasses.dataclass(frozen=True)
class OperatorProcess:
    popen: subprocess.Popen[bytes]
    log: Path
    liveness: str

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def service_account_kubeconfig(
    plane: ControlPlane, path: Path, *, namespace: str, name: str
) -> Path:
    token = plane.create_token(
        name,
        namespace=namespace,
        audience="https://kubernetes.default.svc.cluster.local",
        duration="2h",
    )
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "e2e",
                "cluster": {"server": plane.server, "certificate-authority": str(plane.ca_cert)},
            }
        ],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": name}}],
        "current-context": "e2e",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


@contextlib.contextmanager
def running_operator(
    plane: ControlPlane,
    *,
    namespace: str,
    service_account: str,
    workdir: Path,
    deadline_seconds: float = 90.0,
) -> Iterator[OperatorProcess]:
    """Start the operator as ``service_account`` and wait until kopf's liveness answers."""
    workdir.mkdir(parents=True, exist_ok=True)
    kubeconfig = service_account_kubeconfig(
        plane, workdir / "operator.kubeconfig", namespace=namespace, name=service_account
    )
    port = free_port()
    liveness = f"http://127.0.0.1:{port}/healthz"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "AGENTSAFE_"))}
    env.update(
        # The pod-network stand-in: names of stand-in pods resolve to loopback (see its module).
        PYTHONPATH=str(Path(__file__).parent / "podnet"),
        KUBECONFIG=str(kubeconfig),
        AGENTSAFE_OPERATOR_NAMESPACE=namespace,
        POD_ID=f"e2e-operator-{port}",
    )
    log = workdir / "operator.log"
    with log.open("wb") as sink:
        popen = subprocess.Popen(
            # A free port for the rendered executors: the stand-in binds it on this machine, where
            # a fixed 8443 could be taken by anything else.
            [*operator_command(), f"--liveness={liveness}", f"--executor-port={free_port()}"],
            env=env,
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    process = OperatorProcess(popen=popen, log=log, liveness=liveness)
    try:
        _wait_live(process, deadline=time.monotonic() + deadline_seconds)
        yield process
    finally:
        if popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGTERM)
            try:
                popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(popen.pid, signal.SIGKILL)
                popen.wait(timeout=15)
        shutil.copy(log, workdir / "operator.last.log")


def _wait_live(process: OperatorProcess, *, deadline: float) -> None:
    while time.monotonic() < deadline:
        if process.popen.poll() is not None:
            code = process.popen.returncode
            raise RuntimeError(f"the operator exited with {code}:\n{process.tail()}")
        try:
            with urllib.request.urlopen(process.liveness, timeout=2) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)  # polling interval while the operator starts
    raise RuntimeError(f"the operator's liveness endpoint did not answer:\n{process.tail()}")
