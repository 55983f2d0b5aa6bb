"""A throwaway PKI for tests: a CA, server certificates and client certificates with SAN URIs.

Everything is made with ``cryptography`` in the test process (EC P-256 keys: fast to generate).
Used by the TLS, door and listener tests; other tests may reuse it.

    ca = TestCA("agentsafe test CA")
    server = ca.issue_server()                      # CN/SAN localhost and 127.0.0.1
    client = ca.issue_client("spiffe://bank.example/ns/ops/sa/oncall")
    cert_path, key_path = server.write(tmp_path, "server")
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["Issued", "TestCA"]


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key, in the forms tests need."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def der(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.DER)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.der).hexdigest()

    @property
    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def write(self, directory: Path, stem: str) -> tuple[Path, Path]:
        """Write ``<stem>.crt`` and ``<stem>.key`` (0600) into ``directory``."""
        cert_path = directory / f"{stem}.crt"
        key_path = directory / f"{stem}.key"
        cert_path.write_bytes(self.cert_pem)
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(self.key_pem)
        return cert_path, key_path


class TestCA:
    """A self-signed certificate authority living only in memory."""

    __test__ = False  # not a pytest test class

    def __init__(self, name: str = "agentsafe test CA") -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = _now()
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
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
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False
            )
            .sign(self.key, hashes.SHA256())
        )

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def write(self, directory: Path, stem: str = "ca") -> Path:
        path = directory / f"{stem}.crt"
        path.write_bytes(self.cert_pem)
        return path

    def _issue(
        self,
        common_name: str,
        sans: list[x509.GeneralName],
        usage: x509.ObjectIdentifier,
        *,
        days: int = 1,
    ) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return Issued(cert=builder.sign(self.key, hashes.SHA256()), key=key)

    def issue_server(
        self,
        *,
        dns_names: tuple[str, ...] = ("localhost",),
        ips: tuple[str, ...] = ("127.0.0.1",),
        common_name: str = "localhost",
    ) -> Issued:
        sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
        sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        return self._issue(common_name, sans, ExtendedKeyUsageOID.SERVER_AUTH)

    def issue_client(self, *san_uris: str, common_name: str = "agentsafe test client") -> Issued:
        sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(u) for u in san_uris]
        return self._issue(common_name, sans, ExtendedKeyUsageOID.CLIENT_AUTH)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)
