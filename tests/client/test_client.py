"""agentsafe.client against a real executor and a real provider on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from agentsafe.client import AgentSafeClient, Decision, Outcome, Refused, Unavailable, Verdict
from agentsafe.executor.assembly import assemble
from agentsafe.executor.events import MemorySink, Streams
from agentsafe.executor.plane import Executor
from agentsafe.executor.tools.harness import Workspace, free_port, wait_until
from agentsafe.executor.tools.synthetic import SyntheticProvider
from tests.integration.bearer_principals import OPERATOR_ID, BearerPrincipals, principals_env

PAYOUT = {"amountMinor": 1200, "currency": "USD"}


@dataclass
class Node:
    executor: Executor
    url: str
    principals: BearerPrincipals

    def client(self, who: str = "treasury-workflow", **options: Any) -> AgentSafeClient:
        return AgentSafeClient(self.url, token=self.principals.token(who), **options)

    async def post(self, path: str, who: str, body: Any) -> tuple[int, Any]:
        headers = {"authorization": f"Bearer {self.principals.token(who)}"}
        async with (
            aiohttp.ClientSession() as session,
            session.post(self.url + path, json=body, headers=headers) as r,
        ):
            return r.status, await r.json()


async def _node(tmp_path: Path, provider_url: str, **extra: str) -> Node:
    principals = BearerPrincipals()
    workspace = Workspace(tmp_path / "ws")
    env = principals_env(
        workspace.environment(provider_url=provider_url, port=free_port()),
        principals.write(tmp_path / "principals.json"),
        EXECUTOR_ESCALATION="APPROVAL",
        **extra,
    )
    executor = await assemble(env, streams=Streams(evidence=MemorySink(), security=MemorySink()))
    await executor.reconcile_at_start()
    await executor.listen()
    return Node(executor, f"http://127.0.0.1:{executor.port}", principals)


@pytest.fixture
async def provider() -> AsyncIterator[SyntheticProvider]:
    synthetic = SyntheticProvider()
    await synthetic.start()
    yield synthetic
    await synthetic.stop()


@pytest.fixture
async def node(tmp_path: Path, provider: SyntheticProvider) -> AsyncIterator[Node]:
    running = await _node(tmp_path, provider.base_url)
    yield running
    await running.executor.close()


async def test_allow_block_and_typed_answers(node: Node, provider: SyntheticProvider) -> None:
    async with node.client() as client:
        decision = await client.propose("create_payout", "payout:b-1", PAYOUT)
        assert isinstance(decision, Decision)
        assert decision.verdict is Verdict.ALLOW
        assert decision.outcome is Outcome.COMPLETED
        assert decision.executed is True
        assert decision.idempotency_key is not None
        again = await client.propose(
            "create_payout", "payout:b-1", PAYOUT, idempotency_key=decision.idempotency_key
        )
        assert again.replayed is True
        assert again.intent_hash == decision.intent_hash
        assert len(provider.received) == 1
        blocked = await client.propose(
            "create_payout", "payout:b-1", {"amountMinor": 900000, "currency": "USD"}
        )
        assert blocked.verdict is Verdict.BLOCK
        assert "AMOUNT_ABOVE_POLICY" in blocked.reason_codes
        assert "BLOCK" in blocked.summary()
        assert len(provider.received) == 1
    async with AgentSafeClient(node.url, token="not-a-principal") as stranger:
        with pytest.raises(Refused) as info:
            await stranger.propose("create_payout", "payout:b-1", PAYOUT)
        assert info.value.status == 401
        assert info.value.code == "AUTH_FAILED"
    assert "not-a-principal" not in repr(stranger)


async def test_an_unknown_outcome_is_reconciled_with_the_recovery_object(
    node: Node, provider: SyntheticProvider
) -> None:
    provider.set_mode("reset")  # acts on the request, then drops the connection
    async with node.client() as client:
        lost = await client.propose("create_payout", "payout:b-2", PAYOUT)
        assert lost.outcome is Outcome.UNKNOWN_AFTER_DISPATCH
        assert lost.needs_reconciliation
        assert lost.recovery is not None
        provider.set_mode("normal")
        known = await client.reconcile(lost.recovery)
        assert known.outcome is Outcome.COMPLETED
        assert len(provider.received) == 1, "reconciliation reads; it never sends again"


async def test_an_escalation_is_resumed_once_a_person_approved(
    node: Node, provider: SyntheticProvider
) -> None:
    async with node.client() as client:
        held = await client.propose(
            "create_payout", "payout:b-3", {"amountMinor": 20000, "currency": "USD"}
        )
        assert held.verdict is Verdict.ESCALATE
        assert held.outcome is Outcome.ESCALATE_PENDING
        assert held.escalation is not None
        still = await client.resume(held.escalation)
        assert still.outcome is Outcome.ESCALATE_PENDING
        request_id = held.escalation["request_id"]
        status, _ = await node.post(
            f"/v1/approvals/{request_id}",
            "treasury-lead",
            {"decision": "APPROVE", "reason": "checked the invoice"},
        )
        assert status == 200
        done = await client.resume(held.escalation)
        assert done.outcome is Outcome.COMPLETED
        assert len(provider.received) == 1


class GatedProvider:
    """A provider whose payouts wait for a gate, so a first attempt stays in flight."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.arrived = 0
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()

        async def payout(request: web.Request) -> web.Response:
            await request.read()
            self.arrived += 1
            await self.gate.wait()
            return web.json_response({"reference": "gated-1"}, status=202)

        app.router.add_post("/payouts", payout)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = self.runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        self.gate.set()
        if self.runner is not None:
            await self.runner.cleanup()


