"""The banking family end to end: a real ``agentsafe serve`` and the synthetic core bank as its
own process, each of the provider's behaviours, the effect block, receipts and the halt."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agentsafe.executor.jws import b64url_encode
from agentsafe.executor.tools.harness import (
    ExecutorProcess,
    ProviderProcess,
    Workspace,
    banking_environment,
    banking_policy,
    free_port,
    wait_until,
)

pytestmark = pytest.mark.slow

DE = "iban:DE89370400440532013000"
FR = "iban:FR1420041010050500013M02606"
BLOCK_KEYS = {
    "grant_id",
    "observer",
    "outcome",
    "confirmation",
    "comparison",
    "differing_fields",
    "observation_method",
    "authorised_effect_digest",
    "observed_effect_digest",
    "response_digest",
    "provider_reference",
    "receipt_comparison",
    "receipt_digest",
    "receipt_status",
    "record_digest",
}


def sepa(amount: int | str = 12500) -> dict[str, Any]:
    return {
        "type": "SEPA_CREDIT_TRANSFER",
        "amountMinor": amount,
        "currency": "EUR",
        "debtor": DE,
        "creditor": FR,
        "creditorName": "Synthetic Supplier SA",
    }


class Estate:
    def __init__(self, bank: ProviderProcess, executor: ExecutorProcess) -> None:
        self.bank = bank
        self.executor = executor

    async def propose(
        self,
        session: aiohttp.ClientSession,
        parameters: dict[str, Any],
        key: str,
        *,
        target: str = FR,
        action: str = "credit_transfer_sepa",
    ) -> tuple[int, dict[str, Any]]:
        body = {
            "proposal": {"action": action, "target": target, "parameters": parameters},
            "idempotency_key": key,
        }
        headers = {"authorization": f"Bearer {self.executor.token}"}
        async with session.post(self.executor.url + "/v1/actions", json=body, headers=headers) as r:
            payload: dict[str, Any] = await r.json()
            return r.status, payload

    def evidence(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.executor.stdout_events() if e.get("event") == event]

    def security(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.executor.stderr_events() if e.get("event") == event]


async def start_estate(
    tmp_path: Path, *, on_mismatch: str, extra_args: tuple[str, ...] = ()
) -> Estate:
    key = Ed25519PrivateKey.generate()
    key_file = tmp_path / "bank-receipt-key.pem"
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    public = b64url_encode(
        key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    )
    bank = ProviderProcess(
        tmp_path,
        module="agentsafe.executor.tools.synthetic_bank",
        args=("--receipt-key", str(key_file), *extra_args),
        name="bank",
    )
    await bank.start()
    workspace = Workspace(tmp_path / "ws")
    env = workspace.environment(
        provider_url=bank.url,
        port=free_port(),
        policy_file=banking_policy(tmp_path / "policy.json", provider_key=public),
        extra={
            **banking_environment(bank.url),
            "DOWNSTREAM_TIMEOUT_MS": "1500",
            "EXECUTOR_ON_EFFECT_MISMATCH": on_mismatch,
            "BANKING_ADAPTER_ID": "TEST_CORE_BANKING",
            "BANKING_ADAPTER_VERSION": "9.9.9",
            "EXECUTOR_HARD_LIMIT_SINGLE_MINOR": "EUR:1000000000",
        },
    )
    executor = ExecutorProcess(env, tmp_path)
    try:
        await executor.start()
    except BaseException:
        executor.terminate()
        bank.terminate()
        raise
    return Estate(bank, executor)


@pytest.fixture
async def halting(tmp_path: Path) -> AsyncIterator[Estate]:
    estate = await start_estate(tmp_path, on_mismatch="HALT")
    try:
        yield estate
    finally:
        estate.executor.terminate()
        estate.bank.terminate()


async def test_each_answer_of_the_core_bank_and_the_halt_on_an_effect_mismatch(
    halting: Estate,
) -> None:
    estate = halting
    async with aiohttp.ClientSession() as session:
        # Posted, then read back by the provider's reference: CONFIRMED, the receipt MATCHes.
        status, body = await estate.propose(session, sepa(), "post-1")
        assert status == 200, body
        posted = body
        assert (body["outcome"], body["executed"]) == ("COMPLETED", True)
        effect = body["effect"]
        assert set(effect) == BLOCK_KEYS
        assert effect["outcome"] == "COMMITTED"
        assert effect["confirmation"] == "CONFIRMED"
        assert effect["comparison"] == "MATCH"
        assert effect["observation_method"] == "READ_BACK"
        assert effect["receipt_comparison"] == "MATCH"
        assert effect["authorised_effect_digest"] == effect["observed_effect_digest"]
        assert effect["observer"] == {"id": "TEST_CORE_BANKING", "version": "9.9.9"}
        assert effect["provider_reference"].startswith("bank_")
        assert "EFFECT_MISMATCH" not in body["reason_codes"]
        text = json.dumps(effect)
        for value in (DE, FR, "12500", "Synthetic Supplier"):
            assert value not in text  # never a parameter or a provider body

        # Taken without posting: ACKNOWLEDGED, nothing to compare yet.
        await estate.bank.set_mode("take")
        status, body = await estate.propose(session, sepa(), "take-1")
        assert body["outcome"] == "COMPLETED", body
        assert body["effect"]["confirmation"] == "ACKNOWLEDGED"
        assert body["effect"]["comparison"] == "NOT_COMPARED"

        # A deterministic refusal: DEFINITELY_NOT_EXECUTED, no effect block, the observation
        # is in the evidence all the same.
        await estate.bank.set_mode("refuse")
        status, body = await estate.propose(session, sepa(), "refuse-1")
        assert (body["outcome"], body["executed"]) == ("DEFINITELY_NOT_EXECUTED", False), body
        assert "INSUFFICIENT_FUNDS" in body["reason_codes"]
        assert body["effect"] is None
        refused_grant = body["authorization"]["grant_id"]

        # A timeout: indeterminate, reconciliation owns it.
        await estate.bank.set_mode("timeout")
        status, body = await estate.propose(session, sepa(), "timeout-1")
        assert (body["outcome"], body["executed"]) == ("UNKNOWN_AFTER_DISPATCH", None), body
        assert body["effect"] is None
        assert body["recovery"] is not None

        # A target that is not the one the action derives: refused before the authority.
        await estate.bank.set_mode("post")
        before = (await estate.bank.received())["count"]
        decisions = len(estate.evidence("DECISION"))
        status, body = await estate.propose(session, sepa(), "target-1", target="iban:other")
        assert status == 422
        assert body["error"]["code"] == "ACTION_TARGET_MISMATCH"
        assert (await estate.bank.received())["count"] == before
        assert len(estate.evidence("DECISION")) == decisions

        # The banking projection feeds the ceilings: an amount beyond 2^53, as digits.
        status, body = await estate.propose(session, sepa("9" * 30), "ceiling-1")
        assert status == 422
        assert body["error"]["code"] == "HARD_LIMIT_EXCEEDED"
        assert estate.evidence("CEILING_REFUSED")[-1]["code"] == "HARD_LIMIT_EXCEEDED"

        # The provider lies about the amount: COMPLETED, EFFECT_MISMATCH, and the executor halts.
        await estate.bank.set_mode("lie")
        status, body = await estate.propose(session, sepa(), "lie-1")
        assert (body["outcome"], body["executed"]) == ("COMPLETED", True), body
        assert "EFFECT_MISMATCH" in body["reason_codes"]
        effect = body["effect"]
        assert effect["comparison"] == "MISMATCH"
        assert effect["differing_fields"] == ["amountMinor"]
        assert effect["confirmation"] == "UNKNOWN"
        assert effect["receipt_comparison"] == "MISMATCH"
        lied = body

        async def halted() -> bool:
            async with session.get(estate.executor.url + "/ready") as r:
                return r.status == 503

        await wait_until(halted, timeout=10, what="the executor to halt")
        await estate.bank.set_mode("post")
        status, body = await estate.propose(session, sepa(), "after-halt-1")
        assert status == 503
        assert body["reason_codes"] == ["EXECUTOR_HALTED"]

    halts = estate.security("HALTED")
    assert [h["cause"] for h in halts] == ["EFFECT_MISMATCH"]
    assert len(estate.security("EFFECT_MISMATCH")) == 1
    assert len(estate.security("EFFECT_RECEIPT_MISMATCH")) == 1
    observed = {e["grant_id"]: e for e in estate.evidence("EFFECT_OBSERVED")}
    assert observed[refused_grant]["outcome"] == "REFUSED"
    assert observed[refused_grant]["confirmation"] == "NOT_EFFECTED"
    assert len(estate.security("PROVIDER_REFUSED")) == 1

    # The finalization received every record and receipt: the authority's effect report is in
    # the OUTCOME line, naming the record the answer (or, for a refusal, the evidence) carries.
    reports = {e["grant_id"]: e for e in estate.evidence("OUTCOME")}
    good = reports[posted["authorization"]["grant_id"]]
    assert good["effect_report"] == {
        "effect_evidence": "SIGNED_RECEIPT",  # verified, stating the authorised effect
        "record_digest": posted["effect"]["record_digest"],
        "receipt": "VERIFIED",
        "receipt_digest": posted["effect"]["receipt_digest"],
        "receipt_reason": None,
    }
    # The token itself is redacted on the evidence stream (a JWS); its digest names it.
    assert good["effect_receipt"] == "[REDACTED:JWS]"
    refused = reports[refused_grant]
    assert refused["effect_report"]["record_digest"] == observed[refused_grant]["record_digest"]
    assert refused["effect_report"]["receipt"] == "VERIFIED"  # the bank signed its refusal
    assert refused["effect_report"]["effect_evidence"] == "OBSERVATION"
    assert refused["effect_receipt"] == "[REDACTED:JWS]"  # a refusal's receipt is carried too
    assert refused["effect_report"]["receipt_digest"].startswith("sha256:")
    lie = reports[lied["authorization"]["grant_id"]]
    # The bank signed the amount it booked: a verified receipt of another effect is not
    # evidence of the authorised one.
    assert lie["effect_report"]["receipt"] == "VERIFIED"
    assert lie["effect_report"]["effect_evidence"] == "OBSERVATION"
    assert lie["finalization"] == "RECORDED"


async def test_alert_records_and_counts_a_mismatch_without_halting(tmp_path: Path) -> None:
    estate = await start_estate(tmp_path, on_mismatch="ALERT", extra_args=("--receipt-lie",))
    try:
        async with aiohttp.ClientSession() as session:
            # An honest booking whose receipt states another digest: the receipt MISMATCH alone.
            _status, body = await estate.propose(session, sepa(), "receipt-lie-1")
            assert body["outcome"] == "COMPLETED", body
            assert body["effect"]["comparison"] == "MATCH"
            assert body["effect"]["receipt_comparison"] == "MISMATCH"
            assert body["effect"]["confirmation"] == "UNKNOWN"
            assert "EFFECT_MISMATCH" in body["reason_codes"]
            async with session.get(estate.executor.url + "/ready") as r:
                assert r.status == 200
            _status, body = await estate.propose(session, sepa(), "receipt-lie-2")
            assert body["outcome"] == "COMPLETED", body
    finally:
        estate.executor.terminate()
        estate.bank.terminate()
    assert estate.security("HALTED") == []
    assert len(estate.security("EFFECT_RECEIPT_MISMATCH")) == 2
    assert estate.security("EFFECT_MISMATCH") == []


async def test_a_malformed_or_oversized_receipt_is_a_mismatch_and_the_payment_stays_known(
    tmp_path: Path,
) -> None:
    """Issue 30, item 17: a receipt header that is there but is not a verifiable compact JWS
    (alg none with an empty signature, garbage) was read as ABSENT; a 9 KB one made the
    guard refuse the whole answer, so a posted payment became UNKNOWN_AFTER_DISPATCH. Now each
    is a receipt MISMATCH (EFFECT_RECEIPT_INVALID) and the payment stays COMPLETED."""
    estate = await start_estate(tmp_path, on_mismatch="ALERT")
    try:
        async with aiohttp.ClientSession() as session:
            for form in ("none-alg", "garbage", "oversized"):
                async with session.post(
                    estate.bank.url + "/_control/receipt-form", json={"form": form}
                ) as r:
                    assert r.status == 200
                _status, body = await estate.propose(session, sepa(), f"receipt-{form}")
                assert body["outcome"] == "COMPLETED", (form, body)
                assert body["effect"]["comparison"] == "MATCH", form
                assert body["effect"]["receipt_comparison"] == "MISMATCH", form
                assert body["effect"]["confirmation"] == "UNKNOWN", form
            async with session.post(
                estate.bank.url + "/_control/receipt-form", json={"form": "signed"}
            ) as r:
                assert r.status == 200
            _status, body = await estate.propose(session, sepa(), "receipt-signed")
            assert body["effect"]["receipt_comparison"] == "MATCH", body
    finally:
        estate.executor.terminate()
        estate.bank.terminate()
    refused = estate.security("EFFECT_RECEIPT_MISMATCH")
    assert [e.get("reason") for e in refused] == ["EFFECT_RECEIPT_INVALID"] * 3, refused
    assert estate.security("HALTED") == []
