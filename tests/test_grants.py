"""Ed25519 compact JWS: round trip, thumbprints, JWKS, and every way a token is refused."""

from __future__ import annotations

import base64
import hashlib
import json
import pickle
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes, hmac, serialization
from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, generate_private_key
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agentsafe.executor.canonical import canonical_json
from agentsafe.executor.errors import AgentSafeError
from agentsafe.executor.grants import (
    KeySet,
    SigningKey,
    TokenRefused,
    b64url_decode,
    b64url_encode,
    jwk_thumbprint,
    sign_jws,
    verify_jws,
)

TYP = "agentsafe-grant+jwt"
PAYLOAD = {"sub": "g-1", "exp": 1800000060, "binding": {"intent_hash": "sha256:00"}}


@pytest.fixture(scope="module")
def key() -> SigningKey:
    return SigningKey.generate()


@pytest.fixture(scope="module")
def keys(key: SigningKey) -> KeySet:
    return KeySet([key])


def segments(token: str) -> list[str]:
    return token.split(".")


def encode(value: Any) -> str:
    return b64url_encode(json.dumps(value, separators=(",", ":"), sort_keys=True).encode())


def refused(token: str, keys: KeySet, *, typ: str = TYP) -> str:
    with pytest.raises(TokenRefused) as info:
        verify_jws(token, typ=typ, keys=keys)
    return info.value.code


def test_round_trip(key: SigningKey, keys: KeySet) -> None:
    token = sign_jws(PAYLOAD, typ=TYP, key=key)
    assert verify_jws(token, typ=TYP, keys=keys) == PAYLOAD
    header = json.loads(b64url_decode(segments(token)[0]))
    assert header == {"alg": "EdDSA", "typ": TYP, "kid": key.kid}
    assert b64url_decode(segments(token)[1]) == canonical_json(PAYLOAD)
    assert "=" not in token


def test_signatures_are_deterministic(key: SigningKey) -> None:
    assert sign_jws(PAYLOAD, typ=TYP, key=key) == sign_jws(dict(PAYLOAD), typ=TYP, key=key)


def test_kid_is_the_rfc7638_thumbprint() -> None:
    # RFC 8037 appendix A.3: the thumbprint of the RFC 8032 test key.
    x = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"
    public = Ed25519PrivateKey.from_private_bytes(
        b64url_decode("nWGxne_9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A")
    ).public_key()
    assert b64url_encode(public.public_bytes_raw()) == x
    assert jwk_thumbprint(public) == "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"


def test_pem_round_trip_keeps_the_kid() -> None:
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    loaded = SigningKey.from_pem(bytearray(pem))
    assert loaded.kid == SigningKey(private).kid
    assert loaded.ephemeral is False
    assert SigningKey.generate().ephemeral is True


@pytest.mark.parametrize(
    "pem",
    [
        b"not a pem",
        generate_private_key(SECP256R1()).private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"pw"),
        ),
    ],
)
def test_bad_pem_is_refused(pem: bytes) -> None:
    with pytest.raises(AgentSafeError) as info:
        SigningKey.from_pem(pem)
    assert info.value.code == "KEY_INVALID"


def test_signing_key_never_shows_itself(key: SigningKey) -> None:
    assert "PRIVATE" not in repr(key)
    assert key.kid in repr(key)
    with pytest.raises(TypeError):
        pickle.dumps(key)


def test_jwks(key: SigningKey, keys: KeySet) -> None:
    document = keys.jwks()
    assert document == {
        "keys": [
            {
                "kty": "OKP",
                "crv": "Ed25519",
                "x": b64url_encode(key.public_key.public_bytes_raw()),
                "kid": key.kid,
                "use": "sig",
                "alg": "EdDSA",
            }
        ]
    }
    assert "d" not in document["keys"][0]
    rebuilt = KeySet.from_jwks(json.loads(json.dumps(document)))
    assert verify_jws(sign_jws(PAYLOAD, typ=TYP, key=key), typ=TYP, keys=rebuilt) == PAYLOAD


