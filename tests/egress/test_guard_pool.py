"""Kept-alive provider connections against a real provider that closes them on purpose.

The provider here is a small HTTP/1.1 server on loopback, written with blocking sockets in a
thread so that a test decides, request by request, what it does with a connection (answer and
keep it, answer and close it, close it at accept, close it after reading the headers or the
body) and counts what it received: connections accepted, request heads read, bodies read. The
guard's promises under test: a connection is reused only inside the lane of the address just
checked; no request is ever written twice by aiohttp on its own; a request that may have been
written is reported ``sent`` (UNKNOWN_AFTER_DISPATCH), one provably never written goes on a
fresh connection; idle and count bounds; closed on ``close()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agentsafe.executor.egress import guard as guard_module
from agentsafe.executor.egress.guard import Destination, GuardedClient
from agentsafe.executor.egress.transport import TransportError
from agentsafe.executor.events import Streams
from tests.support.pki import TestCA

ANSWER = "answer"  # answer 200 and keep the connection
ANSWER_THEN_CLOSE = "answer-then-close"  # answer 200, then close (an idle close)
CLOSE_AT_ACCEPT = "close-at-accept"  # close before reading anything
CLOSE_AFTER_HEADERS = "close-after-headers"  # read the request head, then close
CLOSE_AFTER_BODY = "close-after-body"  # read the head and the body, then close
DEADLINE_S = 10.0


def _wait(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


@dataclass
class Provider:
    """A scripted HTTP/1.1 server on ``host`` (port 0 unless given); see the module docstring.

    ``script`` is consumed one action per request head (or per connection for
    CLOSE_AT_ACCEPT), then ANSWER forever."""

    host: str = "127.0.0.1"
    port: int = 0
    script: list[str] = field(default_factory=list)
    tls: ssl.SSLContext | None = None
    connections: int = 0
    closed: int = 0
    heads: list[str] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _sock: socket.socket | None = None
    _threads: list[threading.Thread] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Provider:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        sock.listen(16)
        sock.settimeout(0.05)
        self._sock = sock
        self.port = sock.getsockname()[1]
        thread = threading.Thread(target=self._accept, daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(5)
        if self._sock is not None:
            self._sock.close()

    def _next(self, accept: bool) -> str:
        with self._lock:
            if self.script and (self.script[0] == CLOSE_AT_ACCEPT) == accept:
                return self.script.pop(0)
            return ANSWER

    def _accept(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            with self._lock:
                self.connections += 1
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self, raw: socket.socket) -> None:
        conn: socket.socket = raw
        try:
            if self._next(accept=True) == CLOSE_AT_ACCEPT:
                return
            if self.tls is not None:
                conn = self.tls.wrap_socket(raw, server_side=True)
            conn.settimeout(0.05)
            buffer = b""
            while not self._stop.is_set():
                try:
                    chunk = conn.recv(65536)
                except TimeoutError:
                    continue
                if not chunk:
                    return
                buffer += chunk
                while b"\r\n\r\n" in buffer:
                    head, rest = buffer.split(b"\r\n\r\n", 1)
                    action = self._next(accept=False)
                    with self._lock:
                        self.heads.append(head.split(b"\r\n", 1)[0].decode())
                    if action == CLOSE_AFTER_HEADERS:
                        return
                    length = 0
                    for line in head.split(b"\r\n")[1:]:
                        name, _, value = line.partition(b":")
                        if name.strip().lower() == b"content-length":
                            length = int(value.strip())
                    while len(rest) < length:
                        more = conn.recv(65536)
                        if not more:
                            return
                        rest += more
                    body, buffer = rest[:length], rest[length:]
                    with self._lock:
                        self.bodies.append(body)
                    if action == CLOSE_AFTER_BODY:
                        return
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    if action == ANSWER_THEN_CLOSE:
                        return
        except (OSError, ssl.SSLError):
            return
        finally:
            with contextlib.suppress(OSError):
                conn.close()
            with self._lock:
                self.closed += 1


@pytest.fixture
def providers() -> Iterator[Callable[..., Provider]]:
    started: list[Provider] = []

    def start(**kw: Any) -> Provider:
        provider = Provider(**kw).start()
        started.append(provider)
        return provider

    yield start
    for provider in started:
        provider.stop()


@dataclass
class Dns:
    """Stand-in DNS whose answer a test changes between requests (a rebinding)."""

    answer: list[str]

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        return list(self.answer)


def guarded(port: int, *, dns: Dns | None = None, **kw: Any) -> GuardedClient:
    destination = kw.pop("destinations", None) or [
        Destination(f"http://provider.test:{port}/api/", allow_insecure_loopback=True)
    ]
    return GuardedClient(
        destination, Streams.memory(), resolve=dns or Dns(["127.0.0.1"]), local_addresses=(), **kw
    )


async def call(
    client: GuardedClient,
    port: int,
    method: str = "POST",
    *,
    scheme: str = "http",
    path: str = "/api/x",
) -> bytes:
    body = None if method in ("GET", "DELETE") else b'{"amount":1}'
    response = await client.request(
        method, f"{scheme}://provider.test:{port}{path}", headers={}, body=body, timeout=10
    )
    assert response.status == 200
    return bytes(response.body)


async def test_a_kept_alive_connection_carries_the_next_request(
    providers: Callable[..., Provider],
) -> None:
    provider = providers()
    client = guarded(provider.port)
    for _ in range(3):
        assert await call(client, provider.port) == b"ok"
    assert provider.connections == 1
    assert len(provider.heads) == 3


def _second_loopback(port: int, providers: Callable[..., Provider]) -> Provider:
    try:
        return providers(host="127.0.0.2", port=port)
    except OSError:
        pytest.skip("127.0.0.2 cannot take the same port here")


async def test_a_rebinding_gets_a_new_connection_to_the_address_just_checked(
    providers: Callable[..., Provider],
) -> None:
    first = providers()
    second = _second_loopback(first.port, providers)
    dns = Dns(["127.0.0.1"])
    client = guarded(first.port, dns=dns)
    await call(client, first.port)
    dns.answer = ["127.0.0.2"]  # the name now answers elsewhere: that connection is not reused
    await call(client, first.port)
    assert (first.connections, len(first.heads)) == (1, 1)
    assert (second.connections, len(second.heads)) == (1, 1)
    dns.answer = ["127.0.0.1"]  # back: the connection to the address checked now is reused
    await call(client, first.port)
    assert (first.connections, len(first.heads)) == (1, 2)


async def test_a_rebinding_to_a_refused_address_is_refused_with_a_connection_pooled(
    providers: Callable[..., Provider],
) -> None:
    provider = providers()
    dns = Dns(["127.0.0.1"])
    client = guarded(provider.port, dns=dns)
    await call(client, provider.port)
    dns.answer = ["169.254.169.254"]
    with pytest.raises(TransportError) as refused:
        await call(client, provider.port)
    assert (refused.value.code, refused.value.sent) == ("EGRESS_ADDRESS_REFUSED", False)
    assert len(provider.heads) == 1


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "GET"])
@pytest.mark.parametrize("close", [CLOSE_AFTER_HEADERS, CLOSE_AFTER_BODY])
@pytest.mark.parametrize("reused", [False, True], ids=["fresh", "reused"])
async def test_a_request_the_provider_may_have_read_is_never_sent_again(
    providers: Callable[..., Provider], method: str, close: str, reused: bool
) -> None:
    """aiohttp on its own re-sends GET, PUT and DELETE (and the other idempotent methods) once
    when the connection fails; through the guard, the provider receives the request once and
    the caller hears that it may have been executed."""
    provider = providers(script=[ANSWER, close] if reused else [close])
    client = guarded(provider.port)
    if reused:
        await call(client, provider.port)
    with pytest.raises(TransportError) as lost:
        await call(client, provider.port, method)
    assert (lost.value.code, lost.value.sent) == ("TRANSPORT_CONNECTION_LOST", True)
    line = f"{method} /api/x HTTP/1.1"
    assert provider.heads == (["POST /api/x HTTP/1.1", line] if reused else [line])
    assert provider.connections == 1


async def test_a_connection_closed_at_accept_is_not_retried(
    providers: Callable[..., Provider],
) -> None:
    provider = providers(script=[CLOSE_AT_ACCEPT])
    client = guarded(provider.port)
    with pytest.raises(TransportError) as lost:
        await call(client, provider.port, "PUT")
    assert lost.value.code == "TRANSPORT_CONNECTION_LOST"
    assert provider.connections == 1  # no second connection, no second attempt
    assert provider.heads == []


def _pooled_sockets(client: GuardedClient) -> list[Any]:
    """The kernel sockets of the connections kept alive in the client's pool (test access)."""
    out = []
    for lane in client._pool._lanes.values():
        connector = lane.session.connector
        assert connector is not None
        for conns in connector._conns.values():  # aiohttp's idle connections
            for protocol, _ in conns:
                out.append(protocol.transport.get_extra_info("socket"))
    return out


