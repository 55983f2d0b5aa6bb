"""The halt over real sockets, from each of its causes, and the rules for leaving it.

Causes: an operator (``POST /v1/control/halt``), ``EXECUTOR_HALT_FILE`` (created while running,
and present when a real ``agentsafe serve`` process starts), and a spike of door refusals
(``EXECUTOR_HALT_ON_AUTH_FAILURES``). While halted a proposal is a 503 in the usual answer shape
with ``Retry-After: 30`` and an EXECUTION_BLOCKED line, the authority is not asked, ``/ready`` is
503 and ``/health`` 200; resume is refused while the halt file exists; work already in flight
when the halt lands finishes and is journaled.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from agentsafe.executor.tools.harness import ExecutorProcess, Workspace, free_port, wait_until
from agentsafe.executor.tools.synthetic import SyntheticProvider

from .estate import (
    LEGACY_VARIABLES,
    Cast,
    Estate,
    Reply,
    Starter,
    estates,
    write_private,
)


@pytest.fixture
async def start(tmp_path: Path) -> AsyncIterator[Starter]:
    async with estates(tmp_path) as starter:
        yield starter


def assert_halted_answer(reply: Reply) -> None:
    assert reply.status == 503, reply.text
    body = reply.body
    assert body["verdict"] == "BLOCK"
    assert body["outcome"] == "BLOCKED"
    assert body["fail_closed"] is True
    assert body["reason_codes"] == ["EXECUTOR_HALTED"]
    assert body["executed"] is False
    assert body["authorization"] is None
    assert body["decision_id"] is None
    assert reply.headers["Retry-After"] == "30"


async def assert_halted(estate: Estate, *, key: str) -> None:
    """A proposal is refused without the authority; /ready is 503, /health 200."""
    decisions = len(estate.evidence.named("DECISION"))
    blocked = len(estate.evidence.named("EXECUTION_BLOCKED"))
    received = len(estate.provider.received)
    assert_halted_answer(await estate.client.propose(estate.cast.agent.token, key=key))
    assert len(estate.evidence.named("DECISION")) == decisions
    assert estate.evidence.named("EXECUTION_BLOCKED")[blocked:] == [
        {"caller": "agent", "reason_codes": ["EXECUTOR_HALTED"]}
    ]
    assert len(estate.provider.received) == received
    ready = await estate.client.get("/ready")
    assert ready.status == 503
    assert ready.body == {"ready": False, "code": "EXECUTOR_HALTED"}
    assert (await estate.client.get("/health")).status == 200


# ----------------------------------------------------------------------------- operator


async def test_an_operator_halt_blocks_proposals_until_resumed(start: Starter) -> None:
    estate = await start()
    ops = estate.cast.ops.token
    reply = await estate.client.post("/v1/control/halt", {"reason": "incident 42"}, token=ops)
    assert reply.status == 200, reply.text
    await assert_halted(estate, key="during")
    assert estate.evidence.named("PROPOSAL_RECEIVED") == []
    assert estate.executor.metrics.executions.value(outcome="BLOCKED") == 1
    assert estate.executor.metrics.proposals.value(verdict="ALLOW") == 0
    # A second halt adds nothing; the first cause and reason stand.
    reply = await estate.client.post("/v1/control/halt", {"reason": "again"}, token=ops)
    assert [c["reason"] for c in reply.body["causes"]] == ["incident 42"]
    assert len(estate.security.named("HALTED")) == 1

    reply = await estate.client.post("/v1/control/resume", {"reason": "resolved"}, token=ops)
    assert reply.status == 200, reply.text
    assert (await estate.client.get("/ready")).status == 200
    # The refused key was not recorded: it runs now, once.
    answer = await estate.client.propose(estate.cast.agent.token, key="during")
    assert answer.status == 200, answer.text
    assert answer.body["outcome"] == "COMPLETED"
    assert answer.body["replayed"] is False
    assert [r.idempotency_key for r in estate.provider.received] == ["during"]


# ----------------------------------------------------------------------------- the halt file


async def test_a_halt_file_created_while_running_halts_and_holds_resume(
    start: Starter, tmp_path: Path
) -> None:
    halt_file = tmp_path / "HALT"
    estate = await start(background=True, extra={"EXECUTOR_HALT_FILE": str(halt_file)})
    ops = estate.cast.ops.token
    assert (await estate.client.propose(estate.cast.agent.token, key="before")).status == 200
    halt_file.write_text("stop\n")

    async def not_ready() -> bool:
        return (await estate.client.get("/ready")).status == 503

    await wait_until(not_ready, timeout=15, what="the halt file to be noticed")
    await assert_halted(estate, key="during")
    status = (await estate.client.get("/v1/control/status", token=ops)).body["halt"]
    assert [c["cause"] for c in status["causes"]] == ["FILE"]
    assert status["halt_file_present"] is True
    assert estate.security.named("HALTED") == [
        {"cause": "FILE", "reason": "the halt file exists", "by": None}
    ]

    reply = await estate.client.post("/v1/control/resume", {"reason": "try"}, token=ops)
    assert (reply.status, reply.code) == (409, "HALT_CAUSE_PERSISTS")
    assert estate.executor.halt.halted is True
    await assert_halted(estate, key="still")

    halt_file.unlink()
    reply = await estate.client.post("/v1/control/resume", {"reason": "file removed"}, token=ops)
    assert reply.status == 200, reply.text
    assert (await estate.client.get("/ready")).status == 200
    assert (await estate.client.propose(estate.cast.agent.token, key="after")).status == 200
    assert [r.idempotency_key for r in estate.provider.received] == ["before", "after"]


@pytest.mark.slow
async def test_a_process_started_with_the_halt_file_present_starts_halted(
    tmp_path: Path,
) -> None:
    provider = SyntheticProvider()
    await provider.start()
    workspace = Workspace(tmp_path / "ws")
    cast = Cast(revoked=frozenset({"workload-agent", "oncall", "auditor"}))
    principals = write_private(tmp_path / "principals.json", cast.document())
    halt_file = tmp_path / "HALT"
    halt_file.write_text("halted before start\n")
    env = workspace.environment(provider_url=provider.base_url, port=free_port())
    for name in LEGACY_VARIABLES:
        env.pop(name)
    env.update({"EXECUTOR_PRINCIPALS_FILE": str(principals), "EXECUTOR_HALT_FILE": str(halt_file)})
    process = ExecutorProcess(env, tmp_path)
    ops = {"Authorization": f"Bearer {cast.ops.token}"}
    agent = {"Authorization": f"Bearer {cast.agent.token}"}
    proposal = {
        "proposal": {
            "action": "create_payout",
            "target": "payout:beneficiary-1",
            "parameters": {"amountMinor": 100, "currency": "USD"},
        },
        "idempotency_key": "k-1",
    }
    try:
        await process.start(expect_ready=False)
        async with aiohttp.ClientSession() as session:
            async with session.get(process.url + "/ready") as r:
                assert r.status == 503
                assert (await r.json())["code"] == "EXECUTOR_HALTED"
            async with session.post(process.url + "/v1/actions", json=proposal, headers=agent) as r:
                assert r.status == 503
                assert r.headers["Retry-After"] == "30"
                body = await r.json()
                assert body["reason_codes"] == ["EXECUTOR_HALTED"]
                assert body["outcome"] == "BLOCKED"
            async with session.get(process.url + "/v1/control/status", headers=ops) as r:
                halt = (await r.json())["halt"]
                assert [c["cause"] for c in halt["causes"]] == ["FILE"]
            resume = {"reason": "go"}
            async with session.post(
                process.url + "/v1/control/resume", json=resume, headers=ops
            ) as r:
                assert r.status == 409
                assert (await r.json())["error"]["code"] == "HALT_CAUSE_PERSISTS"
            halt_file.unlink()
            async with session.post(
                process.url + "/v1/control/resume", json=resume, headers=ops
            ) as r:
                assert r.status == 200

            async def ready() -> bool:
                async with session.get(process.url + "/ready") as r:
                    return r.status == 200

            await wait_until(ready, timeout=15, what="the executor to be ready after resume")
            async with session.post(process.url + "/v1/actions", json=proposal, headers=agent) as r:
                assert r.status == 200
                assert (await r.json())["outcome"] == "COMPLETED"
        assert [r.idempotency_key for r in provider.received] == ["k-1"]
    finally:
        status = process.terminate()
        await provider.stop()
    assert status == 0
    security = process.stderr_events()
    halted = [e for e in security if e.get("event") == "HALTED"]
    assert [(e["cause"], e["by"]) for e in halted] == [("FILE", None)]
    evidence = process.stdout_events()
    assert [e["reason_codes"] for e in evidence if e.get("event") == "EXECUTION_BLOCKED"] == [
        ["EXECUTOR_HALTED"]
    ]


# ----------------------------------------------------------------------------- refusal spike


async def test_a_spike_of_door_refusals_halts_by_itself(start: Starter) -> None:
    estate = await start(extra={"EXECUTOR_HALT_ON_AUTH_FAILURES": "3/60"})
    for n in range(2):
        await estate.client.propose(f"guess-{n}", key="k")
    assert estate.executor.halt.halted is False
    assert (await estate.client.propose(estate.cast.agent.token, key="ok")).status == 200
    # a proven principal's own refusal is no authentication failure (issue 16 item 2)
    assert (
        await estate.client.get("/v1/control/status", token=estate.cast.agent.token)
    ).status == (403)
    assert estate.executor.halt.halted is False
    await estate.client.propose("guess-2", key="k")
    assert estate.security.named("HALTED") == [
        {"cause": "AUTH_SPIKE", "reason": "door refusals crossed the threshold", "by": None}
    ]
    await assert_halted(estate, key="during")
    ops = estate.cast.ops.token
    halt = (await estate.client.get("/v1/control/status", token=ops)).body["halt"]
    assert [c["cause"] for c in halt["causes"]] == ["AUTH_SPIKE"]
    assert estate.executor.metrics.halts.value(cause="AUTH_SPIKE") == 1
    reply = await estate.client.post("/v1/control/resume", {"reason": "scanner blocked"}, token=ops)
    assert reply.status == 200, reply.text
    # The detector starts afresh: one more refusal does not halt again.
    await estate.client.propose("guess-again", key="k")
    assert estate.executor.halt.halted is False
    assert (await estate.client.propose(estate.cast.agent.token, key="after")).status == 200


# ----------------------------------------------------------------------------- in flight


class GatedProvider:
    """A loopback provider that takes a payout and answers only when the test opens the gate."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.arrived: list[str] = []
        self.executed: set[str] = set()
        self._runner: web.AppRunner | None = None
        self.base_url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/payouts", self._create)
        app.router.add_get("/payouts/{key}", self._lookup)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.base_url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        self.gate.set()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _create(self, request: web.Request) -> web.Response:
        key = request.headers.get("Idempotency-Key", "")
        await request.read()
        self.arrived.append(key)
        await self.gate.wait()
        self.executed.add(key)
        return web.json_response({"reference": f"gated_{uuid.uuid4().hex[:8]}"}, status=202)

    async def _lookup(self, request: web.Request) -> web.Response:
        if request.match_info["key"] in self.executed:
            return web.json_response({"reference": "gated", "status": "executed"})
        return web.json_response({"code": "NOT_FOUND"}, status=404)