@pytest.mark.parametrize(
    "document",
    [
        {},
        {"keys": [{"kty": "RSA", "n": "x", "e": "AQAB"}]},
        {"keys": [{"kty": "OKP", "crv": "X25519", "x": "AAAA"}]},
        {"keys": [{"kty": "OKP", "crv": "Ed25519", "x": "AAAA"}]},
        {"keys": [{"kty": "OKP", "crv": "Ed25519", "alg": "HS256", "x": "AAAA"}]},
    ],
)
def test_bad_jwks_is_refused(document: dict[str, Any]) -> None:
    with pytest.raises(AgentSafeError) as info:
        KeySet.from_jwks(document)
    assert info.value.code == "JWKS_INVALID"


def test_jwks_kid_must_be_the_thumbprint(key: SigningKey) -> None:
    jwk = {**key.public_jwk(), "kid": "chosen-by-attacker"}
    with pytest.raises(AgentSafeError):
        KeySet.from_jwks({"keys": [jwk]})


def test_flipped_payload_byte(key: SigningKey, keys: KeySet) -> None:
    header, payload, signature = segments(sign_jws(PAYLOAD, typ=TYP, key=key))
    raw = bytearray(b64url_decode(payload))
    raw[raw.index(b"g-1")] = ord("h")
    assert refused(f"{header}.{b64url_encode(bytes(raw))}.{signature}", keys) == (
        "JWS_SIGNATURE_INVALID"
    )


def test_flipped_signature_byte(key: SigningKey, keys: KeySet) -> None:
    header, payload, signature = segments(sign_jws(PAYLOAD, typ=TYP, key=key))
    raw = bytearray(b64url_decode(signature))
    raw[0] ^= 1
    assert refused(f"{header}.{payload}.{b64url_encode(bytes(raw))}", keys) == (
        "JWS_SIGNATURE_INVALID"
    )


def test_alg_none(key: SigningKey, keys: KeySet) -> None:
    payload = segments(sign_jws(PAYLOAD, typ=TYP, key=key))[1]
    header = encode({"alg": "none", "kid": key.kid, "typ": TYP})
    assert refused(f"{header}.{payload}.", keys) == "JWS_ALGORITHM_REFUSED"


def test_hs256_signed_with_the_public_key(key: SigningKey, keys: KeySet) -> None:
    header = encode({"alg": "HS256", "kid": key.kid, "typ": TYP})
    payload = b64url_encode(canonical_json(PAYLOAD))
    mac = hmac.HMAC(key.public_key.public_bytes_raw(), hashes.SHA256())
    mac.update(f"{header}.{payload}".encode())
    token = f"{header}.{payload}.{b64url_encode(mac.finalize())}"
    assert refused(token, keys) == "JWS_ALGORITHM_REFUSED"


def test_signed_by_another_key(keys: KeySet) -> None:
    other = SigningKey.generate()
    assert refused(sign_jws(PAYLOAD, typ=TYP, key=other), keys) == "JWS_KEY_UNKNOWN"


def test_other_key_claiming_our_kid(key: SigningKey, keys: KeySet) -> None:
    other = SigningKey.generate()
    header = encode({"alg": "EdDSA", "kid": key.kid, "typ": TYP})
    payload = b64url_encode(canonical_json(PAYLOAD))
    signature = other.sign(f"{header}.{payload}".encode())
    assert refused(f"{header}.{payload}.{b64url_encode(signature)}", keys) == (
        "JWS_SIGNATURE_INVALID"
    )


def test_wrong_typ(key: SigningKey, keys: KeySet) -> None:
    token = sign_jws(PAYLOAD, typ="agentsafe-escalation+jwt", key=key)
    assert refused(token, keys) == "JWS_TYPE_MISMATCH"


def resign(key: SigningKey, header: bytes, payload: bytes) -> str:
    signing_input = f"{b64url_encode(header)}.{b64url_encode(payload)}"
    return f"{signing_input}.{b64url_encode(key.sign(signing_input.encode()))}"


