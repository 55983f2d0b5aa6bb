"""Run one fuzz target under atheris (libFuzzer), or a short run of every target.

    .venv/bin/python tests/fuzz/run.py TARGET [libFuzzer flags...]   # e.g. -runs=1000000
    .venv/bin/python tests/fuzz/run.py --smoke SECONDS               # every target, briefly

A target's corpus is ``tests/fuzz/corpus/<target>/`` (seeds and found inputs, replayed by
``tests/fuzz/test_corpus.py`` in the suite). New interesting inputs libFuzzer finds go to a
scratch directory, never into the repository; a crash writes ``crash-*`` there and exits
non-zero: minimise it, add it to the corpus as ``found-<what>``, fix the parser. The scratch
directory's other files (the inputs that reached new coverage) may be copied into the corpus
too; libFuzzer's ``-merge=1`` is not available, as it re-executes ``argv[0]``. ``--smoke``
runs each target in its own process for SECONDS (``make fuzz-smoke``, part of ``make test``)
and fails if any target crashes. Run from the repository root with the venv's python: this
script's directory, not the repository root, is what lands on ``sys.path``.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"


def fuzz(name: str, flags: list[str]) -> None:
    import atheris

    with atheris.instrument_imports(include=["agentsafe"]):
        import agentsafe.executor.canonical
        import agentsafe.executor.door.principals_file
        import agentsafe.executor.door.workload
        import agentsafe.executor.egress.httpsig
        import agentsafe.executor.grants
        import agentsafe.executor.intent
        import agentsafe.executor.plans.citations
        import agentsafe.executor.policy.policy
        import agentsafe.executor.routes.app
        import agentsafe.executor.state.journal  # noqa: F401
    from targets import TARGETS

    target = TARGETS[name]
    scratch = tempfile.mkdtemp(prefix=f"agentsafe-fuzz-{name}-")
    seeds = CORPUS / name
    argv = [sys.argv[0], *flags, f"-artifact_prefix={scratch}/", scratch, str(seeds)]
    print(f"fuzzing {name}: new inputs in {scratch}, seeds from {seeds}", flush=True)
    atheris.Setup(argv, target)
    atheris.Fuzz()


def smoke(seconds: int) -> int:
    from targets import TARGETS

    failed = []
    for name in TARGETS:
        print(f"fuzz-smoke: {name} for {seconds}s", flush=True)
        result = subprocess.run(
            [sys.executable, __file__, name, f"-max_total_time={seconds}", "-print_final_stats=1"],
            capture_output=True,
            text=True,
            timeout=seconds * 10 + 60,
        )
        stats = [line for line in result.stderr.splitlines() if line.startswith("stat::")]
        runs = next(
            (line.split(":")[-1].strip() for line in stats if "number_of_executed_units" in line),
            "?",
        )
        print(f"fuzz-smoke: {name}: exit {result.returncode}, {runs} inputs", flush=True)
        if result.returncode != 0:
            sys.stderr.write(result.stderr[-4000:])
            failed.append(name)
    if failed:
        print(f"fuzz-smoke: FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def main() -> int:
    args = sys.argv[1:]
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 2
    if args[0] == "--smoke":
        return smoke(int(args[1]) if len(args) > 1 else 3)
    fuzz(args[0], args[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
