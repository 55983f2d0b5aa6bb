"""The JSON Schemas of what the executor reads beyond a strict model: what the OpenAPI document
says a body may hold, so that a request the document calls valid is never refused as
REQUEST_INVALID (issue 31).

Every body passes :func:`~agentsafe.executor.intent.check_json_bounds` (integers within
±(2**53-1), no ``__proto__``/``prototype``/``constructor`` key, at most 1000 items in an array):
``JsonValue`` says so for every free-form value (a proposal's parameters, the plan routes'
members). An escalation or a recovery presents back an ``agent-safe.intent/1`` binding, which
:func:`~agentsafe.executor.intent.intent_from_binding` checks member by member: ``Intent`` is that
check as a schema. The plan routes read any bounded JSON and leave the members' shapes to the
plan library (``executor/plans/service.py``), whose refusals are its own codes; their bodies say
which members are required (:func:`plan_body`).

A model names a shared schema through :data:`JsonObject`, :data:`IntentBinding` (``allOf`` of
a ``$ref``: pydantic resolves a bare ``$ref`` itself), and ``routes/openapi.py`` puts
:data:`SHARED_SCHEMAS` into the document's components.

Callers: ``routes/app.py``, ``routes/approvals.py``, ``routes/plans.py``, ``routes/openapi.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import ConfigDict, WithJsonSchema
from pydantic.config import JsonDict

from ..canonical import MAX_SAFE_INTEGER
from ..intent import FORBIDDEN_KEYS, INTENT_MEMBERS, MAX_ARRAY_LENGTH, PROTOCOL_VERSION, UUID4

__all__ = [
    "SHARED_SCHEMAS",
    "EscalationObject",
    "IntentBinding",
    "JsonObject",
    "RecoveryObject",
    "plan_body",
]

_COMPONENT = "#/components/schemas/{}"


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": _COMPONENT.format(name)}


_OBJECT: dict[str, Any] = {
    "type": "object",
    "propertyNames": {"not": {"enum": sorted(FORBIDDEN_KEYS)}},
    "additionalProperties": _ref("JsonValue"),
}
# parse_ms: exactly format_ms's 24 characters, a date that exists (no 29 February: the
# document may be stricter than the server, never looser).
_TIMESTAMP = (
    r"^[1-9][0-9]{3}-((0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])|(0[13-9]|1[0-2])-(29|30)"
    r"|(0[13578]|1[02])-31)T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]\.[0-9]{3}Z$"
)
_TEXT: dict[str, Any] = {"type": "string"}
_SCALAR: dict[str, Any] = {
    "anyOf": [
        {"type": "null"},
        {"type": "boolean"},
        {"type": "string"},
        {"type": "number", "minimum": -MAX_SAFE_INTEGER, "maximum": MAX_SAFE_INTEGER},
    ]
}
# The intent's actor, context and downstream target: objects of scalars as the executor writes
# them (stricter than the server, which reads any bounded value; a schema this flat keeps
# schemathesis's stateful phase able to draw a body around a linked escalation).
_FLAT: dict[str, Any] = {
    "type": "object",
    "propertyNames": {"not": {"enum": sorted(FORBIDDEN_KEYS)}},
    "additionalProperties": _SCALAR,
}

SHARED_SCHEMAS: Mapping[str, Any] = {
    "JsonValue": {
        "description": (
            "Any JSON value the executor reads: numbers within ±(2^53-1) (RFC 8785's exact "
            "range), arrays of at most 1000 items, no key named __proto__, prototype or "
            "constructor."
        ),
        "anyOf": [
            {"type": "null"},
            {"type": "boolean"},
            _TEXT,
            {"type": "number", "minimum": -MAX_SAFE_INTEGER, "maximum": MAX_SAFE_INTEGER},
            {"type": "array", "maxItems": MAX_ARRAY_LENGTH, "items": _ref("JsonValue")},
            _OBJECT,
        ],
    },
    "Intent": {
        "description": (
            f"An {PROTOCOL_VERSION} binding, presented back exactly as the executor returned it "
            "(an escalation's or a recovery's intent)."
        ),
        "type": "object",
        "required": list(INTENT_MEMBERS),
        "additionalProperties": False,
        "properties": {
            "protocol_version": {"const": PROTOCOL_VERSION},
            "tenant_id": _TEXT,
            "intent_id": {"type": "string", "pattern": f"^{UUID4.pattern}$"},
            "idempotency_key": _TEXT,
            "captured_at": {"type": "string", "pattern": _TIMESTAMP},
            "expires_at": {"type": "string", "pattern": _TIMESTAMP},
            "actor": _FLAT,
            "action": {
                "type": "object",
                "required": ["type", "resource", "parameters"],
                "additionalProperties": False,
                "properties": {"type": _TEXT, "resource": _TEXT, "parameters": _OBJECT},
            },
            "context": _FLAT,
            "downstream_target": _FLAT,
        },
    },
}

JsonObject = Annotated[dict[str, Any], WithJsonSchema(_OBJECT)]
"""A free-form JSON object of bounded values (a proposal's parameters)."""


def _holding(members: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """An object with ``members`` (``required`` of them), more of any bounded value."""
    return {**_OBJECT, "required": required, "properties": members}


IntentBinding = Annotated[dict[str, Any], WithJsonSchema({"allOf": [_ref("Intent")]})]
"""An ``agent-safe.intent/1`` binding presented back."""

EscalationObject = Annotated[
    dict[str, Any],
    WithJsonSchema(
        {
            "type": "object",
            "required": ["intent"],
            "additionalProperties": False,
            "properties": {
                "mode": {"const": "APPROVAL"},
                "intent": {"allOf": [_ref("Intent")]},
                "request_id": _TEXT,
                "approval_url": _TEXT,
                "expires_at": _TEXT,
                "token": _TEXT,
            },
        }
    ),
]
"""The escalation object ``/v1/actions`` answered, presented back."""

RecoveryObject = Annotated[
    dict[str, Any],
    WithJsonSchema(
        _holding(
            {"intent": {"allOf": [_ref("Intent")]}, "reference": _TEXT}, ["intent", "reference"]
        )
    ),
]
"""The recovery object an attempt answered, presented to ``/v1/reconciliations``."""


def plan_body(*members: str) -> ConfigDict:
    """The model configuration of a plan route's body (``routes/plans.py``): an object of
    exactly ``members``, each any bounded JSON value (the plan library checks its shape)."""
    properties: JsonDict = {name: {"$ref": _COMPONENT.format("JsonValue")} for name in members}
    schema: JsonDict = {
        "type": "object",
        "required": list(members),
        "additionalProperties": False,
        "properties": properties,
    }
    return ConfigDict(json_schema_extra=schema)
