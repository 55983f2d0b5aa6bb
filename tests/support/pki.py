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

__all__ = ["Issued", "TestCA", "TokenSigner", "unsigned_token"]


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


# -- workload tokens ---------------------------------------------------------------------------


def _b64url(data: bytes) -> str:
    import base64

    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _int_b64(value: int, length: int | None = None) -> str:
    size = length or max(1, (value.bit_length() + 7) // 8)
    return _b64url(value.to_bytes(size, "big"))


class TokenSigner:
    """Signs compact JWS tokens with a key made in the test (RS256, ES256 or EdDSA)."""

    __test__ = False

    def __init__(self, alg: str = "ES256", *, kid: str = "test-key") -> None:
        from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

        self.alg = alg
        self.kid = kid
        if alg == "RS256":
            self.key: object = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        elif alg == "ES256":
            self.key = ec.generate_private_key(ec.SECP256R1())
        elif alg == "EdDSA":
            self.key = ed25519.Ed25519PrivateKey.generate()
        else:
            raise ValueError(alg)

    def jwk(self) -> dict[str, str]:
        from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

        key = self.key
        if isinstance(key, rsa.RSAPrivateKey):
            numbers = key.public_key().public_numbers()
            return {"kty": "RSA", "kid": self.kid, "alg": "RS256", "use": "sig",
                    "n": _int_b64(numbers.n), "e": _int_b64(numbers.e)}  # fmt: skip
        if isinstance(key, ec.EllipticCurvePrivateKey):
            pub = key.public_key().public_numbers()
            return {"kty": "EC", "kid": self.kid, "crv": "P-256",
                    "x": _int_b64(pub.x, 32), "y": _int_b64(pub.y, 32)}  # fmt: skip
        assert isinstance(key, ed25519.Ed25519PrivateKey)
        raw = key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        return {"kty": "OKP", "kid": self.kid, "crv": "Ed25519", "x": _b64url(raw)}

    def public_pem(self) -> bytes:
        key = self.key
        public = key.public_key()  # type: ignore[attr-defined]
        pem: bytes = public.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        return pem

    def sign(self, claims: dict[str, object], *, header: dict[str, object] | None = None) -> str:
        import json

        from cryptography.hazmat.primitives.asymmetric import ed25519, padding, rsa
        from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

        head = {"alg": self.alg, "typ": "JWT", "kid": self.kid, **(header or {})}
        signing_input = (
            _b64url(json.dumps(head).encode()) + "." + _b64url(json.dumps(claims).encode())
        ).encode("ascii")
        key = self.key
        if isinstance(key, rsa.RSAPrivateKey):
            signature = key.sign(signing_input, padding.PKCS1v15(), hashes.SHA256())
        elif isinstance(key, ec.EllipticCurvePrivateKey):
            r, s = decode_dss_signature(key.sign(signing_input, ec.ECDSA(hashes.SHA256())))
            signature = r.to_bytes(32, "big") + s.to_bytes(32, "big")
        else:
            assert isinstance(key, ed25519.Ed25519PrivateKey)
            signature = key.sign(signing_input)
        return signing_input.decode("ascii") + "." + _b64url(signature)


def unsigned_token(header: dict[str, object], claims: dict[str, object], signature: bytes) -> str:
    """A token with any header and any signature bytes (for alg:none and HS256 forgeries)."""
    import json

    return ".".join(
        [_b64url(json.dumps(header).encode()), _b64url(json.dumps(claims).encode()),
         _b64url(signature)]
    )  # fmt: skip
