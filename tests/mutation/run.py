"""Mutation testing of the core with mutmut (issue 23): ``make mutation``, nightly, never in
``make test``.

For each module of :data:`MODULES` it mutates a scratch copy of the committed tree (``git
archive HEAD``; the working tree is never touched), runs the tests that guard that module
against every mutant, and prints the score: killed / (killed + survived + timed out +
suspicious). A mutant "survives" when every test still passes with it. Surviving mutants are
listed with ``mutmut show`` in the scratch directory, which is kept and printed at the end.

    .venv/bin/python tests/mutation/run.py [MODULE...]     # default: all of MODULES
    .venv/bin/python tests/mutation/run.py --list

mutmut 2 (it mutates in place, which works with this repository's ``package-dir`` layout; the
scratch copy is imported through a symlink tree on ``PYTHONPATH``). docs/mutation.md has the
last scores and why each remaining survivor is equivalent.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

MODULES: dict[str, list[str]] = {
    "executor/canonical.py": ["tests/test_canonical.py"],
    "executor/intent.py": ["tests/test_intent.py"],
    "executor/grants.py": ["tests/test_grants.py"],
    "executor/door/door.py": ["tests/door"],
    "executor/state/usestore.py": ["tests/state"],
    "executor/state/journal.py": ["tests/state"],
}


def scratch_copy() -> Path:
    root = Path(tempfile.mkdtemp(prefix="agentsafe-mutation-"))
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "HEAD"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    links = root / "build" / "mut" / "agentsafe"
    links.mkdir(parents=True)
    (links / "executor").symlink_to(root / "executor")
    (links / "operator").symlink_to(root / "operator")
    return root


def run_module(root: Path, module: str, tests: list[str]) -> dict[str, int]:
    # Only the plugins the suite uses: autoloading every installed one doubles each run's cost.
    plugins = "-p asyncio -p pytest_timeout -p pytest_aiohttp -p hypothesis.extra.pytestplugin"
    runner = f"{BIN}/pytest -x -q -p no:cacheprovider {plugins} --timeout=120 {' '.join(tests)}"
    env = {
        **os.environ,
        "PYTHONPATH": f"{root}/build/mut",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    }
    cache = root / ".mutmut-cache"
    cache.unlink(missing_ok=True)
    print(f"mutation: {module} against {' '.join(tests)}", flush=True)
    subprocess.run(
        [
            str(BIN / "mutmut"),
            "run",
            "--paths-to-mutate",
            module,
            "--runner",
            runner,
            "--no-progress",
            "--simple-output",
        ],
        cwd=root,
        env=env,
        check=False,
    )
    results = subprocess.run(
        [str(BIN / "mutmut"), "junitxml"], cwd=root, capture_output=True, text=True, check=False
    ).stdout
    total = int(_attr(results, "tests"))
    failures = int(_attr(results, "failures"))
    errors = int(_attr(results, "errors"))
    skipped = int(_attr(results, "skipped"))
    if total == 0:
        raise SystemExit(f"mutation: mutmut produced no results for {module}; see its output")
    survived = failures + errors
    killed = total - survived - skipped
    (root / f"survivors-{module.replace('/', '_')}.txt").write_text(
        subprocess.run(
            [str(BIN / "mutmut"), "results"], cwd=root, capture_output=True, text=True, check=False
        ).stdout
    )
    cache.rename(root / f".mutmut-cache-{module.replace('/', '_')}")
    return {"mutants": total - skipped, "killed": killed, "survived": survived}


def _attr(xml: str, name: str) -> str:
    match = re.search(rf'<testsuite[^>]*\b{name}="(\d+)"', xml)
    return match.group(1) if match else "0"


def main() -> int:
    args = sys.argv[1:]
    if args == ["--list"]:
        print("\n".join(MODULES))
        return 0
    chosen = args or list(MODULES)
    unknown = [m for m in chosen if m not in MODULES]
    if unknown:
        print(f"unknown module(s): {', '.join(unknown)}; see --list", file=sys.stderr)
        return 2
    root = scratch_copy()
    scores: dict[str, dict[str, int]] = {}
    for module in chosen:
        scores[module] = run_module(root, module, MODULES[module])
        s = scores[module]
        pct = 100.0 * s["killed"] / s["mutants"] if s["mutants"] else 100.0
        print(f"mutation: {module}: {s['killed']}/{s['mutants']} killed ({pct:.1f}%)", flush=True)
    killed = sum(s["killed"] for s in scores.values())
    mutants = sum(s["mutants"] for s in scores.values())
    print(json.dumps({"modules": scores, "killed": killed, "mutants": mutants}, indent=2))
    print(f"mutation: scratch copy kept in {root} (survivors-*.txt; mutmut show ID there)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
