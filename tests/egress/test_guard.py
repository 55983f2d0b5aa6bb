"""The egress guard against real loopback servers: TLS anchors, names, pins, bodies, timeouts."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from agentsafe.executor.egress.guard import Destination, GuardedClient, spki_pin
from agentsafe.executor.egress.transport import TransportError
from agentsafe.executor.errors import ConfigError
from agentsafe.executor.events import MemorySink, Streams
from tests.support.pki import TestCA


@dataclass
class StandInDns:
    """Test stand-in for DNS: fixed answers per name, counting lookups."""

    answers: dict[str, list[str]]
    lookups: list[str] = field(default_factory=list)

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        self.lookups.append(host)
        return self.answers.get(host, [])


@dataclass
class Server:
    port: int
    hits: list[str]


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Awaitable[Server]]]:
    runners: list[web.AppRunner] = []

    async def start(
        routes: dict[str, Handler], *, ssl_context: ssl.SSLContext | None = None
    ) -> Server:
        hits: list[str] = []
        app = web.Application()
        for path, handler in routes.items():

            async def wrapped(request: web.Request, _h: Handler = handler) -> web.StreamResponse:
                hits.append(request.path)
                return await _h(request)

            app.router.add_route("*", path, wrapped)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
        await site.start()
        runners.append(runner)
        return Server(port=runner.addresses[0][1], hits=hits)

    yield start
    for runner in runners:
        await runner.cleanup()


async def ok(request: web.Request) -> web.Response:
    return web.Response(body=b"ok:" + request.host.encode(), headers={"X-Test": "1"})


def server_tls(ca: TestCA, tmp_path: Path, name: str = "provider.test") -> ssl.SSLContext:
    issued = ca.issue_server(dns_names=(name,), ips=(), common_name=name)
    cert, key = issued.write(tmp_path, name)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


def client(
    destinations: list[Destination], **kw: Any
) -> tuple[GuardedClient, MemorySink, list[str]]:
    streams = Streams.memory()
    counted: list[str] = []
    kw.setdefault("resolve", StandInDns({"provider.test": ["127.0.0.1"]}))
    guard = GuardedClient(destinations, streams, on_refusal=counted.append, **kw)
    assert isinstance(streams.security, MemorySink)
    return guard, streams.security, counted


async def test_tls_with_the_destination_anchor(serve: Any, tmp_path: Path) -> None:
    ca = TestCA()
    server = await serve({"/api/x": ok}, ssl_context=server_tls(ca, tmp_path))
    guard, sink, _ = client(
        [
            Destination(
                f"https://provider.test:{server.port}/api/",
                ca_file=str(ca.write(tmp_path)),
                allow_insecure_loopback=True,
            )
        ]
    )
    response = await guard.request(
        "GET",
        f"https://provider.test:{server.port}/api/x",
        headers={"Accept": "text/plain"},
        body=None,
        timeout=10,
    )
    assert response.status == 200
    assert response.body == f"ok:provider.test:{server.port}".encode()  # Host is the name
    assert response.headers["x-test"] == "1"
    assert sink.events == []


@pytest.mark.parametrize("case", ["wrong-ca", "wrong-hostname", "platform-store"])
async def test_tls_rejected(serve: Any, tmp_path: Path, case: str) -> None:
    ca, other = TestCA(), TestCA("another CA")
    name = "other.test" if case == "wrong-hostname" else "provider.test"
    server = await serve({"/api/x": ok}, ssl_context=server_tls(ca, tmp_path, name))
    anchor = {
        "wrong-ca": str(other.write(tmp_path, "other")),
        "wrong-hostname": str(ca.write(tmp_path)),
        "platform-store": None,
    }[case]
    guard, sink, counted = client(
        [
            Destination(
                f"https://provider.test:{server.port}/",
                ca_file=anchor,
                allow_insecure_loopback=True,
            )
        ]
    )
    with pytest.raises(TransportError) as info:
        await guard.request(
            "GET", f"https://provider.test:{server.port}/api/x", headers={}, body=None, timeout=10
        )
    assert (info.value.code, info.value.sent) == ("EGRESS_TLS_REJECTED", False)
    assert server.hits == []
    assert counted == ["EGRESS_TLS_REJECTED"]
    assert sink.named("EGRESS_REFUSED") == [
        {"origin": f"https://provider.test:{server.port}", "code": "EGRESS_TLS_REJECTED"}
    ]


@pytest.mark.parametrize("which", ["leaf", "ca"])
async def test_pin_in_the_chain_matches(serve: Any, tmp_path: Path, which: str) -> None:
    ca = TestCA()
    issued = ca.issue_server(dns_names=("provider.test",), ips=(), common_name="provider.test")
    cert, key = issued.write(tmp_path, "leaf")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server = await serve({"/x": ok}, ssl_context=context)
    from cryptography.hazmat.primitives.serialization import Encoding

    pin = spki_pin(issued.der if which == "leaf" else ca.cert.public_bytes(Encoding.DER))
    unrelated = spki_pin(TestCA().cert.public_bytes(Encoding.DER))
    guard, _, _ = client(
        [
            Destination(
                f"https://provider.test:{server.port}/",
                ca_file=str(ca.write(tmp_path)),
                spki_pins=(unrelated, pin),
                allow_insecure_loopback=True,
            )
        ]
    )
    response = await guard.request(
        "GET", f"https://provider.test:{server.port}/x", headers={}, body=None, timeout=10
    )
    assert response.status == 200


async def test_pin_mismatch_refused_before_the_request(serve: Any, tmp_path: Path) -> None:
    ca = TestCA()
    server = await serve({"/x": ok}, ssl_context=server_tls(ca, tmp_path))
    from cryptography.hazmat.primitives.serialization import Encoding

    pins = tuple(spki_pin(TestCA().cert.public_bytes(Encoding.DER)) for _ in range(2))
    guard, _sink, counted = client(
        [
            Destination(
                f"https://provider.test:{server.port}/",
                ca_file=str(ca.write(tmp_path)),
                spki_pins=pins,
                allow_insecure_loopback=True,
            )
        ]
    )
    with pytest.raises(TransportError) as info:
        await guard.request(
            "POST", f"https://provider.test:{server.port}/x", headers={}, body=b"{}", timeout=10
        )
    assert (info.value.code, info.value.sent) == ("EGRESS_TLS_PIN_MISMATCH", False)
    assert server.hits == []
    assert counted == ["EGRESS_TLS_PIN_MISMATCH"]


def test_bad_configuration_refused(tmp_path: Path) -> None:
    streams = Streams.memory()
    for destination in [
        Destination("http://provider.test/"),  # plain http without the allowance
        Destination("ftp://provider.test/"),
        Destination("https://u:p@provider.test/"),
        Destination("https://provider.test/a/../b"),
        Destination("https://provider.test/?q=1"),
        Destination("https://0x7f.1/"),
        Destination("https://provider.test/", spki_pins=("sha1/abc",)),
        Destination("https://provider.test/", ca_file=str(tmp_path / "absent.pem")),
    ]:
        with pytest.raises(ConfigError):
            GuardedClient([destination], streams)
    with pytest.raises(ConfigError):
        GuardedClient([], streams, max_response_bytes=100)


async def loopback_client(server: Server, **kw: Any) -> tuple[GuardedClient, MemorySink, list[str]]:
    return client(
        [Destination(f"http://127.0.0.1:{server.port}/api/", allow_insecure_loopback=True)], **kw
    )


async def test_plain_http_to_allowed_loopback_and_body_limits(serve: Any) -> None:
    async def big(request: web.Request) -> web.Response:
        return web.Response(body=b"x" * 5000)

    async def chunked(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        for _ in range(10):
            await response.write(b"y" * 1000)
        await response.write_eof()
        return response

    server = await serve({"/api/big": big, "/api/chunked": chunked, "/api/ok": ok})
    guard, _sink, counted = await loopback_client(server, max_response_bytes=4096)
    base = f"http://127.0.0.1:{server.port}/api"
    assert (
        await guard.request("GET", f"{base}/ok", headers={}, body=None, timeout=10)
    ).status == 200
    for path in ("big", "chunked"):
        with pytest.raises(TransportError) as info:
            await guard.request("GET", f"{base}/{path}", headers={}, body=None, timeout=10)
        assert (info.value.code, info.value.sent) == ("EGRESS_BODY_TOO_LARGE", True)
    assert counted == ["EGRESS_BODY_TOO_LARGE"] * 2


async def test_slow_body_times_out_after_sending(serve: Any) -> None:
    release = asyncio.Event()

    async def slow(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(b"partial")
        await release.wait()
        return response

    server = await serve({"/api/slow": slow})
    guard, _sink, counted = await loopback_client(server)
    with pytest.raises(TransportError) as info:
        await guard.request(
            "GET", f"http://127.0.0.1:{server.port}/api/slow", headers={}, body=None, timeout=0.5
        )
    release.set()
    assert (info.value.code, info.value.sent) == ("EGRESS_TIMEOUT", True)
    assert counted == ["EGRESS_TIMEOUT"]


async def test_redirects_refused_and_reported(serve: Any) -> None:
    async def away(request: web.Request) -> web.Response:
        raise web.HTTPFound("https://elsewhere.example/steal")

    async def within(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect("/api/ok")

    server = await serve({"/api/away": away, "/api/within": within, "/api/ok": ok})
    guard, sink, _ = await loopback_client(server)
    for path, leaves in (("away", True), ("within", False)):
        with pytest.raises(TransportError) as info:
            await guard.request(
                "GET",
                f"http://127.0.0.1:{server.port}/api/{path}",
                headers={},
                body=None,
                timeout=10,
            )
        assert (info.value.code, info.value.sent) == ("EGRESS_REDIRECT_REFUSED", True)
        assert sink.named("EGRESS_REFUSED")[-1]["leaves_origin"] is leaves
    assert server.hits == ["/api/away", "/api/within"]  # never followed


async def test_malformed_response_is_invalid() -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"NOT-HTTP garbage\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(garbage, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        guard, _, _counted = client(
            [Destination(f"http://127.0.0.1:{port}/", allow_insecure_loopback=True)]
        )
        with pytest.raises(TransportError) as info:
            await guard.request(
                "GET", f"http://127.0.0.1:{port}/", headers={}, body=None, timeout=10
            )
        assert (info.value.code, info.value.sent) == ("EGRESS_RESPONSE_INVALID", True)
    finally:
        server.close()
        await server.wait_closed()


async def test_connection_refused_is_not_sent() -> None:
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    guard, _, counted = client(
        [Destination(f"http://127.0.0.1:{port}/", allow_insecure_loopback=True)]
    )
    with pytest.raises(TransportError) as info:
        await guard.request("GET", f"http://127.0.0.1:{port}/", headers={}, body=None, timeout=10)
    assert (info.value.code, info.value.sent) == ("TRANSPORT_CONNECT_FAILED", False)
    assert counted == []
