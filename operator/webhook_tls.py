"""TLS of the operator's admission webhook when no cert-manager issues it: a CA the operator keeps.

The API server calls the webhook over HTTPS and trusts the ``caBundle`` of the
ValidatingWebhookConfiguration. With cert-manager (the chart's default when its API is
installed) a Certificate issues the serving pair into a mounted Secret and cert-manager's CA
injector writes ``caBundle``; kopf's webhook server re-reads the mounted files and restarts its
listener when they change. Without cert-manager, this module is the other source:

- :func:`ensure_ca`: the CA lives in one Secret in the operator's namespace (``ca.crt``,
  ``ca.key``), created once by whichever replica comes first (a lost race reads the winner's), so
  every replica serves under the same CA and one ``caBundle`` fits them all. The operator never
  updates or deletes it (its RBAC has no such verbs); an unreadable or nearly expired CA is an
  error that says to delete the Secret and restart.
- :func:`issue_serving`: each replica signs its own short-lived serving certificate from that CA
  in memory (:data:`SERVING_VALIDITY`), for the webhook Service's DNS names; :func:`write_serving`
  puts it in a private directory for kopf's server, and :func:`needs_renewal` says when to sign
  again (kopf notices the new files within a minute).
- :func:`publish_ca_bundle`: server-side apply of only ``webhooks[].clientConfig.caBundle`` on
  the chart's ValidatingWebhookConfiguration (field manager :data:`CA_BUNDLE_FIELD_MANAGER`; the
  chart never sets the field, so Helm's upgrades leave it alone).

Hand-written because no maintained library does "a CA in a Secret, leaves per replica": kopf's
own self-signed mode makes one certificate per process (replicas would disagree) and needs
``certbuilder``; the X.509 work itself is ``cryptography``'s.

Callers: ``cli.py`` (the operator's start-up and its renewal loop), the tests.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .errors import OperatorError
from .kubeapi import Kube
from .runtime import decode_secret_key

__all__ = [
    "CA_BUNDLE_FIELD_MANAGER",
    "CA_VALIDITY",
    "SERVING_VALIDITY",
    "CaMaterial",
    "ServingFiles",
    "WebhookTlsError",
    "ensure_ca",
    "issue_serving",
    "needs_renewal",
    "new_ca",
    "publish_ca_bundle",
    "write_serving",
]

CA_VALIDITY: Final = dt.timedelta(days=3650)
SERVING_VALIDITY: Final = dt.timedelta(days=30)
RENEW_BEFORE: Final = dt.timedelta(days=10)
"""A serving certificate is signed again when less than this is left."""
CA_MINIMUM_LEFT: Final = SERVING_VALIDITY
CA_BUNDLE_FIELD_MANAGER: Final = "agentsafe-operator-webhook"
CA_CERT_KEY: Final = "ca.crt"
CA_KEY_KEY: Final = "ca.key"


class WebhookTlsError(OperatorError):
    """The webhook's TLS material cannot be made or read; the message says what to do."""


@dataclass(frozen=True)
class CaMaterial:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )


