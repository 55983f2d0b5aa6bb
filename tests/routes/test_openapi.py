"""The OpenAPI document (``routes/openapi.py``): generated from the route table, valid OpenAPI
3.1, complete per route, kept in ``docs/openapi.json``, and what the server checks its refusals
against (``routes/contract.py``).

Regenerate the copy in docs/ after changing a route:
``AGENTSAFE_WRITE_OPENAPI=1 .venv/bin/pytest tests/routes/test_openapi.py``.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from agentsafe.executor.codes import REASON_CODES, Code
from agentsafe.executor.errors import RequestRejected
from agentsafe.executor.principals import Principal, Role, Scope
from agentsafe.executor.routes.app import Call, Link, Route, build_app
from agentsafe.executor.routes.contract import (
    BODY,
    DOOR,
    UndeclaredRefusal,
    check_refusal,
    check_status,
    declared_statuses,
    refusal_codes,
    refusal_statuses,
)
from agentsafe.executor.routes.openapi import OPENAPI_PATH, openapi_document
from agentsafe.executor.routes.plans import PLAN_CODES
from agentsafe.executor.routes.refusals import status_of

from .test_table import every_route

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "openapi.json"


def rendered() -> str:
    return json.dumps(openapi_document(every_route()), indent=2, ensure_ascii=False) + "\n"


def resolve(document: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    if "$ref" not in schema:
        return schema
    return document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]  # type: ignore[no-any-return]


def test_docs_openapi_json_is_the_document_of_the_route_table() -> None:
    text = rendered()
    if os.environ.get("AGENTSAFE_WRITE_OPENAPI") == "1":
        DOC.write_text(text, encoding="utf-8")
    assert DOC.read_text(encoding="utf-8") == text, (
        "docs/openapi.json is stale: a route changed. Regenerate it with "
        "AGENTSAFE_WRITE_OPENAPI=1 .venv/bin/pytest tests/routes/test_openapi.py"
    )


def test_the_document_is_valid_openapi_3_1() -> None:
    from openapi_spec_validator import validate

    validate(openapi_document(every_route()))


def test_every_row_is_one_operation_with_its_security() -> None:
    rows = every_route()
    paths = openapi_document(rows)["paths"]
    operations = [(m.upper(), p) for p, ops in paths.items() for m in ops]
    assert sorted(operations) == sorted((r.method, r.path) for r in rows)
    ids = [op["operationId"] for ops in paths.values() for op in ops.values()]
    assert len(set(ids)) == len(ids)
    for row in rows:
        operation = paths[row.path][row.method.lower()]
        if row.role is None:
            assert operation["security"] == [], row.path
        else:
            assert operation["security"] == [{"bearer": []}, {"mtls": []}], row.path
            assert operation["x-agentsafe-role"] == row.role.value
        assert operation.get("x-agentsafe-scope") == (row.scope.value if row.scope else None)
        assert ("requestBody" in operation) == (row.body is not None), row.path


def test_every_refusal_code_of_a_route_is_listed_under_its_status() -> None:
    rows = every_route()
    document = openapi_document(rows)
    paths = document["paths"]
    for row in rows:
        responses = paths[row.path][row.method.lower()]["responses"]
        for code in refusal_codes(row):
            if code.status is None:
                continue
            schema = responses[str(code.status)]["content"]["application/json"]["schema"]
            refusal = resolve(document, schema["anyOf"][-1] if "anyOf" in schema else schema)
            code_schema = refusal["properties"]["error"]["properties"]["code"]
            jsonschema.validate(code.value, code_schema)
            assert f"`{code.value}`" in responses[str(code.status)]["description"]
        for status in row.answers:
            assert str(status) in responses, (row.path, status)


def test_a_refusal_code_outside_the_route_does_not_match_its_schema() -> None:
    document = openapi_document(every_route())
    paths = document["paths"]
    health = paths["/health"]["get"]["responses"]
    assert set(health) == {"200", "500"}
    proposal = paths["/v1/actions"]["post"]["responses"]["409"]["content"]["application/json"]
    schema = resolve(document, proposal["schema"])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"error": {"code": "HALT_CAUSE_PERSISTS", "message": "m"}}, schema)
    jsonschema.validate({"error": {"code": "IDEMPOTENCY_KEY_CONFLICT", "message": "m"}}, schema)
    with pytest.raises(jsonschema.ValidationError):  # nothing else rides along
        jsonschema.validate(
            {"error": {"code": "IDEMPOTENCY_KEY_CONFLICT", "message": "m"}, "x": 1}, schema
        )


def test_the_security_schemes_are_bearer_and_mutual_tls() -> None:
    schemes = openapi_document(every_route())["components"]["securitySchemes"]
    assert schemes["bearer"]["type"] == "http"
    assert schemes["bearer"]["scheme"] == "bearer"
    assert schemes["mtls"]["type"] == "mutualTLS"


def test_the_derived_sets_follow_the_row() -> None:
    rows = {(r.method, r.path): r for r in every_route()}
    health = rows[("GET", "/health")]
    assert refusal_codes(health) == {Code.INTERNAL_ERROR}
    halt = rows[("POST", "/v1/control/halt")]
    assert DOOR | BODY | {Code.SCOPE_FORBIDDEN} <= refusal_codes(halt)
    openapi = rows[("GET", OPENAPI_PATH)]
    assert openapi.role is Role.OPERATOR
    assert Code.SCOPE_FORBIDDEN not in refusal_codes(openapi)  # any OPERATOR may read it
    assert not BODY & refusal_codes(openapi)
    for row in rows.values():
        for status, codes in refusal_statuses(row).items():
            assert all(status_of(code) == status for code in codes)


def test_the_plan_routes_declare_every_code_the_plan_library_refuses_with() -> None:
    raised = set()
    for module in (REPO / "executor" / "plans").glob("*.py"):
        for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "Code"
            ):
                raised.add(Code[node.attr])
    missing = {code for code in raised if code.status is not None} - PLAN_CODES
    assert not missing, f"add to routes/plans.PLAN_CODES: {sorted(missing)}"


def test_the_door_set_holds_every_code_the_door_refuses_with() -> None:
    raised = set()
    others = ("RATE_LIMITED", "PRINCIPAL_LOCKED", "ROLE_FORBIDDEN")
    for name in ("door.py", "workload.py"):
        source = (REPO / "executor" / "door" / name).read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(source)):
            if not (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "Code"
            ):
                continue
            if Code[node.attr].status == 401 or node.attr in others:
                raised.add(Code[node.attr])
    assert raised <= DOOR


# ------------------------------------------------------------ the server checks its own rows


def test_an_undeclared_refusal_warns() -> None:
    row = Route("GET", "/x", Role.PROPOSER, None, None, _nothing, codes=frozenset())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_refusal(row, Code.AUTH_REQUIRED)  # the door's: derived from the role
        check_status(row, 200)
        check_status(row, 401)
        with pytest.raises(UndeclaredRefusal, match="HALT_CAUSE_PERSISTS"):
            check_refusal(row, Code.HALT_CAUSE_PERSISTS)
        with pytest.raises(UndeclaredRefusal, match="answered 202"):
            check_status(row, 202)
    host = Route("POST", "/y", Role.PROPOSER, None, None, _nothing, host_codes=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_refusal(host, "ACME_LEDGER_CLOSED")  # a host's own code passes through
        with pytest.raises(UndeclaredRefusal):
            check_refusal(host, Code.HALT_CAUSE_PERSISTS)


class AnyDoor:
    async def authenticate(
        self, request: web.Request, *, role: Role, scope: Scope | None
    ) -> Principal:
        return Principal(id="op-1", role=role, scopes=frozenset())


async def _persists(call: Call) -> web.StreamResponse:
    raise RequestRejected(Code.HALT_CAUSE_PERSISTS, "the cause of the halt still stands")


@pytest.fixture
async def undeclared() -> AsyncIterator[str]:
    rows = (Route("POST", "/r", Role.OPERATOR, None, None, _persists),)
    server = TestServer(build_app(rows, door=AnyDoor()), host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("/r"))
    finally:
        await server.close()


async def test_a_route_that_refuses_with_an_undeclared_code_fails_the_suite(
    undeclared: str,
) -> None:
    """Warnings are errors under pytest: the undeclared code becomes a 500 a test notices."""
    async with aiohttp.ClientSession() as session, session.post(undeclared) as response:
        body: Any = await response.json()
    assert (response.status, body["error"]["code"]) == (500, "INTERNAL_ERROR")


async def _accepted(call: Call) -> web.StreamResponse:
    return web.json_response({}, status=202)


async def test_a_served_status_is_checked_against_the_statuses_the_row_declares() -> None:
    """The application takes a row's statuses once, when it is built: a declared answer passes,
    an undeclared one still warns (an error under pytest: a 500 a test notices)."""
    rows = (
        Route("POST", "/declared", Role.OPERATOR, None, None, _accepted, answers={202: None}),
        Route("POST", "/undeclared", Role.OPERATOR, None, None, _accepted),
    )
    assert declared_statuses(rows[0]) >= {202, 401, 500}
    assert 202 not in declared_statuses(rows[1])
    server = TestServer(build_app(rows, door=AnyDoor()), host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(server.make_url("/declared")) as response:
                assert response.status == 202
            async with session.post(server.make_url("/undeclared")) as response:
                body: Any = await response.json()
            assert (response.status, body["error"]["code"]) == (500, "INTERNAL_ERROR")
    finally:
        await server.close()


# -- links ---------------------------------------------------------------------------------------


def _links(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out = {}
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                for name, link in response.get("links", {}).items():
                    out[f"{method.upper()} {path} {status} -> {name}"] = link
    return out


def test_the_links_are_the_next_steps_of_each_answer() -> None:
    """A collection links to each item; a row declares its other next steps (a proposal's
    escalation presented back, a plan's dry run to its approval to its step to its receipt)."""
    links = _links(openapi_document(every_route()))
    escalation = "$response.body#/escalation"
    assert links["POST /v1/actions 200 -> post_v1_escalations"] == {
        "operationId": "post_v1_escalations",
        "requestBody": {"escalation": escalation},
    }
    assert links["POST /v1/actions 200 -> get_v1_approvals_request_id"]["parameters"] == {
        "request_id": "$response.body#/escalation/request_id"
    }
    assert links["GET /v1/approvals 200 -> get_approve_request_id"]["parameters"] == {
        "request_id": "$response.body#/approvals/0/request_id"
    }
    assert links["POST /v1/plans/approvals 200 -> post_v1_plans_steps"]["requestBody"] == {
        "dryRun": "$request.body#/dryRun",
        "approval": "$response.body#/approval",
    }
    assert links["GET /v1/actions 200 -> post_v1_actions"]["requestBody"] == {
        "proposal": {"action": "$response.body#/actions/0/name"}
    }
    # Every link names another operation of the document, never the same call again.
    document = openapi_document(every_route())
    operations = [op for ops in document["paths"].values() for op in ops.values()]
    ids = {op["operationId"] for op in operations}
    for op in operations:
        for response in op["responses"].values():
            for link in response.get("links", {}).values():
                assert link["operationId"] in ids
                assert link["operationId"] != op["operationId"]
    assert len(links) == 22


@pytest.mark.parametrize(
    ("link", "problem"),
    [
        (Link("GET /v1/approvals/{request_id}"), "must give each path parameter"),
        (Link("GET /v1/approvals", body={"x": "$response.body#/approvals"}), "reads no body"),
        (Link("POST /v1/escalations", body={"nope": "$response.body#/escalation"}), "reads no"),
        (Link("POST /v1/escalations", body={"escalation": "$response.body#/nope"}), "no $resp"),
        (Link("POST /v1/escalations", body={"escalation": "response.body#/x"}), "no response"),
        (
            Link("POST /v1/escalations", body={"escalation": "$response.body#/escalation/x/y"}),
            "no $response.body#/escalation/x/y",
        ),
    ],
)
def test_a_declared_link_that_names_nothing_real_is_refused(link: Link, problem: str) -> None:
    """A link is checked against the models it names when the document is built, so a renamed
    field or route breaks the test suite, never a client."""
    table = every_route()
    source = next(r for r in table if (r.method, r.path) == ("POST", "/v1/actions"))
    broken = dataclasses.replace(source, links=(link,))
    with pytest.raises(ValueError, match=re.escape(problem)):
        openapi_document([broken if r is source else r for r in table])


def test_a_link_to_a_route_that_is_not_served_is_left_out() -> None:
    """The approval routes are off without ``EXECUTOR_ESCALATION=APPROVAL``: no dangling link."""
    table = [r for r in every_route() if "approv" not in r.path or r.path.startswith("/v1/plans")]
    links = _links(openapi_document(table))
    assert "POST /v1/actions 200 -> post_v1_escalations" in links
    assert not [name for name in links if "approvals_request_id" in name]


async def _nothing(call: Call) -> web.StreamResponse:
    return web.json_response({})


def test_intent_expired_is_answered_one_way() -> None:
    """An intent past its TTL is a BLOCK whose reasons name INTENT_EXPIRED (an approval never
    revives it), on every route: no route declares it as a refusal, the registry gives it no
    status of its own, and the document lists it under no error answer (issue 31)."""
    assert Code.INTENT_EXPIRED.status is None
    assert Code.INTENT_EXPIRED in REASON_CODES
    for route in every_route():
        assert Code.INTENT_EXPIRED not in refusal_codes(route), route.path
    assert "INTENT_EXPIRED" not in json.dumps(openapi_document(every_route())["paths"])
