"""Signers, verifiers and the signed envelope approvals and receipts travel in.

A host supplies a :class:`Signer`/:class:`Verifier` carrying an ``algorithm`` and ``key_id``
and receiving canonical JSON bytes; it can be backed by a KMS, an HSM or a remote signing
service. :class:`Ed25519Signer`/:class:`Ed25519Verifier` ship (``EdDSA``, key id = RFC 7638
thumbprint).

An envelope is ``{"type", "algorithm", "keyId", "payload", "signature"}``. The signature covers
the RFC 8785 canonical JSON of everything but ``signature``, so the type, algorithm and key id
are signed too. The envelope's identity (:func:`envelope_digest`) is the SHA-256 of that same
signed content, so a second valid signature over the same content (possible with some
algorithms) is the same approval, never a fresh one. A verifier accepts an envelope only when
its configured algorithm and key id equal the envelope's.

Callers: ``approval.py``, ``receipts.py``, ``execute.py``, ``service.py``.
Also imported by ``assembly.py``, ``__init__.py``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ..canonical import canonical_json, sha256_digest
from ..codes import Code
from ..grants import (
    ALGORITHM,
    SigningKey,
    TokenRefused,
    b64url_decode,
    b64url_encode,
    jwk_thumbprint,
)
from .errors import AgentSafetyError
from .shapes import obj, text
from .snapshot import FrozenDict

__all__ = [
    "APPROVAL_TYPE",
    "RECEIPT_TYPE",
    "CapturedSigner",
    "CapturedVerifier",
    "Ed25519Signer",
    "Ed25519Verifier",
    "Signer",
    "Verifier",
    "capture_signer",
    "capture_verifier",
    "envelope_digest",
    "signed_content",
]

APPROVAL_TYPE = "agentsafe.plan-approval/1"
RECEIPT_TYPE = "agentsafe.plan-receipt/1"
MAX_SIGNATURE_BYTES = 1024


class Signer(Protocol):
    """Signs canonical JSON bytes; ``algorithm`` and ``key_id`` name what it produces."""

    @property
    def algorithm(self) -> str: ...

    @property
    def key_id(self) -> str: ...

    async def sign(self, message: bytes) -> bytes: ...


class Verifier(Protocol):
    """Verifies signatures made by one configured algorithm and key."""

    @property
    def algorithm(self) -> str: ...

    @property
    def key_id(self) -> str: ...

    async def verify(self, message: bytes, signature: bytes) -> bool: ...


class Ed25519Signer:
    """An in-process Ed25519 signer over a :class:`~agentsafe.executor.grants.SigningKey`."""

    algorithm = ALGORITHM

    def __init__(self, key: SigningKey) -> None:
        self._key = key
        self.key_id = key.kid

    async def sign(self, message: bytes) -> bytes:
        return self._key.sign(message)

    def verifier(self) -> Ed25519Verifier:
        return Ed25519Verifier(self._key.public_key)

    def __repr__(self) -> str:
        return f"Ed25519Signer(key_id={self.key_id!r})"


class Ed25519Verifier:
    """Verifies Ed25519 signatures of one public key (key id = its thumbprint)."""

    algorithm = ALGORITHM

    def __init__(self, public_key: Ed25519PublicKey) -> None:
        self._public = public_key
        self.key_id = jwk_thumbprint(public_key)

    async def verify(self, message: bytes, signature: bytes) -> bool:
        try:
            self._public.verify(signature, message)
        except InvalidSignature:
            return False
        return True


@dataclass(frozen=True)
class CapturedSigner:
    """A signer's identity and bound method, read once before the first await."""

    algorithm: str
    key_id: str
    sign: Callable[[bytes], Awaitable[bytes]]


@dataclass(frozen=True)
class CapturedVerifier:
    algorithm: str
    key_id: str
    verify: Callable[[bytes, bytes], Awaitable[bool]]


def _key_identity(holder: object, what: str, code: Code) -> tuple[str, str]:
    try:
        algorithm = holder.algorithm  # type: ignore[attr-defined]
        key_id = holder.key_id  # type: ignore[attr-defined]
    except Exception:
        raise AgentSafetyError(f"the {what} has no algorithm or key id", code=code) from None
    text(algorithm, f"{what}.algorithm", code=code, max_length=64)
    text(key_id, f"{what}.key_id", code=code, max_length=256)
    return algorithm, key_id


