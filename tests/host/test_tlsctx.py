"""The listener's TLS over real sockets: versions, client certificates, rotation, the door."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from agentsafe.executor.clock import ManualClock
from agentsafe.executor.dispatch.seam import Outcome
from agentsafe.executor.door.door import Door
from agentsafe.executor.door.principals_file import parse_principals
from agentsafe.executor.errors import ConfigError, RequestRejected
from agentsafe.executor.events import MemorySink
from agentsafe.executor.host.metrics import ExecutorMetrics
from agentsafe.executor.host.secrets import SecretHandle
from agentsafe.executor.host.tlsctx import (
    ReloadingTlsContext,
    TlsSettings,
    build_server_context,
    certificate_sha256,
    peer_certificate_der,
    peer_san_uris,
)
from agentsafe.executor.policy.policy import Verdict
from agentsafe.executor.principals import Role
from agentsafe.executor.routes.refusals import status_of
from agentsafe.executor.windows import DoorWindows
from tests.support.pki import Issued, TestCA

OPS_URI = "spiffe://bank.example/ns/ops/sa/oncall"
AUDIT_URI = "spiffe://bank.example/ns/ops/sa/audit"


class KeyBox:
    """Stands in for the secret store: hands out the current handle of EXECUTOR_TLS_KEY."""

    def __init__(self, pem: bytes) -> None:
        self.handle = SecretHandle("EXECUTOR_TLS_KEY", bytearray(pem))

    def set(self, pem: bytes) -> None:
        self.handle = SecretHandle("EXECUTOR_TLS_KEY", bytearray(pem))

    def __call__(self) -> SecretHandle:
        return self.handle


@dataclass
class Pki:
    ca: TestCA
    server: Issued
    cert_file: Path
    ca_file: Path
    keys: KeyBox


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    ca = TestCA()
    server = ca.issue_server()
    cert_file = tmp_path / "tls.crt"
    cert_file.write_bytes(server.cert_pem)
    return Pki(ca, server, cert_file, ca.write(tmp_path), KeyBox(server.key_pem))


def settings(pki: Pki, **kw: Any) -> TlsSettings:
    return TlsSettings(cert_file=pki.cert_file, key=pki.keys, client_ca_file=pki.ca_file, **kw)


def client_context(pki: Pki, client: Issued | None = None, tmp: Path | None = None,
                   *, max_version: ssl.TLSVersion | None = None,
                   ciphers: str | None = None) -> ssl.SSLContext:  # fmt: skip
    ctx = ssl.create_default_context(cafile=str(pki.ca_file))
    if client is not None:
        assert tmp is not None
        cert, key = client.write(tmp, f"client-{client.sha256[:8]}")
        ctx.load_cert_chain(str(cert), str(key))
    if max_version is not None:
        ctx.maximum_version = max_version
    if ciphers is not None:
        ctx.set_ciphers(ciphers)
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    return ctx


@contextlib.asynccontextmanager
async def serve(context: ssl.SSLContext, door: Door | None = None) -> AsyncIterator[int]:
    async def peer(request: web.Request) -> web.Response:
        der = peer_certificate_der(request.transport)
        body: dict[str, Any] = {
            "sans": list(peer_san_uris(der)) if der else None,
            "pin": certificate_sha256(der) if der else None,
        }
        if door is not None:
            try:
                principal = door.authenticate(
                    authorization_header=request.headers.get("Authorization"),
                    peer_cert_der=der,
                    route_role=Role.OPERATOR,
                    route_scope=request.query.get("scope"),
                    source=request.remote or "",
                )
                body["principal"] = principal.id
            except RequestRejected as exc:
                return web.json_response({"code": exc.code}, status=status_of(exc.code))
        return web.json_response(body)

    app = web.Application()
    app.router.add_get("/peer", peer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    server = site._server
    assert server is not None
    port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield port
    finally:
        await runner.cleanup()


@dataclass
class Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    @property
    def ssl_object(self) -> ssl.SSLObject:
        obj = self.writer.get_extra_info("ssl_object")
        assert obj is not None
        return obj  # type: ignore[no-any-return]

    async def get(self, path: str = "/peer", headers: str = "") -> tuple[int, dict[str, Any]]:
        self.writer.write(
            f"GET {path} HTTP/1.1\r\nHost: localhost\r\n{headers}\r\n".encode("ascii")
        )
        await self.writer.drain()
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionResetError("closed")
        status = int(status_line.split()[1])
        length = 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        return status, json.loads(await self.reader.readexactly(length))

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await self.writer.wait_closed()


async def connect(port: int, ctx: ssl.SSLContext) -> Connection:
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=ctx, server_hostname="localhost"
    )
    return Connection(reader, writer)


async def fetch(port: int, ctx: ssl.SSLContext, path: str = "/peer") -> tuple[int, dict[str, Any]]:
    conn = await connect(port, ctx)
    try:
        return await conn.get(path)
    finally:
        await conn.close()


async def test_defaults_tls13_http11_and_a_probe_without_certificate(pki: Pki) -> None:
    tls = ReloadingTlsContext(settings(pki))
    async with serve(tls.context) as port:
        conn = await connect(port, client_context(pki))
        try:
            assert conn.ssl_object.version() == "TLSv1.3"
            assert conn.ssl_object.selected_alpn_protocol() == "http/1.1"
            assert conn.ssl_object.compression() is None
            assert await conn.get() == (200, {"sans": None, "pin": None})
        finally:
            await conn.close()


async def test_client_certificate_is_extracted(pki: Pki, tmp_path: Path) -> None:
    client = pki.ca.issue_client(OPS_URI)
    tls = ReloadingTlsContext(settings(pki))
    async with serve(tls.context) as port:
        status, body = await fetch(port, client_context(pki, client, tmp_path))
    assert status == 200
    assert body == {"sans": [OPS_URI], "pin": client.sha256}


async def test_certificate_from_an_unknown_ca_fails_the_handshake(pki: Pki, tmp_path: Path) -> None:
    rogue = TestCA("rogue CA").issue_client(OPS_URI)
    tls = ReloadingTlsContext(settings(pki))
    async with serve(tls.context) as port:
        with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
            await fetch(port, client_context(pki, rogue, tmp_path))
        # and the listener still serves others
        assert (await fetch(port, client_context(pki)))[0] == 200


async def test_tls12_only_when_configured_and_only_ecdhe_aead(pki: Pki) -> None:
    tls12_client = client_context(pki, max_version=ssl.TLSVersion.TLSv1_2)
    async with serve(build_server_context(settings(pki))) as port:
        with pytest.raises((ssl.SSLError, ConnectionError)):
            await fetch(port, tls12_client)
    async with serve(build_server_context(settings(pki, min_version="1.2"))) as port:
        conn = await connect(port, tls12_client)
        try:
            assert conn.ssl_object.version() == "TLSv1.2"
            cipher = conn.ssl_object.cipher()
            assert cipher is not None
            assert cipher[0].startswith("ECDHE-")
            assert "GCM" in cipher[0] or "CHACHA" in cipher[0]
        finally:
            await conn.close()
        cbc = client_context(
            pki, max_version=ssl.TLSVersion.TLSv1_2, ciphers="ECDHE-ECDSA-AES128-SHA256"
        )
        with pytest.raises((ssl.SSLError, ConnectionError)):
            await fetch(port, cbc)


def test_server_context_options(pki: Pki) -> None:
    ctx = build_server_context(settings(pki))
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_3
    assert ctx.verify_mode == ssl.CERT_OPTIONAL
    assert ctx.options & ssl.OP_NO_COMPRESSION
    assert ctx.options & ssl.OP_NO_RENEGOTIATION
    no_ca = build_server_context(TlsSettings(cert_file=pki.cert_file, key=pki.keys))
    assert no_ca.verify_mode == ssl.CERT_NONE


def test_bad_material_is_a_refusal_naming_the_variable(pki: Pki, tmp_path: Path) -> None:
    other = pki.ca.issue_server()
    wrong_key = TlsSettings(cert_file=pki.cert_file, key=KeyBox(other.key_pem))
    with pytest.raises(ConfigError) as info:
        build_server_context(wrong_key)
    assert info.value.variable == "EXECUTOR_TLS_CERT_FILE"
    assert b"PRIVATE" not in str(info.value).encode()
    bad_ca = tmp_path / "bad-ca.crt"
    bad_ca.write_text("not a certificate")
    with pytest.raises(ConfigError) as info:
        build_server_context(TlsSettings(cert_file=pki.cert_file, key=pki.keys,
                                         client_ca_file=bad_ca))  # fmt: skip
    assert info.value.variable == "EXECUTOR_TLS_CLIENT_CA_FILE"


def test_fallback_key_file_is_removed(pki: Pki, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.delattr(os, "memfd_create")
    key_dir = tmp_path / "state"
    key_dir.mkdir(mode=0o700)
    ctx = build_server_context(settings(pki, key_dir=key_dir))
    assert ctx.verify_mode == ssl.CERT_OPTIONAL
    assert list(key_dir.iterdir()) == []


async def test_rotation_reaches_new_connections_and_spares_open_ones(pki: Pki) -> None:
    security = MemorySink()
    metrics = ExecutorMetrics(verdicts=Verdict, outcomes=Outcome)
    tls = ReloadingTlsContext(settings(pki), security=security, metrics=metrics)
    assert not tls.maybe_reload()
    async with serve(tls.context) as port:
        old = await connect(port, client_context(pki))
        try:
            assert old.ssl_object.getpeercert(binary_form=True) == pki.server.der
            rotated = pki.ca.issue_server()
            staged = pki.cert_file.with_suffix(".new")
            staged.write_bytes(rotated.cert_pem)
            os.replace(staged, pki.cert_file)
            pki.keys.set(rotated.key_pem)
            assert tls.maybe_reload()
            assert security.named("TLS_CONTEXT_ROTATED") == [{"file": "EXECUTOR_TLS_CERT_FILE"}]
            assert metrics.tls_rotations.value() == 1
            new = await connect(port, client_context(pki))
            try:
                assert new.ssl_object.getpeercert(binary_form=True) == rotated.der
                assert (await new.get())[0] == 200
            finally:
                await new.close()
            # a client that sends no SNI (an IP address) is moved onto the new context too
            no_sni = client_context(pki)
            no_sni.check_hostname = False
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=no_sni)
            bare = Connection(reader, writer)
            try:
                assert bare.ssl_object.getpeercert(binary_form=True) == rotated.der
            finally:
                await bare.close()
            # the connection opened before the rotation keeps its context and still works
            assert old.ssl_object.getpeercert(binary_form=True) == pki.server.der
            assert (await old.get())[0] == 200
        finally:
            await old.close()


async def test_a_broken_rotation_keeps_the_previous_context(pki: Pki) -> None:
    security = MemorySink()
    tls = ReloadingTlsContext(settings(pki), security=security)
    pki.cert_file.write_bytes(pki.ca.issue_server().cert_pem)  # key not rotated: mismatch
    assert not tls.maybe_reload()
    assert security.named("TLS_RELOAD_REFUSED") == [{"code": "TLS_MATERIAL_INVALID"}]
    async with serve(tls.context) as port:
        conn = await connect(port, client_context(pki))
        try:
            assert conn.ssl_object.getpeercert(binary_form=True) == pki.server.der
        finally:
            await conn.close()


async def test_door_over_real_mtls(pki: Pki, tmp_path: Path) -> None:
    ops = pki.ca.issue_client(OPS_URI)
    audit = pki.ca.issue_client(AUDIT_URI)
    impostor = pki.ca.issue_client(AUDIT_URI)
    wrong_san = pki.ca.issue_client("spiffe://bank.example/ns/ops/sa/intruder")
    doc = {
        "version": "agent-safe.principals/1",
        "principals": [
            {"id": "ops-oncall", "role": "OPERATOR", "scopes": ["status"],
             "credential": {"kind": "MTLS", "san_uri": OPS_URI}},
            {"id": "auditor", "role": "OPERATOR", "scopes": ["evidence"],
             "credential": {"kind": "MTLS", "san_uri": AUDIT_URI, "cert_sha256": audit.sha256}},
        ],
    }  # fmt: skip
    principals = parse_principals(
        json.dumps(doc), registered_actions=[], jwt_configured=False, client_ca_configured=True
    )
    clock = ManualClock()
    security = MemorySink()
    door = Door(principals, windows=DoorWindows(clock=clock), clock=clock, security=security)
    tls = ReloadingTlsContext(settings(pki))
    async with serve(tls.context, door) as port:

        async def ask(client: Issued | None, scope: str) -> tuple[int, dict[str, Any]]:
            return await fetch(port, client_context(pki, client, tmp_path), f"/peer?scope={scope}")

        status, body = await ask(ops, "status")
        assert (status, body["principal"]) == (200, "ops-oncall")
        assert (await ask(audit, "evidence"))[1]["principal"] == "auditor"
        assert await ask(impostor, "evidence") == (401, {"code": "AUTH_FAILED"})
        assert await ask(wrong_san, "status") == (401, {"code": "AUTH_FAILED"})
        assert await ask(None, "status") == (401, {"code": "AUTH_REQUIRED"})
        assert await ask(ops, "evidence") == (403, {"code": "SCOPE_FORBIDDEN"})
    assert [e["method"] for e in security.named("AUTH_FAILED")] == ["mtls", "mtls", "none", "mtls"]


async def test_a_client_ca_removed_from_the_bundle_stops_admitting_its_certificates(
    pki: Pki, tmp_path: Path
) -> None:
    """Only the certificate and key were fingerprinted: a CA taken out of
    EXECUTOR_TLS_CLIENT_CA_FILE kept admitting its certificates, even after secrets/reload
    (issue 16 item 8)."""
    partner = TestCA("partner CA")
    bundle = tmp_path / "clients-ca.pem"
    bundle.write_bytes(pki.ca.cert_pem + partner.cert_pem)
    security = MemorySink()
    tls = ReloadingTlsContext(
        TlsSettings(cert_file=pki.cert_file, key=pki.keys, client_ca_file=bundle),
        security=security,
    )
    ours, theirs = pki.ca.issue_client(OPS_URI), partner.issue_client(OPS_URI)
    async with serve(tls.context) as port:
        assert (await fetch(port, client_context(pki, theirs, tmp_path)))[0] == 200
        bundle.write_bytes(pki.ca.cert_pem)  # the partner CA is withdrawn
        assert tls.maybe_reload()
        assert security.named("TLS_CONTEXT_ROTATED")
        with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
            await fetch(port, client_context(pki, theirs, tmp_path))
        assert (await fetch(port, client_context(pki, ours, tmp_path)))[0] == 200
        assert not tls.maybe_reload()  # nothing changed since


async def test_a_rewrite_in_place_of_the_same_size_and_time_is_still_a_change(
    pki: Pki, tmp_path: Path
) -> None:
    """The bundle is taken by its bytes: same inode, length and modification time, other CA."""
    bundle = tmp_path / "clients-ca.pem"
    bundle.write_bytes(pki.ca.cert_pem)
    tls = ReloadingTlsContext(
        TlsSettings(cert_file=pki.cert_file, key=pki.keys, client_ca_file=bundle)
    )
    size = len(pki.ca.cert_pem)
    other = next(ca for ca in (TestCA("agentsafe test CA") for _ in range(20))
                 if len(ca.cert_pem) <= size)  # fmt: skip
    before = os.stat(bundle)
    with open(bundle, "r+b") as handle:
        handle.write(other.cert_pem.ljust(size, b"\n"))  # PEM allows the trailing blank lines
    os.utime(bundle, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(bundle)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        before.st_ino,
        before.st_size,
        before.st_mtime_ns,
    )
    assert tls.maybe_reload()
    async with serve(tls.context) as port:
        with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
            await fetch(port, client_context(pki, pki.ca.issue_client(OPS_URI), tmp_path))
        assert (await fetch(port, client_context(pki, other.issue_client(OPS_URI), tmp_path)))[
            0
        ] == 200
