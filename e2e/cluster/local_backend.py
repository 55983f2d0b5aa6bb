"""The scenario on the loopback control plane (``--backend=local``, what CI runs).

Role: installs the chart with helm (CRDs, RBAC, the operator's ServiceAccount), runs the
operator as a process authorized only by that ServiceAccount's RBAC
(:mod:`operator_process`), serves the synthetic provider over TLS on loopback
(``tls_provider.py``), and runs the rendered executor pod through the one kubelet stand-in
(:mod:`kubelet_standin`, whose docstring lists its differences from a pod). Caller:
``e2e/test_scenario.py``.
"""

from __future__ import annotations

import contextlib
import json
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from .control_plane import ControlPlane
from .kubelet_standin import StandInPod, standin_pod
from .operator_process import OperatorProcess, running_operator
from .pki import issue_serving_pair
from .polling import poll
from .scenario_backend import Deadlines, Provider

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "agentsafe"
RELEASE = "scenario"

DEADLINES = Deadlines(policy_ready=30, executor_ready=60, listening=60, resume=30)


class LocalBackend:
    name = "local"
    deadlines = DEADLINES

    def __init__(
        self, *, plane: ControlPlane, workdir: Path, operator: OperatorProcess, provider: Provider
    ) -> None:
        self.plane = plane
        self.workdir = workdir
        self.operator = operator
        self.provider = provider
        self._pod: StandInPod | None = None

    @property
    def pod(self) -> StandInPod:
        if self._pod is None:
            raise AssertionError("the executor pod is not running (start_executor first)")
        return self._pod

    @property
    def pod_name(self) -> str:
        return self.pod.plan.pod_name

    @contextlib.contextmanager
    def start_executor(
        self, statefulset: Mapping[str, Any], *, ready: Callable[[], bool]
    ) -> Iterator[None]:
        with standin_pod(self.plane, statefulset, root=self.workdir / "pod-0") as pod:
            self._pod = pod
            try:
                poll(
                    "the executor's /ready",
                    lambda: True if ready() else None,
                    deadline=self.deadlines.executor_ready,
                )
            except BaseException:
                print(pod.tail())
                raise
            # What the endpoint-slice and StatefulSet controllers would report for a ready pod.
            pod.publish(self.plane, ready=True)
            try:
                yield
            finally:
                self._pod = None

    def executor_url(self) -> str:
        return f"https://localhost:{self.pod.plan.port}"

    def restart_executor(self) -> None:
        self.pod.stop()
        self.pod.start()

    def executor_tail(self, lines: int = 40) -> str:
        return self._pod.tail(lines) if self._pod is not None else "(no executor running)"

    def operator_tail(self, lines: int = 40) -> str:
        return self.operator.tail(lines)


@contextlib.contextmanager
def _tls_provider(workdir: Path) -> Iterator[Provider]:
    """The synthetic provider served over TLS on 127.0.0.1 by ``tls_provider.py``."""
    pair = issue_serving_pair(
        common_name="provider", dns_names=["localhost"], ip_addresses=["127.0.0.1"]
    )
    ca, cert, key = pair.write(workdir, "provider")
    port_file = workdir / "provider.port"
    log = (workdir / "provider.log").open("wb")
    script = Path(__file__).parent / "tls_provider.py"
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
        url = f"https://127.0.0.1:{port}"

        def received() -> list[str]:
            context = ssl.create_default_context(cafile=str(ca))
            with urllib.request.urlopen(
                f"{url}/_control/received", context=context, timeout=5
            ) as reply:
                body = json.loads(reply.read())
            return list(body.get("keys") or [])

        yield Provider(
            url=url, cidrs=("127.0.0.1/32",), ca_pem=pair.ca_pem.decode(), received=received
        )
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        log.close()


@contextlib.contextmanager
def local_backend(
    plane: ControlPlane, *, workdir: Path, operator_namespace: str
) -> Iterator[LocalBackend]:
    """Install the chart, start the provider and the operator; stop both after."""
    plane.kubectl("create", "namespace", operator_namespace, check=False)
    plane.helm("install", RELEASE, str(CHART), "--namespace", operator_namespace)
    with contextlib.ExitStack() as stack:
        provider = stack.enter_context(_tls_provider(workdir))
        operator = stack.enter_context(
            running_operator(
                plane,
                namespace=operator_namespace,
                service_account=f"{RELEASE}-agentsafe-operator",
                workdir=workdir / "operator",
            )
        )
        yield LocalBackend(plane=plane, workdir=workdir, operator=operator, provider=provider)
