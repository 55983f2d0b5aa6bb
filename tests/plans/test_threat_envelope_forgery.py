"""Threat: envelope forgery -- an approval the reviewer never signed must not authorize."""

from __future__ import annotations

from typing import Any

import pytest

from agentsafe.executor.grants import b64url_decode, b64url_encode
from agentsafe.executor.plans import AgentSafetyError, verify_agent_step_authorization

from . import support as s
from .conftest import World


async def _verify(world: World, approval: Any, verifier: Any = None) -> Any:
    return await verify_agent_step_authorization(
        dry_run=world.dry_run,
        policy=world.policy,
        approval=approval,
        verifier=verifier or world.approver.verifier(),
        step_id="query-incidents",
        context=s.context(),
        now=s.NOW,
        max_clock_skew_ms=5_000,
    )


async def _refused(world: World, approval: Any, verifier: Any = None) -> str:
    with pytest.raises(AgentSafetyError) as caught:
        await _verify(world, approval, verifier)
    return caught.value.code


async def test_genuine_approval_verifies(world: World) -> None:
    assert (await _verify(world, world.approval))["approvalId"] == "approval-42"


async def test_signed_by_another_key(world: World) -> None:
    # The attacker signs the same request with their own key and presents it as the reviewer's.
    forged = await World(world.store, s.signer(), world.receipt_signer).approve()
    assert await _refused(world, forged) == "APPROVAL_KEY_MISMATCH"


async def test_other_key_relabelled_with_the_reviewers_key_id(world: World) -> None:
    attacker = World(world.store, s.signer(), world.receipt_signer)
    forged = s.deep(await attacker.approve())
    forged["keyId"] = world.approver.key_id
    assert await _refused(world, forged) == "APPROVAL_SIGNATURE_INVALID"


@pytest.mark.parametrize("algorithm", ["none", "HS256", "eddsa", ""])
async def test_algorithm_substitution(world: World, algorithm: str) -> None:
    forged = s.deep(world.approval)
    forged["algorithm"] = algorithm
    assert await _refused(world, forged) in {"APPROVAL_KEY_MISMATCH", "APPROVAL_MALFORMED"}


async def test_payload_edited_after_signing(world: World) -> None:
    for path, value in [
        (("payload", "steps", 0, "maxRows"), 199),
        (("payload", "expiresAt"), "2026-07-11T20:05:00.000Z"),
        (("payload", "approver"), "someone-else@example.test"),
        (("payload", "id"), "approval-43"),
    ]:
        forged = s.deep(world.approval)
        target = forged
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        assert await _refused(world, forged) == "APPROVAL_SIGNATURE_INVALID", path


async def test_signature_bit_flips_and_truncation(world: World) -> None:
    raw = b64url_decode(world.approval["signature"])
    for bad in (bytes([raw[0] ^ 1]) + raw[1:], raw[:-1], raw + b"\0", b"\0" * 64):
        forged = s.deep(world.approval)
        forged["signature"] = b64url_encode(bad)
        assert await _refused(world, forged) == "APPROVAL_SIGNATURE_INVALID"


async def test_malformed_envelopes(world: World) -> None:
    base = s.deep(world.approval)
    cases: list[Any] = [
        {k: v for k, v in base.items() if k != "signature"},
        {**base, "extra": 1},
        {**base, "type": "agentsafe.plan-receipt/1"},
        {**base, "signature": world.approval["signature"] + "="},
        {**base, "signature": "!!!"},
        {**base, "payload": "x"},
        [base],
    ]
    for case in cases:
        assert await _refused(world, case) in {"APPROVAL_MALFORMED", "JSON_TYPE_REFUSED"}


async def test_receipt_cannot_stand_in_for_an_approval(world: World) -> None:
    result = await world.execute()
    forged = s.deep(result.receipt)
    assert await _refused(world, forged, world.receipt_signer.verifier()) == "APPROVAL_MALFORMED"


async def test_verifier_that_returns_truthy_non_bool_is_not_trusted(world: World) -> None:
    class Sloppy:
        algorithm = world.approver.algorithm
        key_id = world.approver.key_id

        async def verify(self, message: bytes, signature: bytes) -> Any:
            return 1

    assert await _refused(world, world.approval, Sloppy()) == "APPROVAL_SIGNATURE_INVALID"
