"""The executor's TLS listener over real sockets, as ``serve`` wires it.

``EXECUTOR_TLS_CERT_FILE`` and ``EXECUTOR_TLS_KEY_FILE`` (inside ``EXECUTOR_SECRETS_DIR``) with
``EXECUTOR_ALLOW_PLAINTEXT_LISTENER`` unset: the negotiated version and ALPN protocol, client
certificates with ``EXECUTOR_TLS_CLIENT_CA_FILE`` (probes without one, principals by SAN URI,
unknown CAs, wrong SANs, pins), and rotation of the certificate reaching new connections while
open ones keep theirs. Certificates are made by ``tests.support.pki`` with ``cryptography``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from agentsafe.executor.tools.harness import wait_until
from tests.support.pki import TestCA

from .estate import (
    AUDIT_URI,
    ONCALL_URI,
    Cast,
    Estate,
    Starter,
    assert_door_refusal,
    estates,
)


@pytest.fixture
async def start(tmp_path: Path) -> AsyncIterator[Starter]:
    async with estates(tmp_path) as starter:
        yield starter


class Connection:
    """One raw TLS connection to the listener, speaking HTTP/1.1 by hand."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.ssl: ssl.SSLObject = writer.get_extra_info("ssl_object")

    @classmethod
    async def open(cls, estate: Estate, ctx: ssl.SSLContext) -> Connection:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", estate.port, ssl=ctx, server_hostname="127.0.0.1"
        )
        return cls(reader, writer)

    @property
    def peer_der(self) -> bytes:
        der = self.ssl.getpeercert(binary_form=True)
        assert der is not None
        return der

    async def get(self, path: str) -> tuple[int, bytes]:
        self.writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        await self.writer.drain()
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        length = next(
            int(line.split(":", 1)[1])
            for line in lines
            if line.lower().startswith("content-length:")
        )
        return status, await self.reader.readexactly(length)

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await self.writer.wait_closed()


def client_context(
    estate: Estate, *, max_version: ssl.TLSVersion | None = None, ciphers: str | None = None
) -> ssl.SSLContext:
    assert estate.tls is not None
    ctx = ssl.create_default_context(cafile=str(estate.tls.ca_file))
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    if max_version is not None:
        ctx.maximum_version = max_version
    if ciphers is not None:
        ctx.set_ciphers(ciphers)
    return ctx


@contextlib.asynccontextmanager
async def connected(estate: Estate, ctx: ssl.SSLContext) -> AsyncIterator[Connection]:
    connection = await Connection.open(estate, ctx)
    try:
        yield connection
    finally:
        await connection.close()


# ----------------------------------------------------------------------------- versions, ALPN


async def test_tls_13_and_http_11_by_default(start: Starter) -> None:
    estate = await start()
    assert "EXECUTOR_ALLOW_PLAINTEXT_LISTENER" not in estate.environ
    [listening] = estate.security.named("LISTENING")
    assert listening["tls"] is True
    async with connected(estate, client_context(estate)) as connection:
        assert connection.ssl.version() == "TLSv1.3"
        assert connection.ssl.selected_alpn_protocol() == "http/1.1"
        assert connection.peer_der == estate.tls.server.der  # type: ignore[union-attr]
        status, body = await connection.get("/health")
    assert status == 200
    assert b'"ok"' in body


async def test_tls_12_is_refused_by_default(start: Starter) -> None:
    estate = await start()
    with pytest.raises((ssl.SSLError, ConnectionError)):
        await Connection.open(estate, client_context(estate, max_version=ssl.TLSVersion.TLSv1_2))
    # The listener is still there for a client that speaks 1.3.
    assert (await estate.client.get("/health")).status == 200


async def test_tls_12_with_ecdhe_and_aead_when_configured(start: Starter) -> None:
    estate = await start(extra={"EXECUTOR_TLS_MIN_VERSION": "1.2"})
    ctx = client_context(estate, max_version=ssl.TLSVersion.TLSv1_2)
    async with connected(estate, ctx) as connection:
        assert connection.ssl.version() == "TLSv1.2"
        cipher = connection.ssl.cipher()
        assert cipher is not None
        assert cipher[0].startswith("ECDHE-")
        assert "GCM" in cipher[0] or "CHACHA20" in cipher[0]
        assert connection.ssl.selected_alpn_protocol() == "http/1.1"
        status, _ = await connection.get("/health")
        assert status == 200
    # A client offering only a CBC suite finds nothing in common.
    cbc = client_context(
        estate, max_version=ssl.TLSVersion.TLSv1_2, ciphers="ECDHE-ECDSA-AES128-SHA256"
    )
    with pytest.raises((ssl.SSLError, ConnectionError)):
        await Connection.open(estate, cbc)
    # 1.3 is still the first choice.
    async with connected(estate, client_context(estate)) as connection:
        assert connection.ssl.version() == "TLSv1.3"


# ----------------------------------------------------------------------------- client certificates


async def test_a_probe_without_a_client_certificate_reaches_health_and_ready(
    start: Starter,
) -> None:
    estate = await start()
    assert "EXECUTOR_TLS_CLIENT_CA_FILE" in estate.environ
    assert (await estate.client.get("/health")).status == 200
    assert (await estate.client.get("/ready")).status == 200
    mark = estate.mark()
    reply = await estate.client.get("/v1/control/status")
    assert_door_refusal(estate, mark, reply, status=401, code="AUTH_REQUIRED", method="none")


