"""Lifecycle benchmark: the executor's BLOCK and ALLOW-and-execute paths against a raw baseline.

In one run, each on its own loopback process and measured by the same client:

* baseline: a raw aiohttp JSON endpoint (benchmarks/baseline_server.py);
* BLOCK: ``agentsafe serve`` refusing an over-policy amount (door, capture, idempotency record,
  ceilings, policy evaluation, evidence) - nothing reaches the provider;
* ALLOW: the full path - the above plus the grant, the durable journal (fsync), the single-use
  claim in SQLite (synchronous=FULL), and the POST to a loopback synthetic provider.

The client is the compiled load generator (``benchmarks/loadgen``, built on demand; see
``benchmarks/loadclient.py``) when ``go`` is on PATH, else the Python client; ``--client``
chooses. Every request carries its own idempotency key. Prints requests/s, p50 and p99 for each,
the ratio to the baseline, and the load average before and after. Speed is never asserted in
tests; record the figures in docs/performance.md.

With ``--workers N`` (N above 1) the same run then starts a second executor with
``EXECUTOR_WORKERS=N`` (its own workspace, the same provider and client) and adds the row
"ALLOW and execute once, N workers", and its ratio to the one-process ALLOW row (issue 18's goal:
2 workers on 2 cores at least 1.7 times one). Its CPU and RSS columns cover the supervisor and
every worker (RSS: the largest process).

    python benchmarks/lifecycle.py [--requests N] [--concurrency C] [--client go|python]
                                   [--soak N] [--workers N] [--tracing OTLP_ENDPOINT]

With ``--tracing`` the ALLOW row is run again by an executor with tracing on (docs/tracing.md),
every trace sampled, then 1% of them, exporting to the collector at that endpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from loadclient import default_client, drive, listeners, proposal_template
from rich.console import Console
from rich.table import Table

from agentsafe.executor.tools.harness import (
    ExecutorProcess,
    ProviderProcess,
    Workspace,
    free_port,
    wait_until,
)


@contextlib.asynccontextmanager
async def worker_group(
    root: Path, provider_url: str, workers: int
) -> AsyncIterator[tuple[ExecutorProcess, list[int]]]:
    """An ``EXECUTOR_WORKERS=workers`` group (its own workspace under ``root``), yielded with the
    supervisor's and every worker's pid once every worker listens on the group's port, not only
    the first (``/ready`` is answered by whichever listens first)."""
    port = free_port()
    env = Workspace(root / "ws-workers").environment(
        provider_url=provider_url, port=port, extra={"EXECUTOR_WORKERS": str(workers)}
    )
    group = ExecutorProcess(env, root, "executor-workers")
    await group.start()
    try:
        assert group.process is not None
        supervisor = group.process.pid

        async def all_up() -> bool:
            return len(group_pids(supervisor)) == workers + 1 and listeners(port) >= workers

        await wait_until(all_up, timeout=60, what="every worker")
        yield group, group_pids(supervisor)
    finally:
        group.terminate()


def group_pids(pid: int) -> list[int]:
    """A supervisor and its worker processes (``EXECUTOR_WORKERS``), from /proc."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [pid, *map(int, children)]


async def _traced_allow(
    endpoint: str, ratio: str, root: Path, provider_url: str, options: dict[str, Any]
) -> dict[str, Any]:
    """The ALLOW row again with tracing on (docs/tracing.md): every new trace sampled with
    ``ratio``, exported over OTLP/HTTP to ``endpoint`` (a collector the caller runs)."""
    env = Workspace(root / f"ws-traced-{ratio}").environment(
        provider_url=provider_url,
        port=free_port(),
        extra={
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_TRACES_SAMPLER": "traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": ratio,
        },
    )
    traced = ExecutorProcess(env, root, f"executor-traced-{ratio}")
    await traced.start()
    try:
        return await drive(
            options["client"],
            f"ALLOW and execute once, traced {float(ratio):.0%}",
            [traced.url + "/v1/actions"],
            proposal_template(f"allow-t{ratio}", 100),
            {"authorization": f"Bearer {traced.token}"},
            requests=options["requests"],
            concurrency=options["concurrency"],
            warmup=options["warmup"],
            pids=[traced.process.pid] if traced.process else None,
        )
    finally:
        traced.terminate()


