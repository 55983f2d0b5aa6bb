"""Issue 34's goals in one run: the executor beside the floor, each ratio measured side by side.

Every row is its own loopback process, driven by the same client (``benchmarks/loadclient.py``:
the compiled load generator when ``go`` is on PATH, else the Python one; ``--client`` chooses),
one after the other in one run, against one synthetic provider
(``agentsafe.executor.tools.synthetic``, the executor's usual loopback provider):

* floor, BLOCK and floor, ALLOW: ``benchmarks/floor_server.py``, only the steps the guarantees
  make unavoidable (its ALLOW posts to the same synthetic provider, with the idempotency key);
* executor, BLOCK (an over-policy amount) and executor, ALLOW (SQLite, ``synchronous=FULL``):
  one ``agentsafe serve``;
* floor, ALLOW, 2 processes, then executor, ALLOW with ``EXECUTOR_WORKERS=2`` (its own
  workspace; CPU over the supervisor and both workers): the floor's two processes share one port
  (``SO_REUSEPORT``) and one SQLite database, as the workers share theirs. Each row starts only
  once every process (every worker) listens on the port, and prints each one's part of the CPU;
* floor, ALLOW on PostgreSQL (its three writes as the shared store sends them: autocommit
  statements on an async pool), then executor, ALLOW on PostgreSQL: a throwaway loopback cluster
  (``tools/pgserver.py``) with its durability on (``fsync``, ``synchronous_commit``,
  ``full_page_writes``, read back with ``SHOW``); skipped with a message when the binaries are
  absent, or with ``--skip-postgres``;
* at concurrency 1: floor and executor BLOCK, the provider alone, floor and executor ALLOW;
* beside each floor row of goals 1 and 3, the *complete floor* (``floor_server.py --complete``):
  the same floor plus the steps it leaves out and the specification still makes unavoidable
  (the caller's token, the intent's binding, the policy's schema and rules, one redacted
  chained line per lifecycle event with checkpoints, the answer kept with the key). Its ratios
  are references with no limit (``block-cpu-complete``, ``allow-cpu-complete``,
  ``c1-allow-p50-complete``, ``postgres-vs-floor-complete``): the goals stay set against the
  floor the issue names.

The two rows of each ratio run back to back (floor BLOCK beside executor BLOCK, and so on), so
that a drift of the machine between minutes (a busy disk's fsync latency) falls on both.

CPU per request is the server processes' user + system CPU over the measured phase (from
``/proc``; warm-up excluded) divided by its requests. Each run prints one table per goal: the
measured value, what it is set against (the floor's, or one worker's), the ratio, the goal and
whether it is met. ``-o json`` prints all of it, and every row, as one JSON object. Speed is never
asserted in tests; record the figures in docs/performance.md, taken on a quiet machine.

``--repeat N`` makes N whole runs one after the other (each with its own processes, rows side by
side as above) and judges each goal on the median of the N runs' ratios, printing every run's
ratio beside it: on this machine one run's ratio moves by 15-30% with no change to the code
(docs/performance.md), more than some goals' margins, so a single run cannot settle them. Its
JSON holds every run's rows in ``runs``; ``rows`` and the provider's subtracted time are the last
run's.

The goals (issue 34):

1. CPU per request against the floor, at ``--concurrency``: executor BLOCK / floor BLOCK <= 2,
   and executor ALLOW / floor ALLOW <= 2.
2. Workers: CPU per ALLOW of the ``EXECUTOR_WORKERS=2`` group / one worker's (the executor ALLOW
   row) <= 1.1, and the group's p99 / p50 <= 3. (Its requests/s beside one worker's is not a
   goal here: the client and the provider share the machine's cores.) Beside them, as a
   reference with no limit: the same two ratios for the floor's two processes against its one.
   They share one port, and the kernel's split of the connections between them varies from run
   to run (an uneven split runs one process at more concurrency, which costs less per request);
   ``benchmarks/split.py`` measures the floor and the executor split evenly, at half the
   concurrency each and at the same concurrency each.
3. One agent (concurrency 1): BLOCK p50/p99 and ALLOW p50/p99 beside the floor's, ALLOW with
   the provider's own time subtracted. Goal: executor ALLOW p50 / floor ALLOW p50 <= 1.5.
4. PostgreSQL (durable): executor ALLOW CPU per request / the floor's ALLOW (SQLite, in process)
   <= 2.5. The PostgreSQL server's own CPU per request is printed beside it, not in the ratio;
   so are, as references, the floor's own ALLOW on PostgreSQL against its SQLite one, and the
   executor's against the floor's, both on PostgreSQL.

The provider's own time is subtracted by measuring it, not by asking it: in the same run, just
before the concurrency-1 ALLOW rows, the same client POSTs straight to the same provider process at
concurrency 1, each request a new payout with its own idempotency key (the path every floor and
executor ALLOW takes there), and that row's p50 is subtracted from each ALLOW's p50 and p99. This
is sound because, at concurrency 1 and on loopback, what an ALLOW spends on the provider is one
loopback round trip plus the provider's handling of a new payout, and that is exactly what the
direct row measures: the same process, the same path, the same moment, nothing queued. What the
floor's and the executor's own HTTP clients spend sending and reading stays in their figures, as
it should: that is their work. Two limits: percentiles do not subtract exactly, so "p99 minus the
provider's p50" removes the provider's typical time, not its tail; and a provider that reported
its handling time itself (a ``Server-Timing`` header) would not help, because the executor does
not hand the provider's headers back to its caller, so the client never sees them.

    python benchmarks/goals.py [--requests N] [--concurrency C] [--client go|python]
                               [--skip-postgres] [--repeat N] [-o text|json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from floor import _serve
from lifecycle import group_pids, render, worker_group
from loadclient import default_client, drive, listeners, proposal_template, thread_cpu
from rich.console import Console
from rich.table import Table

from agentsafe.executor.tools.harness import (
    ExecutorProcess,
    ProviderProcess,
    Workspace,
    free_port,
    wait_until,
)
from agentsafe.executor.tools.pgserver import (
    DURABILITY_SETTINGS,
    PostgresUnavailable,
    postgres_server,
)

HERE = Path(__file__).resolve().parent
WORKERS = 2
BLOCK_AMOUNT = 900000  # over the example policy's ceiling: refused before anything is sent
ALLOW_AMOUNT = 100

#: The goal rows every run reports (``key``: goal number, what, limit); a skipped row has no
#: numbers and says why.
GOALS: tuple[tuple[str, int, str, float | None], ...] = (
    ("block-cpu", 1, "BLOCK CPU ms per request", 2.0),
    ("allow-cpu", 1, "ALLOW CPU ms per request", 2.0),
    ("block-cpu-complete", 1, "BLOCK CPU ms per request, against the complete floor", None),
    ("allow-cpu-complete", 1, "ALLOW CPU ms per request, against the complete floor", None),
    ("workers-cpu", 2, f"ALLOW CPU ms per request, {WORKERS} workers", 1.1),
    ("workers-tail", 2, f"ALLOW p99 / p50, {WORKERS} workers", 3.0),
    ("floor-workers-cpu", 2, f"the floor's ALLOW CPU ms per request, {WORKERS} processes", None),
    ("floor-workers-tail", 2, f"the floor's ALLOW p99 / p50, {WORKERS} processes", None),
    ("c1-allow-p50", 3, "ALLOW p50 ms at c=1, provider subtracted", 1.5),
    ("c1-allow-p50-complete", 3, "the same, against the complete floor", None),
    ("c1-allow-p99", 3, "ALLOW p99 ms at c=1, provider p50 subtracted", None),
    ("c1-block-p50", 3, "BLOCK p50 ms at c=1", None),
    ("c1-block-p99", 3, "BLOCK p99 ms at c=1", None),
    ("postgres-allow-cpu", 4, "ALLOW CPU ms per request on PostgreSQL (durable)", 2.5),
    ("postgres-server-cpu", 4, "PostgreSQL's own CPU ms per request (not in the goal)", None),
    ("floor-postgres-cpu", 4, "the floor's ALLOW CPU ms per request on PostgreSQL", None),
    ("postgres-vs-floor-postgres", 4, "ALLOW CPU ms per request on PostgreSQL, executor", None),
    ("postgres-vs-floor-complete", 4, "the same, against the complete floor's ALLOW", None),
)

TITLES = {
    1: "Goal 1: CPU per request, executor / floor (goal <= 2)",
    2: f"Goal 2: workers, an EXECUTOR_WORKERS={WORKERS} group / one worker",
    3: "Goal 3: one agent, concurrency 1 (goal: ALLOW p50 <= 1.5x the floor's)",
    4: "Goal 4: PostgreSQL, durable: executor ALLOW CPU / the floor's ALLOW (goal <= 2.5)",
}


def say(text: str) -> None:
    print(f"goals: {text}", file=sys.stderr, flush=True)


def _cpu_each(pids: list[int]) -> dict[str, float]:
    """:func:`thread_cpu` of each process still alive (a PostgreSQL backend may come and go)."""
    spent: dict[str, float] = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            spent.update(thread_cpu([pid]))
    return spent


class Run:
    """The rows of one run, in the order they ran, each announced as it starts and ends."""

    def __init__(self, client: str, requests: int, planned: int) -> None:
        self.client = client
        self.requests = requests
        self.planned = planned
        self.rows: dict[str, dict[str, Any]] = {}

    async def measure(
        self,
        key: str,
        name: str,
        url: str,
        template: str,
        headers: dict[str, str],
        *,
        concurrency: int,
        pids: list[int] | None,
        expect: int = 200,
        warmup: int | None = None,
    ) -> dict[str, Any]:
        say(f"[{len(self.rows) + 1}/{self.planned}] {name} ...")
        result = await drive(
            self.client,
            name,
            [url],
            template,
            headers,
            requests=self.requests,
            concurrency=concurrency,
            warmup=max(self.requests // 10, concurrency) if warmup is None else warmup,
            pids=pids,
            expect=expect,
        )
        return self.keep(key, result)

    def keep(self, key: str, result: dict[str, Any]) -> dict[str, Any]:
        result["key"] = key
        self.rows[key] = result
        cpu = f", CPU {result['cpu_ms']:.2f} ms/req" if "cpu_ms" in result else ""
        if len(result.get("cpu_ms_each", ())) > 1:
            cpu += " (" + " + ".join(f"{part:.2f}" for part in result["cpu_ms_each"]) + ")"
        say(
            f"    {result['rps']:.0f} req/s, p50 {result['p50']:.2f} ms, p99 {result['p99']:.2f}"
            f" ms{cpu}, {result['failures']} unexpected"
        )
        return result


#: The floor's servers beside the one executor: name, mode, and whether ``--complete``.
_FLOORS = (
    ("block", "block", False),
    ("allow", "allow", False),
    ("complete-block", "block", True),
    ("complete-allow", "allow", True),
)


async def _floor_and_one_executor(
    run: Run, root: Path, provider: ProviderProcess, concurrency: int
) -> None:
    """The floor's two servers and one executor, all started first; then the rows at
    ``concurrency``, then the provider alone and the same rows at concurrency 1."""
    floors: dict[str, asyncio.subprocess.Process] = {}
    floor_urls: dict[str, str] = {}
    executor: ExecutorProcess | None = None
    workspace = Workspace(root / "ws")
    try:
        for name, mode, complete in _FLOORS:
            directory = root / f"floor-{name}"
            directory.mkdir()
            port = free_port()
            floors[name] = await _serve(
                [
                    str(HERE / "floor_server.py"),
                    mode,
                    str(port),
                    str(directory),
                    provider.url + "/payouts",
                    *(["--complete"] if complete else []),
                ],
                port,
                f"the {name} floor",
                env={"FLOOR_CALLER_TOKEN": workspace.caller_token} if complete else None,
            )
            floor_urls[name] = f"http://127.0.0.1:{port}/v1/actions"
        executor = ExecutorProcess(
            workspace.environment(provider_url=provider.url, port=free_port()), root
        )
        await executor.start()
        assert executor.process is not None
        auth = {"authorization": f"Bearer {workspace.caller_token}"}
        actions = executor.url + "/v1/actions"
        # The two rows of each ratio run back to back: on a busy machine the disk's fsync
        # latency drifts from one minute to the next, and adjacent rows share most of it.
        servers = [
            ("floor-block", "floor, BLOCK", floor_urls["block"], {}, floors["block"].pid),
            (
                "complete-block",
                "complete floor, BLOCK",
                floor_urls["complete-block"],
                auth,
                floors["complete-block"].pid,
            ),
            ("executor-block", "executor, BLOCK", actions, auth, executor.process.pid),
            ("floor-allow", "floor, ALLOW", floor_urls["allow"], {}, floors["allow"].pid),
            (
                "complete-allow",
                "complete floor, ALLOW",
                floor_urls["complete-allow"],
                auth,
                floors["complete-allow"].pid,
            ),
            ("executor-allow", "executor, ALLOW (SQLite)", actions, auth, executor.process.pid),
        ]
        for c in (concurrency, 1):
            suffix = "" if c == concurrency else "-c1"
            for key, name, url, headers, pid in servers:
                if key == "floor-allow" and c == 1:  # just before the ALLOWs it is taken from
                    await run.measure(
                        "provider-c1",
                        "provider alone (new payout), c=1",
                        provider.url + "/payouts",
                        proposal_template("direct", ALLOW_AMOUNT),
                        {"idempotency-key": "direct-{i}"},
                        concurrency=1,
                        pids=None,
                        expect=202,
                    )
                amount = BLOCK_AMOUNT if key.endswith("block") else ALLOW_AMOUNT
                await run.measure(
                    key + suffix,
                    f"{name}, c={c}",
                    url,
                    proposal_template(key + suffix, amount),
                    headers,
                    concurrency=c,
                    pids=[pid],
                )
    finally:
        if executor is not None:
            executor.terminate()
        for process in floors.values():
            process.terminate()
            await process.wait()


async def start_floors(
    args: list[str], port: int, processes: int, name: str
) -> list[asyncio.subprocess.Process]:
    """``processes`` floor servers (``floor_server.py`` with ``args``) on one ``port``, returned
    once every one of them listens (:func:`listeners`), not only the first: the port answers as
    soon as one does, and a run started while the next still starts would measure one process
    and the other's start-up (what this row did until 2026-12-05)."""
    servers: list[asyncio.subprocess.Process] = []
    try:
        for n in range(processes):
            servers.append(
                await _serve(
                    [str(HERE / "floor_server.py"), *args], port, f"{name} ({n + 1} of {processes})"
                )
            )

            async def all_listen(want: int = n + 1) -> bool:
                return listeners(port) >= want

            await wait_until(all_listen, timeout=30, what=f"{name}: {n + 1} listening")
    except BaseException:
        for server in servers:
            server.terminate()
            await server.wait()
        raise
    return servers


