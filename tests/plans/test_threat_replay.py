"""Threat: replay -- one approval runs each step at most once, here and in other processes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from agentsafe.executor.plans import AgentSafetyError, thaw
from agentsafe.executor.state.usestore import SQLiteUseStore

from . import support as s
from .conftest import World

RACER = Path(__file__).parent / "replay_racer.py"


async def _code(world: World, **overrides: object) -> str:
    with pytest.raises(AgentSafetyError) as caught:
        await world.execute(**overrides)
    return caught.value.code


async def test_second_execution_is_refused(world: World) -> None:
    await world.execute()
    assert await _code(world) == "APPROVAL_ALREADY_USED"
    assert len(world.executor.calls) == 1


async def test_replay_with_a_new_execution_id_is_refused(world: World) -> None:
    await world.execute()
    assert await _code(world, execution_id="execution-43") == "APPROVAL_ALREADY_USED"


async def test_replay_through_a_second_store_handle(world: World, tmp_path: Path) -> None:
    await world.execute()
    other = await SQLiteUseStore.open(tmp_path / "state", clock=s.manual_clock())
    try:
        assert await _code(world, use_consumer=other) == "APPROVAL_ALREADY_USED"
    finally:
        await other.close()


async def test_failed_start_audit_leaves_the_approval_spent(world: World) -> None:
    world.audit.fail_on = {"agent_plan_step.started"}
    assert await _code(world) == "AUDIT_START_FAILED"
    assert world.executor.calls == []
    world.audit.fail_on = set()
    assert await _code(world) == "APPROVAL_ALREADY_USED"
    assert world.executor.calls == []


async def test_failed_execution_cannot_be_retried_on_the_same_approval(world: World) -> None:
    world.executor.fail = True
    assert await _code(world) == "EXECUTOR_FAILED"
    world.executor.fail = False
    assert await _code(world) == "APPROVAL_ALREADY_USED"


async def test_concurrent_attempts_execute_exactly_once(world: World) -> None:
    results = await asyncio.gather(
        *(world.execute(execution_id=f"e-{i}") for i in range(12)), return_exceptions=True
    )
    ok = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, AgentSafetyError)]
    assert len(ok) == 1
    assert len(refused) == 11
    assert {r.code for r in refused} == {"APPROVAL_ALREADY_USED"}
    assert len(world.executor.calls) == 1


async def test_forged_consumption_record_is_refused(world: World) -> None:
    from agentsafe.executor.plans import verify_agent_execution_receipt

    result = await world.execute()
    receipt = s.deep(result.receipt)
    receipt["payload"]["consumption"]["token"] = "0" * 64
    with pytest.raises(AgentSafetyError):
        await verify_agent_execution_receipt(receipt, **world.verify_kwargs())


@pytest.mark.slow
async def test_two_processes_race_one_approval(world: World, tmp_path: Path) -> None:
    state = tmp_path / "state"
    key_bytes = world.approver.verifier()._public.public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    job = tmp_path / "job.json"
    job.write_text(
        json.dumps(
            {
                "dryRun": thaw(world.dry_run),
                "policy": world.policy,
                "approval": thaw(world.approval),
                "publicKey": key_bytes.hex(),
                "context": s.context(),
                "operation": s.operation(),
            }
        )
    )
    children = [
        subprocess.Popen(
            [sys.executable, str(RACER), str(state), str(job), f"proc-{i}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
        )
        for i in range(2)
    ]
    try:
        for child in children:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "READY"
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.close()
        outputs = []
        for child in children:
            assert child.stdout is not None
            outputs.append(json.loads(child.stdout.read()))
            assert child.wait(timeout=60) == 0
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
            if child.stdout is not None:
                child.stdout.close()
    assert sorted(o["result"] for o in outputs) == ["APPROVAL_ALREADY_USED", "EXECUTED"]
    assert sum(o["calls"] for o in outputs) == 1
