"""The proposal route, the pipeline and the attempt each run as their own task (issue 32).

The route awaits ``Pipeline.propose`` as a task and the pipeline awaits ``Attempt.run`` as a
task, so a resumption after a durable step starts at the coroutine that waited, not again at
the route's middleware. What must not change, checked here on a real executor in process
(``assembly.assemble``, as the integration fixture builds it): cancelling the route still
reaches the attempt (and a started attempt's key is still never freed), and on PostgreSQL the
attempt's task still sees the key holder ``idempotency_begin`` set in the pipeline's task
(``state/pgconn.py`` ``HELD_KEY``), which fences its ATTEMPT_OPENED, while the pipeline's task
lets go of it when it records the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any

import aiohttp
import psycopg
import pytest

from agentsafe.executor.lifecycle.answers import Answer
from agentsafe.executor.lifecycle.pipeline import Pipeline, Proposal
from agentsafe.executor.principals import Principal
from agentsafe.executor.state import pgconn

from .conftest import Factory, count_statements


class Watched:
    """The pipeline's ``propose`` and ``Attempt.run``, delegated, with the task each runs in
    and the key holder each sees recorded."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.route: asyncio.Task[Any] | None = None
        self.pipeline: asyncio.Task[Any] | None = None
        self.attempt: asyncio.Task[Any] | None = None
        self.held_in_attempt: Any = "unset"
        self.held_after: Any = "unset"
        propose, attempt = pipeline.propose, pipeline._attempt

        def watched_propose(
            principal: Principal, proposal: Proposal
        ) -> Coroutine[Any, Any, Answer]:
            self.route = asyncio.current_task()  # called by the route, in its task

            async def run() -> Answer:
                self.pipeline = asyncio.current_task()
                answer = await propose(principal, proposal)
                self.held_after = pgconn.HELD_KEY.get()
                return answer

            return run()

        class WatchedAttempt:
            async def run(inner, **kwargs: Any) -> Answer:
                self.attempt = asyncio.current_task()
                self.held_in_attempt = pgconn.HELD_KEY.get()
                return await attempt.run(**kwargs)

        pipeline.propose = watched_propose  # type: ignore[method-assign]
        pipeline._attempt = WatchedAttempt()  # type: ignore[assignment]


async def test_the_route_the_pipeline_and_the_attempt_are_three_tasks(running: Factory) -> None:
    run = await running()
    watched = Watched(run.executor.pipeline)
    status, body = await run.propose(amount=4000, key="tasks-1")
    assert (status, body["outcome"], body["executed"]) == (200, "COMPLETED", True)
    assert None not in (watched.route, watched.pipeline, watched.attempt)
    assert len({id(watched.route), id(watched.pipeline), id(watched.attempt)}) == 3
    assert watched.pipeline is not None
    assert watched.pipeline.done()
    assert watched.attempt is not None
    assert watched.attempt.done()
    assert len(run.provider.received) == 1


async def test_cancelling_the_route_cancels_the_pipeline_and_its_attempt(
    running: Factory,
) -> None:
    run = await running()
    pipeline = run.executor.pipeline
    watched = Watched(pipeline)
    entered = asyncio.Event()
    cancelled: list[str] = []

    class Blocking:
        """An attempt that has started (its key is never freed now) and waits for ever."""

        async def run(self, **kwargs: Any) -> Answer:
            watched.attempt = asyncio.current_task()
            kwargs["progress"].started = True
            entered.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append("attempt")
                raise
            raise AssertionError("unreachable")

    pipeline._attempt = Blocking()  # type: ignore[assignment]
    request = asyncio.ensure_future(run.propose(amount=4000, key="cancel-1"))
    await asyncio.wait_for(entered.wait(), 30)
    assert watched.route is not None
    watched.route.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(asyncio.shield(watched.route), 30)
    assert cancelled == ["attempt"]
    assert watched.attempt is not None
    assert watched.attempt.cancelled()
    assert watched.pipeline is not None
    assert watched.pipeline.cancelled()
    with pytest.raises(aiohttp.ClientError):  # the route answered nothing: the peer sees a drop
        await request
    # The attempt had started: the key stays in flight, never freed for a second run.
    store: Any = run.executor.store
    rows = await store._run(
        lambda conn: conn.execute("SELECT state FROM idempotency WHERE key = 'cancel-1'").fetchall()
    )
    assert rows == [("IN_PROGRESS",)]


@pytest.mark.slow
@pytest.mark.xdist_group("postgres")
async def test_on_postgresql_the_attempt_task_is_fenced_by_the_key_its_pipeline_holds(
    running: Factory, pg_url: str
) -> None:
    run = await running(
        EXECUTOR_STORE_URL=pg_url,
        EXECUTOR_REPLICA_ID="solo",
        EXECUTOR_ATTEMPT_LEASE_SECONDS="5",
        DOWNSTREAM_TIMEOUT_MS="2000",  # the lease must outlive a send (issue 29)
    )
    assert run.executor.backend.name == "postgresql"
    watched = Watched(run.executor.pipeline)
    status, body = await run.propose(amount=4000, key="held-1")
    assert (status, body["outcome"]) == (200, "COMPLETED")
    # The attempt's task inherited the holder idempotency_begin set in the pipeline's task ...
    assert watched.held_in_attempt not in ("unset", None)
    held = watched.held_in_attempt
    (tenant, principal, key), holder = held.scope, held.holder
    assert key == "held-1"
    # ... which the database fenced its open with: the key's row names the attempt it opened.
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        cur = await conn.execute(
            "SELECT state, holder, opened_attempt, attempt_id FROM idempotency"
            " WHERE tenant = %s AND principal = %s AND key = %s",
            (tenant, principal, key),
        )
        row = await cur.fetchone()
    assert row is not None
    assert row[0] == "DONE"
    assert row[1] == holder
    assert row[2] is not None
    assert row[2] == row[3]
    # The pipeline's task let go of the key when it recorded the answer.
    assert watched.held_after is None


@pytest.mark.slow
@pytest.mark.xdist_group("postgres")
async def test_on_postgresql_an_allow_sends_four_statements_and_its_key_replays_the_answer(
    running: Factory, pg_url: str
) -> None:
    """The key's begin, the fenced open, the fenced claim, and the close that completes the key
    (issue 34: the close and the key's completion were two statements, two commits)."""
    run = await running(
        EXECUTOR_STORE_URL=pg_url,
        EXECUTOR_REPLICA_ID="solo",
        EXECUTOR_ATTEMPT_LEASE_SECONDS="5",
        DOWNSTREAM_TIMEOUT_MS="2000",
    )
    sent = count_statements(run)
    status, body = await run.propose(amount=4000, key="four-1")
    assert (status, body["outcome"]) == (200, "COMPLETED")
    assert sent == ["INSERT", "WITH", "WITH", "WITH"]
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        cur = await conn.execute("SELECT state FROM attempts")
        assert await cur.fetchall() == [("CLOSED",)]
    again_status, again = await run.propose(amount=4000, key="four-1")
    assert again_status == 200
    assert (again.pop("replayed"), body.pop("replayed")) == (True, False)
    assert again == body
