"""JSON Schema patterns are ECMA-262 (issue 16, item 4): the unit cases.

Each case is one where Python's ``re.search`` and ECMA-262 disagree; the real-process attack is in
``tests/integration/test_schema_patterns_process.py``.
"""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from agentsafe.executor.schema import EcmaValidator, check_schema, ecma_search, reference_cycle


def valid(schema: dict[str, Any], instance: Any) -> bool:
    check_schema(schema)
    validator = EcmaValidator(schema, format_checker=EcmaValidator.FORMAT_CHECKER)
    return bool(validator.is_valid(instance))


@pytest.mark.parametrize(
    ("pattern", "text", "python", "ecma"),
    [
        ("^[A-Z]{3}$", "RUB\n", True, False),  # $ before a trailing newline
        ("^[A-Z]{3}$", "RUB", True, True),
        ("[A-Z]{3}$", "RUB\nx", False, False),
        (r"^\d+$", "١٢٣", True, False),  # Arabic-Indic digits are not \d
        (r"^\d+$", "123", True, True),
        (r"^\w+$", "café", True, False),  # \w is ASCII in ECMA-262
        (r"^a.b$", "a\rb", True, False),  # . is no line terminator
        (r"^a.b$", "a\u2028b", True, False),
        (r"^\s$", "\ufeff", False, True),  # BOM is white space in ECMA-262
        ("^.$", "😀", True, True),  # the u flag: one code point, not two code units
        (r"^\p{Lu}{3}$", "ÄÖÜ", None, True),  # Unicode property escapes under u
        ("^[A-Z]{3}$", "ＲＵＢ", False, False),  # fullwidth letters are not A-Z
    ],
)
def test_patterns_follow_ecma_262_not_python(
    pattern: str, text: str, python: bool | None, ecma: bool
) -> None:
    import re

    if python is not None:
        assert bool(re.search(pattern, text)) is python  # the disagreement is real
    assert ecma_search(pattern, text) is ecma
    assert valid({"type": "string", "pattern": pattern}, text) is ecma


def test_pattern_properties_and_additional_properties_use_ecma() -> None:
    schema = {
        "type": "object",
        "patternProperties": {"^x-[a-z]+$": {"type": "string"}},
        "additionalProperties": False,
    }
    assert valid(schema, {"x-trace": "a"})
    # Python would let "x-trace\n" match the pattern and so not count as additional.
    assert not valid(schema, {"x-trace\n": "a"})
    assert not valid(schema, {"x-trace": 1})


@pytest.mark.parametrize("pattern", ["(?P<name>a)", r"a\Z", r"(?i)abc", "[", "a{2,1}"])
def test_a_pattern_that_is_not_ecma_262_is_refused_when_the_schema_loads(pattern: str) -> None:
    with pytest.raises(jsonschema.SchemaError):
        check_schema({"type": "string", "pattern": pattern})
    with pytest.raises(jsonschema.SchemaError):
        check_schema({"type": "object", "patternProperties": {pattern: {}}})


def test_format_regex_is_ecma_262() -> None:
    schema = {"type": "string", "format": "regex"}
    assert valid(schema, "^[a-z]+$")
    assert not valid(schema, "(?P<n>a)")


def test_unevaluated_properties_beside_pattern_properties_is_refused() -> None:
    with pytest.raises(jsonschema.SchemaError):
        check_schema(
            {
                "type": "object",
                "patternProperties": {"^a$": {}},
                "unevaluatedProperties": False,
            }
        )
    check_schema({"type": "object", "unevaluatedProperties": False})


def test_a_mismatch_never_echoes_the_value() -> None:
    schema = {"type": "object", "properties": {"c": {"type": "string", "pattern": "^[A-Z]{3}$"}}}
    errors = list(EcmaValidator(schema).iter_errors({"c": "secret-value\n"}))
    assert errors
    assert all("secret-value" not in error.message for error in errors)


def test_the_policy_and_the_handler_seam_use_the_ecma_validator() -> None:
    from agentsafe.executor.dispatch.seam import check_parameters_schema
    from agentsafe.executor.policy.policy import build_validator

    schema = {
        "type": "object",
        "additionalProperties": False,
        "properties": {"currency": {"type": "string", "pattern": "^[A-Z]{3}$"}},
    }
    assert not build_validator(schema, path="p").is_valid({"currency": "RUB\n"})
    assert not check_parameters_schema(schema).is_valid({"currency": "RUB\n"})
    assert build_validator(schema, path="p").is_valid({"currency": "RUB"})


