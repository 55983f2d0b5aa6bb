"""The reference core-banking transport: one adapter per banking action, over the downstream.

:class:`CoreBankingHttpAdapter` implements the adapter contract (``effects/adapter.py``) for one
:class:`~agentsafe.executor.banking.actions.ActionKind`. ``execute`` POSTs the verified
parameters through the reference handler's one dispatch path (``ForwardRequestHandler.send``:
the same headers, credential and grant-bounded timeout), adding
``x-agent-safe-banking-action`` with the derived transport action, and maps the answer without
inferring anything:

==============================================  =============================================
the provider says                                this boundary reports
==============================================  =============================================
2xx ``{"status": "ACCEPTED"|"PENDING", ...}``    committed, acknowledged, not yet confirmed
2xx ``{"status": "POSTED"|"BOOKED", ...}``       committed, then read back by the provider's
                                                 reference (``DOWNSTREAM_LOOKUP_BY_REFERENCE_URL``)
                                                 before it is confirmed
4xx with a body (except 408, 409)                refused; nothing was effected
anything else: no body, a timeout, a 5xx         indeterminate: raised, so UNKNOWN_AFTER_DISPATCH
==============================================  =============================================

The read-back is a GET of ``DOWNSTREAM_LOOKUP_BY_REFERENCE_URL`` with ``{provider_reference}``
replaced by the URL-quoted reference, carrying the credential's headers; a 2xx JSON answer is the
observation (``READ_BACK``); anything else leaves the effect UNCONFIRMED (READ_BACK_FAILED in the
security stream), never guessed. Without that setting a posted effect is observed from the answer
alone and stays UNCONFIRMED. The answer's ``x-agent-safe-effect-receipt`` is carried to the
receipt comparison.

``reconcile`` is the reference handler's read-only lookup by idempotency key
(``DOWNSTREAM_LOOKUP_URL``).

Callers: ``banking/registration.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from ..canonical import parse_json, sha256_bytes_digest, sha256_digest
from ..codes import Code
from ..config import PROVIDER_REFERENCE_PLACEHOLDER
from ..dispatch.forward import (
    ForwardRequestHandler,
    effect_receipt,
    provider_reason,
    provider_reference,
)
from ..dispatch.seam import Dispatch, ExecutionContext, ReconcileResult
from ..effects.adapter import ObservationMethod, Prepared, ProviderOutcome, ProviderResult
from ..egress.credentials import DownstreamCredential
from ..egress.transport import HttpResponse, Transport, TransportError
from ..errors import CanonicalizationError, ConfigError, HandlerError
from ..events import EventSink
from ..headers import is_reserved
from .actions import ActionKind, prepare_action, projection

__all__ = ["REFERENCE_PLACEHOLDER", "CoreBankingHttpAdapter"]

REFERENCE_PLACEHOLDER = PROVIDER_REFERENCE_PLACEHOLDER
_TOOK = frozenset({"ACCEPTED", "PENDING"})
_POSTED = frozenset({"POSTED", "BOOKED"})
_UNKNOWN_4XX = frozenset({408, 409})


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        value = parse_json(body)
    except (ValueError, CanonicalizationError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


class CoreBankingHttpAdapter:
    """The adapter for one banking action over the configured downstream."""

    def __init__(
        self,
        kind: ActionKind,
        *,
        forward: ForwardRequestHandler,
        transport: Transport,
        credential: DownstreamCredential | None,
        lookup_by_reference_url: str | None,
        timeout_ms: int,
        adapter_id: str,
        adapter_version: str,
        security: EventSink | None = None,
    ) -> None:
        if lookup_by_reference_url is not None and REFERENCE_PLACEHOLDER not in (
            lookup_by_reference_url
        ):
            raise ConfigError(
                "DOWNSTREAM_LOOKUP_BY_REFERENCE_URL", f"must contain {REFERENCE_PLACEHOLDER}"
            )
        self._kind = kind
        self._forward = forward
        self._transport = transport
        self._credential = credential
        self._lookup = lookup_by_reference_url
        self._timeout = timeout_ms / 1000
        self._id = adapter_id
        self._version = adapter_version
        self._security = security

    def __repr__(self) -> str:
        return f"CoreBankingHttpAdapter({self._kind.type})"

    @property
    def adapter_id(self) -> str:
        return self._id

    @property
    def adapter_version(self) -> str:
        return self._version

    @property
    def parameters_schema(self) -> Mapping[str, Any]:
        return self._kind.schema

    def prepare(self, parameters: Mapping[str, Any]) -> Prepared:
        return prepare_action(self._kind, parameters)

    async def execute(
        self, prepared: Prepared, ctx: ExecutionContext, dispatch: Dispatch
    ) -> ProviderResult:
        response = await self._forward.send(
            ctx,
            dispatch,
            extra_headers={"x-agent-safe-banking-action": prepared.transport_action},
        )
        status = response.status
        digest = sha256_digest({"status": status, "body": sha256_bytes_digest(response.body)})
        answer = _json_object(response.body)
        receipt = effect_receipt(response)
        if 200 <= status < 300 and answer is not None:
            said = answer.get("status")
            reference = provider_reference(response.body)
            if said in _TOOK:
                return ProviderResult(
                    outcome=ProviderOutcome.COMMITTED,
                    status=status,
                    response_digest=digest,
                    provider_reference=reference,
                    reported=answer,
                    method=ObservationMethod.RESPONSE,
                    receipt=receipt,
                )
            if said in _POSTED:
                read_back = await self._read_back(reference, ctx) if reference else None
                return ProviderResult(
                    outcome=ProviderOutcome.COMMITTED,
                    status=status,
                    response_digest=digest,
                    provider_reference=reference,
                    reported=read_back if read_back is not None else answer,
                    method=(
                        ObservationMethod.READ_BACK
                        if read_back is not None
                        else ObservationMethod.RESPONSE
                    ),
                    posted=True,
                    read_back_failed=read_back is None,
                    receipt=receipt,
                )
        if 400 <= status < 500 and status not in _UNKNOWN_4XX and response.body.strip():
            return ProviderResult(
                outcome=ProviderOutcome.REFUSED,
                status=status,
                response_digest=digest,
                reported=None,
                receipt=receipt,
                reason=provider_reason(status, response.body),
            )
        code = Code.PROVIDER_ERROR if status >= 500 else Code.PROVIDER_ANSWER_INDETERMINATE
        raise HandlerError("the provider neither committed nor refused", code=code)

    async def _read_back(self, reference: str, ctx: ExecutionContext) -> dict[str, Any] | None:
        """The provider's record of ``reference``, read only; ``None`` when it cannot be had."""
        if self._lookup is None:
            return None
        url = self._lookup.replace(REFERENCE_PLACEHOLDER, quote(reference, safe=""))
        headers: dict[str, str] = {}
        try:
            if self._credential is not None:
                extra = await self._credential.headers_for(
                    method="GET",
                    url=url,
                    body=b"",
                    idempotency_key=ctx.idempotency_key,
                    intent_hash=ctx.intent.intent_hash,
                )
                headers.update((k, v) for k, v in extra.items() if not is_reserved(k))
            response: HttpResponse = await self._transport.request(
                "GET", url, headers=headers, body=None, timeout=min(self._timeout, ctx.remaining())
            )
        except (TransportError, HandlerError) as exc:
            self._read_back_failed(exc.code)
            return None
        record = _json_object(response.body) if 200 <= response.status < 300 else None
        if record is None:
            self._read_back_failed(f"{Code.LOOKUP_STATUS}_{response.status}")
        return record

    def _read_back_failed(self, code: str) -> None:
        if self._security is not None:
            self._security.emit(
                "READ_BACK_FAILED",
                {"action": self._kind.handler, "code": Code.READ_BACK_FAILED, "cause": code},
            )

    def observe_effect(
        self, prepared: Prepared, result: ProviderResult
    ) -> Mapping[str, Any] | None:
        if result.reported is None:
            return None
        observed = projection(self._kind, result.reported)
        return observed or None

    async def reconcile(self, idempotency_key: str, *, intent_hash: str) -> ReconcileResult:
        """The reference handler's read-only lookup by idempotency key (signed with the lost
        attempt's intent hash, as every lookup is)."""
        return await self._forward.reconcile(idempotency_key, intent_hash=intent_hash)
