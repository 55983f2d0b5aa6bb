"""The reference ``forward_request`` handler.

:class:`ForwardRequestHandler` POSTs the verified parameters, as RFC 8785 canonical JSON, to
``DOWNSTREAM_URL`` right after ``dispatch.start()`` (the point of no return, as
``dispatch.run`` marks it) with ``content-type: application/json``,
``idempotency-key``, ``x-agent-safe-intent-hash``, ``x-agent-safe-dossier-id``,
``x-agent-safe-grant-id`` and the credential's headers, asked of the credential just before
dispatch and never kept. Its timeout is ``DOWNSTREAM_TIMEOUT_MS`` and never more than the grant
has left (monotonic). The provider's answer is mapped without inference:

===========================================  =========================================
the provider says                             the seam reports
===========================================  =========================================
2xx                                           COMPLETED, ``{"status", "accepted": true}``
4xx with a body (except 408 and 409)          DEFINITELY_NOT_EXECUTED, the provider's code
3xx, 5xx, 408, 409, a 4xx with no body        UNKNOWN_AFTER_DISPATCH
timeout or reset after the request was sent   UNKNOWN_AFTER_DISPATCH
nothing sent (refused, connection refused)    FAILED_BEFORE_DISPATCH
===========================================  =========================================

408 and 409 are held unknown on purpose: for an idempotent API they can mean "a request with
this key is still in progress", which is not a refusal.

The result carries the status, ``accepted`` and the provider's ``reference`` (or ``id``) when it
is a short identifier (letters, digits, ``._:-``, at most 128); never the body. The provider's
``x-agent-safe-effect-receipt``, when it has the shape of a compact JWS within the bound, is
carried verbatim (``effect_receipt`` in the result, or on a refusal's ``ProviderRefused``) to the
authority's finalization; a header that is there but is not one is carried as
:data:`INVALID_RECEIPT`, which verifies as nothing (a present receipt is never ABSENT). A refusal's
reason comes from a JSON body's ``code`` (or ``reason``), reduced to UPPER_SNAKE; one longer than
64 characters is not cut short (a cut value would hide what it was from the redactor) but
replaced by ``PROVIDER_REFUSED_<status>``, as is a body without one. The registry then screens
both against the current secrets (``dispatch/seam.py``).

:meth:`ForwardRequestHandler.reconcile` GETs ``DOWNSTREAM_LOOKUP_URL`` with ``{idempotency_key}``
replaced by the URL-quoted key, carrying the key, the lost attempt's intent hash and the
credential's headers (a signed lookup covers the same five components as every signed request):
404 is NOT_EXECUTED, 2xx COMPLETED, anything else UNKNOWN. A credential that cannot produce its
headers is raised to the registry, never reported as the provider's uncertainty.

The credential (:class:`~agentsafe.executor.egress.credentials.DownstreamCredential`) comes from
the egress wing, which knows nothing of handlers; the headers it may not replace are the ground
floor's one list (:mod:`agentsafe.executor.headers`): it may add only its signature headers and
headers nobody else writes.

Callers: ``assembly.py`` (registers it as the ``forward_request`` handler); the integration tests.
Also imported by ``banking/registration.py``, ``banking/transport.py``, ``tools/doctor.py``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlsplit

from .. import telemetry
from ..canonical import canonical_json, parse_json
from ..codes import Code
from ..config import IDEMPOTENCY_KEY_PLACEHOLDER
from ..egress.credentials import DownstreamCredential
from ..egress.transport import HttpResponse, Transport, TransportError
from ..errors import CanonicalizationError, ConfigError, HandlerError
from ..headers import SIGNATURE_HEADERS, is_reserved
from .seam import (
    Dispatch,
    ExecutionContext,
    ProviderRefused,
    ReconcileResult,
    ReconcileStatus,
)

__all__ = [
    "INVALID_RECEIPT",
    "MAX_TIMEOUT_MS",
    "ForwardRequestHandler",
    "effect_receipt",
    "provider_reason",
    "provider_reference",
]

MAX_TIMEOUT_MS = 15_000
PLACEHOLDER = IDEMPOTENCY_KEY_PLACEHOLDER
_REFERENCE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
_COMPACT_JWS = re.compile(r"^[A-Za-z0-9_-]{2,2048}\.[A-Za-z0-9_-]{2,8192}\.[A-Za-z0-9_-]{2,512}$")
_UNKNOWN_4XX = frozenset({408, 409})
INVALID_RECEIPT = "invalid"
"""What stands for a receipt header that is present but not a compact JWS within the bound: it
verifies as nothing, so the comparison reads it MISMATCH (``EFFECT_RECEIPT_INVALID``), never
ABSENT, and the header itself (any size) is not carried (issue 30, item 17)."""
_UNREPRESENTABLE = re.compile(r"[/%\\]")


def provider_reason(status: int, body: bytes) -> str:
    """The provider's refusal code as UPPER_SNAKE (<= 64 chars, never cut short), else
    PROVIDER_REFUSED_<status>."""
    fallback = f"PROVIDER_REFUSED_{status}"
    try:
        payload = parse_json(body)
    except (ValueError, CanonicalizationError, RecursionError):
        return fallback
    if not isinstance(payload, dict):
        return fallback
    for key in ("code", "reason"):
        value = payload.get(key)
        if isinstance(value, str):
            snake = re.sub(r"[^A-Z0-9]+", "_", value.upper()).strip("_")
            if snake and len(snake) <= 64 and snake[0].isalpha() and snake.isascii():
                return snake
    return fallback


def _replaces_reserved(name: str) -> bool:
    """A header the executor writes itself, other than the ones a signing credential adds."""
    return is_reserved(name) and name.lower() not in SIGNATURE_HEADERS


def _merge_credential_headers(headers: dict[str, str], extra: Mapping[str, str]) -> None:
    """Add the credential's headers to ``headers`` (lower-cased), the one rule for a send and a
    lookup: a signing credential returns the covered headers beside its signature, so they must
    be exactly the values sent, and it may set no other reserved header."""
    for name, value in extra.items():
        key = name.lower()
        if _replaces_reserved(key) and headers.get(key) != value:
            raise HandlerError(
                "the credential tried to set a reserved header", code=Code.CREDENTIAL_INVALID
            )
        headers[key] = value


def _reference(body: bytes) -> str | None:
    try:
        payload = parse_json(body)
    except (ValueError, CanonicalizationError, RecursionError):
        return None
    if not isinstance(payload, dict):
        return None
    for key in ("reference", "id"):
        value = payload.get(key)
        if isinstance(value, str) and _REFERENCE.fullmatch(value):
            return value
    return None


def provider_reference(body: bytes) -> str | None:
    """The provider's ``reference`` (or ``id``) in a JSON answer, when it is a short identifier."""
    return _reference(body)


