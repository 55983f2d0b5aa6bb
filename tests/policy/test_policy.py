"""Policy documents: loading (YAML, JSON), refusals that name the field's path, compilation."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentsafe.executor.errors import PolicyError
from agentsafe.executor.policy.policy import (
    PolicyDocument,
    Verdict,
    compile_policy,
    load_policy,
    parse_policy,
)

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "policy.yaml"


def example() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    return data


def refusal(data: Any, **kwargs: Any) -> PolicyError:
    with pytest.raises(PolicyError) as info:
        compile_policy(parse_policy(data), **kwargs)
    return info.value


def test_bundled_example_loads_and_compiles() -> None:
    doc = load_policy(EXAMPLE)
    compiled = compile_policy(doc, registered_handlers={"forward_request"})
    payout = compiled.actions["create_payout"]
    assert payout.handler == "forward_request"
    assert [r.name for r in payout.rules] == ["small", "medium", "large"]
    assert [r.verdict for r in payout.rules] == [Verdict.ALLOW, Verdict.ESCALATE, Verdict.BLOCK]
    assert payout.rules[1].approvers == ("treasury-lead",)
    assert payout.rules[2].reason_code == "AMOUNT_ABOVE_POLICY"
    assert payout.rules[1].path == "actions[0].rules[1]"
    assert compiled.handlers == {"forward_request"}
    assert compiled.digest.startswith("sha256:")


def test_packaged_copy_matches_the_example() -> None:
    packaged = REPO / "executor" / "examples" / "policy.yaml"
    assert packaged.read_bytes() == EXAMPLE.read_bytes()


def test_json_and_yaml_give_the_same_document(tmp_path: Path) -> None:
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(example()))
    assert load_policy(path) == load_policy(EXAMPLE)
    assert compile_policy(load_policy(path)).digest == compile_policy(load_policy(EXAMPLE)).digest


def test_wire_names_round_trip() -> None:
    doc = load_policy(EXAMPLE)
    dumped = doc.as_json()
    assert dumped["actions"][0]["rules"][2]["reasonCode"] == "AMOUNT_ABOVE_POLICY"
    assert "reason_code" not in json.dumps(dumped)
    assert parse_policy(dumped) == doc


def test_json_schema_of_the_model_uses_camel_case() -> None:
    schema = json.dumps(PolicyDocument.model_json_schema(by_alias=True))
    assert "reasonCode" in schema
    assert "reason_code" not in schema


def test_model_is_frozen() -> None:
    doc = load_policy(EXAMPLE)
    with pytest.raises(Exception, match="frozen"):
        doc.actions[0].rules[0].when = "true"  # type: ignore[misc]


def mutate(path: str, value: Any) -> dict[str, Any]:
    data = copy.deepcopy(example())
    target: Any = data
    parts = path.split("/")
    for part in parts[:-1]:
        target = target[int(part)] if part.isdigit() else target[part]
    last = parts[-1]
    if value is _DELETE:
        del target[last]
    elif last.isdigit():
        target[int(last)] = value
    else:
        target[last] = value
    return data


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "where", "fragment"),
    [
        ("actions/0/rules/1/when", "params.amountMinor <=", "actions[0].rules[1].when", "Syntax"),
        ("actions/0/rules/0/when", "amount <= 5", "actions[0].rules[0].when", "undeclared"),
        ("actions/0/rules/1/approvers", [], "actions[0].rules[1]", "at least one approver"),
        ("actions/0/rules/1/approvers", _DELETE, "actions[0].rules[1]", "at least one approver"),
        ("actions/0/rules/0/approvers", ["x"], "actions[0].rules[0]", "only an ESCALATE"),
        ("actions/0/rules/2/reasonCode", "amount-above", "actions[0].rules[2].reasonCode", ""),
        ("actions/0/rules/2/reasonCode", "Amount_Above", "actions[0].rules[2].reasonCode", ""),
        ("actions/0/rules/2/verdict", "DENY", "actions[0].rules[2].verdict", ""),
        ("actions/0/rules/2/reason_code", "X", "actions[0].rules[2].reason_code", "Extra"),
        ("actions/0/rules/1/name", "small", "actions[0]", "a rule name is used twice"),
        ("actions/0/rules", [], "actions[0].rules", ""),
        ("actions/0/handler", _DELETE, "actions[0].handler", "required"),
        ("actions/0/parameters/type", "array", "actions[0].parameters", "type: object"),
        (
            "actions/0/parameters/properties/amountMinor/type",
            "integr",
            "actions[0].parameters",
            "invalid JSON Schema at properties.amountMinor.type",
        ),
        ("actions/0/parameters/required", "amountMinor", "actions[0].parameters", "invalid"),
        ("actions/0/parameters/$schema", "http://json-schema.org/draft-04/schema#", "", "2020-12"),
        ("actions", [], "actions", ""),
        ("workflows", {}, "workflows", "Extra"),
        ("plans", {"allowedEffects": ["teleport"]}, "plans.allowedEffects", ""),
    ],
)
def test_refusals_name_the_path(path: str, value: Any, where: str, fragment: str) -> None:
    error = refusal(mutate(path, value))
    assert str(error).startswith(f"{where}") or where in str(error)
    assert fragment in str(error)


def test_duplicate_action_names_are_refused() -> None:
    data = example()
    data["actions"].append(copy.deepcopy(data["actions"][0]))
    error = refusal(data)
    assert "an action name is used twice" in str(error)


def test_unknown_handler_is_refused_only_when_handlers_are_known() -> None:
    doc = parse_policy(example())
    compile_policy(doc)  # the operator compiles without a registry
    with pytest.raises(PolicyError) as info:
        compile_policy(doc, registered_handlers={"other"})
    assert info.value.code == "POLICY_HANDLER_UNKNOWN"
    assert str(info.value).startswith("actions[0].handler: ")


def test_compile_error_carries_the_compilers_message() -> None:
    error = refusal(mutate("actions/0/rules/1/when", "params.amountMinor <= "))
    assert error.code == "POLICY_EXPRESSION_INVALID"
    assert error.path == "actions[0].rules[1].when"
    assert "mismatched input" in str(error)


def test_yaml_duplicate_keys_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(
        "actions:\n  - name: a\n    name: b\n    handler: h\n"
        "    parameters: {type: object}\n    rules: [{name: r, when: 'true', verdict: ALLOW}]\n"
    )
    with pytest.raises(PolicyError, match="appears twice"):
        load_policy(path)


def test_json_duplicate_keys_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text('{"actions": [], "actions": []}')
    with pytest.raises(PolicyError, match="appears twice"):
        load_policy(path)


@pytest.mark.parametrize(
    "text",
    [
        "d: 2001-13-14\n",  # resolves as a timestamp, cannot be built (found by fuzzing)
        "[1]: 2\n",  # an unhashable key
        "? {a: 1}\n: 2\n",
        "[" * 3000 + "]" * 3000,
    ],
)
def test_yaml_that_cannot_be_built_is_policy_invalid(tmp_path: Path, text: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert info.value.code == "POLICY_INVALID"


def test_a_pattern_that_is_not_ecma_262_is_policy_invalid(tmp_path: Path) -> None:
    # Patterns are ECMA-262 (issue 16): Python-only syntax is refused when the policy loads.
    path = tmp_path / "p.yaml"
    path.write_text(
        "actions:\n  - name: a\n    handler: h\n"
        "    parameters: {type: object, properties: {c: {type: string,"
        " pattern: '^(?P<code>[A-Z]{3})$'}}}\n"
        "    rules: [{name: r, when: 'true', verdict: ALLOW}]\n"
    )
    with pytest.raises(PolicyError) as info:
        compile_policy(load_policy(path))
    assert info.value.code == "POLICY_INVALID"
    assert info.value.path == "actions[0].parameters"


def test_a_huge_repeat_count_compiles_and_evaluates_at_once(tmp_path: Path) -> None:
    # Found by fuzzing: Python's re raised OverflowError for it; ECMA-262 accepts the syntax.
    path = tmp_path / "p.yaml"
    path.write_text(
        "actions:\n  - name: a\n    handler: h\n"
        "    parameters: {type: object, properties: {c: {type: string,"
        " pattern: '^[A-Z]{99999999999999999999999999}$'}}}\n"
        "    rules: [{name: r, when: 'true', verdict: ALLOW}]\n"
    )
    compiled = compile_policy(load_policy(path))
    assert not compiled.actions["a"].validator.is_valid({"c": "AAA"})


def test_yaml_values_without_json_form_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(
        "actions:\n  - name: a\n    handler: h\n"
        "    parameters: {type: object, default: {since: 2026-01-01}}\n"
        "    rules: [{name: r, when: 'true', verdict: ALLOW}]\n"
    )
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert str(info.value).startswith("actions[0].parameters.default.since: ")


@pytest.mark.parametrize(
    ("name", "content", "code"),
    [
        ("bad.yaml", "actions: [\n", "POLICY_INVALID"),
        ("bad.json", "{not json", "POLICY_INVALID"),
        ("bad.json", '{"actions": NaN}', "POLICY_INVALID"),
        ("bad.yaml", "- just\n- a list\n", "POLICY_INVALID"),
    ],
)
def test_unparseable_files(tmp_path: Path, name: str, content: str, code: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert info.value.code == code


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyError) as info:
        load_policy(tmp_path / "absent.yaml")
    assert info.value.code == "POLICY_FILE_UNREADABLE"


def test_oversized_file(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_bytes(b"#" * (1024 * 1024 + 1))
    with pytest.raises(PolicyError, match="larger than"):
        load_policy(path)


def test_schema_formats_are_asserted() -> None:
    data = example()
    data["actions"][0]["parameters"]["properties"]["when"] = {"type": "string", "format": "date"}
    action = compile_policy(parse_policy(data)).actions["create_payout"]
    good = {"amountMinor": 1, "currency": "EUR", "when": "2026-01-01"}
    assert action.validator.is_valid(good)
    assert not action.validator.is_valid({**good, "when": "yesterday"})
