"""The provider's side: verify a signed agentsafe request, and sign an effect receipt.

Role: what a downstream system of record runs to refuse a forged instruction. It checks the
RFC 9421 signature the ``SIGNED_REQUEST`` credential put on a request, then the authority's claim
attestation inside it, then that the attestation is presented once within its lease
(``docs/verifying-provider.md`` states the procedure and ``tests/vectors/provider`` holds vectors).

This module imports only the standard library, ``cryptography``, PyJWT (through ``jws``, the one
compact JWS implementation, so the provider and the executor read a token by the same rule) and
agentsafe's own ``canonical``, ``jws``, ``httpsig``, ``errors`` and ``codes`` modules (the refusal
codes are the registry's), never aiohttp or the server, so a provider can use (or vendor) it
alone.

Callers: providers; ``cli.py`` (``agentsafe verify provider-request <vector>``, through
:func:`main`).
Also imported by ``tools/synthetic_bank.py`` and ``tools/synthetic_credentials.py`` (the dev
tools); the serving process never imports it (an import contract).
"""

from __future__ import annotations

import base64
import hashlib
import json
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .canonical import canonical_json, parse_json, sha256_digest
from .codes import Code
from .egress.httpsig import (
    ATTESTATION_COMPONENT,
    SignatureError,
    parse_content_digest,
    parse_signature,
    parse_signature_input,
    signature_base,
    verify_base,
)
from .errors import CanonicalizationError
from .jws import Compact, TokenRefused, b64url_decode, sign_compact, split_compact, verify_compact

__all__ = [
    "ALL_COMPONENTS",
    "ATTESTATION_TYP",
    "EFFECT_RECEIPT_TYP",
    "MemorySeenStore",
    "ProviderVerdict",
    "SeenStore",
    "main",
    "sign_effect_receipt",
    "verify_provider_request",
]

ATTESTATION_TYP = "agentsafe-claim-attestation+jwt"
EFFECT_RECEIPT_TYP = "agentsafe-effect-receipt+jwt"
CANONICALIZATION_PROFILE = "RFC8785/JCS"
ALL_COMPONENTS: tuple[str, ...] = (
    "@method",
    "@path",
    "content-digest",
    "idempotency-key",
    "x-agent-safe-intent-hash",
    "x-agent-safe-grant-id",
    "x-agent-safe-decision-id",
    "x-agent-safe-claim-attestation",
)
"""What a system of record that effects anything requires the signature to cover."""

DEFAULT_CLOCK_WINDOW_S = 300.0
_MAX_TOKEN = 16 * 1024


class SeenStore(Protocol):
    """Remembers presented attestations (their ``sub``) for as long as they could be valid."""

    def first_presentation(self, sub: str, *, until: float, now: float) -> bool:
        """Record ``sub`` until ``until``; True only the first time within that lease."""
        ...


class MemorySeenStore:
    """An in-process :class:`SeenStore`; a provider with several replicas needs a shared one."""

    def __init__(self, seen: Iterable[str] = ()) -> None:
        self._until: dict[str, float] = {sub: float("inf") for sub in seen}
        self._lock = threading.Lock()

    def first_presentation(self, sub: str, *, until: float, now: float) -> bool:
        with self._lock:
            for key in [k for k, v in self._until.items() if v < now]:
                del self._until[key]
            if sub in self._until:
                return False
            self._until[sub] = until
            return True


