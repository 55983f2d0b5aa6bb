"""The egress guard: the one outbound HTTP client, with its policy sealed at construction.

Role: every connection the executor opens (the forward handler and its lookup, the JWKS refresh,
the token endpoint) goes through :class:`GuardedClient`, which implements the
``transport.Transport`` contract. The policy is a list of :class:`Destination` — the origin and
path prefix of each configured address, its trust anchor and optional SPKI pins — and nothing
else. ``docs/egress.md`` describes the checks in order.

Refused before any socket exists (``sent=False``): a malformed request (EGRESS_INIT_UNSUPPORTED),
credentials in the URL or another origin (EGRESS_ORIGIN_NOT_ALLOWED), plain HTTP except to a
loopback answer of a destination that explicitly allows it (EGRESS_SCHEME_NOT_ALLOWED), a path
outside the prefix or one with dot segments or encoded separators (EGRESS_PATH_NOT_ALLOWED), a
non-canonical numeric host or an answer that is this host, loopback (unless allowed), in any
block of the IANA special-purpose registries (6to4, Teredo, NAT64 and IPv4-translated forms
included, named with the IPv4 address they carry), IPv6 outside global unicast (2000::/3), what
the interpreter's ``ipaddress`` calls reserved or not global, a cloud metadata address, or no
answer at all
(EGRESS_ADDRESS_REFUSED). Private-use blocks (RFC 1918, shared address space, unique local) are
refused too unless ``EXECUTOR_EGRESS_ALLOW_CIDRS`` names the part a deliberate private
destination answers from; the metadata addresses inside them stay refused. The name is resolved
once per request and the connection goes to exactly the checked address: the connector's
resolver can only return that answer, so DNS rebinding has nothing to rebind.
The pure checks of an answer (its refusal, its canonical text and family) and of a configured
host are remembered in bounded memos keyed by everything they depend on (issue 34): a
rebinding answer is another key, judged afresh. So is a request's check of its method, URL and
header names against this client's rules (``urls.check_target``, issue 32); the header values
are checked on every request, and a refusal is never remembered.

Connections are kept alive between requests (:class:`_Pool`), in lanes keyed by everything
that makes a connection what it is: the checked address and port, the scheme, the TLS server
name and the destination's sealed TLS context and pins. A request may reuse only a connection
of the lane of the answer it has just checked; a rebinding gets a new lane and a new, checked
connection. No request is written twice: aiohttp's own re-send of idempotent methods on a lost
connection is cut off (:class:`_ExchangeLost`); a kept-alive connection the kernel knows the
peer closed is discarded before a byte is written; a request that fails once aiohttp was about
to write it (request tracing) is ``sent=True``, and only one that failed on a reused connection
before that point is sent once more, on a fresh connection. Idle connections are closed after
:data:`POOL_IDLE_SECONDS`, at most :data:`POOL_MAX_CONNECTIONS` stay open, and ``close()``
closes them all.

Then TLS 1.2+ against the destination's anchor with hostname verification (EGRESS_TLS_REJECTED)
and the pins over the presented chain (EGRESS_TLS_PIN_MISMATCH, checked before a request byte is
written); a redirect is refused, never followed (EGRESS_REDIRECT_REFUSED, reported with whether
it leaves the origin); the body is read whole up to ``max_response_bytes``
(EGRESS_BODY_TOO_LARGE); a response header field may be up to
:data:`MAX_RESPONSE_HEADER_FIELD_BYTES`; the total time is bounded (EGRESS_TIMEOUT); a malformed
response is EGRESS_RESPONSE_INVALID.

Each refusal raises ``TransportError(code, sent)``, emits EGRESS_REFUSED on the security stream
with the origin and code (never the path or query) and calls ``on_refusal(code)``, through which
the caller counts refusals and halts on a spike (EXECUTOR_HALT_ON_EGRESS_REFUSALS).

Callers: ``egress/destinations.py`` builds one from the configuration, ``assembly.py`` hands it
to every component that reaches out.
Also imported by ``proxy.py``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hashlib
import ipaddress
import socket
import ssl
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.connector import Connection
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from yarl import URL

from .. import telemetry
from ..codes import Code
from ..errors import ConfigError
from ..events import Streams
from ..host.audithook import allowed_egress
from .registries import (
    METADATA_ADDRESSES,
    SPECIAL_PURPOSE_BLOCKS,
    Network,
    address_refusal,
    local_interface_addresses,
    unwrap,
)
from .transport import DEFAULT_MAX_RESPONSE_BYTES, HttpResponse, TransportError
from .urls import (
    HEADER_VALUE,
    Destination,
    Rule,
    _Refusal,
    check_request,
    check_target,
    leaves_origin,
    safe_origin,
    seal,
)

__all__ = [
    "MAX_RESPONSE_BYTES_RANGE",
    "MAX_RESPONSE_HEADER_FIELD_BYTES",
    "METADATA_ADDRESSES",
    "POOL_IDLE_SECONDS",
    "POOL_MAX_CONNECTIONS",
    "SPECIAL_PURPOSE_BLOCKS",
    "Destination",
    "GuardedClient",
    "ResolvedAddress",
    "address_refusal",
    "spki_pin",
]

MAX_RESPONSE_BYTES_RANGE = (1024, 16 * 1024 * 1024)
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_CHUNK = 64 * 1024
_ENCODING_DER = getattr(getattr(ssl, "_ssl", None), "ENCODING_DER", 1)
_TCP_INFO: int | None = getattr(socket, "TCP_INFO", None)
_TCP_ESTABLISHED = 1  # tcpi_state, include/net/tcp_states.h

POOL_IDLE_SECONDS = 2.0
"""A kept-alive provider connection idle longer than this is closed, never reused: well below
the shortest keep-alive timeout common servers use (Node.js 5 s, Go and aiohttp more, nginx
75 s), so the provider is not closing a connection as the executor starts to write on it."""
POOL_MAX_CONNECTIONS = 32
"""At most this many provider connections stay open across all pooled addresses."""
MAX_RESPONSE_HEADER_FIELD_BYTES = 64 * 1024
"""The longest response header field the guard reads (aiohttp's default is 8190): a provider's
effect receipt beyond that default must not turn an answer the executor can read (a committed
payment) into EGRESS_RESPONSE_INVALID, an unknown outcome. aiohttp's bound of 128 header fields
still holds. A longer field makes the response invalid (issue 30, item 17)."""

Resolve = Callable[[str, int], Awaitable[Sequence[str]]]
"""Resolve ``(host, port)`` to IP address strings (the default uses the loop's getaddrinfo)."""


@dataclass(frozen=True)
class ResolvedAddress:
    """The one answer a request was checked against and will connect to."""

    host: str
    port: int
    ip: str
    family: int


@dataclass
class _Progress:
    """How far one request got: a connection (new or ``reused``), and ``written``: aiohttp
    was about to write the request's first byte (so it may have reached the peer)."""

    connected: bool = False
    reused: bool = False
    written: bool = False


def spki_pin(certificate_der: bytes) -> str:
    """``sha256/<base64>`` of the certificate's SubjectPublicKeyInfo (the pin format)."""
    cert = x509.load_der_x509_certificate(certificate_der)
    spki = cert.public_key().public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    return "sha256/" + base64.b64encode(hashlib.sha256(spki).digest()).decode("ascii")


def _spki_digest(certificate_der: bytes) -> bytes:
    cert = x509.load_der_x509_certificate(certificate_der)
    spki = cert.public_key().public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(spki).digest()


class _PinnedResolver(AbstractResolver):
    """Answers only the address the guard checked; never asks DNS."""

    def __init__(self, answer: ResolvedAddress) -> None:
        self._answer = answer

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        if host.lower() != self._answer.host or port != self._answer.port:
            raise OSError("the guard resolved no such name for this request")
        return [
            ResolveResult(
                hostname=host,
                host=self._answer.ip,
                port=self._answer.port,
                family=self._answer.family,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
        ]

    async def close(self) -> None:
        return None


class _ExchangeLost(Exception):
    """The connection failed during an exchange (aiohttp's ``ClientOSError`` or
    ``ServerDisconnectedError``), raised past aiohttp's request loop so it cannot re-send.

    Deliberately neither an ``OSError`` nor an ``aiohttp.ClientError``: aiohttp 3.x re-sends a
    GET, HEAD, OPTIONS, TRACE, PUT or DELETE once, by itself, when one of those two errors
    leaves its connect-and-send step (``ClientSession._request``, the
    ``retry_persistent_connection`` branch), on a reused connection or a fresh one alike. The
    request's one client middleware (:func:`_never_resend`) turns them into this, which that
    branch does not catch, so every request is written at most once per call of
    :meth:`GuardedClient.request`.
    """


async def _never_resend(
    request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
) -> aiohttp.ClientResponse:
    try:
        return await handler(request)
    except aiohttp.ClientConnectorError:
        raise  # no connection was made: never retried by aiohttp, classified by the caller
    except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError) as exc:
        raise _ExchangeLost() from exc


async def _on_connection_created(
    session: aiohttp.ClientSession, ctx: SimpleNamespace, params: object
) -> None:
    progress: _Progress = ctx.trace_request_ctx
    progress.connected = True
    progress.reused = False


async def _on_connection_reused(
    session: aiohttp.ClientSession, ctx: SimpleNamespace, params: object
) -> None:
    progress: _Progress = ctx.trace_request_ctx
    progress.connected = True
    progress.reused = True


async def _on_headers_sent(
    session: aiohttp.ClientSession, ctx: SimpleNamespace, params: object
) -> None:
    # aiohttp calls this just before it serialises the headers, and writes nothing of the
    # request before it: from here on a byte may have reached the peer; before it, none has.
    progress: _Progress = ctx.trace_request_ctx
    progress.written = True


def _tracing() -> aiohttp.TraceConfig:
    trace = aiohttp.TraceConfig()
    trace.on_connection_create_end.append(_on_connection_created)
    trace.on_connection_reuseconn.append(_on_connection_reused)
    trace.on_request_headers_sent.append(_on_headers_sent)
    return trace


_TRACING = _tracing()


def _still_open(transport: asyncio.BaseTransport | None) -> bool:
    """False when the peer has closed (or reset) a kept-alive connection, as far as the kernel
    knows now, even if the event loop has not yet read the FIN.

    Linux's ``TCP_INFO`` gives the socket's state in its first byte; anything but ESTABLISHED
    (CLOSE_WAIT after the peer's FIN, CLOSE after a reset) means the connection must not carry
    another request. Where ``TCP_INFO`` is unavailable the transport's own state is all there is.
    """
    if transport is None or transport.is_closing():
        return False
    sock = transport.get_extra_info("socket")
    if sock is None or _TCP_INFO is None:
        return True
    try:
        state = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 1)
    except OSError:
        return False
    return bool(state) and state[0] == _TCP_ESTABLISHED


@dataclass(frozen=True)
class _LaneKey:
    """What makes a connection what it is: the checked address it goes to, the origin it
    speaks for (scheme, TLS server name and ``Host``), and the TLS it was set up with (the
    destination's sealed context: trust anchor, and a client certificate were one loaded; the
    pins checked over its chain)."""

    ip: str
    port: int
    scheme: str
    server_name: str
    ssl_context: ssl.SSLContext | None
    pins: frozenset[bytes]


@dataclass(eq=False)
class _Lane:
    """The kept-alive connections of one :class:`_LaneKey`, in one aiohttp session whose
    connector can only connect to the lane's address."""

    key: _LaneKey
    session: aiohttp.ClientSession
    open: int = 0
    users: int = 0


class _Pool:
    """Kept-alive provider connections, by :class:`_LaneKey` (see ``docs/egress.md``).

    A connection idle for more than :data:`POOL_IDLE_SECONDS` is closed, never reused, and at
    most :data:`POOL_MAX_CONNECTIONS` connections stay open across all lanes: past that, a
    connection handed to a request is closed after its exchange instead of kept (a request
    never waits for a pooled connection). A lane with no open connection and no request is
    dropped when a new lane is made.
    """

    def __init__(self) -> None:
        self._lanes: dict[_LaneKey, _Lane] = {}
        self._live: dict[Any, _Lane] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self.closed = False

    def lane(self, key: _LaneKey, answer: ResolvedAddress) -> _Lane:
        lane = self._lanes.get(key)
        if lane is None:
            for other in [v for v in self._lanes.values() if not v.open and not v.users]:
                del self._lanes[other.key]
                closing = asyncio.get_running_loop().create_task(other.session.close())
                self._closing.add(closing)
                closing.add_done_callback(self._closing.discard)
            connector = _GuardedConnector(answer=answer, pins=key.pins, pool=self)
            lane = _Lane(key, _client_session(connector))
            connector.lane = lane
            self._lanes[key] = lane
        return lane

    def opened(self, lane: _Lane, protocol: Any) -> None:
        closed = protocol.closed  # None: already lost, nothing to count
        if closed is not None:
            self._live[protocol] = lane
            lane.open += 1
            closed.add_done_callback(functools.partial(self._gone, protocol))

    def _gone(self, protocol: Any, future: asyncio.Future[None]) -> None:
        if not future.cancelled():
            future.exception()  # retrieved: a connection lost with an error is expected here
        self._forget(protocol)

    def _forget(self, protocol: Any) -> None:
        lane = self._live.pop(protocol, None)
        if lane is not None:
            lane.open -= 1

    @property
    def open(self) -> int:
        """Connections open now, in use or idle, across all lanes."""
        return len(self._live)

    def keep(self, protocol: Any) -> bool:
        """Whether the connection just handed to a request may stay pooled after it; when
        not, it no longer counts (the connector has aiohttp close it after the exchange)."""
        if not self.closed and len(self._live) <= POOL_MAX_CONNECTIONS:
            return True
        self._forget(protocol)
        return False

    async def close(self) -> None:
        self.closed = True
        lanes, self._lanes = list(self._lanes.values()), {}
        for lane in lanes:
            await lane.session.close()
        for closing in list(self._closing):
            await closing


class _GuardedConnector(aiohttp.TCPConnector):
    """Connects only to the checked answer, inside ``allowed_egress``, then checks the pins.

    With ``pool`` None it is a one-request connector (``force_close``); with a pool, the
    connector of one lane: it keeps connections alive for :data:`POOL_IDLE_SECONDS`, and
    before it hands out a kept-alive one it asks the kernel whether the peer has closed it
    (:func:`_still_open`), discarding those before a byte of the request is written.
    """

    def __init__(
        self, *, answer: ResolvedAddress, pins: frozenset[bytes], pool: _Pool | None = None
    ) -> None:
        if pool is None:
            super().__init__(
                resolver=_PinnedResolver(answer),
                use_dns_cache=False,
                force_close=True,
                limit=1,
                happy_eyeballs_delay=None,
            )
        else:
            super().__init__(
                resolver=_PinnedResolver(answer),
                use_dns_cache=False,
                keepalive_timeout=POOL_IDLE_SECONDS,
                limit=0,
                happy_eyeballs_delay=None,
            )
        self._pins = pins
        self._pool = pool
        self._attributes = {"server.address": answer.host, "server.port": answer.port}
        self.lane: _Lane | None = None
        self._served: weakref.WeakSet[Any] = weakref.WeakSet()

    async def connect(
        self, req: aiohttp.ClientRequest, traces: list[Any], timeout: aiohttp.ClientTimeout
    ) -> Connection:
        while True:  # ends: each turn takes a kept-alive connection out, or makes a new one
            conn = await super().connect(req, traces, timeout)
            protocol = conn.protocol
            if protocol is None:
                return conn
            if protocol in self._served and not _still_open(conn.transport):
                conn.close()  # the peer closed it while it was idle: nothing of this request left
                continue
            self._served.add(protocol)
            if self._pool is not None and not self._pool.keep(protocol):
                protocol.force_close()  # past the cap: closed after this exchange, not kept
            return conn

    async def _wrap_create_connection(
        self, *args: Any, **kwargs: Any
    ) -> tuple[asyncio.Transport, Any]:
        with telemetry.span("agentsafe.egress.connect", self._attributes, child_only=True) as c:
            with allowed_egress():
                transport, protocol = await super()._wrap_create_connection(*args, **kwargs)
            if self._pins and not _chain_matches(transport, self._pins):
                transport.abort()
                if c is not None:
                    c.set_attribute("agentsafe.code", str(Code.EGRESS_TLS_PIN_MISMATCH))
                raise _Refusal(Code.EGRESS_TLS_PIN_MISMATCH)
        if self._pool is not None and self.lane is not None:
            self._pool.opened(self.lane, protocol)
        return transport, protocol


def _client_session(connector: _GuardedConnector) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=connector,
        max_field_size=MAX_RESPONSE_HEADER_FIELD_BYTES,
        auto_decompress=False,
        skip_auto_headers=("User-Agent", "Accept-Encoding"),
        raise_for_status=False,
        timeout=aiohttp.ClientTimeout(total=None),
        trust_env=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        trace_configs=[_TRACING],
        middlewares=(_never_resend,),
    )


