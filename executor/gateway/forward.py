"""The gateway's handler: forward the captured request byte for byte, once, inside dispatch.

The listener (``gateway/listener.py``) keeps each request it captured in :class:`Exchanges`
under its idempotency key, then proposes the intent; on ALLOW in enforcement the pipeline claims
the grant, journals the attempt and runs :class:`GatewayForwardHandler` through the seam like any
handler. The handler takes the request from the exchanges, checks it is the one the intent binds
(method, path, query and the body's SHA-256 against the verified parameters; nothing is sent on
a mismatch), adds the credential's headers and the binding headers, and sends the exact body
bytes to the upstream through the guarded client inside ``dispatch.run``. Whatever the upstream
answers is the result (an HTTP answer means it was reached; the client gets that answer), kept in
the exchange for the listener; a failure after sending is an unknown outcome, reconciled through
``DOWNSTREAM_LOOKUP_URL`` when one is configured, read-only.

ESCALATE with ``EXECUTOR_ESCALATION=APPROVAL``: the listener holds the captured request
(:meth:`Exchanges.hold`) until its intent expires. When the proposer resumes the escalation
(``POST /v1/escalations`` on the executor's routes, ``--serve-routes``) after an APPROVER
approved it, the pipeline decides again and runs this handler once under the approval's own
idempotency scope: the held bytes are forwarded then, once, and the hold is dropped. A second
resume replays the first answer; nothing is sent twice. A held request is immutable:
:meth:`Exchanges.put` never replaces what is under a key (held or in flight), so a re-send with
other headers or another body is refused by the listener (409 ``GATEWAY_HELD_REQUEST_CONFLICT``)
and the resume forwards exactly what was held when the approver decided.

After sending, the handler looks for the credential values it has just sent in the answer
(``gateway/screen.py``'s :func:`~agentsafe.executor.gateway.screen.echoes`: half a value is
enough) and marks the exchange, so the listener withholds it.

Callers: ``proxy.py`` (registers it), ``gateway/listener.py`` (the exchanges).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import quote

from .. import telemetry
from ..codes import Code
from ..dispatch.seam import Dispatch, ExecutionContext, ReconcileResult, ReconcileStatus
from ..egress.credentials import DownstreamCredential
from ..egress.transport import HttpResponse, Transport, TransportError
from ..errors import HandlerError
from ..headers import is_reserved
from .intercept import body_digest
from .screen import echoes

__all__ = [
    "HANDLER",
    "MAX_HELD",
    "PARAMETERS_SCHEMA",
    "Exchange",
    "Exchanges",
    "GatewayForwardHandler",
]

HANDLER: Final = "gateway_forward"
MAX_HELD: Final = 256
"""At most this many requests held for approval at once (each at most 100 KiB)."""
PARAMETERS_SCHEMA: Final[Mapping[str, Any]] = {
    "type": "object",
    "required": ["method", "path", "query", "body_digest", "body"],
    "additionalProperties": False,
    "properties": {
        "method": {"enum": ["POST", "PUT", "PATCH", "DELETE", "GET", "HEAD", "OPTIONS"]},
        "path": {"type": "string", "pattern": "^/", "maxLength": 2048},
        "query": {"type": "string", "maxLength": 4096},
        "body_digest": {"type": "string", "pattern": "^sha256:[0-9a-f]{64}$"},
        "body": {},
    },
}


@dataclass
class Exchange:
    """One captured request, and the upstream's answer once it was forwarded."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    response: HttpResponse | None = None
    held_until: float | None = None  # epoch seconds: held for an approval until the intent expires
    echoed: str | None = None  # the field of the answer that echoed a credential value sent

    def same_request(self, other: Exchange) -> bool:
        """Whether ``other`` is this request exactly: method, path, query, headers, body."""
        return (self.method, self.path, self.query, self.headers, self.body) == (
            other.method,
            other.path,
            other.query,
            other.headers,
            other.body,
        )


@dataclass
class Exchanges:
    """Captured requests by idempotency key, for the time between capture and answer, and a
    request held for a person's approval until its intent expires (then it is dropped)."""

    _by_key: dict[str, Exchange] = field(default_factory=dict)

    def put(self, key: str, exchange: Exchange, *, now: float | None = None) -> Exchange | None:
        """Keep ``exchange`` under ``key`` unless one is already there (held for an approval or
        in flight): that one is returned and never replaced, so what an approver saw is what
        is forwarded, and a request is never swapped under another's grant. A hold whose
        intent has expired (``now``, epoch seconds) is gone: nothing can resume it."""
        existing = self._by_key.get(key)
        moment = time.time() if now is None else now
        if existing is not None and not (
            existing.held_until is not None and existing.held_until <= moment
        ):
            return existing
        self._by_key[key] = exchange
        return None

    def hold(self, key: str, exchange: Exchange, *, until: float, now: float) -> None:
        """Keep ``exchange`` for a resume after approval; drop every hold already expired, and
        past :data:`MAX_HELD` the one expiring soonest (its resume is then not executed,
        ``GATEWAY_EXCHANGE_LOST``: memory is bounded, and nothing is ever sent unheld)."""
        for old in [k for k, e in self._by_key.items() if e.held_until and e.held_until <= now]:
            del self._by_key[old]
        held = [(e.held_until, k) for k, e in self._by_key.items() if e.held_until is not None]
        if key not in self._by_key and len(held) >= MAX_HELD:
            del self._by_key[min(held)[1]]
        exchange.held_until = until
        self._by_key[key] = exchange

    def get(self, key: str) -> Exchange | None:
        return self._by_key.get(key)

    def pop(self, key: str) -> Exchange | None:
        return self._by_key.pop(key, None)

    def __len__(self) -> int:
        return len(self._by_key)


