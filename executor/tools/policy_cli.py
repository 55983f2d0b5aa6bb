"""``agentsafe policy test|lint|explain``: a policy author's tools, offline.

- ``test``: run ``<policy>.test.yaml`` files (``policy/trial.py`` says the format) through the
  authority's own evaluation, and say which cases failed and how;
- ``lint``: every schema and CEL problem of a policy at once, and rules that can never decide
  (``policy/lint.py``);
- ``explain``: for one case, every step the authority took and the rule that decided.

Nothing here opens a socket, reads a key or starts the executor. ``-o json`` prints one JSON
document on stdout for scripts. Exit statuses are stable: :data:`EXIT_OK` (0), :data:`EXIT_FAILED`
(1: a case failed, the lint found something, or there was nothing to test), :data:`EXIT_USAGE`
(2), :data:`EXIT_INVALID` (78: a policy or test file cannot be read or is not valid).

Callers: ``cli.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..codes import Code
from ..errors import PolicyError
from ..policy.lint import lint_policy
from ..policy.policy import CompiledPolicy, read_document
from ..policy.trial import (
    CaseResult,
    PolicyTestCase,
    discover_test_files,
    explain_case,
    load_compiled,
    load_test_file,
    parse_cases,
    policy_for,
    run_cases,
)

__all__ = ["EXIT_FAILED", "EXIT_INVALID", "EXIT_OK", "EXIT_USAGE", "add_parser"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INVALID = 78

_EPILOG = (
    "Exit status: 0 success; 1 a case failed, the lint found something, or nothing was found to "
    "test; 2 usage; 78 a policy or test file cannot be read or is invalid."
)


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "policy",
        help="test, lint and explain a policy offline",
        description="Tools for policy authors. They read files only: no executor, key or "
        "network is involved, and the decision is made by the same code 'agentsafe serve' uses.",
        epilog=_EPILOG,
    )
    verbs = parser.add_subparsers(dest="policy_command", metavar="ACTION", required=True)

    test = verbs.add_parser(
        "test",
        help="run the policy's test cases (<policy>.test.yaml) and report failures",
        description="Run agent-safe.policy-test/1 files. Each case names a principal, a "
        "proposal and the expected verdict (and optionally reason codes, approvers, the "
        "deciding rule, an approval to apply, the clock). A PATH may be a test file, a policy "
        "(its <name>.test.yaml siblings run), or a directory (every *.test.yaml below it). "
        "See docs/policy-testing.md.",
        epilog=_EPILOG,
    )
    test.add_argument("paths", nargs="+", metavar="PATH", type=Path)
    test.add_argument("--name", help="run only cases whose name contains this text")
    _output(test)
    test.set_defaults(run=_run_test)

    lint = verbs.add_parser(
        "lint",
        help="compile every rule and parameter schema; report unreachable or shadowed rules",
        description="Report every problem of a policy at once: schema errors, parameter "
        "schemas that are not JSON Schema 2020-12, CEL that does not compile, and rules that "
        "never decide (RULE_UNREACHABLE, RULE_SHADOWED). Findings name the field's path.",
        epilog=_EPILOG,
    )
    lint.add_argument("paths", nargs="+", metavar="POLICY", type=Path)
    _output(lint)
    lint.set_defaults(run=_run_lint)

    explain = verbs.add_parser(
        "explain",
        help="show, for one proposal, every step of the decision and the rule that decided",
        description="Evaluate one case and show each step: the action lookup, the parameter "
        "schema (with every problem), each rule tried with its result, and the verdict with "
        "its reason codes and approvers. CASE is a test file (choose the case with --name) or "
        "a file holding one case (then --policy names the policy).",
        epilog=_EPILOG,
    )
    explain.add_argument("case", metavar="CASE", type=Path)
    explain.add_argument("--policy", type=Path, help="the policy (default: the test file's)")
    explain.add_argument("--name", help="the case's name, when the file holds several")
    _output(explain)
    explain.set_defaults(run=_run_explain)


def _output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-o",
        "--output",
        choices=["text", "json"],
        default="text",
        help="text for people (default), json for scripts",
    )


# -- test ------------------------------------------------------------------------------------


def _run_test(args: argparse.Namespace) -> int:
    files = discover_test_files(args.paths)
    report: list[dict[str, Any]] = []
    failed = 0
    passed = 0
    for test_path in files:
        try:
            test_file = load_test_file(test_path)
            policy_path = policy_for(test_path, test_file)
            policy = load_compiled(policy_path)
        except PolicyError as exc:
            return _invalid(args, test_path, exc)
        cases = [c for c in test_file.tests if not args.name or args.name in c.name]
        results = run_cases(policy, cases)
        failed += sum(not r.passed for r in results)
        passed += sum(r.passed for r in results)
        report.append(
            {
                "file": str(test_path),
                "policy": str(policy_path),
                "policyDigest": policy.digest,
                "cases": [r.as_json() for r in results],
            }
        )
        if args.output == "text":
            _print_results(test_path, results)
    if args.output == "json":
        _print_json({"passed": passed, "failed": failed, "files": report})
    if not files:
        print(
            "agentsafe policy test: no test files found (name them <policy>.test.yaml)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    if passed + failed == 0:
        print("agentsafe policy test: no case matched --name", file=sys.stderr)
        return EXIT_FAILED
    if args.output == "text":
        print(f"{passed} passed, {failed} failed")
    return EXIT_FAILED if failed else EXIT_OK


def _print_results(test_path: Path, results: list[CaseResult]) -> None:
    for result in results:
        mark = "PASS" if result.passed else "FAIL"
        print(f"{mark}  {test_path}: {result.name}")
        for failure in result.failures:
            print(f"        {failure}")


# -- lint ------------------------------------------------------------------------------------


def _run_lint(args: argparse.Namespace) -> int:
    report: list[dict[str, Any]] = []
    total = 0
    for path in args.paths:
        try:
            data = read_document(path, code=Code.POLICY_INVALID, what="policy file")
        except PolicyError as exc:
            return _invalid(args, path, exc)
        findings = lint_policy(data)
        total += len(findings)
        report.append({"file": str(path), "findings": [f.as_json() for f in findings]})
        if args.output == "text":
            for finding in findings:
                print(
                    f"{path}: {finding.path}: {finding.severity} {finding.code}: {finding.message}"
                )
    if args.output == "json":
        _print_json({"findings": total, "files": report})
    else:
        print(f"{total} finding{'s' if total != 1 else ''} in {len(args.paths)} file(s)")
    return EXIT_FAILED if total else EXIT_OK


# -- explain ---------------------------------------------------------------------------------


def _run_explain(args: argparse.Namespace) -> int:
    try:
        case, policy = _explain_inputs(args)
    except _Usage as exc:
        print(f"agentsafe policy explain: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except PolicyError as exc:
        return _invalid(args, args.case, exc)
    explanation = explain_case(policy, case)
    if args.output == "json":
        _print_json(explanation)
        return EXIT_OK
    print(f"case: {explanation['case']}")
    print(f"intent: {explanation['intentHash']}")
    for step in explanation["steps"]:
        if step["step"] == "action":
            print(f"  action {step['action']!r}: {'found' if step['found'] else 'not in policy'}")
        elif step["step"] == "parameters":
            print(f"  parameters: {'valid' if step['valid'] else 'INVALID'}")
            for problem in step["problems"]:
                print(f"    {problem['path']}: {problem['problem']}")
        else:
            result = step["result"]
            shown = result if result == "ERROR" else str(result).lower()
            print(f"  rule {step['rule']} ({step['path']}): {step['when']}  -> {shown}")
    print(f"verdict: {explanation['verdict']} {', '.join(explanation['reasonCodes'])}")
    if explanation["approvers"]:
        print(f"approvers: {', '.join(explanation['approvers'])}")
    print(f"because: {explanation['because']}")
    if explanation["failures"]:
        print("differs from the case's expect:")
        for failure in explanation["failures"]:
            print(f"  {failure}")
    return EXIT_OK


class _Usage(Exception):
    pass


def _explain_inputs(args: argparse.Namespace) -> tuple[PolicyTestCase, CompiledPolicy]:
    data = read_document(args.case, code=Code.POLICY_TEST_INVALID, what="case file")
    if isinstance(data, dict) and "tests" in data:
        test_file = load_test_file(args.case)
        cases = list(test_file.tests)
        policy_path = args.policy or policy_for(args.case, test_file)
    else:
        cases = list(parse_cases([data]))
        if args.policy is None:
            raise _Usage("a file holding one case needs --policy")
        policy_path = args.policy
    if args.name is not None:
        cases = [c for c in cases if c.name == args.name]
        if not cases:
            raise _Usage("no case has that --name")
    elif len(cases) > 1:
        names = "; ".join(c.name for c in cases)
        raise _Usage(f"the file holds {len(cases)} cases, choose one with --name: {names}")
    return cases[0], load_compiled(policy_path)


def _invalid(args: argparse.Namespace, path: Path, exc: PolicyError) -> int:
    if args.output == "json":
        _print_json({"error": {"file": str(path), "code": exc.code, "message": str(exc)}})
    else:
        print(f"agentsafe policy: {path}: {exc.code}: {exc}", file=sys.stderr)
        print(
            "fix the field named above and run again; 'agentsafe policy lint' lists every "
            "problem of a policy at once",
            file=sys.stderr,
        )
    return EXIT_INVALID


def _print_json(document: Any) -> None:
    sys.stdout.write(json.dumps(document, indent=2, sort_keys=True) + "\n")
