"""``KubeClient`` and ``Login`` against a loopback HTTP stand-in for the API server.

What is checked is the client's side of the contract: server-side apply as a PATCH with
``application/apply-patch+yaml``, ``fieldManager`` and ``force``; create-once; paths from the
resource table; the API server's Status turned into ``ApiError`` and then kopf errors; and the
login: a kubeconfig's ``tokenFile``, ``exec`` plugin and ``oidc`` auth-provider each become the
bearer token sent, a 401 loads the credentials again (the file read again, the plugin run
again) and retries once, and kopf's ``ConnectionInfo`` gets the same credentials. The real API
server (an exec plugin's ServiceAccount token, a rotated projected token) is exercised by
``e2e/test_operator_client.py``.
"""

from __future__ import annotations

import base64
import json
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml
from aiohttp import web

from agentsafe.operator.handlers import to_kopf_error
from agentsafe.operator.kubeapi import (
    ApiError,
    CredentialsMissing,
    KubeClient,
    LoadedCredentials,
    Login,
    LoginFailed,
    connection_fields,
)
from agentsafe.operator.settings import FIELD_MANAGER


class ApiStandIn:
    """Records requests; answers 401 unless the bearer token is one of :attr:`accepted`."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.answers: dict[tuple[str, str], tuple[int, Any]] = {}
        self.accepted: set[str] = {"t0ken"}

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        auth = request.headers.get("Authorization")
        self.requests.append(
            {
                "method": request.method,
                "path": request.path,
                "query": dict(request.query),
                "content_type": request.headers.get("Content-Type"),
                "auth": auth,
                "body": json.loads(body) if body else None,
            }
        )
        if auth is None or auth.removeprefix("Bearer ") not in self.accepted:
            return web.json_response(
                {"kind": "Status", "reason": "Unauthorized", "message": "Unauthorized"},
                status=401,
            )
        status, answer = self.answers.get((request.method, request.path), (200, {"ok": True}))
        return web.json_response(answer, status=status)


@dataclass
class Served:
    stand_in: ApiStandIn
    server: str


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    stand_in = ApiStandIn()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", stand_in.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield Served(stand_in, f"http://127.0.0.1:{port}")
    finally:
        await runner.cleanup()


def _kubeconfig(path: Path, server: str, user: dict[str, Any]) -> Login:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path.write_text(yaml.safe_dump(config))
    return Login(environ={}, kubeconfig=str(path))


@pytest.fixture
async def api(served: Served, tmp_path: Path) -> AsyncIterator[tuple[ApiStandIn, KubeClient]]:
    login = _kubeconfig(tmp_path / "kubeconfig", served.server, {"token": "t0ken"})
    client = await KubeClient.connect(login)
    try:
        yield served.stand_in, client
    finally:
        await client.close()


async def test_apply_is_server_side_apply(api: tuple[ApiStandIn, KubeClient]) -> None:
    stand_in, client = api
    obj = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "payouts-executor", "namespace": "payments"},
    }
    await client.apply(obj)
    (request,) = stand_in.requests
    assert request["method"] == "PATCH"
    assert request["path"] == "/apis/apps/v1/namespaces/payments/statefulsets/payouts-executor"
    assert request["query"] == {"fieldManager": FIELD_MANAGER, "force": "true"}
    assert request["content_type"] == "application/apply-patch+yaml"
    assert request["auth"] == "Bearer t0ken"
    assert request["body"] == obj


async def test_create_once_and_get_missing(api: tuple[ApiStandIn, KubeClient]) -> None:
    stand_in, client = api
    path = "/api/v1/namespaces/payments/secrets"
    obj = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "payments"}}
    assert await client.create(obj) is True
    assert stand_in.requests[-1]["method"] == "POST"
    assert stand_in.requests[-1]["body"] == obj
    stand_in.answers[("POST", path)] = (
        409,
        {"kind": "Status", "reason": "AlreadyExists", "message": "exists"},
    )
    assert await client.create(obj) is False
    stand_in.answers[("GET", path + "/gone")] = (404, {"kind": "Status", "reason": "NotFound"})
    assert await client.get("Secret", "payments", "gone") is None


async def test_list_passes_the_label_selector(api: tuple[ApiStandIn, KubeClient]) -> None:
    stand_in, client = api
    stand_in.answers[("GET", "/apis/networking.k8s.io/v1/networkpolicies")] = (
        200,
        {"items": [{"metadata": {"name": "a"}}]},
    )
    items = await client.list_objects(
        "NetworkPolicy", None, label_selector="agentsafe.io/owner=x.y"
    )
    assert items == [{"metadata": {"name": "a"}}]
    assert stand_in.requests[-1]["query"] == {"labelSelector": "agentsafe.io/owner=x.y"}


async def test_status_patch_uses_the_subresource(api: tuple[ApiStandIn, KubeClient]) -> None:
    stand_in, client = api
    await client.patch_status(
        "AgentPolicy", "payments", "payouts", {"halted": True}, resource_version="7"
    )
    request = stand_in.requests[-1]
    assert (
        request["path"]
        == "/apis/agentsafe.io/v1alpha1/namespaces/payments/agentpolicies/payouts/status"
    )
    assert request["content_type"] == "application/merge-patch+json"
    assert request["body"] == {"status": {"halted": True}, "metadata": {"resourceVersion": "7"}}


async def test_delete_of_a_missing_object_is_quiet(api: tuple[ApiStandIn, KubeClient]) -> None:
    stand_in, client = api
    path = "/apis/policy/v1/namespaces/payments/poddisruptionbudgets/p"
    stand_in.answers[("DELETE", path)] = (404, {"kind": "Status", "reason": "NotFound"})
    await client.delete("PodDisruptionBudget", "payments", "p")
    assert stand_in.requests[-1]["method"] == "DELETE"


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (409, kopf.TemporaryError),
        (429, kopf.TemporaryError),
        (500, kopf.TemporaryError),
        (503, kopf.TemporaryError),
        (403, kopf.TemporaryError),
        (400, kopf.PermanentError),
        (422, kopf.PermanentError),
    ],
)
async def test_refusals_become_kopf_errors(
    api: tuple[ApiStandIn, KubeClient], status: int, kind: type
) -> None:
    stand_in, client = api
    path = "/api/v1/namespaces/payments/configmaps/c"
    stand_in.answers[("PATCH", path)] = (
        status,
        {"kind": "Status", "reason": "Because", "message": "refused"},
    )
    obj = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "c", "namespace": "payments"},
    }
    with pytest.raises(ApiError) as info:
        await client.apply(obj)
    assert (info.value.status, info.value.reason, info.value.message) == (
        status,
        "Because",
        "refused",
    )
    assert isinstance(to_kopf_error(info.value), kind)
    assert client.logins == 1  # only a 401 loads the credentials again


async def test_a_401_reads_a_rotated_token_file_and_retries_once(
    served: Served, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("old-token")
    served.stand_in.accepted = {"old-token"}
    login = _kubeconfig(tmp_path / "kubeconfig", served.server, {"tokenFile": str(token_file)})
    client = await KubeClient.connect(login)
    try:
        assert await client.get_json("/version") == {"ok": True}
        # Rotated: the file holds a new token and the API server refuses the old one.
        token_file.write_text("new-token")
        served.stand_in.accepted = {"new-token"}
        mark = len(served.stand_in.requests)
        assert await client.get_json("/version") == {"ok": True}
        assert [r["auth"] for r in served.stand_in.requests[mark:]] == [
            "Bearer old-token",
            "Bearer new-token",
        ]
        assert client.logins == 2
        # Refused with fresh credentials too: one retry, then the caller's ApiError (401);
        # the next call logs in again rather than resending the refused token forever.
        served.stand_in.accepted = set()
        with pytest.raises(ApiError) as info:
            await client.get_json("/version")
        assert info.value.status == 401
        assert to_kopf_error(info.value).delay == 60  # type: ignore[union-attr]
        token_file.write_text("newest-token")
        served.stand_in.accepted = {"newest-token"}
        assert await client.get_json("/version") == {"ok": True}
    finally:
        await client.close()


def _exec_plugin(tmp_path: Path, *, expires: str | None = None) -> dict[str, Any]:
    """A kubeconfig ``exec`` user whose plugin prints ``token-<n>``, n counting its runs."""
    counter = tmp_path / "runs"
    script = tmp_path / "plugin.py"
    status = {"token": "token-{n}"}
    if expires:
        status["expirationTimestamp"] = expires
    script.write_text(
        "import json, pathlib, sys\n"
        f"counter = pathlib.Path({str(counter)!r})\n"
        "n = int(counter.read_text()) + 1 if counter.exists() else 1\n"
        "counter.write_text(str(n))\n"
        "info = json.loads(__import__('os').environ['KUBERNETES_EXEC_INFO'])\n"
        "assert info['kind'] == 'ExecCredential'\n"
        f"status = json.loads({json.dumps(json.dumps(status))}.replace('{{n}}', str(n)))\n"
        "json.dump({'apiVersion': 'client.authentication.k8s.io/v1', "
        "'kind': 'ExecCredential', 'status': status}, sys.stdout)\n"
    )
    return {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": sys.executable,
            "args": [str(script)],
            "interactiveMode": "Never",
        }
    }


async def test_an_exec_plugin_token_is_used_and_rerun_after_a_401(
    served: Served, tmp_path: Path
) -> None:
    served.stand_in.accepted = {"token-1"}
    login = _kubeconfig(tmp_path / "kubeconfig", served.server, _exec_plugin(tmp_path))
    client = await KubeClient.connect(login)
    try:
        assert await client.get_json("/version") == {"ok": True}
        assert served.stand_in.requests[-1]["auth"] == "Bearer token-1"
        served.stand_in.accepted = {"token-2"}  # the plugin's first token expired
        assert await client.get_json("/version") == {"ok": True}
        assert served.stand_in.requests[-1]["auth"] == "Bearer token-2"
        assert (tmp_path / "runs").read_text() == "2"
    finally:
        await client.close()


async def test_kopf_gets_the_same_credentials(served: Served, tmp_path: Path) -> None:
    user = _exec_plugin(tmp_path, expires="2099-01-02T03:04:05Z")
    login = _kubeconfig(tmp_path / "kubeconfig", served.server, user)
    info = kopf.ConnectionInfo(**connection_fields(await login.load()))
    assert (info.server, info.scheme, info.token) == (served.server, "Bearer", "token-1")
    assert info.expiration is not None
    assert info.expiration.year == 2099
    assert info.as_http_headers()["Authorization"] == "Bearer token-1"
    # Loaded afresh for every kopf login: the plugin runs again.
    again = kopf.ConnectionInfo(**connection_fields(await login.load()))
    assert again.token == "token-2"


def _unsigned_jwt(claims: dict[str, Any]) -> str:
    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'RS256'})}.{part(claims)}.c2ln"


async def test_an_oidc_id_token_is_the_bearer(served: Served, tmp_path: Path) -> None:
    id_token = _unsigned_jwt({"sub": "operator", "exp": int(time.time()) + 3600})
    served.stand_in.accepted = {id_token}
    user = {
        "auth-provider": {
            "name": "oidc",
            "config": {
                "client-id": "agentsafe",
                "client-secret": "unused",
                "idp-issuer-url": "https://idp.invalid",
                "id-token": id_token,
                "refresh-token": "unused",
            },
        }
    }
    client = await KubeClient.connect(_kubeconfig(tmp_path / "kubeconfig", served.server, user))
    try:
        assert await client.get_json("/version") == {"ok": True}
        assert served.stand_in.requests[-1]["auth"] == f"Bearer {id_token}"
    finally:
        await client.close()


async def test_no_credentials_and_failing_credentials(tmp_path: Path) -> None:
    with pytest.raises(CredentialsMissing, match="set KUBECONFIG"):
        await Login(environ={"HOME": str(tmp_path)}).load()
    # A service account host without the token file is not a pod: the kubeconfig is looked for.
    with pytest.raises(CredentialsMissing):
        await Login(
            environ={"HOME": str(tmp_path), "KUBERNETES_SERVICE_HOST": "10.0.0.1"},
            token_file=tmp_path / "absent",
        ).load()
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": sys.executable,
            "args": ["-c", "import sys; sys.exit('plugin refused')"],
        }
    }
    login = _kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:9", user)
    with pytest.raises(LoginFailed, match="plugin refused"):
        await login.load()


def test_in_cluster_is_the_projected_token(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("projected")
    login = Login(environ={"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, token_file=token)
    assert login.in_cluster()
    assert not Login(environ={}, token_file=token).in_cluster()


async def test_credentials_that_stop_loading_are_a_401_for_the_steps(
    served: Served, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("old-token")
    served.stand_in.accepted = {"old-token"}
    login = _kubeconfig(tmp_path / "kubeconfig", served.server, {"tokenFile": str(token_file)})
    client = await KubeClient.connect(login)
    try:
        served.stand_in.accepted = set()
        (tmp_path / "kubeconfig").write_text("not: [a kubeconfig")
        with pytest.raises(ApiError) as info:
            await client.get_json("/version")
        assert info.value.status == 401
        assert isinstance(to_kopf_error(info.value), kopf.TemporaryError)
    finally:
        await client.close()


def test_a_client_certificate_login_reaches_kopf(tmp_path: Path) -> None:
    from kubernetes_asyncio.client import Configuration

    config = Configuration()
    config.host = "https://127.0.0.1:6443"
    config.ssl_ca_cert = str(tmp_path / "ca.crt")
    config.cert_file = str(tmp_path / "admin.crt")
    config.key_file = str(tmp_path / "admin.key")
    fields = connection_fields(LoadedCredentials(config, "kubeconfig"))
    assert fields["scheme"] is None
    assert fields["token"] is None
    assert fields["certificate_path"] == str(tmp_path / "admin.crt")
    assert fields["private_key_path"] == str(tmp_path / "admin.key")
    assert fields["insecure"] is False
    info = kopf.ConnectionInfo(**fields)
    assert "Authorization" not in info.as_http_headers()