async def _floor_row(
    run: Run,
    root: Path,
    provider: ProviderProcess,
    concurrency: int,
    *,
    key: str,
    name: str,
    options: list[str],
    processes: int = 1,
) -> None:
    """One floor ALLOW row: ``processes`` floor servers on one port and one directory."""
    directory = root / key
    directory.mkdir()
    port = free_port()
    servers: list[asyncio.subprocess.Process] = []
    try:
        servers.extend(
            await start_floors(
                ["allow", str(port), str(directory), provider.url + "/payouts", *options],
                port,
                processes,
                name,
            )
        )
        await run.measure(
            key,
            f"{name}, c={concurrency}",
            f"http://127.0.0.1:{port}/v1/actions",
            proposal_template(key, ALLOW_AMOUNT),
            {},
            concurrency=concurrency,
            pids=[server.pid for server in servers],
        )
    finally:
        for server in servers:
            server.terminate()
            await server.wait()


async def _workers(run: Run, root: Path, provider: ProviderProcess, concurrency: int) -> None:
    # The floor's two processes first, back to back with the executor's two workers.
    await _floor_row(
        run,
        root,
        provider,
        concurrency,
        key="floor-workers-allow",
        name=f"floor, ALLOW, {WORKERS} processes",
        options=["--reuse-port"],
        processes=WORKERS,
    )
    async with worker_group(root, provider.url, WORKERS) as (group, pids):
        await run.measure(
            "workers-allow",
            f"executor, ALLOW, {WORKERS} workers, c={concurrency}",
            group.url + "/v1/actions",
            proposal_template("workers-allow", ALLOW_AMOUNT),
            {"authorization": f"Bearer {group.token}"},
            concurrency=concurrency,
            pids=pids,
        )


