"""What one load split over two processes costs per request, for the floor and the executor.

Issue 34's goal 2 asks an ``EXECUTOR_WORKERS=2`` group to spend at most 1.1x one worker's CPU
per ALLOW at the same load (``goals.py`` row ``workers-cpu``). Split over two processes, each
one serves half the requests in flight, and a durable server's CPU per request depends on that:
a group commit, a journal ``fsync`` and a wake-up of the event loop are shared by the requests
in flight together, so at half the concurrency each request carries twice its share of them.
This script separates that effect from the cost of two processes, for the floor
(``floor_server.py allow``: the least a server with the same guarantees can do) and for the
executor, in alternating rounds, each shape started once and kept for every round:

* ``one``: one process at concurrency C (``--concurrency``);
* ``one-half``: the same process at C/2, the share each of two processes gets;
* ``two``: two processes at C, the client's connections split evenly between them. For the
  floor, two independent servers (each its own port and database, so nothing is shared and the
  split is exactly even; ``goals.py``'s reference shares one port, where the kernel's split of
  the connections varies from run to run). For the executor, an ``EXECUTOR_WORKERS=2`` group
  (supervisor and workers counted);
* ``two-double``: the same two at 2C, each process at C again.

Printed per server: each shape's median CPU ms per ALLOW over the rounds (every round's figure
beside it) and three ratios to ``one``: ``two`` (goal 2's form), ``one-half`` (what half the
concurrency costs one process) and ``two-double`` (what two processes cost at the same
concurrency each). Speed is never asserted in tests; docs/performance.md keeps the readings.

    python benchmarks/split.py [--requests N] [--concurrency C] [--rounds R]
                               [--skip-executor] [--client go|python] [-o json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, NamedTuple

from goals import ALLOW_AMOUNT, start_floors
from lifecycle import worker_group
from loadclient import default_client, drive, proposal_template

from agentsafe.executor.tools.harness import ExecutorProcess, ProviderProcess, Workspace, free_port

SHAPES = ("one", "one-half", "two", "two-double")
"""The shapes, in the order the first round runs them (odd rounds run them backwards)."""


class Server(NamedTuple):
    """One server's processes: where to send its load and whose CPU to count."""

    urls: list[str]
    pids: list[int]
    headers: dict[str, str]


def say(text: str) -> None:
    print(f"split: {text}", file=sys.stderr, flush=True)


@contextlib.asynccontextmanager
async def floors(root: Path, provider: ProviderProcess) -> AsyncIterator[dict[str, Server]]:
    """The floor as one server and as two independent ones."""
    started: list[asyncio.subprocess.Process] = []
    servers: dict[str, Server] = {}
    try:
        for name, count in (("one", 1), ("two", 2)):
            urls, pids = [], []
            for index in range(count):
                directory = root / f"floor-{name}-{index}"
                directory.mkdir()
                port = free_port()
                args = ["allow", str(port), str(directory), provider.url + "/payouts"]
                (process,) = await start_floors(args, port, 1, f"floor {name} ({index + 1})")
                started.append(process)
                urls.append(f"http://127.0.0.1:{port}/v1/actions")
                pids.append(process.pid)
            servers[name] = Server(urls, pids, {})
        yield servers
    finally:
        for process in started:
            process.terminate()
            await process.wait()


@contextlib.asynccontextmanager
async def executors(root: Path, provider: ProviderProcess) -> AsyncIterator[dict[str, Server]]:
    """One executor, and an ``EXECUTOR_WORKERS=2`` group."""
    workspace = Workspace(root / "ws-one")
    single = ExecutorProcess(
        workspace.environment(provider_url=provider.url, port=free_port()), root
    )
    await single.start()
    try:
        assert single.process is not None
        auth = {"authorization": f"Bearer {workspace.caller_token}"}
        one = Server([single.url + "/v1/actions"], [single.process.pid], auth)
        async with worker_group(root, provider.url, 2) as (group, pids):
            token = {"authorization": f"Bearer {group.token}"}
            yield {"one": one, "two": Server([group.url + "/v1/actions"], pids, token)}
    finally:
        single.terminate()


