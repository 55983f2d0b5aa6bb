"""The adapter bridge inside a real attempt: the effect block, EFFECT_MISMATCH and its
behaviour, a refusal's observation, an indeterminate provider, and ceiling refusals.

Every collaborator is real (the attempt test's world: the local authority, SQLite use store,
journal, registry, ceilings) except the adapter's transport, which is scripted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from agentsafe.executor.dispatch.effects import EffectRegister
from agentsafe.executor.dispatch.seam import (
    Dispatch,
    ExecutionContext,
    ReconcileResult,
    ReconcileStatus,
    Registry,
)
from agentsafe.executor.effects.adapter import (
    AdapterHandler,
    ObservationMethod,
    Prepared,
    ProviderOutcome,
    ProviderResult,
)
from agentsafe.executor.errors import HandlerError, RequestRejected
from agentsafe.executor.intent import CapturedIntent
from agentsafe.executor.lifecycle.attempt import Attempt, Progress, Unreported
from agentsafe.executor.lifecycle.ceilings import HostCeilings
from agentsafe.executor.policy.authority import Claim, Finalization, LocalAuthority
from agentsafe.executor.principals import Principal
from tests.lifecycle.test_attempt import EXAMPLE, PROPOSER, World, common

RECEIPT = "eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJub3QtdGhpcy1ncmFudCJ9.c2lnbmF0dXJl"
"""A receipt with the shape of a compact JWS that no registered key signed."""


class Finalizations:
    """The real local authority, with every finalization it recorded kept for the test."""

    def __init__(self, inner: LocalAuthority) -> None:
        self.inner = inner
        self.seen: list[Finalization] = []

    async def evaluate(self, intent: Any, **kwargs: Any) -> Any:
        return await self.inner.evaluate(intent, **kwargs)

    async def claim(self, grant: str, *, intent: Any, fence: Any = None) -> Claim:
        return await self.inner.claim(grant, intent=intent)

    async def finalize(self, claim: Claim, **kwargs: Any) -> Finalization:
        finalized = await self.inner.finalize(claim, **kwargs)
        self.seen.append(finalized)
        return finalized


class ScriptedAdapter:
    adapter_id = "TEST_ADAPTER"
    adapter_version = "1.2.3"
    parameters_schema: Mapping[str, Any] = EXAMPLE["actions"][0]["parameters"]

    def __init__(self, script: str) -> None:
        self.script = script

    def prepare(self, parameters: Mapping[str, Any]) -> Prepared:
        return Prepared(
            transport_action="pay",
            target="payout:synthetic-beneficiary-1",
            expected={"amountMinor": parameters["amountMinor"], "currency": "EUR"},
            ceiling={"amountMinor": parameters["amountMinor"], "currency": "EUR"},
        )

    async def execute(
        self, prepared: Prepared, ctx: ExecutionContext, dispatch: Dispatch
    ) -> ProviderResult:
        async def send(key: str) -> str:
            return key

        await dispatch.run(send)
        if self.script == "vanish":
            raise HandlerError("no answer", code="PROVIDER_ANSWER_INDETERMINATE")
        if self.script == "refuse":
            return ProviderResult(
                ProviderOutcome.REFUSED,
                422,
                "sha256:" + "0" * 64,
                reason="INSUFFICIENT_FUNDS",
                receipt=RECEIPT,
            )
        amount = prepared.expected["amountMinor"] * (10 if self.script == "lie" else 1)
        return ProviderResult(
            ProviderOutcome.COMMITTED,
            201,
            "sha256:" + "1" * 64,
            provider_reference="ref-9",
            reported={"amountMinor": amount, "currency": "EUR", "secret": "never shown"},
            method=ObservationMethod.READ_BACK,
            posted=True,
            receipt=RECEIPT if self.script == "receipt" else None,
        )

    def observe_effect(
        self, prepared: Prepared, result: ProviderResult
    ) -> Mapping[str, Any] | None:
        if result.reported is None:
            return None
        return {k: result.reported[k] for k in ("amountMinor", "currency")}

    async def reconcile(self, idempotency_key: str, *, intent_hash: str = "") -> ReconcileResult:
        return ReconcileResult(ReconcileStatus.UNKNOWN)


def attempt_with(
    world: World,
    script: str,
    halts: list[str],
    ceilings: HostCeilings | None = None,
    *,
    authority: Finalizations | None = None,
    handler: Any = None,
) -> tuple[Attempt, list[tuple[str, str]]]:
    register = EffectRegister()
    registry = Registry(security=world.streams.security)
    registry.register(
        "forward_request",
        handler(register)
        if handler is not None
        else AdapterHandler(ScriptedAdapter(script), register=register),
    )
    registry.seal()
    refused: list[tuple[str, str]] = []
    return (
        Attempt(
            authority=authority if authority is not None else world.authority,
            signer=world.authority,
            registry=registry,
            journal=world.journal,
            ceilings=ceilings,
            streams=world.streams,
            clock=world.clock,
            effects=register,
            report=Reported(halts, refused),
        ),
        refused,
    )


@dataclass
class Reported(Unreported):
    """The attempt's reporter, keeping the effect mismatches and ceiling refusals."""

    halts: list[str]
    refused: list[tuple[str, str]]

    def effect_mismatch(self, grant_id: str) -> None:
        self.halts.append(grant_id)

    def ceiling_refused(
        self, intent: CapturedIntent, principal: Principal, code: str, stage: str
    ) -> None:
        self.refused.append((code, stage))


