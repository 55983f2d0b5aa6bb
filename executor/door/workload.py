"""Workload tokens: verifying Kubernetes projected service-account JWTs, and the JWKS they use.

Our own verifier on ``cryptography`` (no JWT library, so the accepted shapes are exactly these):

* compact JWS, three base64url segments, header ``alg`` one of ``RS256`` (RSA >= 2048 bits),
  ``ES256`` (P-256, the signature is raw ``r || s``) or ``EdDSA`` (Ed25519); anything else,
  ``none`` and every HMAC among them, is ``JWT_ALGORITHM_REFUSED`` before any key is touched, so
  an ``HS256`` token "signed" with the public key can never verify;
* the key is chosen from the JWKS by ``kid`` (or, without one, every key of the algorithm's type
  is tried); a key whose own ``alg`` or ``use`` disagrees is never used;
* ``iss``, ``sub``, ``exp`` and ``iat`` are required; the token may be at most a day old by
  ``iat``; ``EXECUTOR_JWT_CLOCK_TOLERANCE_SECONDS`` of leeway applies to ``exp``, ``nbf``, ``iat``;
* the audience must include ``EXECUTOR_JWT_AUDIENCE`` or the principal's own ``audience``;
* ``required_claims`` match exactly. A key is looked up first as a flat claim name
  (``"kubernetes.io/namespace"`` as written in the specification's example) and, when the token
  has no such top-level claim, as a ``/``-separated path into nested objects, which is how
  Kubernetes actually carries it: ``{"kubernetes.io": {"namespace": ...}}``.

Codes (each refusal its own): JWT_MALFORMED, JWT_ALGORITHM_REFUSED, JWT_SIGNATURE_INVALID,
JWT_ISSUER_UNKNOWN, JWT_SUBJECT_UNKNOWN, JWT_EXPIRED (expired, not yet valid, or older than a
day), JWT_AUDIENCE_MISMATCH, JWT_CLAIM_MISMATCH (including a missing required claim).
:class:`JwtRefused` carries ``principal_id`` once the signature proved which principal the token
belongs to; the door counts such refusals against that principal's lockout.

:class:`JwksSource` holds the keys: read from ``EXECUTOR_JWKS_FILE`` at start (failure is a
refusal to start), re-read whenever the file's identity changes (checked on use), optionally
refreshed from ``EXECUTOR_JWKS_URL`` through an injected fetch callable (the guarded transport);
any failed re-read or refresh keeps the last good set and is reported on the security stream
(``JWKS_RELOAD_REFUSED`` / ``JWKS_REFRESH_FAILED``). The keys in use are the union of the file's
last good set and the URL's last good set, so a cluster key rotation picked up by either works.

Callers: ``door/door.py``, ``assembly.py`` (builds the source); ``plane.py`` runs
:meth:`JwksSource.run_refresh`.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from .. import base64url
from ..canonical import parse_json
from ..clock import Clock
from ..codes import Code
from ..errors import AgentSafeError, CanonicalizationError, ConfigError
from ..events import EventSink
from .principals_file import PrincipalRecord, PrincipalSet, WorkloadJwtCredential

__all__ = [
    "ALLOWED_ALGORITHMS",
    "MAX_TOKEN_AGE_SECONDS",
    "Jwk",
    "JwksSource",
    "JwtRefused",
    "WorkloadVerifier",
    "looks_like_jwt",
    "parse_jwks",
]

ALLOWED_ALGORITHMS = frozenset({"RS256", "ES256", "EdDSA"})
MAX_TOKEN_AGE_SECONDS = 86_400
MAX_TOKEN_BYTES = 16 * 1024
MAX_JWKS_BYTES = 256 * 1024
MAX_JWKS_KEYS = 64
_B64URL = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")

PublicKey = rsa.RSAPublicKey | ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey
FetchJwks = Callable[[], Awaitable[bytes]]


class JwtRefused(AgentSafeError):
    """A workload token refused; ``principal_id`` is set once the signature named a principal."""

    code: Code

    def __init__(self, code: Code, message: str, *, principal_id: str | None = None) -> None:
        super().__init__(message, code=code)
        self.code = code
        self.principal_id = principal_id


@dataclass(frozen=True)
class Jwk:
    """One verification key from a JWKS, with the only algorithm it may verify."""

    kid: str | None
    alg: str
    key: PublicKey

    def verify(self, signature: bytes, signed: bytes) -> bool:
        try:
            if self.alg == "RS256":
                assert isinstance(self.key, rsa.RSAPublicKey)
                self.key.verify(signature, signed, padding.PKCS1v15(), hashes.SHA256())
            elif self.alg == "ES256":
                assert isinstance(self.key, ec.EllipticCurvePublicKey)
                if len(signature) != 64:
                    return False
                r = int.from_bytes(signature[:32], "big")
                s = int.from_bytes(signature[32:], "big")
                self.key.verify(encode_dss_signature(r, s), signed, ec.ECDSA(hashes.SHA256()))
            else:
                assert isinstance(self.key, ed25519.Ed25519PublicKey)
                self.key.verify(signature, signed)
        except InvalidSignature:
            return False
        return True


def _b64url_decode(segment: str) -> bytes:
    """The one rule (``base64url.decode``): canonical unpadded base64url, else ``ValueError``."""
    if not segment:
        raise ValueError("not base64url")
    return base64url.decode(segment)


def _b64_int(value: Any) -> int:
    if not isinstance(value, str):
        raise ValueError("a key parameter is not a string")
    return int.from_bytes(_b64url_decode(value), "big")


def _jwk(entry: Mapping[str, Any]) -> Jwk | None:
    """One JWK as a verification key, or None for a key we never use (wrong use, unknown type)."""
    kty = entry.get("kty")
    kid = entry.get("kid")
    if kid is not None and not isinstance(kid, str):
        raise ValueError("kid is not a string")
    if entry.get("use") not in (None, "sig"):
        return None
    declared = entry.get("alg")
    key: PublicKey
    if kty == "RSA":
        alg = "RS256"
        key = rsa.RSAPublicNumbers(_b64_int(entry.get("e")), _b64_int(entry.get("n"))).public_key()
        if key.key_size < 2048:
            return None
    elif kty == "EC":
        if entry.get("crv") != "P-256":
            return None
        alg = "ES256"
        key = ec.EllipticCurvePublicNumbers(
            _b64_int(entry.get("x")), _b64_int(entry.get("y")), ec.SECP256R1()
        ).public_key()
    elif kty == "OKP":
        if entry.get("crv") != "Ed25519":
            return None
        alg = "EdDSA"
        raw = _b64url_decode(str(entry.get("x", "")))
        key = ed25519.Ed25519PublicKey.from_public_bytes(raw)
    else:
        return None
    if declared is not None and declared != alg:
        return None
    return Jwk(kid=kid, alg=alg, key=key)


def parse_jwks(data: bytes) -> tuple[Jwk, ...]:
    """Parse a JWKS document; ``ValueError`` when it is not one (message names no key material)."""
    if len(data) > MAX_JWKS_BYTES:
        raise ValueError("the JWKS is too large")
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise ValueError("the JWKS is not JSON") from None
    keys = document.get("keys") if isinstance(document, dict) else None
    if not isinstance(keys, list) or len(keys) > MAX_JWKS_KEYS:
        raise ValueError("the JWKS has no keys list (or too many keys)")
    parsed: list[Jwk] = []
    for entry in keys:
        if not isinstance(entry, dict):
            raise ValueError("a JWKS key is not an object")
        try:
            jwk = _jwk(entry)
        except (ValueError, TypeError):
            raise ValueError("a JWKS key is malformed") from None
        if jwk is not None:
            parsed.append(jwk)
    return tuple(parsed)


class JwksSource:
    """The verification keys, from a file (re-read on change) and optionally a URL."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        security: EventSink | None = None,
        fetch: FetchJwks | None = None,
        refresh_seconds: float = 300.0,
    ) -> None:
        self._path = Path(path)
        self._security = security
        self._fetch = fetch
        self.refresh_seconds = refresh_seconds
        self._lock = threading.Lock()
        self._file_keys: tuple[Jwk, ...] = ()
        self._url_keys: tuple[Jwk, ...] = ()
        self._stamp: tuple[int, int, int, int] | None = None
        self._refused: tuple[int, int, int, int] | None = None
        self._missing_reported = False
        try:
            self._file_keys, self._stamp = self._read_file()
        except (OSError, ValueError) as exc:
            raise ConfigError(
                "EXECUTOR_JWKS_FILE", f"cannot be used: {_reason(exc)}", code=Code.JWKS_INVALID
            ) from None

    def _identity(self) -> tuple[int, int, int, int]:
        info = os.stat(self._path)
        return (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)

    def _read_file(self) -> tuple[tuple[Jwk, ...], tuple[int, int, int, int]]:
        stamp = self._identity()
        with open(self._path, "rb") as handle:
            data = handle.read(MAX_JWKS_BYTES + 1)
        return parse_jwks(data), stamp

    def is_current(self) -> bool:
        """Whether the keys in use are those of the file as it is now (False after a refusal)."""
        try:
            stamp: tuple[int, int, int, int] | None = self._identity()
        except OSError:
            return False
        with self._lock:
            return stamp is not None and stamp == self._stamp

    def check_file(self) -> bool:
        """Re-read the file if it changed; True when a new set was taken.

        A file that vanished or no longer parses keeps the previous set and is reported once
        per file state as ``JWKS_RELOAD_REFUSED``.
        """
        try:
            stamp: tuple[int, int, int, int] | None = self._identity()
        except OSError:
            stamp = None
        with self._lock:
            if stamp == self._stamp or (stamp is not None and stamp == self._refused):
                return False
            if stamp is None and self._missing_reported:
                return False
        try:
            keys, read_stamp = self._read_file()
        except (OSError, ValueError) as exc:
            with self._lock:
                self._refused = stamp
                self._missing_reported = stamp is None
            if self._security is not None:
                self._security.emit(
                    "JWKS_RELOAD_REFUSED", {"file": "EXECUTOR_JWKS_FILE", "reason": _reason(exc)}
                )
            return False
        with self._lock:
            self._file_keys, self._stamp = keys, read_stamp
            self._refused, self._missing_reported = None, False
        if self._security is not None:
            self._security.emit("JWKS_RELOADED", {"source": "file", "keys": len(keys)})
        return True

    async def refresh(self) -> bool:
        """Fetch the URL's JWKS once; on any failure keep the last good set and say so."""
        if self._fetch is None:
            return False
        try:
            data = await self._fetch()
            keys = parse_jwks(data)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if self._security is not None:
                code = getattr(exc, "code", None)
                self._security.emit(
                    "JWKS_REFRESH_FAILED",
                    {"source": "url", "reason": code if isinstance(code, str) else "invalid"},
                )
            return False
        with self._lock:
            self._url_keys = keys
        if self._security is not None:
            self._security.emit("JWKS_RELOADED", {"source": "url", "keys": len(keys)})
        return True

    async def run_refresh(self) -> None:
        """Refresh from the URL every ``refresh_seconds`` until cancelled."""
        while True:
            await self.refresh()
            await asyncio.sleep(self.refresh_seconds)

    def current(self) -> tuple[Jwk, ...]:
        """The keys in use now (stats the file first: a changed file is re-read)."""
        self.check_file()
        with self._lock:
            return self._file_keys + self._url_keys


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        return "unreadable"
    return str(exc) or "invalid"


