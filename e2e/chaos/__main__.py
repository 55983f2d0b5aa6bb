"""``python -m chaos`` (run from ``e2e/``): ``run`` a seeded chaos run, or ``check`` a history.

``run`` (``make chaos``): the short run by default, every fault class once per seed of
:data:`SHORT_SEEDS`; ``--seed N`` (repeatable) replays those seeds; ``--seconds S`` (``make chaos
CHAOS_SECONDS=S``) makes a long run of about S seconds per seed; ``--only FAULT`` plays only
those fault classes; ``--replica-python PATH`` runs the replicas from another checkout's venv
(the same schedule against other code). Exits 0 when every property holds for every seed, 1
when one fails, and 0 with one line when toxiproxy or PostgreSQL is missing, unless
``AGENTSAFE_E2E=require``, which makes that a failure. ``check DIR`` runs only the checker.

Callers: ``make chaos``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
from pathlib import Path

from cluster.build import TOXIPROXY_VERSION, e2e_required, toxiproxy_binary

from . import checker
from .pgpair import find_bindir
from .run import RunOptions, default_out, run
from .schedule import FAULT_CLASSES, long_schedule, short_schedule
from .system import faketime_available

SHORT_SEEDS = (29,)


def _unavailable(message: str) -> int:
    if e2e_required():
        print(f"chaos: AGENTSAFE_E2E=require and {message}", file=sys.stderr)
        return 1
    print(f"chaos: skipped: {message} (AGENTSAFE_E2E=require makes this a failure)")
    return 0


def _run(args: argparse.Namespace) -> int:
    binary = toxiproxy_binary()
    if binary is None:
        return _unavailable(f"toxiproxy {TOXIPROXY_VERSION} is not built (make e2e-build)")
    if find_bindir() is None:
        return _unavailable("PostgreSQL is not installed (apt-get install -y postgresql)")
    only = tuple(args.only or ())
    if not faketime_available():
        if e2e_required():
            return _unavailable("libfaketime is missing (apt-get install -y faketime)")
        print("chaos: libfaketime missing (apt-get install -y faketime): no clock-step")
        only = only or tuple(f for f in FAULT_CLASSES if f != "clock-step")
    seeds = args.seed or list(SHORT_SEEDS)
    failed: list[int] = []
    for seed in seeds:
        schedule = long_schedule(seed, args.seconds) if args.seconds else short_schedule(seed, only)
        out = Path(args.out) / f"seed-{seed}" if args.out else default_out(seed)
        options = RunOptions(
            seed=seed,
            schedule=schedule,
            out=out,
            toxiproxy=binary,
            replica_python=args.replica_python,
        )
        if asyncio.run(run(options)) != 0:
            failed.append(seed)
            print(
                f"chaos: seed {seed} FAILED; history kept in {out}; replay: make chaos SEED={seed}"
            )
        elif not args.out:  # a passing run's history is not kept unless asked for (--out)
            shutil.rmtree(out, ignore_errors=True)
    if failed:
        print(f"chaos: {len(failed)} of {len(seeds)} seeds failed: {failed}")
        return 1
    print(f"chaos: {len(seeds)} seed(s) passed")
    return 0


def _check(args: argparse.Namespace) -> int:
    history = checker.load_history(Path(args.directory))
    agentsafe = Path(sys.executable).parent / "agentsafe"
    results = checker.check(history, agentsafe=str(agentsafe) if agentsafe.exists() else None)
    print(checker.format_report(history, results))
    return 1 if any(r.status == "FAIL" for r in results) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run", help="a seeded chaos run, then the checker")
    run_parser.add_argument("--seed", type=int, action="append", help="replay this seed")
    run_parser.add_argument(
        "--seconds", type=float, default=float(os.environ.get("CHAOS_SECONDS") or 0)
    )
    run_parser.add_argument("--only", action="append", choices=FAULT_CLASSES)
    run_parser.add_argument("--out", help="keep the histories under this directory")
    run_parser.add_argument(
        "--replica-python",
        help="run the replicas with this interpreter (another checkout's .venv/bin/python)",
    )
    run_parser.set_defaults(handler=_run)
    check_parser = sub.add_parser("check", help="check a saved history directory")
    check_parser.add_argument("directory")
    check_parser.set_defaults(handler=_check)
    args = parser.parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    raise SystemExit(main())