async def _postgres(
    run: Run, root: Path, provider: ProviderProcess, concurrency: int
) -> dict[str, str]:
    """The ALLOW row on a durable loopback PostgreSQL; returns the server's durability
    settings as it reports them. Raises PostgresUnavailable without the binaries."""
    with postgres_server(durable=True) as server:
        settings = server.settings(*(name for name, _ in DURABILITY_SETTINGS))
        if settings != dict(DURABILITY_SETTINGS):
            raise SystemExit(f"PostgreSQL did not start durable: {settings}")
        await _floor_row(
            run,
            root,
            provider,
            concurrency,
            key="floor-postgres-allow",
            name="floor, ALLOW, PostgreSQL (durable)",
            options=["--store-url", server.create_database()],
        )
        own = root / "pg"
        for sub in ("journal", "evidence"):
            (own / sub).mkdir(parents=True, mode=0o700)
        workspace = Workspace(root / "ws-pg")
        env = workspace.environment(
            provider_url=provider.url,
            port=free_port(),
            extra={
                "EXECUTOR_STORE_URL": server.create_database(),
                "EXECUTOR_REPLICA_ID": "goals-0",
                "EXECUTOR_JOURNAL_DIR": str(own / "journal"),
                "EXECUTOR_EVIDENCE_DIR": str(own / "evidence"),
            },
        )
        env.pop("EXECUTOR_STATE_DIR")
        executor = ExecutorProcess(env, root, "executor-pg")
        await executor.start()
        try:
            assert executor.process is not None
            url = executor.url + "/v1/actions"
            auth = {"authorization": f"Bearer {workspace.caller_token}"}
            name = f"executor, ALLOW, PostgreSQL (durable), c={concurrency}"
            # Warm-up first, so the pool's backends exist when PostgreSQL's CPU is read.
            await drive(run.client, name, [url], proposal_template("pg-warm", ALLOW_AMOUNT),
                        auth, requests=max(run.requests // 10, concurrency),
                        concurrency=concurrency, warmup=0)  # fmt: skip
            postmaster = int((server.datadir / "data" / "postmaster.pid").read_text().split()[0])
            backends = group_pids(postmaster)
            before = _cpu_each(backends)
            row = await run.measure(
                "postgres-allow",
                name,
                url,
                proposal_template("pg-allow", ALLOW_AMOUNT),
                auth,
                concurrency=concurrency,
                pids=[executor.process.pid],
                warmup=0,
            )
            after = _cpu_each(backends)
            spent = sum(after[tid] - before[tid] for tid in after if tid in before)
            row["postgres_cpu_ms"] = spent / max(row["n"], 1) * 1000
        finally:
            executor.terminate()
    return settings


async def run_all(
    requests: int, concurrency: int, client: str, *, skip_postgres: bool
) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="agentsafe-goals-"))
    planned = 6 + 7 + 2 + (0 if skip_postgres else 2)
    run = Run(client, requests, planned)
    postgres: dict[str, Any] = {"skipped": None, "settings": {}}
    provider = ProviderProcess(root)
    await provider.start()
    try:
        await _floor_and_one_executor(run, root, provider, concurrency)
        await _workers(run, root, provider, concurrency)
        if skip_postgres:
            postgres["skipped"] = "--skip-postgres"
        else:
            try:
                postgres["settings"] = await _postgres(run, root, provider, concurrency)
            except PostgresUnavailable as exc:
                postgres["skipped"] = str(exc)
        if postgres["skipped"]:
            say(f"PostgreSQL row skipped: {postgres['skipped']}")
    finally:
        provider.terminate()
    return {"rows": run.rows, "postgres": postgres}


