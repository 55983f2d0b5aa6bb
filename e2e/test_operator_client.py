"""The operator's Kubernetes client and Secret watch against a real kube-apiserver on loopback.

What the unit tests (``tests/operator/test_kubeapi.py``, ``test_secret_watch.py``) cannot show,
shown here with the loopback control plane and no stand-in:

- an ``exec`` credential plugin in a kubeconfig (a script printing an ExecCredential with a
  ServiceAccount token) logs the operator's client in out of cluster, and that ServiceAccount,
  bound to exactly the generated ClusterRole (``render_rbac``), can do what the client does;
- a rotated projected token is used: the token file gets a new valid token, the old one is
  invalidated (it is bound to a Secret that is then deleted), and the client's next call
  succeeds (it loaded the file again on the 401) instead of resending the old token forever;
- the real ``agentsafe operator`` process, logged in through that exec plugin and holding only
  the generated RBAC, re-renders an AgentPolicy at once when a labelled Secret it uses changes:
  a Principal's rotated bearer token reaches the principals file while the drift timer is an
  hour away, so only the Secret watch can have done it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from cluster.control_plane import ControlPlane, free_port
from cluster.polling import poll

from agentsafe.operator.kubeapi import ApiError, KubeClient, Login
from agentsafe.operator.rbac import render_rbac
from agentsafe.operator.render.common import WATCH_LABEL
from agentsafe.operator.settings import FIELD_MANAGER

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples" / "k8s"
OPERATOR_SA = "agentsafe-operator"

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Operator:
    """A namespace for the operator's objects and a ServiceAccount holding its generated RBAC."""

    plane: ControlPlane
    namespace: str
    agents: str

    def token(self, *, bound_secret: str | None = None, duration: str = "1h") -> str:
        args = [
            "create",
            "token",
            OPERATOR_SA,
            "-n",
            self.namespace,
            "--duration",
            duration,
        ]
        if bound_secret is not None:
            args += ["--bound-object-kind", "Secret", "--bound-object-name", bound_secret]
        return self.plane.kubectl(*args).stdout.strip()

    def apply(self, obj: dict[str, Any]) -> None:
        self.plane.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(obj))

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        found = self.plane.kubectl(
            "get", kind, name, "-n", self.namespace, "-o", "json", check=False
        )
        if found.returncode != 0:
            assert "NotFound" in found.stderr, found.stderr
            return None
        result: dict[str, Any] = json.loads(found.stdout)
        return result


@pytest.fixture(scope="module")
def operator(control_plane: ControlPlane) -> Iterator[Operator]:
    suffix = uuid.uuid4().hex[:8]
    namespace, agents = f"opclient-{suffix}", f"opagents-{suffix}"
    for name in (namespace, agents):
        control_plane.kubectl("create", "namespace", name)
    for path in sorted((REPO / "crds").glob("*.yaml")):
        control_plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    for path in sorted((REPO / "crds").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                name = doc["metadata"]["name"]
                control_plane.kubectl(
                    "wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s"
                )
    control_plane.kubectl("create", "serviceaccount", OPERATOR_SA, "-n", namespace)
    rbac = render_rbac(
        service_account=OPERATOR_SA, namespace=namespace, name=f"agentsafe-operator-{suffix}"
    )
    for obj in rbac:
        control_plane.kubectl("apply", "-f", "-", input=json.dumps(obj))
    try:
        yield Operator(control_plane, namespace, agents)
    finally:
        for obj in rbac:
            control_plane.kubectl(
                "delete", obj["kind"], obj["metadata"]["name"], "--wait=false", check=False
            )
        for name in (namespace, agents):
            control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _exec_kubeconfig(plane: ControlPlane, workdir: Path, token_file: Path) -> Path:
    """A kubeconfig whose user is an exec credential plugin: a script printing an
    ExecCredential with the token in ``token_file`` (as a cloud CLI prints its own)."""
    plugin = workdir / "credential-plugin.py"
    plugin.write_text(
        textwrap.dedent(
            f"""\
            import json, os, pathlib, sys
            request = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
            assert request["kind"] == "ExecCredential", request
            token = pathlib.Path({str(token_file)!r}).read_text().strip()
            json.dump({{"apiVersion": "client.authentication.k8s.io/v1",
                        "kind": "ExecCredential", "status": {{"token": token}}}}, sys.stdout)
            """
        )
    )
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "loopback",
                "cluster": {"server": plane.server, "certificate-authority": str(plane.ca_cert)},
            }
        ],
        "users": [
            {
                "name": "operator",
                "user": {
                    "exec": {
                        "apiVersion": "client.authentication.k8s.io/v1",
                        "command": sys.executable,
                        "args": [str(plugin)],
                        "interactiveMode": "Never",
                    }
                },
            }
        ],
        "contexts": [{"name": "op", "context": {"cluster": "loopback", "user": "operator"}}],
        "current-context": "op",
    }
    path = workdir / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


