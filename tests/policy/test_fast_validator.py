"""The compiled parameter validator (``jsonschema-rs``) against today's, differentially (issue 34).

The authority asks ``CompiledAction.fast_validator`` first and takes only its "valid"; anything
else goes to the reference validator (``jsonschema`` with ECMA-262 patterns,
``CompiledAction.validator``), so the reason code must be the reference's on every instance.
:func:`reference_code` below is the authority's ``_check_parameters`` as it was before the
compiled validator, kept here as the oracle.

Hypothesis generates schemas from every keyword a policy may use (the ones
``build_fast_validator`` hands to the compiled library and the ones it keeps away from it),
with the example policies' schemas among them, and instances with the values where two
implementations part: integers past 2**53 and 2**64, floats that are integers (1.0), -0.0,
floats whose quotient is not exact (0.07 / 0.01), strings past the Basic Multilingual Plane,
line terminators before ``$``, non-ASCII digits, format edge cases.

Checked by mutation (each made the tests below fail): handing every schema to the compiled
library (``_fast_judges`` always true: ``patternProperties`` and ``multipleOf`` differ); dropping
the ``pattern`` / ``format`` / ``multipleOf`` keywords that run the reference's functions (the
library's own regex accepts ``"١٢٣"`` for ``^\\d+$``, its ``multipleOf`` accepts 0.07 for 0.01,
its formats refuse what ``jsonschema`` lets through); taking the library's "not valid" as final.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from agentsafe.executor.codes import Code
from agentsafe.executor.policy.authority import _check_parameters
from agentsafe.executor.policy.policy import (
    CompiledAction,
    build_fast_validator,
    compile_policy,
    parse_policy,
)
from agentsafe.executor.schema import EcmaValidator, ParameterValidator, check_schema

REPO = Path(__file__).resolve().parents[2]


def _checked(schema: dict[str, Any], instance: Any) -> str | None:
    """The reason code before issue 34: ``jsonschema`` alone (the oracle, verbatim)."""
    validator = EcmaValidator(schema, format_checker=EcmaValidator.FORMAT_CHECKER)
    try:
        valid = validator.is_valid(instance)
    except Exception:  # an unresolvable $ref or a validator bug: refuse, never allow
        return Code.POLICY_EVALUATION_ERROR
    return None if valid else Code.PARAMETERS_INVALID


def _outcome(check: Callable[[], str | None]) -> str | None:
    """A reason code, or what escaped (``referencing``'s Rust map can panic, a
    ``BaseException``, when a cyclic ``$ref`` reaches the recursion limit inside it)."""
    try:
        return check()
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:
        return f"raised {type(exc).__name__}"


def reference_code(schema: dict[str, Any], instance: Any) -> str | None:
    return _outcome(lambda: _checked(schema, instance))


def fast_code(schema: dict[str, Any], instance: Any) -> str | None:
    """The reason code now: the authority's ``_check_parameters`` with both validators."""
    action = CompiledAction(
        name="a",
        handler="h",
        validator=EcmaValidator(schema, format_checker=EcmaValidator.FORMAT_CHECKER),
        rules=(),
        fast_validator=build_fast_validator(schema),
    )
    return _outcome(lambda: _check_parameters(action, instance))


def seam_code(schema: dict[str, Any], instance: Any) -> str | None:
    """The seam's check now: its reference asserts no format, nor does its compiled validator."""
    validator = ParameterValidator(
        EcmaValidator(schema), build_fast_validator(schema, formats=False)
    )
    return _outcome(lambda: None if validator.is_valid(instance) else Code.PARAMETERS_INVALID)


def seam_reference_code(schema: dict[str, Any], instance: Any) -> str | None:
    """The seam's check before issue 34 (the oracle): ``jsonschema`` without a format checker."""
    validator = EcmaValidator(schema)
    return _outcome(lambda: None if validator.is_valid(instance) else Code.PARAMETERS_INVALID)


