"""``agentsafe policy test|lint|explain``: output, ``-o json`` and the exit statuses."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from agentsafe.executor.cli import main

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    shutil.copy(EXAMPLES / "policy.yaml", tmp_path / "policy.yaml")
    shutil.copy(EXAMPLES / "policy.test.yaml", tmp_path / "policy.test.yaml")
    return tmp_path


def test_the_examples_pass(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "test", str(EXAMPLES)]) == 0
    out = capsys.readouterr().out
    assert "0 failed" in out
    assert "FAIL" not in out


def test_a_failing_case_exits_1_and_says_why(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (workdir / "policy.test.yaml").read_text()
    (workdir / "policy.test.yaml").write_text(
        text.replace("reasonCodes: [AMOUNT_ABOVE_POLICY]", "reasonCodes: [TOO_MUCH]")
    )
    assert main(["policy", "test", str(workdir / "policy.yaml")]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out
    assert "expected ['TOO_MUCH'], got ['AMOUNT_ABOVE_POLICY']" in out


def test_json_output_for_scripts(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "test", str(workdir), "-o", "json", "--name", "a small payout"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["failed"] == 0
    assert report["passed"] == 1
    (entry,) = report["files"]
    assert entry["policyDigest"].startswith("sha256:")
    assert entry["cases"][0]["verdict"] == "ALLOW"


def test_nothing_to_test_is_a_failure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "test", str(tmp_path)]) == 1
    assert "no test files found" in capsys.readouterr().err


def test_an_invalid_policy_exits_78(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (workdir / "policy.yaml").write_text("actions: [{name: x}]\n")
    assert main(["policy", "test", str(workdir), "-o", "json"]) == 78
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["code"] == "POLICY_INVALID"


def test_an_invalid_test_file_exits_78(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (workdir / "policy.test.yaml").write_text("version: agent-safe.policy-test/1\ntests: [{}]\n")
    assert main(["policy", "test", str(workdir)]) == 78
    err = capsys.readouterr().err
    assert "POLICY_TEST_INVALID" in err
    assert "tests[0]" in err


def test_lint_clean_and_with_findings(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "lint", str(workdir / "policy.yaml")]) == 0
    capsys.readouterr()
    text = (workdir / "policy.yaml").read_text()
    (workdir / "policy.yaml").write_text(
        text.replace('"params.amountMinor <= 50000"', '"params.amountMinor <= 500"')
    )
    assert main(["policy", "lint", str(workdir / "policy.yaml"), "-o", "json"]) == 1
    report = json.loads(capsys.readouterr().out)
    (finding,) = report["files"][0]["findings"]
    assert finding["code"] == "RULE_SHADOWED"
    assert finding["path"] == "actions[0].rules[1]"


def test_lint_of_unparseable_yaml_exits_78(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text("actions: [\n")
    assert main(["policy", "lint", str(tmp_path / "p.yaml")]) == 78


def test_explain_one_case(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name = "a large payout is blocked with the policy's reason"
    assert main(["policy", "explain", str(workdir / "policy.test.yaml"), "--name", name]) == 0
    out = capsys.readouterr().out
    assert "rule large (actions[0].rules[2]): true  -> true" in out
    assert "verdict: BLOCK AMOUNT_ABOVE_POLICY" in out


def test_explain_needs_a_name_when_the_file_has_several(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["policy", "explain", str(workdir / "policy.test.yaml")]) == 2
    assert "--name" in capsys.readouterr().err


def test_explain_a_single_case_file(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    case = workdir / "case.yaml"
    case.write_text(
        "name: one\n"
        "principal: {id: p, tenantId: t, actor: {id: a, type: ai_agent}}\n"
        "proposal: {action: create_payout, resource: r,"
        " parameters: {amountMinor: 7, currency: EUR}}\n"
        "expect: {verdict: BLOCK}\n"
    )
    assert main(["policy", "explain", str(case)]) == 2
    capsys.readouterr()
    argv = ["policy", "explain", str(case), "--policy", str(workdir / "policy.yaml"), "-o", "json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "ALLOW"
    assert out["expected"] is False
    assert out["failures"] == ["verdict: expected BLOCK, got ALLOW"]


def test_help_explains_the_format_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["policy", "test", "--help"])
    out = capsys.readouterr().out
    assert "test.yaml" in out
    assert "78" in out