async def run(world: World, attempt: Attempt) -> dict[str, Any]:
    intent = world.intent()
    decision = await world.allow(intent)
    answer = await attempt.run(
        intent=intent,
        principal=PROPOSER,
        decision=decision,
        handler="forward_request",
        common=common(intent, decision),
        progress=Progress(),
    )
    return dict(answer.body)


async def test_a_matching_effect_is_confirmed_and_carried_without_values(world: World) -> None:
    halts: list[str] = []
    attempt, _ = attempt_with(world, "honest", halts)
    body = await run(world, attempt)
    effect = body["effect"]
    assert (body["outcome"], effect["confirmation"], effect["comparison"]) == (
        "COMPLETED",
        "CONFIRMED",
        "MATCH",
    )
    assert effect["observer"] == {"id": "TEST_ADAPTER", "version": "1.2.3"}
    assert effect["receipt_comparison"] == "ABSENT"
    assert "never shown" not in str(effect)
    assert "4200" not in str(effect)
    assert halts == []
    [observed] = world.evidence.named("EFFECT_OBSERVED")
    assert observed["record_digest"] == effect["record_digest"]


async def test_a_lie_is_completed_with_effect_mismatch_and_the_behaviour(world: World) -> None:
    halts: list[str] = []
    attempt, _ = attempt_with(world, "lie", halts)
    body = await run(world, attempt)
    assert body["outcome"] == "COMPLETED"
    assert body["finalization"] == "RECORDED"
    assert body["reason_codes"][-1] == "EFFECT_MISMATCH"
    assert body["effect"]["differing_fields"] == ["amountMinor"]
    assert body["effect"]["confirmation"] == "UNKNOWN"
    assert halts == [body["authorization"]["grant_id"]]
    security = world.streams.security
    assert [e for e, _ in security.events if e == "EFFECT_MISMATCH"] == ["EFFECT_MISMATCH"]  # type: ignore[attr-defined]


async def test_a_refusal_has_no_block_but_its_observation_is_evidence(world: World) -> None:
    attempt, _ = attempt_with(world, "refuse", [])
    body = await run(world, attempt)
    assert (body["outcome"], body["executed"], body["effect"]) == (
        "DEFINITELY_NOT_EXECUTED",
        False,
        None,
    )
    assert "INSUFFICIENT_FUNDS" in body["reason_codes"]
    [observed] = world.evidence.named("EFFECT_OBSERVED")
    assert (observed["outcome"], observed["confirmation"]) == ("REFUSED", "NOT_EFFECTED")


async def test_a_provider_that_neither_commits_nor_refuses_is_unknown(world: World) -> None:
    attempt, _ = attempt_with(world, "vanish", [])
    body = await run(world, attempt)
    assert (body["outcome"], body["executed"], body["effect"]) == (
        "UNKNOWN_AFTER_DISPATCH",
        None,
        None,
    )
    assert world.evidence.named("EFFECT_OBSERVED") == []


async def test_a_ceiling_refusal_at_commit_is_reported(world: World) -> None:
    ceilings = HostCeilings(single={"EUR": 100}, clock=world.clock)
    attempt, refused = attempt_with(world, "honest", [], ceilings)
    with pytest.raises(RequestRejected) as caught:
        await run(world, attempt)
    assert caught.value.code == "HARD_LIMIT_EXCEEDED"
    assert refused == [("HARD_LIMIT_EXCEEDED", "COMMIT")]


