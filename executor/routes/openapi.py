"""The OpenAPI 3.1 document of the wire contract, generated from the route table.

:func:`openapi_document` reads nothing but the rows it is given (``routes/table.py``) and the
models they name, so the description is the server's own data and never a file written beside
it: one operation per row, with

- the request body's JSON Schema from the row's strict model (``body``), the query parameters
  from its ``query`` model and the path parameters from its path; what the models name beyond
  themselves (``JsonValue``, ``Intent``: ``routes/schemas.py``) is in the components, so a body
  the document calls valid is one the server reads;
- one response per status: the row's answer models (``answers``, ``routes/answers.py``) and the
  refusals the row may answer (``routes/contract.py``), each ``{"error": {"code", "message"}}``
  with ``code`` an ``enum`` of exactly the codes with that status, described one per line;
- the security the door applies: ``bearer`` (a principal's token or a workload JWT) or
  ``mtls`` (a client certificate), never both at once, or none for an open route; the role and
  the scope the door requires are the ``x-agentsafe-role`` and ``x-agentsafe-scope`` extensions;
- links, which schemathesis's stateful phase follows: from a collection's answer whose items
  carry another operation's path parameter to that operation, and the links a row declares
  (``Route.links``: an escalation presented back, a plan's dry run to its approval to its step,
  a receipt to its verification), each checked against the models it names.

The executor serves the document of the routes it serves to OPERATOR principals
(:func:`openapi_route`); ``docs/openapi.json`` is the document of every route with every optional
section on, and ``tests/routes/test_openapi.py`` fails when it is stale
(``AGENTSAFE_WRITE_OPENAPI=1 .venv/bin/pytest tests/routes/test_openapi.py`` rewrites it).

Callers: ``routes/table.py`` (the row that serves it), tests.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

from aiohttp import web
from pydantic import BaseModel, RootModel
from pydantic.json_schema import models_json_schema

from ..codes import HOST_CODE_STATUS
from ..principals import Role
from .answers import OpenApiDocument
from .contract import refusal_statuses
from .route import Call, Route
from .schemas import SHARED_SCHEMAS

__all__ = ["OPENAPI_PATH", "openapi_document", "openapi_route"]

OPENAPI_PATH = "/v1/control/openapi.json"
_REF = "#/components/schemas/{model}"
_PARAM = re.compile(r"\{([^}:]+)(?::[^}]*)?\}")
_HOST_CODE = r"^[A-Z][A-Z0-9_]*$"

_SECURITY_SCHEMES = {
    "bearer": {
        "type": "http",
        "scheme": "bearer",
        "description": (
            "A bearer principal's token (agent-safe.principals/1, matched by digest), or a "
            "workload principal's projected service-account JWT. Never together with a client "
            "certificate (401 AUTH_AMBIGUOUS)."
        ),
    },
    "mtls": {
        "type": "mutualTLS",
        "description": (
            "A client certificate issued by EXECUTOR_TLS_CLIENT_CA_FILE whose SAN URI (and "
            "optional pin) names an MTLS principal."
        ),
    },
}

_RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds to wait before retrying (RATE_LIMITED, STORE_UNAVAILABLE, a halt).",
        "schema": {"type": "string", "pattern": "^[0-9]+$"},
    }
}

_WWW_AUTHENTICATE = {
    "WWW-Authenticate": {
        "description": (
            'The Bearer challenge (RFC 6750 §3): `Bearer realm="agentsafe"`, with '
            '`error="invalid_token"` when a credential was presented and refused.'
        ),
        "schema": {"type": "string", "pattern": '^Bearer realm="agentsafe"'},
        "required": True,
    }
}

_DESCRIPTION = (
    "The execution boundary between AI agents and the systems they can change. Every answer, "
    "refusals included, carries Content-Security-Policy, X-Frame-Options, "
    "X-Content-Type-Options and Cache-Control: no-store. A refusal is "
    '{"error": {"code", "message"}}: a stable code (docs/error-codes.md) with the status the '
    "registry gives it, and a message that echoes nothing from the request. Bodies are JSON "
    "(application/json) of at most 100 KiB. A path that is not listed answers 404 NOT_FOUND, "
    "a method a path does not take 405 METHOD_NOT_ALLOWED."
)

_Mode = Literal["validation", "serialization"]


def _package_version() -> str:
    try:
        return version("agentsafe")
    except PackageNotFoundError:  # pragma: no cover - a source tree that was never installed
        return "0"


def _schemas(routes: Sequence[Route]) -> tuple[dict[tuple[type[BaseModel], _Mode], Any], Any]:
    wanted: dict[tuple[type[BaseModel], _Mode], None] = {}
    for route in routes:
        if route.body is not None:
            wanted[(route.body, "validation")] = None
        if route.query is not None:
            wanted[(route.query, "validation")] = None
        for model in route.answers.values():
            if model is not None:
                wanted[(model, "serialization")] = None
    refs, defs = models_json_schema(list(wanted), ref_template=_REF)
    return {key: refs[key] for key in wanted}, defs.get("$defs", {})


def _refusal_schema(codes: list[str], *, host: bool, extra: bool) -> dict[str, Any]:
    code: dict[str, Any] = {"type": "string", "enum": codes}
    if host:
        code = {"type": "string", "pattern": _HOST_CODE}
    error = {
        "type": "object",
        "required": ["code", "message"],
        "additionalProperties": False,
        "properties": {"code": code, "message": {"type": "string", "minLength": 1}},
    }
    body: dict[str, Any] = {
        "type": "object",
        "required": ["error"],
        "additionalProperties": False,
        "properties": {"error": error},
    }
    if extra:
        body["properties"]["receipt"] = {
            "description": "The signed receipt of a step that ran (or may have), to reconcile."
        }
    return body


def _describe(codes: list[str], *, host: bool) -> str:
    names = ", ".join(f"`{name}`" for name in codes)
    if host:
        names += ", or a host step executor's own UPPER_SNAKE code, passed through"
    return f"A refusal: {names} (docs/error-codes.md says what each means)."


def _refusal_ref(schema: dict[str, Any], status: int, refusals: dict[str, Any]) -> dict[str, Any]:
    """One component per distinct refusal schema, named for its status and content."""
    digest = hashlib.sha256(json.dumps(schema, sort_keys=True).encode()).hexdigest()[:8]
    name = f"Refusal{status}_{digest}"
    refusals[name] = schema
    return {"$ref": _REF.format(model=name)}


def _items(annotation: Any) -> tuple[Any, bool]:
    """``annotation`` without ``| None``, and whether it is a list (of what)."""
    args = [arg for arg in get_args(annotation) if arg is not type(None)]
    if get_origin(annotation) in (list, tuple) and args:
        return args[0], True
    if get_origin(annotation) in (Union, UnionType) and len(args) == 1:
        return _items(args[0])
    return annotation, False


def _model(annotation: Any) -> type[BaseModel] | None:
    is_model = isinstance(annotation, type) and issubclass(annotation, BaseModel)
    return annotation if is_model and not issubclass(annotation, RootModel) else None


def _pointers(model: type[BaseModel], name: str) -> list[str]:
    """Where an answer of ``model`` carries a field ``name`` in the first item of a list of
    models: a collection's answer, whose items each name a resource of their own. Any other
    next step is declared by its row (``Route.links``)."""
    found = []
    for field_name, field in model.model_fields.items():
        inner, is_list = _items(field.annotation)
        inner_model = _model(inner)
        if is_list and inner_model is not None and name in inner_model.model_fields:
            found.append(f"/{field_name}/0/{name}")
    return found


_EXPRESSION = re.compile(r"^\$(response|request)\.body#((?:/[^/]+)+)$")


def _resolves(model: type[BaseModel] | None, pointer: str) -> bool:
    """Whether ``pointer`` can name a value in a body of ``model`` (``None``: a body the route's
    own library checks, ``AnyJson``, where any pointer may)."""
    annotation: Any = model
    for segment in pointer.strip("/").split("/"):
        inner, is_list = _items(annotation)
        if is_list:
            if not segment.isdigit():
                return False
            annotation = inner
            continue
        current = _model(inner)
        if current is None:
            return inner is not str and inner is not int and inner is not bool
        field = current.model_fields.get(segment)
        if field is None:
            return False
        annotation = field.annotation
    return True


def _leaves(body: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    """``(pointer, expression)`` of each value of a link's (nested) body."""
    for name, value in body.items():
        if isinstance(value, Mapping):
            yield from _leaves(value, f"{prefix}/{name}")
        else:
            yield f"{prefix}/{name}", value