def raw_verdict(schema: dict[str, Any], instance: Any) -> bool | str | None:
    """The compiled library's own answer (None: it is not used for this schema)."""
    fast = build_fast_validator(schema)
    if fast is None:
        return None
    try:
        return bool(fast.is_valid(instance))
    except BaseException as exc:  # a Rust panic is a BaseException
        return type(exc).__name__


def example_schemas() -> list[dict[str, Any]]:
    """Every action's parameter schema in the repository's example policies."""
    found: list[dict[str, Any]] = []
    for path in sorted([*REPO.glob("examples/**/*.yaml"), REPO / "executor/examples/policy.yaml"]):
        for document in yaml.safe_load_all(path.read_text()):
            if not isinstance(document, dict):
                continue
            policy = document.get("spec", {}).get("policy") if "spec" in document else document
            for action in (policy or {}).get("actions", []):
                found.append(action["parameters"])
    return found


EXAMPLES = example_schemas()

# -- instances -------------------------------------------------------------------------------

KEYS = st.sampled_from(
    ["a", "b", "c", "amountMinor", "currency", "account", "note", "é", "𝔘", "1", "pattern", ""]
)
INTS = st.one_of(
    st.integers(-12, 12),
    st.integers(),
    st.sampled_from(
        [
            2**53 - 1,
            2**53,
            2**53 + 1,
            2**63 - 1,
            2**63,
            2**64 - 1,
            2**64,
            2**64 + 1,
            -(2**63),
            -(2**63) - 1,
            -(2**64) - 1,
            10**30,
            -(10**30),
            10**400,
            5000,
            5001,
            4200,
        ]
    ),
)
FLOATS = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(
        [
            1.0,
            -0.0,
            0.0,
            0.5,
            2.0,
            3.0,
            1e308,
            -1e308,
            2.0**53,
            2.0**53 + 2,
            2.0**63,
            2.0**64,
            1e20,
            0.07,
            0.1,
            0.3,
            0.30000000000000004,
            1e-300,
            5e-324,
            4200.0,
            4200.5,
        ]
    ),
)
TEXTS = st.one_of(
    st.text(max_size=6),
    st.sampled_from(
        [
            "EUR",
            "RUB",
            "RUB\n",
            "RUB\r",
            "eur",
            "EURO",
            "١٢٣",
            "123",
            "12\n",
            "abc",
            "a\u2028",
            "\r",
            "😀",
            "😀😀",
            "é",
            "e\u0301",
            "ACCT-0001",
            "",
            " ",
            "2024-02-30",
            "2024-01-01",
            "2024-01-01T00:00:00Z",
            "2024-01-01T00:00:00",
            "12:00:00Z",
            "12:00:00",
            "user@example.com",
            "nope",
            "127.0.0.1",
            "127.0.0.01",
            "256.1.1.1",
            "::1",
            "1.2.3",
            "00000000-0000-4000-8000-000000000000",
            "00000000000040008000000000000000",
            "/a/b",
            "0/a",
            "a/b",
            "[",
            "^a$",
            "\\d",
            "(?P<n>a)",
            "http://x.test/a b",
            "example.com",
            "-bad-.com",
            "P1D",
            "\ud800",
        ]
    ),
)
LEAVES = st.one_of(st.none(), st.booleans(), INTS, FLOATS, TEXTS)
JSON = st.recursive(
    LEAVES,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(KEYS, children, max_size=4),
    max_leaves=10,
)

# -- schemas ---------------------------------------------------------------------------------

