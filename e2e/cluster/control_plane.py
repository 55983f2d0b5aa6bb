"""Start and stop a real etcd + kube-apiserver (+ optional kube-controller-manager) on loopback.

Role: the library behind the session fixture in ``e2e/conftest.py``. It writes a throwaway PKI,
starts etcd and kube-apiserver as child processes in a temporary directory, configures the
service-account issuer, signing key and audiences (so the TokenRequest API and
``/openid/v1/jwks`` work), writes an admin kubeconfig (client certificate in
``system:masters``; RBAC authorizes everyone else), waits for ``/readyz`` with a deadline, and
tears everything down. No containers and no kubelet: pods never run here.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from .build import Binaries, Tools
from .pki import ControlPlanePki, make_pki

SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
API_AUDIENCE = SERVICE_ACCOUNT_ISSUER
READY_DEADLINE_SECONDS = 180.0


class ControlPlaneError(RuntimeError):
    """A component did not start or become ready in time; the message carries its log tail."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclasses.dataclass
class _Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, *, grace: float = 10.0) -> None:
        if self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=grace)


def _spawn(name: str, argv: Sequence[str], *, workdir: Path) -> _Process:
    log = workdir / f"{name}.log"
    with log.open("wb") as sink:
        popen = subprocess.Popen(
            list(argv),
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return _Process(name=name, popen=popen, log=log)


@dataclasses.dataclass(frozen=True)
class ControlPlane:
    """A running control plane: where it listens and how to talk to it as the admin."""

    tools: Tools
    workdir: Path
    server: str
    kubeconfig: Path
    ca_cert: Path
    admin_cert: Path
    admin_key: Path
    garbage_collection: bool

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment for kubectl, helm and the operator: the admin kubeconfig only."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBE")}
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["HOME"] = str(self.workdir / "home")
        env["HELM_CACHE_HOME"] = str(self.workdir / "home" / "helm-cache")
        env["HELM_CONFIG_HOME"] = str(self.workdir / "home" / "helm-config")
        env["HELM_DATA_HOME"] = str(self.workdir / "home" / "helm-data")
        env.update(extra or {})
        return env

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return self._tool(self.tools.kubectl, args, input=input, check=check, timeout=timeout)

    def helm(
        self, *args: str, check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        return self._tool(self.tools.helm, args, input=None, check=check, timeout=timeout)

    def _tool(
        self,
        binary: Path,
        args: Sequence[str],
        *,
        input: str | None,
        check: bool,
        timeout: float,
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(binary), *args],
            input=input,
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"{binary.name} {' '.join(args)} exited {result.returncode}:\n"
                f"{result.stdout}\n{result.stderr}"
            )
        return result

    def ssl_context(self, *, admin: bool = True) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca_cert))
        if admin:
            context.load_cert_chain(str(self.admin_cert), str(self.admin_key))
        return context

    def get(self, path: str, *, token: str | None = None, admin: bool = True) -> tuple[int, bytes]:
        """GET ``path`` on the API server, as the admin or with a bearer ``token``."""
        request = urllib.request.Request(f"{self.server}{path}")
        if token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        context = self.ssl_context(admin=admin and token is None)
        try:
            with urllib.request.urlopen(request, context=context, timeout=30) as response:
                return int(response.status), bytes(response.read())
        except urllib.error.HTTPError as error:
            with error:
                return int(error.code), bytes(error.read())

    def get_json(self, path: str, **kwargs: Any) -> Any:
        status, body = self.get(path, **kwargs)
        if status != 200:
            raise AssertionError(f"GET {path} -> {status}: {body[:300]!r}")
        return json.loads(body)

    def create_token(
        self, service_account: str, *, namespace: str, audience: str, duration: str = "10m"
    ) -> str:
        """A TokenRequest token for ``service_account`` (``kubectl create token``)."""
        result = self.kubectl(
            "create",
            "token",
            service_account,
            "--namespace",
            namespace,
            "--audience",
            audience,
            "--duration",
            duration,
        )
        return result.stdout.strip()


def _write_kubeconfig(path: Path, *, server: str, pki: ControlPlanePki) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "agentsafe-e2e",
                "cluster": {"server": server, "certificate-authority": str(pki.ca_cert)},
            }
        ],
        "users": [
            {
                "name": "admin",
                "user": {
                    "client-certificate": str(pki.admin_cert),
                    "client-key": str(pki.admin_key),
                },
            }
        ],
        "contexts": [
            {"name": "agentsafe-e2e", "context": {"cluster": "agentsafe-e2e", "user": "admin"}}
        ],
        "current-context": "agentsafe-e2e",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)


