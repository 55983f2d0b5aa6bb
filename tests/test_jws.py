"""The one compact JWS implementation (``executor/jws.py``) and the readers that share it.

Grants (``grants.verify_jws``), a provider's attestation check (``provider``), workload tokens
and the signers all go through ``jws``: so the executor and a provider read every token by the
same rule. The differential test mutates a real attestation in the ways two readers commonly
disagree on (non-canonical base64 trailing bits, padding, a duplicate header member, a ``crit``
or ``b64`` header, a foreign alphabet) and requires both readers to refuse each one.
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.api_jws import PyJWS
from jwt.exceptions import InvalidAlgorithmError, PyJWTError

from agentsafe.executor import jws, provider
from agentsafe.executor.codes import Code
from agentsafe.executor.grants import KeySet, SigningKey, TokenRefused, sign_jws, verify_jws
from agentsafe.executor.policy.attestation import ATTESTATION_TYP


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@pytest.mark.parametrize("alg", ["EdDSA", "ES256", "PS256", "RS256"])
def test_sign_and_verify_round_trip_through_the_library(alg: str) -> None:
    key: Any
    if alg == "EdDSA":
        key = ed25519.Ed25519PrivateKey.generate()
    elif alg == "ES256":
        key = ec.generate_private_key(ec.SECP256R1())
    else:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    token = jws.sign_compact({"alg": alg, "typ": "JWT"}, b'{"a":1}', key)
    compact = jws.split_compact(token)
    assert compact.payload == {"a": 1}
    assert compact.header_bytes == b'{"alg":"' + alg.encode() + b'","typ":"JWT"}'  # RFC 8785
    jws.verify_compact(compact, key.public_key(), algorithms=[alg])
    if alg == "ES256":
        assert len(compact.signature) == 64  # JWA's r || s, not DER
    with pytest.raises(TokenRefused) as info:
        jws.verify_compact(compact, key.public_key(), algorithms=["EdDSA" if alg != "EdDSA"
                                                                  else "ES256"])  # fmt: skip
    assert info.value.code == Code.JWS_ALGORITHM_REFUSED


@pytest.mark.parametrize("alg", ["EdDSA", "ES256", "RS256"])
def test_a_key_of_another_type_never_verifies(alg: str) -> None:
    # PyJWT raises InvalidKeyError for some of these, TypeError for others: all are refusals.
    signer: Any = {
        "EdDSA": ed25519.Ed25519PrivateKey.generate,
        "ES256": lambda: ec.generate_private_key(ec.SECP256R1()),
        "RS256": lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048),
    }[alg]()
    token = jws.sign_compact({"alg": alg}, b"{}", signer)
    others = [ec.generate_private_key(ec.SECP256R1()).public_key(),
              ed25519.Ed25519PrivateKey.generate().public_key(), b"no key"]  # fmt: skip
    for other in others:
        if type(other) is type(signer.public_key()):
            continue
        with pytest.raises(TokenRefused) as info:
            jws.verify_compact(jws.split_compact(token), other, algorithms=[alg])
        assert info.value.code == Code.JWS_SIGNATURE_INVALID


def test_symmetric_and_none_are_never_signed() -> None:
    for alg in ("none", "HS256"):
        with pytest.raises(ValueError):
            jws.sign_compact({"alg": alg}, b"{}", b"secret")


@pytest.mark.parametrize(
    "header",
    [{"alg": "EdDSA", "crit": ["exp"]}, {"alg": "EdDSA", "b64": False, "crit": ["b64"]}],
)
def test_extensions_are_refused_before_any_key(header: dict[str, Any]) -> None:
    token = f"{b64(json.dumps(header).encode())}.{b64(b'{}')}.{b64(bytes(64))}"
    with pytest.raises(TokenRefused) as info:
        jws.split_compact(token)
    assert info.value.code == Code.JWS_MALFORMED


def test_b64url_is_canonical() -> None:
    assert jws.b64url_decode("AA") == b"\x00"
    for spelling in ("AB", "AA==", "A", "A+", "A/", "A.", "QQ=", " AA"):
        with pytest.raises(TokenRefused):
            jws.b64url_decode(spelling)


# ----------------------------------------------------------------------------- differential


def attestation(key: SigningKey) -> str:
    return sign_jws({"sub": "g-1", "exp": 4_000_000_000}, typ=ATTESTATION_TYP, key=key)


def trailing_bits(segment: str) -> str:
    """The same bytes spelled with non-zero trailing bits (a second spelling)."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    if len(segment) % 4 == 0:
        return segment  # no trailing bits to flip
    last = alphabet.index(segment[-1])
    return segment[:-1] + alphabet[last | 1]