def test_extra_header_field(key: SigningKey, keys: KeySet) -> None:
    header = canonical_json({"alg": "EdDSA", "kid": key.kid, "typ": TYP, "jku": "https://x"})
    assert refused(resign(key, header, canonical_json(PAYLOAD)), keys) == "JWS_MALFORMED"


def test_header_with_crit_or_missing_kid(key: SigningKey, keys: KeySet) -> None:
    header = canonical_json({"alg": "EdDSA", "typ": TYP})
    assert refused(resign(key, header, canonical_json(PAYLOAD)), keys) == "JWS_MALFORMED"


def test_non_canonical_payload_is_refused_even_when_signed(key: SigningKey, keys: KeySet) -> None:
    header = canonical_json({"alg": "EdDSA", "kid": key.kid, "typ": TYP})
    assert refused(resign(key, header, json.dumps(PAYLOAD).encode()), keys) == "JWS_MALFORMED"
    dup = b'{"sub":"a","sub":"b"}'
    assert refused(resign(key, header, dup), keys) == "JWS_MALFORMED"
    assert refused(resign(key, header, b"[1,2]"), keys) == "JWS_MALFORMED"


def test_padded_or_non_canonical_base64(key: SigningKey, keys: KeySet) -> None:
    header, payload, signature = segments(sign_jws(PAYLOAD, typ=TYP, key=key))
    assert refused(f"{header}.{payload}.{signature}==", keys) == "JWS_MALFORMED"
    std = base64.b64encode(b64url_decode(signature)).decode().rstrip("=")
    if std != signature:
        assert refused(f"{header}.{payload}.{std}", keys) == "JWS_MALFORMED"
    # same bytes, different spelling: the last character's unused bits set
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    last = alphabet.index(signature[-1])
    assert last % 16 == 0  # 64 bytes in 86 characters: the last one has 4 unused bits
    twin = signature[:-1] + alphabet[last | 1]
    assert refused(f"{header}.{payload}.{twin}", keys) == "JWS_MALFORMED"


@pytest.mark.parametrize(
    "token",
    ["", "a.b", "a.b.c.d", "x" * 20000, "...", "eyJ.e30.", "a b.c.d", "€.a.b"],
)
def test_malformed_tokens(token: str, keys: KeySet) -> None:
    assert refused(token, keys) == "JWS_MALFORMED"


def test_signature_of_wrong_length(key: SigningKey, keys: KeySet) -> None:
    header, payload, signature = segments(sign_jws(PAYLOAD, typ=TYP, key=key))
    short = b64url_encode(b64url_decode(signature)[:63])
    assert refused(f"{header}.{payload}.{short}", keys) == "JWS_SIGNATURE_INVALID"


def test_retired_key_still_verifies(key: SigningKey) -> None:
    new = SigningKey.generate()
    rotated = KeySet([new, key])
    assert verify_jws(sign_jws(PAYLOAD, typ=TYP, key=key), typ=TYP, keys=rotated) == PAYLOAD
    assert set(rotated.kids) == {new.kid, key.kid}


def test_thumbprint_is_sha256_of_required_members(key: SigningKey) -> None:
    members = {"crv": "Ed25519", "kty": "OKP", "x": key.public_jwk()["x"]}
    expected = hashlib.sha256(
        json.dumps(members, separators=(",", ":"), sort_keys=True).encode()
    ).digest()
    assert key.kid == b64url_encode(expected)


# Found by mutation testing (docs/mutation.md).


def test_base64url_round_trips_every_byte_and_length() -> None:
    for length in range(0, 7):
        for first in range(256):
            data = bytes([first]) * length
            text = b64url_encode(data)
            assert "=" not in text
            assert b64url_decode(text) == data
    assert b64url_decode("AAAA") == b"\0\0\0"
    for bad in ("A", "AAAAA", "AA=A", "AA+/", "AB"):
        with pytest.raises(TokenRefused) as info:
            b64url_decode(bad)
        assert info.value.code == "JWS_MALFORMED"


