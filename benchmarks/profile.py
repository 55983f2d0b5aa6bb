"""Profile one executor process under BLOCK or ALLOW load: where its CPU goes, by part.

Starts a synthetic provider and ``agentsafe serve`` (as ``benchmarks/lifecycle.py`` does), drives
it with the compiled load generator, and samples the executor with py-spy (``pip install py-spy``
into the venv; it is a profiling tool, not a dependency) for the whole measured phase. Every
thread is sampled while it runs Python or waits in a C call, idle threads are not. Prints each
part's share of the samples (inclusive: a frame anywhere on the stack counts it, so the shares
can add up to more than 100%) and the top functions by own time; ``--out`` keeps the collapsed
stacks (flamegraph.pl, speedscope) for a closer look.

    python benchmarks/profile.py --path allow [--requests N] [--concurrency C] [--out FILE]
                                 [--store sqlite|postgresql]

``--store postgresql`` runs the executor on a throwaway loopback PostgreSQL (durability on, as
``benchmarks/shared_store.py`` runs it) instead of the embedded SQLite store.

``--workers N`` (N above 1) profiles an ``EXECUTOR_WORKERS=N`` group instead: py-spy follows
the supervisor and every worker (``--subprocesses``), the tables are printed for the whole group
and then for each process (the supervisor, worker 0, worker 1, ...), and each process's CPU per
measured request (from ``/proc``) is printed beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from loadclient import cpu_seconds, drive, proposal_template

from agentsafe.executor.tools.harness import (
    ExecutorProcess,
    ProviderProcess,
    Workspace,
    free_port,
    wait_until,
)
from agentsafe.executor.tools.pgserver import postgres_server

# (part, a substring of a frame "function (file:line)") - the first match on a stack names it.
PARTS: list[tuple[str, tuple[str, ...]]] = [
    ("evidence: redaction", ("evidence/redact.py",)),
    ("evidence: RFC 8785 canonical JSON", ("canonical.py",)),
    ("evidence: chain (hash, line, write)", ("evidence/chain.py",)),
    ("journal (append, fsync)", ("state/journal.py",)),
    ("use store (SQLite commit)", ("state/usestore.py", "state/sqlitedb.py")),
    (
        "use store (PostgreSQL)",
        ("state/pgstore.py", "state/pgconn.py", "state/pgattempts.py", "psycopg"),
    ),
    ("Ed25519 grant (sign, verify)", ("grants.py", "jws.py")),
    ("egress (resolve, connect, POST)", ("egress/",)),
    ("policy (schema, CEL)", ("policy/", "schema.py")),
    ("door (authenticate)", ("door/",)),
    ("aiohttp server (parse, answer)", ("aiohttp/web_protocol.py", "aiohttp/http_parser.py")),
    ("asyncio event loop", ("asyncio/",)),
]


Profile = tuple[int, collections.Counter[str], collections.Counter[str]]


def _parse(collapsed: Path, process: str | None = None) -> Profile:
    """The samples of ``collapsed``; with ``process`` (a pid, under ``--subprocesses``) only
    that process's (a child's stacks sit under its parent's ``process`` frame: the innermost
    one names the process)."""
    total = 0
    parts: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        frames = stack.split(";")
        if process is not None:
            owner = [f for f in frames if f.startswith("process ")][-1:]
            if not owner or not owner[0].startswith(f"process {process}:"):
                continue
        total += n
        own[frames[-1]] += n
        for part, needles in PARTS:
            if any(needle in frame for frame in frames for needle in needles):
                parts[part] += n
    return total, parts, own


def _print(profile: Profile, top: int = 15) -> None:
    total, parts, own = profile
    print("\n| part | share of samples (inclusive) |\n| --- | ---: |")
    for part, _ in PARTS:
        print(f"| {part} | {100 * parts[part] / max(total, 1):.1f}% |")
    print("\n| function (own time) | share |\n| --- | ---: |")
    for frame, n in own.most_common(top):
        print(f"| `{frame}` | {100 * n / max(total, 1):.1f}% |")


def _group(pid: int) -> list[int]:
    """A supervisor and its workers (by worker index: the order they were started)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [pid, *map(int, children)]


