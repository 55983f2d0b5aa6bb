"""``policy/trial.py``: policy test files, run through the authority's own evaluation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from agentsafe.executor.errors import PolicyError
from agentsafe.executor.policy.authority import evaluate_policy
from agentsafe.executor.policy.policy import compile_policy, load_policy
from agentsafe.executor.policy.trial import (
    discover_test_files,
    explain_case,
    load_test_file,
    parse_cases,
    parse_test_file,
    policy_for,
    run_case,
)

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "policy.yaml"
PRINCIPAL = {
    "id": "payments-agent",
    "tenantId": "7c0e5f2a-4d1b-4c3e-9f60-2b8a1d9e0c11",
    "actor": {"id": "agent-7", "type": "ai_agent"},
}


def _case(amount: int, expect: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "name": f"payout {amount}",
        "principal": PRINCIPAL,
        "proposal": {
            "action": "create_payout",
            "resource": "payouts",
            "parameters": {"amountMinor": amount, "currency": "EUR"},
        },
        "expect": expect,
        **extra,
    }


@pytest.fixture
def policy() -> Any:
    return compile_policy(load_policy(EXAMPLE))


def test_the_examples_ship_with_passing_tests() -> None:
    files = discover_test_files([REPO / "examples"])
    assert files, "examples/ has no *.test.yaml"
    for path in files:
        test_file = load_test_file(path)
        compiled = compile_policy(load_policy(policy_for(path, test_file)))
        for case in test_file.tests:
            assert run_case(compiled, case).passed, case.name


def test_every_example_policy_ships_with_tests() -> None:
    """Each policy file under examples/ has its ``<policy>.test.yaml`` (``make policy-test``
    runs them), and each example AgentPolicy carries ``spec.tests`` (the operator runs them)."""
    tested = {
        policy_for(path, load_test_file(path)) for path in discover_test_files([REPO / "examples"])
    }
    for policy in sorted((REPO / "examples").rglob("policy.yaml")):
        assert policy in tested, f"{policy} has no test file beside it"
    for manifest in sorted((REPO / "examples").rglob("*.yaml")):
        for document in yaml.safe_load_all(manifest.read_text(encoding="utf-8")):
            if isinstance(document, dict) and document.get("kind") == "AgentPolicy":
                assert document["spec"].get("tests"), f"{manifest}: an AgentPolicy without tests"


def test_a_case_is_decided_by_the_authoritys_evaluation(policy: Any) -> None:
    (case,) = parse_cases([_case(20000, {"verdict": "ESCALATE"})])
    result = run_case(policy, case)
    direct = evaluate_policy(
        policy, result.intent, principal=case.principal.principal(), now=result.intent.captured_at
    )
    assert result.evaluation == direct
    assert result.intent.binding["context"]["caller_principal"] == "payments-agent"
    assert result.intent.binding["actor"] == {"id": "agent-7", "type": "ai_agent"}


def test_a_wrong_expectation_names_every_difference(policy: Any) -> None:
    (case,) = parse_cases(
        [
            _case(
                20000,
                {
                    "verdict": "ALLOW",
                    "reasonCodes": ["POLICY_ALLOWED"],
                    "approvers": ["nobody"],
                    "rule": "small",
                },
            )
        ]
    )
    result = run_case(policy, case)
    assert not result.passed
    assert result.failures == (
        "verdict: expected ALLOW, got ESCALATE",
        "reasonCodes: expected ['POLICY_ALLOWED'], got ['APPROVAL_REQUIRED']",
        "approvers: expected ['nobody'], got ['treasury-lead']",
        "rule: expected small, got medium",
    )


def test_the_same_case_always_yields_the_same_intent(policy: Any) -> None:
    (case,) = parse_cases([_case(10, {"verdict": "ALLOW"})])
    assert run_case(policy, case).intent.intent_hash == run_case(policy, case).intent.intent_hash


def test_now_can_expire_nothing_but_moves_the_clock(policy: Any, tmp_path: Path) -> None:
    rules = [{"name": "year", "when": "now.getFullYear() == 2030", "verdict": "ALLOW"}]
    doc = {
        "actions": [{"name": "a", "handler": "h", "parameters": {"type": "object"}, "rules": rules}]
    }
    from agentsafe.executor.policy.policy import parse_policy

    compiled = compile_policy(parse_policy(doc))
    base = {
        "principal": PRINCIPAL,
        "proposal": {"action": "a", "resource": "r"},
        "expect": {"verdict": "ALLOW"},
    }
    cases = parse_cases(
        [
            {**base, "name": "in 2030", "now": "2030-06-01T00:00:00.000Z"},
            {**base, "name": "default clock"},
        ]
    )
    assert run_case(compiled, cases[0]).passed
    assert run_case(compiled, cases[1]).evaluation.reason_codes == ("POLICY_NO_MATCH",)


def test_an_approval_by_the_proposer_itself_is_separation_of_duties(policy: Any) -> None:
    (case,) = parse_cases(
        [
            _case(
                20000,
                {"verdict": "BLOCK", "reasonCodes": ["SEPARATION_OF_DUTIES_VIOLATED"]},
                approval={
                    "approver": "treasury-lead",
                    "decision": "APPROVE",
                    "approverActor": "agent-7",
                },
            )
        ]
    )
    assert run_case(policy, case).passed


def test_explain_lists_each_step(policy: Any) -> None:
    (case,) = parse_cases([_case(20000, {"verdict": "ESCALATE"})])
    out = explain_case(policy, case)
    assert out["verdict"] == "ESCALATE"
    assert out["decidedAt"] == "RULES"
    assert out["approvers"] == ["treasury-lead"]
    assert [s["step"] for s in out["steps"]] == ["action", "parameters", "rule", "rule"]
    assert [s.get("result") for s in out["steps"][2:]] == [False, True]
    assert out["because"] == "rule medium is the first whose 'when' is true"


def test_explain_names_every_schema_problem(policy: Any) -> None:
    data = _case(0, {"verdict": "BLOCK"})
    data["proposal"]["parameters"] = {"amountMinor": 0, "currency": "eur", "x": 1}
    (case,) = parse_cases([data])
    out = explain_case(policy, case)
    assert out["reasonCodes"] == ["PARAMETERS_INVALID"]
    problems = out["steps"][1]["problems"]
    assert {p["path"] for p in problems} == {"params", "params.amountMinor", "params.currency"}


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({"version": "agent-safe.policy-test/2", "tests": []}, "version"),
        ({"version": "agent-safe.policy-test/1", "tests": []}, "tests"),
        ({"version": "agent-safe.policy-test/1", "tests": [{"name": "x"}]}, "tests[0].principal"),
        (
            {"version": "agent-safe.policy-test/1", "tests": [_case(1, {"verdict": "MAYBE"})]},
            "tests[0].expect.verdict",
        ),
        (
            {
                "version": "agent-safe.policy-test/1",
                "tests": [_case(1, {"verdict": "ALLOW"}, extra=1)],
            },
            "tests[0].extra",
        ),
    ],
)
def test_a_malformed_test_file_is_refused_with_the_path(data: dict[str, Any], path: str) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_test_file(data)
    assert caught.value.code == "POLICY_TEST_INVALID"
    assert caught.value.path == path


def test_duplicate_keys_in_a_test_file_are_refused(tmp_path: Path) -> None:
    file = tmp_path / "p.test.yaml"
    file.write_text("version: agent-safe.policy-test/1\nversion: x\ntests: []\n")
    with pytest.raises(PolicyError) as caught:
        load_test_file(file)
    assert caught.value.code == "POLICY_TEST_INVALID"


def test_discovery_and_the_policy_a_file_tests(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("x")
    (tmp_path / "a.test.yaml").write_text("x")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.test.json").write_text("x")
    assert discover_test_files([tmp_path / "a.yaml"]) == [tmp_path / "a.test.yaml"]
    assert discover_test_files([tmp_path]) == [
        tmp_path / "a.test.yaml",
        tmp_path / "sub/b.test.json",
    ]
    one = parse_test_file(
        {"version": "agent-safe.policy-test/1", "tests": [_case(1, {"verdict": "ALLOW"})]}
    )
    assert policy_for(tmp_path / "a.test.yaml", one) == tmp_path / "a.yaml"
    named = one.model_copy(update={"policy": "../other.yaml"})
    assert policy_for(tmp_path / "a.test.yaml", named) == tmp_path / "../other.yaml"
    with pytest.raises(PolicyError):
        policy_for(tmp_path / "tests.yaml", one)