def test_the_ceilings_currency_is_refused_with_a_trailing_newline() -> None:
    from agentsafe.executor.errors import RequestRejected
    from agentsafe.executor.lifecycle.ceilings import read_payment

    assert read_payment({"amountMinor": 1, "currency": "RUB"}) is not None
    for currency in ("RUB\n", "rub", "ＲＵＢ", "RU", "RUBX"):
        with pytest.raises(RequestRejected) as refused:
            read_payment({"amountMinor": 1, "currency": currency})
        assert refused.value.code == "HARD_LIMIT_AMOUNT_INVALID"


def test_a_lone_surrogate_matches_no_pattern_and_never_raises() -> None:
    assert ecma_search("^.*$", "a\ud800") is False
    assert not valid({"type": "string", "pattern": "^.*$"}, "a\ud800")
    with pytest.raises(jsonschema.SchemaError):
        check_schema({"type": "string", "pattern": "\ud800"})


_OBJ: dict[str, Any] = {"type": "object"}
_CYCLES: dict[str, tuple[dict[str, Any], bool]] = {
    "the root refers to itself": ({**_OBJ, "$ref": "#"}, True),
    "a definition refers to itself": (
        {**_OBJ, "$defs": {"a": {"$ref": "#/$defs/a"}}, "properties": {"x": {"$ref": "#/$defs/a"}}},
        True,
    ),
    "two definitions through allOf": (
        {
            **_OBJ,
            "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"allOf": [{"$ref": "#/$defs/a"}]}},
            "properties": {"x": {"$ref": "#/$defs/a"}},
        },
        True,
    ),
    "anyOf back to the root": ({**_OBJ, "anyOf": [{"type": "string"}, {"$ref": "#"}]}, True),
    "an anchor under not": (
        {**_OBJ, "$defs": {"a": {"$anchor": "A", "not": {"$ref": "#A"}}}, "$ref": "#/$defs/a"},
        True,
    ),
    "an escaped pointer": (
        {**_OBJ, "$defs": {"a/b": {"$ref": "#/$defs/a~1b"}}, "$ref": "#/$defs/a~1b"},
        True,
    ),
    "a percent-encoded pointer": (
        {**_OBJ, "$defs": {"a b": {"$ref": "#/$defs/a%20b"}}, "$ref": "#/$defs/a%20b"},
        True,
    ),
    "a loop no value reaches": ({**_OBJ, "$defs": {"a": {"$ref": "#/$defs/a"}}}, False),
    "a tree that descends": (
        {
            **_OBJ,
            "$defs": {
                "n": {
                    "type": "object",
                    "properties": {"c": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
                }
            },
            "properties": {"root": {"$ref": "#/$defs/n"}},
        },
        False,
    ),
    "one definition used twice": (
        {
            **_OBJ,
            "$defs": {"s": {"type": "string"}},
            "properties": {
                "a": {"$ref": "#/$defs/s"},
                "b": {"allOf": [{"$ref": "#/$defs/s"}, {"$ref": "#/$defs/s"}]},
            },
        },
        False,
    ),
}


@pytest.mark.parametrize("name", sorted(_CYCLES))
def test_a_reference_cycle_that_never_descends_is_found(name: str) -> None:
    schema, cycle = _CYCLES[name]
    assert reference_cycle(schema) is cycle
    if cycle:
        with pytest.raises(jsonschema.SchemaError, match="leads back to itself"):
            check_schema(schema)
        # what the check keeps out: the validator recursing without end on any value, until
        # RecursionError, or a panic of the Rust map under the resolver (``rpds``) when the limit
        # is reached inside it (which of the two depends on the stack the test starts from)
        with pytest.raises(BaseException) as recursed:
            EcmaValidator(schema).is_valid({"x": {}})
        assert isinstance(recursed.value, RecursionError) or (
            type(recursed.value).__name__ == "PanicException"
        ), recursed.value
    else:
        check_schema(schema)
        EcmaValidator(schema).is_valid({"x": {}, "root": {"c": [{"c": []}]}})
