"""The RFC 9421 base builder and parser, cross-checked against http-message-signatures."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import http_message_signatures as hms
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from http_message_signatures import algorithms

from agentsafe.executor.clock import SystemClock
from agentsafe.executor.egress.credentials import SignedRequestCredential
from agentsafe.executor.egress.httpsig import (
    SignatureError,
    SignatureParams,
    content_digest,
    parse_content_digest,
    parse_signature,
    parse_signature_input,
    signature_base,
)


@dataclass
class StandInSecret:
    """Test stand-in for a secrets.py handle."""

    name: str
    value: bytes

    @contextlib.contextmanager
    def reveal(self) -> Iterator[bytearray]:
        yield bytearray(self.value)


def test_base_matches_the_specification_layout() -> None:
    params = SignatureParams(
        components=("@method", "@path", "content-digest", "idempotency-key"),
        created=1800000000,
        keyid="k1",
        alg="ed25519",
    )
    base = signature_base(
        params,
        method="POST",
        path="/v1/t",
        headers={"content-digest": content_digest(b""), "idempotency-key": "i-1"},
    )
    assert base.decode() == (
        '"@method": POST\n'
        '"@path": /v1/t\n'
        '"content-digest": sha-256=:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=:\n'
        '"idempotency-key": i-1\n'
        '"@signature-params": ("@method" "@path" "content-digest" "idempotency-key")'
        ';created=1800000000;keyid="k1";alg="ed25519"'
    )


def test_parse_round_trip() -> None:
    params = SignatureParams(components=("@method", "x-a"), created=5, keyid="k", alg="hmac-sha256")
    header = f'other=("@method");created=1, agentsafe={params.serialize()}'
    assert parse_signature_input(header) == params
    assert parse_signature("agentsafe=:AAEC:, x=:AA==:") == b"\x00\x01\x02"
    assert parse_content_digest("sha-512=:AA==:, sha-256=:AQ==:") == {
        "sha-512": b"\0",
        "sha-256": b"\1",
    }


@pytest.mark.parametrize(
    ("header", "code"),
    [
        ('sig1=("@method");created=1;keyid="k";alg="ed25519"', "SIGNATURE_MISSING"),
        ('agentsafe=("@method");created=1;keyid="k"', "SIGNATURE_MALFORMED"),
        (
            'agentsafe=("@method");created=1;keyid="k";alg="rsa-pss-sha512"',
            "SIGNATURE_ALGORITHM_UNSUPPORTED",
        ),
        (
            'agentsafe=("@method" "@method");created=1;keyid="k";alg="ed25519"',
            "SIGNATURE_MALFORMED",
        ),
        ('agentsafe=("@query");created=1;keyid="k";alg="ed25519"', "SIGNATURE_MALFORMED"),
        ('agentsafe=("@method";req);created=1;keyid="k";alg="ed25519"', "SIGNATURE_MALFORMED"),
        ('agentsafe=("@method");created=1.5;keyid="k";alg="ed25519"', "SIGNATURE_MALFORMED"),
        (
            'agentsafe=("@method");created=1;created=2;keyid="k";alg="ed25519"',
            "SIGNATURE_MALFORMED",
        ),
        ('agentsafe=("@method");created=1;keyid="k";alg="ed25519",', "SIGNATURE_MALFORMED"),
        ('agentsafe=("@method");created=1;keyid="k;alg="ed25519"', "SIGNATURE_MALFORMED"),
        ('agentsafe=(@method);created=1;keyid="k";alg="ed25519"', "SIGNATURE_MALFORMED"),
        ("agentsafe=:AA==:", "SIGNATURE_MALFORMED"),
        ("", "SIGNATURE_MISSING"),
    ],
)
def test_signature_input_strictness(header: str, code: str) -> None:
    with pytest.raises(SignatureError) as info:
        parse_signature_input(header)
    assert info.value.code == code


@pytest.mark.parametrize(
    "value", ["agentsafe=:A:", "agentsafe=:AA=A:", 'agentsafe="AA=="', "agentsafe=:AA=="]
)
def test_signature_strictness(value: str) -> None:
    with pytest.raises(SignatureError):
        parse_signature(value)


def test_base_refuses_values_it_cannot_carry() -> None:
    params = SignatureParams(
        components=("@method", "@path", "x-a"), created=1, keyid="k", alg="ed25519"
    )
    for method, path, value in [
        ("post", "/a", "v"),
        ("POST", "a", "v"),
        ("POST", "/a?q", "v"),
        ("POST", "/a", "v\nx"),
        ("POST", "/a", ""),
        ("POST", "/a", " v"),
    ]:
        with pytest.raises(SignatureError):
            signature_base(params, method=method, path=path, headers={"x-a": value})
    with pytest.raises(SignatureError) as info:
        signature_base(params, method="POST", path="/a", headers={})
    assert info.value.code == "HEADER_MISSING"


@pytest.mark.parametrize("alg", ["ed25519", "hmac-sha256"])
async def test_maintained_library_verifies_our_signatures(alg: str) -> None:
    key = Ed25519PrivateKey.generate()
    if alg == "ed25519":
        secret = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        algorithm, public = algorithms.ED25519, key.public_key()
    else:
        secret = b"k" * 32
        algorithm, public = algorithms.HMAC_SHA256, secret
    credential = SignedRequestCredential(
        key_id="k1", signing_key=StandInSecret("k", secret), algorithm=alg, clock=SystemClock()
    )  # type: ignore[arg-type]
    body = b'{"amount":1}'
    headers = await credential.headers_for(
        method="POST",
        url="https://bank.test/v1/t?x=1",
        body=body,
        idempotency_key="i",
        intent_hash="sha256:ab",
        grant_id="g",
        decision_id="d",
        attestation="a.b.c",
    )
    verifier = hms.HTTPMessageVerifier(
        signature_algorithm=algorithm,
        key_resolver=hms.MappingKeyResolver(public_keys={"k1": public}, private_keys={}),
    )
    message = SimpleNamespace(
        method="POST", url="https://bank.test/v1/t?x=1", headers=dict(headers)
    )
    [result] = verifier.verify(
        message,
        body=body,
        require_components=(
            "@method",
            "@path",
            "content-digest",
            "idempotency-key",
            "x-agent-safe-intent-hash",
            "x-agent-safe-grant-id",
            "x-agent-safe-decision-id",
            "x-agent-safe-claim-attestation",
        ),
    )
    assert result.label == "agentsafe"
    message.headers["idempotency-key"] = "other"
    with pytest.raises(hms.HTTPMessageSignaturesException):
        verifier.verify(message, body=body)


# -- the received parameter order (issue 16) --------------------------------------------------


def _signed_in_order(order: tuple[str, ...], *, created: int) -> tuple[dict[str, str], bytes, Any]:
    """A request signed by hand, the way a conforming signer writing ``order`` would."""
    import base64 as b64

    key = Ed25519PrivateKey.generate()
    body = b'{"amount":1}'
    headers = {
        "content-digest": content_digest(body),
        "idempotency-key": "i-1",
        "x-agent-safe-intent-hash": "sha256:" + "ab" * 32,
    }
    components = (
        "@method",
        "@path",
        "content-digest",
        "idempotency-key",
        "x-agent-safe-intent-hash",
    )
    values = {"created": str(created), "keyid": '"k1"', "alg": '"ed25519"'}
    inner = " ".join(f'"{c}"' for c in components)
    params = f"({inner})" + "".join(f";{name}={values[name]}" for name in order)
    lines = [
        '"@method": GET',
        '"@path": /payouts/i-1',
        *(f'"{name}": {headers[name]}' for name in components[2:]),
        f'"@signature-params": {params}',
    ]
    signature = key.sign("\n".join(lines).encode())
    headers["signature-input"] = f"agentsafe={params}"
    headers["signature"] = "agentsafe=:" + b64.b64encode(signature).decode() + ":"
    return headers, body, key.public_key()


@pytest.mark.parametrize(
    "order",
    [
        ("created", "keyid", "alg"),
        ("alg", "keyid", "created"),
        ("keyid", "created", "alg"),
        ("alg", "created", "keyid"),
    ],
)
def test_a_signature_is_verified_in_the_parameter_order_it_was_received(
    order: tuple[str, ...],
) -> None:
    import time

    from agentsafe.executor.provider import MemorySeenStore, verify_provider_request

    now = int(time.time())
    headers, body, public = _signed_in_order(order, created=now)
    params = parse_signature_input(headers["signature-input"])
    assert params.order == order
    assert params.serialize() == headers["signature-input"].removeprefix("agentsafe=")
    verdict = verify_provider_request(
        method="GET",
        path="/payouts/i-1",
        headers=headers,
        body=body,
        keys={"k1": public},
        authority_jwks={},
        now=now,
        seen_store=MemorySeenStore(),
        required_components=params.components,
    )
    assert (verdict.accepted, verdict.code) == (True, "VERIFIED")


def test_the_order_is_part_of_what_was_signed() -> None:
    """Rebuilding in another order than received is another base: it must not verify."""
    import time

    from agentsafe.executor.provider import MemorySeenStore, verify_provider_request

    now = int(time.time())
    headers, body, public = _signed_in_order(("alg", "keyid", "created"), created=now)
    headers["signature-input"] = headers["signature-input"].replace(
        ';alg="ed25519";keyid="k1";created=' + str(now),
        ";created=" + str(now) + ';keyid="k1";alg="ed25519"',
    )
    verdict = verify_provider_request(
        method="GET",
        path="/payouts/i-1",
        headers=headers,
        body=body,
        keys={"k1": public},
        authority_jwks={},
        now=now,
        seen_store=MemorySeenStore(),
        required_components=(),
    )
    assert verdict.code == "SIGNATURE_INVALID"


def test_the_order_must_name_each_parameter_once() -> None:
    with pytest.raises(SignatureError):
        SignatureParams(
            components=("@method",), created=1, keyid="k", alg="ed25519", order=("created", "alg")
        ).validate()


def test_our_signer_writes_created_keyid_alg() -> None:
    params = SignatureParams(components=("@method",), created=1, keyid="k", alg="ed25519")
    assert params.serialize() == '("@method");created=1;keyid="k";alg="ed25519"'
