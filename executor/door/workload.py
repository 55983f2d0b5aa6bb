"""Workload tokens: verifying Kubernetes projected service-account JWTs, and the JWKS they use.

The signature is verified by PyJWT through ``jws.py`` (the one compact JWS implementation, which
reads the segments strictly first); the rules around it are ours:

* compact JWS, three base64url segments, header ``alg`` in the allowlist ``RS256`` (RSA >= 2048
  bits), ``ES256`` (P-256, the signature is raw ``r || s``) or ``EdDSA`` (Ed25519); anything else,
  ``none`` and every HMAC among them, is ``JWT_ALGORITHM_REFUSED`` before any key is touched, so
  an ``HS256`` token "signed" with the public key can never verify; a ``crit`` header is refused;
* ``iss`` must be an issuer some principal names (``JWT_ISSUER_UNKNOWN``), and only the keys of
  *that issuer's* key set are tried: every key set is bound to one issuer (see below), so a key
  from issuer B's JWKS never verifies a token that claims issuer A;
* within that set the key is chosen by ``kid`` (or, without one, every key of the algorithm's
  type is tried); a key whose own ``alg`` or ``use`` disagrees is never used;
* ``iss``, ``sub``, ``exp`` and ``iat`` are required; ``exp``, ``iat`` and ``nbf`` are finite
  numbers (the JSON reader refuses ``NaN`` and ``Infinity``, and a number that overflows); the
  token may be at most a day old by ``iat``; ``EXECUTOR_JWT_CLOCK_TOLERANCE_SECONDS`` of leeway
  applies to ``exp``, ``nbf``, ``iat``;
* the audience must include ``EXECUTOR_JWT_AUDIENCE`` or the principal's own ``audience``;
* ``required_claims`` match exactly. A key is looked up both as a flat claim name
  (``"kubernetes.io/namespace"`` as written in the specification's example) and as a
  ``/``-separated path into nested objects, which is how Kubernetes actually carries it:
  ``{"kubernetes.io": {"namespace": ...}}``. When both are present they must agree, else the
  token is refused: two readers that resolve the ambiguity differently would disagree on it.

Codes (each refusal its own): JWT_MALFORMED, JWT_ALGORITHM_REFUSED, JWT_SIGNATURE_INVALID,
JWT_ISSUER_UNKNOWN, JWT_SUBJECT_UNKNOWN, JWT_EXPIRED (expired, not yet valid, or older than a
day), JWT_AUDIENCE_MISMATCH, JWT_CLAIM_MISMATCH (including a missing required claim).
No workload token failure counts towards a principal's lockout, so :class:`JwtRefused` names no
principal: a token that names a key of the issuer's set (a ``kid`` is public, in the JWKS) and a
principal's subject but whose signature does not verify is what anyone can produce at will, with
a key of their own (issue 30, item 20); a genuine token for another audience, or a stale one, is
what a stranger holding it can replay. Each counts in its source's window only (``door.py``).

Key sets and their issuers. ``EXECUTOR_JWKS_FILE`` is a JWKS (``{"keys": [...]}``), optionally
with an ``"issuer"`` member naming the issuer its keys belong to, or several bound sets
(``{"issuers": [{"issuer": ..., "keys": [...]}, ...]}``). A set that names no issuer belongs to
the one workload issuer the principals file names; when the principals name several, such a set
is refused at start (``JWKS_INVALID``) and verifies nothing. The keys from ``EXECUTOR_JWKS_URL``
belong to the file's issuer, so the file must then hold one set.

:class:`JwksSource` holds the keys: read from ``EXECUTOR_JWKS_FILE`` at start (failure is a
refusal to start), re-read whenever the file's identity changes (checked on use), optionally
refreshed from ``EXECUTOR_JWKS_URL`` through an injected fetch callable (the guarded transport);
any failed re-read or refresh keeps the last good set and is reported on the security stream
(``JWKS_RELOAD_REFUSED`` / ``JWKS_REFRESH_FAILED``). An issuer's keys in use are the union of the
file's last good set and the URL's last good set, so a cluster key rotation picked up by either
works.

Callers: ``door/door.py``, ``assembly.py`` (builds the source); ``plane.py`` runs
:meth:`JwksSource.run_refresh`.
Also imported by ``tools/doctor.py``.
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from ..canonical import parse_json
from ..clock import Clock
from ..codes import Code
from ..errors import AgentSafeError, CanonicalizationError, ConfigError
from ..events import EventSink
from ..jws import Compact, TokenRefused, b64url_decode, split_compact, verify_compact
from .principals_file import PrincipalRecord, PrincipalSet, WorkloadJwtCredential

__all__ = [
    "ALLOWED_ALGORITHMS",
    "MAX_TOKEN_AGE_SECONDS",
    "Jwk",
    "JwkSet",
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
MAX_JWKS_ISSUERS = 16
_B64URL = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")

PublicKey = rsa.RSAPublicKey | ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey
FetchJwks = Callable[[], Awaitable[bytes]]


class JwtRefused(AgentSafeError):
    """A workload token refused. It names no principal: no workload token failure counts
    towards a principal's lockout (see the module docstring)."""

    code: Code

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message, code=code)
        self.code = code