async def test_admit_refuses_a_target_the_action_does_not_derive() -> None:
    handler = AdapterHandler(ScriptedAdapter("honest"), register=EffectRegister())
    registry = Registry()
    registry.register("forward_request", handler)
    registry.seal()
    view = registry.admit("forward_request", "payout:synthetic-beneficiary-1", {"amountMinor": 7})
    assert view == {"amountMinor": 7, "currency": "EUR"}
    with pytest.raises(RequestRejected) as caught:
        registry.admit("forward_request", "payout:someone-else", {"amountMinor": 7})
    assert caught.value.code == "ACTION_TARGET_MISMATCH"


async def test_the_finalization_receives_the_record_and_the_receipt(world: World) -> None:
    authority = Finalizations(world.authority)
    attempt, _ = attempt_with(world, "receipt", [], authority=authority)
    body = await run(world, attempt)
    assert body["outcome"] == "COMPLETED"
    [finalized] = authority.seen
    assert finalized.effect == body["effect"]
    assert finalized.effect_receipt == RECEIPT
    # The authority verified the receipt itself (no key is registered: UNVERIFIED), recorded
    # it all the same, and the finalization stands.
    assert body["finalization"] == "RECORDED"
    assert finalized.effect_report["receipt"] == "UNVERIFIED"
    assert finalized.effect_report["record_digest"] == body["effect"]["record_digest"]
    [outcome] = world.evidence.named("OUTCOME")
    assert outcome["effect_report"] == dict(finalized.effect_report)
    assert outcome["effect_receipt"] == RECEIPT


async def test_a_refusals_record_and_receipt_reach_the_finalization(world: World) -> None:
    authority = Finalizations(world.authority)
    attempt, _ = attempt_with(world, "refuse", [], authority=authority)
    body = await run(world, attempt)
    assert (body["outcome"], body["effect"]) == ("DEFINITELY_NOT_EXECUTED", None)
    [finalized] = authority.seen
    assert finalized.outcome == "DEFINITELY_NOT_EXECUTED"
    assert finalized.effect is not None
    assert (finalized.effect["outcome"], finalized.effect["confirmation"]) == (
        "REFUSED",
        "NOT_EFFECTED",
    )
    assert finalized.effect_receipt == RECEIPT
    assert finalized.effect_report["effect_evidence"] == "OBSERVATION"
    [observed] = world.evidence.named("EFFECT_OBSERVED")
    assert observed["record_digest"] == finalized.effect["record_digest"]


async def test_an_unknown_outcome_finalizes_without_a_record(world: World) -> None:
    authority = Finalizations(world.authority)
    attempt, _ = attempt_with(world, "vanish", [], authority=authority)
    await run(world, attempt)
    [finalized] = authority.seen
    assert (finalized.outcome, finalized.effect) == ("UNKNOWN_AFTER_DISPATCH", None)
    assert finalized.effect_report["effect_evidence"] == "NONE"


class ObservingHandler:
    """An ordinary handler (no adapter) that records its observation through the register."""

    parameters_schema: Mapping[str, Any] = EXAMPLE["actions"][0]["parameters"]

    def __init__(self, register: EffectRegister) -> None:
        self.register = register

    async def execute(self, ctx: ExecutionContext, dispatch: Dispatch) -> Mapping[str, Any]:
        async def send(key: str) -> str:
            return key

        await dispatch.run(send)
        digest = self.register.record(ctx, {"account": "acct-1", "status": 201})
        return {"accepted": True, "observation": digest}

    async def reconcile(self, idempotency_key: str, *, intent_hash: str = "") -> ReconcileResult:
        return ReconcileResult(ReconcileStatus.UNKNOWN)


async def test_an_ordinary_handlers_observation_is_the_same_register(world: World) -> None:
    authority = Finalizations(world.authority)
    attempt, _ = attempt_with(world, "", [], authority=authority, handler=ObservingHandler)
    body = await run(world, attempt)
    assert body["outcome"] == "COMPLETED"
    assert body["effect"] is None  # no adapter, no block
    [finalized] = authority.seen
    assert finalized.effect is not None
    assert finalized.effect["observation_digest"] == body["result"]["observation"]
    assert "acct-1" not in str(finalized.effect)
    [observed] = world.evidence.named("EFFECT_OBSERVED")
    assert observed["grant_id"] == body["authorization"]["grant_id"]
    assert observed["observation_digest"] == body["result"]["observation"]
    assert observed["record_digest"] == finalized.effect_report["record_digest"]
