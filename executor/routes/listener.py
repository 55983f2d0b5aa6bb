"""The listener: aiohttp's HTTP/1.1 server with read deadlines, connection caps and the refusal
contract for everything aiohttp answers on its own.

aiohttp's server has no read deadline of its own that a slowloris cannot outlast, no connection
cap, and answers a request it cannot parse itself: ``text/plain``, none of the security headers,
and about 90 characters of the offending request line or header echoed back. This module closes
those gaps around aiohttp's public extension points (:class:`aiohttp.web.BaseSite`, a
:class:`aiohttp.web.RequestHandler` subclass whose ``handle_error`` is the documented place for
an error page); nothing here parses HTTP itself.

- **Header deadline** (``EXECUTOR_HEADER_TIMEOUT_SECONDS``): a connection must deliver a whole
  request head within the deadline of being accepted, and then within the deadline of each
  response; else it is closed. The TLS handshake counts against it (the handshake timeout is the
  same), and aiohttp's keep-alive timer is the clock: it closes a connection that is waiting for
  a request head, however many bytes of one have arrived, so one header byte every few seconds
  buys nothing. An idle kept-alive connection is closed after the same time.
- **Body deadline** (``EXECUTOR_BODY_TIMEOUT_SECONDS``): ``routes/app.py`` reads each body under
  it (408 ``REQUEST_TIMEOUT``), and a refusal answered before the body was read whole closes the
  connection, so nobody is left draining a slow body.
- **Connection caps** (``EXECUTOR_MAX_CONNECTIONS``, ``EXECUTOR_MAX_CONNECTIONS_PER_SOURCE``):
  one more connection than either allows is answered 503 ``CONNECTION_LIMIT_REACHED`` (the
  refusal contract, ``Retry-After: 1``) and closed before a byte of it is read. The per-source
  cap keeps one peer from taking every connection, so a flood from one address does not keep
  an operator out. Under ``EXECUTOR_WORKERS`` both caps are each worker's (the kernel hands
  a new connection to one worker, which counts only its own). Refusals are summarised on the
  security stream (``CONNECTIONS_REFUSED``, at
  most one line every ten seconds). A connection still in its TLS handshake is not yet counted;
  the handshake deadline bounds how long it can be held.
- **The refusal contract everywhere**: aiohttp's own answers (a request line or header it
  cannot parse, a handler failure it caught) are ``{"error": {"code", "message"}}`` JSON with
  the four security headers and ``Cache-Control: no-store``, a fixed message that echoes nothing
  of the request, and ``Server: agentsafe`` instead of the Python and aiohttp versions.

Callers: ``plane.py`` (``Executor.listen`` starts :class:`GuardedSite`). The security headers and
the body deadline itself live with the application (``SECURITY_HEADERS``, ``read_json``).
Also imported by ``proxy.py``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from ..codes import Code
from ..config import (
    BODY_TIMEOUT_SECONDS_DEFAULT,
    HEADER_TIMEOUT_SECONDS_DEFAULT,
    MAX_CONNECTIONS_DEFAULT,
    MAX_CONNECTIONS_PER_SOURCE_DEFAULT,
)
from ..events import EventSink
from ..lifecycle.answers import error_body
from .app import SECURITY_HEADERS, SERVER_HEADER
from .refusals import code_for_http_error, refusal

__all__ = [
    "REFUSAL_SUMMARY_SECONDS",
    "ConnectionGate",
    "GuardedSite",
    "ListenerLimits",
    "handler_settings",
]

log = logging.getLogger(__name__)

_MALFORMED = "the request is not well-formed HTTP/1.1; it was not processed"
_FAILED = "the executor failed; the request was not executed"
_BUSY = "too many connections are open; retry later"
REFUSAL_SUMMARY_SECONDS = 10.0


@dataclass(frozen=True)
class ListenerLimits:
    """The listener's deadlines (seconds) and caps; see the module docstring."""

    header_timeout: float = float(HEADER_TIMEOUT_SECONDS_DEFAULT)
    body_timeout: float = float(BODY_TIMEOUT_SECONDS_DEFAULT)
    max_connections: int = MAX_CONNECTIONS_DEFAULT
    max_connections_per_source: int = MAX_CONNECTIONS_PER_SOURCE_DEFAULT


def handler_settings(limits: ListenerLimits) -> dict[str, Any]:
    """The keyword arguments of every connection's request handler."""
    return {
        "access_log": None,
        # The keep-alive timer closes a connection still waiting for a whole request head.
        "keepalive_timeout": limits.header_timeout,
        # A body left unread after the answer is drained for at most the body deadline.
        "lingering_time": limits.body_timeout,
    }


def _raw_refusal(code: Code, message: str, *, status: int, reason: str) -> bytes:
    """A whole HTTP/1.1 refusal, for a connection refused before aiohttp has a request."""
    body = json.dumps(error_body(code, message)).encode("utf-8")
    headers = {
        "Content-Type": "application/json; charset=utf-8",
        "Content-Length": str(len(body)),
        "Connection": "close",
        "Retry-After": "1",
        "Server": SERVER_HEADER,
        **SECURITY_HEADERS,
    }
    head = f"HTTP/1.1 {status} {reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return head.encode("ascii") + b"\r\n" + body