def _wait_ready(
    server: str, pki: ControlPlanePki, processes: Sequence[_Process], *, deadline: float
) -> None:
    context = ssl.create_default_context(cafile=str(pki.ca_cert))
    context.load_cert_chain(str(pki.admin_cert), str(pki.admin_key))
    last = "no answer yet"
    while time.monotonic() < deadline:
        for process in processes:
            if process.popen.poll() is not None:
                raise ControlPlaneError(
                    f"{process.name} exited with {process.popen.returncode}:\n{process.tail()}"
                )
        try:
            with urllib.request.urlopen(f"{server}/readyz", context=context, timeout=5) as reply:
                if reply.status == 200:
                    return
                last = f"HTTP {reply.status}"
        except urllib.error.HTTPError as error:
            with error:
                last = f"HTTP {error.code}: {error.read()[-500:]!r}"
        except (urllib.error.URLError, OSError) as error:
            last = str(error)
        time.sleep(0.5)  # polling interval while waiting for readiness, not synchronisation
    tails = "\n".join(f"--- {p.name}\n{p.tail()}" for p in processes)
    raise ControlPlaneError(f"kube-apiserver not ready before the deadline ({last})\n{tails}")


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports: every probe stays bound until all are chosen."""
    with contextlib.ExitStack() as stack:
        probes = [
            stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            for _ in range(count)
        ]
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [int(probe.getsockname()[1]) for probe in probes]


_PORT_ATTEMPTS = 3
"""etcd starts on fresh ports this many times when a port it was given was taken meanwhile."""


def _start_etcd(
    binaries: Binaries, workdir: Path, processes: list[_Process], *, deadline: float
) -> int:
    """Start etcd and wait until it is healthy; returns its client port. A free port can be
    taken by another process between the probe and etcd's bind: that start is retried on new
    ports (any other failure is not)."""
    for attempt in range(_PORT_ATTEMPTS):
        client_port, peer_port = free_ports(2)
        data_dir = workdir / "etcd"
        shutil.rmtree(data_dir, ignore_errors=True)
        etcd = _spawn(
            "etcd",
            etcd_argv(
                binaries.etcd, data_dir=data_dir, client_port=client_port, peer_port=peer_port
            ),
            workdir=workdir,
        )
        processes.append(etcd)
        try:
            _wait_etcd(client_port, etcd, deadline=deadline)
        except ControlPlaneError as exc:
            taken = "address already in use" in str(exc)
            if not taken or attempt == _PORT_ATTEMPTS - 1:
                raise
            processes.remove(etcd)
            continue
        return client_port
    raise AssertionError("unreachable")


def _wait_etcd(port: int, process: _Process, *, deadline: float) -> None:
    while time.monotonic() < deadline:
        if process.popen.poll() is not None:
            code = process.popen.returncode
            raise ControlPlaneError(f"etcd exited with {code}:\n{process.tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as reply:
                if json.loads(reply.read()).get("health") == "true":
                    return
        except (urllib.error.URLError, OSError, ValueError):
            pass
        time.sleep(0.2)  # polling interval while waiting for readiness
    raise ControlPlaneError(f"etcd not healthy before the deadline:\n{process.tail()}")


def etcd_argv(binary: Path, *, data_dir: Path, client_port: int, peer_port: int) -> list[str]:
    client = f"http://127.0.0.1:{client_port}"
    peer = f"http://127.0.0.1:{peer_port}"
    return [
        str(binary),
        "--name=e2e",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=e2e={peer}",
        "--listen-metrics-urls=",
        "--log-level=warn",
        # A throwaway store: skipping fsync keeps a shared 2-core machine responsive.
        "--unsafe-no-fsync",
    ]


def apiserver_argv(
    binary: Path, *, pki: ControlPlanePki, etcd_port: int, secure_port: int, cert_dir: Path
) -> list[str]:
    return [
        str(binary),
        f"--etcd-servers=http://127.0.0.1:{etcd_port}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={secure_port}",
        f"--cert-dir={cert_dir}",
        f"--tls-cert-file={pki.serving_cert}",
        f"--tls-private-key-file={pki.serving_key}",
        f"--client-ca-file={pki.ca_cert}",
        "--authorization-mode=RBAC",
        "--anonymous-auth=false",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-key-file={pki.sa_public_key}",
        f"--service-account-signing-key-file={pki.sa_private_key}",
        f"--api-audiences={API_AUDIENCE}",
        "--service-cluster-ip-range=10.96.0.0/24",
        "--endpoint-reconciler-type=none",
        "--profiling=false",
        "--v=1",
    ]


def controller_manager_argv(binary: Path, *, kubeconfig: Path, secure_port: int) -> list[str]:
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        # Only what the suite needs: owner-reference garbage collection, namespace deletion and
        # the default ServiceAccount of each namespace (admission looks it up for pods).
        # No workload controllers, so a StatefulSet never turns into pods nobody would run.
        "--controllers=garbagecollector,namespace,serviceaccount",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        f"--secure-port={secure_port}",
        "--v=1",
    ]


@contextlib.contextmanager
def running_control_plane(
    binaries: Binaries,
    *,
    garbage_collection: bool = True,
    ready_deadline: float = READY_DEADLINE_SECONDS,
    keep_dir: bool = False,
) -> Iterator[ControlPlane]:
    """Start etcd, kube-apiserver and (when built) kube-controller-manager; stop them after."""
    workdir = Path(tempfile.mkdtemp(prefix="agentsafe-e2e-cp-"))
    processes: list[_Process] = []
    try:
        (workdir / "home").mkdir()
        pki = make_pki(workdir / "pki")
        started = time.monotonic()
        etcd_port = _start_etcd(binaries, workdir, processes, deadline=started + ready_deadline)
        secure_port = free_port()
        server = f"https://127.0.0.1:{secure_port}"
        apiserver = _spawn(
            "kube-apiserver",
            apiserver_argv(
                binaries.kube_apiserver,
                pki=pki,
                etcd_port=etcd_port,
                secure_port=secure_port,
                cert_dir=workdir / "apiserver-certs",
            ),
            workdir=workdir,
        )
        processes.append(apiserver)
        _wait_ready(server, pki, processes, deadline=started + ready_deadline)
        kubeconfig = workdir / "kubeconfig"
        _write_kubeconfig(kubeconfig, server=server, pki=pki)
        gc = garbage_collection and binaries.kube_controller_manager is not None
        if gc and binaries.kube_controller_manager is not None:
            processes.append(
                _spawn(
                    "kube-controller-manager",
                    controller_manager_argv(
                        binaries.kube_controller_manager,
                        kubeconfig=kubeconfig,
                        secure_port=free_port(),
                    ),
                    workdir=workdir,
                )
            )
        yield ControlPlane(
            tools=binaries.tools,
            workdir=workdir,
            server=server,
            kubeconfig=kubeconfig,
            ca_cert=pki.ca_cert,
            admin_cert=pki.admin_cert,
            admin_key=pki.admin_key,
            garbage_collection=gc,
        )
    finally:
        for process in reversed(processes):
            process.stop()
        if not keep_dir:
            shutil.rmtree(workdir, ignore_errors=True)


def _write_data(path: Path, data: str) -> Path:
    path.write_bytes(base64.b64decode(data))
    path.chmod(0o600)
    return path


@contextlib.contextmanager
def attached_cluster(kubeconfig: Path, tools: Tools) -> Iterator[ControlPlane]:
    """An existing cluster (``--backend=kind``): its current context's server and admin
    credentials (kind writes them inline as ``*-data``). Nothing is started or stopped."""
    config = yaml.safe_load(kubeconfig.read_text())
    context_name = config["current-context"]
    context = next(c["context"] for c in config["contexts"] if c["name"] == context_name)
    cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
    user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
    workdir = Path(tempfile.mkdtemp(prefix="agentsafe-e2e-attached-"))
    try:
        (workdir / "home").mkdir()
        yield ControlPlane(
            tools=tools,
            workdir=workdir,
            server=str(cluster["server"]),
            kubeconfig=kubeconfig,
            ca_cert=_write_data(workdir / "ca.crt", cluster["certificate-authority-data"]),
            admin_cert=_write_data(workdir / "admin.crt", user["client-certificate-data"]),
            admin_key=_write_data(workdir / "admin.key", user["client-key-data"]),
            # kind runs kube-controller-manager: dependents are really collected.
            garbage_collection=True,
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
