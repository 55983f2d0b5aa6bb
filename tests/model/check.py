"""``make model``: check the Promela model of the exactly-once protocol with spin (issue 29).

Role: builds ``tests/model/protocol.pml`` into a verifier for each configuration below (``spin
-a``, then ``cc``), runs it (``pan``), and fails unless every run searched its whole state space
and spin reported 0 errors. It prints each configuration as it starts and spin's counts (states,
depth, seconds) when it ends. ``docs/protocol.md`` says what each configuration covers and maps
the model's steps to the code.

The same helpers build the model with the fence removed (``NOFENCE``) for the test that expects a
counterexample, and replay a trail (``spin -t``) as its ``STEP`` lines.

Run as ``.venv/bin/python tests/model/check.py [NAME ...]`` (``make model``); ``--list`` names
the configurations. ``MODEL_MEMLIM`` (MB, default 2500) bounds each verifier's memory.

Callers: ``Makefile`` (``make model``); ``tests/model/test_model.py``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

MODEL = Path(__file__).resolve().parent / "protocol.pml"
SPIN = "spin"
CC = os.environ.get("CC", "cc")
MEMLIM_MB = int(os.environ.get("MODEL_MEMLIM", "2500"))
DEPTH = 100_000


@dataclass(frozen=True)
class Config:
    """One bounded configuration of the model, checked exhaustively."""

    name: str
    defines: tuple[str, ...]
    covers: str
    cycles: bool = False
    """Search for non-progress cycles (``-DNP``, ``pan -l``) instead of the safety properties:
    none means every run of this configuration ends, so the check at quiescence covers
    "eventually"."""


# Every configuration has 2 replicas; a key's client retries it on any replica (the first request
# goes to replica 0: the replicas are symmetric). Fault counts are per run. docs/protocol.md
# ("What is checked") repeats this table with the numbers of a run.
CONFIGS: tuple[Config, ...] = (
    Config(
        "two-keys-retry",
        ("NK=2", "LEAN", "MAXPAUSE=0", "MAXCRASH=0", "MAXPART=0", "MAXFAIL=0"),
        "2 keys (key 0 retried: 3 requests), no fault: retries racing the first request",
    ),
    Config(
        "two-keys-pause",
        ("NK=2", "MAXREQ=1", "LEAN", "MAXPAUSE=1", "MAXCRASH=0", "MAXPART=0", "MAXFAIL=0"),
        "2 keys (1 request each), 1 pause: one replica's stall lapses both",
    ),
    Config(
        "pauses",
        ("NK=1", "MAXPAUSE=2", "MAXCRASH=0", "MAXPART=0", "MAXFAIL=0"),
        "1 key retried (2 requests), 2 pauses: issue 29's reproduction and its neighbours",
    ),
    Config(
        "pause-crash",
        ("NK=1", "MAXPAUSE=1", "MAXCRASH=1", "MAXPART=0", "MAXFAIL=0"),
        "1 key retried, 1 pause and 1 crash (a restart from the journal)",
    ),
    Config(
        "pause-failover-sync",
        ("NK=1", "MAXPAUSE=1", "MAXCRASH=0", "MAXPART=0", "MAXFAIL=1"),
        "1 key retried, 1 pause, 1 failover to a synchronous standby",
    ),
    Config(
        "partition-failover-sync",
        ("NK=1", "MAXPAUSE=0", "MAXCRASH=0", "MAXPART=1", "MAXFAIL=1"),
        "1 key retried, 1 replica-database partition, 1 failover to a synchronous standby",
    ),
    Config(
        "pauses-cycles",
        ("NK=1", "MAXPAUSE=2", "MAXCRASH=0", "MAXPART=0", "MAXFAIL=0"),
        "the same as pauses: no run cycles without end (non-progress cycles, pan -l)",
        cycles=True,
    ),
    Config(
        "failover-async",
        ("NK=1", "MAXPAUSE=0", "MAXCRASH=0", "MAXPART=0", "MAXFAIL=1", "ASYNC"),
        "1 key retried, 1 failover to an asynchronous standby that lost writes",
    ),
)

# Larger bounds, on demand only (by name): tens of millions of states, more than MODEL_MEMLIM's
# default; run with MODEL_MEMLIM=8000 or more.
DEEP: tuple[Config, ...] = (
    Config(
        "deep-two-keys-retry-pause",
        ("NK=2", "LEAN", "MAXPAUSE=1", "MAXCRASH=0", "MAXPART=0", "MAXFAIL=0"),
        "2 keys (key 0 retried), 1 pause",
    ),
    Config(
        "deep-pause-crash-async",
        ("NK=1", "MAXPAUSE=1", "MAXCRASH=1", "MAXPART=0", "MAXFAIL=1", "ASYNC"),
        "1 key retried, 1 pause, 1 crash, 1 failover that lost writes",
    ),
)


@dataclass(frozen=True)
class Result:
    errors: int
    states: int
    depth: int
    seconds: float
    complete: bool
    output: str


def spin_available() -> bool:
    return shutil.which(SPIN) is not None and shutil.which(CC) is not None


def build(
    workdir: Path, defines: tuple[str, ...], *, collapse: bool = True, cycles: bool = False
) -> Path:
    """``spin -a`` the model into ``workdir`` with ``defines`` and compile the verifier (for
    non-progress cycles with ``cycles``)."""
    shutil.copy(MODEL, workdir / MODEL.name)
    flags = [f"-D{d}" for d in defines]
    subprocess.run(
        [SPIN, "-a", *flags, MODEL.name], cwd=workdir, check=True, capture_output=True, text=True
    )
    cflags = ["-O2", "-w", "-DNP" if cycles else "-DSAFETY", f"-DMEMLIM={MEMLIM_MB}"]
    if collapse:
        cflags.append("-DCOLLAPSE")
    subprocess.run(
        [CC, *cflags, "-o", "pan", "pan.c"], cwd=workdir, check=True, capture_output=True, text=True
    )
    return workdir / "pan"


def verify(workdir: Path, *, cycles: bool = False) -> Result:
    """Run the verifier: stop at the first error (its trail is written), search the rest."""
    started = time.monotonic()
    proc = subprocess.run(
        ["./pan", f"-m{DEPTH}", *(["-l"] if cycles else [])],
        cwd=workdir,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.monotonic() - started
    out = proc.stdout + proc.stderr
    errors = re.search(r"errors: (\d+)", out)
    states = re.search(r"(\d+) states, stored", out)
    depth = re.search(r"depth reached (\d+)", out)
    incomplete = (
        "Search not completed" in out
        or "reached -DMEMLIM bound" in out
        or "max search depth" in out
    )
    return Result(
        errors=int(errors.group(1)) if errors else -1,
        states=int(states.group(1)) if states else 0,
        depth=int(depth.group(1)) if depth else 0,
        seconds=seconds,
        complete=errors is not None and not incomplete,
        output=out,
    )


def trail(workdir: Path, defines: tuple[str, ...]) -> list[str]:
    """The ``STEP`` lines of the trail the last run wrote, replayed with ``spin -t``, then
    spin's lines about the assertion that failed."""
    flags = [f"-D{d}" for d in defines]
    proc = subprocess.run(
        [SPIN, "-t", *flags, MODEL.name], cwd=workdir, capture_output=True, text=True, check=False
    )
    steps = [line.strip() for line in proc.stdout.splitlines() if line.strip().startswith("STEP ")]
    failed = [line.strip() for line in proc.stdout.splitlines() if "assert" in line]
    return steps + failed


