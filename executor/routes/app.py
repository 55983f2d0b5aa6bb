"""The executor's HTTP surface (aiohttp): routes, the door hook, security headers, error bodies.

Every response, refusals and aiohttp's own errors included, carries the four security headers,
``Cache-Control: no-store`` and ``Server: agentsafe`` (``routes/listener.py`` answers what aiohttp
would answer itself). Bodies are JSON of at most 100 KiB (413), with the ``application/json``
content type (415), read whole within ``EXECUTOR_BODY_TIMEOUT_SECONDS`` (408 REQUEST_TIMEOUT); a
malformed body is 400; the strict request schemas refuse unknown or forbidden fields (tenant,
actor, credentials) with 400 REQUEST_INVALID. An error body is ``{"error": {"code", "message"}}``
and echoes nothing from the request. A refusal answered before the body was read whole closes
the connection.

Every route is one row of a declarative table (:class:`~agentsafe.executor.routes.route.Route`,
in ``routes/route.py``: method, path, role, scope, body model, handler, and what it answers:
answer models and its handler's refusal codes);
:func:`build_app` builds the application from the rows ``routes/table.py`` assembles, so the
order inside a route is fixed in one place: the door (authentication, the row's role and scope),
then the query and the body (read, bounded, checked against the row's strict models), then the
handler. Every refusal and status a route answers is checked against its row
(``routes/contract.py``), the data the OpenAPI document is generated from (``routes/openapi.py``).
With the executor's metrics, every request's duration is recorded once, by its row's template
(never the raw path), its method and its outcome (a decision's verdict, else the answer's class).
This module holds the rows of the agent's own routes (:func:`core_routes`).

Callers: ``plane.py`` builds the application; ``routes/listener.py`` serves it;
``routes/table.py`` gathers the rows; ``proxy.py`` (the ``Server`` header); tests drive it over
real sockets.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import hdrs, web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .. import telemetry
from ..canonical import DuplicateKeyError, parse_json
from ..codes import ADMISSION_CODES, Code
from ..config import BODY_TIMEOUT_SECONDS_DEFAULT
from ..errors import AgentSafeError, CanonicalizationError, RequestRejected, StoreError
from ..host.metrics import ExecutorMetrics, outcome_of_status
from ..intent import MAX_BODY_BYTES, check_json_bounds
from ..lifecycle.answers import Answer
from ..lifecycle.escalations import Escalations
from ..lifecycle.pipeline import Pipeline, Proposal
from ..lifecycle.reconciliations import Reconciliations
from ..principals import Principal, Role, Scope
from .answers import Decision, Health, Jwks, Readiness
from .contract import check_refusal, check_status, declared_statuses
from .refusals import code_for_http_error, refusal, status_of
from .route import AnyJson, Call, Link, Route, RouteHandler
from .schemas import EscalationObject, JsonObject, RecoveryObject

__all__ = [
    "AnyJson",
    "Call",
    "Door",
    "Link",
    "ReadyState",
    "Route",
    "RouteHandler",
    "build_app",
    "core_routes",
    "parse_body",
    "read_json",
]

log = logging.getLogger(__name__)

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}
SERVER_HEADER = "agentsafe"
"""Every response's ``Server``: no interpreter or library version for a scanner to match."""
# The same names as aiohttp's case-insensitive constants (``hdrs``, spelled as above, so the
# bytes on the wire are the same): the response's header multidict takes those as they are,
# where it makes one of a plain ``str`` on every response (issue 34).
_CSP, _SERVER = hdrs.CONTENT_SECURITY_POLICY, hdrs.SERVER
_SECURITY_HEADERS = {
    _CSP: SECURITY_HEADERS["Content-Security-Policy"],
    hdrs.X_FRAME_OPTIONS: SECURITY_HEADERS["X-Frame-Options"],
    hdrs.X_CONTENT_TYPE_OPTIONS: SECURITY_HEADERS["X-Content-Type-Options"],
    hdrs.CACHE_CONTROL: SECURITY_HEADERS["Cache-Control"],
}
BODY_TIMEOUT_SECONDS = float(BODY_TIMEOUT_SECONDS_DEFAULT)
"""``EXECUTOR_BODY_TIMEOUT_SECONDS``' default: how long a route waits for a whole body."""
VERDICT_KEY: web.ResponseKey[str] = web.ResponseKey("agentsafe.verdict", str)
"""Where a decision's response carries its verdict for the request-duration histogram."""