async def run(
    requests: int,
    concurrency: int,
    client: str,
    soak: int = 0,
    workers: int = 1,
    tracing: str | None = None,
) -> list[dict[str, Any]]:
    root = Path(tempfile.mkdtemp(prefix="agentsafe-bench-"))
    rows: list[dict[str, Any]] = []
    warmup = max(requests // 10, concurrency)
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
        rows.append(
            await drive(
                client,
                "baseline: raw aiohttp JSON",
                [f"http://127.0.0.1:{port}/v1/actions"],
                proposal_template("base", 100),
                {},
                requests=requests,
                concurrency=concurrency,
                warmup=warmup,
                pids=[baseline.pid],
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
    urls = [executor.url + "/v1/actions"]
    drive_options = {
        "client": client,
        "requests": requests,
        "concurrency": concurrency,
        "warmup": warmup,
    }
    try:
        phases = [
            ("BLOCK (over policy)", "block", 900000, requests),
            ("ALLOW and execute once", "allow", 100, requests),
        ]
        if soak:
            phases.append((f"ALLOW, {soak} more (RSS growth)", "soak", 100, soak))
        for name, prefix, amount, count in phases:
            rows.append(
                await drive(
                    client,
                    name,
                    urls,
                    proposal_template(prefix, amount),
                    headers,
                    requests=count,
                    concurrency=concurrency,
                    warmup=warmup,
                    pids=[executor.process.pid] if executor.process else None,
                )
            )
        executor.terminate()
        for ratio in ("1.0", "0.01") if tracing else ():
            rows.append(await _traced_allow(tracing, ratio, root, provider.url, drive_options))
        if workers > 1:
            async with worker_group(root, provider.url, workers) as (group, pids):
                rows.append(
                    await drive(
                        client,
                        f"ALLOW and execute once, {workers} workers",
                        [group.url + "/v1/actions"],
                        proposal_template("allow-w", 100),
                        {"authorization": f"Bearer {group.token}"},
                        requests=requests,
                        concurrency=concurrency,
                        warmup=warmup,
                        pids=pids,
                    )
                )
    finally:
        executor.terminate()
        provider.terminate()
    return rows


def render(title: str, rows: list[dict[str, Any]], against: str) -> None:
    base = rows[0]["rps"]
    table = Table(title=title)
    columns = (
        "path",
        "req/s",
        "p50 ms",
        "p99 ms",
        "p99/p50",
        f"vs {against}",
        "CPU ms/req",
        "RSS MiB",
    )
    for column in (*columns, "non-200"):
        table.add_column(column, justify="left" if column == "path" else "right")
    for row in rows:
        table.add_row(
            row["name"],
            f"{row['rps']:.0f}",
            f"{row['p50']:.2f}",
            f"{row['p99']:.2f}",
            f"{row['p99'] / row['p50']:.2f}" if row["p50"] else "-",
            f"{row['rps'] / base:.3f}",
            f"{row['cpu_ms']:.2f}" if "cpu_ms" in row else "-",
            f"{row['rss_mb']:.0f}" if "rss_mb" in row else "-",
            str(row["failures"]),
        )
    Console(width=140).print(table)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--client", choices=("go", "python"), default=default_client())
    parser.add_argument(
        "--soak", type=int, default=0, help="then N more ALLOW requests, to compare the RSS"
    )
    parser.add_argument(
        "--tracing",
        metavar="OTLP_ENDPOINT",
        default=None,
        help="then the ALLOW row again with tracing on, sampled 100%% and 1%%, exporting to"
        " this OTLP/HTTP collector (e.g. a Jaeger all-in-one from make e2e-build)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="then ALLOW again on an executor with EXECUTOR_WORKERS=N (N above 1)",
    )
    args = parser.parse_args()
    before = os.getloadavg()
    rows = asyncio.run(
        run(
            args.requests,
            args.concurrency,
            args.client,
            args.soak,
            workers=args.workers,
            tracing=args.tracing,
        )
    )
    after = os.getloadavg()
    render(
        f"lifecycle: {args.requests} requests, concurrency {args.concurrency}, "
        f"{args.client} client, load average {before[0]:.1f} -> {after[0]:.1f}",
        rows,
        "baseline",
    )
    one = next((r for r in rows if r["name"] == "ALLOW and execute once"), None)
    group = next((r for r in rows if r["name"].endswith(" workers")), None)
    if one is not None and group is not None and one["rps"]:
        print(f"ALLOW, {args.workers} workers / one process: {group['rps'] / one['rps']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