async def rounds(
    label: str, servers: dict[str, Server], args: argparse.Namespace
) -> dict[str, list[list[float]]]:
    """CPU ms per ALLOW of each shape, one entry per round: each process's part of it."""
    c = args.concurrency
    plan = {
        "one": (servers["one"], c),
        "one-half": (servers["one"], max(c // 2, 1)),
        "two": (servers["two"], c),
        "two-double": (servers["two"], 2 * c),
    }
    readings: dict[str, list[list[float]]] = {shape: [] for shape in SHAPES}
    for index in range(args.rounds):
        for shape in SHAPES if index % 2 == 0 else SHAPES[::-1]:
            server, concurrency = plan[shape]
            result = await drive(
                args.client,
                f"{label} {shape}",
                server.urls,
                proposal_template(f"{label}-{shape}-{index}", ALLOW_AMOUNT),
                server.headers,
                requests=args.requests,
                concurrency=concurrency,
                warmup=max(args.requests // 10, concurrency),
                pids=server.pids,
            )
            if result["failures"]:
                raise SystemExit(f"split: {label} {shape}: {result['failures']} answers not 200")
            readings[shape].append(list(result["cpu_ms_each"]))
            parts = " + ".join(f"{part:.2f}" for part in result["cpu_ms_each"])
            cpu = result["cpu_ms"]
            say(f"{label} round {index + 1}, {shape} (c={concurrency}): {cpu:.3f} ms ({parts})")
    return readings


def summary(readings: dict[str, list[list[float]]]) -> dict[str, Any]:
    """Per shape: every round's CPU ms per ALLOW (``rounds``, with each process's part in
    ``parts``), their median (``cpu_ms``), and the medians' ratios to ``one``."""
    totals = {shape: [sum(parts) for parts in rows] for shape, rows in readings.items()}
    medians = {shape: statistics.median(values) for shape, values in totals.items()}
    return {
        "cpu_ms": medians,
        "rounds": totals,
        "parts": readings,
        "ratios": {shape: medians[shape] / medians["one"] for shape in SHAPES[1:]},
    }


async def run(args: argparse.Namespace, root: Path | None = None) -> dict[str, Any]:
    """Every shape of every server; their processes and files under ``root`` (default: a new
    temporary directory, kept for its logs)."""
    root = root or Path(tempfile.mkdtemp(prefix="agentsafe-split-"))
    provider = ProviderProcess(root)
    await provider.start()
    out: dict[str, Any] = {"requests": args.requests, "concurrency": args.concurrency}
    try:
        async with floors(root, provider) as servers:
            out["floor"] = summary(await rounds("floor", servers, args))
        if not args.skip_executor:
            async with executors(root, provider) as servers:
                out["executor"] = summary(await rounds("executor", servers, args))
    finally:
        provider.terminate()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=3000, help="measured ALLOWs per shape")
    parser.add_argument("--concurrency", type=int, default=16, help="C: requests in flight")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds of every shape")
    parser.add_argument("--skip-executor", action="store_true", help="the floor's shapes only")
    parser.add_argument(
        "--client",
        choices=("go", "python"),
        default=default_client(),
        help="the load generator (go: the compiled one, when go is on PATH)",
    )
    parser.add_argument(
        "-o", "--output", choices=("text", "json"), default="text", help="json: for scripts"
    )
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.requests < 1 or args.concurrency < 2:
        parser.error("--rounds and --requests need at least 1, --concurrency at least 2")
    result = asyncio.run(run(args))
    if args.output == "json":
        print(json.dumps(result, indent=2))
        return 0
    c = args.concurrency
    for server in ("floor", "executor"):
        if server not in result:
            continue
        each = result[server]
        print(f"{server}: CPU ms per ALLOW, median of {args.rounds} rounds (each round)")
        levels = (f"c={c}", f"c={c // 2}", f"c={c}", f"c={2 * c}")
        for shape, detail in zip(SHAPES, levels, strict=True):
            rounds_text = ", ".join(f"{value:.3f}" for value in each["rounds"][shape])
            ratio = "" if shape == "one" else f"  {each['ratios'][shape]:.2f}x one"
            print(f"  {shape:<11} {detail:<6} {each['cpu_ms'][shape]:.3f} ({rounds_text}){ratio}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
