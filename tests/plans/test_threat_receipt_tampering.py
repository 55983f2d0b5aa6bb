"""Threat: receipt tampering -- any change to a signed receipt, or verification against other
evidence, is refused."""

from __future__ import annotations

from typing import Any

import pytest

from agentsafe.executor.plans import AgentSafetyError, verify_agent_execution_receipt

from . import support as s
from .conftest import World


async def _code(world: World, receipt: Any, **overrides: Any) -> str:
    with pytest.raises(AgentSafetyError) as caught:
        await verify_agent_execution_receipt(receipt, **world.verify_kwargs(**overrides))
    return caught.value.code


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("outcome", "failed"),
        ("rows", 0),
        ("bytes", 1),
        ("resultDigest", "sha256:" + "a" * 64),
        ("completedAt", "2026-07-10T20:00:01.000Z"),
        ("executionId", "execution-99"),
        ("stepId", "other"),
        ("approvalDigest", "sha256:" + "b" * 64),
        ("operationDigest", "sha256:" + "c" * 64),
        ("useDigest", "sha256:" + "d" * 64),
    ],
)
async def test_every_payload_field_is_signed(world: World, key: str, value: Any) -> None:
    receipt = s.deep((await world.execute()).receipt)
    receipt["payload"][key] = value
    assert await _code(world, receipt) == "RECEIPT_SIGNATURE_INVALID"


async def test_receipt_signed_by_another_key(world: World) -> None:
    receipt = (await world.execute()).receipt
    assert await _code(world, receipt, receipt_verifier=s.signer().verifier()) == (
        "RECEIPT_KEY_MISMATCH"
    )


async def test_receipt_checked_against_another_context(world: World) -> None:
    receipt = (await world.execute()).receipt
    drifted = s.context(sourceVersion="snapshot-9", attribution="Someone else")
    assert await _code(world, receipt, context=drifted) == "CONTEXT_MISMATCH"


async def test_receipt_checked_against_another_approval(world: World) -> None:
    receipt = (await world.execute()).receipt
    other = await World(world.store, world.approver, world.receipt_signer).approve(id="approval-77")
    assert await _code(world, receipt, approval=other) == "RECEIPT_MISMATCH"


async def test_receipt_requires_the_issuing_store(world: World, tmp_path: Any) -> None:
    from agentsafe.executor.state.usestore import SQLiteUseStore

    receipt = (await world.execute()).receipt
    other = await SQLiteUseStore.open(tmp_path / "elsewhere", clock=s.manual_clock())
    try:
        assert await _code(world, receipt, use_verifier=other) == "CONSUMPTION_UNVERIFIED"
    finally:
        await other.close()


async def test_receipt_resigned_by_attacker_with_own_key_is_refused(world: World) -> None:
    # Even with a valid signature, a receipt claiming success for rows beyond the approval fails.
    from agentsafe.executor.canonical import canonical_json, sha256_digest
    from agentsafe.executor.grants import b64url_encode

    attacker = s.signer()
    receipt = s.deep((await world.execute()).receipt)
    receipt["payload"]["rows"] = 201
    receipt["keyId"] = attacker.key_id
    content = {k: v for k, v in receipt.items() if k != "signature"}
    receipt["signature"] = b64url_encode(await attacker.sign(canonical_json(content)))
    assert await _code(world, receipt, receipt_verifier=attacker.verifier()) == (
        "EVIDENCE_EXCEEDS_APPROVAL"
    )
    # A signer key alone cannot invent a use: the consumption record is the store's.
    receipt["payload"]["rows"] = 1
    receipt["payload"]["consumption"]["nonce"] = "f" * 32
    receipt["payload"]["useDigest"] = sha256_digest(receipt["payload"]["consumption"])
    receipt["signature"] = b64url_encode(
        await attacker.sign(canonical_json({k: v for k, v in receipt.items() if k != "signature"}))
    )
    assert await _code(world, receipt, receipt_verifier=attacker.verifier()) == (
        "CONSUMPTION_UNVERIFIED"
    )
