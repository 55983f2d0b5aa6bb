"""Profile one executor process under BLOCK or ALLOW load: where its CPU goes, by part.

Starts a synthetic provider and ``agentsafe serve`` (as ``benchmarks/lifecycle.py`` does), drives
it with the compiled load generator, and samples the executor with py-spy (``pip install py-spy``
into the venv; it is a profiling tool, not a dependency) for the whole measured phase. Prints
each part's share of the samples (inclusive: a frame anywhere on the stack counts it, so the
shares can add up to more than 100%) and the top functions by own time; ``--out`` keeps the
collapsed stacks (flamegraph.pl, speedscope) for a closer look.

    python benchmarks/profile.py --path allow [--requests N] [--concurrency C] [--out FILE]
                                 [--store sqlite|postgresql] [--cpu]

What a sample counts depends on the mode:

* By default (py-spy without ``--idle``), every thread whose kernel state is running or runnable
  (``R`` in ``/proc``) is sampled, whether it runs Python, runs C code without the GIL, waits
  for the GIL's holder to be scheduled, or sits in a system call the kernel reports as runnable.
  On this machine that includes much of a thread's ``fsync`` (a probe thread writing 4 KiB and
  calling ``fsync`` in a loop used 4% of a core and was ``R`` in two thirds of its ``/proc``
  reads) and a selector woken on a busy machine; sleeping threads are not sampled. It is a
  picture of where threads stand, not of CPU.
* ``--cpu`` passes py-spy's ``--gil``: only the thread that holds the GIL is sampled, so the
  samples are the interpreter's time, one thread at a time, whichever thread runs it: what
  issue 34 calls CPU, less the C work done with the GIL released (SQLite's own statement work,
  the kernel's side of ``write`` and ``fsync``, large hashes). A thread blocked in ``fsync`` or
  ``COMMIT`` has released the GIL and is not counted; a holder the kernel has preempted (a busy
  machine) still is. The samples divided by the rate are the seconds the GIL was held, printed
  per request beside the process's CPU per request (``/proc``, every thread), and the CPU each
  thread used during the phase is printed per request (named from the stacks), so the part of
  the CPU the samples cannot see is bounded, with how often per request the thread gave up its
  core to wait (``voluntary_ctxt_switches``: for the GIL, a lock, a blocking system call). The
  parts are also given exclusively (each sample to the first part of the list below found on
  its stack, then the executor's other code, then aiohttp, asyncio, and everything else), so
  they add up to 100%, with the CPU per request each share means (share x CPU per request: it
  assumes the CPU the samples cannot see is spread like the samples, which the thread table
  lets you check). Own time is given by function (all its lines together).

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
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from loadclient import cpu_since, drive, proposal_template, thread_cpu

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


# --cpu's exclusive attribution: after PARTS' executor parts, the executor's other code (a frame
# of an executor file other than those that only start the process and run its event loop).
EXECUTOR_REST = ("executor: other code (routes, pipeline, lifecycle, intent, ids)", ("executor/",))
LOOP_FILES = ("executor/cli.py", "executor/serve.py")
LIBRARY_PARTS = ("aiohttp server (parse, answer)", "asyncio event loop")
OTHER = "other (thread pools' loops, stdlib, ...)"

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


def _exclusive(collapsed: Path) -> tuple[int, collections.Counter[str], dict[str, str]]:
    """Each sample given to one part (PARTS' executor parts in order, then the executor's other
    code, then aiohttp, asyncio, then OTHER), and the threads' names from their frames. The
    frames that start the process and run its loop (LOOP_FILES) are not the executor's other
    code: what runs under them alone is the loop's."""
    order = [part for part in PARTS if part[0] not in LIBRARY_PARTS]
    order += [EXECUTOR_REST, *(part for part in PARTS if part[0] in LIBRARY_PARTS)]
    total = 0
    parts: collections.Counter[str] = collections.Counter()
    names: dict[str, str] = {}
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        frames = stack.split(";")
        total += n
        frames = [f for f in frames if not any(f"({loop}" in f for loop in LOOP_FILES)]
        for frame in frames:
            if frame.startswith("thread ("):
                tid, _, name = frame[len("thread (") :].partition("): ")
                names[tid] = name
        found = next(
            (part for part, needles in order
             if any(needle in frame for frame in frames for needle in needles)),
            OTHER,
        )  # fmt: skip
        parts[found] += n
    return total, parts, names


def _by_module(collapsed: Path) -> collections.Counter[str]:
    """Each sample given to the file of the innermost executor frame on its stack (what the
    executor's own code costs, with the libraries it calls), else ``(the loop alone)``: no
    executor frame but those of LOOP_FILES."""
    modules: collections.Counter[str] = collections.Counter()
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        files = [f for f in re.findall(r"\((executor/[^:)]+)", stack) if f not in LOOP_FILES]
        modules[files[-1] if files else "(the loop alone)"] += int(count)
    return modules


def _by_function(own: collections.Counter[str]) -> collections.Counter[str]:
    """Own time by function: ``name (file:line)`` frames of one function added together."""
    functions: collections.Counter[str] = collections.Counter()
    for frame, n in own.items():
        functions[re.sub(r":\d+\)$", ")", frame)] += n
    return functions


