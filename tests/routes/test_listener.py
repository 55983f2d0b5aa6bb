"""The listener's pieces in process: the connection gate, aiohttp's own errors, the deadlines.

The same attacks against a real ``agentsafe serve`` are in
``tests/integration/test_hardening_process.py``; these pin each piece on its own, on a real
loopback socket with the executor's application builder.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from pydantic import BaseModel, ConfigDict

from agentsafe.executor.events import MemorySink
from agentsafe.executor.principals import Principal, Role, Scope
from agentsafe.executor.routes.app import Call, Route, build_app
from agentsafe.executor.routes.listener import (
    REFUSAL_SUMMARY_SECONDS,
    ConnectionGate,
    GuardedSite,
    ListenerLimits,
    handler_settings,
)
from tests.support.pki import TestCA

SECURITY = {
    "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}


class _Peer:
    def __init__(self, host: str) -> None:
        self.host = host

    def get_extra_info(self, name: str) -> Any:
        return (self.host, 40000) if name == "peername" else None


def test_the_gate_counts_in_all_and_by_source() -> None:
    gate = ConnectionGate(ListenerLimits(max_connections=3, max_connections_per_source=2))
    a1, a2, a3, b1, c1 = (_Peer(h) for h in ("10.0.0.1", "10.0.0.1", "10.0.0.1", "::1", "x"))
    assert gate.admit(a1) == "10.0.0.1"  # type: ignore[arg-type]
    assert gate.admit(a2) == "10.0.0.1"  # type: ignore[arg-type]
    assert gate.admit(a3) is None  # type: ignore[arg-type]  # the source's cap
    assert gate.admit(b1) == "::1"  # type: ignore[arg-type]
    assert gate.admit(c1) is None  # type: ignore[arg-type]  # the total cap
    assert (gate.open, gate.refused) == (3, 2)
    gate.release("10.0.0.1")
    assert gate.admit(c1) == "x"  # type: ignore[arg-type]
    assert gate.open == 3


def test_refusals_are_summarised_not_written_one_line_each() -> None:
    now = [100.0]
    sink = MemorySink()
    gate = ConnectionGate(
        ListenerLimits(max_connections=1, max_connections_per_source=1),
        security=sink,
        monotonic=lambda: now[0],
    )
    assert gate.admit(_Peer("a")) == "a"  # type: ignore[arg-type]
    for _ in range(50):
        assert gate.admit(_Peer("b")) is None  # type: ignore[arg-type]
    now[0] += REFUSAL_SUMMARY_SECONDS
    for _ in range(7):
        assert gate.admit(_Peer("b")) is None  # type: ignore[arg-type]
    assert sink.named("CONNECTIONS_REFUSED") == [
        {"refused": 1, "open": 1},  # the first refusal is said at once
        {"refused": 50, "open": 1},  # then what came since, once per interval
    ]


def test_the_handler_settings_make_the_keepalive_timer_the_head_deadline() -> None:
    settings = handler_settings(ListenerLimits(header_timeout=7, body_timeout=3))
    assert settings == {"access_log": None, "keepalive_timeout": 7, "lingering_time": 3}


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    reason: str


class _OpenDoor:
    async def authenticate(
        self, request: web.Request, *, role: Role, scope: Scope | None
    ) -> Principal:
        raise AssertionError("no route here needs the door")


@contextlib.asynccontextmanager
async def listening(limits: ListenerLimits) -> AsyncIterator[int]:
    async def echo(call: Call) -> web.StreamResponse:
        return web.json_response({"reason": call.body.reason})

    async def health(call: Call) -> web.StreamResponse:
        return web.json_response({"status": "ok"})

    routes = [
        Route("GET", "/health", None, None, None, health),
        Route("POST", "/echo", None, None, _Body, echo),
    ]
    app = build_app(routes, door=_OpenDoor(), body_timeout=limits.body_timeout)
    runner = web.AppRunner(app, handle_signals=False, **handler_settings(limits))
    await runner.setup()
    site = GuardedSite(runner, "127.0.0.1", 0, limits=limits)
    await site.start()
    try:
        yield site.port
    finally:
        await runner.cleanup()


_ECHOED = json.dumps({"reason": "ok"}).encode()
# a whole request in one write: its body arrives with its head
WHOLE_ECHO = (
    b"POST /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    b"Content-Type: application/json\r\nContent-Length: "
    + str(len(_ECHOED)).encode()
    + b"\r\n\r\n"
    + _ECHOED
)
# a head that promises 100 bytes of body and sends one
PARTIAL_ECHO = (
    b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: 100\r\n\r\n{"
)


async def raw(port: int, data: bytes) -> tuple[int, dict[str, str], Any]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(30):
            answer = await reader.read(-1)
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, json.loads(body) if body else None


async def test_a_request_aiohttp_cannot_parse_is_answered_in_the_contract() -> None:
    async with listening(ListenerLimits()) as port:
        status, headers, body = await raw(port, b"GE<T /token-abc123 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 400
    assert headers["Content-Type"].startswith("application/json")
    assert headers["Server"] == "agentsafe"
    assert {k: headers[k] for k in SECURITY} == SECURITY
    assert body["error"]["code"] == "HTTP_MALFORMED"
    assert "token-abc123" not in json.dumps(body)


async def test_a_body_that_does_not_arrive_in_time_is_408_and_the_connection_closes() -> None:
    async with listening(ListenerLimits(body_timeout=0.5)) as port:
        status, headers, body = await raw(port, PARTIAL_ECHO)  # read(-1): returns once closed
        assert (status, body["error"]["code"]) == (408, "REQUEST_TIMEOUT")
        assert headers["Connection"] == "close"
        # a whole body in time is served
        status, _, body = await raw(port, WHOLE_ECHO)
        assert (status, body) == (200, {"reason": "ok"})


async def test_a_body_that_arrived_whole_is_read_without_arming_the_body_timer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()
    armed: list[float] = []
    call_at = loop.call_at

    def counting(when: float, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        if abs(when - loop.time() - 123.0) < 5:  # the body timer, not the client's own
            armed.append(when)
        return call_at(when, *args, **kwargs)

    monkeypatch.setattr(loop, "call_at", counting)
    async with listening(ListenerLimits(body_timeout=123.0)) as port:
        status, _, body = await raw(port, WHOLE_ECHO)
        assert (status, body) == (200, {"reason": "ok"})
        assert armed == []
        # a body still on its way arms it (and the 408 test shows it fires)
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(PARTIAL_ECHO)
        await writer.drain()
        deadline = loop.time() + 10
        while not armed and loop.time() < deadline:
            await asyncio.sleep(0.01)
        writer.close()
        assert len(armed) == 1


async def test_a_broken_chunked_body_is_400_not_500() -> None:
    async with listening(ListenerLimits()) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(
                b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )
            await writer.drain()
            writer.write(b"zz\r\nabc\r\n0\r\n\r\n")
            await writer.drain()
            async with asyncio.timeout(30):
                answer = await reader.read(-1)
        finally:
            writer.close()
    status = int(answer.split(b" ", 2)[1])
    assert status == 400, answer
    assert b'"code": "REQUEST_MALFORMED"' in answer or b'"code": "HTTP_MALFORMED"' in answer


@pytest.mark.parametrize("cap", [1, 2])
async def test_one_connection_more_than_the_cap_is_503_and_closed(cap: int) -> None:
    limits = ListenerLimits(header_timeout=30, max_connections=cap, max_connections_per_source=cap)
    async with listening(limits) as port:
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(cap)]
        try:
            status, headers, body = await raw(port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        finally:
            for _, writer in held:
                writer.close()
    assert (status, body["error"]["code"]) == (503, "CONNECTION_LIMIT_REACHED")
    assert headers["Retry-After"] == "1"
    assert {k: headers[k] for k in SECURITY} == SECURITY


@pytest.mark.parametrize("tls", [False, True])
async def test_what_a_refused_connection_sends_is_dropped_and_it_still_gets_its_answer(
    tls: bool, tmp_path: Path
) -> None:
    """The refused connection is handed to a protocol that drops its data (the handler of an
    admitted one no longer checks each chunk): its requests reach no route, on TLS too."""
    served: list[str] = []

    async def health(call: Call) -> web.StreamResponse:
        served.append(call.request.path)
        return web.json_response({"status": "ok"})

    server_context = client_context = None
    if tls:
        ca = TestCA()
        cert, key = ca.issue_server().write(tmp_path, "server")
        server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_context.load_cert_chain(cert, key)
        client_context = ssl.create_default_context(cafile=str(ca.write(tmp_path)))
    limits = ListenerLimits(header_timeout=1, max_connections=1, max_connections_per_source=1)
    app = build_app([Route("GET", "/health", None, None, None, health)], door=_OpenDoor())
    runner = web.AppRunner(app, handle_signals=False, **handler_settings(limits))
    await runner.setup()
    site = GuardedSite(runner, "127.0.0.1", 0, limits=limits, ssl_context=server_context)
    await site.start()
    host = "localhost" if tls else None
    try:
        kept, held = await asyncio.open_connection(
            "127.0.0.1", site.port, ssl=client_context, server_hostname=host
        )
        held.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")  # answered: it was admitted
        async with asyncio.timeout(30):
            assert (await kept.readline()).startswith(b"HTTP/1.1 200")
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", site.port, ssl=client_context, server_hostname=host
        )
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" * 3)
        await writer.drain()
        async with asyncio.timeout(30):
            answer = await reader.read(-1)  # the answer, then closed (half-closed, or lingered)
        assert answer.startswith(b"HTTP/1.1 503")
        assert b"CONNECTION_LIMIT_REACHED" in answer
        assert served == ["/health"]  # the admitted connection's request only
        assert site.gate.refused == 1
        writer.close()
        held.close()
    finally:
        await runner.cleanup()