async def run(
    path: str,
    requests: int,
    concurrency: int,
    out: Path,
    rate: int,
    store_url: str | None = None,
    workers: int = 1,
) -> None:
    py_spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if py_spy is None:
        raise SystemExit("profile.py needs py-spy: .venv/bin/pip install py-spy")
    root = Path(tempfile.mkdtemp(prefix="agentsafe-profile-"))
    provider = ProviderProcess(root)
    await provider.start()
    workspace = Workspace(root / "ws")
    env = workspace.environment(provider_url=provider.url, port=free_port())
    env.update({k: v for k, v in os.environ.items() if k.startswith("EXECUTOR_")})
    if workers > 1:
        env["EXECUTOR_WORKERS"] = str(workers)
    if store_url is not None:
        own = root / "own"
        for sub in ("journal", "evidence"):
            (own / sub).mkdir(parents=True, mode=0o700)
        env.pop("EXECUTOR_STATE_DIR", None)
        env.update(
            EXECUTOR_STORE_URL=store_url,
            EXECUTOR_JOURNAL_DIR=str(own / "journal"),
            EXECUTOR_EVIDENCE_DIR=str(own / "evidence"),
        )
    executor = ExecutorProcess(env, root)
    await executor.start()
    assert executor.process is not None
    pid = executor.process.pid
    if workers > 1:

        async def all_up() -> bool:
            return len(_group(pid)) == workers + 1

        await wait_until(all_up, timeout=60, what="every worker")
    pids = _group(pid) if workers > 1 else [pid]
    headers = {"authorization": f"Bearer {workspace.caller_token}"}
    amount = 900000 if path == "block" else 100
    try:
        urls = [executor.url + "/v1/actions"]
        template = proposal_template(f"warm-{path}", amount)
        await drive("go", "warm", urls, template, headers, requests=requests // 5,
                    concurrency=concurrency, warmup=0)  # fmt: skip
        follow = ["--subprocesses"] if workers > 1 else []
        sampler = subprocess.Popen(  # noqa: ASYNC220 - a benchmark, nothing else runs
            [py_spy, "record", "--pid", str(pid), "--format", "raw", *follow,
             "--rate", str(rate), "--threads", "--nonblocking", "--output", str(out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        await asyncio.sleep(1.0)  # py-spy attaches before the load starts
        before = [cpu_seconds([p]) for p in pids]
        row = await drive("go", path, urls, proposal_template(path, amount), headers,
                          requests=requests, concurrency=concurrency, warmup=0)  # fmt: skip
        spent = [cpu_seconds([p]) - b for p, b in zip(pids, before, strict=True)]
        cpu = [seconds * 1000 / max(row["n"], 1) for seconds in spent]
        sampler.send_signal(2)  # SIGINT: py-spy writes its output and exits
        _, err = sampler.communicate(timeout=60)
        if not out.exists():  # noqa: ASYNC240
            raise SystemExit(f"py-spy wrote nothing: {err.decode()[-500:]}")
    finally:
        executor.terminate()
        provider.terminate()
    group = _parse(out)
    print(
        f"{path.upper()}{f', {workers} workers' if workers > 1 else ''}: {row['rps']:.0f} req/s,"
        f" p50 {row['p50']:.1f} ms, p99 {row['p99']:.1f} ms, {row['failures']} non-200;"
        f" {group[0]} samples at {rate} Hz; CPU {sum(cpu):.2f} ms per request; load average"
        f" {os.getloadavg()[0]:.1f}"
    )
    _print(group)
    if workers > 1:
        for index, (process, ms) in enumerate(zip(pids, cpu, strict=True)):
            name = "supervisor" if index == 0 else f"worker {index - 1}"
            profile = _parse(out, str(process))
            print(f"\n### {name} (pid {process}): {profile[0]} samples, {ms:.2f} ms CPU/request")
            _print(profile, top=10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", choices=("allow", "block"), default="allow")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rate", type=int, default=250, help="samples per second")
    parser.add_argument("--out", type=Path, help="keep the collapsed stacks here")
    parser.add_argument("--store", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument(
        "--workers", type=int, default=1, help="profile an EXECUTOR_WORKERS=N group (N above 1)"
    )
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="agentsafe-stacks-")) / "stacks.txt"
    if args.store == "postgresql":
        with postgres_server(durable=True) as server:
            url = server.create_database()
            asyncio.run(
                run(args.path, args.requests, args.concurrency, out, args.rate, url, args.workers)
            )
    else:
        asyncio.run(
            run(args.path, args.requests, args.concurrency, out, args.rate, workers=args.workers)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