TYPES = st.sampled_from(["null", "boolean", "integer", "number", "string", "array", "object"])
COUNTS = st.one_of(st.integers(0, 4), st.sampled_from([0.0, 2.0, 2**64]))
BOUNDS = st.one_of(
    st.integers(-10, 10),
    st.sampled_from([0, 1, 5000, 2**53, 2**53 + 1, 2**64, -(2**64), 10**30]),
    st.sampled_from([0.5, 1.0, -0.0, 2.0**53, 1e308, 4999.5, 0.1]),
)
DIVISORS = st.one_of(
    st.integers(1, 7),
    st.sampled_from([0.01, 0.1, 0.5, 1.0, 2.5, 1e-3, 1e-308, 3.0, 2**64]),
)
PATTERNS = st.sampled_from(
    [
        "^[A-Z]{3}$",
        "^[A-Z0-9-]{4,34}$",
        "^\\d+$",
        "^\\w+$",
        "^.$",
        "^a",
        "b$",
        "\\p{L}",
        "^[^\\s]+$",
        "(?=a)a",
        "(?<=a)b",
        "^\\u00e9$",
        "^.{2}$",
        "[\\uD83D\\uDE00]",
        "^(a|ab)c$",
        "(a)\\1",
        "",
    ]
)
FORMATS = st.sampled_from(
    [
        "date",
        "date-time",
        "time",
        "email",
        "idn-email",
        "hostname",
        "idn-hostname",
        "ipv4",
        "ipv6",
        "uri",
        "uri-reference",
        "iri",
        "uuid",
        "regex",
        "json-pointer",
        "relative-json-pointer",
        "duration",
        "uri-template",
        "an-unknown-format",
    ]
)


def _keywords(children: st.SearchStrategy[Any]) -> dict[str, st.SearchStrategy[Any]]:
    """Every keyword the compiled library is given, with values where libraries part."""
    return {
        "type": TYPES | st.lists(TYPES, min_size=1, max_size=3, unique=True),
        "enum": st.lists(JSON, min_size=1, max_size=4),
        "const": JSON,
        "minimum": BOUNDS,
        "maximum": BOUNDS,
        "exclusiveMinimum": BOUNDS,
        "exclusiveMaximum": BOUNDS,
        "multipleOf": DIVISORS,
        "minLength": COUNTS,
        "maxLength": COUNTS,
        "pattern": PATTERNS,
        "format": FORMATS,
        "minItems": COUNTS,
        "maxItems": COUNTS,
        "uniqueItems": st.booleans(),
        "minProperties": COUNTS,
        "maxProperties": COUNTS,
        "required": st.lists(KEYS, max_size=3, unique=True),
        "dependentRequired": st.dictionaries(KEYS, st.lists(KEYS, max_size=2, unique=True)),
        "minContains": COUNTS,
        "maxContains": COUNTS,
        "properties": st.dictionaries(KEYS, children, max_size=3),
        "additionalProperties": children,
        "items": children,
        "prefixItems": st.lists(children, min_size=1, max_size=2),
        "contains": children,
        "propertyNames": children,
        "not": children,
        "if": children,
        "then": children,
        "else": children,
        "allOf": st.lists(children, min_size=1, max_size=2),
        "anyOf": st.lists(children, min_size=1, max_size=2),
        "oneOf": st.lists(children, min_size=1, max_size=2),
        "$ref": st.just("#/$defs/d"),
        "title": st.text(max_size=3),
        "default": JSON,
    }


def _kept_away(children: st.SearchStrategy[Any]) -> dict[str, st.SearchStrategy[Any]]:
    """Keywords that keep a schema on the reference (the decision is exercised too)."""
    return {
        "patternProperties": st.dictionaries(PATTERNS, children, max_size=2),
        "unevaluatedItems": children,
        "dependentSchemas": st.dictionaries(KEYS, children, max_size=2),
        "x-extension": JSON,
    }