@dataclass(frozen=True)
class ServingFiles:
    """Where kopf's webhook server reads its pair, and when the certificate expires."""

    certfile: Path
    pkeyfile: Path
    cafile: Path
    not_after: dt.datetime


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def new_ca(common_name: str, *, now: dt.datetime | None = None) -> CaMaterial:
    """A new P-256 CA, valid for :data:`CA_VALIDITY`, that signs only serving certificates."""
    start = (now or _now()) - dt.timedelta(minutes=5)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return CaMaterial(cert=cert, key=key)


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def issue_serving(
    ca: CaMaterial, names: Sequence[str], *, now: dt.datetime | None = None
) -> tuple[bytes, bytes, dt.datetime]:
    """A serving certificate for ``names`` (DNS names or IP addresses) signed by ``ca``:
    ``(cert_pem, key_pem, not_after)``."""
    if not names:
        raise WebhookTlsError("the webhook's serving certificate needs at least one name")
    start = (now or _now()) - dt.timedelta(minutes=5)
    not_after = min(start + SERVING_VALIDITY, ca.cert.not_valid_after_utc)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0][:64])]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName([_san(n) for n in names]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
            critical=False,
        )
        .sign(ca.key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem, not_after


def _write_private(path: Path, data: bytes) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(temporary, path)


def write_serving(
    directory: Path, ca: CaMaterial, names: Sequence[str], *, now: dt.datetime | None = None
) -> ServingFiles:
    """Sign a serving certificate and (re)write ``tls.crt``, ``tls.key``, ``ca.crt`` in
    ``directory`` (mode 0600, each replaced atomically; the key first, so a reader that sees
    the new certificate also finds its key)."""
    cert_pem, key_pem, not_after = issue_serving(ca, names, now=now)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    files = ServingFiles(
        certfile=directory / "tls.crt",
        pkeyfile=directory / "tls.key",
        cafile=directory / "ca.crt",
        not_after=not_after,
    )
    _write_private(files.pkeyfile, key_pem)
    _write_private(files.certfile, cert_pem)
    _write_private(files.cafile, ca.cert_pem)
    return files


def needs_renewal(files: ServingFiles, *, now: dt.datetime | None = None) -> bool:
    return files.not_after - (now or _now()) < RENEW_BEFORE


def _secret(namespace: str, name: str, ca: CaMaterial) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/name": "agentsafe-operator",
                "app.kubernetes.io/component": "webhook-ca",
                "app.kubernetes.io/managed-by": "agentsafe-operator",
            },
        },
        "data": {
            CA_CERT_KEY: base64.b64encode(ca.cert_pem).decode(),
            CA_KEY_KEY: base64.b64encode(ca.key_pem).decode(),
        },
    }


def _read_ca(secret: dict[str, Any], where: str, *, now: dt.datetime) -> CaMaterial:
    fix = f"delete Secret {where} and restart the operator: it creates a new CA"
    cert_pem = decode_secret_key(secret, CA_CERT_KEY)
    key_pem = decode_secret_key(secret, CA_KEY_KEY)
    if cert_pem is None or key_pem is None:
        raise WebhookTlsError(
            f"the webhook CA Secret {where} lacks {CA_CERT_KEY}/{CA_KEY_KEY}; {fix}"
        )
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
    except ValueError:
        raise WebhookTlsError(f"the webhook CA Secret {where} does not parse; {fix}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
        raise WebhookTlsError(f"the webhook CA Secret {where} holds a mismatched key; {fix}")
    if cert.not_valid_after_utc - now < CA_MINIMUM_LEFT:
        raise WebhookTlsError(f"the webhook CA in Secret {where} expires soon; {fix}")
    return CaMaterial(cert=cert, key=key)


async def ensure_ca(
    kube: Kube, namespace: str, name: str, *, now: dt.datetime | None = None
) -> CaMaterial:
    """The webhook CA from Secret ``namespace/name``, created first if it does not exist."""
    when = now or _now()
    where = f"{namespace}/{name}"
    found = await kube.get("Secret", namespace, name)
    if found is None:
        ca = new_ca(f"agentsafe operator webhook CA ({namespace})", now=when)
        if await kube.create(_secret(namespace, name, ca)):
            return ca
        found = await kube.get("Secret", namespace, name)  # another replica created it first
        if found is None:
            raise WebhookTlsError(f"the webhook CA Secret {where} vanished while it was created")
    return _read_ca(found, where, now=when)


async def publish_ca_bundle(
    kube: Kube, configuration: str, webhook_names: Sequence[str], ca: CaMaterial
) -> None:
    """Set ``caBundle`` of the named webhooks of ValidatingWebhookConfiguration
    ``configuration`` (server-side apply of that one field)."""
    bundle = base64.b64encode(ca.cert_pem).decode()
    await kube.apply(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": configuration},
            "webhooks": [
                {"name": name, "clientConfig": {"caBundle": bundle}} for name in webhook_names
            ],
        },
        field_manager=CA_BUNDLE_FIELD_MANAGER,
    )
