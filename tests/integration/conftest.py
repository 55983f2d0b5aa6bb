"""Fixtures for lifecycle tests: a real synthetic provider and a real executor on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agentsafe.executor.assembly import assemble
from agentsafe.executor.clock import Clock
from agentsafe.executor.events import MemorySink, Streams
from agentsafe.executor.plane import Executor
from agentsafe.executor.tools.harness import Workspace
from agentsafe.executor.tools.synthetic import SyntheticProvider


@dataclass
class Running:
    executor: Executor
    provider: SyntheticProvider
    workspace: Workspace
    session: aiohttp.ClientSession
    url: str
    evidence: MemorySink
    security: MemorySink

    @property
    def token(self) -> str:
        return self.workspace.caller_token

    async def post(
        self,
        path: str,
        body: Any,
        *,
        token: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, Any], aiohttp.typedefs.LooseHeaders]:
        hdrs = {"authorization": f"Bearer {token if token is not None else self.token}"}
        hdrs.update(headers or {})
        async with self.session.post(self.url + path, json=body, headers=hdrs) as response:
            return response.status, await response.json(), response.headers

    async def propose(
        self, amount: int | None = 5000, *, key: str = "k-1", currency: str = "USD", **extra: Any
    ) -> tuple[int, dict[str, Any]]:
        params: dict[str, Any] = {"currency": currency}
        if amount is not None:
            params["amountMinor"] = amount
        body = {
            "proposal": {
                "action": extra.pop("action", "create_payout"),
                "target": "payout:beneficiary-1",
                "parameters": params,
            },
            "idempotency_key": key,
            **extra,
        }
        status, payload, _ = await self.post("/v1/actions", body)
        return status, payload


Factory = Callable[..., Awaitable[Running]]


def count_statements(run: Running) -> list[str]:
    """From now on, the first word of every statement the shared store's pool sends on its own
    (``PostgresPool.statement``; transactions are not counted), in order."""
    pool: Any = run.executor.backend.store._store  # type: ignore[attr-defined]
    sent: list[str] = []
    statement = pool.statement

    async def counted(sql: str, params: Any = ()) -> Any:
        sent.append(sql.split()[0])
        return await statement(sql, params)

    pool.statement = counted
    return sent


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[Factory]:
    started: list[Running] = []
    provider = SyntheticProvider()
    await provider.start()

    async def start(
        mode: str = "ENFORCEMENT", *, clock: Clock | None = None, **extra: str
    ) -> Running:
        workspace = Workspace(tmp_path / f"ws{len(started)}")
        # Port 0: the listener takes a free port itself, so no other test (or xdist worker)
        # can take it between choosing and binding.
        env = workspace.environment(provider_url=provider.base_url, port=0, mode=mode, extra=extra)
        evidence, security = MemorySink(), MemorySink()
        executor = await assemble(
            env, streams=Streams(evidence=evidence, security=security), clock=clock
        )
        await executor.reconcile_at_start()
        await executor.listen()
        session = aiohttp.ClientSession()
        run = Running(
            executor=executor,
            provider=provider,
            workspace=workspace,
            session=session,
            url=f"http://127.0.0.1:{executor.port}",
            evidence=evidence,
            security=security,
        )
        started.append(run)
        return run

    yield start
    for run in started:
        await run.session.close()
        await run.executor.close()
    await provider.stop()
