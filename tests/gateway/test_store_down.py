"""Issue 30 item 8: ``agentsafe proxy`` on a real PostgreSQL shared store that is stopped under
it answers 503 ``STORE_UNAVAILABLE`` with ``Retry-After`` from its work gate (it watches the
store as ``serve`` does), not 500 ``INTERNAL_ERROR`` after the store's connect timeout."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from agentsafe.executor.gateway.demo import DEMO_POLICY
from agentsafe.executor.tools.harness import wait_until
from tests.gateway.test_proxy import Upstream, start_configured_gateway
from tests.support.postgres import PostgresServer

# One worker runs every test on the one PostgreSQL server its session starts.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("postgres")]


@pytest.fixture
async def provider() -> AsyncIterator[Upstream]:
    server = Upstream()
    await server.start()
    yield server
    await server.stop()


async def test_with_the_store_down_the_gateway_answers_503_with_retry_after(
    tmp_path: Path, provider: Upstream, postgres: PostgresServer, pg_url: str
) -> None:
    process, port, control_port, _ = await start_configured_gateway(
        tmp_path,
        provider,
        mode="ENFORCEMENT",
        policy_text=DEMO_POLICY,
        EXECUTOR_STORE_URL=pg_url,
        EXECUTOR_REPLICA_ID="gateway-0",
    )
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(f"http://127.0.0.1:{port}/pay", json={"amountMinor": 1}) as r:
                assert r.status == 201, await r.text()
            await asyncio.to_thread(postgres.stop)
            # Before the watch has noticed, a proposal meets the store itself: 503 too.
            async with session.post(
                f"http://127.0.0.1:{port}/pay",
                json={"amountMinor": 3},
                headers={"Idempotency-Key": "as-it-drops"},
            ) as r:
                assert r.status == 503, await r.text()
                assert r.headers["Retry-After"]
                assert (await r.json())["error"]["code"] == "STORE_UNAVAILABLE"

            async def noticed() -> bool:
                async with session.get(f"http://127.0.0.1:{control_port}/ready") as r:
                    return r.status == 503

            await wait_until(noticed, timeout=30, what="the gateway to see the store is down")
            async with session.post(
                f"http://127.0.0.1:{port}/pay",
                json={"amountMinor": 2},
                headers={"Idempotency-Key": "while-down"},
            ) as r:
                assert r.status == 503, await r.text()
                assert r.headers["Retry-After"]
                answer = await r.json()
        assert answer["error"]["code"] == "STORE_UNAVAILABLE"
        assert answer["reason_codes"] == ["STORE_UNAVAILABLE"], "refused by the work gate"
        assert len(provider.received) == 1, "nothing forwarded while the store is down"
    finally:
        await asyncio.to_thread(postgres.start)
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