@dataclass(frozen=True)
class Jwk:
    """One verification key from a JWKS, with the only algorithm it may verify."""

    kid: str | None
    alg: str
    key: PublicKey


@dataclass(frozen=True)
class JwkSet:
    """The keys of one issuer; ``issuer`` None: the one workload issuer the principals name."""

    issuer: str | None
    keys: tuple[Jwk, ...]

    def bound_to(self, issuers: frozenset[str]) -> str | None:
        """The issuer these keys verify for, given the issuers the principals name."""
        if self.issuer is not None:
            return self.issuer
        return next(iter(issuers)) if len(issuers) == 1 else None


def _b64_int(value: Any) -> int:
    if not isinstance(value, str):
        raise ValueError("a key parameter is not a string")
    return int.from_bytes(b64url_decode(value), "big")


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
        raw = b64url_decode(str(entry.get("x", "")))
        key = ed25519.Ed25519PublicKey.from_public_bytes(raw)
    else:
        return None
    if declared is not None and declared != alg:
        return None
    return Jwk(kid=kid, alg=alg, key=key)


def _keys(keys: Any) -> tuple[Jwk, ...]:
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


def _issuer(value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > 1024:
        raise ValueError("a key set's issuer is not a string")
    return value


def parse_jwks(data: bytes) -> tuple[JwkSet, ...]:
    """Parse a JWKS document into its issuer-bound sets; ``ValueError`` when it is not one
    (the message names no key material). See the module docstring for the two forms."""
    if len(data) > MAX_JWKS_BYTES:
        raise ValueError("the JWKS is too large")
    try:
        document = parse_json(data)
    except (ValueError, CanonicalizationError, RecursionError):
        raise ValueError("the JWKS is not JSON") from None
    if not isinstance(document, dict):
        raise ValueError("the JWKS has no keys list (or too many keys)")
    if "issuers" in document:
        if "keys" in document:
            raise ValueError("a JWKS has either keys or issuers, not both")
        bound = document["issuers"]
        if not isinstance(bound, list) or not bound or len(bound) > MAX_JWKS_ISSUERS:
            raise ValueError("issuers is a list of at most 16 bound key sets")
        sets: list[JwkSet] = []
        for entry in bound:
            if not isinstance(entry, dict):
                raise ValueError("a bound key set is not an object")
            sets.append(JwkSet(_issuer(entry.get("issuer")), _keys(entry.get("keys"))))
        if len({s.issuer for s in sets}) != len(sets):
            raise ValueError("an issuer has two key sets")
        return tuple(sets)
    issuer = _issuer(document["issuer"]) if "issuer" in document else None
    return (JwkSet(issuer, _keys(document.get("keys"))),)


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
        self._file_sets: tuple[JwkSet, ...] = ()
        self._url_keys: tuple[Jwk, ...] = ()
        self._stamp: tuple[int, int, int, int] | None = None
        self._refused: tuple[int, int, int, int] | None = None
        self._missing_reported = False
        try:
            self._file_sets, self._stamp = self._read_file()
            if fetch is not None and len(self._file_sets) != 1:
                raise ValueError("with EXECUTOR_JWKS_URL the file holds one issuer's key set")
        except (OSError, ValueError) as exc:
            raise ConfigError(
                "EXECUTOR_JWKS_FILE", f"cannot be used: {_reason(exc)}", code=Code.JWKS_INVALID
            ) from None

    def _identity(self) -> tuple[int, int, int, int]:
        info = os.stat(self._path)
        return (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)

    def _read_file(self) -> tuple[tuple[JwkSet, ...], tuple[int, int, int, int]]:
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
            sets, read_stamp = self._read_file()
            if self._fetch is not None and len(sets) != 1:
                raise ValueError("with EXECUTOR_JWKS_URL the file holds one issuer's key set")
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
            self._file_sets, self._stamp = sets, read_stamp
            self._refused, self._missing_reported = None, False
        if self._security is not None:
            count = sum(len(s.keys) for s in sets)
            self._security.emit("JWKS_RELOADED", {"source": "file", "keys": count})
        return True

    async def refresh(self) -> bool:
        """Fetch the URL's JWKS once; on any failure keep the last good set and say so."""
        if self._fetch is None:
            return False
        try:
            data = await self._fetch()
            sets = parse_jwks(data)
            with self._lock:
                file_issuer = self._file_sets[0].issuer if len(self._file_sets) == 1 else None
            if len(sets) != 1 or sets[0].issuer not in (None, file_issuer):
                raise ValueError("the URL serves one JWKS of the file's issuer")
            keys = sets[0].keys
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

    def current(self) -> tuple[JwkSet, ...]:
        """The key sets in use now (stats the file first: a changed file is re-read); the URL's
        keys join the file's one set."""
        self.check_file()
        with self._lock:
            sets = self._file_sets
            if self._url_keys and len(sets) == 1:
                sets = (JwkSet(sets[0].issuer, sets[0].keys + self._url_keys),)
            return sets

    def keys_for(self, issuer: str, issuers: frozenset[str]) -> tuple[Jwk, ...]:
        """The keys that may verify a token of ``issuer``, given the principals' issuers."""
        return tuple(
            key
            for bound in self.current()
            if bound.bound_to(issuers) == issuer
            for key in bound.keys
        )

    def check_binding(self, issuers: Iterable[str]) -> None:
        """Refuse (``JWKS_INVALID``) a key set bound to no issuer: one that names none while
        the principals name several workload issuers."""
        named = frozenset(issuers)
        if any(bound.bound_to(named) is None for bound in self.current()) and len(named) > 1:
            raise ConfigError(
                "EXECUTOR_JWKS_FILE",
                "names no issuer while the principals name several: give each key set its "
                'issuer ({"issuers": [{"issuer": ..., "keys": [...]}]})',
                code=Code.JWKS_INVALID,
            )


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
        compact = self._parse(token)
        header, claims = compact.header, compact.payload
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in ALLOWED_ALGORITHMS:
            raise JwtRefused(Code.JWT_ALGORITHM_REFUSED, "the token's algorithm is not accepted")
        issuer, subject = claims.get("iss"), claims.get("sub")
        if not isinstance(issuer, str) or not principals.knows_issuer(issuer):
            raise JwtRefused(Code.JWT_ISSUER_UNKNOWN, "no principal accepts the token's issuer")
        kid = header.get("kid")
        candidates = [
            k
            for k in self._jwks.keys_for(issuer, principals.workload_issuers)
            if k.alg == alg and (kid is None or k.kid == kid)
        ]
        if not any(_verifies(compact, k) for k in candidates):
            raise JwtRefused(Code.JWT_SIGNATURE_INVALID, "the token's signature does not verify")
        if not isinstance(subject, str):
            raise JwtRefused(Code.JWT_SUBJECT_UNKNOWN, "the token names no subject")
        record = principals.by_workload(issuer, subject)
        if record is None:
            raise JwtRefused(Code.JWT_SUBJECT_UNKNOWN, "no principal has the token's subject")
        credential = record.credential
        assert isinstance(credential, WorkloadJwtCredential)
        self._check_times(claims)
        self._check_audience(claims, credential)
        self._check_claims(claims, credential)
        return record

    def _parse(self, token: str) -> Compact:
        if len(token) > MAX_TOKEN_BYTES or not looks_like_jwt(token):
            raise JwtRefused(Code.JWT_MALFORMED, "the token is not a compact JWS")
        try:
            return split_compact(token, max_length=MAX_TOKEN_BYTES)
        except TokenRefused:
            raise JwtRefused(Code.JWT_MALFORMED, "the token is not a compact JWS") from None

    def _check_times(self, claims: Mapping[str, Any]) -> None:
        now = self._clock.now()
        tol = self._tolerance
        exp, iat = _number(claims.get("exp")), _number(claims.get("iat"))
        nbf = _number(claims.get("nbf")) if "nbf" in claims else 0.0
        if exp is None or iat is None or nbf is None:
            raise JwtRefused(Code.JWT_CLAIM_MISMATCH, "exp and iat are required finite numbers")
        if now > exp + tol:
            raise JwtRefused(Code.JWT_EXPIRED, "the token has expired")
        if iat > now + tol or nbf > now + tol:
            raise JwtRefused(Code.JWT_EXPIRED, "the token is not valid yet")
        if now - iat > MAX_TOKEN_AGE_SECONDS + tol:
            raise JwtRefused(Code.JWT_EXPIRED, "the token is more than a day old")

    def _check_audience(self, claims: Mapping[str, Any], credential: WorkloadJwtCredential) -> None:
        aud = claims.get("aud")
        audiences: Sequence[Any] = (
            [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
        )
        accepted = {self._audience}
        if credential.audience is not None:
            accepted.add(credential.audience)
        if not any(isinstance(a, str) and a in accepted for a in audiences):
            raise JwtRefused(Code.JWT_AUDIENCE_MISMATCH, "the token is not meant for this executor")

    def _check_claims(self, claims: Mapping[str, Any], credential: WorkloadJwtCredential) -> None:
        for name, expected in (credential.required_claims or {}).items():
            found, value = _claim(claims, name)
            if not found or type(value) is not type(expected) or value != expected:
                raise JwtRefused(Code.JWT_CLAIM_MISMATCH, "a required claim does not match")


def _verifies(compact: Compact, key: Jwk) -> bool:
    try:
        verify_compact(compact, key.key, algorithms=(key.alg,))
    except TokenRefused:
        return False
    return True


def _number(value: Any) -> float | None:
    """A finite JSON number (never a boolean, never NaN or an infinity)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value) if not isinstance(value, int) or abs(value) < 2**63 else None
        if number is not None and math.isfinite(number):
            return number
    return None


_ABSENT = object()


def _claim(claims: Mapping[str, Any], name: str) -> tuple[bool, Any]:
    """``name`` as a flat claim and as a ``/``-separated path; both present must agree.

    Returns ``(found, value)``; a flat and a nested value that disagree are ``(False, None)``:
    the token is ambiguous about the claim, and an ambiguous claim never matches.
    """
    flat = claims.get(name, _ABSENT)
    nested: Any = _ABSENT
    if "/" in name:
        node: Any = claims
        for part in name.split("/"):
            if not isinstance(node, Mapping) or part not in node:
                node = _ABSENT
                break
            node = node[part]
        nested = node
    if flat is _ABSENT and nested is _ABSENT:
        return False, None
    both = flat is not _ABSENT and nested is not _ABSENT
    if both and (type(flat) is not type(nested) or flat != nested):
        return False, None
    return True, flat if flat is not _ABSENT else nested
