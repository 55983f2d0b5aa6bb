"""RFC 8785 canonicalisation: the peer vectors byte for byte, and ECMAScript number form."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentsafe.executor.canonical import (
    DuplicateKeyError,
    canonical_json,
    format_number,
    parse_json,
    sha256_digest,
)
from agentsafe.executor.errors import CanonicalizationError

VECTORS = sorted((Path(__file__).parent / "conformance" / "agent-safe-intent").glob("*.json"))


def test_every_vector_is_discovered() -> None:
    assert len(VECTORS) >= 7


@pytest.mark.parametrize("path", VECTORS, ids=lambda p: p.stem)
def test_conformance_vector(path: Path) -> None:
    vector = json.loads(path.read_text(encoding="utf-8"))
    canonical = canonical_json(vector["binding"])
    if "canonical_json" in vector:
        assert canonical == vector["canonical_json"].encode("utf-8")
    assert sha256_digest(vector["binding"]) == vector["intent_hash"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, "0"),
        (-0.0, "0"),
        (1.5, "1.5"),
        (1e21, "1e+21"),
        (1e20, "100000000000000000000"),
        (123456789012345680000.0, "123456789012345680000"),
        (1e-7, "1e-7"),
        (1e-6, "0.000001"),
        (0.1, "0.1"),
        (-1.5e-9, "-1.5e-9"),
        (5e-324, "5e-324"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
        (9007199254740991, "9007199254740991"),
        (333333333.3333333, "333333333.3333333"),
        (4.35, "4.35"),
        (1.2345e-7, "1.2345e-7"),
        (1e300, "1e+300"),
    ],
)
def test_ecmascript_number_form(value: float, expected: str) -> None:
    assert format_number(value) == expected


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 2**53, -(2**53)])
def test_numbers_without_exact_json_form_are_refused(value: float) -> None:
    with pytest.raises(CanonicalizationError):
        canonical_json({"n": value})


def test_keys_sort_by_utf16_code_units_not_code_points() -> None:
    # U+1F680 is a surrogate pair (0xD83D ...) and sorts before U+FF21 in UTF-16 order,
    # although its code point is larger.
    value = {"\uff21": 1, "\U0001f680": 2, "Z": 3, "za": 4, "z\u00e9": 5, "\u00c9clair": 6}
    text = canonical_json(value).decode("utf-8")
    order = [k for k in json.loads(text)]
    assert order == ["Z", "za", "z\u00e9", "\u00c9clair", "\U0001f680", "\uff21"]


def test_no_unicode_normalisation() -> None:
    assert canonical_json("caf\u00e9") != canonical_json("cafe\u0301")


def test_control_characters_and_lone_surrogates() -> None:
    assert canonical_json("\u0001\n\u2028") == b'"\\u0001\\n\xe2\x80\xa8"'
    with pytest.raises(CanonicalizationError):
        canonical_json("\ud800")


def test_non_json_types_are_refused() -> None:
    for value in ({1: "a"}, {"a": b"x"}, {"a": object()}):
        with pytest.raises(CanonicalizationError):
            canonical_json(value)


TEXT = st.characters(exclude_categories=["Cs"])
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False, min_value=-1e300, max_value=1e300).filter(
        lambda f: not (f.is_integer() and abs(f) > 2**53 - 1)
    )
    | st.text(alphabet=TEXT),
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(st.text(alphabet=TEXT), children, max_size=5)
    ),
    max_leaves=30,
)


@given(json_values)
def test_canonical_form_is_json_that_round_trips(value: object) -> None:
    text = canonical_json(value)
    reparsed = json.loads(text)
    # Canonicalising the parsed form again is a fixed point.
    assert canonical_json(reparsed) == text


# -- the one strict reader ------------------------------------------------------------------


def test_parse_json_reads_i_json() -> None:
    assert parse_json(b'{"a": [1, 2.5, "x", null, true]}') == {"a": [1, 2.5, "x", None, True]}
    assert parse_json('{"a": {"a": 1}}') == {"a": {"a": 1}}  # one key per object, not per text


def test_parse_json_refuses_a_key_twice_and_names_it() -> None:
    with pytest.raises(DuplicateKeyError) as info:
        parse_json('{"x": {"amount": 1, "amount": 1000000}}')
    assert (info.value.code, info.value.key) == ("JSON_DUPLICATE_KEY", "amount")
    assert "amount" not in str(info.value)  # the message echoes nothing


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ('{"n": NaN}', "NUMBER_NOT_FINITE"),
        ("[Infinity]", "NUMBER_NOT_FINITE"),
        ("-Infinity", "NUMBER_NOT_FINITE"),
        ("[1e999]", "NUMBER_NOT_FINITE"),
        ("9" * 5000, "NUMBER_OUT_OF_RANGE"),
    ],
)
def test_parse_json_refuses_numbers_that_are_not_finite(text: str, code: str) -> None:
    with pytest.raises(CanonicalizationError) as info:
        parse_json(text)
    assert info.value.code == code


@pytest.mark.parametrize("data", [b"{not json", b'"\xff"', b"", "[1,]"])
def test_parse_json_refuses_what_is_not_json_as_a_value_error(data: bytes | str) -> None:
    with pytest.raises(ValueError):
        parse_json(data)
