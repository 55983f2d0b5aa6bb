"""Ed25519 compact JWS: grants, escalation objects, recovery references, and the JWKS.

Everything the authority signs is a compact JWS (RFC 7515) with the header
``{"alg":"EdDSA","kid":...,"typ":...}`` over an RFC 8785 canonical JSON payload. ``kid`` is the
RFC 7638 thumbprint of the public key. Verification is deliberately narrow: exactly three
unpadded, canonical base64url segments; a header with exactly ``alg``, ``kid`` and ``typ``;
``alg`` must be ``EdDSA`` (``none``, ``HS256`` and everything else refused); the ``typ`` the caller
expects; a ``kid`` in the key set; a valid signature; and a canonical JSON object as payload.
Each refusal is a :class:`TokenRefused` (``jws.py``'s, re-exported) with its own code.

The compact form itself (strict segments, signing input, the signature under an algorithm
allowlist) is ``jws.py``'s, over PyJWT, the one JWS implementation; this module adds the grant
rules around it (the exact header, canonical header and payload, ``typ``, the key set by ``kid``).

Callers: ``policy/authority.py`` (grants and other signed tokens), ``policy/attestation.py``,
``plans/signing.py``, ``assembly.py`` (loading the
signing key; the route ``GET /.well-known/agentsafe-grant-jwks.json`` serves the authority's key
set).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from .canonical import canonical_json, sha256_hex
from .codes import Code
from .errors import AgentSafeError, CanonicalizationError
from .jws import (
    TokenRefused,
    b64url_decode,
    b64url_encode,
    sign_compact,
    split_compact,
    verify_compact,
)

__all__ = [
    "ALGORITHM",
    "MAX_TOKEN_LENGTH",
    "KeySet",
    "SigningKey",
    "TokenRefused",
    "b64url_decode",
    "b64url_encode",
    "jwk_thumbprint",
    "own_payload",
    "sign_jws",
    "verify_jws",
]

ALGORITHM = "EdDSA"
MAX_TOKEN_LENGTH = 16 * 1024
_HEADER_KEYS = frozenset({"alg", "kid", "typ"})


def _public_x(public_key: Ed25519PublicKey) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return b64url_encode(raw)


def jwk_thumbprint(public_key: Ed25519PublicKey) -> str:
    """RFC 7638 thumbprint (SHA-256, base64url) of an Ed25519 public key."""
    members = {"crv": "Ed25519", "kty": "OKP", "x": _public_x(public_key)}
    return b64url_encode(bytes.fromhex(sha256_hex(canonical_json(members))))


class SigningKey:
    """An Ed25519 private key and its ``kid``. Never printed, never serialised."""

    __slots__ = ("_key", "ephemeral", "kid", "public_key")

    def __init__(self, private_key: Ed25519PrivateKey, *, ephemeral: bool = False) -> None:
        self._key = private_key
        self.public_key = private_key.public_key()
        self.kid = jwk_thumbprint(self.public_key)
        self.ephemeral = ephemeral

    @classmethod
    def from_pem(cls, data: bytes | bytearray) -> SigningKey:
        """Load an unencrypted PKCS#8 PEM Ed25519 key; anything else is ``KEY_INVALID``."""
        try:
            key = serialization.load_pem_private_key(bytes(data), password=None)
        except (ValueError, TypeError):
            raise AgentSafeError(
                "not an unencrypted PKCS#8 PEM private key", code=Code.KEY_INVALID
            ) from None
        except Exception:  # cryptography's UnsupportedAlgorithm and friends
            raise AgentSafeError("unsupported private key", code=Code.KEY_INVALID) from None
        if not isinstance(key, Ed25519PrivateKey):
            raise AgentSafeError("the signing key must be Ed25519", code=Code.KEY_INVALID)
        return cls(key)

    @classmethod
    def generate(cls) -> SigningKey:
        """A fresh key that lives as long as the process (outside production only)."""
        return cls(Ed25519PrivateKey.generate(), ephemeral=True)

    def sign(self, data: bytes) -> bytes:
        return self._key.sign(data)

    def public_jwk(self) -> dict[str, str]:
        return _jwk(self.public_key, self.kid)

    def __repr__(self) -> str:
        return f"SigningKey(kid={self.kid!r}, ephemeral={self.ephemeral})"

    def __reduce__(self) -> Any:
        raise TypeError("a signing key cannot be pickled")


def _jwk(public_key: Ed25519PublicKey, kid: str) -> dict[str, str]:
    return {
        "kty": "OKP",
        "crv": "Ed25519",
        "x": _public_x(public_key),
        "kid": kid,
        "use": "sig",
        "alg": ALGORITHM,
    }


