"""Compact JWS (RFC 7515): the one implementation every signed token in agentsafe goes through.

The executor signs grants, escalation objects, recovery references and claim attestations
(``grants.py``), private_key_jwt client assertions (``egress/credentials.py``); a provider signs
effect receipts (``provider.py``); the executor verifies its own tokens, workload tokens
(``door/workload.py``) and a provider verifies attestations (``provider.py``). All of it is here,
over PyJWT, a maintained JOSE library: the JWA algorithms (signing, the ``r || s`` form of ECDSA
signatures, RSA-PSS, the verification itself and its minimum key lengths) are the library's,
always under an explicit algorithm allowlist.

What this module adds around the library, and why:

* :func:`split_compact` reads the three segments strictly before the library sees the token
  (the one base64 rule, ``base64url.py``):
  exactly three unpadded segments of the base64url alphabet, each the canonical spelling of its
  bytes (non-zero trailing bits are a second spelling of the same bytes, and two verifiers that
  disagree on them disagree on what was signed); a header and payload that are I-JSON objects
  (``canonical.parse_json``: no duplicate members, no ``NaN``/``Infinity`` constants); no
  ``crit`` and no ``b64`` header (no extension is supported, so none may be critical, and a
  detached or unencoded payload is never what we sign).
* :func:`verify_compact` hands the library's algorithm the signing input and signature that
  :func:`split_compact` read, instead of the whole token to ``PyJWS.decode_complete``, which
  would split, decode and parse it a second time, more leniently (about 35 us of a grant's
  110 us verification, issue 34). Everything that path checks on a token
  :func:`split_compact` admits is checked here the same way, by the same library calls: the
  algorithm named and known (``get_algorithm_by_name``), the key of its type
  (``prepare_key``) and long enough (``check_key_length``, refused as PyJWT's
  ``enforce_minimum_key_length`` refuses it), a ``kid`` that is text, and the signature
  (``verify``). ``tests/test_jws.py`` holds it to ``decode_complete`` by a differential test.
* :func:`sign_compact` builds the signing input from the RFC 8785 form of the header and the
  payload bytes the caller gives, so the bytes signed are exactly the canonical ones, and signs
  with the library's algorithm object.

Each refusal is a :class:`TokenRefused` with its ``JWS_*`` code; callers that answer in their
own vocabulary map it (``JWT_*`` for workload tokens, ``ATTESTATION_*`` for a provider).

Callers: ``grants.py`` (which re-exports :class:`TokenRefused` and ``b64url_*`` for the plan
library), ``door/workload.py``, ``egress/credentials.py``, ``provider.py``.
Also imported by ``effects/adapter.py``, ``effects/receipts.py``, ``tools/synthetic_bank.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from jwt.api_jws import PyJWS
from jwt.exceptions import PyJWTError

from . import base64url
from .canonical import canonical_json, parse_json
from .codes import Code
from .errors import AgentSafeError, CanonicalizationError

__all__ = [
    "MAX_COMPACT_LENGTH",
    "Compact",
    "TokenRefused",
    "b64url_decode",
    "b64url_encode",
    "sign_compact",
    "split_compact",
    "verify_compact",
]

MAX_COMPACT_LENGTH = 16 * 1024
_REFUSED_HEADERS = frozenset({"crit", "b64"})
_JWS = PyJWS()
"""The library's registry of JWA algorithm objects (``get_algorithm_by_name``)."""


class TokenRefused(AgentSafeError, ValueError):
    """A compact JWS refused. Codes: JWS_MALFORMED, JWS_ALGORITHM_REFUSED, JWS_SIGNATURE_INVALID
    here; ``grants.py`` adds JWS_TYPE_MISMATCH and JWS_KEY_UNKNOWN. Also a ``ValueError``, so a
    parser's caller may treat it as malformed input."""

    code = Code.JWS_MALFORMED


b64url_encode = base64url.encode


def b64url_decode(text: str) -> bytes:
    """Unpadded base64url by the one rule every verifier shares (``base64url.decode``: the
    canonical spelling only); anything else is ``JWS_MALFORMED``."""
    try:
        return base64url.decode(text)
    except base64url.NotCanonical:
        raise TokenRefused("a segment is not canonical unpadded base64url") from None


