"""The reference core-banking transport's answers, over a scripted transport (the real-process
tests cover the same paths against the synthetic core bank; these pin the edges)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest

from agentsafe.executor.banking.actions import ACTIONS
from agentsafe.executor.banking.transport import CoreBankingHttpAdapter
from agentsafe.executor.clock import ManualClock
from agentsafe.executor.dispatch.effects import EffectRegister
from agentsafe.executor.dispatch.forward import ForwardRequestHandler
from agentsafe.executor.dispatch.seam import (
    Authorization,
    Dispatch,
    ExecutionContext,
    ProviderRefused,
)
from agentsafe.executor.effects.adapter import (
    AdapterHandler,
    Confirmation,
    ObservationMethod,
    ProviderOutcome,
)
from agentsafe.executor.egress.transport import HttpResponse, TransportError
from agentsafe.executor.errors import ConfigError, HandlerError
from agentsafe.executor.events import MemorySink
from tests.support.intents import make_intent

KIND = ACTIONS["banking.credit_transfer.sepa"]
ACTION = {
    "type": "SEPA_CREDIT_TRANSFER",
    "amountMinor": "12500",
    "currency": "EUR",
    "debtor": "iban:DE89370400440532013000",
    "creditor": "iban:FR1420041010050500013M02606",
    "creditorName": "Synthetic Supplier SA",
}
BASE = "http://127.0.0.1:9"


class Scripted:
    """Answers POSTs and GETs as scripted; records what was asked."""

    def __init__(self, post: HttpResponse, get: HttpResponse | Exception | None = None) -> None:
        self.post = post
        self.get = get
        self.asked: list[tuple[str, str, Mapping[str, str]]] = []
        self.timeouts: list[float] = []

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout: float,
    ) -> HttpResponse:
        self.asked.append((method, url, dict(headers)))
        self.timeouts.append(timeout)
        if method == "POST":
            return self.post
        if isinstance(self.get, Exception):
            raise self.get
        assert self.get is not None
        return self.get

    async def close(self) -> None:
        return None


def answer(status: int, payload: Any) -> HttpResponse:
    return HttpResponse(status, {}, json.dumps(payload).encode())


def bridge(
    transport: Scripted,
    *,
    lookup: str | None,
    security: MemorySink,
    by_key: str | None = None,
) -> AdapterHandler:
    forward = ForwardRequestHandler(
        url=BASE + "/payments",
        lookup_url=by_key,
        timeout_ms=1000,
        transport=transport,
        credential=None,
        parameters_schema={"type": "object", "additionalProperties": False},
    )
    adapter = CoreBankingHttpAdapter(
        KIND,
        forward=forward,
        transport=transport,
        credential=None,
        lookup_by_reference_url=lookup,
        timeout_ms=1000,
        adapter_id="A",
        adapter_version="1",
        security=security,
    )
    return AdapterHandler(adapter, register=EffectRegister())


def context(grant_left: float = 60) -> ExecutionContext:
    clock = ManualClock()
    intent = make_intent(now=clock.now(), parameters=ACTION, ttl_seconds=120)
    auth = Authorization("d", "s", "g-1", clock.now() + grant_left)
    return ExecutionContext.create(intent=intent, authorization=auth, clock=clock)


async def run(handler: AdapterHandler, *, grant_left: float = 60) -> tuple[Mapping[str, Any], Any]:
    ctx = context(grant_left)
    result = await handler.execute(ctx, Dispatch(ctx))
    register = handler._register  # the test reads back what the bridge registered
    return result, register.take("g-1")


async def test_posted_and_read_back_is_confirmed_by_the_reference() -> None:
    record = {k: v for k, v in ACTION.items() if k != "creditorName"}
    transport = Scripted(
        answer(201, {"status": "POSTED", "reference": "bank_1"}), answer(200, record)
    )
    handler = bridge(transport, lookup=BASE + "/by-ref/{provider_reference}", security=MemorySink())
    result, effect = await run(handler)
    assert result["provider_reference"] == "bank_1"
    assert effect.confirmation is Confirmation.CONFIRMED
    assert effect.observation_method is ObservationMethod.READ_BACK
    assert transport.asked[0][2]["x-agent-safe-banking-action"] == "credit_transfer.sepa"
    assert transport.asked[1][:2] == ("GET", BASE + "/by-ref/bank_1")


@pytest.mark.parametrize(
    "get",
    [answer(404, {"code": "NOT_FOUND"}), TransportError("EGRESS_TIMEOUT", True), None],
)
async def test_a_read_back_that_fails_leaves_the_effect_unconfirmed(get: Any) -> None:
    security = MemorySink()
    transport = Scripted(answer(201, {"status": "POSTED", "reference": "bank_1"}), get)
    lookup = None if get is None else BASE + "/by-ref/{provider_reference}"
    _result, effect = await run(bridge(transport, lookup=lookup, security=security))
    assert effect.confirmation is Confirmation.UNCONFIRMED
    assert effect.observation_method is ObservationMethod.RESPONSE
    if get is not None:
        assert security.named("READ_BACK_FAILED")[0]["code"] == "READ_BACK_FAILED"


@pytest.mark.parametrize(
    "post",
    [
        HttpResponse(200, {}, b""),  # 2xx without a body
        answer(200, {"status": "SOMETHING"}),  # a status that says neither
        HttpResponse(503, {}, b""),
        answer(409, {"code": "IN_PROGRESS"}),
    ],
)
async def test_neither_committed_nor_refused_is_raised_never_guessed(post: HttpResponse) -> None:
    handler = bridge(Scripted(post), lookup=None, security=MemorySink())
    with pytest.raises(HandlerError):
        await run(handler)


def test_the_read_back_url_must_name_the_reference() -> None:
    with pytest.raises(ConfigError):
        bridge(Scripted(answer(201, {})), lookup=BASE + "/by-ref", security=MemorySink())


@pytest.mark.parametrize(
    ("grant_left", "bound"),
    [(60, 1.0), (0.25, 0.25)],  # DOWNSTREAM_TIMEOUT_MS=1000 here; the grant may have less left
)
async def test_the_dispatch_and_the_read_back_are_bounded_by_the_grant(
    grant_left: float, bound: float
) -> None:
    record = {k: v for k, v in ACTION.items() if k != "creditorName"}
    transport = Scripted(
        answer(201, {"status": "POSTED", "reference": "bank_1"}), answer(200, record)
    )
    handler = bridge(transport, lookup=BASE + "/by-ref/{provider_reference}", security=MemorySink())
    await run(handler, grant_left=grant_left)
    assert [method for method, _, _ in transport.asked] == ["POST", "GET"]
    assert transport.timeouts == [bound, bound]  # min(timeout, what the grant has left)


async def test_a_deterministic_refusal_is_registered_then_raised() -> None:
    handler = bridge(
        Scripted(answer(422, {"code": "insufficient funds"})), lookup=None, security=MemorySink()
    )
    ctx = context()
    with pytest.raises(ProviderRefused) as refused:
        await handler.execute(ctx, Dispatch(ctx))
    assert (refused.value.reason, refused.value.status) == ("INSUFFICIENT_FUNDS", 422)
    effect = handler._register.take("g-1")  # registered before the raise
    assert effect is not None
    assert (effect.outcome, effect.confirmation) == (
        ProviderOutcome.REFUSED,
        Confirmation.NOT_EFFECTED,
    )
    assert effect.observed_effect_digest is None


@pytest.mark.parametrize(
    "post",
    [
        answer(408, {"code": "TIMEOUT"}),  # held unknown on purpose, like 409
        HttpResponse(422, {}, b"  "),  # a refusal without a body says nothing
        answer(302, {"status": "POSTED"}),
    ],
)
async def test_what_is_not_a_refusal_is_raised_as_unknown(post: HttpResponse) -> None:
    handler = bridge(Scripted(post), lookup=None, security=MemorySink())
    with pytest.raises(HandlerError):
        await run(handler)
    assert handler._register.take("g-1") is None  # nothing observed, nothing guessed


async def test_reconcile_only_reads_by_the_idempotency_key() -> None:
    transport = Scripted(answer(500, {}), answer(200, {"reference": "bank_7", "status": "POSTED"}))
    handler = bridge(
        transport,
        lookup=BASE + "/by-ref/{provider_reference}",
        security=MemorySink(),
        by_key=BASE + "/payments/{idempotency_key}",
    )
    result = await handler.reconcile("key 1", intent_hash="sha256:" + "a" * 64)
    assert (result.status.value, result.provider_reference) == ("COMPLETED", "bank_7")
    [(method, url, headers)] = transport.asked
    assert (method, url) == ("GET", BASE + "/payments/key%201")  # never the POST
    assert headers["x-agent-safe-intent-hash"] == "sha256:" + "a" * 64