class GatewayForwardHandler:
    """The ``gateway_forward`` handler (see the module docstring)."""

    parameters_schema = PARAMETERS_SCHEMA
    description = "An HTTP request to the upstream, forwarded byte for byte on ALLOW."

    def __init__(
        self,
        *,
        upstream: str,
        lookup_url: str | None,
        timeout_ms: int,
        transport: Transport,
        credential: DownstreamCredential | None,
        exchanges: Exchanges,
    ) -> None:
        self._upstream = upstream.rstrip("/")
        self._lookup_url = lookup_url
        self._timeout = timeout_ms / 1000
        self._transport = transport
        self._credential = credential
        self._exchanges = exchanges

    def __repr__(self) -> str:
        return "GatewayForwardHandler()"

    async def execute(self, ctx: ExecutionContext, dispatch: Dispatch) -> Mapping[str, Any]:
        exchange = self._exchanges.get(ctx.idempotency_key)
        params = ctx.parameters
        if exchange is None:
            raise HandlerError(
                "the captured request is not held by this process", code=Code.GATEWAY_EXCHANGE_LOST
            )
        if (
            exchange.method != params.get("method")
            or exchange.path != params.get("path")
            or exchange.query != params.get("query")
            or body_digest(exchange.body) != params.get("body_digest")
        ):
            raise HandlerError(
                "the request differs from the intent", code=Code.GRANT_BINDING_MISMATCH
            )
        url = self._upstream + exchange.path + (f"?{exchange.query}" if exchange.query else "")
        auth = ctx.authorization
        headers = dict(exchange.headers)
        headers.update(
            {
                "idempotency-key": ctx.idempotency_key,
                "x-agent-safe-intent-hash": ctx.intent.intent_hash,
                "x-agent-safe-dossier-id": auth.dossier_id,
                "x-agent-safe-grant-id": auth.grant_id,
                "x-agent-safe-decision-id": auth.decision_id,
            }
        )
        extra: Mapping[str, str] = {}
        if self._credential is not None:
            extra = await self._credential.headers_for(
                method=exchange.method,
                url=url,
                body=exchange.body,
                idempotency_key=ctx.idempotency_key,
                intent_hash=ctx.intent.intent_hash,
                grant_id=auth.grant_id,
                decision_id=auth.decision_id,
                attestation=ctx.attestation,
            )
            headers.update({k.lower(): v for k, v in extra.items()})

        async def send(key: str) -> HttpResponse:
            timeout = min(self._timeout, ctx.remaining())
            sent = {**headers, "idempotency-key": key}
            with telemetry.span(
                "agentsafe.dispatch",
                {"http.request.method": exchange.method, "url.scheme": url.split(":", 1)[0]},
                kind=telemetry.SpanKind.CLIENT,
            ) as current:
                # while tracing is on, the caller's trace context is replaced by this span's
                telemetry.inject(sent)
                response = await self._transport.request(
                    exchange.method,
                    url,
                    headers=sent,
                    body=exchange.body if exchange.body or exchange.method != "GET" else None,
                    timeout=timeout,
                )
                if current is not None:
                    current.set_attribute("http.response.status_code", response.status)
                return response

        response = await dispatch.run(send)
        exchange.response = response
        # The redactor cannot see a credential cut short: look for the values just sent.
        # (a signing credential returns the covered binding headers too: no secret there)
        sent = [v for k, v in extra.items() if not is_reserved(k)]
        exchange.echoed = echoes(response, sent)
        if exchange.held_until is not None:  # resumed after approval: sent; hold it no longer
            self._exchanges.pop(ctx.idempotency_key)
        return {
            "status": response.status,
            "accepted": 200 <= response.status < 400,
            "response_digest": "sha256:" + hashlib.sha256(response.body).hexdigest(),
        }

    async def reconcile(self, idempotency_key: str, *, intent_hash: str) -> ReconcileResult:
        """Read-only: ``DOWNSTREAM_LOOKUP_URL`` by key when configured; else unknown. The lookup
        names the key and the lost attempt's intent hash, as serve's lookups do."""
        if self._lookup_url is None:
            return ReconcileResult(ReconcileStatus.UNKNOWN, reason_code=Code.LOOKUP_NOT_CONFIGURED)
        url = self._lookup_url.replace("{idempotency_key}", quote(idempotency_key, safe=""))
        try:
            response = await self._transport.request(
                "GET",
                url,
                headers={
                    "idempotency-key": idempotency_key,
                    "x-agent-safe-intent-hash": intent_hash,
                },
                body=None,
                timeout=self._timeout,
            )
        except TransportError as exc:
            return ReconcileResult(ReconcileStatus.UNKNOWN, reason_code=exc.code)
        if response.status == 404:
            return ReconcileResult(ReconcileStatus.NOT_EXECUTED)
        if 200 <= response.status < 300:
            return ReconcileResult(ReconcileStatus.COMPLETED)
        return ReconcileResult(ReconcileStatus.UNKNOWN, reason_code=Code.LOOKUP_STATUS)
