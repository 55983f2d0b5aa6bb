"""What of the kind backend can be checked without a kubelet: its provider and port-forwards.

The kind scenario (``cluster/kind_backend.py``) needs Docker and cannot run here, so its parts
that do not need a kubelet are checked on every backend:

* ``e2e/kind/provider.yaml`` is schema-valid for the pinned release (strict) and its pod passes
  Pod Security "restricted" as enforced by the real API server;
* the provider pod's two containers, run here from the objects the kind backend applies (their
  commands, the ConfigMap holding ``tls_front.py`` and the TLS Secret materialised as volumes,
  the pod's ports moved to free loopback ports): the synthetic provider binds loopback, the
  TLS front serves it with the test's certificate, and a payout posted through it arrives once;
* a port-forward to a pod that does not exist fails fast with kubectl's own message.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from cluster.build import KUBERNETES_VERSION
from cluster.control_plane import ControlPlane, free_port
from cluster.kind_backend import PROVIDER_MANIFEST, PROVIDER_NAMESPACE, _provider_objects
from cluster.pki import issue_serving_pair
from cluster.polling import poll
from cluster.port_forward import PortForward, PortForwardFailed

SCHEMA_VERSION = KUBERNETES_VERSION.lstrip("v").rsplit(".", 1)[0] + ".0"


def _manifest() -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(PROVIDER_MANIFEST.read_text()) if doc]


def _deployment(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = [obj for obj in objects if obj["kind"] == "Deployment"]
    return deployment


def test_provider_manifest_is_schema_valid() -> None:
    objects = _manifest()
    assert [obj["kind"] for obj in objects] == ["Namespace", "Service", "Deployment"]
    for obj in objects:
        kubernetes_validate.validate(obj, SCHEMA_VERSION, strict=True)
    service = next(obj for obj in objects if obj["kind"] == "Service")
    # Headless: the name resolves to the pod's IP, the one address downstream.cidrs allows.
    assert service["spec"]["clusterIP"] == "None"


def test_provider_objects_pass_the_api_server_and_pod_security_restricted(
    control_plane: ControlPlane,
) -> None:
    """Every object the kind backend applies (server-side dry run, in a fresh namespace with the
    manifest's Pod Security labels), and the pod itself under ``restricted`` enforcement."""
    namespace = f"provider-pss-{uuid.uuid4().hex[:6]}"
    control_plane.kubectl("create", "namespace", namespace)
    try:
        control_plane.kubectl(
            "label",
            "namespace",
            namespace,
            "pod-security.kubernetes.io/enforce=restricted",
            "pod-security.kubernetes.io/warn=restricted",
        )
        default_sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}
        control_plane.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(default_sa))
        tls = {"tls.crt": "unused", "tls.key": "unused", "ca.crt": "unused"}
        objects = _provider_objects("agentsafe:e2e", tls=tls)
        assert [obj["kind"] for obj in objects] == [
            "Namespace",
            "Secret",
            "ConfigMap",
            "Service",
            "Deployment",
        ]
        template = _deployment(objects)["spec"]["template"]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "synthetic-provider", **template["metadata"]},
            "spec": template["spec"],
        }
        for obj in [*objects[1:], pod]:
            obj["metadata"]["namespace"] = namespace
            # PodSecurity refuses a violating pod and warns about a violating Deployment.
            result = control_plane.kubectl(
                "create", "--dry-run=server", "-f", "-", input=json.dumps(obj), check=False
            )
            assert result.returncode == 0, (obj["kind"], result.stderr)
            assert "PodSecurity" not in result.stderr, (obj["kind"], result.stderr)
    finally:
        control_plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def _volume_files(objects: list[dict[str, Any]], volume: Mapping[str, Any]) -> dict[str, str]:
    """A configMap or secret volume's files, as a kubelet would write them."""
    if "configMap" in volume:
        kind, name, field = "ConfigMap", volume["configMap"]["name"], "data"
    else:
        kind, name, field = "Secret", volume["secret"]["secretName"], "stringData"
    (source,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert source["metadata"]["namespace"] == PROVIDER_NAMESPACE
    return dict(source[field])


class _Containers:
    """The provider pod's containers as local processes on free loopback ports."""

    def __init__(self, workdir: Path, objects: list[dict[str, Any]]) -> None:
        self.upstream_port = free_port()
        self.front_port = free_port()
        pod = _deployment(objects)["spec"]["template"]["spec"]
        mounts: dict[str, Path] = {}
        for volume in pod["volumes"]:
            directory = workdir / "volumes" / volume["name"]
            directory.mkdir(parents=True)
            for key, text in _volume_files(objects, volume).items():
                (directory / key).write_text(text)
            for container in pod["containers"]:
                for mount in container.get("volumeMounts") or []:
                    if mount["name"] == volume["name"]:
                        mounts[mount["mountPath"]] = directory
        self.argv: dict[str, list[str]] = {}
        for container in pod["containers"]:
            self.argv[container["name"]] = [
                self._rewrite(arg, mounts) for arg in container["command"]
            ]
        self.logs = {name: workdir / f"{name}.log" for name in self.argv}
        self.processes: list[subprocess.Popen[bytes]] = []

    def _rewrite(self, arg: str, mounts: Mapping[str, Path]) -> str:
        ports = {"8080": str(self.upstream_port), "8443": str(self.front_port)}
        if arg == "python":
            return sys.executable
        if arg in ports:
            return ports[arg]
        if arg == "0.0.0.0":
            return "127.0.0.1"  # the pod's address; here, loopback
        for mount_path, directory in mounts.items():
            if arg.startswith(mount_path + "/"):
                return str(directory / arg[len(mount_path) + 1 :])
        return arg

    def start(self) -> None:
        for name, argv in self.argv.items():
            with self.logs[name].open("wb") as sink:
                self.processes.append(
                    subprocess.Popen(
                        argv, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
                    )
                )

    def tail(self) -> str:
        return "\n".join(f"--- {n}\n{p.read_text(errors='replace')}" for n, p in self.logs.items())

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


@pytest.fixture
def provider_pod(tmp_path: Path) -> Iterator[tuple[_Containers, ssl.SSLContext]]:
    host = f"synthetic-provider.{PROVIDER_NAMESPACE}.svc"
    pair = issue_serving_pair(
        common_name="synthetic-provider", dns_names=[host, "localhost"], ip_addresses=[]
    )
    tls = {
        "tls.crt": pair.cert_pem.decode(),
        "tls.key": pair.key_pem.decode(),
        "ca.crt": pair.ca_pem.decode(),
    }
    containers = _Containers(tmp_path, _provider_objects("agentsafe:e2e", tls=tls))
    containers.start()
    try:
        yield containers, ssl.create_default_context(cadata=pair.ca_pem.decode())
    finally:
        containers.stop()


def _request(
    url: str, context: ssl.SSLContext, *, body: bytes | None = None, key: str | None = None
) -> tuple[int, dict[str, Any]]:
    headers = {"content-type": "application/json"} if body is not None else {}
    if key is not None:
        headers["idempotency-key"] = key
    request = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, context=context, timeout=5) as reply:
            return int(reply.status), json.loads(reply.read() or b"{}")
    except urllib.error.HTTPError as error:
        with error:
            return int(error.code), json.loads(error.read() or b"{}")