def _tcp_state(sock: Any) -> int:
    return int(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0])


async def test_a_connection_the_provider_closed_while_idle_carries_nothing(
    providers: Callable[..., Provider],
) -> None:
    """The provider closes a kept-alive connection just before the next request: the guard
    finds it closed before writing a byte and sends the request on a new connection. The event
    loop is held (blocking waits) so that aiohttp has not yet seen the close; only the kernel
    has, which is what the guard asks."""
    provider = providers(script=[ANSWER_THEN_CLOSE])
    client = guarded(provider.port)
    await call(client, provider.port)
    _wait(lambda: provider.closed == 1, "the provider to close the connection")
    pooled = _pooled_sockets(client)
    assert len(pooled) == 1
    _wait(lambda: _tcp_state(pooled[0]) != 1, "the client's kernel to see the close")
    assert await call(client, provider.port, "PUT") == b"ok"
    assert provider.connections == 2
    assert [h.split(" ")[0] for h in provider.heads] == ["POST", "PUT"]


def test_still_open_asks_the_kernel() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()

    class Stand:
        """A transport stand-in around a real socket: only what ``_still_open`` reads."""

        def is_closing(self) -> bool:
            return False

        def get_extra_info(self, name: str) -> Any:
            return client if name == "socket" else None

    try:
        assert guard_module._still_open(Stand())
        server.close()
        _wait(lambda: _tcp_state(client) != 1, "the FIN")
        assert not guard_module._still_open(Stand())
        assert not guard_module._still_open(None)
    finally:
        client.close()
        listener.close()


