"""The route table (``routes/table.py``) is the wire contract: the README lists the same rows,
and the application serves exactly them, each behind the door its row names.

The table is built with stand-ins for the services behind the handlers (the pipeline, the control
plane, the plan service, the use store): the rows are data, and these tests only read them or
drive the door and body checks in front of a handler, never the service.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from pydantic import BaseModel

from agentsafe.executor.clock import ManualClock
from agentsafe.executor.codes import Code
from agentsafe.executor.errors import RequestRejected
from agentsafe.executor.events import Streams
from agentsafe.executor.evidence.chain import ChainError
from agentsafe.executor.principals import Principal, Role, Scope
from agentsafe.executor.routes.app import AnyJson, Call, ReadyState, Route, build_app
from agentsafe.executor.routes.table import Approvals, route_table

REPO = Path(__file__).resolve().parents[2]
STAND_IN: Any = object()  # a service no test here calls


def every_route() -> tuple[Route, ...]:
    """The table with every optional section on (plans, approvals)."""
    return route_table(
        pipeline=STAND_IN,
        reconciler=STAND_IN,
        escalator=STAND_IN,
        readiness=lambda: ReadyState(ready=True, code=Code.READY, details={}),
        jwks=lambda: {"keys": []},
        plane=SimpleNamespace(streams=Streams.memory(), work_refusal=lambda: None),  # type: ignore[arg-type]
        plans=STAND_IN,
        approvals=Approvals(store=STAND_IN, streams=Streams.memory(), clock=ManualClock()),
    )


def readme_rows() -> list[tuple[str, str, str, str | None]]:
    """(method, path, role, scope) of every row of the README's wire-contract table."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("### The wire contract", 1)[1].split("\n### ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 5 or cells[0] in ("method", "---"):
            continue
        method, path, role, scope, _ = cells
        assert re.fullmatch(r"`[^`]+`", path), line
        rows.append((method, path.strip("`"), role, scope.strip("`") or None))
    return rows


def contract(route: Route) -> tuple[str, str, str, str | None]:
    role = route.role.value if route.role else "anyone"
    return (route.method, route.path, role, route.scope.value if route.scope else None)


def test_the_readme_lists_exactly_the_routes_the_table_serves() -> None:
    documented = readme_rows()
    served = [contract(route) for route in every_route()]
    assert len(set(documented)) == len(documented), "a README row appears twice"
    assert len(set(served)) == len(served), "a route appears twice in the table"
    assert sorted(documented) == sorted(served)


def test_every_role_and_scope_is_one_the_door_knows() -> None:
    for route in every_route():
        assert route.method in ("GET", "POST")
        assert route.scope is None or route.role is Role.OPERATOR, route.path
        if route.role is None:
            assert route.body is None, route.path


def test_a_get_reads_no_body_and_every_body_model_is_strict() -> None:
    for route in every_route():
        if route.method == "GET":
            assert route.body is None, route.path
        elif route.body is not None and not issubclass(route.body, AnyJson):
            assert issubclass(route.body, BaseModel)
            config = route.body.model_config
            assert (config.get("extra"), config.get("strict")) == ("forbid", True), route.path


def test_the_application_serves_the_table_and_nothing_else() -> None:
    rows = every_route()
    app = build_app(rows, door=RecordingDoor())
    registered = {
        (resource.method, resource.resource.canonical)
        for resource in app.router.routes()
        if resource.resource is not None and resource.method != "HEAD"
    }
    assert registered == {(route.method, route.path) for route in rows}


# ---------------------------------------------------------------- what build_app puts in front


class RecordingDoor:
    """Records what each route asks of the door; refuses a caller without a bearer token."""

    def __init__(self) -> None:
        self.asked: list[tuple[Role, Scope | None]] = []

    async def authenticate(
        self, request: web.Request, *, role: Role, scope: Scope | None
    ) -> Principal:
        self.asked.append((role, scope))
        if "Authorization" not in request.headers:
            raise RequestRejected(Code.AUTH_REQUIRED, "a credential is required")
        return Principal(id="caller-1", role=role, scopes=frozenset({scope} if scope else ()))


