"""Concurrent proposals: distinct ones each executed once; one key from 30 callers executed once."""

from __future__ import annotations

import asyncio

from .conftest import Factory


async def test_distinct_proposals_each_execute_once(running: Factory) -> None:
    run = await running()
    answers = await asyncio.gather(*(run.propose(100 + i, key=f"distinct-{i}") for i in range(25)))
    assert all(body["outcome"] == "COMPLETED" for _, body in answers)
    keys = [r.idempotency_key for r in run.provider.received]
    assert sorted(keys) == sorted(f"distinct-{i}" for i in range(25))


async def test_one_key_from_thirty_callers_executes_once(running: Factory) -> None:
    run = await running()
    answers = await asyncio.gather(*(run.propose(700, key="shared-key") for _ in range(30)))
    statuses = [status for status, _ in answers]
    completed = [b for s, b in answers if s == 200 and b.get("outcome") == "COMPLETED"]
    assert len(run.provider.received) == 1
    assert len(completed) >= 1
    # Every answer is either the execution, its replay, or "still in flight".
    for status, body in answers:
        if status == 409:
            assert body["error"]["code"] == "IDEMPOTENCY_IN_PROGRESS"
        else:
            assert status == 200
            assert body["outcome"] == "COMPLETED"
    assert sum(1 for b in completed if not b["replayed"]) == 1
    assert statuses.count(200) >= 1
