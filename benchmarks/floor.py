"""Floor benchmark: what the guarantees alone cost, beside the raw baseline, in one run.

Rows, each its own loopback process, all driven by the same client as benchmarks/lifecycle.py:

* baseline: the raw aiohttp JSON endpoint (benchmarks/baseline_server.py);
* floor, BLOCK: only the unavoidable steps of a refusal, each in its cheapest Python form
  (benchmarks/floor_server.py: intent hash, two group-committed durable SQLite writes, one
  chained evidence line);
* floor, ALLOW: those plus an Ed25519 grant, a third durable write, three fsynced journal
  records and one kept-alive POST to a loopback provider (the baseline server again).

The executor's own rows come from ``benchmarks/lifecycle.py``: the ratio of a floor row to the
baseline is the best any Python implementation of these steps gets on this machine, so it
bounds what issue 18's ratio goals can mean here. Speed is never asserted in tests.

    python benchmarks/floor.py [--requests N] [--concurrency C] [--client go|python]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
from lifecycle import render
from loadclient import default_client, drive, proposal_template

from agentsafe.executor.tools.harness import free_port, wait_until

HERE = Path(__file__).resolve().parent


async def _serve(
    args: list[str], port: int, what: str, env: dict[str, str] | None = None
) -> asyncio.subprocess.Process:
    """Start ``args`` under this interpreter (``env`` added to this process's environment) and
    wait until it answers HTTP on ``port``."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, *args, env=None if env is None else {**os.environ, **env}
    )

    async def up() -> bool:
        try:
            async with (
                aiohttp.ClientSession() as s,
                s.get(f"http://127.0.0.1:{port}/") as r,
            ):
                return r.status in (404, 405)
        except aiohttp.ClientError:
            return False

    await wait_until(up, timeout=30, what=what)
    return process


async def run(requests: int, concurrency: int, client: str) -> list[dict[str, Any]]:
    root = Path(tempfile.mkdtemp(prefix="agentsafe-floor-"))
    warmup = max(requests // 10, concurrency)
    rows: list[dict[str, Any]] = []
    provider_port = free_port()
    provider = await _serve(
        [str(HERE / "baseline_server.py"), str(provider_port)], provider_port, "the baseline"
    )
    provider_url = f"http://127.0.0.1:{provider_port}/v1/actions"
    try:
        rows.append(
            await drive(
                client,
                "baseline: raw aiohttp JSON",
                [provider_url],
                proposal_template("base", 100),
                {},
                requests=requests,
                concurrency=concurrency,
                warmup=warmup,
                pids=[provider.pid],
            )
        )
        for mode, name in (("block", "floor, BLOCK"), ("allow", "floor, ALLOW")):
            directory = root / mode
            directory.mkdir()
            port = free_port()
            server = await _serve(
                [str(HERE / "floor_server.py"), mode, str(port), str(directory), provider_url],
                port,
                f"the {mode} floor",
            )
            try:
                rows.append(
                    await drive(
                        client,
                        name,
                        [f"http://127.0.0.1:{port}/v1/actions"],
                        proposal_template(mode, 100),
                        {},
                        requests=requests,
                        concurrency=concurrency,
                        warmup=warmup,
                        pids=[server.pid],
                    )
                )
            finally:
                server.terminate()
                await server.wait()
    finally:
        provider.terminate()
        await provider.wait()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--client", choices=("go", "python"), default=default_client())
    args = parser.parse_args()
    before = os.getloadavg()
    rows = asyncio.run(run(args.requests, args.concurrency, args.client))
    after = os.getloadavg()
    render(
        f"floor: {args.requests} requests, concurrency {args.concurrency}, "
        f"{args.client} client, load average {before[0]:.1f} -> {after[0]:.1f}",
        rows,
        "baseline",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