class KeySet:
    """Public keys tokens are verified against, by ``kid`` (the current key and retired ones)."""

    def __init__(self, keys: Iterable[SigningKey | Ed25519PublicKey]) -> None:
        self._keys: dict[str, Ed25519PublicKey] = {}
        for key in keys:
            public = key.public_key if isinstance(key, SigningKey) else key
            self._keys[jwk_thumbprint(public)] = public

    @classmethod
    def from_jwks(cls, document: Mapping[str, Any]) -> KeySet:
        """Build from a JWKS; every key must be an Ed25519 OKP key whose kid is its thumbprint."""
        keys = document.get("keys") if isinstance(document, Mapping) else None
        if not isinstance(keys, list):
            raise AgentSafeError("a JWKS has a keys array", code=Code.JWKS_INVALID)
        publics: list[Ed25519PublicKey] = []
        for jwk in keys:
            if (
                not isinstance(jwk, Mapping)
                or jwk.get("kty") != "OKP"
                or jwk.get("crv") != "Ed25519"
                or jwk.get("alg", ALGORITHM) != ALGORITHM
                or not isinstance(jwk.get("x"), str)
            ):
                raise AgentSafeError("only Ed25519 OKP keys are accepted", code=Code.JWKS_INVALID)
            try:
                raw = b64url_decode(jwk["x"])
                public = Ed25519PublicKey.from_public_bytes(raw)
            except (TokenRefused, ValueError):
                raise AgentSafeError(
                    "a key's x is not an Ed25519 key", code=Code.JWKS_INVALID
                ) from None
            if jwk.get("kid", jwk_thumbprint(public)) != jwk_thumbprint(public):
                raise AgentSafeError("a key's kid is not its thumbprint", code=Code.JWKS_INVALID)
            publics.append(public)
        return cls(publics)

    def get(self, kid: str) -> Ed25519PublicKey | None:
        return self._keys.get(kid)

    @property
    def kids(self) -> tuple[str, ...]:
        return tuple(self._keys)

    def jwks(self) -> dict[str, Any]:
        """The document served at ``GET /.well-known/agentsafe-grant-jwks.json``."""
        return {"keys": [_jwk(public, kid) for kid, public in self._keys.items()]}


def sign_jws(payload: Mapping[str, Any], *, typ: str, key: SigningKey) -> str:
    """Sign ``payload`` (canonical JSON) as a compact JWS with ``typ`` and the key's ``kid``."""
    header = {"alg": ALGORITHM, "typ": typ, "kid": key.kid}
    return sign_compact(header, canonical_json(dict(payload)), key._key)


def verify_jws(token: str, *, typ: str, keys: KeySet) -> dict[str, Any]:
    """Verify a compact JWS and return its payload; raises :class:`TokenRefused`."""
    compact = split_compact(token, max_length=MAX_TOKEN_LENGTH)
    header = compact.header
    if header.get("alg") != ALGORITHM:
        raise TokenRefused("only EdDSA is accepted", code=Code.JWS_ALGORITHM_REFUSED)
    if set(header) != _HEADER_KEYS:
        raise TokenRefused("header carries unexpected fields", code=Code.JWS_MALFORMED)
    _require_canonical(header, compact.header_bytes, what="header")
    if header.get("typ") != typ:
        raise TokenRefused("token is of another type", code=Code.JWS_TYPE_MISMATCH)
    kid = header.get("kid")
    public = keys.get(kid) if isinstance(kid, str) else None
    if public is None:
        raise TokenRefused("token names an unknown key", code=Code.JWS_KEY_UNKNOWN)
    if len(compact.signature) != 64:
        raise TokenRefused("signature has the wrong length", code=Code.JWS_SIGNATURE_INVALID)
    verify_compact(compact, public, algorithms=(ALGORITHM,))
    _require_canonical(compact.payload, compact.payload_bytes, what="payload")
    return compact.payload


def own_payload(token: str) -> dict[str, Any]:
    """The payload of a token this process made with :func:`sign_jws`, read as
    :func:`verify_jws` reads it, without checking its signature again.

    Only for a token its caller knows it signed itself (the exact text :func:`sign_jws`
    returned, held in memory since, under a key still in the caller's :class:`KeySet`): every
    check :func:`verify_jws` makes then holds by construction, and the Ed25519 verification is
    most of its cost (issue 34: 222 us against 32 us). Never for a token that came from outside
    the process."""
    return split_compact(token, max_length=MAX_TOKEN_LENGTH).payload


def _require_canonical(value: dict[str, Any], data: bytes, *, what: str) -> None:
    try:
        same = canonical_json(value) == data
    except CanonicalizationError:
        same = False
    if not same:
        raise TokenRefused(f"{what} is not canonical JSON", code=Code.JWS_MALFORMED)
