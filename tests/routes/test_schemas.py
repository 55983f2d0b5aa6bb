"""The OpenAPI document says what the server reads (issue 31, item 10): each request the issue
found the document calling valid while the server refused it with 400 REQUEST_INVALID is now
invalid by the document, and the document's ``Intent`` and ``JsonValue`` agree with the server's
own checks (:func:`~agentsafe.executor.intent.intent_from_binding`,
:func:`~agentsafe.executor.routes.app.parse_body`) on a real binding and on each way to break one.
The document is docs/openapi.json, the file ``make api-test`` checks the served one against."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from agentsafe.executor.errors import RequestRejected
from agentsafe.executor.intent import intent_from_binding
from agentsafe.executor.routes.app import parse_body

DOC = json.loads((Path(__file__).parents[2] / "docs" / "openapi.json").read_text())
BEYOND = 2**53  # one past the exact range


def body_schema(path: str) -> dict[str, Any]:
    schema = DOC["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return {**schema, "components": DOC["components"]}


def valid(path: str, body: Any) -> bool:
    validator = jsonschema.Draft202012Validator(body_schema(path))
    return validator.is_valid(body)


def binding() -> dict[str, Any]:
    """An intent as the executor captures it (executor/intent.py, capture_intent)."""
    return {
        "protocol_version": "agent-safe.intent/1",
        "tenant_id": "00000000-0000-4000-8000-000000000001",
        "intent_id": "5f0c6f3e-2b7a-4c1d-9e8f-0a1b2c3d4e5f",
        "idempotency_key": "k-1",
        "captured_at": "2026-12-02T02:00:00.000Z",
        "expires_at": "2026-12-02T02:05:00.000Z",
        "actor": {"id": "payout-agent", "type": "AI_AGENT"},
        "action": {
            "type": "create_payout",
            "resource": "payout:acct-1",
            "parameters": {"amountMinor": 1200, "currency": "USD"},
        },
        "context": {"caller_principal": "treasury-workflow"},
        "downstream_target": {"system": "payments", "operation": "payout"},
    }


def refusal(intent: Any) -> str | None:
    """The code the server refuses ``intent`` with (as a body's member), or None."""
    try:
        parse_body(json.dumps({"intent": intent}).encode())
        intent_from_binding(intent)
    except RequestRejected as exc:
        return str(exc.code)
    return None


def _set(path: tuple[str, ...], value: Any) -> Any:
    def change(intent: dict[str, Any]) -> None:
        target = intent
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return change


def _drop(path: tuple[str, ...]) -> Any:
    def change(intent: dict[str, Any]) -> None:
        target = intent
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return change


BROKEN = {
    "no context": _drop(("context",)),
    "a member more": _set(("extra",), 1),
    "another protocol": _set(("protocol_version",), "agent-safe.intent/2"),
    "an upper-case intent id": _set(("intent_id",), "5F0C6F3E-2B7A-4C1D-9E8F-0A1B2C3D4E5F"),
    "a UUIDv1": _set(("intent_id",), "5f0c6f3e-2b7a-1c1d-9e8f-0a1b2c3d4e5f"),
    "30 February": _set(("captured_at",), "2026-02-30T02:00:00.000Z"),
    "seconds only": _set(("expires_at",), "2026-12-02T02:05:00Z"),
    "an action without parameters": _drop(("action", "parameters")),
    "parameters that are a list": _set(("action", "parameters"), [1]),
    "an actor that is a string": _set(("actor",), "payout-agent"),
    "an integer beyond the exact range": _set(("action", "parameters", "amountMinor"), BEYOND),
    "a negative one": _set(("context", "n"), -BEYOND),
    "a forbidden key": _set(("downstream_target", "__proto__"), {}),
}


def test_a_captured_intent_is_valid_by_the_document_and_read_by_the_server() -> None:
    intent = binding()
    assert refusal(intent) is None
    assert valid("/v1/escalations", {"escalation": {"intent": intent, "token": "t"}})
    assert valid("/v1/escalations/cancel", {"escalation": {"intent": intent}, "reason": "done"})
    assert valid("/v1/reconciliations", {"recovery": {"intent": intent, "reference": "r"}})


@pytest.mark.parametrize("how", sorted(BROKEN))
def test_an_intent_the_server_refuses_is_invalid_by_the_document(how: str) -> None:
    intent = copy.deepcopy(binding())
    BROKEN[how](intent)
    assert refusal(intent) == "REQUEST_INVALID", how
    for path, body in (
        ("/v1/escalations", {"escalation": {"intent": intent}}),
        ("/v1/escalations/cancel", {"escalation": {"intent": intent}, "reason": "done"}),
        ("/v1/reconciliations", {"recovery": {"intent": intent, "reference": "r"}}),
    ):
        assert not valid(path, body), f"{how}: {path} calls it valid"


def test_integers_beyond_the_exact_range_are_invalid_by_the_document() -> None:
    proposal = {"action": "create_payout", "target": "payout:acct-1", "parameters": {}}
    for amount, ok in ((2**53 - 1, True), (-(2**53 - 1), True), (BEYOND, False), (-BEYOND, False)):
        proposal["parameters"] = {"amountMinor": amount, "nested": [{"n": 1}]}
        body = {"proposal": proposal, "idempotency_key": "k-1"}
        assert valid("/v1/actions", body) is ok, amount
        step = {
            name: {"deep": [amount]}
            for name in ("dryRun", "approval", "context", "operation", "stepId", "executionId")
        }
        assert valid("/v1/plans/steps", step) is ok, amount
        try:
            parse_body(json.dumps(body).encode())
            read = True
        except RequestRejected:
            read = False
        assert read is ok, amount


def test_the_plan_routes_name_their_required_members() -> None:
    assert not valid("/v1/plans/dry-run", {})
    assert not valid("/v1/plans/dry-run", {"plan": {}, "more": 1})
    assert valid("/v1/plans/dry-run", {"plan": {"anything": ["the library's"]}})
    assert not valid("/v1/plans/approvals", {"dryRun": {}})
    assert not valid("/v1/plans/receipts/verify", {"receipt": {}, "dryRun": {}, "approval": {}})


def test_a_recovery_without_its_reference_is_invalid_by_the_document() -> None:
    assert not valid("/v1/reconciliations", {"recovery": {"intent": binding()}})
