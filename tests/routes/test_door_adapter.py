"""The HTTP door: its remembered source keys are door.source_key's, for every address text, and
it reads the peer certificate of a TLS connection only (a plain connection is not asked)."""

from __future__ import annotations

import ipaddress
import ssl
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from agentsafe.executor.door.door import source_key
from agentsafe.executor.host.tlsctx import peer_certificate_der
from agentsafe.executor.principals import Actor, Principal, Role, legacy_principal
from agentsafe.executor.routes import door as door_module
from agentsafe.executor.routes.door import HttpDoor, remembered_source_key
from tests.support.pki import TestCA

_ADDRESSES = (
    st.ip_addresses().map(str)
    | st.ip_addresses(v=6).map(lambda ip: f"{ip}%eth0")
    | st.integers(0, 2**32 - 1).map(lambda n: f"::ffff:{ipaddress.IPv4Address(n)}")
    | st.text(max_size=20)
    | st.none()
)


@given(st.lists(_ADDRESSES, max_size=20))
def test_a_remembered_key_is_the_key(addresses: list[str | None]) -> None:
    for address in addresses + addresses:  # each a second time: answered from memory
        assert remembered_source_key(address) == source_key(address)


TENANT = "00000000-0000-4000-8000-000000000001"


class _RecordingDoor:
    """Stands in for the door: records the peer certificate it was handed, lets everyone in."""

    def __init__(self) -> None:
        self.peer_certs: list[bytes | None] = []

    def authenticate(self, *, peer_cert_der: bytes | None, **_: object) -> Principal:
        self.peer_certs.append(peer_cert_der)
        return legacy_principal(tenant_id=TENANT, actor=Actor(id="ops", type="HUMAN"))


async def _serve(door: HttpDoor, context: ssl.SSLContext | None) -> tuple[web.AppRunner, int]:
    async def handler(request: web.Request) -> web.Response:
        await door.authenticate(request, role=Role.OPERATOR, scope=None)
        return web.Response(text="in")

    app = web.Application()
    app.router.add_get("/", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    return runner, runner.addresses[0][1]


async def test_the_peer_certificate_is_read_on_tls_and_not_looked_up_on_plain_http(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca = TestCA()
    client = ca.issue_client("spiffe://bank.example/ns/ops/sa/oncall")
    server_cert, server_key = ca.issue_server().write(tmp_path, "server")
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(server_cert, server_key)
    server_context.load_verify_locations(cafile=str(ca.write(tmp_path)))
    server_context.verify_mode = ssl.CERT_OPTIONAL
    client_context = ssl.create_default_context(cafile=str(ca.write(tmp_path)))
    client_context.load_cert_chain(*client.write(tmp_path, "client"))

    looked_up: list[object] = []

    def recording_lookup(transport: object) -> bytes | None:
        looked_up.append(transport)
        return peer_certificate_der(transport)

    monkeypatch.setattr(door_module, "peer_certificate_der", recording_lookup)
    stand_in = _RecordingDoor()
    door = HttpDoor(stand_in)  # type: ignore[arg-type]
    tls_runner, tls_port = await _serve(door, server_context)
    plain_runner, plain_port = await _serve(door, None)
    try:
        async with aiohttp.ClientSession() as session:
            url = f"https://localhost:{tls_port}/"
            async with session.get(url, ssl=client_context) as response:
                assert await response.text() == "in"
            assert (stand_in.peer_certs, len(looked_up)) == ([client.der], 1)
            async with session.get(f"http://127.0.0.1:{plain_port}/") as response:
                assert await response.text() == "in"
            assert (stand_in.peer_certs, len(looked_up)) == ([client.der, None], 1)
    finally:
        await tls_runner.cleanup()
        await plain_runner.cleanup()
