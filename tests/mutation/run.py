"""Mutation testing of the core (issue 23): ``make mutation``, nightly, never in ``make test``.

For each module of :data:`MODULES` it copies the committed tree (``git archive HEAD``) to a
scratch directory, so the working tree is never touched, and for every mutant mutmut's engine
generates for that module (``mutmut.list_mutations`` / ``mutmut.mutate``: numbers, strings,
operators, keywords, arguments, decorators...) it writes the mutant into the copy and runs the
tests that guard the module. A mutant is *killed* when those tests fail (or cannot even import
it), *survived* when they all pass. The score is killed / mutants.

    .venv/bin/python tests/mutation/run.py [MODULE...] [--json FILE]   # default: all MODULES
    .venv/bin/python tests/mutation/run.py --list
    .venv/bin/python tests/mutation/run.py --recheck OLD.json [--json NEW.json]  # survivors only

A report records each module's source digest; ``--recheck`` refuses a module whose source changed
since (its mutants, and their line numbers, are others: a stale survivor list would count every
new mutant as killed).

Why a driver and not ``mutmut run``: mutmut 2's runner keeps its results in a pony/SQLite cache
that lost track of lines here (``Attribute Mutant.line is required``) and recorded mutants its
own single-mutant rerun kills as survivors; and mutmut 3 imports a copied ``src`` tree, which
this repository's ``package-dir`` layout (``executor/`` is ``agentsafe.executor``) does not have.
The copy is imported through a symlink tree on ``PYTHONPATH``; only the plugins the suite needs
are loaded, which halves the cost of each run. Survivors are printed as unified diffs.
docs/mutation.md has the scores and why each remaining survivor is equivalent.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

MODULES: dict[str, list[str]] = {
    "executor/canonical.py": ["tests/test_canonical.py"],
    "executor/intent.py": ["tests/test_intent.py"],
    "executor/grants.py": ["tests/test_grants.py", "tests/test_grants_messages.py"],
    # compact JWS: its own tests, and grants' (verify_jws, the words of each refusal) over it
    "executor/jws.py": [
        "tests/test_jws.py",
        "tests/test_grants.py",
        "tests/test_grants_messages.py",
    ],
    "executor/door/door.py": ["tests/door"],  # test_door_messages.py among them
    "executor/state/usestore.py": ["tests/state/test_usestore.py"],
    # the consumption token and the completion rule both backends share (issue 32's split)
    "executor/state/records.py": ["tests/state/test_usestore.py"],
    "executor/state/journal.py": [
        "tests/state/test_journal.py",
        "tests/state/test_journal_recovery.py",
    ],
    # reading the journal back, split out of journal.py (issue 32)
    "executor/state/journalscan.py": [
        "tests/state/test_journal.py",
        "tests/state/test_journal_recovery.py",
    ],
    "executor/state/journalrecords.py": [
        "tests/state/test_journal.py",
        "tests/state/test_journal_recovery.py",
    ],
}
# A quick first pass for a module whose guard has slow tests: a mutant these tests kill is killed
# (they are a subset of the guard); one they miss is tried against the whole guard.
FIRST_PASS: dict[str, list[str]] = {
    "executor/door/door.py": ["tests/door/test_door.py", "tests/door/test_door_messages.py"],
    "executor/state/usestore.py": ["-k", "not processes", "tests/state/test_usestore.py"],
    "executor/state/records.py": ["-k", "not processes", "tests/state/test_usestore.py"],
    "executor/state/journal.py": [
        "-k",
        "not 256_kib and not two_hundred and not sigkill",
        "tests/state/test_journal_recovery.py",
        "tests/state/test_journal.py",
    ],
    "executor/state/journalscan.py": [
        "-k",
        "not 256_kib and not two_hundred and not sigkill",
        "tests/state/test_journal_recovery.py",
        "tests/state/test_journal.py",
    ],
    "executor/state/journalrecords.py": [
        "-k",
        "not 256_kib and not two_hundred and not sigkill",
        "tests/state/test_journal_recovery.py",
        "tests/state/test_journal.py",
    ],
}
# The part of a module the core is (issue 23): only mutants inside these functions and classes
# count; a module not listed here is mutated whole.
SCOPES: dict[str, list[str]] = {
    "executor/state/usestore.py": [  # idempotency and grant claims (and single-use consumption)
        "SQLiteUseStore.claim_grant",
        "SQLiteUseStore.idempotency_begin",
        "SQLiteUseStore.idempotency_record",
        "_key_kept",
        "SQLiteUseStore.idempotency_complete",
        "SQLiteUseStore.idempotency_settle",
        "SQLiteUseStore.idempotency_release",
        "SQLiteUseStore.consume",
        "SQLiteUseStore.verify_consumption",
        "SQLiteUseStore._token",
    ],
    "executor/state/records.py": ["consumption_token", "settles"],
    # recovery: reading the journal back after a crash (journal.py was split in issue 32)
    "executor/state/journal.py": ["_day_of"],
    "executor/state/journalwriter.py": ["_cut_torn_tail"],
    "executor/state/journalscan.py": ["scan_journal", "_parse_line", "_text", "_Builder"],
    "executor/state/journalrecords.py": ["OpenAttempt"],
}
PLUGINS = ["-p", "asyncio", "-p", "pytest_timeout", "-p", "pytest_aiohttp"]
PLUGINS += ["-p", "hypothesis.extra.pytestplugin"]


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


def scoped_lines(source: str, names: list[str]) -> set[int]:
    """The 1-based lines of the functions and classes ``names`` (dotted: ``Class.method``)."""
    import ast

    lines: set[int] = set()
    wanted = set(names)

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if name in wanted:
                    wanted.discard(name)
                    first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                    lines.update(range(first, (child.end_lineno or child.lineno) + 1))
                else:
                    visit(child, name + ".")

    visit(ast.parse(source), "")
    if wanted:
        raise SystemExit(f"mutation: no such function or class: {', '.join(sorted(wanted))}")
    return lines


def mutants(source: str, filename: str) -> list[tuple[int, str]]:
    from mutmut import ALL, Context, list_mutations, mutate

    ids = list_mutations(Context(source=source, mutation_id=ALL, filename=filename))
    out = []
    for mutation_id in ids:
        mutated, count = mutate(Context(source=source, mutation_id=mutation_id, filename=filename))
        if count:
            out.append((mutation_id.line_number + 1, mutated))
    return out


def tests_pass(root: Path, tests: list[str], timeout: float) -> bool | None:
    env = {
        **os.environ,
        "PYTHONPATH": f"{root}/build/mut",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    command = [str(BIN / "pytest"), "-x", "-q", "-p", "no:cacheprovider", *PLUGINS, *tests]
    try:
        result = subprocess.run(
            command, cwd=root, env=env, capture_output=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return None
    return result.returncode == 0


def _diff(module: str, original: str, mutated: str, line: int) -> str:
    return "".join(
        difflib.unified_diff(
            original.splitlines(keepends=True),
            mutated.splitlines(keepends=True),
            f"{module}:{line}",
            "mutant",
            n=0,
        )
    )


def run_module(
    root: Path,
    module: str,
    tests: list[str],
    only: set[str] | None = None,
    source_sha256: str | None = None,
) -> dict[str, object]:
    """Try every mutant of ``module``; with ``only`` (survivor diffs of an earlier report on the
    same source, whose digest is ``source_sha256``), only those, counting every other mutant as
    killed as it was then. A recheck of another source is refused: its mutants are others."""
    path = root / module
    original = path.read_text()
    digest = hashlib.sha256(original.encode()).hexdigest()
    if source_sha256 is not None and source_sha256 != digest:
        raise SystemExit(f"mutation: {module} changed since the report: run it whole again")
    start = time.monotonic()
    if not tests_pass(root, tests, timeout=600):
        raise SystemExit(f"mutation: the tests of {module} fail without any mutant")
    baseline = time.monotonic() - start
    found = mutants(original, module)
    if module in SCOPES:
        scope = scoped_lines(original, SCOPES[module])
        found = [(line, mutated) for line, mutated in found if line in scope]
    print(f"mutation: {module}: {len(found)} mutants, baseline {baseline:.1f}s", flush=True)
    killed = timed_out = 0
    survivors: list[str] = []
    try:
        for index, (line, mutated) in enumerate(found, start=1):
            if only is not None and _diff(module, original, mutated, line) not in only:
                killed += 1
                continue
            path.write_text(mutated)
            verdict: bool | None = True
            if module in FIRST_PASS:
                verdict = tests_pass(root, FIRST_PASS[module], timeout=max(30.0, baseline * 10))
            if verdict:
                verdict = tests_pass(root, tests, timeout=max(30.0, baseline * 10))
            if verdict is None:
                timed_out += 1  # the suite hangs on it: noticed, counted as killed
            elif verdict:
                diff = _diff(module, original, mutated, line)
                survivors.append(diff)
                print(f"mutation: SURVIVED {module}:{line}\n{diff}", flush=True)
            else:
                killed += 1
            if index % 20 == 0:
                print(f"mutation: {module}: {index}/{len(found)} tried", flush=True)
    finally:
        path.write_text(original)
    total = len(found)
    detected = killed + timed_out
    return {
        "source_sha256": digest,
        "mutants": total,
        "killed": detected,
        "timed_out": timed_out,
        "survived": len(survivors),
        "score": round(100.0 * detected / total, 1) if total else 100.0,
        "survivors": survivors,
    }


def main() -> int:
    args = sys.argv[1:]
    if args == ["--list"]:
        print("\n".join(MODULES))
        return 0
    report_file = None
    if "--json" in args:
        at = args.index("--json")
        report_file = Path(args[at + 1])
        del args[at : at + 2]
    earlier: dict[str, set[str]] = {}
    digests: dict[str, str | None] = {}
    if "--recheck" in args:  # re-try only an earlier report's survivors (tests changed since)
        at = args.index("--recheck")
        previous = json.loads(Path(args[at + 1]).read_text())
        earlier = {module: set(s["survivors"]) for module, s in previous.items()}
        digests = {module: s.get("source_sha256") for module, s in previous.items()}
        del args[at : at + 2]
        args = args or list(earlier)
    chosen = args or list(MODULES)
    unknown = [m for m in chosen if m not in MODULES]
    if unknown:
        print(f"unknown module(s): {', '.join(unknown)}; see --list", file=sys.stderr)
        return 2
    root = scratch_copy()
    scores = {}
    for module in chosen:
        scores[module] = run_module(
            root, module, MODULES[module], earlier.get(module), digests.get(module)
        )
        s = scores[module]
        print(
            f"mutation: {module}: {s['killed']}/{s['mutants']} killed ({s['score']}%), "
            f"{s['survived']} survived",
            flush=True,
        )
        if report_file is not None:
            report_file.write_text(json.dumps(scores, indent=2))
    killed = sum(int(str(s["killed"])) for s in scores.values())
    total = sum(int(str(s["mutants"])) for s in scores.values())
    print(f"mutation: total {killed}/{total} killed ({100.0 * killed / max(total, 1):.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