def mutations(token: str) -> dict[str, str]:
    head, body, sig = token.split(".")
    header = json.loads(base64.urlsafe_b64decode(head + "=="))
    kid, typ = header["kid"], header["typ"]
    twice = f'{{"alg":"EdDSA","alg":"EdDSA","kid":"{kid}","typ":"{typ}"}}'
    out = {
        "signature trailing bits": f"{head}.{body}.{trailing_bits(sig)}",
        "payload trailing bits": f"{head}.{trailing_bits(body)}.{sig}",
        "header trailing bits": f"{trailing_bits(head)}.{body}.{sig}",
        "padded signature": f"{head}.{body}.{sig}==",
        "standard alphabet": f"{head}.{body}.{sig.replace('-', '+').replace('_', '/')}",
        "duplicate alg": b64(twice.encode()) + f".{body}.{sig}",
        "crit header": b64(json.dumps({**header, "crit": ["x"]}).encode()) + f".{body}.{sig}",
        "four segments": f"{token}.{sig}",
    }
    return {name: value for name, value in out.items() if value != token}


def provider_refuses(token: str, jwks: dict[str, Any]) -> bool:
    try:
        compact = provider._decode_jws(token)
        key = provider._authority_key(jwks, compact.header.get("kid"))
        jws.verify_compact(compact, key, algorithms=("EdDSA",))
    except (provider._Refused, TokenRefused):
        return True
    return False


def executor_refuses(token: str, keys: KeySet) -> bool:
    try:
        verify_jws(token, typ=ATTESTATION_TYP, keys=keys)
    except TokenRefused:
        return True
    return False


def test_the_provider_and_the_executor_agree_on_every_mutation() -> None:
    key = SigningKey.generate()
    keys = KeySet([key])
    token = attestation(key)
    assert not executor_refuses(token, keys)
    assert not provider_refuses(token, keys.jwks())
    found = mutations(token)
    assert "signature trailing bits" in found  # a 64-byte signature has trailing bits
    for name, mutated in found.items():
        verdicts = (executor_refuses(mutated, keys), provider_refuses(mutated, keys.jwks()))
        assert verdicts == (True, True), name


# ------------------------------------------------------------- found by mutation testing (#23)


EDDSA_HEADER = b64(b'{"alg":"EdDSA"}')


def _said(call: Any) -> tuple[str, str]:
    with pytest.raises(TokenRefused) as info:
        call()
    return (str(info.value.code), str(info.value))


def _sized(length: int) -> str:
    """A compact JWS of exactly ``length`` characters (read, never verified)."""
    head = EDDSA_HEADER
    for size in range(length):
        for signature in range(4):
            token = f"{head}.{b64(json.dumps({'p': 'x' * size}).encode())}.{b64(bytes(signature))}"
            if len(token) == length:
                return token
    raise AssertionError(length)


def test_the_length_bound_is_16_kib_and_a_token_at_it_is_read() -> None:
    assert jws.MAX_COMPACT_LENGTH == 16 * 1024 == 16384
    assert jws.split_compact(_sized(16384)).header == {"alg": "EdDSA"}
    assert _said(lambda: jws.split_compact(_sized(16385))) == (
        "JWS_MALFORMED",
        "the token is not a compact JWS",
    )
    short = _sized(100)
    assert jws.split_compact(short, max_length=100).token == short
    assert _said(lambda: jws.split_compact(short, max_length=99))[0] == "JWS_MALFORMED"


@pytest.mark.parametrize(
    "token",
    [None, b"a.b.c", "", "e30.e30", "e30.e30.AA.AA", ".e30.AA", "e30..AA"],
    ids=["none", "bytes", "empty", "two", "four", "no header", "no payload"],
)
def test_what_is_not_three_segments_of_text_is_refused(token: Any) -> None:
    assert _said(lambda: jws.split_compact(token)) == (
        "JWS_MALFORMED",
        "the token is not a compact JWS",
    )


