"""The built-in authority's finalization: the effect record and the receipt it is handed.

The receipt is verified against the provider keys registered with the authority (the real
``ProviderKeys`` from the policy's ``providerKeys``, receipts signed by the provider library),
reported whether or not it verifies, read as SIGNED_RECEIPT evidence when it states the expected
effect, and never a reason for the finalization to fail.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agentsafe.executor.canonical import sha256_digest
from agentsafe.executor.clock import ManualClock
from agentsafe.executor.effects.receipts import ProviderKeys
from agentsafe.executor.grants import SigningKey
from agentsafe.executor.jws import b64url_encode
from agentsafe.executor.policy.authority import Claim, Finalization, LocalAuthority
from agentsafe.executor.provider import sign_effect_receipt
from tests.policy.test_authority import PROPOSER, FakeUseStore, intent, policy

BANK_KEY = Ed25519PrivateKey.generate()
EFFECT = sha256_digest({"type": "SEPA_CREDIT_TRANSFER", "amountMinor": 12500})


def _public(key: Ed25519PrivateKey) -> str:
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return b64url_encode(raw)


KEYS = ProviderKeys.from_entries(
    [{"kid": "bank-1", "issuer": "bank", "publicKey": _public(BANK_KEY)}]
)


class Exploding:
    """A verifier that fails in a way nobody planned for."""

    def check(self, receipt: str, *, grant_id: str, claim_token_digest: str | None) -> Any:
        raise RuntimeError("the verifier broke")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


async def claimed(authority: LocalAuthority, clock: ManualClock) -> Claim:
    subject = intent(clock)
    decision = await authority.evaluate(subject, principal=PROPOSER)
    assert decision.grant is not None
    return await authority.claim(decision.grant, intent=subject)


def receipt_for(claim: Claim, **overrides: Any) -> str:
    args: dict[str, Any] = {
        "attestation": {
            "sub": claim.grant_id,
            "decision_id": claim.decision_id,
            "claim_token_digest": claim.claim_token_digest,
        },
        "status": "POSTED",
        "key": BANK_KEY,
        "kid": "bank-1",
        "issuer": "bank",
        "effect_digest": EFFECT,
    }
    args.update(overrides)
    return sign_effect_receipt(**args)


def record(**overrides: Any) -> dict[str, Any]:
    effect: dict[str, Any] = {
        "grant_id": "g",
        "authorised_effect_digest": EFFECT,
        "observed_effect_digest": EFFECT,
        "record_digest": sha256_digest({"the": "record"}),
    }
    effect.update(overrides)
    return effect


def authority(
    clock: ManualClock, receipts: Any = KEYS, seen: list[Finalization] | None = None
) -> LocalAuthority:
    async def finalizer(claim: Claim, finalization: Finalization) -> None:
        if seen is not None:
            seen.append(finalization)

    return LocalAuthority(
        policy(),
        keys=SigningKey.generate(),
        store=FakeUseStore(),
        clock=clock,
        receipts=receipts,
        finalizer=finalizer,
    )


async def test_a_verified_receipt_stating_the_expected_effect_is_signed_receipt_evidence(
    clock: ManualClock,
) -> None:
    seen: list[Finalization] = []
    local = authority(clock, seen=seen)
    claim = await claimed(local, clock)
    token = receipt_for(claim)
    effect = record()
    finalized = await local.finalize(
        claim, outcome="COMPLETED", executed=True, effect=effect, effect_receipt=token
    )
    assert finalized.status == "RECORDED"
    assert finalized.effect_report == {
        "effect_evidence": "SIGNED_RECEIPT",
        "record_digest": effect["record_digest"],
        "receipt": "VERIFIED",
        "receipt_digest": "sha256:" + hashlib.sha256(token.encode("ascii")).hexdigest(),
        "receipt_reason": None,
    }
    # The finalizer (what the authority records) is handed the record and the receipt verbatim.
    [recorded] = seen
    assert recorded.effect == effect
    assert recorded.effect_receipt == token
    assert recorded.effect_report == finalized.effect_report


async def test_a_verified_receipt_of_another_effect_leaves_the_observation_as_evidence(
    clock: ManualClock,
) -> None:
    local = authority(clock)
    claim = await claimed(local, clock)
    finalized = await local.finalize(
        claim,
        outcome="COMPLETED",
        executed=True,
        effect=record(),
        effect_receipt=receipt_for(claim, effect_digest=sha256_digest({"amountMinor": 1})),
    )
    assert finalized.effect_report["receipt"] == "VERIFIED"
    assert finalized.effect_report["effect_evidence"] == "OBSERVATION"
    # A silent receipt (no effect digest) verifies and is not effect evidence either.
    silent = await local.finalize(
        claim,
        outcome="COMPLETED",
        executed=True,
        effect=record(),
        effect_receipt=receipt_for(claim, effect_digest=None),
    )
    assert (silent.effect_report["receipt"], silent.effect_report["effect_evidence"]) == (
        "VERIFIED",
        "OBSERVATION",
    )


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (
            lambda claim: receipt_for(claim, key=Ed25519PrivateKey.generate()),
            "EFFECT_RECEIPT_INVALID",
        ),
        (lambda claim: receipt_for(claim, kid="unknown"), "EFFECT_RECEIPT_INVALID"),
        (lambda claim: "not-a-jws", "EFFECT_RECEIPT_INVALID"),
        (lambda claim: "a.b.c" * 5000, "EFFECT_RECEIPT_INVALID"),
        (lambda claim: receipt_for(claim, issuer="impostor"), "EFFECT_RECEIPT_ISSUER_MISMATCH"),
        (
            lambda claim: sign_effect_receipt(
                attestation={"sub": "another-grant", "claim_token_digest": None},
                status="POSTED",
                key=BANK_KEY,
                kid="bank-1",
                issuer="bank",
                effect_digest=EFFECT,
            ),
            "EFFECT_RECEIPT_GRANT_MISMATCH",
        ),
    ],
)
async def test_a_receipt_that_does_not_verify_is_recorded_and_never_fails_the_finalization(
    clock: ManualClock, make: Any, reason: str
) -> None:
    local = authority(clock)
    claim = await claimed(local, clock)
    token = make(claim)
    finalized = await local.finalize(
        claim, outcome="COMPLETED", executed=True, effect=record(), effect_receipt=token
    )
    assert finalized.status == "RECORDED"
    report = finalized.effect_report
    assert (report["receipt"], report["receipt_reason"], report["effect_evidence"]) == (
        "UNVERIFIED",
        reason,
        "OBSERVATION",
    )
    assert report["receipt_digest"] == (
        "sha256:" + hashlib.sha256(token.encode("utf-8")).hexdigest()
    )


async def test_a_verifier_that_breaks_or_is_missing_never_fails_the_finalization(
    clock: ManualClock,
) -> None:
    for receipts in (Exploding(), None):
        local = authority(clock, receipts=receipts)
        claim = await claimed(local, clock)
        finalized = await local.finalize(
            claim,
            outcome="DEFINITELY_NOT_EXECUTED",
            executed=False,
            effect=record(),
            effect_receipt=receipt_for(claim, status="REFUSED", effect_digest=None),
        )
        assert finalized.status == "RECORDED"
        assert finalized.effect_report["receipt"] == "UNVERIFIED"
        assert finalized.effect_report["receipt_reason"] == "EFFECT_RECEIPT_INVALID"


async def test_without_effect_evidence_the_report_says_none(clock: ManualClock) -> None:
    local = authority(clock)
    claim = await claimed(local, clock)
    finalized = await local.finalize(claim, outcome="UNKNOWN_AFTER_DISPATCH", executed=None)
    assert finalized.effect_report == {
        "effect_evidence": "NONE",
        "record_digest": None,
        "receipt": "ABSENT",
        "receipt_digest": None,
        "receipt_reason": None,
    }
    assert (finalized.effect, finalized.effect_receipt) == (None, None)