def _thread_sleeps(pids: list[int]) -> dict[str, int]:
    """How often each live thread of ``pids`` has given up its core to wait (the kernel's
    ``voluntary_ctxt_switches``: a lock, the GIL, a futex, a blocking system call)."""
    sleeps: dict[str, int] = {}
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                status = (task / "status").read_text()
            except FileNotFoundError:  # the thread ended
                continue
            for line in status.splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    sleeps[task.name] = int(line.split()[1])
    return sleeps


def _print_cpu(
    collapsed: Path,
    profile: Profile,
    cpu_ms: float,
    n: int,
    rate: int,
    threads: dict[str, float],
    top: int = 20,
    sleeps: dict[str, int] | None = None,
) -> None:
    """--cpu's tables: parts inclusive and exclusive with the ms per request each share means,
    own time by function, and each thread's CPU and waits per request."""
    total, inclusive, own = profile
    _, exclusive, names = _exclusive(collapsed)
    held = total / rate * 1000 / max(n, 1)
    print(
        f"\nGIL held {held:.2f} ms per request ({total} samples / {rate} Hz / {n} requests);"
        f" the process's CPU {cpu_ms:.2f} ms per request"
    )
    print(
        "\n| part | inclusive | exclusive | exclusive x CPU ms/req |\n| --- | ---: | ---: | ---: |"
    )
    order = [part for part, _ in PARTS if part not in LIBRARY_PARTS]
    order += [EXECUTOR_REST[0], *LIBRARY_PARTS, OTHER]
    for part in order:
        share = exclusive[part] / max(total, 1)
        within = f"{100 * inclusive[part] / max(total, 1):.1f}%" if part in dict(PARTS) else "-"
        print(f"| {part} | {within} | {100 * share:.1f}% | {share * cpu_ms:.3f} |")
    print("\n| function (own time, all its lines) | share | x CPU ms/req |\n| --- | ---: | ---: |")
    for frame, count in _by_function(own).most_common(top):
        share = count / max(total, 1)
        print(f"| `{frame}` | {100 * share:.1f}% | {share * cpu_ms:.3f} |")
    print("\n| innermost executor file (and what it calls) | share | x CPU ms/req |")
    print("| --- | ---: | ---: |")
    for module, count in _by_module(collapsed).most_common(top):
        share = count / max(total, 1)
        print(f"| `{module}` | {100 * share:.1f}% | {share * cpu_ms:.3f} |")
    print("\n| thread (id: name) | CPU ms/req | GIL samples | waits/req |")
    print("| --- | ---: | ---: | ---: |")
    samples: collections.Counter[str] = collections.Counter()
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        for frame in stack.split(";"):
            if frame.startswith("thread ("):
                samples[frame[len("thread (") :].partition(")")[0]] += int(count)
    for tid, seconds in sorted(threads.items(), key=lambda item: -item[1]):
        if seconds > 0 or samples[tid]:
            name = names.get(tid, "(never held the GIL while sampled)")
            waits = f"{(sleeps or {}).get(tid, 0) / max(n, 1):.1f}" if sleeps is not None else "-"
            print(
                f"| {tid}: {name} | {seconds * 1000 / max(n, 1):.3f} | {samples[tid]} | {waits} |"
            )
    print(
        f"| threads that ended during the phase | "
        f"{max(cpu_ms - sum(threads.values()) * 1000 / max(n, 1), 0):.3f} | - | - |"
    )


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
    cpu_only: bool = False,
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
        follow += ["--gil"] if cpu_only else []
        sampler = subprocess.Popen(  # noqa: ASYNC220 - a benchmark, nothing else runs
            [py_spy, "record", "--pid", str(pid), "--format", "raw", *follow,
             "--rate", str(rate), "--threads", "--nonblocking", "--output", str(out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        await asyncio.sleep(1.0)  # py-spy attaches before the load starts
        load_before = os.getloadavg()[0]
        threads_before = thread_cpu(pids)
        sleeps_before = _thread_sleeps(pids)
        row = await drive("go", path, urls, proposal_template(path, amount), headers,
                          requests=requests, concurrency=concurrency, warmup=0)  # fmt: skip
        threads = {
            tid: seconds - threads_before.get(tid, 0.0) for tid, seconds in thread_cpu(pids).items()
        }
        sleeps = {
            tid: count - sleeps_before.get(tid, 0) for tid, count in _thread_sleeps(pids).items()
        }
        spent = [cpu_since(threads_before, [p]) for p in pids]  # thread ids are system-wide
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
    if cpu_only:
        print(f"--cpu: py-spy --gil; load average {load_before:.1f} -> {os.getloadavg()[0]:.1f}")
        _print_cpu(out, group, sum(cpu), row["n"], rate, threads, sleeps=sleeps)
    else:
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
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="sample only the GIL's holder (py-spy --gil): CPU by part, see the docstring",
    )
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="agentsafe-stacks-")) / "stacks.txt"
    if args.store == "postgresql":
        with postgres_server(durable=True) as server:
            url = server.create_database()
            asyncio.run(
                run(args.path, args.requests, args.concurrency, out, args.rate, url, args.workers,
                    args.cpu)
            )  # fmt: skip
    else:
        asyncio.run(
            run(args.path, args.requests, args.concurrency, out, args.rate, workers=args.workers,
                cpu_only=args.cpu)
        )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
