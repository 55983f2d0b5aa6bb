"""Certificates and keys for the local control plane, made with ``cryptography``.

Role: one throwaway CA per control plane, the API server's serving certificate, an admin
client certificate (``O=system:masters``) and the service-account signing key pair. Caller:
:mod:`control_plane`. Nothing here is reused across runs.
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclasses.dataclass(frozen=True)
class ControlPlanePki:
    ca_cert: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    sa_public_key: Path
    sa_private_key: Path


def _pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, *, private: bool = False) -> Path:
    path.write_bytes(data)
    path.chmod(0o600 if private else 0o644)
    return path


def _name(common_name: str, organisation: str | None = None) -> x509.Name:
    parts = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organisation:
        parts.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organisation))
    return x509.Name(parts)


def _leaf(
    *,
    ca_key: ec.EllipticCurvePrivateKey,
    ca_name: x509.Name,
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    usage: x509.ObjectIdentifier,
    sans: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_encipherment=False,
                content_commitment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def _new_ca(
    common_name: str, now: datetime.datetime
) -> tuple[ec.EllipticCurvePrivateKey, x509.Name, x509.Certificate]:
    """A self-signed P-256 CA valid for a day (from five minutes ago)."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name(common_name)
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_encipherment=False,
                content_commitment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return ca_key, ca_name, ca


def make_pki(
    directory: Path,
    *,
    admin_user: str = "agentsafe-e2e-admin",
    extra_ips: Sequence[str] = (),
    extra_dns_names: Sequence[str] = (),
) -> ControlPlanePki:
    """Write a CA, serving and admin certificates and an RSA service-account key pair.

    ``extra_ips``/``extra_dns_names`` join the serving certificate's names (the one-node
    cluster's API server is also reached at the node IP and the ``kubernetes`` Service)."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key, ca_name, ca = _new_ca("agentsafe-e2e-ca", now)
    serving_key = ec.generate_private_key(ec.SECP256R1())
    serving = _leaf(
        ca_key=ca_key,
        ca_name=ca_name,
        subject=_name("kube-apiserver"),
        key=serving_key,
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        sans=[
            x509.DNSName("localhost"),
            x509.DNSName("kubernetes.default.svc"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            *(x509.DNSName(name) for name in extra_dns_names),
            *(x509.IPAddress(ipaddress.ip_address(ip)) for ip in extra_ips),
        ],
    )
    admin_key = ec.generate_private_key(ec.SECP256R1())
    admin = _leaf(
        ca_key=ca_key,
        ca_name=ca_name,
        subject=_name(admin_user, "system:masters"),
        key=admin_key,
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
    )
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = serialization.Encoding.PEM
    return ControlPlanePki(
        ca_cert=_write(directory / "ca.crt", ca.public_bytes(pem)),
        serving_cert=_write(directory / "apiserver.crt", serving.public_bytes(pem)),
        serving_key=_write(directory / "apiserver.key", _pem_key(serving_key), private=True),
        admin_cert=_write(directory / "admin.crt", admin.public_bytes(pem)),
        admin_key=_write(directory / "admin.key", _pem_key(admin_key), private=True),
        sa_public_key=_write(
            directory / "sa.pub",
            sa_key.public_key().public_bytes(pem, serialization.PublicFormat.SubjectPublicKeyInfo),
        ),
        sa_private_key=_write(directory / "sa.key", _pem_key(sa_key), private=True),
    )


@dataclasses.dataclass(frozen=True)
class ServingPair:
    """PEM texts of a throwaway CA and a serving certificate it issued."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    def write(self, directory: Path, stem: str) -> tuple[Path, Path, Path]:
        directory.mkdir(parents=True, exist_ok=True)
        return (
            _write(directory / f"{stem}-ca.crt", self.ca_pem),
            _write(directory / f"{stem}.crt", self.cert_pem),
            _write(directory / f"{stem}.key", self.key_pem, private=True),
        )


def issue_serving_pair(
    *, common_name: str, dns_names: list[str], ip_addresses: list[str]
) -> ServingPair:
    """A new CA and one serving certificate for ``dns_names`` and ``ip_addresses``."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key, ca_name, ca = _new_ca(f"{common_name} test CA", now)
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    leaf = _leaf(
        ca_key=ca_key,
        ca_name=ca_name,
        subject=_name(common_name),
        key=key,
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        sans=sans,
    )
    pem = serialization.Encoding.PEM
    return ServingPair(
        ca_pem=ca.public_bytes(pem), cert_pem=leaf.public_bytes(pem), key_pem=_pem_key(key)
    )