def effect_receipt(response: HttpResponse) -> str | None:
    """``x-agent-safe-effect-receipt`` when it has the shape of a compact JWS within the bound;
    :data:`INVALID_RECEIPT` when the header is there but is not one (garbage, an empty
    signature segment, beyond the bound); ``None`` only when the provider sent no header."""
    receipt = response.headers.get("x-agent-safe-effect-receipt")
    if receipt is None:
        return None
    return receipt if _COMPACT_JWS.match(receipt) else INVALID_RECEIPT


class ForwardRequestHandler:
    """The reference handler (see the module docstring)."""

    def __init__(
        self,
        *,
        url: str,
        lookup_url: str | None,
        timeout_ms: int,
        transport: Transport,
        credential: DownstreamCredential | None,
        parameters_schema: Mapping[str, Any],
    ) -> None:
        if not 1 <= timeout_ms <= MAX_TIMEOUT_MS:
            raise ConfigError("DOWNSTREAM_TIMEOUT_MS", f"must be 1..{MAX_TIMEOUT_MS}")
        if lookup_url is not None and PLACEHOLDER not in lookup_url:
            raise ConfigError("DOWNSTREAM_LOOKUP_URL", f"must contain {PLACEHOLDER}")
        self._url = url
        self._lookup_url = lookup_url
        self._timeout = timeout_ms / 1000
        self._transport = transport
        self._credential = credential
        self._schema = dict(parameters_schema)
        target = urlsplit(url)
        self._span_attributes = {
            "http.request.method": "POST",
            "url.scheme": target.scheme,
            "server.address": target.hostname or "",
            "server.port": target.port or (443 if target.scheme == "https" else 80),
        }
        lookup = urlsplit(lookup_url or url)
        self._lookup_attributes = {
            "http.request.method": "GET",
            "url.scheme": lookup.scheme,
            "server.address": lookup.hostname or "",
            "server.port": lookup.port or (443 if lookup.scheme == "https" else 80),
        }

    def __repr__(self) -> str:
        return "ForwardRequestHandler()"

    @property
    def parameters_schema(self) -> Mapping[str, Any]:
        return self._schema

    async def send(
        self,
        ctx: ExecutionContext,
        dispatch: Dispatch,
        *,
        extra_headers: Mapping[str, str] | None = None,
    ) -> HttpResponse:
        """POST the verified parameters once, right after ``dispatch.start()`` (the point of
        no return, once the credential's headers are in), and return the answer as it came;
        the banking transport (``banking/transport.py``) reads it its own way.
        ``extra_headers`` are a family's own non-reserved headers."""
        body = canonical_json(dict(ctx.parameters))
        auth = ctx.authorization
        # The context's fields are read directly, not through its ``idempotency_key`` property
        # and ``remaining()``: each would re-enter the seam once per request (issue 32).
        intent = ctx.intent
        headers = {
            "content-type": "application/json",
            "idempotency-key": intent.idempotency_key,
            "x-agent-safe-intent-hash": intent.intent_hash,
            "x-agent-safe-dossier-id": auth.dossier_id,
            "x-agent-safe-grant-id": auth.grant_id,
            "x-agent-safe-decision-id": auth.decision_id,
        }
        if ctx.attestation is not None:
            headers["x-agent-safe-claim-attestation"] = ctx.attestation
        if self._credential is not None:
            extra = await self._credential.headers_for(
                method="POST",
                url=self._url,
                body=body,
                idempotency_key=intent.idempotency_key,
                intent_hash=intent.intent_hash,
                grant_id=auth.grant_id,
                decision_id=auth.decision_id,
                attestation=ctx.attestation,
            )
            _merge_credential_headers(headers, extra)

        for name, value in (extra_headers or {}).items():
            if is_reserved(name) and not name.lower().startswith("x-agent-safe-banking-"):
                raise HandlerError("a family header is reserved", code=Code.CREDENTIAL_INVALID)
            headers[name.lower()] = value

        # The point of no return, then the send at once, here: ``dispatch.run(post)`` would
        # call back into this module from the seam between the credential and the send.
        idempotency_key = dispatch.start()
        # ``ctx.remaining()``, spelled out: never more than the grant has left (monotonic).
        left = max(0.0, ctx.deadline_monotonic - ctx.clock.monotonic())
        timeout = min(self._timeout, left)
        sent_headers = {**headers, "idempotency-key": idempotency_key}
        with telemetry.span(
            "agentsafe.dispatch", self._span_attributes, kind=telemetry.SpanKind.CLIENT
        ) as current:
            # W3C Trace Context to the provider: outside the signature's covered
            # components (docs/tracing.md), and no credential may set it (headers.py).
            telemetry.inject(sent_headers)
            response = await self._transport.request(
                "POST", self._url, headers=sent_headers, body=body, timeout=timeout
            )
            if current is not None:
                current.set_attribute("http.response.status_code", response.status)
            return response

    async def execute(self, ctx: ExecutionContext, dispatch: Dispatch) -> Mapping[str, Any]:
        response = await self.send(ctx, dispatch)
        status = response.status
        if 200 <= status < 300:
            result: dict[str, Any] = {"status": status, "accepted": True}
            reference = _reference(response.body)
            if reference is not None:
                result["provider_reference"] = reference
            receipt = effect_receipt(response)
            if receipt is not None:
                result["effect_receipt"] = receipt
            return result
        if 400 <= status < 500 and status not in _UNKNOWN_4XX and response.body.strip():
            raise ProviderRefused(
                provider_reason(status, response.body),
                status=status,
                receipt=effect_receipt(response),
            )
        if 300 <= status < 400:
            code = Code.PROVIDER_REDIRECT
        elif status >= 500:
            code = Code.PROVIDER_ERROR
        else:
            code = Code.PROVIDER_ANSWER_INDETERMINATE
        raise HandlerError("the provider's answer does not say what happened", code=code)

    async def reconcile(self, idempotency_key: str, *, intent_hash: str) -> ReconcileResult:
        """Ask the provider what it did with ``idempotency_key``; never sends the request.

        The lookup is a request like any other: it carries ``idempotency-key`` and
        ``x-agent-safe-intent-hash`` (the intent the lost attempt was for) and, under a
        signing credential, a signature over the method, the path, the empty body's digest,
        the key and the intent hash. A credential that cannot sign raises
        :class:`~agentsafe.executor.egress.credentials.CredentialUnavailable` to the registry,
        which reports it: this process failing to ask is not the provider being unsure.
        """
        if self._lookup_url is None:
            return ReconcileResult(ReconcileStatus.UNKNOWN, reason_code=Code.LOOKUP_NOT_CONFIGURED)
        if _UNREPRESENTABLE.search(idempotency_key) or idempotency_key in (".", ".."):
            # It would become an encoded separator or a dot segment, which the egress guard
            # refuses (and counts towards a halt): answer unknown here, without asking.
            return ReconcileResult(
                ReconcileStatus.UNKNOWN, reason_code=Code.LOOKUP_KEY_UNREPRESENTABLE
            )
        url = self._lookup_url.replace(PLACEHOLDER, quote(idempotency_key, safe=""))
        headers: dict[str, str] = {
            "idempotency-key": idempotency_key,
            "x-agent-safe-intent-hash": intent_hash,
        }
        if self._credential is not None:
            extra = await self._credential.headers_for(
                method="GET",
                url=url,
                body=b"",
                idempotency_key=idempotency_key,
                intent_hash=intent_hash,
            )
            _merge_credential_headers(headers, extra)
        with telemetry.span(
            "agentsafe.lookup", self._lookup_attributes, kind=telemetry.SpanKind.CLIENT
        ) as current:
            telemetry.inject(headers)  # like the dispatch: outside the covered components
            try:
                response = await self._transport.request(
                    "GET", url, headers=headers, body=None, timeout=self._timeout
                )
            except TransportError as exc:
                if current is not None:
                    current.set_attribute("agentsafe.code", str(exc.code))
                return ReconcileResult(ReconcileStatus.UNKNOWN, reason_code=exc.code)
            if current is not None:
                current.set_attribute("http.response.status_code", response.status)
        if response.status == 404:
            return ReconcileResult(ReconcileStatus.NOT_EXECUTED)
        if 200 <= response.status < 300:
            return ReconcileResult(
                ReconcileStatus.COMPLETED, provider_reference=_reference(response.body)
            )
        return ReconcileResult(
            ReconcileStatus.UNKNOWN, reason_code=f"{Code.LOOKUP_STATUS}_{response.status}"
        )
