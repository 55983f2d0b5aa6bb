"""Outbound HTTP: the contract every component uses to reach another system, and a plain client.

The contract (see ``docs/architecture.md``, "Outbound HTTP") is three names: :class:`HttpResponse`,
:class:`TransportError` and the :class:`Transport` protocol. The guarded fetch in ``egress.py``
implements the same protocol with the full egress policy; :class:`PlainTransport` here is the
minimal implementation the foundation runs on:

* ``https://`` to any host, verified against the platform's trust store;
* ``http://`` only to a loopback address (``127.0.0.0/8``, ``::1`` or ``localhost``) and only when
  constructed with ``allow_insecure_loopback=True`` (``DOWNSTREAM_ALLOW_INSECURE_LOOPBACK``);
* no credentials in the URL, no redirects followed (a 3xx is returned as a response);
* the body is read whole up to ``max_response_bytes`` and refused beyond it.

Every failure is a :class:`TransportError` whose ``sent`` says whether bytes may have reached the
peer: ``False`` only when the request provably never left (refused before a socket, connection
refused, a timeout before the request was written); ``True`` whenever it is not provable, which
the handler seam reports as UNKNOWN_AFTER_DISPATCH rather than guessing "not executed".

Callers: ``forward.py`` (the reference handler and its lookup), tests, the demo.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Protocol

import aiohttp
from yarl import URL

from .errors import AgentSafeError

__all__ = [
    "DEFAULT_MAX_RESPONSE_BYTES",
    "HttpResponse",
    "PlainTransport",
    "Transport",
    "TransportError",
    "is_loopback_host",
]

DEFAULT_MAX_RESPONSE_BYTES = 1024 * 1024
_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"})
_CHUNK = 64 * 1024


@dataclass(frozen=True)
class HttpResponse:
    """A whole response: status, headers (lower-cased names) and the body read in full."""

    status: int
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""


class TransportError(AgentSafeError):
    """An outbound request failed; ``code`` is EGRESS_* or TRANSPORT_*.

    ``sent`` is False only when nothing can have reached the peer (the caller may report the
    attempt FAILED_BEFORE_DISPATCH); True means bytes may have arrived (UNKNOWN_AFTER_DISPATCH).
    """

    code = "TRANSPORT_FAILED"

    def __init__(self, code: str, sent: bool, message: str | None = None) -> None:
        super().__init__(message or code.replace("_", " ").lower(), code=code)
        self.sent = sent


class Transport(Protocol):
    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout: float,
    ) -> HttpResponse: ...

    async def close(self) -> None:
        """Release connections; later requests fail with ``sent=False``."""
        ...


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback IP literals (``127.0.0.0/8``, ``::1``)."""
    name = host.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class PlainTransport:
    """An aiohttp client honouring the :class:`Transport` contract (see the module docstring).

    One :class:`aiohttp.ClientSession` with its own connector, created lazily inside the running
    loop on first use; :meth:`close` releases it. Not shared across event loops.
    """

    def __init__(
        self,
        *,
        allow_insecure_loopback: bool = False,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        if max_response_bytes < 1:
            raise ValueError("max_response_bytes must be positive")
        self._allow_insecure_loopback = allow_insecure_loopback
        self._max_response_bytes = max_response_bytes
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    def __repr__(self) -> str:
        return (
            f"PlainTransport(allow_insecure_loopback={self._allow_insecure_loopback}, "
            f"max_response_bytes={self._max_response_bytes})"
        )

    async def __aenter__(self) -> PlainTransport:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def check_url(self, url: str) -> URL:
        """Refuse what this transport never sends to, before any socket exists (``sent=False``)."""
        try:
            parsed = URL(url)
        except (TypeError, ValueError):
            raise TransportError("EGRESS_INIT_UNSUPPORTED", False, "the URL is malformed") from None
        if not parsed.is_absolute() or not parsed.host:
            raise TransportError("EGRESS_INIT_UNSUPPORTED", False, "the URL is not absolute")
        if parsed.user is not None or parsed.password is not None:
            raise TransportError(
                "EGRESS_ORIGIN_NOT_ALLOWED", False, "credentials in a URL are refused"
            )
        if parsed.scheme == "https":
            return parsed
        if parsed.scheme == "http":
            if not is_loopback_host(parsed.host):
                raise TransportError(
                    "EGRESS_SCHEME_NOT_ALLOWED", False, "plain http is allowed only to loopback"
                )
            if not self._allow_insecure_loopback:
                raise TransportError(
                    "EGRESS_SCHEME_NOT_ALLOWED",
                    False,
                    "plain http to loopback needs DOWNSTREAM_ALLOW_INSECURE_LOOPBACK=true",
                )
            return parsed
        raise TransportError("EGRESS_SCHEME_NOT_ALLOWED", False, "only https and http are allowed")

    def _get_session(self) -> aiohttp.ClientSession:
        if self._closed:
            raise TransportError("TRANSPORT_CLOSED", False, "the transport is closed")
        if self._session is None:
            trace = aiohttp.TraceConfig()
            trace.on_request_headers_sent.append(_mark_sent)
            trace.on_request_chunk_sent.append(_mark_sent)
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=100, force_close=False),
                trace_configs=[trace],
                auto_decompress=False,
                skip_auto_headers=("User-Agent",),
                raise_for_status=False,
            )
        return self._session

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout: float,
    ) -> HttpResponse:
        if method not in _METHODS:
            raise TransportError("EGRESS_INIT_UNSUPPORTED", False, "the method is not supported")
        parsed = self.check_url(url)
        if not timeout > 0:
            raise TransportError("EGRESS_TIMEOUT", False, "no time left to send the request")
        session = self._get_session()
        progress = SimpleNamespace(sent=False)
        try:
            async with asyncio.timeout(timeout):
                async with session.request(
                    method,
                    parsed,
                    headers=dict(headers),
                    data=body,
                    allow_redirects=False,
                    trace_request_ctx=progress,
                ) as response:
                    progress.sent = True
                    data = await self._read_body(response)
                    return HttpResponse(
                        status=response.status,
                        headers={k.lower(): v for k, v in response.headers.items()},
                        body=data,
                    )
        except TransportError:
            raise
        except TimeoutError:
            raise TransportError(
                "EGRESS_TIMEOUT", bool(progress.sent), "the peer did not answer in time"
            ) from None
        except aiohttp.ClientConnectorError:
            # The connection was never established: nothing can have been written.
            raise TransportError(
                "TRANSPORT_CONNECT_FAILED", False, "the peer could not be reached"
            ) from None
        except (aiohttp.ClientError, OSError):
            raise TransportError(
                "TRANSPORT_CONNECTION_LOST",
                bool(progress.sent),
                "the connection failed during the exchange",
            ) from None

    async def _read_body(self, response: aiohttp.ClientResponse) -> bytes:
        limit = self._max_response_bytes
        declared = response.content_length
        if declared is not None and declared > limit:
            raise TransportError("EGRESS_BODY_TOO_LARGE", True, "the response body is too large")
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = await response.content.read(_CHUNK)
            if not chunk:
                break
            total += len(chunk)
            if total > limit:
                raise TransportError(
                    "EGRESS_BODY_TOO_LARGE", True, "the response body is too large"
                )
            chunks.append(chunk)
        return b"".join(chunks)


async def _mark_sent(session: aiohttp.ClientSession, ctx: SimpleNamespace, params: object) -> None:
    progress = ctx.trace_request_ctx
    if isinstance(progress, SimpleNamespace):
        progress.sent = True