def _declared_links(route: Route, routes: Sequence[Route], status: int) -> dict[str, Any]:
    """The links the row declares (``Route.links``) from its ``status`` answer, checked: the
    target's path parameters are all given, the body fields are the target's, and every
    expression names a field of this row's answer or request."""
    links: dict[str, Any] = {}
    where = f"{route.method} {route.path}"
    for link in route.links:
        if link.status != status:
            continue
        method, _, path = link.target.partition(" ")
        target = next((r for r in routes if (r.method, r.path) == (method, path)), None)
        if target is None:
            continue  # an optional section that is off
        if set(link.parameters) != set(_PARAM.findall(target.path)):
            raise ValueError(f"{where}: the link to {link.target} must give each path parameter")
        if link.body and target.body is None:
            raise ValueError(f"{where}: {link.target} reads no body")
        body = list(_leaves(link.body))
        for pointer, _ in body:
            if not _resolves(_model(target.body), pointer):
                raise ValueError(f"{where}: {link.target} reads no {pointer}")
        for expression in (*link.parameters.values(), *(value for _, value in body)):
            found = _EXPRESSION.match(expression)
            source = route.answers.get(status) if found and found[1] == "response" else route.body
            if found is None or not _resolves(_model(source), found[2]):
                raise ValueError(f"{where}: the link to {link.target}: no {expression}")
        definition: dict[str, Any] = {"operationId": _operation_id(target)}
        if link.parameters:
            definition["parameters"] = dict(link.parameters)
        if link.body:
            definition["requestBody"] = json.loads(json.dumps(link.body))
        if link.description:
            definition["description"] = link.description
        links[_operation_id(target)] = definition
    return links