async def test_an_idle_connection_is_closed_after_the_idle_bound(
    providers: Callable[..., Provider], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(guard_module, "POOL_IDLE_SECONDS", 0.05)
    provider = providers()
    client = guarded(provider.port)
    await call(client, provider.port)
    deadline = time.monotonic() + DEADLINE_S
    while provider.closed < 1 or client._pool.open:  # the guard closes it, the provider sees it
        assert time.monotonic() < deadline, "the idle connection was kept"
        await asyncio.sleep(0.01)
    await call(client, provider.port)
    assert provider.connections == 2


async def test_past_the_cap_a_finished_connection_is_closed(
    providers: Callable[..., Provider], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(guard_module, "POOL_MAX_CONNECTIONS", 1)
    provider = providers()
    client = guarded(provider.port)
    await asyncio.gather(*(call(client, provider.port) for _ in range(3)))
    opened = provider.connections
    deadline = time.monotonic() + DEADLINE_S
    while client._pool.open > 1 or provider.closed < opened - 1:
        assert time.monotonic() < deadline, "more than the cap stayed open"
        await asyncio.sleep(0.01)
    assert client._pool.open == 1
    await call(client, provider.port)
    assert provider.connections == opened  # the one kept was reused


async def test_close_closes_the_kept_connections_and_refuses_after(
    providers: Callable[..., Provider],
) -> None:
    provider = providers()
    client = guarded(provider.port)
    await call(client, provider.port)
    await client.close()
    deadline = time.monotonic() + DEADLINE_S
    while provider.closed < 1:
        assert time.monotonic() < deadline, "close() left the connection open"
        await asyncio.sleep(0.01)
    with pytest.raises(TransportError) as closed:
        await call(client, provider.port)
    assert (closed.value.code, closed.value.sent) == ("TRANSPORT_CONNECT_FAILED", False)
    await client.close()  # twice is fine


def _server_tls(ca: TestCA, tmp_path: Path) -> ssl.SSLContext:
    issued = ca.issue_server(dns_names=("provider.test",), ips=(), common_name="provider.test")
    cert, key = issued.write(tmp_path, "provider.test")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


async def test_tls_connections_are_reused_only_under_the_same_trust_anchor(
    providers: Callable[..., Provider], tmp_path: Path
) -> None:
    ca = TestCA()
    anchor = str(ca.write(tmp_path))
    provider = providers(tls=_server_tls(ca, tmp_path))
    port = provider.port
    client = guarded(
        port,
        destinations=[
            Destination(
                f"https://provider.test:{port}/a/", ca_file=anchor, allow_insecure_loopback=True
            ),
            Destination(
                f"https://provider.test:{port}/b/", ca_file=anchor, allow_insecure_loopback=True
            ),
        ],
    )
    for _ in range(2):
        await call(client, port, scheme="https", path="/a/x")
    assert provider.connections == 1
    # another destination: its own sealed TLS context (anchor, pins), so its own connection
    await call(client, port, scheme="https", path="/b/x")
    assert provider.connections == 2
    assert len(provider.heads) == 3


async def test_a_failure_on_a_reused_connection_before_any_byte_goes_once_on_a_fresh_one(
    providers: Callable[..., Provider], monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiohttp 3.14 writes nothing between handing out a kept-alive connection and the
    request-headers trace, so nothing there fails on its own; the failure is injected at
    exactly that point (the kept-alive connection is lost as it is handed out), and the
    request, provably never written, is sent once on a fresh connection."""
    original = guard_module._GuardedConnector.connect
    calls: list[int] = []

    async def lost_on_reuse(self: Any, req: Any, traces: Any, timeout: Any) -> Any:
        conn = await original(self, req, traces, timeout)
        calls.append(1)
        if len(calls) == 2:  # the second request, on the kept-alive connection
            conn.close()
            raise aiohttp.ServerDisconnectedError()
        return conn

    monkeypatch.setattr(guard_module._GuardedConnector, "connect", lost_on_reuse)
    provider = providers()
    client = guarded(provider.port)
    await call(client, provider.port)
    assert await call(client, provider.port, "PUT") == b"ok"
    assert provider.connections == 2
    assert [h.split(" ")[0] for h in provider.heads] == ["POST", "PUT"]


async def test_a_lane_left_without_connections_is_dropped(
    providers: Callable[..., Provider], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(guard_module, "POOL_IDLE_SECONDS", 0.05)
    first = providers()
    second = _second_loopback(first.port, providers)
    dns = Dns(["127.0.0.1"])
    client = guarded(first.port, dns=dns)
    await call(client, first.port)
    deadline = time.monotonic() + DEADLINE_S
    while client._pool.open:
        assert time.monotonic() < deadline, "the idle connection was kept"
        await asyncio.sleep(0.01)
    dns.answer = ["127.0.0.2"]
    await call(client, first.port)
    assert [lane.key.ip for lane in client._pool._lanes.values()] == ["127.0.0.2"]
    assert len(second.heads) == 1
