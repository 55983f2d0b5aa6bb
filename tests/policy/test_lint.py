"""``policy/lint.py``: every compile problem at once, and rules proven never to decide."""

from __future__ import annotations

from typing import Any

import pytest

from agentsafe.executor.policy.lint import lint_policy

SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["amountMinor", "currency"],
    "properties": {
        "amountMinor": {"type": "integer", "minimum": 1, "maximum": 10_000_000},
        "currency": {"type": "string", "enum": ["EUR", "USD"]},
        "note": {"type": "string"},
    },
    "additionalProperties": False,
}


def _policy(*whens: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    rules = [
        {"name": f"r{index}", "when": when, "verdict": "BLOCK"} for index, when in enumerate(whens)
    ]
    return {
        "actions": [
            {
                "name": "pay",
                "handler": "forward_request",
                "parameters": schema or SCHEMA,
                "rules": rules,
            }
        ]
    }


def _codes(data: dict[str, Any]) -> list[tuple[str, str]]:
    return [(f.code, f.path) for f in lint_policy(data)]


def test_a_clean_policy_has_no_findings() -> None:
    data = _policy("params.amountMinor <= 5000", "params.amountMinor <= 50000", "true")
    assert lint_policy(data) == []


def test_a_narrower_rule_after_a_wider_one_is_shadowed() -> None:
    data = _policy("params.amountMinor <= 5000", "params.amountMinor <= 1000")
    findings = lint_policy(data)
    assert [(f.code, f.path) for f in findings] == [("RULE_SHADOWED", "actions[0].rules[1]")]
    assert "'r0'" in findings[0].message


@pytest.mark.parametrize(
    ("earlier", "later"),
    [
        ("params.amountMinor < 100", "params.amountMinor <= 99"),
        ("params.amountMinor > 10", "100 <= params.amountMinor"),
        ("params.currency == 'EUR'", "params.currency == 'EUR' && params.amountMinor > 5"),
        ("params.currency in ['EUR', 'GBP']", 'params.currency == "EUR"'),
        ("principal.id == 'a' && tenant == 't'", "(tenant == 't') && principal.id == 'a'"),
        ("params.currency != 'USD'", "params.currency == 'EUR'"),
        ("context.flag", "context.flag && params.amountMinor < 3"),
        ("size(params.currency) > 2", "size(params.currency)  >  2"),
    ],
)
def test_shadowing_is_proven_for_the_understood_fragment(earlier: str, later: str) -> None:
    assert _codes(_policy(earlier, later)) == [("RULE_SHADOWED", "actions[0].rules[1]")]


@pytest.mark.parametrize(
    ("earlier", "later"),
    [
        ("params.amountMinor < 100", "params.amountMinor <= 100"),
        ("params.amountMinor <= 100 || tenant == 'x'", "params.amountMinor <= 50"),
        ("params.currency == 'EUR'", "params.currency in ['EUR', 'USD']"),
        ("params.currency != 'USD'", "params.amountMinor > 5"),
        ("principal.id == 'a'", "tenant == 't'"),
        ("params.note == 'x'", "params.amountMinor < 5"),
        ("params.amountMinor < 10", "params.amountMinor < 5 || params.amountMinor > 100"),
        ("params.amountMinor < 10.5", "params.amountMinor < 11"),
    ],
)
def test_nothing_is_claimed_without_proof(earlier: str, later: str) -> None:
    assert _codes(_policy(earlier, later)) == []


def test_rules_after_one_that_always_matches_are_unreachable() -> None:
    data = _policy("1 == 1", "params.amountMinor > 5", "tenant == 'x' || true")
    assert _codes(data) == [
        ("RULE_UNREACHABLE", "actions[0].rules[1]"),
        ("RULE_UNREACHABLE", "actions[0].rules[2]"),
    ]


def test_a_rule_the_schema_makes_always_true_hides_the_rest() -> None:
    # minimum 1 is guaranteed by the schema: amountMinor >= 1 is always true.
    data = _policy("params.amountMinor >= 1", "params.amountMinor > 500")
    assert _codes(data) == [("RULE_UNREACHABLE", "actions[0].rules[1]")]


@pytest.mark.parametrize(
    "when",
    [
        "false",
        "params.amountMinor > 10 && params.amountMinor < 5",
        "params.amountMinor < 1",
        "params.amountMinor > 10000000",
        "params.currency == 'GBP'",
        "params.amountMinor == 5 && params.amountMinor != 5",
        "params.currency in []",
    ],
)
def test_a_rule_that_can_never_be_true_is_unreachable(when: str) -> None:
    assert _codes(_policy(when, "true")) == [("RULE_UNREACHABLE", "actions[0].rules[0]")]


def test_an_optional_property_gets_no_bounds_from_the_schema() -> None:
    schema = {**SCHEMA, "required": ["currency"]}
    # amountMinor may be absent, so `>= 1` is not always true.
    assert _codes(_policy("params.amountMinor >= 1", "true", schema=schema)) == []


def test_every_compile_problem_is_reported_at_once() -> None:
    data = {
        "actions": [
            {
                "name": "pay",
                "handler": "h",
                "parameters": {"type": "object", "properties": {"a": {"type": "nonsense"}}},
                "rules": [
                    {"name": "a", "when": "params.a <", "verdict": "ALLOW"},
                    {"name": "b", "when": "secrets.x == 1", "verdict": "ALLOW"},
                    {"name": "c", "when": "evil(params)", "verdict": "ALLOW"},
                ],
            }
        ]
    }
    findings = lint_policy(data)
    assert [(f.severity, f.code, f.path) for f in findings] == [
        ("error", "POLICY_INVALID", "actions[0].parameters"),
        ("error", "POLICY_EXPRESSION_INVALID", "actions[0].rules[0].when"),
        ("error", "POLICY_EXPRESSION_INVALID", "actions[0].rules[1].when"),
        ("error", "POLICY_EXPRESSION_INVALID", "actions[0].rules[2].when"),
    ]
    assert "secrets" in findings[2].message
    assert not findings[2].message.startswith("actions[0]")


def test_a_document_that_is_not_a_policy_is_one_finding() -> None:
    findings = lint_policy({"actions": [{"name": "x"}]})
    assert len(findings) == 1
    assert findings[0].code == "POLICY_INVALID"
    assert findings[0].path.startswith("actions[0]")