def capture_signer(signer: object, what: str = "signer") -> CapturedSigner:
    algorithm, key_id = _key_identity(signer, what, Code.SIGNER_INVALID)
    sign = getattr(signer, "sign", None)
    if not callable(sign):
        raise AgentSafetyError(f"the {what} cannot sign", code=Code.SIGNER_INVALID)
    return CapturedSigner(algorithm, key_id, sign)


def capture_verifier(verifier: object, what: str = "verifier") -> CapturedVerifier:
    algorithm, key_id = _key_identity(verifier, what, Code.VERIFIER_INVALID)
    verify = getattr(verifier, "verify", None)
    if not callable(verify):
        raise AgentSafetyError(f"the {what} cannot verify", code=Code.VERIFIER_INVALID)
    return CapturedVerifier(algorithm, key_id, verify)


def unsigned(type_: str, algorithm: str, key_id: str, payload: Any) -> dict[str, Any]:
    return {"type": type_, "algorithm": algorithm, "keyId": key_id, "payload": payload}


def signed_content(envelope: FrozenDict) -> dict[str, Any]:
    """The part of an envelope its signature covers (everything but ``signature``)."""
    return {key: value for key, value in envelope.items() if key != "signature"}


def envelope_digest(envelope: Any) -> str:
    """The identity of an envelope: SHA-256 of its signed content."""
    return sha256_digest({k: v for k, v in envelope.items() if k != "signature"})


def check_signature_bytes(signature: object, code: Code) -> bytes:
    if type(signature) is not bytes or not 0 < len(signature) <= MAX_SIGNATURE_BYTES:
        raise AgentSafetyError("the signer returned no usable signature", code=code)
    return signature


_ENVELOPE_CODES = {
    "APPROVAL": (Code.APPROVAL_MALFORMED, Code.APPROVAL_KEY_MISMATCH),
    "RECEIPT": (Code.RECEIPT_MALFORMED, Code.RECEIPT_KEY_MISMATCH),
}


def read_envelope(
    value: Any, *, type_: str, verifier: CapturedVerifier, prefix: Literal["APPROVAL", "RECEIPT"]
) -> tuple[FrozenDict, FrozenDict, bytes, bytes]:
    """Check an envelope's shape and key identity; return (envelope, payload, message,
    signature). ``prefix`` is ``APPROVAL`` or ``RECEIPT`` (codes ``<prefix>_MALFORMED``,
    ``<prefix>_KEY_MISMATCH``)."""
    malformed, key_mismatch = _ENVELOPE_CODES[prefix]
    envelope = obj(
        value,
        prefix.lower(),
        code=malformed,
        required=frozenset({"type", "algorithm", "keyId", "payload", "signature"}),
    )
    if envelope["type"] != type_:
        raise AgentSafetyError(f"the {prefix.lower()} is of another type", code=malformed)
    algorithm = text(envelope["algorithm"], "algorithm", code=malformed, max_length=64)
    key_id = text(envelope["keyId"], "keyId", code=malformed, max_length=256)
    if algorithm != verifier.algorithm or key_id != verifier.key_id:
        raise AgentSafetyError(
            f"the {prefix.lower()} was signed with another algorithm or key",
            code=key_mismatch,
        )
    raw_signature = envelope["signature"]
    if type(raw_signature) is not str or len(raw_signature) > 2 * MAX_SIGNATURE_BYTES:
        raise AgentSafetyError("the signature is not base64url", code=malformed)
    try:
        signature = b64url_decode(raw_signature)
    except TokenRefused:
        raise AgentSafetyError("the signature is not base64url", code=malformed) from None
    if not signature:
        raise AgentSafetyError("the signature is empty", code=malformed)
    payload = envelope["payload"]
    if type(payload) is not FrozenDict:
        raise AgentSafetyError("the payload is not an object", code=malformed)
    message = canonical_json(signed_content(envelope))
    return envelope, payload, message, signature


def encode_signature(signature: bytes) -> str:
    return b64url_encode(signature)


__all__ += [
    "CapturedSigner",
    "CapturedVerifier",
    "capture_signer",
    "capture_verifier",
]