@dataclass(frozen=True)
class ProviderVerdict:
    """The answer: ``accepted`` with what was proven, or refused with one stable ``code``."""

    accepted: bool
    code: str
    keyid: str | None = None
    components: tuple[str, ...] = ()
    grant_id: str | None = None
    decision_id: str | None = None
    attestation: Mapping[str, Any] | None = field(default=None, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {
            "verdict": "ACCEPT" if self.accepted else "REFUSE",
            "code": self.code,
            "keyid": self.keyid,
            "grant_id": self.grant_id,
            "decision_id": self.decision_id,
        }


class _Refused(Exception):
    def __init__(self, code: Code) -> None:
        super().__init__(code)
        self.code = code


def _ed25519_from_jwk(jwk: Mapping[str, Any]) -> Ed25519PublicKey:
    if jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519" or not isinstance(jwk.get("x"), str):
        raise ValueError("not an Ed25519 public JWK")
    raw = b64url_decode(jwk["x"])
    if len(raw) != 32:
        raise ValueError("wrong key length")
    return Ed25519PublicKey.from_public_bytes(raw)


def _signing_key(alg: str, key: Any) -> Ed25519PublicKey | bytes:
    """Turn a configured key (JWK, public key object, or HMAC bytes) into what ``alg`` needs."""
    if isinstance(key, Mapping):
        if alg == "ed25519":
            return _ed25519_from_jwk(key)
        if alg == "hmac-sha256" and key.get("kty") == "oct" and isinstance(key.get("k"), str):
            return b64url_decode(key["k"])
        raise ValueError("key does not match the algorithm")
    if alg == "ed25519" and isinstance(key, Ed25519PublicKey):
        return key
    if alg == "hmac-sha256" and isinstance(key, bytes | bytearray):
        return bytes(key)
    raise ValueError("key does not match the algorithm")


def _headers_lower(headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    items = headers.items() if isinstance(headers, Mapping) else headers
    out: dict[str, list[str]] = {}
    for name, value in items:
        out.setdefault(name.lower(), []).append(value.strip(" \t"))
    return out


def _single(headers: dict[str, list[str]], name: str, missing: Code) -> str:
    values = headers.get(name)
    if not values:
        raise _Refused(missing)
    if len(values) != 1:
        raise _Refused(Code.HEADER_DUPLICATED)
    return values[0]


def verify_provider_request(
    *,
    method: str,
    path: str,
    headers: Mapping[str, str] | Iterable[tuple[str, str]],
    body: bytes,
    keys: Mapping[str, Any],
    authority_jwks: Mapping[str, Any],
    now: float,
    seen_store: SeenStore,
    clock_window_s: float = DEFAULT_CLOCK_WINDOW_S,
    required_components: Iterable[str] = ALL_COMPONENTS,
) -> ProviderVerdict:
    """Run the whole verifying-provider procedure over one received request.

    ``headers`` may be a mapping or a list of pairs (a repeated covered header is refused).
    ``keys`` maps each key id issued to the executor to its key: an Ed25519 public JWK or
    ``Ed25519PublicKey`` for ``ed25519``, an ``oct`` JWK or raw bytes for ``hmac-sha256``.
    ``authority_jwks`` is the authority's published JWKS. The attestation is verified whenever
    it is required or present; a refused request records nothing in ``seen_store``.
    """
    try:
        return _verify(
            method=method,
            path=path,
            headers=_headers_lower(headers),
            body=body,
            keys=keys,
            authority_jwks=authority_jwks,
            now=now,
            seen_store=seen_store,
            clock_window_s=clock_window_s,
            required=tuple(required_components),
        )
    except _Refused as refused:
        return ProviderVerdict(accepted=False, code=refused.code)


def _verify(
    *,
    method: str,
    path: str,
    headers: dict[str, list[str]],
    body: bytes,
    keys: Mapping[str, Any],
    authority_jwks: Mapping[str, Any],
    now: float,
    seen_store: SeenStore,
    clock_window_s: float,
    required: tuple[str, ...],
) -> ProviderVerdict:
    # 1. the content digest matches the body received.
    digest_header = _single(headers, "content-digest", Code.CONTENT_DIGEST_MISSING)
    try:
        digests = parse_content_digest(digest_header)
    except SignatureError as exc:
        raise _Refused(Code.CONTENT_DIGEST_MALFORMED) from exc
    if "sha-256" not in digests:
        raise _Refused(Code.CONTENT_DIGEST_MALFORMED)
    if digests["sha-256"] != hashlib.sha256(body).digest():
        raise _Refused(Code.CONTENT_DIGEST_MISMATCH)

    # 2. the signature input and its parameters.
    try:
        params = parse_signature_input(_single(headers, "signature-input", Code.SIGNATURE_MISSING))
        signature = parse_signature(_single(headers, "signature", Code.SIGNATURE_MISSING))
    except SignatureError as exc:
        raise _Refused(exc.code) from exc

    # 3. every required component is covered.
    if any(name not in params.components for name in required):
        raise _Refused(Code.COMPONENT_NOT_COVERED)

    # 4. every covered header is present once; the base carries exactly the received values.
    covered: dict[str, str] = {}
    for name in params.components:
        if not name.startswith("@"):
            covered[name] = _single(headers, name, Code.HEADER_MISSING)

    # 5. created is inside the clock window.
    if abs(now - params.created) > clock_window_s:
        raise _Refused(Code.CREATED_OUT_OF_WINDOW)

    # 6. the key id names a key issued to the executor, of the algorithm the input names.
    if params.keyid not in keys:
        raise _Refused(Code.KEY_UNKNOWN)
    try:
        key = _signing_key(params.alg, keys[params.keyid])
    except ValueError as exc:
        raise _Refused(Code.SIGNATURE_ALGORITHM_MISMATCH) from exc

    # 7. the signature over the base.
    try:
        base = signature_base(params, method=method, path=path, headers=covered)
        valid = verify_base(params.alg, key, base, signature)
    except SignatureError as exc:
        raise _Refused(exc.code) from exc
    if not valid:
        raise _Refused(Code.SIGNATURE_INVALID)

    grant_id = covered.get("x-agent-safe-grant-id")
    decision_id = covered.get("x-agent-safe-decision-id")
    attestation_claims: Mapping[str, Any] | None = None
    if ATTESTATION_COMPONENT in params.components:
        attestation_claims = _verify_attestation(
            token=covered[ATTESTATION_COMPONENT],
            covered=covered,
            body=body,
            authority_jwks=authority_jwks,
            now=now,
            seen_store=seen_store,
        )
    elif ATTESTATION_COMPONENT in headers:
        # Present but not signed over: never ignore it, never trust it.
        raise _Refused(Code.COMPONENT_NOT_COVERED)
    return ProviderVerdict(
        accepted=True,
        code=Code.VERIFIED,
        keyid=params.keyid,
        components=params.components,
        grant_id=grant_id,
        decision_id=decision_id,
        attestation=attestation_claims,
    )


def _decode_jws(token: str) -> Compact:
    try:
        return split_compact(token, max_length=_MAX_TOKEN)
    except TokenRefused as exc:
        raise _Refused(Code.ATTESTATION_MALFORMED) from exc


def _authority_key(jwks: Mapping[str, Any], kid: Any) -> Ed25519PublicKey:
    keys = jwks.get("keys")
    if not isinstance(kid, str) or not isinstance(keys, list):
        raise _Refused(Code.ATTESTATION_KEY_UNKNOWN)
    for jwk in keys:
        if isinstance(jwk, Mapping) and jwk.get("kid") == kid:
            try:
                return _ed25519_from_jwk(jwk)
            except ValueError as exc:
                raise _Refused(Code.ATTESTATION_KEY_UNKNOWN) from exc
    raise _Refused(Code.ATTESTATION_KEY_UNKNOWN)


def _verify_attestation(
    *,
    token: str,
    covered: Mapping[str, str],
    body: bytes,
    authority_jwks: Mapping[str, Any],
    now: float,
    seen_store: SeenStore,
) -> Mapping[str, Any]:
    compact = _decode_jws(token)
    header, payload = compact.header, compact.payload
    if header.get("alg") != "EdDSA":
        raise _Refused(Code.ATTESTATION_ALGORITHM_INVALID)
    if header.get("typ") != ATTESTATION_TYP:
        raise _Refused(Code.ATTESTATION_TYPE_INVALID)
    key = _authority_key(authority_jwks, header.get("kid"))
    try:
        verify_compact(compact, key, algorithms=("EdDSA",))
    except TokenRefused as exc:
        raise _Refused(Code.ATTESTATION_SIGNATURE_INVALID) from exc

    binding = payload.get("binding")
    if not isinstance(binding, dict):
        raise _Refused(Code.ATTESTATION_MALFORMED)
    sub = payload.get("sub")
    if not isinstance(sub, str) or sub != covered.get("x-agent-safe-grant-id"):
        raise _Refused(Code.ATTESTATION_GRANT_MISMATCH)
    if payload.get("decision_id") != covered.get("x-agent-safe-decision-id"):
        raise _Refused(Code.ATTESTATION_DECISION_MISMATCH)
    if binding.get("intent_hash") != covered.get("x-agent-safe-intent-hash"):
        raise _Refused(Code.ATTESTATION_INTENT_MISMATCH)
    if binding.get("execution_payload_canonicalization_profile") != CANONICALIZATION_PROFILE:
        raise _Refused(Code.ATTESTATION_PROFILE_UNSUPPORTED)
    if binding.get("execution_payload_digest") != _payload_digest(body):
        raise _Refused(Code.ATTESTATION_PAYLOAD_MISMATCH)
    exp = payload.get("exp")
    if isinstance(exp, bool) or not isinstance(exp, int | float):
        raise _Refused(Code.ATTESTATION_MALFORMED)
    if now >= exp:
        raise _Refused(Code.ATTESTATION_EXPIRED)
    if not seen_store.first_presentation(sub, until=float(exp), now=now):
        raise _Refused(Code.ATTESTATION_REPLAYED)
    return payload


def _payload_digest(body: bytes) -> str | None:
    """``sha256:`` + hex of the RFC 8785 form of the received body, or None if it is not JSON."""
    try:
        return sha256_digest(parse_json(body))
    except (UnicodeDecodeError, ValueError, CanonicalizationError, RecursionError):
        return None


def sign_effect_receipt(
    *,
    attestation: Mapping[str, Any],
    status: str,
    key: Ed25519PrivateKey,
    kid: str,
    issuer: str,
    effect_digest: str | None = None,
    now: float | None = None,
) -> str:
    """The provider's signed effect receipt for ``x-agent-safe-effect-receipt``.

    ``attestation`` is the verified attestation payload (``ProviderVerdict.attestation``); the
    receipt names its grant (``sub``), decision and ``claim_token_digest``, and says what the
    provider did: ``status`` (e.g. ``EFFECTED``, ``REFUSED``) and, when it can state one, the
    digest of the effect it applied.
    """
    issued = int(time.time() if now is None else now)
    payload: dict[str, Any] = {
        "iss": issuer,
        "sub": attestation["sub"],
        "decision_id": attestation.get("decision_id"),
        "claim_token_digest": attestation.get("claim_token_digest"),
        "status": status,
        "iat": issued,
    }
    if effect_digest is not None:
        payload["effect_digest"] = effect_digest
    header = {"alg": "EdDSA", "typ": EFFECT_RECEIPT_TYP, "kid": kid}
    return sign_compact(header, canonical_json(payload), key)


# --- vectors and the CLI ---------------------------------------------------------------------


def run_vector(vector: Mapping[str, Any]) -> ProviderVerdict:
    """Run one JSON test vector (``tests/vectors/provider``) through the procedure."""
    request = vector["request"]
    if "body_base64" in request:
        body = base64.b64decode(request["body_base64"])
    else:
        body = str(request.get("body", "")).encode("utf-8")
    headers = request["headers"]
    pairs = [tuple(pair) for pair in headers] if isinstance(headers, list) else headers
    return verify_provider_request(
        method=request["method"],
        path=request["path"],
        headers=pairs,
        body=body,
        keys=vector["keys"],
        authority_jwks=vector["authority_jwks"],
        now=float(vector["now"]),
        clock_window_s=float(vector.get("clock_window_s", DEFAULT_CLOCK_WINDOW_S)),
        required_components=vector.get("required_components", ALL_COMPONENTS),
        seen_store=MemorySeenStore(vector.get("seen", ())),
    )


def main(argv: list[str] | None = None) -> int:
    """``agentsafe verify provider-request <vector.json>...``: 0 when every verdict is expected.

    ``argv`` is the arguments after ``provider-request``. Prints one JSON line per vector.
    Exit status: 0 all as expected, 1 a verdict differed, 2 a vector could not be read.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "provider-request":
        args = args[1:]
    if not args:
        print("usage: agentsafe verify provider-request <vector.json>...", file=sys.stderr)
        return 2
    status = 0
    for name in args:
        try:
            vector = json.loads(Path(name).read_text(encoding="utf-8"))
            verdict = run_vector(vector)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(json.dumps({"vector": name, "error": type(exc).__name__}), file=sys.stderr)
            return 2
        expected = vector.get("expected", {})
        actual = verdict.as_dict()
        ok = expected.get("verdict") == actual["verdict"] and expected.get("code") == verdict.code
        print(json.dumps({"vector": name, **actual, "as_expected": ok}, sort_keys=True))
        if not ok:
            status = 1
    return status


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