@dataclass(frozen=True)
class Compact:
    """A compact JWS read (not verified): its parsed header and payload and their bytes."""

    token: str
    header: dict[str, Any]
    header_bytes: bytes
    payload: dict[str, Any]
    payload_bytes: bytes
    signature: bytes


def split_compact(token: str, *, max_length: int = MAX_COMPACT_LENGTH) -> Compact:
    """Read a compact JWS strictly (see the module docstring); nothing is verified yet."""
    if not isinstance(token, str) or not token or len(token) > max_length:
        raise TokenRefused("the token is not a compact JWS")
    parts = token.split(".")
    if len(parts) != 3 or not parts[0] or not parts[1]:
        raise TokenRefused("the token is not a compact JWS")
    header_bytes = b64url_decode(parts[0])
    payload_bytes = b64url_decode(parts[1])
    signature = b64url_decode(parts[2])
    header = _object(header_bytes, "header")
    payload = _object(payload_bytes, "payload")
    if _REFUSED_HEADERS.intersection(header):
        raise TokenRefused("the header names an extension that is not supported")
    return Compact(token, header, header_bytes, payload, payload_bytes, signature)


def _object(data: bytes, what: str) -> dict[str, Any]:
    try:
        value = parse_json(data)
    except (ValueError, CanonicalizationError, RecursionError):
        raise TokenRefused(f"the {what} is not a JSON object") from None
    if not isinstance(value, dict):
        raise TokenRefused(f"the {what} is not a JSON object")
    result: dict[str, Any] = value
    return result


def verify_compact(compact: Compact, key: Any, *, algorithms: Iterable[str]) -> None:
    """Verify ``compact``'s signature with ``key`` (a ``cryptography`` public key) under the
    allowlist ``algorithms``; raises :class:`TokenRefused`. The header's ``alg`` must be in
    the allowlist before any key is touched."""
    allowed = list(algorithms)
    alg = compact.header.get("alg")
    if not isinstance(alg, str) or alg not in allowed:
        raise TokenRefused(_ALG_REFUSED, code=Code.JWS_ALGORITHM_REFUSED)
    if not isinstance(compact.header.get("kid", ""), str):  # PyJWT's header rule, checked first
        raise TokenRefused(_NOT_VERIFIED, code=Code.JWS_SIGNATURE_INVALID)
    try:
        algorithm = _JWS.get_algorithm_by_name(alg)
    except NotImplementedError:
        raise TokenRefused(_ALG_REFUSED, code=Code.JWS_ALGORITHM_REFUSED) from None
    signing_input = compact.token[: compact.token.rindex(".")].encode("ascii")
    try:
        prepared = algorithm.prepare_key(key)
        verified = not algorithm.check_key_length(prepared) and algorithm.verify(
            signing_input, prepared, compact.signature
        )
    except (PyJWTError, TypeError, ValueError):
        # A key of another type than the algorithm's: PyJWT raises InvalidKeyError for some
        # (an EC key for EdDSA), TypeError or ValueError for others (an Ed25519 key for ES256,
        # bytes that are no key). decode_complete let the last two escape.
        verified = False
    if not verified:
        # A wrong signature, a key of another type, or one too short: either way this key
        # does not verify this token.
        raise TokenRefused(_NOT_VERIFIED, code=Code.JWS_SIGNATURE_INVALID)


_ALG_REFUSED = "the token's algorithm is not accepted"
_NOT_VERIFIED = "the signature does not verify"


def sign_compact(header: Mapping[str, Any], payload: bytes, key: Any) -> str:
    """Sign ``payload`` bytes under the RFC 8785 form of ``header`` (which names ``alg``)."""
    alg = header.get("alg")
    if not isinstance(alg, str) or alg in ("none",) or alg.startswith("HS"):
        raise ValueError("sign_compact signs with an asymmetric algorithm")
    algorithm = _JWS.get_algorithm_by_name(alg)
    signing_input = (
        b64url_encode(canonical_json(dict(header))) + "." + b64url_encode(payload)
    ).encode("ascii")
    signature = algorithm.sign(signing_input, algorithm.prepare_key(key))
    return signing_input.decode("ascii") + "." + b64url_encode(signature)