def test_token_length_is_bounded_at_16_kib(key: SigningKey, keys: KeySet) -> None:
    from agentsafe.executor.grants import MAX_TOKEN_LENGTH

    assert MAX_TOKEN_LENGTH == 16 * 1024
    token = sign_jws({"pad": "x" * 11_000}, typ=TYP, key=key)
    assert len(token) <= MAX_TOKEN_LENGTH
    assert verify_jws(token, typ=TYP, keys=keys)["pad"] == "x" * 11_000
    long = sign_jws({"pad": "x" * 13_000}, typ=TYP, key=key)
    assert len(long) > MAX_TOKEN_LENGTH
    assert refused(long, keys) == "JWS_MALFORMED"


def test_a_token_refusal_defaults_to_malformed_and_a_key_shows_only_its_kid(
    key: SigningKey,
) -> None:
    assert TokenRefused("x").code == "JWS_MALFORMED"
    assert repr(key) == f"SigningKey(kid={key.kid!r}, ephemeral={key.ephemeral})"


@pytest.mark.parametrize(
    "change", [{"alg": "HS256"}, {"kty": "EC"}, {"crv": "X25519"}, {"kty": None}]
)
def test_a_real_key_with_one_wrong_member_is_refused(
    key: SigningKey, change: dict[str, Any]
) -> None:
    jwk: dict[str, Any] = {**key.public_jwk(), **change}
    with pytest.raises(AgentSafeError) as info:
        KeySet.from_jwks({"keys": [jwk]})
    assert info.value.code == "JWKS_INVALID"
    assert KeySet.from_jwks({"keys": [key.public_jwk()]}).get(key.kid) is not None


def test_a_token_exactly_at_the_bound_verifies(key: SigningKey, keys: KeySet) -> None:
    from agentsafe.executor.grants import MAX_TOKEN_LENGTH

    def token_of(size: int, typ: str) -> str:
        return sign_jws({"pad": "x" * size}, typ=typ, key=key)

    # Unpadded base64 never has a length of 1 mod 4, so the payload alone may step over the
    # bound: a type name of another length moves the header, and one of them lands on it.
    typs = [f"agentsafe-t{'y' * k}+jwt" for k in range(4)]
    size, typ = next(
        (size, typ)
        for typ in typs
        for size in range(12_000, 12_400)
        if len(token_of(size, typ)) == MAX_TOKEN_LENGTH
    )
    token = token_of(size, typ)
    assert len(token) == MAX_TOKEN_LENGTH
    assert verify_jws(token, typ=typ, keys=keys)["pad"] == "x" * size


@pytest.mark.parametrize("token", [b"a.b.c", "", None, 7])
def test_a_token_that_is_not_text_is_malformed(keys: KeySet, token: object) -> None:
    with pytest.raises(TokenRefused) as info:
        verify_jws(token, typ=TYP, keys=keys)  # type: ignore[arg-type]
    assert info.value.code == "JWS_MALFORMED"


def test_the_algorithm_is_checked_before_the_header_form(key: SigningKey, keys: KeySet) -> None:
    header = b64url_encode(b'{ "alg": "none", "typ": "agentsafe-grant+jwt", "kid": "k" }')
    payload = b64url_encode(canonical_json(PAYLOAD))
    assert refused(f"{header}.{payload}.", keys) == "JWS_ALGORITHM_REFUSED"


def test_a_signed_payload_without_a_canonical_form_is_malformed(
    key: SigningKey, keys: KeySet
) -> None:
    header = b64url_encode(canonical_json({"alg": "EdDSA", "kid": key.kid, "typ": TYP}))
    payload = b64url_encode(b'{"n":9007199254740993}')  # no exact double: no RFC 8785 form
    signature = b64url_encode(key.sign(f"{header}.{payload}".encode()))
    assert refused(f"{header}.{payload}.{signature}", keys) == "JWS_MALFORMED"