def main(argv: list[str]) -> int:
    if "--list" in argv:
        for config in (*CONFIGS, *DEEP):
            print(f"{config.name:26} {' '.join(config.defines):60} {config.covers}")
        return 0
    wanted = [c for c in (*CONFIGS, *DEEP) if c.name in argv] if argv else list(CONFIGS)
    if not spin_available():
        print(f"model: no {SPIN} or {CC} on PATH (make model installs Debian's spin as root)")
        return 2
    failed = 0
    for n, config in enumerate(wanted, 1):
        print(
            f"model [{n}/{len(wanted)}] {config.name}: {config.covers}\n"
            f"        spin -a {' '.join('-D' + d for d in config.defines)}"
            f"{' (non-progress cycles)' if config.cycles else ''} ...",
            flush=True,
        )
        with tempfile.TemporaryDirectory(prefix="agentsafe-model-") as tmp:
            workdir = Path(tmp)
            build(workdir, config.defines, cycles=config.cycles)
            result = verify(workdir, cycles=config.cycles)
            verdict = "ok" if result.complete and result.errors == 0 else "FAILED"
            print(
                f"        {verdict}: errors {result.errors}, {result.states} states,"
                f" depth {result.depth}, {result.seconds:.1f} s",
                flush=True,
            )
            if verdict != "ok":
                failed += 1
                print(result.output)
                if result.errors > 0:
                    print("        counterexample (spin -t):")
                    for line in trail(workdir, config.defines):
                        print(f"          {line}")
    print(f"model: {len(wanted) - failed} of {len(wanted)} configurations with 0 errors")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