def test_an_empty_signature_segment_is_read_and_never_verifies() -> None:
    key = ed25519.Ed25519PrivateKey.generate()
    compact = jws.split_compact(f"{EDDSA_HEADER}.{b64(b'{}')}.")
    assert compact.signature == b""
    with pytest.raises(TokenRefused) as info:
        jws.verify_compact(compact, key.public_key(), algorithms=["EdDSA"])
    assert info.value.code == Code.JWS_SIGNATURE_INVALID


@pytest.mark.parametrize(
    "header",
    [b'{"alg":"EdDSA","crit":["x"]}', b'{"alg":"EdDSA","b64":false}'],
    ids=["crit", "b64"],
)
def test_each_refused_header_alone_is_refused(header: bytes) -> None:
    token = f"{b64(header)}.{b64(b'{}')}.{b64(bytes(64))}"
    assert _said(lambda: jws.split_compact(token)) == (
        "JWS_MALFORMED",
        "the header names an extension that is not supported",
    )


@pytest.mark.parametrize(
    ("header", "payload", "said"),
    [
        (b"[" * 3000 + b"]" * 3000, b"{}", "the header is not a JSON object"),
        (b'{"alg":"EdDSA","alg":"none"}', b"{}", "the header is not a JSON object"),
        (b'{"alg":"\xff"}', b"{}", "the header is not a JSON object"),
        (b'{"alg":"EdDSA"}', b'{"n":NaN}', "the payload is not a JSON object"),
        (b'{"alg":"EdDSA"}', b'"a string"', "the payload is not a JSON object"),
    ],
    ids=["too deep", "duplicate member", "not utf-8", "nan", "not an object"],
)
def test_a_header_or_payload_that_is_no_i_json_object_is_refused(
    header: bytes, payload: bytes, said: str
) -> None:
    token = f"{b64(header)}.{b64(payload)}.{b64(bytes(64))}"
    assert _said(lambda: jws.split_compact(token)) == ("JWS_MALFORMED", said)


def test_a_compact_read_is_frozen() -> None:
    import dataclasses

    compact = jws.split_compact(f"{EDDSA_HEADER}.{b64(b'{}')}.")
    with pytest.raises(dataclasses.FrozenInstanceError):
        compact.token = "x"  # type: ignore[misc]


def test_the_algorithm_refusals_say_so_before_any_key() -> None:
    key = ed25519.Ed25519PrivateKey.generate()
    refused = ("JWS_ALGORITHM_REFUSED", "the token's algorithm is not accepted")
    for header in (b'{"alg":1}', b"{}", b'{"alg":"ES256"}'):
        compact = jws.split_compact(f"{b64(header)}.{b64(b'{}')}.{b64(bytes(64))}")
        assert _said(lambda c=compact: jws.verify_compact(c, key, algorithms=["EdDSA"])) == refused
    # allowed, but no algorithm the library knows: refused as an algorithm, not a signature
    unknown_header = b64(b'{"alg":"XY1"}')
    unknown = jws.split_compact(f"{unknown_header}.{b64(b'{}')}.{b64(bytes(64))}")
    assert _said(lambda: jws.verify_compact(unknown, key, algorithms=("XY1",))) == refused


def test_a_key_below_the_minimum_length_never_verifies() -> None:
    weak = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    token = jws.sign_compact({"alg": "RS256"}, b"{}", weak)  # signed; never accepted
    assert _said(
        lambda: jws.verify_compact(
            jws.split_compact(token), weak.public_key(), algorithms=["RS256"]
        )
    ) == ("JWS_SIGNATURE_INVALID", "the signature does not verify")


@pytest.mark.parametrize("alg", [None, 256, "none", "HS256", "HS512"])
def test_only_an_asymmetric_algorithm_named_in_text_is_signed(alg: Any) -> None:
    with pytest.raises(ValueError) as info:
        jws.sign_compact({"alg": alg}, b"{}", b"secret")
    assert str(info.value) == "sign_compact signs with an asymmetric algorithm"
    assert not isinstance(info.value, TokenRefused)


# verify_compact against the library's whole-token path (issue 34): ``verify_compact`` hands
# PyJWT's algorithm the signing input and signature split_compact read; it used to hand the whole
# token to ``PyJWS.decode_complete``. Every token split_compact admits must get the same answer
# from both, for every key and allowlist: kept, or refused with the same code.
_LIBRARY = PyJWS(options={"verify_signature": True, "enforce_minimum_key_length": True})


