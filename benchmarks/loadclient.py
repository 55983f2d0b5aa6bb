"""The benchmarks' two load generators, one interface: the compiled client and the Python one.

* ``go``: ``benchmarks/loadgen`` (Go, standard library only), a closed loop of ``concurrency``
  kept-alive connections, each with one request in flight. It is built on demand into
  ``$AGENTSAFE_CACHE_DIR/bench`` (default ``~/.cache/agentsafe/bench``), keyed by a hash of its
  source, and never committed. It is the default whenever ``go`` is on PATH: at a few thousand
  requests per second the Python client spends as much CPU as the server it measures.
* ``python``: the aiohttp client the benchmarks always had (no toolchain needed).

Both send the same bodies (each with its own idempotency key: ``{i}`` in the template is the
request's index, and in a header's value too: a provider driven directly takes its key in an
``idempotency-key`` header), warm up first, and return the same row: requests/s, p50, p99, the
count of answers whose status was not ``expect`` (200 unless said).

Callers: ``benchmarks/lifecycle.py``, ``benchmarks/shared_store.py``, ``benchmarks/floor.py``,
``benchmarks/goals.py``.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import os
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp

LOADGEN_SOURCE = Path(__file__).resolve().parent / "loadgen"


def cache_dir() -> Path:
    """``$AGENTSAFE_CACHE_DIR`` or ``$XDG_CACHE_HOME/agentsafe`` or ``~/.cache/agentsafe``."""
    explicit = os.environ.get("AGENTSAFE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "agentsafe"


def build_loadgen(cache: Path | None = None) -> Path:
    """Build the Go load generator (once per source revision) and return the binary's path."""
    go = shutil.which("go")
    if go is None:
        raise RuntimeError("the compiled load generator needs the Go toolchain on PATH")
    digest = hashlib.sha256()
    for name in ("go.mod", "main.go"):
        digest.update((LOADGEN_SOURCE / name).read_bytes())
    binary = (cache or cache_dir()) / "bench" / f"loadgen-{digest.hexdigest()[:16]}"
    if not binary.exists():
        binary.parent.mkdir(parents=True, exist_ok=True)
        partial = binary.with_suffix(".partial")
        subprocess.run(
            [go, "build", "-trimpath", "-o", str(partial), "."],
            cwd=LOADGEN_SOURCE,
            check=True,
            env={**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod"},
        )
        partial.replace(binary)
    return binary


def default_client() -> str:
    return "go" if shutil.which("go") else "python"


def _numbered(headers: dict[str, str], prefix: str) -> dict[str, str]:
    """``headers`` with each ``{i}`` in a value prefixed as the body's is (warm-up, per URL)."""
    return {key: value.replace("{i}", prefix + "{i}") for key, value in headers.items()}


def row(name: str, rps: float, p50: float, p99: float, n: int, failures: int) -> dict[str, Any]:
    return {"name": name, "rps": rps, "p50": p50, "p99": p99, "n": n, "failures": failures}


async def drive_go(
    name: str,
    urls: list[str],
    template: str,
    headers: dict[str, str],
    *,
    requests: int,
    concurrency: int,
    warmup: int,
    expect: int = 200,
) -> dict[str, Any]:
    """One measured phase with the compiled client (several URLs: one client per URL, sharing
    ``concurrency`` between them, run at the same time; the row sums them)."""
    binary = build_loadgen()
    share, extra = divmod(concurrency, len(urls))
    procs = []
    for index, url in enumerate(urls):
        argv = [
            str(binary),
            "-url",
            url,
            "-requests",
            str(requests // len(urls)),
            "-warmup",
            str(warmup // len(urls)),
            "-concurrency",
            str(share + (1 if index < extra else 0)),
            "-expect",
            str(expect),
            # Each URL's client numbers its own requests: keep the keys apart.
            "-body",
            template.replace("{i}", f"u{index}-{{i}}"),
        ]
        for key, value in _numbered(headers, f"u{index}-").items():
            argv += ["-header", f"{key}: {value}"]
        procs.append(
            await asyncio.create_subprocess_exec(*argv, stdout=subprocess.PIPE, stderr=None)
        )
    results = []
    for proc in procs:
        out, _ = await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"the load generator exited {proc.returncode}")
        results.append(json.loads(out))
    return row(
        name,
        sum(r["rps"] for r in results),
        max(r["p50_ms"] for r in results),
        max(r["p99_ms"] for r in results),
        sum(r["requests"] for r in results),
        sum(r["unexpected"] for r in results),
    )


async def _python_phase(
    urls: list[str],
    requests: list[tuple[bytes, dict[str, str]]],
    concurrency: int,
    expect: int = 200,
) -> tuple[float, list[float], int]:
    latencies: list[float] = []
    failures = 0
    pending = iter(requests)
    targets = itertools.cycle(urls)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            nonlocal failures
            for body, headers in pending:
                started = time.perf_counter()
                async with session.post(next(targets), data=body, headers=headers) as response:
                    await response.read()
                    if response.status != expect:
                        failures += 1
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return elapsed, latencies, failures


async def drive_python(
    name: str,
    urls: list[str],
    template: str,
    headers: dict[str, str],
    *,
    requests: int,
    concurrency: int,
    warmup: int,
    expect: int = 200,
) -> dict[str, Any]:
    """One measured phase with the aiohttp client (several URLs: round-robin)."""
    fixed = {"content-type": "application/json", **headers}
    numbered = [key for key, value in fixed.items() if "{i}" in value]

    def prepared(first: int, count: int) -> list[tuple[bytes, dict[str, str]]]:
        made = []
        for i in range(first, first + count):
            own = dict(fixed)
            for key in numbered:
                own[key] = fixed[key].replace("{i}", str(i))
            made.append((template.replace("{i}", str(i)).encode(), own))
        return made

    if warmup:
        await _python_phase(urls, prepared(0, warmup), concurrency, expect)
    elapsed, latencies, failures = await _python_phase(
        urls, prepared(warmup, requests), concurrency, expect
    )
    ordered = sorted(latencies)
    return row(
        name,
        len(latencies) / elapsed,
        statistics.median(ordered) * 1000,
        ordered[max(0, int(len(ordered) * 0.99) - 1)] * 1000,
        len(latencies),
        failures,
    )


def thread_cpu(pids: list[int]) -> dict[str, float]:
    """The CPU seconds (user + system) each live thread of ``pids`` has used, by thread id.

    Read from ``/proc/PID/task/TID/schedstat``, the scheduler's own count in nanoseconds.
    ``/proc/PID/stat`` counts in clock ticks (10 ms), which a small run rounds to nothing: 30
    BLOCKs of the floor are about 12 ms, one tick or none. On a kernel built without schedstat
    the ticks are read instead."""
    ticks = os.sysconf("SC_CLK_TCK")
    seconds: dict[str, float] = {}
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                seconds[task.name] = int((task / "schedstat").read_text().split()[0]) / 1e9
            except FileNotFoundError:
                try:
                    fields = (task / "stat").read_text().rpartition(")")[2].split()
                except FileNotFoundError:  # the thread ended
                    continue
                seconds[task.name] = (int(fields[11]) + int(fields[12])) / ticks
    return seconds


def cpu_since(before: dict[str, float], pids: list[int]) -> float:
    """The CPU seconds ``pids`` have used since ``before`` (a :func:`thread_cpu` reading), thread
    by thread. A thread started since counts from zero; one that ended since takes its time with
    it (the servers measured here keep their threads for their whole life)."""
    return sum(spent - before.get(tid, 0.0) for tid, spent in thread_cpu(pids).items())


_LISTEN = "0A"  # TCP_LISTEN, as /proc/net/tcp writes a socket's state


def listeners(port: int) -> int:
    """How many sockets listen on TCP ``port`` in this network namespace (IPv4 and IPv6), from
    ``/proc/net/tcp*``.

    Processes that share a port with ``SO_REUSEPORT`` each add one, and the kernel spreads new
    connections over those that listen. An HTTP answer on the port proves only that one of them
    does: a second server still importing its modules would get no connection of a run that
    starts then. A socket that is bound but not listening (the supervisor's reservation of its
    workers' port) is not counted."""
    found = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == _LISTEN and int(fields[1].rpartition(":")[2], 16) == port:
                found += 1
    return found


def rss_bytes(pid: int) -> int:
    """The process's resident set size now (VmRSS), from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


async def drive(
    client: str,
    name: str,
    urls: list[str],
    template: str,
    headers: dict[str, str],
    *,
    requests: int,
    concurrency: int,
    warmup: int,
    pids: list[int] | None = None,
    expect: int = 200,
) -> dict[str, Any]:
    """Warm up, then one measured phase with ``client`` (``go`` or ``python``). With ``pids``
    (the servers), the row also says how much CPU they spent per measured request
    (``cpu_ms``: on a loaded machine that is steadier than requests/s; ``cpu_ms_each``: each
    process's part of it, in the order of ``pids``) and the largest one's
    resident set size after the phase (``rss_mb``). ``expect``: the status every answer should
    have (others are counted in ``failures``)."""
    run = drive_go if client == "go" else drive_python
    if warmup:
        await run(
            name, urls, template.replace("{i}", "w{i}"), _numbered(headers, "w"),
            requests=warmup, concurrency=concurrency, warmup=0, expect=expect,
        )  # fmt: skip
    before = thread_cpu(pids) if pids else {}
    result = await run(
        name, urls, template, headers,
        requests=requests, concurrency=concurrency, warmup=0, expect=expect,
    )  # fmt: skip
    if pids:
        # Each process's share too: a group whose processes did not all serve shows it here.
        each = [cpu_since(before, [pid]) / max(result["n"], 1) * 1000 for pid in pids]
        result["cpu_ms"] = sum(each)
        result["cpu_ms_each"] = each
        result["rss_mb"] = max(rss_bytes(pid) for pid in pids) / 2**20
    return result


def proposal_template(prefix: str, amount: int) -> str:
    """A create_payout proposal whose idempotency key and target are unique per request."""
    body = {
        "proposal": {
            "action": "create_payout",
            "target": "payout:bench-{i}",
            "parameters": {"amountMinor": amount, "currency": "EUR"},
        },
        "idempotency_key": f"{prefix}-{{i}}",
    }
    return json.dumps(body, separators=(",", ":"))