def _chain_matches(transport: asyncio.BaseTransport, pins: frozenset[bytes]) -> bool:
    """True when some certificate of the verified chain (at least the leaf) has a pinned SPKI.

    Python 3.11 has no public API for the chain; the private ``get_verified_chain`` of the
    underlying ``_ssl`` object (public from 3.13) is used when present, else only the leaf.
    """
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        return False
    ders: list[bytes] = []
    inner = getattr(ssl_object, "_sslobj", None)
    chain_fn = getattr(ssl_object, "get_verified_chain", None) or getattr(
        inner, "get_verified_chain", None
    )
    if callable(chain_fn):
        with contextlib.suppress(Exception):
            for cert in chain_fn() or ():
                ders.append(cert.public_bytes(_ENCODING_DER))
    if not ders:
        leaf = ssl_object.getpeercert(binary_form=True)
        if leaf:
            ders.append(leaf)
    return any(_spki_digest(der) in pins for der in ders)


def _server(rule: Rule) -> dict[str, object]:
    """A span's ``server.address`` and ``server.port``: the configured destination's, never the
    request's path or query."""
    return {"server.address": rule.host, "server.port": rule.port, "url.scheme": rule.scheme}


# The pure checks of a resolved answer, remembered (issue 34: ``ipaddress`` parsing was 1.0-1.4%
# of an ALLOW). Each is a function of its arguments alone, so a remembered answer is the one it
# would compute; the name is still resolved once per request and every answer of that request is
# checked, so a rebinding answer is a new argument and is judged afresh. Bounded, least recently
# used first out (``functools.lru_cache``, the standard library's bounded memo).
@functools.lru_cache(maxsize=1024)
def _address_refusal_memo(
    address: str,
    allow_loopback: bool,
    local_addresses: frozenset[str],
    allowed: tuple[Network, ...],
) -> str | None:
    """:func:`address_refusal` of one answer, for one destination's allowance and this
    client's own addresses and opened networks (all part of the key)."""
    return address_refusal(
        address, allow_loopback=allow_loopback, local_addresses=local_addresses, allowed=allowed
    )