class Door(Protocol):
    """Authenticates a request for a route's role and scope, or raises ``RequestRejected``."""

    async def authenticate(
        self, request: web.Request, *, role: Role, scope: Scope | None
    ) -> Principal: ...


@dataclass(frozen=True)
class ReadyState:
    """What ``GET /ready`` knows. Anonymous callers get ``ready`` and ``code`` only (a stable
    code: READY, RECONCILING, EXECUTOR_HALTED, STORE_UNAVAILABLE, UNKNOWN_ATTEMPTS_OPEN); the
    mode, the action names and the counts are ``details``, for OPERATORs in
    ``GET /v1/control/status`` (``readiness``), never for whoever reaches the probe port."""

    ready: bool
    code: Code
    details: Mapping[str, Any]


# ---------------------------------------------------------------------- request schemas

_Strict = ConfigDict(extra="forbid", strict=True, frozen=True)
_TOKEN = r"^[\x21-\x7e]+$"


class ProposalModel(BaseModel):
    model_config = _Strict
    action: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")
    target: str = Field(min_length=1, max_length=512)
    parameters: JsonObject


class ActionRequest(BaseModel):
    model_config = _Strict
    proposal: ProposalModel
    idempotency_key: str = Field(
        min_length=1, max_length=255, pattern=r"^[A-Za-z0-9][A-Za-z0-9._~:=+-]*$"
    )
    correlation_id: str | None = Field(default=None, min_length=1, max_length=255, pattern=_TOKEN)


class RecoveryRequest(BaseModel):
    model_config = _Strict
    recovery: RecoveryObject


class EscalationRequest(BaseModel):
    model_config = _Strict
    escalation: EscalationObject


def _schema_error(exc: ValidationError) -> RequestRejected:
    for error in exc.errors():
        if error["type"] == "extra_forbidden":
            return RequestRejected(Code.REQUEST_INVALID, "the request carries a field it may not")
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"] if isinstance(part, str))
    return RequestRejected(
        Code.REQUEST_INVALID, f"the request does not match the schema at '{where}'"
    )


_JSON_REFUSALS: Mapping[str, str] = {
    Code.NUMBER_NOT_FINITE: "numbers must be finite",
    Code.NUMBER_OUT_OF_RANGE: "an integer is outside the exact range",
    Code.JSON_INVALID: "a string holds a lone surrogate, which has no UTF-8 form",
}


async def read_json(request: web.Request, *, timeout: float = BODY_TIMEOUT_SECONDS) -> Any:
    """Read a bounded JSON body within ``timeout`` seconds or raise the right refusal.

    A body that has arrived whole (the usual case: it came in the same read as its head) is
    read without arming the timer, which would cost every request a scheduled and cancelled
    timer handle for nothing (issue 34)."""
    if request.content_type != "application/json":
        raise RequestRejected(Code.UNSUPPORTED_MEDIA_TYPE, "the body must be application/json")
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        raise RequestRejected(Code.REQUEST_TOO_LARGE, "the body is larger than 100 KiB")
    try:
        if request.content.is_eof():  # the whole body has arrived: reading it cannot wait
            raw = await request.read()
        else:
            async with asyncio.timeout(timeout):
                raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise RequestRejected(Code.REQUEST_TOO_LARGE, "the body is larger than 100 KiB") from None
    except TimeoutError:
        raise RequestRejected(
            Code.REQUEST_TIMEOUT, "the body did not arrive in time; nothing was executed"
        ) from None
    except web.RequestPayloadError:
        raise RequestRejected(
            Code.REQUEST_MALFORMED, "the body is not well-formed (its framing is broken)"
        ) from None
    return parse_body(raw)


def parse_body(raw: bytes) -> Any:
    """The JSON value of a body already read whole, bounded, or the right refusal (no I/O: the
    fuzz target drives it directly)."""
    if len(raw) > MAX_BODY_BYTES:
        raise RequestRejected(Code.REQUEST_TOO_LARGE, "the body is larger than 100 KiB")
    try:
        value = parse_json(raw)
    except DuplicateKeyError:
        raise RequestRejected(Code.REQUEST_INVALID, "a key appears twice in one object") from None
    except CanonicalizationError as exc:
        raise RequestRejected(
            Code.REQUEST_INVALID, _JSON_REFUSALS.get(exc.code, "the body is not I-JSON")
        ) from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise RequestRejected(Code.REQUEST_MALFORMED, "the body is not valid JSON") from None
    check_json_bounds(value)
    return value


