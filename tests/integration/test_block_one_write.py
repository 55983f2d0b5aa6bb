"""A BLOCK is one durable write: its idempotency key and its final answer together (issue 34).

The pipeline decides a proposal before it claims the key (``Pipeline.propose``), so a
BLOCK records its key with its answer in one write (``UseStore.idempotency_record``) where it
took two before (the key claimed, then completed). What must not change, checked here on a real
executor in process: the answer and its three lines, a replay that adds only PROPOSAL_REPLAYED,
a key kept for another proposal or still in flight that is answered first and leaves no line,
and an ALLOW that still claims its key before its attempt.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from agentsafe.executor.lifecycle.pipeline import Proposal
from agentsafe.executor.principals import LEGACY_PRINCIPAL_ID
from agentsafe.executor.state.records import IdempotencyKind
from agentsafe.executor.tools.harness import DEMO_TENANT

from .conftest import Factory, Running, count_statements

OVER_POLICY = 900_000  # over the example policy's ceiling: BLOCK
WITHIN_POLICY = 4000


def _count_writes(run: Running) -> list[str]:
    """Every durable write the SQLite store is handed, by the store method that made it."""
    store: Any = run.executor.store
    made: list[str] = []
    write = store._write

    def counted(fn: Callable[..., Any]) -> Any:
        made.append(fn.__qualname__.split(".<locals>")[0].rsplit(".", 1)[-1])
        return write(fn)

    store._write = counted
    return made


def _lines(run: Running) -> list[str]:
    return [name for name, _ in run.evidence.events]


async def test_a_block_is_one_write_with_its_answer_and_its_three_lines(running: Factory) -> None:
    run = await running()
    writes = _count_writes(run)
    status, body = await run.propose(amount=OVER_POLICY, key="block-1")
    assert (status, body["verdict"], body["outcome"], body["executed"]) == (
        200,
        "BLOCK",
        "BLOCKED",
        False,
    )
    assert writes == ["idempotency_record"]
    assert _lines(run) == ["PROPOSAL_RECEIVED", "DECISION", "EXECUTION_BLOCKED"]
    received, decision, blocked = (fields for _, fields in run.evidence.events)
    assert received["intent_id"] == decision["intent_id"] == blocked["intent_id"]
    assert received["intent_id"] == body["intent_id"]
    assert decision["decision_id"] == blocked["decision_id"] == body["decision_id"]
    assert run.provider.received == []

    again_status, again = await run.propose(amount=OVER_POLICY, key="block-1")
    assert again_status == 200
    assert (again.pop("replayed"), body.pop("replayed")) == (True, False)
    assert again == body
    assert _lines(run)[3:] == ["PROPOSAL_REPLAYED"]
    assert writes == ["idempotency_record", "idempotency_record"]


async def test_a_block_under_a_key_kept_for_another_proposal_is_refused_first(
    running: Factory,
) -> None:
    run = await running()
    status, body = await run.propose(amount=WITHIN_POLICY, key="shared-1")
    assert (status, body["outcome"]) == (200, "COMPLETED")
    before = len(run.evidence.events)
    status, refused = await run.propose(amount=OVER_POLICY, key="shared-1")
    assert status == 409
    assert refused["error"]["code"] == "IDEMPOTENCY_KEY_CONFLICT"
    assert run.evidence.events[before:] == []
    assert len(run.provider.received) == 1


async def test_a_block_under_a_key_in_flight_is_refused_and_leaves_the_key_alone(
    running: Factory,
) -> None:
    run = await running()
    proposal = Proposal(
        action="create_payout",
        target="payout:beneficiary-1",
        parameters={"currency": "USD", "amountMinor": OVER_POLICY},
        idempotency_key="flight-1",
    )
    scope = {"tenant": DEMO_TENANT, "principal": LEGACY_PRINCIPAL_ID, "key": "flight-1"}
    now = run.executor.clock.now()
    store = run.executor.store
    begun = await store.idempotency_begin(
        **scope, payload_digest=proposal.payload_digest(), now=now
    )
    assert begun.kind is IdempotencyKind.NEW
    status, refused = await run.propose(amount=OVER_POLICY, key="flight-1")
    assert status == 409
    assert refused["error"]["code"] == "IDEMPOTENCY_IN_PROGRESS"
    assert run.evidence.events == []
    # The key is still the first request's to complete: the BLOCK wrote nothing into it.
    answer = {"status": 200, "body": {"outcome": "COMPLETED"}}
    await store.idempotency_complete(**scope, response=answer, now=now)
    kept = await store.idempotency_begin(**scope, payload_digest=proposal.payload_digest(), now=now)
    assert (kept.kind, kept.response) == (IdempotencyKind.REPLAY, answer)


async def test_an_allow_still_claims_its_key_before_its_attempt(running: Factory) -> None:
    run = await running()
    writes = _count_writes(run)
    status, body = await run.propose(amount=WITHIN_POLICY, key="allow-1")
    assert (status, body["outcome"]) == (200, "COMPLETED")
    assert writes[0] == "idempotency_begin"
    assert "idempotency_record" not in writes
    assert _lines(run)[:2] == ["PROPOSAL_RECEIVED", "DECISION"]


@pytest.mark.slow
@pytest.mark.xdist_group("postgres")
async def test_on_postgresql_a_block_sends_one_statement(running: Factory, pg_url: str) -> None:
    run = await running(
        EXECUTOR_STORE_URL=pg_url,
        EXECUTOR_REPLICA_ID="solo",
        EXECUTOR_ATTEMPT_LEASE_SECONDS="5",
        DOWNSTREAM_TIMEOUT_MS="2000",
    )
    sent = count_statements(run)
    status, body = await run.propose(amount=OVER_POLICY, key="pg-block-1")
    assert (status, body["outcome"]) == (200, "BLOCKED")
    assert sent == ["INSERT"]
    assert _lines(run) == ["PROPOSAL_RECEIVED", "DECISION", "EXECUTION_BLOCKED"]
    again_status, again = await run.propose(amount=OVER_POLICY, key="pg-block-1")
    assert again_status == 200
    assert (again.pop("replayed"), body.pop("replayed")) == (True, False)
    assert again == body