def _links(route: Route, routes: Sequence[Route], status: int) -> dict[str, Any]:
    """OpenAPI links from a collection's answer to every operation whose path parameter its
    items carry (``GET /v1/approvals`` -> ``/v1/approvals/{request_id}``), and those the row
    declares: the stateful tests follow them."""
    model = route.answers.get(status)
    if model is None or not 200 <= status < 300:
        return {}
    links: dict[str, Any] = {}
    for target in routes:
        names = _PARAM.findall(target.path)
        if not names or target is route:
            continue  # no parameter to carry, or the same call again
        parameters = {}
        for name in names:
            pointers = _pointers(model, name)
            if pointers:
                parameters[name] = f"$response.body#{pointers[0]}"
        if len(parameters) == len(names):
            target_id = _operation_id(target)
            links[target_id] = {"operationId": target_id, "parameters": parameters}
    return {**links, **_declared_links(route, routes, status)}


def _operation_id(route: Route) -> str:
    slug = re.sub(r"[^A-Za-z0-9]+", "_", _PARAM.sub(r"\1", route.path)).strip("_")
    return f"{route.method.lower()}_{slug}"


def _responses(
    route: Route,
    routes: Sequence[Route],
    refs: dict[tuple[type[BaseModel], _Mode], Any],
    shared: dict[str, Any],
) -> dict[str, Any]:
    refusals = refusal_statuses(route)
    out: dict[str, Any] = {}
    for status in sorted(set(route.answers) | set(refusals)):
        schemas: list[dict[str, Any]] = []
        descriptions: list[str] = []
        content: dict[str, Any] = {}
        if status in route.answers:
            model = route.answers[status]
            if model is None:
                media = route.text_media_type
                for media_type in (media,) if isinstance(media, str) else media:
                    content[media_type] = {"schema": {"type": "string"}}
                descriptions.append("The answer, as text.")
            else:
                schemas.append(refs[(model, "serialization")])
                descriptions.append((model.__doc__ or model.__name__).strip().split("\n\n")[0])
        if status in refusals:
            host = route.host_codes and status == HOST_CODE_STATUS
            schemas.append(_refusal_schema(refusals[status], host=host, extra=route.host_codes))
            descriptions.append(_describe(refusals[status], host=host))
        if schemas:
            schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
            content["application/json"] = {"schema": schema}
        response: dict[str, Any] = {"description": "\n\n".join(descriptions), "content": content}
        if status in (429, 503):
            response["headers"] = _RETRY_AFTER
        elif status == 401:
            response["headers"] = _WWW_AUTHENTICATE
        links = _links(route, routes, status)
        if links:
            response["links"] = links
        out[str(status)] = response
    return out