def test_the_provider_pod_serves_the_synthetic_provider_over_tls(
    provider_pod: tuple[_Containers, ssl.SSLContext],
) -> None:
    containers, context = provider_pod
    base = f"https://localhost:{containers.front_port}"

    def answers() -> int | None:
        try:
            return _request(f"{base}/", context)[0]
        except (urllib.error.URLError, OSError):
            return None

    try:
        assert poll("the TLS front and the synthetic provider", answers, deadline=30) == 200
    except BaseException:
        print(containers.tail())
        raise
    # The synthetic provider itself binds loopback only, unchanged.
    assert "--host" in containers.argv["synthetic"]
    assert containers.argv["synthetic"][containers.argv["synthetic"].index("--host") + 1] == (
        "127.0.0.1"
    )
    key = f"kind-{uuid.uuid4().hex[:8]}"
    payout = json.dumps({"amountMinor": 1200, "currency": "EUR"}).encode()
    status, body = _request(f"{base}/payouts", context, body=payout, key=key)
    assert status == 202, body
    assert str(body["reference"]).startswith("syn_")
    status, again = _request(f"{base}/payouts", context, body=payout, key=key)
    assert (status, again["reference"]) == (202, body["reference"])
    status, lookup = _request(f"{base}/payouts/{key}", context)
    assert (status, lookup["status"]) == (200, "executed")
    status, received = _request(f"{base}/_control/received", context)
    assert status == 200
    # Both requests arrived through the front; the provider acted once (one reference).
    assert (received["count"], received["keys"]) == (2, [key, key])
    # TLS only: a plain-http request to the front gets no HTTP answer.
    with pytest.raises((urllib.error.URLError, OSError)):
        urllib.request.urlopen(f"http://127.0.0.1:{containers.front_port}/", timeout=5)


def test_a_port_forward_to_a_missing_pod_fails_fast(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    forward = PortForward(
        plane=control_plane,
        namespace="default",
        target=f"pod/missing-{uuid.uuid4().hex[:6]}",
        remote_port=8443,
        log_dir=tmp_path,
    )
    try:
        with pytest.raises(PortForwardFailed, match=r"NotFound|not found"):
            forward.local_port()
    finally:
        forward.close()
    assert forward.starts == 1