def _less(value: float | None, minus: float | None) -> float | None:
    if value is None or minus is None:
        return None
    return value - minus


def goals(rows: dict[str, dict[str, Any]], skipped: str | None) -> list[dict[str, Any]]:
    """One entry per goal row: measured, what it is set against, ratio, limit, met."""

    def get(key: str, field: str) -> float | None:
        value = rows.get(key, {}).get(field)
        return float(value) if value is not None else None

    provider = get("provider-c1", "p50")
    pairs: dict[str, tuple[float | None, float | None, str]] = {
        "block-cpu": (get("executor-block", "cpu_ms"), get("floor-block", "cpu_ms"), "floor"),
        "allow-cpu": (get("executor-allow", "cpu_ms"), get("floor-allow", "cpu_ms"), "floor"),
        "block-cpu-complete": (
            get("executor-block", "cpu_ms"),
            get("complete-block", "cpu_ms"),
            "complete floor",
        ),
        "allow-cpu-complete": (
            get("executor-allow", "cpu_ms"),
            get("complete-allow", "cpu_ms"),
            "complete floor",
        ),
        "workers-cpu": (
            get("workers-allow", "cpu_ms"),
            get("executor-allow", "cpu_ms"),
            "one worker",
        ),
        "workers-tail": (get("workers-allow", "p99"), get("workers-allow", "p50"), "its p50"),
        "floor-workers-cpu": (
            get("floor-workers-allow", "cpu_ms"),
            get("floor-allow", "cpu_ms"),
            "one floor",
        ),
        "floor-workers-tail": (
            get("floor-workers-allow", "p99"),
            get("floor-workers-allow", "p50"),
            "its p50",
        ),
        "c1-allow-p50": (
            _less(get("executor-allow-c1", "p50"), provider),
            _less(get("floor-allow-c1", "p50"), provider),
            "floor",
        ),
        "c1-allow-p50-complete": (
            _less(get("executor-allow-c1", "p50"), provider),
            _less(get("complete-allow-c1", "p50"), provider),
            "complete floor",
        ),
        "c1-allow-p99": (
            _less(get("executor-allow-c1", "p99"), provider),
            _less(get("floor-allow-c1", "p99"), provider),
            "floor",
        ),
        "c1-block-p50": (get("executor-block-c1", "p50"), get("floor-block-c1", "p50"), "floor"),
        "c1-block-p99": (get("executor-block-c1", "p99"), get("floor-block-c1", "p99"), "floor"),
        "postgres-allow-cpu": (
            get("postgres-allow", "cpu_ms"),
            get("floor-allow", "cpu_ms"),
            "floor ALLOW",
        ),
        "postgres-server-cpu": (
            get("postgres-allow", "postgres_cpu_ms"),
            get("floor-allow", "cpu_ms"),
            "floor ALLOW",
        ),
        "floor-postgres-cpu": (
            get("floor-postgres-allow", "cpu_ms"),
            get("floor-allow", "cpu_ms"),
            "floor ALLOW",
        ),
        "postgres-vs-floor-postgres": (
            get("postgres-allow", "cpu_ms"),
            get("floor-postgres-allow", "cpu_ms"),
            "floor on PG",
        ),
        "postgres-vs-floor-complete": (
            get("postgres-allow", "cpu_ms"),
            get("complete-allow", "cpu_ms"),
            "complete floor ALLOW",
        ),
    }
    entries = []
    for key, goal, what, limit in GOALS:
        measured, against, against_what = pairs[key]
        ratio = measured / against if measured is not None and against else None
        if ratio is not None and against is not None and against < 0:
            ratio = None  # the floor below the provider's own time: noise, not a figure
        entries.append(
            {
                "key": key,
                "goal": goal,
                "what": what,
                "measured": measured,
                "against": against,
                "against_what": against_what,
                "ratio": ratio,
                "limit": limit,
                "met": None if ratio is None or limit is None else ratio <= limit,
                "skipped": skipped if goal == 4 and skipped else None,
            }
        )
    return entries