async def test_an_exec_plugin_logs_the_client_in_with_the_generated_rbac(
    operator: Operator, tmp_path: Path
) -> None:
    token_file = tmp_path / "sa-token"
    token_file.write_text(operator.token())
    kubeconfig = _exec_kubeconfig(operator.plane, tmp_path, token_file)
    client = await KubeClient.connect(Login(environ={}, kubeconfig=str(kubeconfig)))
    try:
        assert await _once_served(client, "AgentPolicy", operator.namespace) == []
        jwks = await client.get_json("/openid/v1/jwks")
        assert jwks["keys"]
        config_map = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "exec-login", "namespace": operator.namespace},
            "data": {"k": "v"},
        }
        applied = await client.apply(config_map)
        managers = {m["manager"]: m["operation"] for m in applied["metadata"]["managedFields"]}
        assert managers == {FIELD_MANAGER: "Apply"}
        # Least privilege, seen from the API server: the generated role never updates Secrets.
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "exec-login", "namespace": operator.namespace},
            "stringData": {"k": "v"},
        }
        assert await client.create(secret) is True
        assert await client.create(secret) is False
        with pytest.raises(ApiError) as refused:
            await client.apply(secret)
        assert refused.value.status == 403
    finally:
        await client.close()


async def test_a_rotated_projected_token_is_used(operator: Operator, tmp_path: Path) -> None:
    """In-cluster login: the token file and CA the kubelet projects. The file's token is
    replaced and the old one invalidated; the client's next call succeeds."""
    plane = operator.plane
    for name in ("bound-1", "bound-2"):
        plane.kubectl("create", "secret", "generic", name, "-n", operator.namespace)
    old = operator.token(bound_secret="bound-1")
    token_file = tmp_path / "token"
    token_file.write_text(old)
    server = urlsplit(plane.server)
    login = Login(
        environ={
            "KUBERNETES_SERVICE_HOST": str(server.hostname),
            "KUBERNETES_SERVICE_PORT": str(server.port),
        },
        token_file=token_file,
        ca_file=plane.ca_cert,
    )
    assert login.in_cluster()
    client = await KubeClient.connect(login)
    try:
        await client.list_objects("Secret", operator.namespace, label_selector="none=none")
        assert client.logins == 1
        # The kubelet rotates: a new valid token in the file; then the old one stops working.
        token_file.write_text(operator.token(bound_secret="bound-2"))
        plane.kubectl("delete", "secret", "bound-1", "-n", operator.namespace)
        path = f"/api/v1/namespaces/{operator.namespace}/secrets"
        poll(
            "the old token to be refused",
            lambda: True if plane.get(path, token=old)[0] == 401 else None,
            deadline=60,
        )
        # The very next call succeeds: the 401 made the client read the file again.
        found = await client.list_objects("Secret", operator.namespace)
        assert {"bound-2"} <= {s["metadata"]["name"] for s in found}
        assert client.logins == 2
    finally:
        await client.close()


