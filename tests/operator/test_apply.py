"""``KubeClient`` against a loopback HTTP stand-in for the API server (records requests).

What is checked is the client's side of the contract: server-side apply as a PATCH with
``application/apply-patch+yaml``, ``fieldManager`` and ``force``; create-once; paths from the
resource table; the API server's Status turned into ``ApiError`` and then kopf errors.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import kopf
import pytest
from aiohttp import web

from agentsafe.operator.apply import ApiError, KubeClient
from agentsafe.operator.handlers import to_kopf_error
from agentsafe.operator.settings import FIELD_MANAGER


class ApiStandIn:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.answers: dict[tuple[str, str], tuple[int, Any]] = {}

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.requests.append(
            {
                "method": request.method,
                "path": request.path,
                "query": dict(request.query),
                "content_type": request.headers.get("Content-Type"),
                "auth": request.headers.get("Authorization"),
                "body": json.loads(body) if body else None,
            }
        )
        status, answer = self.answers.get((request.method, request.path), (200, {"ok": True}))
        return web.json_response(answer, status=status)


@pytest.fixture
async def api() -> AsyncIterator[tuple[ApiStandIn, KubeClient]]:
    stand_in = ApiStandIn()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", stand_in.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    client = KubeClient(kopf.ConnectionInfo(server=f"http://127.0.0.1:{port}", token="t0ken"))
    try:
        yield stand_in, client
    finally:
        await client.close()
        await runner.cleanup()


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
    await client.patch_status("AgentPolicy", "payments", "payouts", {"halted": True})
    request = stand_in.requests[-1]
    assert (
        request["path"]
        == "/apis/agentsafe.io/v1alpha1/namespaces/payments/agentpolicies/payouts/status"
    )
    assert request["content_type"] == "application/merge-patch+json"
    assert request["body"] == {"status": {"halted": True}}


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
