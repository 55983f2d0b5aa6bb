"""The gateway's listener: one HTTP request in, one intent, one answer the client can read.

For ``POST``, ``PUT``, ``PATCH`` and ``DELETE`` (and ``GET``, ``HEAD``, ``OPTIONS`` when the
policy has an ``http_read`` action; without one they pass through unbound, as the policy says by
not naming them) the request is captured (``gateway/intercept.py``), kept under its idempotency
key (the client's ``Idempotency-Key`` when it sends a valid one, else a fresh one) and proposed to
the pipeline as the action ``http_request`` (``http_read``) by the gateway's principal. The
pipeline decides, and on ALLOW in enforcement claims the single-use grant, journals and runs
``gateway_forward`` once (``gateway/forward.py``): the journal, reconciliation and evidence are
the same as ``agentsafe serve``'s. The answers:

======================================  ==========================================================
what happened                            the client sees
======================================  ==========================================================
ALLOW, forwarded                         the upstream's own answer (status, headers, body)
ALLOW, a replay of a key already used    200 ``{"replayed": true, "result"}``; nothing sent again
BLOCK                                    403 ``GATEWAY_BLOCKED`` with the reason codes
ESCALATE                                 202 ``{"state": "ESCALATE_PENDING", "escalation"}``, held
ESCALATE with approvals                  the same with the approval's escalation object
                                         (``approval_url``) and ``resume``; the request is held
                                         (``Exchanges.hold``) and forwarded once on the resume
authority cannot be reached              503 ``GATEWAY_AUTHORITY_UNAVAILABLE``, ``Retry-After``
halted                                   503 ``EXECUTOR_HALTED``, ``Retry-After``
outcome unknown after sending            502 ``GATEWAY_OUTCOME_UNKNOWN`` with the recovery object
not sent                                 502 ``GATEWAY_NOT_EXECUTED`` with the reason codes
the answer carries a credential           502 ``GATEWAY_ANSWER_WITHHELD`` with the upstream's status
                                         (``gateway/screen.py``; never the answer)
the store does not answer                503 ``STORE_UNAVAILABLE``, ``Retry-After``
an ambiguous path                        400 ``GATEWAY_PATH_AMBIGUOUS`` (``intercept.py``)
a method override (header or _method)    400 ``GATEWAY_METHOD_OVERRIDE_REFUSED``
a body the policy cannot read            422 ``GATEWAY_BODY_UNREADABLE``
a body on a read passed through unbound  400 ``GATEWAY_READ_BODY_REFUSED``
another request under a held key         409 ``GATEWAY_HELD_REQUEST_CONFLICT``; the hold is kept
an upgrade                               400 ``GATEWAY_UPGRADE_REFUSED``
a streaming body                         411 ``GATEWAY_STREAMING_REFUSED``
an oversize body (over 100 KiB)          413 ``GATEWAY_BODY_TOO_LARGE``
a body slower than the body deadline    408 ``REQUEST_TIMEOUT`` (the connection closes)
CL+TE, duplicate Content-Length, folded  400 ``HTTP_MALFORMED`` (the connection closes)
======================================  ==========================================================

In shadow (the default) every request is forwarded as it would be without the gateway, and the
answer carries ``x-agentsafe-shadow-verdict``: what enforcement would have done is in the shadow
report. Every answer says who decided in ``x-agentsafe-authority``.

The connection is the executor's own hardened listener (``routes/listener.py``'s
:class:`GuardedSite`, wired by ``proxy.py``): the same header and body deadlines, connection caps
and parser refusals. aiohttp's llhttp parser refuses the request-smuggling framings strictly, and
that listener answers every parser refusal in the refusal contract (400 ``HTTP_MALFORMED``, a
fixed message, nothing echoed, the connection closed): one rule for the gateway and ``serve``.
The body is read whole within the body deadline (408 ``REQUEST_TIMEOUT``, connection closed).

Callers: ``proxy.py`` (builds and runs it).
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import web, web_request

from .. import telemetry
from ..clock import parse_ms
from ..codes import WORK_GATE_CODES, Code
from ..egress.transport import HttpResponse, Transport, TransportError
from ..errors import AgentSafeError, RequestRejected
from ..events import EventSink
from ..lifecycle.answers import error_body
from ..lifecycle.pipeline import Pipeline, Proposal
from ..principals import Principal
from .forward import Exchange, Exchanges
from .intercept import (
    MAX_BODY_BYTES,
    UNREADABLE,
    WRITE_METHODS,
    capture,
    forwardable_headers,
    normalised_path,
    overrides_method,
    read_body,
    refusal_for,
    response_headers,
)
from .screen import Screen, withheld_field

__all__ = ["Gateway"]

_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._~:=+-]{0,200}$")
_RETRY_AFTER = "5"
_TRACED_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
RESUME_HINT: Final = (
    "held until the intent expires: once an APPROVER decides at approval_url, POST "
    '{"escalation": <this object>} to /v1/escalations on the executor\'s routes (--serve-routes) '
    "as this gateway's principal; the held request is forwarded then, once"
)


def _refusal(
    code: Code, message: str, *, headers: Mapping[str, str] | None = None, **extra: Any
) -> web.Response:
    body = error_body(code, message)
    body.update(extra)
    response = web.json_response(body, status=code.status or 400)
    response.headers.update(headers or {})
    return response


@dataclass
class Gateway:
    """What one request needs: the pipeline, who proposes, where to, and what to say."""

    pipeline: Pipeline
    principal: Principal
    upstream: str
    transport: Transport
    exchanges: Exchanges
    read_action: bool
    authority: str  # the x-agentsafe-authority value: "local" or "demo"
    timeout: float
    log: Callable[[str], None]
    screen: Screen  # the process's redactor, as serve screens provider strings
    security: EventSink
    body_timeout: float = 30.0  # EXECUTOR_BODY_TIMEOUT_SECONDS

    @property
    def shadow(self) -> bool:
        return self.pipeline.mode.value == "SHADOW"

    async def handle(self, request: web_request.BaseRequest) -> web.StreamResponse:
        # one server span per intercepted request, child of the caller's trace context (no
        # route template here: the path is the caller's, so only the method is named)
        method = request.method if request.method in _TRACED_METHODS else "_OTHER"
        with telemetry.span(
            method,
            {"http.request.method": method, "url.scheme": request.scheme},
            kind=telemetry.SpanKind.SERVER,
            context=telemetry.extract(request.headers),
        ) as current:
            response = await self._handle(request)
            if current is not None:
                current.set_attribute("http.response.status_code", response.status)
        response.headers["x-agentsafe-authority"] = self.authority
        return response

    async def _handle(self, request: web_request.BaseRequest) -> web.StreamResponse:
        method = request.method
        raw = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.raw_headers]
        code = refusal_for(method, raw)
        path = normalised_path(request.raw_path)
        shown = path or "(ambiguous path)"  # a refused target is never written anywhere
        if code is None and path is None:
            code = Code.GATEWAY_PATH_AMBIGUOUS
        if code is not None:
            self.log(f"{method} {shown} -> refused {code}")
            return _refusal(code, _MESSAGES[code])
        assert path is not None
        try:
            async with asyncio.timeout(self.body_timeout):
                body = await request.content.read()  # bounded: Content-Length was checked
        except TimeoutError:
            self.log(f"{method} {path} -> refused {Code.REQUEST_TIMEOUT}")
            response = _refusal(
                Code.REQUEST_TIMEOUT, "the body did not arrive in time; nothing was sent"
            )
            response.force_close()
            return response
        if len(body) > MAX_BODY_BYTES:
            self.log(f"{method} {path} -> refused {Code.GATEWAY_BODY_TOO_LARGE}")
            return _refusal(Code.GATEWAY_BODY_TOO_LARGE, _MESSAGES[Code.GATEWAY_BODY_TOO_LARGE])
        query = request.rel_url.raw_query_string
        headers = forwardable_headers(raw)
        bound = method in WRITE_METHODS or self.read_action
        value = read_body(body, request.headers.get("content-type"))
        code = None
        if overrides_method(query, value):
            code = Code.GATEWAY_METHOD_OVERRIDE_REFUSED
        elif not bound and body:
            code = Code.GATEWAY_READ_BODY_REFUSED
        elif value is UNREADABLE:
            code = Code.GATEWAY_BODY_UNREADABLE
        if code is not None:
            self.log(f"{method} {path} -> refused {code}")
            return _refusal(code, _MESSAGES[code])
        if not bound:
            self.log(f"{method} {path} -> passed through (the policy names no http_read)")
            return await self._pass_through(method, path, query, headers, body)
        given = request.headers.get("idempotency-key", "")
        key = given if _KEY.match(given) else f"gw-{uuid.uuid4()}"
        parameters = capture(method=method, path=path, query=query, body=body, value=value)
        captured = Exchange(method, path, query, headers, body)
        existing = self.exchanges.put(key, captured)
        if existing is not None and not (
            existing.held_until is not None and existing.same_request(captured)
        ):
            # Held for an approval (or in flight) under this key: never replaced, never dropped.
            code = Code.GATEWAY_HELD_REQUEST_CONFLICT
            self.log(f"{method} {path} -> refused {code}")
            return _refusal(code, _MESSAGES[code])
        exchange: Exchange | None = existing
        try:
            answer = await self.pipeline.propose(
                self.principal,
                Proposal(
                    action="http_request" if method in WRITE_METHODS else "http_read",
                    target=f"http:{self.upstream}"[:512],
                    parameters=parameters,
                    idempotency_key=key,
                ),
            )
        except RequestRejected as exc:
            self.log(f"{method} {path} -> refused {exc.code}")
            return _refusal(exc.code, exc.message, headers=dict(exc.headers or {}))
        except AgentSafeError as exc:
            if exc.code != Code.STORE_UNAVAILABLE:
                raise
            self.log(f"{method} {path} -> refused {Code.STORE_UNAVAILABLE}; nothing forwarded")
            return _refusal(
                Code.STORE_UNAVAILABLE,
                "the use store cannot answer; nothing was sent",
                headers={"Retry-After": _RETRY_AFTER},
            )
        finally:
            if existing is None:  # the hold, if this re-sent a held request, stays as it was
                exchange = self.exchanges.pop(key)
        decided: dict[str, Any] = dict(answer.body)
        reasons = list(decided.get("reason_codes") or [])
        verdict = decided.get("verdict")
        outcome = decided.get("outcome")
        summary = f"{verdict} {outcome} ({', '.join(reasons) or 'no reason codes'})"
        if Code.AUTHORITY_UNAVAILABLE in reasons:
            self.log(f"{method} {path} -> the authority cannot be reached; nothing forwarded")
            return _refusal(
                Code.GATEWAY_AUTHORITY_UNAVAILABLE,
                "the authority could not be reached: this is not a verdict; nothing was sent",
                headers={"Retry-After": _RETRY_AFTER},
                state=Code.AUTHORITY_UNAVAILABLE,
                intent_hash=decided.get("intent_hash"),
            )
        if self.shadow and answer.status < 500:
            self.log(f"{method} {path} -> shadow: would be {verdict}; forwarded as before")
            forwarded = await self._pass_through(method, path, query, headers, body)
            forwarded.headers["x-agentsafe-shadow-verdict"] = str(verdict)
            return forwarded
        if answer.status == 503:
            # Why the boundary takes no work now (halted, the store down, ...): its own code.
            code = next(
                (Code[r] for r in reasons if r in WORK_GATE_CODES), Code.GATEWAY_NOT_EXECUTED
            )
            self.log(f"{method} {path} -> {summary}; nothing forwarded")
            return _refusal(
                code,
                "the boundary is not taking work; nothing was sent",
                headers={"Retry-After": answer.headers.get("Retry-After", _RETRY_AFTER)},
                reason_codes=reasons,
            )
        common: dict[str, Any] = {
            "intent_hash": decided.get("intent_hash"),
            "decision_id": decided.get("decision_id"),
            "reason_codes": reasons,
        }
        if verdict == "BLOCK":
            self.log(f"{method} {path} -> {summary}; refused")
            return _refusal(Code.GATEWAY_BLOCKED, "the policy refused this request", **common)
        if verdict == "ESCALATE":
            self.log(f"{method} {path} -> {summary}; held")
            escalation = decided.get("escalation")
            extra: dict[str, Any] = {}
            if escalation is not None and exchange is not None and "token" in escalation:
                # EXECUTOR_ESCALATION=APPROVAL: the request is held for the resume.
                intent = escalation.get("intent") or {}
                until = parse_ms(str(intent.get("expires_at")))
                self.exchanges.hold(key, exchange, until=until, now=time.time())
                extra["resume"] = RESUME_HINT
            if escalation is None:
                escalation = {
                    "mode": "HOLD",
                    "intent_id": decided.get("intent_id"),
                    "intent_hash": decided.get("intent_hash"),
                }
            return web.json_response(
                {"state": "ESCALATE_PENDING", "escalation": escalation, **extra, **common},
                status=202,
            )
        if outcome == "COMPLETED":
            if exchange is not None and exchange.response is not None:
                self.log(f"{method} {path} -> {summary}; forwarded once under a claimed grant")
                out = await self._relay(exchange.response, common, echoed=exchange.echoed)
                out.headers["x-agentsafe-intent-hash"] = str(decided.get("intent_hash"))
                return out
            self.log(f"{method} {path} -> {summary}; a replay, nothing sent again")
            return web.json_response(
                {"replayed": True, "result": decided.get("result"), **common}, status=200
            )
        if outcome == "UNKNOWN_AFTER_DISPATCH":
            self.log(f"{method} {path} -> {summary}; outcome unknown, reconcile")
            return _refusal(
                Code.GATEWAY_OUTCOME_UNKNOWN,
                "the request was sent and its outcome is unknown; it is not sent again",
                recovery=decided.get("recovery"),
                **common,
            )
        self.log(f"{method} {path} -> {summary}; not sent")
        return _refusal(Code.GATEWAY_NOT_EXECUTED, "the request was not sent", **common)

    async def _pass_through(
        self, method: str, path: str, query: str, headers: dict[str, str], body: bytes
    ) -> web.StreamResponse:
        url = self.upstream + path + (f"?{query}" if query else "")
        try:
            upstream = await self.transport.request(
                method,
                url,
                headers=headers,
                body=body if body or method not in ("GET", "HEAD", "OPTIONS") else None,
                timeout=self.timeout,
            )
        except TransportError as exc:
            return _refusal(
                Code.GATEWAY_UPSTREAM_UNREACHABLE,
                "the upstream could not be reached",
                transport=exc.code,
            )
        return await self._relay(upstream, {})

    async def _relay(
        self, upstream: HttpResponse, common: Mapping[str, Any], *, echoed: str | None = None
    ) -> web.Response:
        """The upstream's answer as the client sees it, or 502 ``GATEWAY_ANSWER_WITHHELD``
        when any part of it carries a credential (``gateway/screen.py``)."""
        relayed = HttpResponse(
            status=upstream.status,
            headers=_client_headers(upstream.headers),
            body=upstream.body,
        )
        where = echoed or await asyncio.to_thread(withheld_field, relayed, self.screen)
        if where is None:
            return _from_upstream(relayed)
        self.security.emit("PROVIDER_STRING_WITHHELD", {"action": "http_request", "field": where})
        self.log(f"answer withheld: the upstream's {where.split(':')[0]} carried a credential")
        return _refusal(
            Code.GATEWAY_ANSWER_WITHHELD,
            "the upstream answered, and its answer carried a credential: it is withheld",
            upstream_status=upstream.status,
            **common,
        )


def _client_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in response_headers(headers).items() if k != "content-encoding"}


def _from_upstream(upstream: HttpResponse) -> web.Response:
    return web.Response(
        status=upstream.status, body=upstream.body, headers=_client_headers(upstream.headers)
    )


_MESSAGES: dict[Code, str] = {
    Code.GATEWAY_UPGRADE_REFUSED: "protocol upgrades and CONNECT are not intercepted",
    Code.GATEWAY_STREAMING_REFUSED: "a streaming (Transfer-Encoding) body cannot be bound; "
    "send Content-Length",
    Code.GATEWAY_BODY_TOO_LARGE: f"the body is larger than {MAX_BODY_BYTES} bytes",
    Code.GATEWAY_METHOD_REFUSED: "this method is not intercepted",
    Code.HTTP_MALFORMED: "the request's framing is ambiguous or malformed",
    Code.GATEWAY_PATH_AMBIGUOUS: "the request path is ambiguous (an escaped separator, a dot or "
    "empty segment, a backslash or a path parameter); send it in its plain form",
    Code.GATEWAY_METHOD_OVERRIDE_REFUSED: "a method-override header or _method field is refused: "
    "send the method itself",
    Code.GATEWAY_READ_BODY_REFUSED: "a read passed through unbound may not carry a body",
    Code.GATEWAY_BODY_UNREADABLE: "the body is not a strict JSON document (one canonical form) "
    "the policy can read; nothing was sent",
    Code.GATEWAY_HELD_REQUEST_CONFLICT: "a different request is held or in flight under this "
    "idempotency key; it is kept as it was and nothing was sent",
}
