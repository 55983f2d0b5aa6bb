"""The client itself: one aiohttp session, one retry loop for every call.

:meth:`AgentSafeClient._call` is the loop: send; on ``409 IDEMPOTENCY_IN_PROGRESS`` back off
(0.25 s doubling to 5 s); on ``503`` with ``Retry-After`` wait what the executor asks (capped by
``retry_after_cap`` when given); on a connection failure back off; everything with the same body,
so the same idempotency key, until ``max_wait`` seconds have passed, then :class:`Unavailable`.
Any other error body is :class:`Refused`; a decision body is a :class:`Decision`. Every request
is a client span of the agent host's OpenTelemetry set-up, its W3C Trace Context sent along
(``client/_tracing.py``).

Callers: ``client/__init__.py`` (the public name).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
import uuid
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

import aiohttp

from ._models import ActionInfo, Decision, Refused, Unavailable
from ._tracing import request_span

__all__ = ["AgentSafeClient"]

_IN_PROGRESS = "IDEMPOTENCY_IN_PROGRESS"
_FIRST_BACKOFF = 0.25
_MAX_BACKOFF = 5.0


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None  # an HTTP date: not sent by agentsafe; treat as no hint
    return seconds if seconds >= 0 else None


class AgentSafeClient:
    """An agent's connection to one executor (see the package docstring).

    ``token`` is the agent's bearer token for the executor (or give ``cert``/``key`` for an mTLS
    principal, never both). ``ca_file`` is the executor's CA. ``max_wait`` bounds the whole of
    one call's polite waiting; ``retry_after_cap`` caps one wait (``None``: as long as asked).
    ``on_wait(reason, seconds)`` is told before each wait (progress for a log or a UI).
    ``tracer_provider``: the OpenTelemetry tracer provider of the client's spans (None: the
    global one); each request carries its span's ``traceparent`` (docs/tracing.md).
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        ca_file: str | None = None,
        cert: str | None = None,
        key: str | None = None,
        max_wait: float = 60.0,
        retry_after_cap: float | None = None,
        timeout: float = 30.0,
        on_wait: Callable[[str, float], None] | None = None,
        tracer_provider: Any = None,
    ) -> None:
        if (token is None) == (cert is None):
            raise ValueError("give the agent's token or its client certificate, exactly one")
        self._url = url.rstrip("/")
        self._headers = {"authorization": f"Bearer {token}"} if token is not None else {}
        self._ssl: ssl.SSLContext | bool = False
        if self._url.startswith("https://"):
            context = ssl.create_default_context(cafile=ca_file)
            if cert is not None:
                context.load_cert_chain(cert, key)
            self._ssl = context
        self._max_wait = max_wait
        self._retry_after_cap = retry_after_cap
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._on_wait = on_wait
        self._tracer_provider = tracer_provider
        self._session: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:
        return f"AgentSafeClient({self._url!r})"  # never the token

    async def __aenter__(self) -> AgentSafeClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self._ssl), timeout=self._timeout
            )
        return self._session

    # ------------------------------------------------------------------ the three calls

    async def propose(
        self,
        action: str,
        target: str,
        parameters: Mapping[str, Any],
        *,
        idempotency_key: str | None = None,
        correlation_id: str | None = None,
    ) -> Decision:
        """``POST /v1/actions``: capture, decide and (in enforcement, on ALLOW) execute once."""
        key = idempotency_key or f"agent-{uuid.uuid4()}"
        body: dict[str, Any] = {
            "proposal": {"action": action, "target": target, "parameters": dict(parameters)},
            "idempotency_key": key,
        }
        if correlation_id is not None:
            body["correlation_id"] = correlation_id
        return await self._call("/v1/actions", body, idempotency_key=key)

    async def reconcile(self, recovery: Mapping[str, Any]) -> Decision:
        """``POST /v1/reconciliations`` with the recovery object an unknown outcome carried:
        what the provider did, read-only (never sent again)."""
        return await self._call("/v1/reconciliations", {"recovery": dict(recovery)})

    async def resume(self, escalation: Mapping[str, Any]) -> Decision:
        """``POST /v1/escalations`` with the escalation object: still pending, refused, or (once
        a person approved) executed once."""
        return await self._call("/v1/escalations", {"escalation": dict(escalation)})

    async def actions(self) -> list[ActionInfo]:
        """``GET /v1/actions``: the actions this caller may propose, with their schemas."""
        url = self._url + "/v1/actions"
        headers = dict(self._headers)
        try:
            with request_span(
                "GET", url, "/v1/actions", headers, tracer_provider=self._tracer_provider
            ) as span:
                async with self._open().get(url, headers=headers) as r:
                    answer: Any = await r.json(content_type=None)
                    status = r.status
                    if span is not None:
                        span.set_attribute("http.response.status_code", status)
        except (TimeoutError, aiohttp.ClientConnectionError):
            raise Unavailable("the executor could not be reached", idempotency_key=None) from None
        except ValueError:
            raise Refused(0, "RESPONSE_INVALID", "the executor's answer is not JSON") from None
        if status != 200 or not isinstance(answer, dict):
            error = answer.get("error", {}) if isinstance(answer, dict) else {}
            raise Refused(status, str(error.get("code")), str(error.get("message", "")))
        return [ActionInfo.from_wire(entry) for entry in answer.get("actions", [])]

    # ------------------------------------------------------------------ the loop

    async def _call(
        self, path: str, body: Mapping[str, Any], *, idempotency_key: str | None = None
    ) -> Decision:
        deadline = time.monotonic() + self._max_wait
        backoff = _FIRST_BACKOFF
        payload = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        headers = {**self._headers, "content-type": "application/json"}
        last: Decision | None = None
        while True:
            wait: float
            hint: float | None = None
            try:
                sent = dict(headers)
                with request_span(
                    "POST", self._url + path, path, sent, tracer_provider=self._tracer_provider
                ) as span:
                    async with self._open().post(
                        self._url + path, data=payload, headers=sent
                    ) as response:
                        status = response.status
                        if span is not None:
                            span.set_attribute("http.response.status_code", status)
                        hint = _retry_after(response.headers.get("Retry-After"))
                        answer: Any = await response.json(content_type=None)
            except (TimeoutError, aiohttp.ClientConnectionError):
                wait, backoff = backoff, min(backoff * 2, _MAX_BACKOFF)
                reason = "the executor could not be reached"
            except (ValueError, aiohttp.ContentTypeError):
                raise Refused(0, "RESPONSE_INVALID", "the executor's answer is not JSON") from None
            else:
                if not isinstance(answer, dict):
                    raise Refused(status, "RESPONSE_INVALID", "the answer is not a JSON object")
                error = answer.get("error")
                if isinstance(error, dict):
                    code = str(error.get("code"))
                    if status == 409 and code == _IN_PROGRESS:
                        wait, backoff = backoff, min(backoff * 2, _MAX_BACKOFF)
                        reason = "a request with this idempotency key is still in flight"
                    elif status == 503 and hint is not None:
                        wait, reason = hint, f"the executor is unavailable ({code})"
                    else:
                        raise Refused(status, code, str(error.get("message", "")))
                else:
                    decision = Decision.from_wire(status, answer, idempotency_key=idempotency_key)
                    if not (status == 503 and hint is not None):
                        return decision
                    last = decision
                    wait = hint
                    reason = (
                        f"the executor asks to retry later ({', '.join(decision.reason_codes)})"
                    )
            if self._retry_after_cap is not None:
                wait = min(wait, self._retry_after_cap)
            if time.monotonic() + wait > deadline:
                raise Unavailable(
                    reason, idempotency_key=idempotency_key, last=last, retry_after=hint
                )
            if self._on_wait is not None:
                self._on_wait(reason, wait)
            await asyncio.sleep(wait)
