"""Effect receipts (VP-3): every comparison, with receipts signed by the provider library."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agentsafe.executor.canonical import canonical_json, sha256_digest
from agentsafe.executor.effects.receipts import ProviderKeys, ReceiptComparison
from agentsafe.executor.errors import ConfigError
from agentsafe.executor.jws import b64url_encode, sign_compact
from agentsafe.executor.provider import sign_effect_receipt

KEY = Ed25519PrivateKey.generate()
EFFECT = sha256_digest({"type": "SEPA_CREDIT_TRANSFER", "amountMinor": 100})
CLAIM = "sha256:" + "ab" * 32


def public(key: Ed25519PrivateKey) -> str:
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return b64url_encode(raw)


KEYS = ProviderKeys.from_entries([{"kid": "bank-1", "issuer": "bank", "publicKey": public(KEY)}])


def receipt(**overrides: Any) -> str:
    args: dict[str, Any] = {
        "attestation": {"sub": "grant-1", "decision_id": "d-1", "claim_token_digest": CLAIM},
        "status": "EFFECTED",
        "key": KEY,
        "kid": "bank-1",
        "issuer": "bank",
        "effect_digest": EFFECT,
    }
    args.update(overrides)
    return sign_effect_receipt(**args)


def wrong_typ() -> str:
    """A receipt's claims and key under another ``typ`` (a claim attestation's, say)."""
    header = {"alg": "EdDSA", "typ": "agentsafe-claim-attestation+jwt", "kid": "bank-1"}
    claims = {"iss": "bank", "sub": "grant-1", "claim_token_digest": CLAIM, "status": "EFFECTED"}
    return sign_compact(header, canonical_json(claims), KEY)


def compare(token: str | None, **overrides: Any) -> Any:
    args: dict[str, Any] = {
        "grant_id": "grant-1",
        "claim_token_digest": CLAIM,
        "provider_committed": True,
        "authorised_digest": EFFECT,
        "observed_digest": EFFECT,
    }
    args.update(overrides)
    return KEYS.compare(token, **args)


def test_absent_silent_and_match() -> None:
    assert compare(None).comparison is ReceiptComparison.ABSENT
    silent = compare(receipt(effect_digest=None))
    assert silent.comparison is ReceiptComparison.SILENT
    assert silent.status == "EFFECTED"
    match = compare(receipt())
    assert match.comparison is ReceiptComparison.MATCH
    assert str(match.digest).startswith("sha256:")
    # Without an observation the authorised digest alone decides.
    assert compare(receipt(), observed_digest=None).comparison is ReceiptComparison.MATCH


@pytest.mark.parametrize(
    ("token", "overrides", "reason"),
    [
        (lambda: receipt(key=Ed25519PrivateKey.generate()), {}, "EFFECT_RECEIPT_INVALID"),
        (lambda: receipt(kid="other"), {}, "EFFECT_RECEIPT_INVALID"),
        (lambda: "not.a.jws", {}, "EFFECT_RECEIPT_INVALID"),
        (lambda: receipt(issuer="someone-else"), {}, "EFFECT_RECEIPT_ISSUER_MISMATCH"),
        (lambda: receipt(), {"grant_id": "grant-2"}, "EFFECT_RECEIPT_GRANT_MISMATCH"),
        (
            lambda: receipt(),
            {"claim_token_digest": "sha256:" + "cd" * 32},
            "EFFECT_RECEIPT_CLAIM_MISMATCH",
        ),
        (lambda: receipt(status="REFUSED"), {}, "EFFECT_RECEIPT_STATUS_MISMATCH"),
        (lambda: receipt(), {"provider_committed": False}, "EFFECT_RECEIPT_STATUS_MISMATCH"),
        (
            lambda: receipt(effect_digest=sha256_digest({"x": 1})),
            {},
            "EFFECT_RECEIPT_DIGEST_MISMATCH",
        ),
        (lambda: wrong_typ(), {}, "EFFECT_RECEIPT_INVALID"),
        (
            lambda: receipt(),
            {"observed_digest": sha256_digest({"amountMinor": 1000})},
            "EFFECT_RECEIPT_DIGEST_MISMATCH",
        ),
    ],
)
def test_every_disagreement_is_a_mismatch(
    token: Any, overrides: dict[str, Any], reason: str
) -> None:
    reading = compare(token(), **overrides)
    assert reading.comparison is ReceiptComparison.MISMATCH
    assert reading.reason == reason


def test_a_refusal_receipt_matches_a_refusal() -> None:
    reading = compare(receipt(status="REFUSED", effect_digest=None), provider_committed=False)
    assert reading.comparison is ReceiptComparison.SILENT


def test_a_provider_key_that_is_not_ed25519_is_refused_at_start() -> None:
    with pytest.raises(ConfigError):
        ProviderKeys.from_entries([{"kid": "k", "issuer": "i", "publicKey": "AAAA"}])


def test_check_is_the_one_verification_the_authority_reads() -> None:
    good = KEYS.check(receipt(), grant_id="grant-1", claim_token_digest=CLAIM)
    assert (good.verified, good.status, good.effect_digest, good.reason) == (
        True,
        "EFFECTED",
        EFFECT,
        None,
    )
    token = receipt()
    assert KEYS.check(token, grant_id="grant-1", claim_token_digest=CLAIM).digest == (
        "sha256:" + hashlib.sha256(token.encode("ascii")).hexdigest()
    )
    other = KEYS.check(receipt(), grant_id="grant-2", claim_token_digest=CLAIM)
    assert (other.verified, other.reason) == (False, "EFFECT_RECEIPT_GRANT_MISMATCH")
    forged = KEYS.check(
        receipt(key=Ed25519PrivateKey.generate()), grant_id="grant-1", claim_token_digest=CLAIM
    )
    assert (forged.verified, forged.reason) == (False, "EFFECT_RECEIPT_INVALID")
    # Without an attested claim, the claim is not compared (nothing to compare it with).
    assert KEYS.check(receipt(), grant_id="grant-1", claim_token_digest=None).verified
