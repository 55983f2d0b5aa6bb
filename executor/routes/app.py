"""The executor's HTTP surface (aiohttp): routes, the door hook, security headers, error bodies.

Every response, refusals and aiohttp's own errors included, carries the four security headers and
``Cache-Control: no-store``. Bodies are JSON of at most 100 KiB (413), with the
``application/json`` content type (415); a malformed body is 400; the strict request schemas refuse
unknown or forbidden fields (tenant, actor, credentials) with 400 REQUEST_INVALID. An error body
is ``{"error": {"code", "message"}}`` and echoes nothing from the request.

The order inside a route: the door (authentication, role, scope), then the body, then the
pipeline. Callers: ``serve.py`` builds the application; tests drive it over real sockets.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..codes import Code
from ..errors import RequestRejected, StoreError
from ..intent import MAX_BODY_BYTES, check_json_bounds
from ..lifecycle.answers import Answer
from ..lifecycle.pipeline import Pipeline, Proposal
from ..principals import Principal, Role
from .refusals import code_for_http_error, refusal

__all__ = ["Door", "ReadyState", "build_app"]

log = logging.getLogger(__name__)

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}


class Door(Protocol):
    """Authenticates a request for a route's role and scope, or raises ``RequestRejected``."""

    async def authenticate(
        self, request: web.Request, *, role: Role, scope: str | None
    ) -> Principal: ...


@dataclass(frozen=True)
class ReadyState:
    ready: bool
    body: Mapping[str, Any]


# ---------------------------------------------------------------------- request schemas

_Strict = ConfigDict(extra="forbid", strict=True, frozen=True)
_TOKEN = r"^[\x21-\x7e]+$"


class _ProposalModel(BaseModel):
    model_config = _Strict
    action: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")
    target: str = Field(min_length=1, max_length=512)
    parameters: dict[str, Any]


class _ActionRequest(BaseModel):
    model_config = _Strict
    proposal: _ProposalModel
    idempotency_key: str = Field(
        min_length=1, max_length=255, pattern=r"^[A-Za-z0-9][A-Za-z0-9._~:=+-]*$"
    )
    correlation_id: str | None = Field(default=None, min_length=1, max_length=255, pattern=_TOKEN)


class _RecoveryRequest(BaseModel):
    model_config = _Strict
    recovery: dict[str, Any]


class _EscalationRequest(BaseModel):
    model_config = _Strict
    escalation: dict[str, Any]


def _schema_error(exc: ValidationError) -> RequestRejected:
    for error in exc.errors():
        if error["type"] == "extra_forbidden":
            return RequestRejected(Code.REQUEST_INVALID, "the request carries a field it may not")
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"] if isinstance(part, str))
    return RequestRejected(
        Code.REQUEST_INVALID, f"the request does not match the schema at '{where}'"
    )


def _refuse_constant(name: str) -> Any:
    raise RequestRejected(Code.REQUEST_INVALID, "numbers must be finite")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise RequestRejected(Code.REQUEST_INVALID, "a key appears twice in one object")
        out[key] = value
    return out


async def read_json(request: web.Request) -> Any:
    """Read a bounded JSON body or raise the right refusal."""
    if request.content_type != "application/json":
        raise RequestRejected(Code.UNSUPPORTED_MEDIA_TYPE, "the body must be application/json")
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        raise RequestRejected(Code.REQUEST_TOO_LARGE, "the body is larger than 100 KiB")
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise RequestRejected(Code.REQUEST_TOO_LARGE, "the body is larger than 100 KiB") from None
    if len(raw) > MAX_BODY_BYTES:
        raise RequestRejected(Code.REQUEST_TOO_LARGE, "the body is larger than 100 KiB")
    try:
        text = raw.decode("utf-8")
        value = json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise RequestRejected(Code.REQUEST_MALFORMED, "the body is not valid JSON") from None
    check_json_bounds(value)
    return value


def _respond(answer: Answer) -> web.Response:
    response = web.json_response(dict(answer.body), status=answer.status)
    response.headers.update(answer.headers)
    return response


# ---------------------------------------------------------------------- middleware


@web.middleware
async def _errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except RequestRejected as exc:
        return refusal(exc.code, exc.message, headers=exc.headers)
    except StoreError as exc:
        if exc.code != Code.STORE_UNAVAILABLE:
            return _internal_error(request)
        # Raised only before an attempt starts: the pipeline answers for what it dispatched.
        return refusal(
            Code.STORE_UNAVAILABLE,
            "the shared store is unreachable; nothing was executed; retry later",
            headers={"Retry-After": "5"},
        )
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return refusal(code_for_http_error(exc.status), exc.reason, status=exc.status)
    except Exception:
        return _internal_error(request)


def _internal_error(request: web.Request) -> web.Response:
    log.exception("unhandled error in %s %s", request.method, request.path)
    return refusal(Code.INTERNAL_ERROR, "the executor failed; the request was not executed")


async def _security_headers(request: web.Request, response: web.StreamResponse) -> None:
    response.headers.update(SECURITY_HEADERS)


# ---------------------------------------------------------------------- application


def build_app(
    *,
    pipeline: Pipeline,
    door: Door,
    readiness: Callable[[], ReadyState],
    jwks: Callable[[], Mapping[str, Any]],
    extra_routes: Callable[[web.Application], None] | None = None,
) -> web.Application:
    """The executor's aiohttp application."""
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_errors])
    app.on_response_prepare.append(_security_headers)

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def ready(request: web.Request) -> web.Response:
        state = readiness()
        return web.json_response(dict(state.body), status=200 if state.ready else 503)

    async def grant_jwks(request: web.Request) -> web.Response:
        return web.json_response(dict(jwks()))

    async def actions(request: web.Request) -> web.Response:
        principal = await door.authenticate(request, role=Role.PROPOSER, scope=None)
        body = await read_json(request)
        try:
            parsed = _ActionRequest.model_validate(body)
        except ValidationError as exc:
            raise _schema_error(exc) from None
        proposal = Proposal(
            action=parsed.proposal.action,
            target=parsed.proposal.target,
            parameters=parsed.proposal.parameters,
            idempotency_key=parsed.idempotency_key,
            correlation_id=parsed.correlation_id,
        )
        return _respond(await pipeline.propose(principal, proposal))

    async def reconciliations(request: web.Request) -> web.Response:
        principal = await door.authenticate(request, role=Role.PROPOSER, scope=None)
        body = await read_json(request)
        try:
            parsed = _RecoveryRequest.model_validate(body)
        except ValidationError as exc:
            raise _schema_error(exc) from None
        return _respond(await pipeline.reconcile(principal, parsed.recovery))

    async def escalations(request: web.Request) -> web.Response:
        principal = await door.authenticate(request, role=Role.PROPOSER, scope=None)
        body = await read_json(request)
        try:
            parsed = _EscalationRequest.model_validate(body)
        except ValidationError as exc:
            raise _schema_error(exc) from None
        return _respond(await pipeline.resume_escalation(principal, parsed.escalation))

    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/.well-known/agentsafe-grant-jwks.json", grant_jwks)
    app.router.add_post("/v1/actions", actions)
    app.router.add_post("/v1/reconciliations", reconciliations)
    app.router.add_post("/v1/escalations", escalations)
    if extra_routes is not None:
        extra_routes(app)
    return app