async def test_in_progress_waits_and_the_retry_carries_the_same_key(tmp_path: Path) -> None:
    gated = GatedProvider()
    await gated.start()
    running = await _node(tmp_path, gated.url)
    waits: list[str] = []
    try:
        async with (
            running.client() as first,
            running.client(on_wait=lambda reason, s: waits.append(reason)) as second,
        ):
            one = asyncio.create_task(
                first.propose("create_payout", "payout:b-4", PAYOUT, idempotency_key="same-key")
            )

            async def in_flight() -> bool:
                return gated.arrived == 1

            await wait_until(in_flight, timeout=30, what="the first attempt to reach the provider")
            two = asyncio.create_task(
                second.propose("create_payout", "payout:b-4", PAYOUT, idempotency_key="same-key")
            )

            async def told_to_wait() -> bool:
                return bool(waits)

            await wait_until(told_to_wait, timeout=30, what="409 IDEMPOTENCY_IN_PROGRESS")
            assert "still in flight" in waits[0]
            gated.gate.set()
            a, b = await asyncio.gather(one, two)
        assert a.outcome is Outcome.COMPLETED
        assert b.outcome is Outcome.COMPLETED
        assert b.replayed is True
        assert gated.arrived == 1, "the same key never executes twice"
    finally:
        await running.executor.close()
        await gated.stop()


async def test_a_halt_is_waited_out_politely_on_retry_after(
    node: Node, provider: SyntheticProvider
) -> None:
    status, _ = await node.post("/v1/control/halt", OPERATOR_ID, {"reason": "drill"})
    assert status == 200
    async with node.client(max_wait=0.5) as impatient:
        with pytest.raises(Unavailable) as info:
            await impatient.propose("create_payout", "payout:b-5", PAYOUT, idempotency_key="k-5")
        assert info.value.retry_after == 30
        assert info.value.idempotency_key == "k-5"
        assert info.value.last is not None
        assert "EXECUTOR_HALTED" in info.value.last.reason_codes
    waits: list[float] = []
    async with node.client(
        max_wait=60, retry_after_cap=0.05, on_wait=lambda reason, s: waits.append(s)
    ) as patient:
        task = asyncio.create_task(
            patient.propose("create_payout", "payout:b-5", PAYOUT, idempotency_key="k-5")
        )

        async def waited() -> bool:
            return len(waits) >= 2

        await wait_until(waited, timeout=30, what="the client to wait on Retry-After")
        assert len(provider.received) == 0
        status, _ = await node.post("/v1/control/resume", OPERATOR_ID, {"reason": "drill over"})
        assert status == 200
        decision = await task
    assert decision.outcome is Outcome.COMPLETED
    assert len(provider.received) == 1


async def test_the_documented_tool_reads_as_text_for_a_model(
    node: Node, provider: SyntheticProvider
) -> None:
    import importlib.util

    path = Path(__file__).parents[2] / "examples" / "agent_client.py"
    spec = importlib.util.spec_from_file_location("agent_client_example", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    async with node.client() as client:
        tool = module.payout_tool(client)
        assert (await tool(1200, "USD", "b-9")).startswith("Paid 1200 USD")
        assert "Held for a person's approval" in await tool(20000, "USD", "b-9")
        assert "AMOUNT_ABOVE_POLICY" in await tool(900000, "USD", "b-9")
    assert len(provider.received) == 1