@functools.lru_cache(maxsize=1024)
def _address_facts(address: str) -> tuple[str, int, bool]:
    """An address checked already (its zone left off): its canonical text, its IP version and
    whether it is loopback as the IPv4 address it may carry."""
    ip = ipaddress.ip_address(address)
    return str(ip), ip.version, unwrap(ip).is_loopback


@functools.lru_cache(maxsize=256)
def _is_address(host: str) -> bool:
    """Whether a destination's host (brackets left off) is an IP address, not a name."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


async def _system_resolve(host: str, port: int) -> Sequence[str]:
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


@dataclass
class GuardedClient:
    """The ``Transport`` every component uses; see the module docstring for the policy.

    ``resolve`` replaces the system resolver (tests use a stand-in DNS); ``local_addresses``
    replaces the discovered interface addresses of this host. ``allowed_networks``
    (``EXECUTOR_EGRESS_ALLOW_CIDRS``) opens those parts of the private-use blocks a deliberate
    private destination answers from, and nothing else.
    """

    destinations: Sequence[Destination]
    streams: Streams
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    on_refusal: Callable[[str], None] | None = None
    resolve: Resolve | None = None
    local_addresses: Iterable[str] | None = None
    allowed_networks: Sequence[str] = ()
    _rules: tuple[Rule, ...] = field(init=False, repr=False)
    _local: frozenset[str] = field(init=False, repr=False)
    _allowed: tuple[Network, ...] = field(init=False, repr=False)
    _pool: _Pool = field(init=False, repr=False, default_factory=lambda: _Pool())
    _target: Callable[[str, str, tuple[str, ...]], tuple[URL, str, Rule]] = field(
        init=False, repr=False
    )

    def __post_init__(self) -> None:
        low, high = MAX_RESPONSE_BYTES_RANGE
        if not low <= self.max_response_bytes <= high:
            raise ConfigError("EXECUTOR_EGRESS_MAX_RESPONSE_BYTES", "must be 1 KiB to 16 MiB")
        self._rules = tuple(seal(d) for d in self.destinations)
        # ``check_target`` remembered for this client's rules: a pure function of them and of
        # the method, the URL and the header names, so a remembered answer is the one it would
        # compute; a refusal is never remembered (an exception), so it is judged afresh.
        self._target = functools.lru_cache(maxsize=256)(
            functools.partial(check_target, self._rules)
        )
        local = (
            local_interface_addresses() if self.local_addresses is None else self.local_addresses
        )
        self._local = frozenset(str(ipaddress.ip_address(a)) for a in local)
        try:  # checked by the configuration already (host bits clear, no /0)
            self._allowed = tuple(ipaddress.ip_network(n) for n in self.allowed_networks)
        except ValueError:
            raise ConfigError("EXECUTOR_EGRESS_ALLOW_CIDRS", "must be CIDRs") from None

    def __repr__(self) -> str:
        return f"GuardedClient(origins={sorted({r.origin for r in self._rules})})"

    async def close(self) -> None:
        """Close the kept-alive connections (the process calls it on shutdown); a request
        after it is refused."""
        await self._pool.close()

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout: float,
    ) -> HttpResponse:
        origin = "invalid"
        progress = _Progress()
        try:
            # The remembered check of the method, the URL and the header names, then each
            # header value (``urls.header_value_ok``, inlined): a request seen before calls
            # nothing in egress.urls (issue 32). Anything either refuses is checked again whole,
            # which raises the first refusal, with the origin to report.
            target = None
            if type(method) is str and type(url) is str:
                with contextlib.suppress(_Refusal):
                    target = self._target(method, url, tuple(headers))
            if target is None or not all(
                isinstance(value, str) and HEADER_VALUE.fullmatch(value) is not None
                for value in headers.values()
            ):
                origin = safe_origin(url)
                target = check_request(self._rules, method, url, headers)
            parsed, origin, rule = target
            if not timeout > 0:
                raise _Refusal(Code.EGRESS_TIMEOUT)
            async with asyncio.timeout(timeout):
                with telemetry.span(
                    "agentsafe.egress.resolve", _server(rule), child_only=True
                ) as resolving:
                    try:
                        answer = await self._resolve_once(parsed, rule)
                    except _Refusal as refusal:
                        if resolving is not None:
                            resolving.set_attribute("agentsafe.code", str(refusal.code))
                        raise
                return await self._exchange(method, parsed, rule, answer, headers, body, progress)
        except _Refusal as refusal:
            raise self._refused(refusal, origin) from None
        except TimeoutError:
            raise self._refused(
                _Refusal(Code.EGRESS_TIMEOUT, sent=progress.connected or progress.written), origin
            ) from None
        except TransportError:
            raise
        except aiohttp.ClientConnectorCertificateError:
            raise self._refused(_Refusal(Code.EGRESS_TLS_REJECTED), origin) from None
        except aiohttp.ClientSSLError:
            raise self._refused(_Refusal(Code.EGRESS_TLS_REJECTED), origin) from None
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.__cause__, _Refusal):
                raise self._refused(exc.__cause__, origin) from None
            raise TransportError(
                Code.TRANSPORT_CONNECT_FAILED, False, "the peer could not be reached"
            ) from None
        except _ExchangeLost:
            raise TransportError(
                Code.TRANSPORT_CONNECTION_LOST,
                progress.connected or progress.written,
                "the connection failed during the exchange",
            ) from None
        except (aiohttp.ClientResponseError, aiohttp.ClientPayloadError):
            raise self._refused(_Refusal(Code.EGRESS_RESPONSE_INVALID, sent=True), origin) from None
        except (aiohttp.ClientError, OSError):
            raise TransportError(
                Code.TRANSPORT_CONNECTION_LOST,
                progress.connected or progress.written,
                "the connection failed during the exchange",
            ) from None

    # -- policy -----------------------------------------------------------------------------

    async def _resolve_once(self, url: URL, rule: Rule) -> ResolvedAddress:
        host = rule.host
        literal = host.strip("[]")
        if _is_address(literal):
            answers: Sequence[str] = [literal]
        else:
            resolver = self.resolve or _system_resolve
            try:
                answers = list(await resolver(host, rule.port))
            except (OSError, UnicodeError):
                answers = []
        if not answers:
            raise _Refusal(Code.EGRESS_ADDRESS_REFUSED, reason="nowhere")
        for answer in answers:
            if type(answer) is str:  # every answer checked, this request, as it was given
                reason = _address_refusal_memo(
                    answer, rule.allow_loopback, self._local, self._allowed
                )
            else:
                reason = address_refusal(
                    answer,
                    allow_loopback=rule.allow_loopback,
                    local_addresses=self._local,
                    allowed=self._allowed,
                )
            if reason is not None:
                raise _Refusal(Code.EGRESS_ADDRESS_REFUSED, reason=reason)
        chosen = answers[0].split("%", 1)[0]
        ip_text, version, loopback = _address_facts(chosen)
        if rule.scheme == "http" and not loopback:
            raise _Refusal(Code.EGRESS_SCHEME_NOT_ALLOWED)
        family = socket.AF_INET6 if version == 6 else socket.AF_INET
        return ResolvedAddress(host=host, port=rule.port, ip=ip_text, family=family)

    # -- the exchange -----------------------------------------------------------------------

    async def _exchange(
        self,
        method: str,
        url: URL,
        rule: Rule,
        answer: ResolvedAddress,
        headers: Mapping[str, str],
        body: bytes | None,
        progress: _Progress,
    ) -> HttpResponse:
        """One request on a kept-alive connection to exactly ``answer`` (or a new one in its
        lane); once more, on a fresh one-request connection, only when it failed on a reused
        connection before aiohttp was about to write its first byte."""
        if self._pool.closed:
            raise TransportError(
                Code.TRANSPORT_CONNECT_FAILED, False, "the egress client is closed"
            )
        key = _LaneKey(answer.ip, answer.port, rule.scheme, rule.host, rule.ssl_context, rule.pins)
        lane = self._pool.lane(key, answer)
        lane.users += 1
        try:
            return await self._attempt(lane.session, method, url, rule, headers, body, progress)
        except _ExchangeLost:
            if progress.written or not progress.reused:
                raise
        finally:
            lane.users -= 1
        progress.reused = False
        connector = _GuardedConnector(answer=answer, pins=rule.pins)
        async with _client_session(connector) as session:
            return await self._attempt(session, method, url, rule, headers, body, progress)

    async def _attempt(
        self,
        session: aiohttp.ClientSession,
        method: str,
        url: URL,
        rule: Rule,
        headers: Mapping[str, str],
        body: bytes | None,
        progress: _Progress,
    ) -> HttpResponse:
        async with session.request(
            method,
            url,
            headers=dict(headers),
            data=body,
            allow_redirects=False,
            ssl=rule.ssl_context or False,
            trace_request_ctx=progress,
        ) as response:
            if response.status in _REDIRECTS:
                raise _Refusal(
                    Code.EGRESS_REDIRECT_REFUSED,
                    sent=True,
                    leaves_origin=leaves_origin(url, response.headers.get("Location")),
                )
            data = await self._read_body(response)
            joined: dict[str, str] = {}
            for name, value in response.headers.items():
                key = name.lower()
                joined[key] = f"{joined[key]}, {value}" if key in joined else value
            return HttpResponse(status=response.status, headers=joined, body=data)

    async def _read_body(self, response: aiohttp.ClientResponse) -> bytes:
        limit = self.max_response_bytes
        declared = response.content_length
        if declared is not None and declared > limit:
            raise _Refusal(Code.EGRESS_BODY_TOO_LARGE, sent=True)
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = await response.content.read(_CHUNK)
            if not chunk:
                break
            total += len(chunk)
            if total > limit:
                raise _Refusal(Code.EGRESS_BODY_TOO_LARGE, sent=True)
            chunks.append(chunk)
        return b"".join(chunks)

    def _refused(self, refusal: _Refusal, origin: str) -> TransportError:
        fields: dict[str, Any] = {"origin": origin, "code": refusal.code}
        if "leaves_origin" in refusal.extra:
            fields["leaves_origin"] = refusal.extra["leaves_origin"]
        self.streams.security.emit("EGRESS_REFUSED", fields)
        if self.on_refusal is not None:
            self.on_refusal(refusal.code)
        return TransportError(refusal.code, refusal.sent)