def looks_like_jwt(token: str) -> bool:
    """Three base64url segments (the signature may be empty): worth trying as a workload token."""
    if not token.isascii():  # a str from anywhere may carry surrogates; base64url is ASCII
        return False
    parts = token.split(".")
    return (
        len(parts) == 3
        and bool(parts[0])
        and bool(parts[1])
        and all(set(p.encode()) <= _B64URL for p in parts)
    )


class WorkloadVerifier:
    """Verifies a projected service-account token and names the principal it proves."""

    def __init__(
        self,
        jwks: JwksSource,
        *,
        audience: str,
        clock: Clock,
        clock_tolerance_seconds: float = 30.0,
    ) -> None:
        self._jwks = jwks
        self._audience = audience
        self._clock = clock
        self._tolerance = clock_tolerance_seconds

    def verify(self, token: str, principals: PrincipalSet) -> PrincipalRecord:
        """Return the principal the token proves; raise :class:`JwtRefused` otherwise."""
        header, claims, signed, signature = self._parse(token)
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in ALLOWED_ALGORITHMS:
            raise JwtRefused(Code.JWT_ALGORITHM_REFUSED, "the token's algorithm is not accepted")
        if "crit" in header:
            raise JwtRefused(Code.JWT_MALFORMED, "critical header parameters are not supported")
        kid = header.get("kid")
        candidates = [
            k for k in self._jwks.current() if k.alg == alg and (kid is None or k.kid == kid)
        ]
        if not any(k.verify(signature, signed) for k in candidates):
            raise JwtRefused(Code.JWT_SIGNATURE_INVALID, "the token's signature does not verify")
        issuer, subject = claims.get("iss"), claims.get("sub")
        if not isinstance(issuer, str) or not principals.knows_issuer(issuer):
            raise JwtRefused(Code.JWT_ISSUER_UNKNOWN, "no principal accepts the token's issuer")
        if not isinstance(subject, str):
            raise JwtRefused(Code.JWT_SUBJECT_UNKNOWN, "the token names no subject")
        record = principals.by_workload(issuer, subject)
        if record is None:
            raise JwtRefused(Code.JWT_SUBJECT_UNKNOWN, "no principal has the token's subject")
        credential = record.credential
        assert isinstance(credential, WorkloadJwtCredential)
        pid = record.id
        self._check_times(claims, pid)
        self._check_audience(claims, credential, pid)
        self._check_claims(claims, credential, pid)
        return record

    def _parse(self, token: str) -> tuple[dict[str, Any], dict[str, Any], bytes, bytes]:
        if len(token) > MAX_TOKEN_BYTES or not looks_like_jwt(token):
            raise JwtRefused(Code.JWT_MALFORMED, "the token is not a compact JWS")
        head, body, sig = token.split(".")
        try:
            header = parse_json(_b64url_decode(head))
            claims = parse_json(_b64url_decode(body))
            signature = _b64url_decode(sig) if sig else b""
        except (ValueError, CanonicalizationError, RecursionError):
            raise JwtRefused(Code.JWT_MALFORMED, "the token is not a compact JWS") from None
        if not isinstance(header, dict) or not isinstance(claims, dict):
            raise JwtRefused(Code.JWT_MALFORMED, "the token is not a compact JWS")
        return header, claims, f"{head}.{body}".encode("ascii"), signature

    def _check_times(self, claims: Mapping[str, Any], pid: str) -> None:
        now = self._clock.now()
        tol = self._tolerance
        exp, iat = _number(claims.get("exp")), _number(claims.get("iat"))
        nbf = _number(claims.get("nbf")) if "nbf" in claims else 0.0
        if exp is None or iat is None or nbf is None:
            raise JwtRefused(
                Code.JWT_CLAIM_MISMATCH, "exp and iat are required numbers", principal_id=pid
            )
        if now > exp + tol:
            raise JwtRefused(Code.JWT_EXPIRED, "the token has expired", principal_id=pid)
        if iat > now + tol or nbf > now + tol:
            raise JwtRefused(Code.JWT_EXPIRED, "the token is not valid yet", principal_id=pid)
        if now - iat > MAX_TOKEN_AGE_SECONDS + tol:
            raise JwtRefused(Code.JWT_EXPIRED, "the token is more than a day old", principal_id=pid)

    def _check_audience(
        self, claims: Mapping[str, Any], credential: WorkloadJwtCredential, pid: str
    ) -> None:
        aud = claims.get("aud")
        audiences: Sequence[Any] = (
            [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
        )
        accepted = {self._audience}
        if credential.audience is not None:
            accepted.add(credential.audience)
        if not any(isinstance(a, str) and a in accepted for a in audiences):
            raise JwtRefused(
                Code.JWT_AUDIENCE_MISMATCH,
                "the token is not meant for this executor",
                principal_id=pid,
            )

    def _check_claims(
        self, claims: Mapping[str, Any], credential: WorkloadJwtCredential, pid: str
    ) -> None:
        for name, expected in (credential.required_claims or {}).items():
            found, value = _claim(claims, name)
            if not found or type(value) is not type(expected) or value != expected:
                raise JwtRefused(
                    Code.JWT_CLAIM_MISMATCH, "a required claim does not match", principal_id=pid
                )


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _claim(claims: Mapping[str, Any], name: str) -> tuple[bool, Any]:
    """A flat claim ``name`` if present, else ``name`` as a ``/``-separated path."""
    if name in claims:
        return True, claims[name]
    node: Any = claims
    for part in name.split("/"):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node
