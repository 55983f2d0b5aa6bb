"""Shared-store benchmark: the ALLOW-and-execute path on PostgreSQL beside SQLite.

In one run, with the same client, provider and policy (``benchmarks/lifecycle.py``'s driver):

* ALLOW on SQLite: the embedded store (``EXECUTOR_STATE_DIR``, WAL, ``synchronous=FULL``);
* ALLOW on PostgreSQL, one replica: ``EXECUTOR_STORE_URL`` to a throwaway loopback server
  (``tools/pgserver.py``: initdb in a temporary directory; ``fsync=off``, so the figure is the
  protocol's cost, not a disk's);
* ALLOW on PostgreSQL, three replicas: the same database, requests spread round-robin.

Each ALLOW claims a grant, records idempotency, journals the attempt (the file journal with
fsync, and on PostgreSQL the open-attempt row and its lease) and POSTs to a loopback synthetic
provider. Prints requests/s, p50 and p99 and the ratio to SQLite. Speed is never asserted in
tests; record the figures in docs/performance.md.

    python benchmarks/shared_store.py [--requests N] [--concurrency C]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console
from rich.table import Table

from agentsafe.executor.tools.harness import ExecutorProcess, ProviderProcess, Workspace, free_port
from agentsafe.executor.tools.pgserver import postgres_server


def _proposals(prefix: str, count: int) -> list[dict[str, Any]]:
    return [
        {
            "proposal": {
                "action": "create_payout",
                "target": f"payout:bench-{i}",
                "parameters": {"amountMinor": 100, "currency": "EUR"},
            },
            "idempotency_key": f"{prefix}-{i}",
        }
        for i in range(count)
    ]


async def _drive(
    urls: list[str], bodies: list[dict[str, Any]], headers: dict[str, str], concurrency: int
) -> dict[str, Any]:
    latencies: list[float] = []
    failures = 0
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)
    targets = itertools.cycle(urls)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as s:

        async def worker() -> None:
            nonlocal failures
            while not queue.empty():
                body = queue.get_nowait()
                started = time.perf_counter()
                async with s.post(next(targets), json=body, headers=headers) as response:
                    await response.read()
                    if response.status != 200:
                        failures += 1
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    ordered = sorted(latencies)
    return {
        "rps": len(latencies) / elapsed,
        "p50": statistics.median(ordered) * 1000,
        "p99": ordered[max(0, int(len(ordered) * 0.99) - 1)] * 1000,
        "failures": failures,
    }


async def _measure(
    name: str,
    envs: list[dict[str, str]],
    root: Path,
    token: str,
    requests: int,
    concurrency: int,
) -> dict[str, Any]:
    executors = [ExecutorProcess(env, root, f"{name}-{i}") for i, env in enumerate(envs)]
    await asyncio.gather(*(e.start() for e in executors))
    headers = {"authorization": f"Bearer {token}"}
    urls = [e.url + "/v1/actions" for e in executors]
    try:
        slug = "".join(c if c.isalnum() else "-" for c in name.lower())
        await _drive(urls, _proposals(f"warm-{slug}", requests // 10), headers, concurrency)
        row = await _drive(urls, _proposals(slug, requests), headers, concurrency)
    finally:
        for executor in executors:
            executor.terminate()
    return {"name": name, **row}


async def run(requests: int, concurrency: int) -> list[dict[str, Any]]:
    root = Path(tempfile.mkdtemp(prefix="agentsafe-bench-store-"))
    provider = ProviderProcess(root)
    await provider.start()
    workspace = Workspace(root / "ws")
    rows: list[dict[str, Any]] = []
    try:
        sqlite_env = workspace.environment(provider_url=provider.url, port=free_port())
        rows.append(
            await _measure(
                "ALLOW on SQLite", [sqlite_env], root, workspace.caller_token, requests, concurrency
            )
        )
        with postgres_server() as server:
            for replicas in (1, 3):
                url = server.create_database()
                envs = []
                for i in range(replicas):
                    own = root / f"pg{replicas}-{i}"
                    for sub in ("journal", "evidence"):
                        (own / sub).mkdir(parents=True, mode=0o700)
                    env = workspace.environment(
                        provider_url=provider.url,
                        port=free_port(),
                        extra={
                            "EXECUTOR_STORE_URL": url,
                            "EXECUTOR_REPLICA_ID": f"bench-{i}",
                            "EXECUTOR_JOURNAL_DIR": str(own / "journal"),
                            "EXECUTOR_EVIDENCE_DIR": str(own / "evidence"),
                        },
                    )
                    env.pop("EXECUTOR_STATE_DIR")
                    envs.append(env)
                name = f"ALLOW on PostgreSQL, {replicas} replica{'s' if replicas > 1 else ''}"
                rows.append(
                    await _measure(name, envs, root, workspace.caller_token, requests, concurrency)
                )
    finally:
        provider.terminate()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    rows = asyncio.run(run(args.requests, args.concurrency))
    base = rows[0]["rps"]
    table = Table(title=f"shared store: {args.requests} requests, concurrency {args.concurrency}")
    for column in ("path", "req/s", "p50 ms", "p99 ms", "throughput vs SQLite", "non-200"):
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
