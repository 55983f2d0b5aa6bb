"""The banking family in an assembled executor (in process, real sockets), counted.

``assemble`` over the real configuration with the synthetic core bank listening on loopback in
the same event loop, so the test can read the executor's counters: an effect mismatch is counted
under both behaviours and halts only under HALT, with the halt counted by its own cause; a
ceiling refusal fed by the banking projection is an evidence line and a count; and the effect
block carries neither a parameter nor the downstream credential.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from agentsafe.executor.assembly import assemble
from agentsafe.executor.events import MemorySink, Streams
from agentsafe.executor.plane import Executor
from agentsafe.executor.tools.harness import (
    Workspace,
    banking_environment,
    banking_policy,
    wait_until,
)
from agentsafe.executor.tools.synthetic_bank import SyntheticBank

CREDITOR = "iban:FR1420041010050500013M02606"
SEPA = {
    "type": "SEPA_CREDIT_TRANSFER",
    "amountMinor": 12500,
    "currency": "EUR",
    "debtor": "iban:DE89370400440532013000",
    "creditor": CREDITOR,
    "creditorName": "Synthetic Supplier SA",
}


class Estate:
    def __init__(
        self,
        bank: SyntheticBank,
        executor: Executor,
        workspace: Workspace,
        evidence: MemorySink,
        security: MemorySink,
        session: aiohttp.ClientSession,
    ) -> None:
        self.bank = bank
        self.executor = executor
        self.workspace = workspace
        self.evidence = evidence
        self.security = security
        self.session = session
        self.url = f"http://127.0.0.1:{executor.port}"

    async def propose(
        self, parameters: dict[str, Any], key: str, *, action: str = "credit_transfer_sepa"
    ) -> tuple[int, dict[str, Any]]:
        target = parameters.get("creditor") or parameters.get("toAccount")
        body = {
            "proposal": {
                "action": action,
                "target": target,
                "parameters": parameters,
            },
            "idempotency_key": key,
        }
        headers = {"authorization": f"Bearer {self.workspace.caller_token}"}
        async with self.session.post(self.url + "/v1/actions", json=body, headers=headers) as r:
            payload: dict[str, Any] = await r.json()
            return r.status, payload

    async def ready(self) -> int:
        async with self.session.get(self.url + "/ready") as r:
            return r.status


Start = Callable[[str], Awaitable[Estate]]


@pytest.fixture
async def estate(tmp_path: Path) -> AsyncIterator[Start]:
    cleanups: list[Callable[[], Awaitable[None]]] = []

    async def start(on_mismatch: str) -> Estate:
        bank = SyntheticBank()
        runner = web.AppRunner(bank.app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        cleanups.append(runner.cleanup)
        port = runner.addresses[0][1]
        bank_url = f"http://127.0.0.1:{port}"
        workspace = Workspace(tmp_path / f"ws-{on_mismatch}")
        env = workspace.environment(
            provider_url=bank_url,
            port=0,
            policy_file=banking_policy(tmp_path / f"policy-{on_mismatch}.json"),
            extra={
                **banking_environment(bank_url),
                "EXECUTOR_ON_EFFECT_MISMATCH": on_mismatch,
                "EXECUTOR_HARD_LIMIT_SINGLE_MINOR": "EUR:1000000,JPY:5000",
            },
        )
        evidence, security = MemorySink(), MemorySink()
        executor = await assemble(env, streams=Streams(evidence=evidence, security=security))
        await executor.reconcile_at_start()
        await executor.listen()
        session = aiohttp.ClientSession()
        cleanups.append(session.close)
        cleanups.append(executor.close)
        return Estate(bank, executor, workspace, evidence, security, session)

    yield start
    for cleanup in reversed(cleanups):
        await cleanup()


async def test_alert_counts_each_mismatch_and_keeps_running(estate: Start) -> None:
    run = await estate("ALERT")
    run.bank.mode = "lie"
    for key in ("lie-1", "lie-2"):
        status, body = await run.propose(SEPA, key)
        assert (status, body["outcome"]) == (200, "COMPLETED"), body
        assert "EFFECT_MISMATCH" in body["reason_codes"]
    metrics = run.executor.metrics
    assert metrics.effect_mismatches.value() == 2
    assert metrics.halts.value(cause="EFFECT_MISMATCH") == 0
    assert await run.ready() == 200
    assert len(run.security.named("EFFECT_MISMATCH")) == 2


async def test_halt_counts_the_mismatch_and_the_halt_by_its_own_cause(estate: Start) -> None:
    run = await estate("HALT")
    run.bank.mode = "lie"
    status, body = await run.propose(SEPA, "lie-1")
    assert (status, body["outcome"], body["executed"]) == (200, "COMPLETED", True), body
    assert body["effect"]["differing_fields"] == ["amountMinor"]

    async def halted() -> bool:
        return await run.ready() == 503

    await wait_until(halted, timeout=10, what="the executor to halt")
    metrics = run.executor.metrics
    assert metrics.effect_mismatches.value() == 1
    assert metrics.halts.value(cause="EFFECT_MISMATCH") == 1
    assert [h["cause"] for h in run.security.named("HALTED")] == ["EFFECT_MISMATCH"]
    run.bank.mode = "post"
    status, body = await run.propose(SEPA, "after-1")
    assert (status, body["reason_codes"]) == (503, ["EXECUTOR_HALTED"])


async def test_the_banking_projection_feeds_the_ceilings_counted(estate: Start) -> None:
    run = await estate("HALT")
    # Beyond 2^53, as digits: the projection carries the exact integer to the ceiling.
    status, body = await run.propose({**SEPA, "amountMinor": str(2**53 + 1)}, "big-1")
    assert (status, body["error"]["code"]) == (422, "HARD_LIMIT_EXCEEDED")
    # JPY has no minor digits: 6000 minor units are 6000 yen, above JPY:5000.
    internal = {
        "type": "INTERNAL_TRANSFER",
        "amountMinor": 6000,
        "currency": "JPY",
        "fromAccount": "account:ops-1",
        "toAccount": "account:ops-2",
    }
    status, body = await run.propose(internal, "jpy-1", action="internal_transfer")
    assert (status, body["error"]["code"]) == (422, "HARD_LIMIT_EXCEEDED")
    lines = run.evidence.named("CEILING_REFUSED")
    assert [(line["code"], line["stage"]) for line in lines] == [
        ("HARD_LIMIT_EXCEEDED", "CHECK"),
        ("HARD_LIMIT_EXCEEDED", "CHECK"),
    ]
    assert run.executor.metrics.ceiling_refusals.value(code="HARD_LIMIT_EXCEEDED") == 2
    assert run.evidence.named("DECISION") == []  # refused before the authority was asked
    # Within the ceilings the same actions run.
    status, body = await run.propose(SEPA, "ok-1")
    assert body["outcome"] == "COMPLETED", body
    status, body = await run.propose(
        {**internal, "amountMinor": 4000}, "jpy-2", action="internal_transfer"
    )
    assert body["outcome"] == "COMPLETED", body
    # A currency ISO 4217 does not list is refused by the family before the ceilings.
    status, body = await run.propose(
        {**internal, "currency": "ABC"}, "abc-1", action="internal_transfer"
    )
    assert (status, body["error"]["code"]) == (422, "BANKING_CURRENCY_UNKNOWN")


async def test_the_effect_block_holds_no_parameter_and_no_credential(estate: Start) -> None:
    run = await estate("HALT")
    _status, body = await run.propose(SEPA, "post-1")
    assert body["effect"]["confirmation"] == "CONFIRMED", body
    text = json.dumps(body["effect"])
    credential = run.workspace.downstream_credential
    for value in (credential, credential.split()[-1], run.workspace.caller_token):
        assert value not in text
    for value in ("DE89370400440532013000", "FR1420041010050500013M02606", "12500", "Supplier"):
        assert value not in text
    [observed] = run.evidence.named("EFFECT_OBSERVED")
    assert credential.split()[-1] not in json.dumps(observed)