def _median(values: list[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


def combined(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One entry per goal row over several runs' :func:`goals` entries: the median of the runs'
    ratios (and of what was measured and set against), judged against the limit, with every
    run's ratio in ``ratios`` (``None`` where a run had none). One run is returned as it is,
    with its one ratio listed."""
    entries = []
    for position, first in enumerate(runs[0]):
        each = [run[position] for run in runs]
        assert all(entry["key"] == first["key"] for entry in each)
        ratio = _median([entry["ratio"] for entry in each])
        limit = first["limit"]
        entries.append(
            first
            | {
                "measured": _median([entry["measured"] for entry in each]),
                "against": _median([entry["against"] for entry in each]),
                "ratio": ratio,
                "ratios": [entry["ratio"] for entry in each],
                "met": None if ratio is None or limit is None else ratio <= limit,
            }
        )
    return entries


def _show(entries: list[dict[str, Any]], provider: dict[str, Any] | None) -> None:
    console = Console(width=140)

    def number(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    several = any(len(entry["ratios"]) > 1 for entry in entries)
    columns = ["measure", "measured", "against", "value", "ratio", "goal", "met"]
    if several:
        columns[4:5] = ["median ratio", "each run"]
    for goal, title in TITLES.items():
        table = Table(title=title)
        for column in columns:
            table.add_column(column, justify="left" if column == "measure" else "right")
        for entry in (e for e in entries if e["goal"] == goal):
            met = {True: "yes", False: "no", None: "-"}[entry["met"]]
            if entry["skipped"]:
                met = "skipped"
            cells = [
                entry["what"],
                number(entry["measured"]),
                entry["against_what"],
                number(entry["against"]),
                "-" if entry["ratio"] is None else f"{entry['ratio']:.2f}x",
                "-" if entry["limit"] is None else f"<= {entry['limit']:g}x",
                met,
            ]
            if several:
                cells.insert(5, " ".join(number(ratio) for ratio in entry["ratios"]))
            table.add_row(*cells)
        console.print(table)
        if goal == 3 and provider is not None:
            console.print(
                f"the provider alone at c=1 (subtracted from ALLOW): p50 {provider['p50']:.2f}"
                f" ms, p99 {provider['p99']:.2f} ms"
            )
        if goal == 4:
            skipped = next((e["skipped"] for e in entries if e["goal"] == 4), None)
            if skipped:
                console.print(f"PostgreSQL skipped: {skipped}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=1000, help="measured requests per row")
    parser.add_argument(
        "--concurrency", type=int, default=16, help="requests in flight (goals 1, 2 and 4)"
    )
    parser.add_argument("--client", choices=("go", "python"), default=default_client())
    parser.add_argument(
        "--skip-postgres", action="store_true", help="no PostgreSQL row (goal 4 says skipped)"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="N whole runs; each goal is judged on the median of their ratios (see above)",
    )
    parser.add_argument(
        "-o", "--output", choices=("text", "json"), default="text", help="json: for scripts"
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat needs at least one run")
    before = os.getloadavg()
    results = []
    for index in range(args.repeat):
        if args.repeat > 1:
            say(f"run {index + 1} of {args.repeat}")
        results.append(
            asyncio.run(
                run_all(
                    args.requests, args.concurrency, args.client, skip_postgres=args.skip_postgres
                )
            )
        )
    after = os.getloadavg()
    result = results[-1]
    rows: dict[str, dict[str, Any]] = result["rows"]
    entries = combined([goals(each["rows"], each["postgres"]["skipped"]) for each in results])
    unexpected = {
        f"{key} (run {index + 1})" if args.repeat > 1 else key: row["failures"]
        for index, each in enumerate(results)
        for key, row in each["rows"].items()
        if row["failures"]
    }
    title = (
        f"goals: {args.requests} requests per row, concurrency {args.concurrency} (and 1),"
        f" {args.client} client, load average {before[0]:.1f} -> {after[0]:.1f}"
    )
    if args.output == "json":
        report = {
            "requests": args.requests,
            "concurrency": args.concurrency,
            "client": args.client,
            "repeat": args.repeat,
            "load_average": [round(before[0], 2), round(after[0], 2)],
            "provider_subtracted_ms": rows.get("provider-c1", {}).get("p50"),
            "postgres": result["postgres"],
            "unexpected_answers": unexpected,
            "goals": entries,
            "rows": list(rows.values()),
            "runs": [list(each["rows"].values()) for each in results],
        }
        print(json.dumps(report, indent=1))
    else:
        for index, each in enumerate(results):
            run_title = f"{title}, run {index + 1} of {args.repeat}" if args.repeat > 1 else title
            render(run_title, list(each["rows"].values()), "floor BLOCK")
        _show(entries, rows.get("provider-c1"))
        if result["postgres"]["settings"]:
            shown = ", ".join(f"{k}={v}" for k, v in result["postgres"]["settings"].items())
            print(f"PostgreSQL durability: {shown}")
    if unexpected:
        say(f"some answers were not the expected status, the figures are suspect: {unexpected}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