def _journal_records(estate: Estate) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for path in sorted((estate.workspace.root / "journal").rglob("*.jsonl")):
        records += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return records


async def test_work_in_flight_when_the_halt_lands_finishes_and_is_journaled(
    start: Starter,
) -> None:
    gated = GatedProvider()
    await gated.start()
    try:
        estate = await start(provider_url=gated.base_url)
        ops = estate.cast.ops.token
        first = asyncio.ensure_future(
            estate.client.propose(estate.cast.agent.token, key="inflight")
        )
        await wait_until(
            lambda: asyncio.sleep(0, result=gated.arrived == ["inflight"]),
            timeout=15,
            what="the provider to receive the payout",
        )
        reply = await estate.client.post("/v1/control/halt", {"reason": "mid-flight"}, token=ops)
        assert reply.status == 200, reply.text
        assert_halted_answer(await estate.client.propose(estate.cast.agent.token, key="late"))
        assert gated.arrived == ["inflight"]

        gated.gate.set()
        answer = await first
        assert answer.status == 200, answer.text
        assert answer.body["outcome"] == "COMPLETED"
        assert answer.body["executed"] is True
        assert answer.body["finalization"] == "RECORDED"
        assert estate.executor.halt.halted is True

        outcome = estate.evidence.named("OUTCOME")
        assert [(o["outcome"], o["caller"]) for o in outcome] == [("COMPLETED", "agent")]
        records = _journal_records(estate)
        closed = [r for r in records if r["record"] == "ATTEMPT_CLOSED"]
        assert [(r["outcome"], r["executed"]) for r in closed] == [("COMPLETED", True)]
        reply = await estate.client.get("/v1/control/open-attempts", token=ops)
        assert reply.body == {"open_attempts": []}
        # Its answer is recorded: presenting the key again replays and executes nothing.
        await estate.client.post("/v1/control/resume", {"reason": "done"}, token=ops)
        again = await estate.client.propose(estate.cast.agent.token, key="inflight")
        assert again.body["replayed"] is True
        assert gated.arrived == ["inflight"]
    finally:
        await gated.stop()
