"""Lifecycle benchmark: the executor's BLOCK and ALLOW-and-execute paths against a raw baseline.

In one run, each on its own loopback process and measured by the same client:

* baseline: a raw aiohttp JSON endpoint (benchmarks/baseline_server.py);
* BLOCK: ``agentsafe serve`` refusing an over-policy amount (door, capture, idempotency record,
  ceilings, policy evaluation, evidence) - nothing reaches the provider;
* ALLOW: the full path - the above plus the grant, the durable journal (fsync), the single-use
  claim in SQLite (synchronous=FULL), and the POST to a loopback synthetic provider.

Prints requests/s, p50 and p99 for each and the ratio to the baseline. Speed is never asserted in
tests; record the figures in docs/performance.md.

    python benchmarks/lifecycle.py [--requests N] [--concurrency C]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console
from rich.table import Table

from agentsafe.executor.tools.harness import (
    ExecutorProcess,
    ProviderProcess,
    Workspace,
    free_port,
    wait_until,
)


async def _drive(
    url: str, bodies: list[dict[str, Any]], headers: dict[str, str], concurrency: int
) -> tuple[float, list[float], int]:
    latencies: list[float] = []
    failures = 0
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            nonlocal failures
            while not queue.empty():
                body = queue.get_nowait()
                started = time.perf_counter()
                async with session.post(url, json=body, headers=headers) as response:
                    await response.read()
                    if response.status != 200:
                        failures += 1
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return elapsed, latencies, failures


def _proposals(prefix: str, amount: int, count: int) -> list[dict[str, Any]]:
    return [
        {
            "proposal": {
                "action": "create_payout",
                "target": f"payout:bench-{i}",
                "parameters": {"amountMinor": amount, "currency": "EUR"},
            },
            "idempotency_key": f"{prefix}-{i}",
        }
        for i in range(count)
    ]


def _row(name: str, elapsed: float, latencies: list[float], failures: int) -> dict[str, Any]:
    ordered = sorted(latencies)
    return {
        "name": name,
        "rps": len(latencies) / elapsed,
        "p50": statistics.median(ordered) * 1000,
        "p99": ordered[max(0, int(len(ordered) * 0.99) - 1)] * 1000,
        "n": len(latencies),
        "failures": failures,
    }


async def run(requests: int, concurrency: int) -> list[dict[str, Any]]:
    root = Path(tempfile.mkdtemp(prefix="agentsafe-bench-"))
    rows: list[dict[str, Any]] = []
    port = free_port()
    baseline = await asyncio.create_subprocess_exec(
        sys.executable, str(Path(__file__).parent / "baseline_server.py"), str(port)
    )
    try:

        async def up() -> bool:
            try:
                async with (
                    aiohttp.ClientSession() as s,
                    s.post(f"http://127.0.0.1:{port}/v1/actions", json={}) as r,
                ):
                    return r.status == 200
            except aiohttp.ClientError:
                return False

        await wait_until(up, timeout=30, what="the baseline server")
        body = _proposals("warm", 100, requests)
        await _drive(f"http://127.0.0.1:{port}/v1/actions", body[: requests // 10], {}, concurrency)
        rows.append(
            _row(
                "baseline: raw aiohttp JSON",
                *await _drive(f"http://127.0.0.1:{port}/v1/actions", body, {}, concurrency),
            )
        )
    finally:
        baseline.terminate()
        await baseline.wait()

    provider = ProviderProcess(root)
    await provider.start()
    workspace = Workspace(root / "ws")
    env = workspace.environment(provider_url=provider.url, port=free_port())
    executor = ExecutorProcess(env, root)
    await executor.start()
    headers = {"authorization": f"Bearer {workspace.caller_token}"}
    url = executor.url + "/v1/actions"
    try:
        await _drive(url, _proposals("warm-block", 900000, requests // 10), headers, concurrency)
        rows.append(
            _row(
                "BLOCK (over policy)",
                *await _drive(url, _proposals("block", 900000, requests), headers, concurrency),
            )
        )
        rows.append(
            _row(
                "ALLOW and execute once",
                *await _drive(url, _proposals("allow", 100, requests), headers, concurrency),
            )
        )
    finally:
        executor.terminate()
        provider.terminate()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    rows = asyncio.run(run(args.requests, args.concurrency))
    base = rows[0]["rps"]
    table = Table(title=f"lifecycle: {args.requests} requests, concurrency {args.concurrency}")
    for column in ("path", "req/s", "p50 ms", "p99 ms", "throughput vs baseline", "non-200"):
        table.add_column(column, justify="left" if column == "path" else "right")
    for row in rows:
        table.add_row(
            row["name"],
            f"{row['rps']:.0f}",
            f"{row['p50']:.2f}",
            f"{row['p99']:.2f}",
            f"{row['rps'] / base:.3f}",
            str(row["failures"]),
        )
    Console(width=120).print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