def _pick(keywords: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    names = st.lists(st.sampled_from(sorted(keywords)), min_size=1, max_size=4, unique=True)
    return names.flatmap(lambda chosen: st.fixed_dictionaries({n: keywords[n] for n in chosen}))


def _schemas(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    usual = _pick(_keywords(children))
    rare = _pick({**_keywords(children), **_kept_away(children)})
    return st.one_of(usual, usual, usual, rare)


SUBSCHEMAS = st.recursive(
    st.booleans() | st.fixed_dictionaries({"type": TYPES}),
    _schemas,
    max_leaves=6,
)


@st.composite
def schemas(draw: st.DrawFn) -> dict[str, Any]:
    schema: dict[str, Any] = dict(draw(_schemas(SUBSCHEMAS) | st.sampled_from(EXAMPLES)))
    if "$ref" in str(schema) or draw(st.booleans()):
        schema["$defs"] = {"d": draw(SUBSCHEMAS)}
    if "patternProperties" in schema and "unevaluatedProperties" in schema:
        del schema["unevaluatedProperties"]
    try:
        check_schema(schema)
    except (jsonschema.SchemaError, RecursionError, OverflowError):
        assume(False)
    return schema


@st.composite
def instances_for(draw: st.DrawFn, schema: dict[str, Any]) -> Any:
    """Mostly objects keyed by the schema's own property names, so the rules are reached."""
    names = list(schema.get("properties", {})) + list(schema.get("required", []))
    if names and draw(st.booleans()):
        keys = st.sampled_from(names) | KEYS
        return draw(st.dictionaries(keys, JSON, max_size=len(names) + 1))
    return draw(JSON)


SETTINGS = settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@SETTINGS
@given(st.data())
def test_the_reason_code_is_the_reference_s(data: st.DataObject) -> None:
    schema = data.draw(schemas())
    instance = data.draw(instances_for(schema))
    assert fast_code(schema, instance) == reference_code(schema, instance)


@SETTINGS
@given(st.data())
def test_the_seam_s_verdict_is_its_reference_s(data: st.DataObject) -> None:
    """A handler's schema at the seam: formats assert nothing on either side."""
    schema = data.draw(schemas())
    instance = data.draw(instances_for(schema))
    assert seam_code(schema, instance) == seam_reference_code(schema, instance)


@pytest.mark.parametrize(
    ("schema", "instance"),
    [
        ({"not": {"format": "email"}}, "not an address"),
        ({"not": {"format": "date"}}, "2026-13-45"),
        ({"if": {"format": "ipv4"}, "then": {"const": 1}, "else": {"const": 2}}, "x"),
        ({"oneOf": [{"format": "uuid"}, {"type": "string"}]}, "x"),
    ],
)
def test_a_format_under_a_negation_is_judged_as_the_seam_s_reference_judges_it(
    schema: dict[str, Any], instance: Any
) -> None:
    """Where an asserted format would flip the verdict: a compiled validator that asserted
    formats (``formats=True``) beside the seam's reference calls these valid; the reference
    does not."""
    check_schema(schema)
    assert build_fast_validator(schema, formats=False) is not None
    assert seam_reference_code(schema, instance) == Code.PARAMETERS_INVALID
    assert seam_code(schema, instance) == Code.PARAMETERS_INVALID


def test_the_seam_compiles_each_handler_schema_of_the_examples() -> None:
    from agentsafe.executor.dispatch.seam import check_parameters_schema

    for schema in EXAMPLES:
        strict = {**schema, "type": "object", "additionalProperties": False}
        assert check_parameters_schema(strict).compiled is not None, schema


@SETTINGS
@given(st.data())
def test_the_compiled_library_alone_agrees_where_it_is_used(data: st.DataObject) -> None:
    """Stronger than the product needs (its "not valid" is re-asked): where the compiled
    library is used, its own verdict is the reference's, both ways."""
    schema = data.draw(schemas())
    instance = data.draw(instances_for(schema))
    raw = raw_verdict(schema, instance)
    assume(raw is not None)
    if isinstance(raw, str):
        # only a string it cannot hand to Rust (a lone surrogate: intents refuse them)
        assert "\\ud800" in repr(instance), raw
        return
    valid = reference_code(schema, instance) is None
    if raw is False and valid:
        # The one difference found: uniqueItems compares numbers past 2**53 as doubles
        # ([1e308, 10**308] are "equal"); the reference re-decides it, see test_known_edges.
        assert _has_big_number(instance), (schema, instance)
        return
    assert raw == valid


def _has_big_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return abs(value) >= 2**53
    if isinstance(value, dict):
        return any(_has_big_number(item) for item in value.values())
    if isinstance(value, list):
        return any(_has_big_number(item) for item in value)
    return False


@pytest.mark.parametrize(
    ("schema", "instance"),
    [
        ({"type": "string", "pattern": "^[A-Z]{3}$"}, "RUB\n"),
        ({"type": "string", "pattern": "^\\d+$"}, "١٢٣"),
        ({"type": "string", "pattern": "^.$"}, "\u2028"),
        ({"multipleOf": 0.01}, 0.07),
        ({"multipleOf": 0.1}, 0.30000000000000004),
        ({"multipleOf": 3}, 2**64 * 3 + 1),
        ({"format": "email"}, "nope"),
        ({"format": "uri"}, "not a uri"),
        ({"format": "date"}, "2024-02-30"),
        ({"format": "ipv4"}, "127.0.0.01"),
        ({"format": "an-unknown-format"}, "x"),
        ({"type": "integer"}, 1.0),
        ({"type": "integer"}, 1e308),
        ({"type": "integer", "maximum": 2**53}, 2**53 + 1),
        ({"type": "integer", "maximum": 2**64}, 2**64 + 1),
        ({"minimum": 2**64 + 1}, 2**64),
        ({"minimum": 10**30}, 10**30 - 1),
        ({"maximum": 2.0**53}, 2**53 + 1),
        ({"maxLength": 1}, "😀"),
        ({"minLength": 2}, "😀"),
        ({"maxLength": 1}, "e\u0301"),
        ({"enum": [1]}, True),
        ({"enum": [1]}, 1.0),
        ({"const": 0}, -0.0),
        ({"const": {"a": [1]}}, {"a": [1.0]}),
        ({"uniqueItems": True}, [1, 1.0]),
        ({"uniqueItems": True}, [1, True]),
        ({"uniqueItems": True}, [0, False]),
        ({"uniqueItems": True}, [{"a": 1}, {"a": 1.0}]),
        ({"uniqueItems": True}, [[1], [True]]),
        ({"type": "string"}, "\ud800"),
        ({"type": "object", "properties": {"a": {"type": "string"}}}, {"a": "\ud800"}),
        ({"type": "object", "propertyNames": {"maxLength": 1}}, {"😀": 1}),
        ({"$ref": "#/$defs/d", "$defs": {"d": {"type": "integer"}}}, 1.5),
        ({"minItems": 2.0}, [1]),
        # numbers past 2**53: the compiled library compares them as doubles
        ({"minimum": 2**64 + 1}, 2.0**64),
        ({"const": 1e308}, 10**308),
        ({"enum": [2**53 + 1]}, 2.0**53),
        ({"maximum": 2**53 - 1}, 2**53),
        ({"exclusiveMaximum": 5}, 2**64 + 1),
        ({"minimum": -5.5}, -(2**64) - 1),
        ({"const": 5}, 5.0),
        ({"uniqueItems": True}, [1e308, 10**308]),
        ({"uniqueItems": True}, [2**53 + 1, 2.0**53]),
        ({"uniqueItems": True}, [10**400, 10**400 + 1]),
        ({"type": "integer"}, 10**400),
        ({"multipleOf": 0.5}, 10**400 + 1),
        ({"maxContains": 1, "contains": {"const": 1}}, [1, 1.0]),
    ],
)
def test_known_edges(schema: dict[str, Any], instance: Any) -> None:
    check_schema(schema)
    assert fast_code(schema, instance) == reference_code(schema, instance)


def test_each_example_policy_schema_is_compiled() -> None:
    assert len(EXAMPLES) >= 4
    for schema in EXAMPLES:
        assert build_fast_validator(schema) is not None, schema
    for path in [REPO / "examples/policy.yaml", REPO / "executor/examples/policy.yaml"]:
        compiled = compile_policy(parse_policy(yaml.safe_load(path.read_text())))
        assert all(a.fast_validator is not None for a in compiled.actions.values())


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "patternProperties": {"^a$": {"type": "integer"}}},
        {"type": "object", "properties": {"a": {"patternProperties": {"x": True}}}},
        {"type": "object", "unevaluatedProperties": False},
        {"type": "array", "unevaluatedItems": False},
        {"type": "object", "dependentSchemas": {"a": {"required": ["b"]}}},
        {"type": "object", "$id": "https://example.test/s"},
        {"type": "object", "$anchor": "a"},
        {"type": "object", "$dynamicRef": "#a"},
        {"type": "object", "$ref": "https://example.test/s"},
        {"type": "object", "$ref": "#/$defs/missing"},
        {"type": "object", "contentEncoding": "base64"},
        {"type": "object", "x-extension": 1},
        {"type": "object", "items": {"$schema": "https://json-schema.org/draft/2020-12/schema"}},
        {"type": "object", "properties": {"a": 1}},
        {"type": "object", "$ref": "#/$defs/d", "$defs": {"d": {"$ref": "#/$defs/d"}}},
        {"type": "object", "$ref": "#", "properties": {}},
        {"type": "object", "$ref": "#/$defs/a~1b", "$defs": {"a/b": True}},
        {"type": "object", "properties": {"a": {"minimum": 2**53}}},
        {"type": "object", "properties": {"a": {"const": 1e308}}},
        {"type": "object", "enum": [{"a": -(2**64)}]},
    ],
)
def test_a_schema_outside_the_known_keywords_stays_on_the_reference(
    schema: dict[str, Any],
) -> None:
    assert build_fast_validator(schema) is None