def _parameters(route: Route, refs: dict[tuple[type[BaseModel], _Mode], Any], defs: Any) -> Any:
    params: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in _PARAM.findall(route.path)
    ]
    if route.query is not None:
        ref = refs[(route.query, "validation")]["$ref"].rsplit("/", 1)[1]
        model = defs[ref]
        required = set(model.get("required", []))
        for name, schema in model.get("properties", {}).items():
            param = {"name": name, "in": "query", "required": name in required, "schema": schema}
            params.append(param)
    return params


def _operation(
    route: Route,
    routes: Sequence[Route],
    refs: dict[tuple[type[BaseModel], _Mode], Any],
    defs: Any,
    shared: Any,
) -> Any:
    operation: dict[str, Any] = {
        "operationId": _operation_id(route),
        "summary": route.summary or f"{route.method} {route.path}",
        "x-agentsafe-role": route.role.value if route.role is not None else "anyone",
    }
    if route.scope is not None:
        operation["x-agentsafe-scope"] = route.scope.value
    if route.role is None:
        operation["security"] = []
    else:
        operation["security"] = [{"bearer": []}, {"mtls": []}]
        who = f"For the {route.role.value} role"
        if route.scope is not None:
            who += f" with the `{route.scope.value}` scope"
        operation["description"] = f"{who}."
    parameters = _parameters(route, refs, defs)
    if parameters:
        operation["parameters"] = parameters
    if route.body is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": refs[(route.body, "validation")]}},
        }
    operation["responses"] = _responses(route, routes, refs, shared)
    return operation


def openapi_document(routes: Sequence[Route]) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``routes``, in their order."""
    refs, defs = _schemas(routes)
    shared: dict[str, Any] = {}
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        path = _PARAM.sub(r"{\1}", route.path)
        operation = _operation(route, routes, refs, defs, shared)
        paths.setdefault(path, {})[route.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "agentsafe executor",
            "version": _package_version(),
            "description": _DESCRIPTION,
            "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
        },
        "paths": paths,
        "components": {
            "schemas": dict(sorted({**defs, **shared, **SHARED_SCHEMAS}.items())),
            "securitySchemes": _SECURITY_SCHEMES,
        },
    }


def openapi_route(routes: Callable[[], Sequence[Route]]) -> Route:
    """The row that serves the document of ``routes()`` (the whole table, this row included)
    to any OPERATOR principal. The document is built on first use and kept."""
    built: list[dict[str, Any]] = []

    async def serve(call: Call) -> web.StreamResponse:
        if not built:
            built.append(openapi_document(routes()))
        return web.json_response(built[0])

    return Route(
        "GET",
        OPENAPI_PATH,
        Role.OPERATOR,
        None,
        None,
        serve,
        summary="The OpenAPI 3.1 document of the routes this executor serves",
        answers={200: OpenApiDocument},
    )