async def test_an_mtls_operator_is_named_by_its_san_uri(start: Starter) -> None:
    estate = await start()
    assert estate.tls is not None
    oncall = estate.tls.ca.issue_client(ONCALL_URI)
    reply = await estate.client.post("/v1/control/halt", {"reason": "card testing"}, cert=oncall)
    assert reply.status == 200, reply.text
    assert reply.body["causes"][0]["by"] == "oncall"
    reply = await estate.client.post("/v1/control/resume", {"reason": "contained"}, cert=oncall)
    assert reply.status == 200, reply.text
    assert estate.security.named("OPERATOR_ACTION") == [
        {"principal": "oncall", "action": "halt"},
        {"principal": "oncall", "action": "resume"},
    ]
    assert estate.auth_failures() == []


async def test_a_certificate_from_an_unknown_ca_is_refused_in_the_handshake(
    start: Starter, tmp_path: Path
) -> None:
    estate = await start()
    stranger = TestCA("someone else's CA").issue_client(ONCALL_URI)
    with pytest.raises(aiohttp.ClientError):
        await estate.client.get("/v1/control/status", cert=stranger)
    # Nothing reached a route: no door decision, no operator action.
    assert estate.auth_failures() == []
    assert estate.security.named("OPERATOR_ACTION") == []
    assert (await estate.client.get("/health")).status == 200


@pytest.mark.parametrize(
    "sans",
    [("spiffe://bank.example/ns/ops/sa/stranger",), ()],
    ids=["unknown-san", "no-san-uri"],
)
async def test_a_trusted_certificate_naming_no_principal_is_refused(
    start: Starter, sans: tuple[str, ...]
) -> None:
    estate = await start()
    assert estate.tls is not None
    cert = estate.tls.ca.issue_client(*sans)
    mark = estate.mark()
    reply = await estate.client.get("/v1/control/status", cert=cert)
    assert_door_refusal(
        estate, mark, reply, status=401, code="AUTH_FAILED", method="mtls",
        secrets=[*sans, "stranger", cert.sha256],
    )  # fmt: skip


async def test_a_pinned_certificate_must_be_the_pinned_one(start: Starter) -> None:
    ca = TestCA("pinning CA")
    pinned = ca.issue_client(AUDIT_URI)
    impostor = ca.issue_client(AUDIT_URI)
    estate = await start(
        ca=ca,
        cast=Cast(pinned_cert_sha256=pinned.sha256),
        extra={"EXECUTOR_AUTH_LOCKOUT": "2/60/300"},
    )
    reply = await estate.client.get("/v1/control/status", cert=pinned)
    assert reply.status == 200, reply.text
    for _ in range(2):
        mark = estate.mark()
        reply = await estate.client.get("/v1/control/status", cert=impostor)
        assert_door_refusal(
            estate, mark, reply, status=401, code="AUTH_FAILED", method="mtls",
            secrets=[pinned.sha256, impostor.sha256, AUDIT_URI],
        )  # fmt: skip
    # A pin mismatch is a failure of a known principal: it counts towards the lock.
    assert estate.security.named("PRINCIPAL_LOCKED") == [
        {"principal": "auditor", "lock_seconds": 300}
    ]
    mark = estate.mark()
    reply = await estate.client.get("/v1/control/status", cert=pinned)
    assert_door_refusal(estate, mark, reply, status=423, code="PRINCIPAL_LOCKED", method="mtls")


# ----------------------------------------------------------------------------- rotation


async def test_a_rotated_certificate_reaches_new_connections_after_reload(
    start: Starter,
) -> None:
    estate = await start()
    tls = estate.tls
    assert tls is not None
    old = tls.server
    async with connected(estate, client_context(estate)) as before:
        assert before.peer_der == old.der
        fresh = tls.ca.issue_server()
        tls.install(fresh)
        reply = await estate.client.post("/v1/control/secrets/reload", token=estate.cast.ops.token)
        assert reply.status == 200, reply.text
        assert reply.body["tls"] == {"file": str(tls.cert_file), "rotated": True}
        assert "EXECUTOR_TLS_KEY" in reply.body["secrets"]["rotated"]
        assert reply.body["secrets"]["files"]["EXECUTOR_TLS_KEY"] == str(tls.key_file)
        for pem in (fresh.key_pem, old.key_pem):
            assert pem.decode().splitlines()[1] not in reply.text
        assert "PRIVATE KEY" not in reply.text
        async with connected(estate, client_context(estate)) as after:
            assert after.peer_der == fresh.der
            status, _ = await after.get("/health")
            assert status == 200
        # The connection opened before the rotation keeps what it negotiated, and still works.
        assert before.peer_der == old.der
        status, _ = await before.get("/health")
        assert status == 200
    assert estate.security.named("TLS_CONTEXT_ROTATED") == [{"file": "EXECUTOR_TLS_CERT_FILE"}]


async def test_a_broken_rotation_keeps_the_current_certificate(start: Starter) -> None:
    estate = await start()
    tls = estate.tls
    assert tls is not None
    # A certificate whose key is not the installed key: the pair does not load.
    tls.cert_file.write_bytes(tls.ca.issue_server().cert_pem)
    reply = await estate.client.post("/v1/control/secrets/reload", token=estate.cast.ops.token)
    assert reply.status == 200, reply.text
    assert reply.body["tls"]["rotated"] is False
    assert estate.security.named("TLS_RELOAD_REFUSED") == [{"code": "TLS_MATERIAL_INVALID"}]
    async with connected(estate, client_context(estate)) as connection:
        assert connection.peer_der == tls.server.der


@pytest.mark.slow
async def test_a_rotated_certificate_is_picked_up_without_a_reload(start: Starter) -> None:
    estate = await start(background=True)
    tls = estate.tls
    assert tls is not None
    fresh = tls.ca.issue_server()
    tls.install(fresh)

    async def serving_fresh() -> bool:
        async with connected(estate, client_context(estate)) as connection:
            return connection.peer_der == fresh.der

    await wait_until(serving_fresh, timeout=30, interval=0.2, what="the rotated certificate")