@pytest.mark.parametrize(
    "schema",
    [
        # a property named like a keyword is a name, not a keyword
        {"type": "object", "properties": {"patternProperties": {"type": "string"}}},
        {"type": "object", "properties": {"$id": True, "x-a": False}},
        {"type": "object", "$defs": {"unevaluatedItems": {"type": "integer"}}},
        {"type": "object", "required": ["$ref"], "dependentRequired": {"$id": ["x-a"]}},
        {"type": "object", "enum": [{"patternProperties": 1}], "const": {"$ref": 1}},
        {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object"},
        {"type": "object", "$ref": "#/$defs/d", "$defs": {"d": {"type": "object"}}},
        {"type": "object", "properties": {"a": {"maximum": 2**53 - 1, "minimum": -4.5}}},
    ],
)
def test_a_schema_within_the_known_keywords_is_compiled(schema: dict[str, Any]) -> None:
    assert build_fast_validator(schema) is not None


def test_a_failure_inside_a_reference_keyword_is_the_reference_s_error() -> None:
    """A format checker that raises (not a FormatError): the reference's is_valid raises, so
    POLICY_EVALUATION_ERROR, and the compiled path must not turn it into PARAMETERS_INVALID."""
    checkers = EcmaValidator.FORMAT_CHECKER.checkers
    saved = checkers.get("date")

    def broken(instance: object) -> bool:
        raise ZeroDivisionError

    checkers["date"] = (broken, ())
    try:
        schema = {"type": "object", "properties": {"d": {"format": "date"}}}
        assert build_fast_validator(schema) is not None
        assert reference_code(schema, {"d": "2024-01-01"}) == Code.POLICY_EVALUATION_ERROR
        assert fast_code(schema, {"d": "2024-01-01"}) == Code.POLICY_EVALUATION_ERROR
    finally:
        assert saved is not None
        checkers["date"] = saved


def test_nothing_is_fetched_for_a_remote_ref() -> None:
    assert build_fast_validator({"type": "object", "$ref": "http://127.0.0.1:9/s"}) is None


class _Panic(BaseException):
    """What a Rust panic raises through pyo3 (``pyo3_runtime.PanicException``)."""


class _PanickingValidator:
    def is_valid(self, instance: Any) -> bool:
        raise _Panic


@pytest.mark.parametrize("instance", [{"amountMinor": 5, "currency": "EUR"}, {"amountMinor": 0}])
def test_a_panic_of_the_compiled_library_leaves_the_verdict_to_the_reference(
    instance: Any,
) -> None:
    schema = EXAMPLES[0]
    action = CompiledAction(
        name="a",
        handler="h",
        validator=EcmaValidator(schema, format_checker=EcmaValidator.FORMAT_CHECKER),
        rules=(),
        fast_validator=_PanickingValidator(),
    )
    assert _check_parameters(action, instance) == reference_code(schema, instance)
