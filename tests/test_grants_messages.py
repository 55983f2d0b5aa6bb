"""What each refusal of ``grants.py`` says: the code, and a message that names the part of the
token or key that failed (an operator reads it in an incident), never its content.

These pin the words on purpose: a refusal that named the wrong part (``header`` for the payload)
would send an operator after the wrong half of a token. Found by mutation testing (issue 23).
"""

from __future__ import annotations

import base64
import json
import pickle
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, generate_private_key

from agentsafe.executor.canonical import canonical_json
from agentsafe.executor.errors import AgentSafeError
from agentsafe.executor.grants import (
    KeySet,
    SigningKey,
    TokenRefused,
    b64url_decode,
    b64url_encode,
    jwk_thumbprint,
)
from agentsafe.executor.grants import verify_jws as verify

TYP = "agentsafe-grant+jwt"
KEY = SigningKey.generate()
KEYS = KeySet([KEY])


def token(header: Any, payload: Any, *, raw_header: bytes | None = None) -> str:
    head = raw_header if raw_header is not None else canonical_json(header)
    body = payload if isinstance(payload, bytes) else canonical_json(payload)
    signing_input = b64url_encode(head) + "." + b64url_encode(body)
    return signing_input + "." + b64url_encode(KEY.sign(signing_input.encode()))


HEADER = {"alg": "EdDSA", "typ": TYP, "kid": KEY.kid}


def refusal(call: Any) -> tuple[str, str]:
    with pytest.raises((TokenRefused, AgentSafeError, TypeError)) as caught:
        call()
    exc = caught.value
    return (getattr(exc, "code", "TypeError"), str(exc))


@pytest.mark.parametrize("text", ["a*", "a", "AB"])
def test_a_segment_refusal_names_the_one_base64_rule(text: str) -> None:
    # a foreign character, an impossible length and non-zero trailing bits all break the one
    # rule (executor/base64url.py): the canonical unpadded spelling
    assert refusal(lambda: b64url_decode(text)) == (
        "JWS_MALFORMED",
        "a segment is not canonical unpadded base64url",
    )


def test_a_key_refusal_says_what_is_wrong_with_the_key() -> None:
    ec = generate_private_key(SECP256R1()).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    assert refusal(lambda: SigningKey.from_pem(b"not a pem")) == (
        "KEY_INVALID",
        "not an unencrypted PKCS#8 PEM private key",
    )
    assert refusal(lambda: SigningKey.from_pem(ec)) == (
        "KEY_INVALID",
        "the signing key must be Ed25519",
    )
    assert refusal(lambda: SigningKey.from_pem(unknown_algorithm_pem())) == (
        "KEY_INVALID",
        "unsupported private key",
    )
    assert refusal(lambda: pickle.dumps(KEY)) == ("TypeError", "a signing key cannot be pickled")


def unknown_algorithm_pem() -> bytes:
    """A well-formed PKCS#8 key of an algorithm nobody knows (OID 1.2.3.4): cryptography raises
    UnsupportedAlgorithm, not ValueError."""
    oid = bytes([0x06, 0x03, 0x2A, 0x03, 0x04])
    body = bytes([0x02, 0x01, 0x00, 0x30, len(oid)]) + oid + bytes([0x04, 0x02, 0x04, 0x00])
    der = bytes([0x30, len(body)]) + body
    return (
        b"-----BEGIN PRIVATE KEY-----\n" + base64.b64encode(der) + b"\n-----END PRIVATE KEY-----\n"
    )


def test_a_jwks_refusal_says_which_rule() -> None:
    jwk = KEY.public_jwk()
    cases = [
        ({"keys": 1}, "a JWKS has a keys array"),
        ({"keys": [{**jwk, "kty": "RSA"}]}, "only Ed25519 OKP keys are accepted"),
        ({"keys": [{**jwk, "x": "AA"}]}, "a key's x is not an Ed25519 key"),
        ({"keys": [{**jwk, "kid": "other"}]}, "a key's kid is not its thumbprint"),
    ]
    for document, message in cases:
        assert refusal(lambda d=document: KeySet.from_jwks(d)) == ("JWKS_INVALID", message)
    assert KeySet.from_jwks({"keys": [jwk]}).kids == (jwk_thumbprint(KEY.public_key),)


def test_a_token_refusal_names_the_part_that_failed() -> None:
    good = token(HEADER, {"sub": "g"})
    head, payload, signature = good.split(".")
    other = SigningKey.generate()
    cases = [
        ("", "JWS_MALFORMED", "the token is not a compact JWS"),
        ("a.b", "JWS_MALFORMED", "the token is not a compact JWS"),
        (token(None, {}, raw_header=b"{"), "JWS_MALFORMED", "the header is not a JSON object"),
        (token([1], {}), "JWS_MALFORMED", "the header is not a JSON object"),
        (token({**HEADER, "alg": "HS256"}, {}), "JWS_ALGORITHM_REFUSED", "only EdDSA is accepted"),
        (token({**HEADER, "x": 1}, {}), "JWS_MALFORMED", "header carries unexpected fields"),
        (
            token(None, {}, raw_header=json.dumps(HEADER).encode()),
            "JWS_MALFORMED",
            "header is not canonical JSON",
        ),
        (token({**HEADER, "typ": "other"}, {}), "JWS_TYPE_MISMATCH", "token is of another type"),
        (
            token({**HEADER, "kid": other.kid}, {}),
            "JWS_KEY_UNKNOWN",
            "token names an unknown key",
        ),
        (
            f"{head}.{payload}.{b64url_encode(b'short')}",
            "JWS_SIGNATURE_INVALID",
            "signature has the wrong length",
        ),
        (
            f"{head}.{payload}.{b64url_encode(bytes(64))}",
            "JWS_SIGNATURE_INVALID",
            "the signature does not verify",
        ),
        (token(HEADER, b"[1]"), "JWS_MALFORMED", "the payload is not a JSON object"),
        (token(HEADER, b'{"a": 1}'), "JWS_MALFORMED", "payload is not canonical JSON"),
    ]
    for text, code, message in cases:
        assert refusal(lambda t=text: verify(t, typ=TYP, keys=KEYS)) == (code, message), message
    assert signature
