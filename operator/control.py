"""The operator's calls to executors' control routes: halt and resume, at once, over TLS.

:func:`executor_endpoints` reads every executor pod address from the policy's EndpointSlices
(ready or not: a halted executor is not ready and must still be reachable for the resume).
:class:`ControlClient` posts ``POST /v1/control/halt`` (``/resume``) with the reason to each of
them at once, as the operator's OPERATOR principal (its bearer token), over TLS verified by
:func:`trust_context` against the executor's own certificate (``ca.crt`` of its TLS Secret when
present, else the certificate itself, pinned). Each pod's answer is one
:class:`ControlResult`; a refusal carries the HTTP status and the executor's error code, never
the body. :meth:`ControlClient.status_all` reads ``GET /v1/control/status`` of each the same way
and keeps only ``store_lost_writes`` (the claims the shared database lost,
``state/lostwrites.py``), one :class:`StatusResult` per pod.

The reason is cut to the executor's own bound
(:data:`~agentsafe.executor.host.halt.MAX_REASON_CHARS`) so that a long HaltSwitch reason is
never a refused call.

Callers: ``halt.py`` (:func:`~.halt.enforce_halt`), ``lostwrites.py`` (the ``StoreLostWrites``
condition), ``runtime.py`` (the default client), the tests.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from agentsafe.executor.host.halt import MAX_REASON_CHARS

__all__ = [
    "ControlClient",
    "ControlResult",
    "Endpoint",
    "StatusResult",
    "executor_endpoints",
    "trust_context",
]


@dataclass(frozen=True)
class Endpoint:
    pod: str
    address: str
    ready: bool


@dataclass(frozen=True)
class ControlResult:
    pod: str
    acknowledged: bool
    error: str | None = None


@dataclass(frozen=True)
class StatusResult:
    """One pod's ``store_lost_writes`` (``None`` when it could not be read: ``error`` says why)."""

    pod: str
    lost: tuple[dict[str, Any], ...] | None
    error: str | None = None


def executor_endpoints(slices: Iterable[Mapping[str, Any]]) -> list[Endpoint]:
    """Every executor pod address in the Service's EndpointSlices, ready or not (a halted
    executor is not ready and must still be reachable for the resume)."""
    seen: dict[str, Endpoint] = {}
    for piece in slices:
        for endpoint in piece.get("endpoints") or []:
            addresses = endpoint.get("addresses") or []
            target = endpoint.get("targetRef") or {}
            if not addresses:
                continue
            pod = str(target.get("name") or addresses[0])
            ready = bool((endpoint.get("conditions") or {}).get("ready", False))
            seen.setdefault(pod, Endpoint(pod=pod, address=str(addresses[0]), ready=ready))
    return sorted(seen.values(), key=lambda e: e.pod)


def trust_context(*, ca_pem: str | None, certificate_pem: str | None) -> ssl.SSLContext:
    """Trust the executor's CA, or pin its certificate when no CA is given."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=ca_pem or certificate_pem)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if not ca_pem:
        context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return context


class ControlClient:
    """Calls the executors' control routes as the operator's OPERATOR principal."""

    def __init__(self, *, timeout: float = 2.0) -> None:
        self._timeout = aiohttp.ClientTimeout(total=timeout)

    async def call_all(
        self,
        endpoints: Sequence[Endpoint],
        *,
        action: str,
        reason: str,
        token: str,
        port: int,
        server_hostname: str,
        context: ssl.SSLContext,
    ) -> list[ControlResult]:
        """``POST /v1/control/<action>`` on every endpoint at once; one result per pod."""
        if action not in ("halt", "resume"):
            raise ValueError("action is halt or resume")
        body = {"reason": reason[:MAX_REASON_CHARS]}
        headers = {"Authorization": f"Bearer {token}"}
        connector = aiohttp.TCPConnector(ssl=context, force_close=True)
        async with aiohttp.ClientSession(connector=connector, timeout=self._timeout) as session:

            async def one(endpoint: Endpoint) -> ControlResult:
                host = f"[{endpoint.address}]" if ":" in endpoint.address else endpoint.address
                url = f"https://{host}:{port}/v1/control/{action}"
                try:
                    async with session.post(
                        url, json=body, headers=headers, server_hostname=server_hostname
                    ) as response:
                        if response.status == 200:
                            return ControlResult(endpoint.pod, True)
                        code = await _error_code(response)
                        return ControlResult(endpoint.pod, False, f"HTTP {response.status} {code}")
                except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                    return ControlResult(endpoint.pod, False, type(exc).__name__)

            return list(await asyncio.gather(*(one(e) for e in endpoints)))

    async def status_all(
        self,
        endpoints: Sequence[Endpoint],
        *,
        token: str,
        port: int,
        server_hostname: str,
        context: ssl.SSLContext,
    ) -> list[StatusResult]:
        """``GET /v1/control/status`` on every endpoint at once: each pod's lost claims."""
        headers = {"Authorization": f"Bearer {token}"}
        connector = aiohttp.TCPConnector(ssl=context, force_close=True)
        async with aiohttp.ClientSession(connector=connector, timeout=self._timeout) as session:

            async def one(endpoint: Endpoint) -> StatusResult:
                host = f"[{endpoint.address}]" if ":" in endpoint.address else endpoint.address
                url = f"https://{host}:{port}/v1/control/status"
                try:
                    async with session.get(
                        url, headers=headers, server_hostname=server_hostname
                    ) as response:
                        if response.status != 200:
                            code = await _error_code(response)
                            error = f"HTTP {response.status} {code}"
                            return StatusResult(endpoint.pod, None, error)
                        data = await response.json(content_type=None)
                except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
                    return StatusResult(endpoint.pod, None, type(exc).__name__)
                lost = data.get("store_lost_writes") if isinstance(data, dict) else None
                if not isinstance(lost, list):
                    return StatusResult(endpoint.pod, ())
                return StatusResult(
                    endpoint.pod, tuple(item for item in lost if isinstance(item, dict))
                )

            return list(await asyncio.gather(*(one(e) for e in endpoints)))


async def _error_code(response: aiohttp.ClientResponse) -> str:
    try:
        data = await response.json(content_type=None)
    except (ValueError, aiohttp.ClientError):
        return ""
    error = data.get("error") if isinstance(data, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    if code is None and isinstance(data, dict):
        code = data.get("code")
    return str(code)[:64] if isinstance(code, str) else ""
