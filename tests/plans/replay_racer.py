"""A separate process executing one approved step against a shared SQLite use store
(test_threat_replay.py). Usage: ``python replay_racer.py STATE_DIR JOB_JSON NAME``. Prints
``READY``, waits for one line on stdin, executes, prints ``{"result", "calls"}``."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from agentsafe.executor.clock import ManualClock, parse_ms
from agentsafe.executor.grants import SigningKey
from agentsafe.executor.plans import (
    AgentSafetyError,
    Ed25519Signer,
    Ed25519Verifier,
    StepRequest,
    StepResult,
    execute_agent_plan_step,
)
from agentsafe.executor.state.usestore import SQLiteUseStore


class Executor:
    tool = "query"
    effect = "read"

    def __init__(self) -> None:
        self.calls = 0

    async def execute(self, request: StepRequest) -> StepResult:
        self.calls += 1
        return StepResult(value=[{"OBJECTID": 1}], rows=1)


class Audit:
    async def append(self, event: object) -> None:
        return None


async def main(state_dir: str, job_path: str, name: str) -> None:
    job = json.loads(Path(job_path).read_text())
    clock = ManualClock(parse_ms("2026-07-10T20:00:00.000Z"))
    store = await SQLiteUseStore.open(Path(state_dir), clock=clock)
    executor = Executor()
    try:
        print("READY", flush=True)
        sys.stdin.readline()
        try:
            await execute_agent_plan_step(
                dry_run=job["dryRun"],
                policy=job["policy"],
                approval=job["approval"],
                approval_verifier=Ed25519Verifier(
                    Ed25519PublicKey.from_public_bytes(bytes.fromhex(job["publicKey"]))
                ),
                context=job["context"],
                step_id="query-incidents",
                operation=job["operation"],
                use_consumer=store,
                executor=executor,
                audit_sink=Audit(),
                receipt_signer=Ed25519Signer(SigningKey.generate()),
                execution_id=name,
                clock=clock,
                max_clock_skew_ms=5_000,
            )
            result = "EXECUTED"
        except AgentSafetyError as exc:
            result = exc.code
        print(json.dumps({"result": result, "calls": executor.calls}), flush=True)
    finally:
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
