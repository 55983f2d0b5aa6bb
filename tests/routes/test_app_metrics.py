"""The application records each request's duration once: through ``observe_request`` the first
time it sees a route's labels, then on the histogram's child the metrics kept for them, observed
by the route itself (``ExecutorMetrics.kept_durations``); the counts are the same either way."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from agentsafe.executor.dispatch.seam import Outcome
from agentsafe.executor.host.metrics import ExecutorMetrics
from agentsafe.executor.policy.policy import Verdict
from agentsafe.executor.principals import Principal, Role, Scope
from agentsafe.executor.routes.app import Call, Route, build_app


class _AnyDoor:
    async def authenticate(
        self, request: web.Request, *, role: Role, scope: Scope | None
    ) -> Principal:
        return Principal(id="op-1", role=role, scopes=frozenset())


async def _ok(call: Call) -> web.StreamResponse:
    return web.json_response({})


async def _refused(call: Call) -> web.StreamResponse:
    return web.json_response({}, status=404)


async def test_a_route_observes_the_kept_child_after_the_first_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    metrics = ExecutorMetrics(verdicts=Verdict, outcomes=Outcome)
    rows = (
        Route("GET", "/ok", Role.OPERATOR, None, None, _ok),
        Route("GET", "/gone", Role.OPERATOR, None, None, _refused, answers={404: None}),
    )
    app = build_app(rows, door=_AnyDoor(), metrics=metrics)
    resolved: list[tuple[Any, ...]] = []
    observe_request = metrics.observe_request

    def recording(method: str, route: str, outcome: str, seconds: float) -> None:
        resolved.append((method, route, outcome))
        observe_request(method, route, outcome, seconds)

    monkeypatch.setattr(metrics, "observe_request", recording)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            for path in ("/ok", "/ok", "/gone", "/ok", "/gone"):
                async with session.get(server.make_url(path)) as response:
                    await response.read()
            assert resolved == [("GET", "/ok", "ok"), ("GET", "/gone", "refused")]
            assert metrics.request_count("GET", "/ok", "ok") == 3
            assert metrics.request_count("GET", "/gone", "refused") == 2

            metrics.declare_routes((row.method, row.path) for row in rows)  # forgets the kept
            async with session.get(server.make_url("/ok")) as response:
                await response.read()
            assert resolved[-1] == ("GET", "/ok", "ok")
            assert len(resolved) == 3
            assert metrics.request_count("GET", "/ok", "ok") == 4
    finally:
        await server.close()