def _respond(answer: Answer) -> web.Response:
    response = web.json_response(dict(answer.body), status=answer.status)
    if answer.headers:  # most answers bring none
        response.headers.update(answer.headers)
    verdict = answer.body.get("verdict")
    if isinstance(verdict, str):
        response[VERDICT_KEY] = verdict
    return response


# ---------------------------------------------------------------------- middleware

_HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"})


@web.middleware
async def _traced(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """One server span per request (docs/tracing.md), child of the caller's W3C Trace Context
    when it sent a valid one; only the route's template, never the raw path or query."""
    if not telemetry.enabled():
        return await handler(request)
    info = request.match_info.route.resource
    template = info.canonical if info is not None else None
    method = request.method if request.method in _HTTP_METHODS else "_OTHER"
    attributes: dict[str, object] = {
        "http.request.method": method,
        "url.scheme": request.scheme,
        "network.protocol.version": f"{request.version.major}.{request.version.minor}",
    }
    if template is not None:
        attributes["http.route"] = template
    name = f"{method} {template}" if template is not None else method
    with telemetry.span(
        name,
        attributes,
        kind=telemetry.SpanKind.SERVER,
        context=telemetry.extract(request.headers),
    ) as current:
        response = await handler(request)
        if current is not None:
            verdict = response.get(VERDICT_KEY)
            outcome: dict[str, object] = {"http.response.status_code": response.status}
            if isinstance(verdict, str):
                outcome["agentsafe.verdict"] = verdict
            if response.status >= 500:
                outcome["error.type"] = str(response.status)
            current.set_attributes(telemetry.safe_attributes(outcome))
        return response


@web.middleware
async def _errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except RequestRejected as exc:
        response = refusal(exc.code, exc.message, headers=exc.headers)
        if not request.content.is_eof():
            # Refused before the body was read whole (the door, a media type, a deadline):
            # close rather than drain what the peer may be sending slowly.
            response.force_close()
        return response
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
        allow = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        return refusal(
            code_for_http_error(exc.status), exc.reason, status=exc.status, headers=allow
        )
    except AgentSafeError as exc:
        if exc.code != Code.CHAIN_JOURNAL:
            return _internal_error(request)
        # A chained line this request needed was refused: the heads cannot be persisted (the
        # executor halts, cause CHAIN_HEADS). Coded, and, like the 500, it never says whether
        # anything was executed (the pipeline answers for what it dispatched).
        log.error("a chained line was refused in %s %s", request.method, request.path)
        return refusal(
            Code.CHAIN_HEADS_UNAVAILABLE,
            "the evidence chain cannot record this request (its heads cannot be persisted);"
            " retry with the same idempotency key to learn the outcome",
            headers={"Retry-After": "30"},
        )
    except Exception:
        return _internal_error(request)


def _internal_error(request: web.Request) -> web.Response:
    log.exception("unhandled error in %s %s", request.method, request.path)
    # Raised from anywhere: this answer cannot know whether anything was executed, so it never
    # says (the pipeline answers for what it dispatched: an attempt's own answer, never this).
    return refusal(
        Code.INTERNAL_ERROR,
        "the executor failed before it could answer; retry with the same idempotency key to"
        " learn the outcome",
    )


async def _security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """The four headers on every response. A route may bring its own stricter policy (the
    approval page's nonce-bound one) only if it still starts ``default-src 'none'`` and forbids
    framing; anything else is replaced by the default."""
    headers = response.headers
    own = headers.get(_CSP, "")
    headers.update(_SECURITY_HEADERS)
    headers[_SERVER] = SERVER_HEADER
    if own.startswith("default-src 'none';") and "frame-ancestors 'none'" in own:
        headers[_CSP] = own


# ---------------------------------------------------------------------- application


def build_app(
    routes: Sequence[Route],
    *,
    door: Door,
    body_timeout: float = BODY_TIMEOUT_SECONDS,
    metrics: ExecutorMetrics | None = None,
) -> web.Application:
    """The executor's aiohttp application, one handler per row of ``routes``; each body is read
    within ``body_timeout`` seconds (``EXECUTOR_BODY_TIMEOUT_SECONDS``); with ``metrics``, every
    request's duration is recorded by its row's template, method and outcome."""
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_traced, _errors])
    app.on_response_prepare.append(_security_headers)
    if metrics is not None:
        metrics.declare_routes((route.method, route.path) for route in routes)
    for route in routes:
        handler = _bind(route, door, body_timeout)
        if metrics is not None:
            handler = _timed(route, handler, metrics)
        if route.method == "GET":
            app.router.add_get(route.path, handler)
        else:
            app.router.add_route(route.method, route.path, handler)
    return app


