"""The operator's own webhook CA: one CA in a Secret (created once), a serving leaf per replica.

The leaves are checked by a real TLS handshake on loopback (``ssl`` trusting only the CA),
not by reading fields back.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509

from agentsafe.operator.webhook_tls import (
    CA_BUNDLE_FIELD_MANAGER,
    SERVING_VALIDITY,
    WebhookTlsError,
    ensure_ca,
    needs_renewal,
    new_ca,
    publish_ca_bundle,
    write_serving,
)

from .fakekube import FakeKube

NS = "agentsafe-system"
NAME = "agentsafe-operator-webhook-ca"


async def test_the_ca_is_created_once_and_shared(tmp_path: Path) -> None:
    kube = FakeKube()
    first = await ensure_ca(kube, NS, NAME)
    second = await ensure_ca(kube, NS, NAME)
    assert first.cert_pem == second.cert_pem
    assert first.key_pem == second.key_pem
    assert [c[0] for c in kube.calls].count("create") == 1
    stored = kube.objects[("Secret", NS, NAME)]
    assert set(stored["data"]) == {"ca.crt", "ca.key"}
    assert stored["metadata"]["labels"]["app.kubernetes.io/component"] == "webhook-ca"


async def test_a_lost_creation_race_reads_the_winner() -> None:
    kube = FakeKube()
    winner = new_ca("winner")
    original_get = kube.get
    calls = 0

    async def racing_get(kind: str, namespace: str | None, name: str) -> object:
        nonlocal calls
        calls += 1
        if calls == 1:  # the other replica creates it between our get and our create
            result = await original_get(kind, namespace, name)
            kube.put(
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": NAME, "namespace": NS},
                    "data": {
                        "ca.crt": base64.b64encode(winner.cert_pem).decode(),
                        "ca.key": base64.b64encode(winner.key_pem).decode(),
                    },
                }
            )
            return result
        return await original_get(kind, namespace, name)

    kube.get = racing_get  # type: ignore[method-assign]
    got = await ensure_ca(kube, NS, NAME)
    assert got.cert_pem == winner.cert_pem


@pytest.mark.parametrize(
    "data",
    [
        {"ca.crt": base64.b64encode(b"not a certificate").decode(), "ca.key": "eA=="},
        {"ca.crt": base64.b64encode(b"x").decode()},
    ],
)
async def test_an_unusable_ca_secret_says_what_to_do(data: dict[str, str]) -> None:
    kube = FakeKube()
    kube.put({"kind": "Secret", "metadata": {"name": NAME, "namespace": NS}, "data": data})
    with pytest.raises(WebhookTlsError) as info:
        await ensure_ca(kube, NS, NAME)
    assert f"delete Secret {NS}/{NAME} and restart the operator" in str(info.value)


async def test_a_ca_near_its_end_is_refused() -> None:
    kube = FakeKube()
    old = dt.datetime.now(dt.UTC) - dt.timedelta(days=3640)
    await ensure_ca(kube, NS, NAME, now=old)
    with pytest.raises(WebhookTlsError, match="expires soon"):
        await ensure_ca(kube, NS, NAME)


async def _handshake(port: int, ca_pem: bytes, server_name: str) -> x509.Certificate:
    context = ssl.create_default_context(cadata=ca_pem.decode())
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=context, server_hostname=server_name
    )
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    await writer.wait_closed()
    del reader
    return x509.load_der_x509_certificate(der)


async def test_each_replicas_leaf_verifies_under_the_one_ca(tmp_path: Path) -> None:
    ca = new_ca("test")
    names = ["agentsafe-operator.agentsafe-system.svc", "127.0.0.1"]
    leaves = []
    for replica in ("a", "b"):
        files = write_serving(tmp_path / replica, ca, names)
        for path in (files.certfile, files.pkeyfile, files.cafile):
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert files.cafile.read_bytes() == ca.cert_pem
        server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_context.load_cert_chain(files.certfile, files.pkeyfile)
        server = await asyncio.start_server(
            lambda r, w: w.close(), "127.0.0.1", 0, ssl=server_context
        )
        port = server.sockets[0].getsockname()[1]
        async with server:
            leaves.append(await _handshake(port, ca.cert_pem, names[0]))
            with pytest.raises(ssl.SSLCertVerificationError):
                await _handshake(port, ca.cert_pem, "elsewhere.example")
            with pytest.raises(ssl.SSLCertVerificationError):
                await _handshake(port, new_ca("other").cert_pem, names[0])
    assert leaves[0].serial_number != leaves[1].serial_number


def test_renewal_is_due_before_the_leaf_ends(tmp_path: Path) -> None:
    files = write_serving(tmp_path, new_ca("test"), ["localhost"])
    now = dt.datetime.now(dt.UTC)
    assert not needs_renewal(files, now=now)
    assert needs_renewal(files, now=now + SERVING_VALIDITY - dt.timedelta(days=9))


async def test_the_ca_bundle_is_published_as_one_field() -> None:
    kube = FakeKube()
    ca = new_ca("test")
    await publish_ca_bundle(kube, "agentsafe-operator", ["agentpolicies.agentsafe.io"], ca)
    (call,) = kube.calls
    assert call == (
        f"apply:{CA_BUNDLE_FIELD_MANAGER}",
        "ValidatingWebhookConfiguration",
        None,
        "agentsafe-operator",
    )
    applied = kube.objects[("ValidatingWebhookConfiguration", None, "agentsafe-operator")]
    assert applied["webhooks"] == [
        {
            "name": "agentpolicies.agentsafe.io",
            "clientConfig": {"caBundle": base64.b64encode(ca.cert_pem).decode()},
        }
    ]
