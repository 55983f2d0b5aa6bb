"""The provider's verifier and the executor's own verifiers agree on every vector (issue 16).

The provider side is ``provider.verify_provider_request`` (what a system of record runs, and
what the synthetic provider runs when it demands SIGNED_REQUEST). The executor side is an
independent walk of the same procedure over the executor's own primitives: RFC 9421 parsing and
verification (``egress/httpsig.py``), its key decoding (``grants.b64url_decode``) and its JWS
verifier for the attestation (``policy/attestation.verify_claim_attestation`` over
``grants.verify_jws``). Only the verdict (accept or refuse) is compared.

The vectors are every one in ``tests/vectors/provider``, each also with *second spellings* of
its base64 values: the same bytes written with non-zero trailing bits, in the attestation's
three segments, the signature and content-digest byte sequences and the public keys. Before one
rule decoded every base64 value (``base64url.py``), the provider's verifier accepted a second
spelling of the attestation that the executor's JWS verifier refused.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentsafe.executor import provider
from agentsafe.executor.canonical import parse_json, sha256_digest
from agentsafe.executor.egress import httpsig
from agentsafe.executor.errors import AgentSafeError
from agentsafe.executor.grants import KeySet, b64url_decode
from agentsafe.executor.policy.attestation import verify_claim_attestation

VECTORS = sorted((Path(__file__).parent / "vectors" / "provider").glob("*.json"))
_URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
_STD = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def second_spelling(text: str, alphabet: str) -> str | None:
    """The same bytes with a non-zero trailing bit, or None when the spelling has no spare bit."""
    data = text.rstrip("=")
    if len(data) % 4 == 0:
        return None
    last = alphabet.index(data[-1])
    return data[:-1] + alphabet[last | 1] + text[len(data) :]


def _header(vector: dict[str, Any], name: str) -> str | None:
    headers = vector["request"]["headers"]
    items = headers if isinstance(headers, list) else list(headers.items())
    for key, value in items:
        if key.lower() == name:
            return str(value)
    return None


def _set_header(vector: dict[str, Any], name: str, value: str) -> None:
    headers = vector["request"]["headers"]
    if isinstance(headers, list):
        for pair in headers:
            if pair[0].lower() == name:
                pair[1] = value
    else:
        for key in list(headers):
            if key.lower() == name:
                headers[key] = value


def _byte_sequence_variant(member: str) -> Callable[[dict[str, Any]], bool]:
    def mutate(vector: dict[str, Any]) -> bool:
        value = _header(vector, member)
        if value is None:
            return False
        head, sep, rest = value.partition("=:")
        inner, colon, tail = rest.partition(":")
        changed = second_spelling(inner, _STD) if sep and colon else None
        if changed is None:
            return False
        _set_header(vector, member, f"{head}=:{changed}:{tail}")
        return True

    return mutate


def _attestation_variant(segment: int) -> Callable[[dict[str, Any]], bool]:
    def mutate(vector: dict[str, Any]) -> bool:
        token = _header(vector, provider.ATTESTATION_COMPONENT)
        if token is None or token.count(".") != 2:
            return False
        parts = token.split(".")
        changed = second_spelling(parts[segment], _URL)
        if changed is None:
            return False
        parts[segment] = changed
        _set_header(vector, provider.ATTESTATION_COMPONENT, ".".join(parts))
        return True

    return mutate


def _key_variant(where: str) -> Callable[[dict[str, Any]], bool]:
    def mutate(vector: dict[str, Any]) -> bool:
        if where == "authority" and _header(vector, provider.ATTESTATION_COMPONENT) is None:
            return False  # the authority's keys are not read without an attestation
        keys = vector["keys"].values() if where == "keys" else vector["authority_jwks"]["keys"]
        done = False
        for jwk in keys:
            for name in ("x", "k"):
                if isinstance(jwk.get(name), str):
                    changed = second_spelling(jwk[name], _URL)
                    if changed is not None:
                        jwk[name] = changed
                        done = True
        return done

    return mutate


MUTATIONS: dict[str, Callable[[dict[str, Any]], bool]] = {
    "as-is": lambda vector: True,
    "attestation-header": _attestation_variant(0),
    "attestation-payload": _attestation_variant(1),
    "attestation-signature": _attestation_variant(2),
    "signature-bytes": _byte_sequence_variant("signature"),
    "content-digest-bytes": _byte_sequence_variant("content-digest"),
    "executor-key": _key_variant("keys"),
    "authority-key": _key_variant("authority"),
}


def cases() -> Iterator[Any]:
    for path in VECTORS:
        for name, mutate in MUTATIONS.items():
            vector = json.loads(path.read_text())
            if mutate(vector):
                yield pytest.param(vector, name, id=f"{path.stem}:{name}")


class _Refuse(Exception):
    pass


def executor_accepts(vector: dict[str, Any]) -> bool:
    """The procedure over the executor's own primitives (see the module docstring)."""
    request = vector["request"]
    body = str(request.get("body", "")).encode("utf-8")
    raw = request["headers"]
    items = raw if isinstance(raw, list) else list(raw.items())
    headers: dict[str, list[str]] = {}
    for key, value in items:
        headers.setdefault(key.lower(), []).append(str(value).strip(" \t"))

    def one(name: str) -> str:
        values = headers.get(name, [])
        if len(values) != 1:
            raise _Refuse
        return values[0]

    try:
        digests = httpsig.parse_content_digest(one("content-digest"))
        if digests.get("sha-256") != hashlib.sha256(body).digest():
            raise _Refuse
        params = httpsig.parse_signature_input(one("signature-input"))
        signature = httpsig.parse_signature(one("signature"))
        required = vector.get("required_components", provider.ALL_COMPONENTS)
        if any(name not in params.components for name in required):
            raise _Refuse
        covered = {n: one(n) for n in params.components if not n.startswith("@")}
        if abs(float(vector["now"]) - params.created) > float(vector.get("clock_window_s", 300)):
            raise _Refuse
        jwk = vector["keys"].get(params.keyid)
        if not isinstance(jwk, dict):
            raise _Refuse
        key: Any
        if params.alg == "ed25519" and jwk.get("kty") == "OKP":
            from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

            key = Ed25519PublicKey.from_public_bytes(b64url_decode(jwk["x"]))
        elif params.alg == "hmac-sha256" and jwk.get("kty") == "oct":
            key = b64url_decode(jwk["k"])
        else:
            raise _Refuse
        base = httpsig.signature_base(
            params, method=request["method"], path=request["path"], headers=covered
        )
        if not httpsig.verify_base(params.alg, key, base, signature):
            raise _Refuse
        attestation = covered.get(provider.ATTESTATION_COMPONENT)
        if attestation is None:
            if provider.ATTESTATION_COMPONENT in headers:
                raise _Refuse
            return True
        claims = verify_claim_attestation(
            attestation, keys=KeySet.from_jwks(vector["authority_jwks"])
        )
        binding = claims.get("binding") or {}
        if (
            claims.get("sub") != covered.get("x-agent-safe-grant-id")
            or claims.get("decision_id") != covered.get("x-agent-safe-decision-id")
            or binding.get("intent_hash") != covered.get("x-agent-safe-intent-hash")
            or binding.get("execution_payload_canonicalization_profile") != "RFC8785/JCS"
            or binding.get("execution_payload_digest") != sha256_digest(parse_json(body))
            or not float(vector["now"]) < float(claims["exp"])
            or claims.get("sub") in set(vector.get("seen", ()))
        ):
            raise _Refuse
        return True
    except (_Refuse, AgentSafeError, ValueError, KeyError, TypeError):
        return False


@pytest.mark.parametrize(("vector", "mutation"), list(cases()))
def test_the_provider_and_the_executor_agree(vector: dict[str, Any], mutation: str) -> None:
    expected = copy.deepcopy(vector)
    by_provider = provider.run_vector(vector).accepted
    by_executor = executor_accepts(expected)
    assert by_provider is by_executor, (mutation, provider.run_vector(vector).code)
    if mutation == "as-is":
        assert by_provider is (vector["expected"]["verdict"] == "ACCEPT")
    else:
        assert by_provider is False  # a second spelling is never accepted, by either


def test_every_mutation_applies_to_some_vector() -> None:
    applied = {case.values[1] for case in cases()}
    assert applied == set(MUTATIONS)