def _bind(
    route: Route, door: Door, body_timeout: float
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The door, then the body, then the row's handler; every refusal and status the route
    answers is checked against what its row declares (``routes/contract.py``; the statuses
    taken once, here, so a declared answer is checked without a call)."""
    declared = declared_statuses(route)

    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            response = await _through(route, door, request, body_timeout)
        except RequestRejected as exc:
            check_refusal(route, exc.code)
            raise
        except StoreError as exc:
            if exc.code == Code.STORE_UNAVAILABLE:
                check_refusal(route, exc.code)
            raise
        if response.status not in declared:
            check_status(route, response.status)  # warns: the row does not declare it
        return response

    return handle


def _timed(
    route: Route,
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    metrics: ExecutorMetrics,
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """``handler`` with its duration recorded once per request: by the row's template (never the
    raw path), its method, and the outcome (a decision's verdict, else the answer's class).
    The histogram's child for labels seen before is observed here, without a call into the
    metrics; the metrics resolve new labels (``observe_request``) and keep the child."""
    kept = metrics.kept_durations  # live: observe_request adds to it
    # Only exact strings find a kept child (``host/metrics.py``: a ``str`` subclass may label
    # a series differently from the equal string).
    exact = type(route.method) is str and type(route.path) is str

    async def handle(request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        outcome = "error"
        try:
            response = await handler(request)
        except RequestRejected as exc:
            outcome = outcome_of_status(status_of(exc.code))
            raise
        except StoreError as exc:
            outcome = "unavailable" if exc.code == Code.STORE_UNAVAILABLE else "error"
            raise
        except web.HTTPException as exc:
            outcome = outcome_of_status(exc.status)
            raise
        else:
            verdict = response.get(VERDICT_KEY)
            outcome = verdict if isinstance(verdict, str) else outcome_of_status(response.status)
            return response
        finally:
            seconds = time.perf_counter() - started
            child = (
                kept.get((route.method, route.path, outcome))
                if exact and type(outcome) is str
                else None
            )
            if child is not None:
                child.observe(seconds)
            else:
                metrics.observe_request(route.method, route.path, outcome, seconds)

    return handle


async def _through(
    route: Route, door: Door, request: web.Request, body_timeout: float
) -> web.StreamResponse:
    principal = None
    if route.role is not None:
        principal = await door.authenticate(request, role=route.role, scope=route.scope)
    query = None
    if route.query is not None:
        try:
            query = route.query.model_validate(dict(request.query))
        except ValidationError as exc:
            raise _schema_error(exc) from None
    body = None
    if route.body is not None:
        raw = await read_json(request, timeout=body_timeout)
        try:
            body = route.body.model_validate(raw)
        except ValidationError as exc:
            if route.invalid is not None:
                raise RequestRejected(Code.REQUEST_INVALID, route.invalid) from None
            raise _schema_error(exc) from None
    return await route.handler(Call(request, principal, body, query))


def core_routes(
    *,
    pipeline: Pipeline,
    reconciler: Reconciliations,
    escalator: Escalations,
    readiness: Callable[[], ReadyState],
    jwks: Callable[[], Mapping[str, Any]],
) -> tuple[Route, ...]:
    """The probes, the authority's keys, and the agent's proposal, reconciliation and escalation."""

    async def health(call: Call) -> web.StreamResponse:
        return web.json_response({"status": "ok"})

    async def ready(call: Call) -> web.StreamResponse:
        state = readiness()
        body = {"ready": state.ready, "code": state.code}
        return web.json_response(body, status=200 if state.ready else 503)

    async def grant_jwks(call: Call) -> web.StreamResponse:
        return web.json_response(dict(jwks()))

    async def actions(call: Call) -> web.StreamResponse:
        parsed: ActionRequest = call.body
        proposal = Proposal(
            action=parsed.proposal.action,
            target=parsed.proposal.target,
            parameters=parsed.proposal.parameters,
            idempotency_key=parsed.idempotency_key,
            correlation_id=parsed.correlation_id,
        )
        # The pipeline runs as its own task (cancelled with this one): each of its resumptions
        # starts there, not again at this route's middleware (issue 32).
        return _respond(await asyncio.ensure_future(pipeline.propose(call.caller, proposal)))

    async def reconciliations(call: Call) -> web.StreamResponse:
        parsed: RecoveryRequest = call.body
        return _respond(await reconciler.reconcile(call.caller, parsed.recovery))

    async def escalations(call: Call) -> web.StreamResponse:
        parsed: EscalationRequest = call.body
        return _respond(await escalator.resume(call.caller, parsed.escalation))

    proposer = Role.PROPOSER
    decision = {200: Decision, 503: Decision}
    escalation = "$response.body#/escalation"
    request_id = {"request_id": "$response.body#/escalation/request_id"}
    return (
        Route(
            "GET",
            "/health",
            None,
            None,
            None,
            health,
            summary="Liveness: the process answers",
            answers={200: Health},
        ),
        Route(
            "GET",
            "/ready",
            None,
            None,
            None,
            ready,
            summary="Readiness: reconciled, not halted, the store answers",
            answers={200: Readiness, 503: Readiness},
        ),
        Route(
            "GET",
            "/.well-known/agentsafe-grant-jwks.json",
            None,
            None,
            None,
            grant_jwks,
            summary="The authority's public grant keys (JWKS)",
            answers={200: Jwks},
        ),
        Route(
            "POST",
            "/v1/actions",
            proposer,
            None,
            ActionRequest,
            actions,
            summary="Propose an action: pin the intent, ask the authority, run it once on ALLOW",
            answers=decision,
            codes=PROPOSE_CODES,
            links=(
                Link("GET /v1/approvals/{request_id}", request_id, description="Review it"),
                Link("POST /v1/approvals/{request_id}", request_id, description="Decide it"),
                Link("POST /v1/escalations", body={"escalation": escalation}),
                Link("POST /v1/escalations/cancel", body={"escalation": escalation}),
                Link("POST /v1/control/approvals/{request_id}/cancel", request_id),
                Link("POST /v1/control/evidence-export", description="Export its evidence"),
            ),
        ),
        Route(
            "POST",
            "/v1/reconciliations",
            proposer,
            None,
            RecoveryRequest,
            reconciliations,
            summary="Ask what became of an attempt whose answer was lost (read-only)",
            answers={200: Decision},
            codes=RECONCILE_CODES,
        ),
        Route(
            "POST",
            "/v1/escalations",
            proposer,
            None,
            EscalationRequest,
            escalations,
            summary="Present an escalation object back once a person decided it",
            answers=decision,
            codes=ESCALATION_CODES,
            links=(
                Link("POST /v1/escalations/cancel", body={"escalation": escalation}),
                Link("GET /v1/approvals/{request_id}", request_id),
            ),
        ),
    )


_CEILINGS = frozenset(
    {
        Code.HARD_LIMIT_EXCEEDED,
        Code.HARD_LIMIT_CURRENCY_UNKNOWN,
        Code.HARD_LIMIT_AMOUNT_INVALID,
        Code.HARD_LIMIT_WINDOW_COUNT_EXCEEDED,
        Code.HARD_LIMIT_WINDOW_SUM_EXCEEDED,
    }
)
_ONCE = frozenset(
    {
        Code.IDEMPOTENCY_KEY_CONFLICT,
        Code.IDEMPOTENCY_IN_PROGRESS,
        Code.STORE_UNAVAILABLE,
        # a shared store's attempt lost before it sent anything (issue 29): retry, same key
        Code.IDEMPOTENCY_TAKEN_OVER,
        Code.ATTEMPT_FENCED,
    }
)
PROPOSE_CODES = (
    _ONCE
    | _CEILINGS
    | ADMISSION_CODES
    | {
        Code.ACTION_NOT_PERMITTED_FOR_PRINCIPAL,
        Code.ACTION_NOT_REGISTERED,
    }
)
"""What ``POST /v1/actions`` refuses with past the door and the body (``lifecycle/pipeline.py``,
``lifecycle/ceilings.py``, ``door.check_action``, and a deriving handler's admission,
``codes.ADMISSION_CODES``)."""
RECONCILE_CODES = frozenset(
    {
        Code.RECOVERY_BINDING_MISMATCH,
        Code.INTENT_PRINCIPAL_MISMATCH,
        Code.ACTION_NOT_REGISTERED,
        Code.STORE_UNAVAILABLE,
    }
)
ESCALATION_CODES = _ONCE | {
    Code.ESCALATION_NOT_CONFIGURED,
    Code.ESCALATION_BINDING_MISMATCH,
    Code.INTENT_PRINCIPAL_MISMATCH,
    Code.APPROVAL_NOT_FOUND,
    Code.ACTION_NOT_REGISTERED,
}