def _by_decode_complete(compact: jws.Compact, key: Any, algorithms: list[str]) -> str:
    """The former ``verify_compact``, whole: the allowlist, then ``decode_complete``."""
    alg = compact.header.get("alg")
    if not isinstance(alg, str) or alg not in algorithms:
        return str(Code.JWS_ALGORITHM_REFUSED)
    try:
        _LIBRARY.decode_complete(compact.token, key=key, algorithms=[alg])
    except InvalidAlgorithmError:
        return str(Code.JWS_ALGORITHM_REFUSED)
    except PyJWTError:
        return str(Code.JWS_SIGNATURE_INVALID)
    except (TypeError, ValueError) as exc:
        # The one intended difference: a key of another type than the algorithm's escaped
        # decode_complete as TypeError or ValueError; verify_compact refuses it.
        return f"{type(exc).__name__} -> {Code.JWS_SIGNATURE_INVALID}"
    return "verified"


def _by_verify_compact(compact: jws.Compact, key: Any, algorithms: list[str]) -> str:
    try:
        jws.verify_compact(compact, key, algorithms=algorithms)
    except TokenRefused as exc:
        return str(exc.code)
    return "verified"


def _flip_last(segment: str) -> str:
    data = bytearray(jws.b64url_decode(segment))
    data[-1] ^= 1
    return b64(bytes(data))


def test_verify_compact_answers_as_decode_complete_did_for_every_token_and_key() -> None:
    ed = ed25519.Ed25519PrivateKey.generate()
    p256 = ec.generate_private_key(ec.SECP256R1())
    p384 = ec.generate_private_key(ec.SECP384R1())
    rsa2048 = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    rsa1024 = rsa.generate_private_key(public_exponent=65537, key_size=1024)  # below the minimum
    signers: list[tuple[Any, str]] = [
        (ed, "EdDSA"), (p256, "ES256"), (p384, "ES384"), (rsa2048, "RS256"), (rsa2048, "PS256"),
        (rsa1024, "RS256"),
    ]  # fmt: skip
    public_pem = ed.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    keys = [
        ed.public_key(), p256.public_key(), p384.public_key(), rsa2048.public_key(),
        rsa1024.public_key(), public_pem, b"a shared secret",
    ]  # fmt: skip
    extras: list[dict[str, Any]] = [{}, {"kid": "k-1"}, {"kid": 7}, {"kid": None}, {"typ": "JWT"}]
    tokens: list[str] = []
    for private, alg in signers:
        for extra in extras:
            token = jws.sign_compact({"alg": alg, **extra}, b'{"a":1}', private)
            head, payload, signature = token.split(".")
            other_payload = b64(b'{"a":2}')
            tokens += [
                token,
                f"{head}.{payload}.{_flip_last(signature)}",  # the signature altered
                f"{head}.{other_payload}.{signature}",  # the payload swapped
                f"{head}.{payload}.{b64(jws.b64url_decode(signature)[:10])}",  # cut short
            ]
    for extra in extras:  # an algorithm allowed, but not one the library knows
        tokens.append(f"{b64(json.dumps({'alg': 'XY1', **extra}).encode())}.{b64(b'{}')}.AAAA")
    seen: Counter[str] = Counter()
    for token in tokens:
        compact = jws.split_compact(token)
        alg = compact.header["alg"]
        for key in keys:
            for algorithms in ([alg], [alg, "EdDSA"], ["EdDSA"]):
                before = _by_decode_complete(compact, key, algorithms)
                expected = before.rpartition(" -> ")[2]
                assert _by_verify_compact(compact, key, algorithms) == expected, (
                    compact.header, algorithms, type(key).__name__, before
                )  # fmt: skip
                seen[before] += 1
    # Every answer was compared, and the corpus reaches every outcome of the former path.
    assert sum(seen.values()) == len(tokens) * len(keys) * 3
    assert set(seen) == {
        "verified",
        str(Code.JWS_SIGNATURE_INVALID),
        str(Code.JWS_ALGORITHM_REFUSED),
        f"TypeError -> {Code.JWS_SIGNATURE_INVALID}",
        f"ValueError -> {Code.JWS_SIGNATURE_INVALID}",
    }