async def _once_served(client: KubeClient, kind: str, namespace: str) -> list[dict[str, Any]]:
    """The first list of a freshly established CRD: the API server answers 429 ("storage is
    (re)initializing") for a moment, as kopf would retry it."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return await client.list_objects(kind, namespace)
        except ApiError as error:
            if error.status != 429 or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.5)  # polling interval while the CRD's storage initializes


def _examples(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((EXAMPLES / name).read_text()) if doc]


def _secret(namespace: str, name: str, data: dict[str, str], *, watched: bool) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if watched:
        meta["labels"] = {WATCH_LABEL: "true"}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta,
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }


@contextlib.contextmanager
def _running_operator(operator: Operator, workdir: Path, kubeconfig: Path) -> Iterator[Path]:
    """``agentsafe operator`` as its own process (the console script, never ``python -m`` from
    the checkout), watching the test namespace; its log on failure."""
    log = workdir / "operator.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBE")}
    env.update(KUBECONFIG=str(kubeconfig), HOME=str(workdir))
    argv = [
        str(Path(sys.executable).parent / "agentsafe"),
        "operator",
        "--namespace",
        operator.namespace,
        "--operator-namespace",
        operator.namespace,
        "--reconcile-interval",
        "3600",  # the drift timer is an hour away: only the watch can act within the test
        "--priority",
        "100",
        "--liveness",
        f"http://127.0.0.1:{free_port()}/healthz",
        "--metrics-port",
        "0",  # never a fixed port on a shared machine
    ]
    with log.open("wb") as sink:
        process = subprocess.Popen(
            argv, cwd=workdir, env=env, stdout=sink, stderr=subprocess.STDOUT
        )
    try:
        yield log
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


def _principal_digest(operator: Operator, principal: str) -> str | None:
    config_map = operator.get("configmap", "payouts-executor-config")
    if config_map is None:
        return None
    document = json.loads(config_map["data"]["principals.json"])
    for entry in document["principals"]:
        if entry["id"] == principal:
            return str(entry["credential"].get("token_sha256"))
    return None


def _condition(operator: Operator, type_: str, reason: str) -> dict[str, Any] | None:
    """The AgentPolicy's condition ``type_`` when its reason is ``reason``, else ``None``."""
    policy = operator.get("agentpolicy", "payouts") or {}
    for condition in (policy.get("status") or {}).get("conditions") or []:
        if condition["type"] == type_ and condition["reason"] == reason:
            return dict(condition)
    return None


def test_a_labelled_secret_change_reconciles_at_once(operator: Operator, tmp_path: Path) -> None:
    ns, agents = operator.namespace, operator.agents
    token_file = tmp_path / "sa-token"
    token_file.write_text(operator.token())
    kubeconfig = _exec_kubeconfig(operator.plane, tmp_path, token_file)
    operator.apply(
        {
            "apiVersion": "kopf.dev/v1",
            "kind": "KopfPeering",
            "metadata": {"name": "agentsafe", "namespace": ns},
        }
    )
    first, rotated = "approver-token-first-0123456789abcdef", "approver-token-rotated-9876543210"
    for obj in (
        _secret(ns, "payouts-executor-tls", {"tls.crt": "-", "tls.key": "-"}, watched=True),
        _secret(ns, "payouts-downstream", {"token": "downstream-api-key"}, watched=True),
        _secret(ns, "treasury-lead-token", {"token": first}, watched=True),
    ):
        operator.apply(obj)
    (policy,) = _examples("30-agentpolicy.yaml")
    policy["metadata"]["namespace"] = ns
    policy["spec"]["agentNamespaces"] = [agents]
    principals = _examples("40-principals.yaml")
    for principal in principals:
        principal["metadata"]["namespace"] = ns
        if "serviceAccount" in principal["spec"]:
            principal["spec"]["serviceAccount"]["namespace"] = agents
        operator.apply(principal)
    operator.apply(policy)

    with _running_operator(operator, tmp_path, kubeconfig) as log:
        try:
            poll(
                "the AgentPolicy to be reconciled",
                lambda: _condition(operator, "Reconciled", "Applied"),
                deadline=120,
                interval=0.5,
            )
            digest = hashlib.sha256(first.encode()).hexdigest()
            assert _principal_digest(operator, "treasury-lead") == digest
            # The approver's token is rotated in its (labelled) Secret, and nothing else.
            operator.apply(_secret(ns, "treasury-lead-token", {"token": rotated}, watched=True))
            want = hashlib.sha256(rotated.encode()).hexdigest()
            poll(
                "the rotated bearer token's digest in the principals file",
                lambda: True if _principal_digest(operator, "treasury-lead") == want else None,
                deadline=30,
                interval=0.5,
            )
            # Deleting a watched Secret the policy uses is reported at once too.
            operator.plane.kubectl("delete", "secret", "payouts-downstream", "-n", ns)
            poll(
                "Reconciled=False with reason SecretMissing",
                lambda: _condition(operator, "Reconciled", "SecretMissing"),
                deadline=30,
                interval=0.5,
            )
        except AssertionError as error:
            raise AssertionError(f"{error}\n--- operator log\n{log.read_text()[-6000:]}") from None