class ConnectionGate:
    """Counts open connections, in all and by source address, against the caps.

    Refusals are summarised on the security stream, never one line each (a flood would write
    one per connection): ``CONNECTIONS_REFUSED`` with how many since the last such line and how
    many connections are open, at most once every :data:`REFUSAL_SUMMARY_SECONDS`.
    """

    def __init__(
        self,
        limits: ListenerLimits,
        *,
        security: EventSink | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._limits = limits
        self._open = 0
        self._by_source: Counter[str] = Counter()
        self._security = security
        self._monotonic = monotonic
        self._reported = 0
        self._reported_at: float | None = None
        self.refused = 0
        status = Code.CONNECTION_LIMIT_REACHED.status or 503
        self.refusal = _raw_refusal(
            Code.CONNECTION_LIMIT_REACHED, _BUSY, status=status, reason="Service Unavailable"
        )

    @property
    def open(self) -> int:
        return self._open

    @property
    def linger(self) -> float:
        """How long a refused connection waits for its peer to close (the header deadline)."""
        return self._limits.header_timeout

    def admit(self, transport: asyncio.BaseTransport) -> str | None:
        """The connection's source when it may be served, ``None`` when a cap is reached."""
        peer = transport.get_extra_info("peername")
        source = str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"
        if (
            self._open >= self._limits.max_connections
            or self._by_source[source] >= self._limits.max_connections_per_source
        ):
            self.refused += 1
            self._summarise()
            return None
        self._open += 1
        self._by_source[source] += 1
        return source

    def _summarise(self) -> None:
        now = self._monotonic()
        if self._security is None or (
            self._reported_at is not None and now - self._reported_at < REFUSAL_SUMMARY_SECONDS
        ):
            return
        self._security.emit(
            "CONNECTIONS_REFUSED", {"refused": self.refused - self._reported, "open": self._open}
        )
        self._reported, self._reported_at = self.refused, now

    def release(self, source: str) -> None:
        self._open -= 1
        self._by_source[source] -= 1
        if self._by_source[source] <= 0:
            del self._by_source[source]


class _Refused(asyncio.Protocol):
    """A connection the gate refused, once its answer is written: whatever the peer sends is
    dropped, and the connection closes when the peer closes its side (``eof_received``), or at
    the header deadline. The refused connection is handed to it, so that the handler of an
    admitted one passes data straight to aiohttp, with no check of its own on every chunk."""


class _ContractHandler(web.RequestHandler):
    """One connection: admitted by the gate, and aiohttp's own errors in the contract's form."""

    __slots__ = ("_gate", "_source")

    def __init__(self, manager: web.Server, *, gate: ConnectionGate, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._gate = gate
        self._source: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        source = self._gate.admit(transport)
        if source is None:
            # Answer, then half-close: a close with the peer's request still unread (or still
            # arriving) would be a reset that discards the answer. Whatever the peer sends is
            # dropped, and the connection is closed when the peer closes its side, or at the
            # header deadline: a refused connection is held no longer than an admitted one.
            assert isinstance(transport, asyncio.WriteTransport)
            transport.set_protocol(_Refused())
            transport.write(self._gate.refusal)
            if transport.can_write_eof():
                transport.write_eof()
            asyncio.get_running_loop().call_later(self._gate.linger, transport.close)
            return
        self._source = source
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._source is None:  # refused at the gate: aiohttp never saw it (nor does this)
            return
        self._gate.release(self._source)
        self._source = None
        super().connection_lost(exc)

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """aiohttp's answer when it could not parse a request (400) or a handler escaped (500):
        the refusal contract, a fixed message, the connection closed. ``message`` and ``exc``
        carry request bytes, so neither is answered nor logged."""
        if request.writer.output_size > 0:  # a response is already on the wire
            raise ConnectionError("a response was already sent; the connection is closed")
        log.debug("aiohttp refused a request (%s): %s", status, type(exc).__name__)
        if status == 400:
            code, text = Code.HTTP_MALFORMED, _MALFORMED
        elif status >= 500:
            code, text, status = Code.INTERNAL_ERROR, _FAILED, 500
        else:
            code, text = code_for_http_error(status), _MALFORMED
        response = refusal(code, text, status=status)
        response.headers.update(SECURITY_HEADERS)
        response.headers["Server"] = SERVER_HEADER
        response.force_close()
        return response


class GuardedSite(web.BaseSite):
    """A TCP listener whose connections pass the gate and the deadlines (module docstring)."""

    __slots__ = ("_bound_port", "_gate", "_host", "_limits", "_port", "_reuse_port")

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        limits: ListenerLimits,
        ssl_context: ssl.SSLContext | None = None,
        backlog: int = 128,
        security: EventSink | None = None,
        reuse_port: bool = False,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        self._reuse_port = reuse_port
        self._host = host
        self._port = port
        self._limits = limits
        self._gate = ConnectionGate(limits, security=security)
        self._bound_port: int | None = None

    @property
    def gate(self) -> ConnectionGate:
        return self._gate

    @property
    def port(self) -> int:
        return self._bound_port if self._bound_port is not None else self._port

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context is not None else "http"
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"{scheme}://{host}:{self.port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        settings = handler_settings(self._limits)
        gate = self._gate

        def connection() -> _ContractHandler:
            return _ContractHandler(server, gate=gate, loop=loop, **settings)

        self._server = await loop.create_server(
            connection,
            self._host,
            self._port,
            ssl=self._ssl_context,
            ssl_handshake_timeout=(
                self._limits.header_timeout if self._ssl_context is not None else None
            ),
            backlog=self._backlog,
            reuse_address=True,
            # EXECUTOR_WORKERS: every worker binds the same address; the kernel spreads
            # new connections over them (the TLS listener too: the handshake is per worker)
            reuse_port=self._reuse_port or None,
        )
        sockets = self._server.sockets
        self._bound_port = int(sockets[0].getsockname()[1]) if sockets else self._port