class Body(BaseModel):
    model_config = {"extra": "forbid", "strict": True}
    reason: str


async def echo(call: Call) -> web.StreamResponse:
    principal = call.principal.id if call.principal is not None else None
    body = call.body.model_dump() if call.body is not None else None
    return web.json_response({"principal": principal, "body": body})


ROWS = (
    Route("GET", "/open", None, None, None, echo),
    Route("POST", "/guarded", Role.OPERATOR, Scope.HALT, Body, echo, "the body must be a reason"),
    Route("POST", "/located", Role.PROPOSER, None, Body, echo),
)


@pytest.fixture
async def served() -> AsyncIterator[tuple[str, RecordingDoor]]:
    door = RecordingDoor()
    server = TestServer(build_app(ROWS, door=door), host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/"), door
    finally:
        await server.close()


async def call(url: str, path: str, body: Any = None, token: bool = True) -> tuple[int, Any]:
    headers = {"Authorization": "Bearer t"} if token else {}
    async with aiohttp.ClientSession() as session:
        method = "GET" if body is None else "POST"
        async with session.request(method, url + path, json=body, headers=headers) as response:
            return response.status, await response.json()


async def test_an_open_route_never_asks_the_door(served: tuple[str, RecordingDoor]) -> None:
    url, door = served
    assert await call(url, "/open", token=False) == (200, {"principal": None, "body": None})
    assert door.asked == []


async def test_the_door_is_asked_for_the_rows_role_and_scope_before_the_body(
    served: tuple[str, RecordingDoor],
) -> None:
    url, door = served
    status, body = await call(url, "/guarded", {"nonsense": 1}, token=False)
    assert (status, body["error"]["code"]) == (401, "AUTH_REQUIRED")  # the body was never read
    assert door.asked == [(Role.OPERATOR, Scope.HALT)]
    status, body = await call(url, "/guarded", {"reason": "drill"})
    assert (status, body) == (200, {"principal": "caller-1", "body": {"reason": "drill"}})


async def test_a_body_that_does_not_match_its_model_is_400_request_invalid(
    served: tuple[str, RecordingDoor],
) -> None:
    url, _ = served
    status, body = await call(url, "/guarded", {"reason": 7})
    assert status == 400
    assert body["error"] == {"code": "REQUEST_INVALID", "message": "the body must be a reason"}
    status, body = await call(url, "/located", {"reason": "x", "tenant": "t"})
    assert (status, body["error"]["code"]) == (400, "REQUEST_INVALID")
    assert body["error"]["message"] == "the request carries a field it may not"
    status, body = await call(url, "/located", {"reason": 7})
    assert body["error"]["message"] == "the request does not match the schema at 'reason'"


async def refused_line(call: Call) -> web.StreamResponse:
    raise ChainError(
        "chain head for stream evidence could not be persisted", code=Code.CHAIN_JOURNAL
    )


async def test_a_line_a_failing_chain_refuses_is_a_coded_503_never_a_bare_500() -> None:
    """Issue 29: full chain heads. A proposal in flight when the executor halted (cause
    CHAIN_HEADS) whose line the chain refuses is answered with a code, and the answer says
    nothing about whether anything was executed."""
    rows = (Route("POST", "/refused", Role.PROPOSER, None, Body, refused_line),)
    server = TestServer(build_app(rows, door=RecordingDoor()), host="127.0.0.1")
    await server.start_server()
    try:
        url = str(server.make_url("")).rstrip("/")
        status, body = await call(url, "/refused", {"reason": "x"})
    finally:
        await server.close()
    assert (status, body["error"]["code"]) == (503, "CHAIN_HEADS_UNAVAILABLE")
    assert "executed" not in body["error"]["message"]
