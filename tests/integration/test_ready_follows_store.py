"""A real ``agentsafe serve`` on a real PostgreSQL: ``/ready`` follows the store (issue 31, item 3).

docs/high-availability.md promises that a replica asks the database once a second and that
``/ready`` is 503 while it does not answer, so a load balancer stops routing to it. The bound
polled here is that promise (``READY_FOLLOWS_STORE_SECONDS``): the ping interval plus the ping's
own deadline. Before the fix ``/ready`` stayed 200 READY for about 11 s after the server stopped
(the ping waited for the pool's connect timeout, twice).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from agentsafe.executor.host.workgate import READY_FOLLOWS_STORE_SECONDS
from agentsafe.executor.tools.harness import (
    ExecutorProcess,
    ProviderProcess,
    Workspace,
    free_port,
    wait_until,
)
from tests.support.postgres import PostgresServer

# One worker runs every test on the one PostgreSQL server its session starts.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("postgres")]

SCHEDULING = 1.0
"""What this test's own polling and a loaded CI machine may add to the bound; the old code took
about 11 s, so the check still tells the two apart."""


async def test_ready_turns_503_within_the_documented_bound_and_back(
    tmp_path: Path, postgres: PostgresServer, pg_url: str
) -> None:
    provider = ProviderProcess(tmp_path)
    await provider.start()
    workspace = Workspace(tmp_path / "ws")
    env = workspace.environment(
        provider_url=provider.url,
        port=free_port(),
        extra={"EXECUTOR_STORE_URL": pg_url, "EXECUTOR_REPLICA_ID": "solo"},
    )
    replica = ExecutorProcess(env, tmp_path, "solo")
    await replica.start()
    stopped = False
    try:
        async with aiohttp.ClientSession() as session:

            async def ready_is(status: int, code: str) -> bool:
                got, body = await replica.get_json(session, "/ready")
                return got == status and body.get("code") == code

            assert await ready_is(200, "READY")
            await asyncio.to_thread(postgres.stop)
            stopped = True
            await wait_until(
                lambda: ready_is(503, "STORE_UNAVAILABLE"),
                timeout=READY_FOLLOWS_STORE_SECONDS + SCHEDULING,
                interval=0.1,
                what="/ready to answer 503 once the database stopped",
            )
            await asyncio.to_thread(postgres.start)
            stopped = False
            await wait_until(
                lambda: ready_is(200, "READY"),
                timeout=READY_FOLLOWS_STORE_SECONDS + SCHEDULING,
                interval=0.1,
                what="/ready to answer READY once the database is back",
            )
    finally:
        if stopped:
            await asyncio.to_thread(postgres.start)
        replica.terminate()
        provider.terminate()
