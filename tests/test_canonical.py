"""RFC 8785 canonicalisation: the peer vectors byte for byte, and ECMAScript number form."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentsafe.executor.canonical import (
    MAX_DEPTH,
    DuplicateKeyError,
    canonical_json,
    canonical_text,
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


# Found by mutation testing (docs/mutation.md): each escape and boundary pinned exactly.


def test_every_short_escape_is_exact() -> None:
    text = '"\\\b\f\n\r\t'
    assert canonical_json(text) == b'"\\"\\\\\\b\\f\\n\\r\\t"'
    assert canonical_json({text: 1}) == b'{"\\"\\\\\\b\\f\\n\\r\\t":1}'


def test_other_control_characters_use_lower_case_u_escapes() -> None:
    assert canonical_json("\x00\x1f\x1b\x7f ") == b'"\\u0000\\u001f\\u001b\x7f "'


@pytest.mark.parametrize("value", [chr(0xD800), chr(0xDFFF), "a" + chr(0xDC00) + "b"])
def test_lone_surrogates_at_either_bound_are_refused(value: str) -> None:
    with pytest.raises(CanonicalizationError) as info:
        canonical_json(value)
    assert info.value.code == "JSON_INVALID"
    with pytest.raises(CanonicalizationError):
        canonical_json({value: 1})


def test_the_characters_beside_the_surrogate_range_are_kept() -> None:
    assert canonical_json("\ud7ff\ue000") == '"\ud7ff\ue000"'.encode()


def test_the_exact_integer_range_ends_at_2_53_minus_1() -> None:
    assert canonical_json([2**53 - 1, -(2**53 - 1)]) == b"[9007199254740991,-9007199254740991]"
    for value in (2**53, -(2**53)):
        with pytest.raises(CanonicalizationError) as info:
            canonical_json(value)
        assert info.value.code == "NUMBER_OUT_OF_RANGE"


def test_refusal_codes_are_stable() -> None:
    cases = [(math.nan, "NUMBER_NOT_FINITE"), (True, None), ({1: 2}, "JSON_INVALID")]
    for value, code in cases:
        if code is None:
            continue
        with pytest.raises(CanonicalizationError) as info:
            canonical_json(value)
        assert info.value.code == code
    with pytest.raises(CanonicalizationError) as info:
        format_number(True)
    assert info.value.code == "JSON_INVALID"
    with pytest.raises(CanonicalizationError) as info:
        canonical_json(b"x")
    assert info.value.code == "JSON_INVALID"


def test_nesting_is_bounded_below_the_recursion_limit() -> None:
    assert MAX_DEPTH == 500  # the contract, not only the edge the rest of the test probes
    deep: object = []
    for _ in range(MAX_DEPTH):
        deep = [deep]
    assert canonical_json(deep) == b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1)
    with pytest.raises(CanonicalizationError) as info:
        canonical_json([deep])
    assert info.value.code == "JSON_TOO_DEEP"


def test_separators_and_literals() -> None:
    assert canonical_json({"b": [None, True, False], "a": (1, 2.5)}) == (
        b'{"a":[1,2.5],"b":[null,true,false]}'
    )
    assert canonical_json(-0.0) == b"0"
    assert canonical_json(0.0) == b"0"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1e21, "1e+21"),
        (1e20, "100000000000000000000"),
        (1.5e21, "1.5e+21"),
        (123.456, "123.456"),
        (-123.456, "-123.456"),
        (0.000001, "0.000001"),
        (0.0000015, "0.0000015"),
        (1.5e-7, "1.5e-7"),
        (12e-7, "0.0000012"),
        (100.0, "100"),
        (-5.0, "-5"),
        (2.0**60, "1152921504606847000"),
    ],
)
def test_number_form_at_every_branch(value: float, expected: str) -> None:
    assert format_number(value) == expected


def test_sha256_digest_form() -> None:
    assert sha256_digest({}) == (
        "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
    )


def test_objects_nest_to_the_same_bound_as_arrays() -> None:
    deep: object = {}
    for _ in range(MAX_DEPTH):
        deep = {"a": deep}
    assert canonical_json(deep) == b'{"a":' * MAX_DEPTH + b"{}" + b"}" * MAX_DEPTH
    with pytest.raises(CanonicalizationError) as info:
        canonical_json({"a": deep})
    assert info.value.code == "JSON_TOO_DEEP"


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


@pytest.mark.parametrize(
    "text",
    [
        '"\\ud800"',  # a lone high surrogate, top level
        '["ok", ["\\udfff"]]',  # a lone low surrogate, nested in an array
        '{"\\udc00": 1}',  # in a key
        '{"a": {"b": "x\\ud83d"}}',  # a high surrogate with no low one after it
        '"\\ude00\\ud83d"',  # a pair in the wrong order is two lone surrogates
    ],
)
def test_parse_json_refuses_a_lone_surrogate(text: str) -> None:
    """json.loads reads these into a str with no UTF-8 form, which used to fail only when hashed
    (a 500 at the HTTP edge, issue 16)."""
    with pytest.raises(CanonicalizationError) as info:
        parse_json(text)
    assert info.value.code == "JSON_INVALID"


def test_parse_json_keeps_an_escaped_surrogate_pair_and_a_literal_backslash_u() -> None:
    assert parse_json('["\\ud83d\\ude00"]') == ["\U0001f600"]
    assert parse_json('"\\\\ud800"') == "\\ud800"  # an escaped backslash, then text


# The C encoder's route must write exactly what the writer writes (canonical.py's docstring).

plain_text = st.text(
    alphabet=st.characters(
        blacklist_categories=("Cs",),  # lone surrogates take the writer, which refuses them
    )
)
# A float with a fraction in [1e-4, 2**53), either sign: repr() writes ECMAScript's form.
fractional = st.floats(min_value=1e-4, max_value=2.0**53, exclude_max=True).filter(
    lambda x: not x.is_integer()
) | st.floats(max_value=-1e-4, min_value=-(2.0**53), exclude_min=True).filter(
    lambda x: not x.is_integer()
)
plain_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1)
    | fractional
    | plain_text
    | st.sampled_from(["\x00", "\x1f", "\x7f", "\u2028", "\ue000", "\uffff", "\U0001f600", '"\\'])
    ,
    lambda children: (
        st.lists(children, max_size=6)
        | st.dictionaries(plain_text | st.sampled_from(["\ue000", "\uffff", "a", "\x00"]),
                          children, max_size=6)
    ),
    max_leaves=40,
)  # fmt: skip


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_every_float_gets_the_writers_bytes_or_its_refusal(value: float) -> None:
    """Whichever route a float takes, its bytes are ECMAScript's (``format_number``)."""
    from agentsafe.executor.canonical import _written

    try:
        expected: object = _written(value)
    except CanonicalizationError as exc:
        expected = exc.code
    try:
        got: object = canonical_text(value)
    except CanonicalizationError as exc:
        got = exc.code
    assert got == expected


@given(fractional)
def test_a_float_with_a_fraction_in_range_takes_the_c_encoder(value: float) -> None:
    from agentsafe.executor.canonical import _C_ENCODER, _plain

    assert _plain(value, 0)
    assert _C_ENCODER.encode(value) == format_number(value) == repr(value)


@given(plain_values)
def test_the_c_encoder_route_writes_what_the_writer_writes(value: object) -> None:
    from agentsafe.executor.canonical import _written

    assert canonical_text(value) == _written(value)


@pytest.mark.parametrize(
    "value",
    [
        {"\U0001f600": 1, "\uffff": 2},  # code-point order and UTF-16 order differ here
        {"a": 2.0},  # repr "2.0", ECMAScript "2"
        {"a": 1.5e-5},  # repr "1.5e-05", ECMAScript "0.000015"
        {"a": 1e16},  # repr "1e+16", ECMAScript "10000000000000000"
        {"a": -0.0},
        {"a": math.inf},
        {"a": math.nan},
        {"a": 2**53},
        [{"k": (1, 2.0)}],
        {1: "int key"},
        "lone \ud800",
    ],
)
def test_what_the_c_encoder_would_write_differently_takes_the_writer(value: object) -> None:
    from agentsafe.executor.canonical import _plain, _written

    assert not _plain(value, 0)
    try:
        expected: object = _written(value)
    except CanonicalizationError as exc:
        expected = exc.code
    try:
        got: object = canonical_text(value)
    except CanonicalizationError as exc:
        got = exc.code
    assert got == expected


def test_utf16_order_is_kept_where_code_points_disagree() -> None:
    assert canonical_text({"\U0001f600": 1, "\uffff": 2}) == '{"\U0001f600":1,"\uffff":2}'


def test_str_and_tuple_subclasses_and_depth_on_the_c_route() -> None:
    from enum import StrEnum

    class Verdict(StrEnum):
        ALLOW = "ALLOW"

    assert canonical_text({"v": Verdict.ALLOW, "t": (1, "x")}) == '{"t":[1,"x"],"v":"ALLOW"}'
    deep: object = "x"
    for _ in range(MAX_DEPTH + 1):
        deep = [deep]
    with pytest.raises(CanonicalizationError) as refused:
        canonical_text(deep)
    assert refused.value.code == "JSON_TOO_DEEP"


# The writer's own route: plain values take the C encoder, so each pinned form above is also
# held against the Python writer directly (mutation testing found its escape table, key order
# and integer bounds otherwise unexercised once the C route existed).


@pytest.mark.parametrize("path", VECTORS, ids=lambda p: p.stem)
def test_the_writer_reproduces_each_conformance_vector(path: Path) -> None:
    from agentsafe.executor.canonical import _written

    vector = json.loads(path.read_text(encoding="utf-8"))
    if "canonical_json" in vector:
        assert _written(vector["binding"]).encode("utf-8") == vector["canonical_json"].encode()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ('"\\\b\f\n\r\t', '"\\"\\\\\\b\\f\\n\\r\\t"'),
        ({'"\\\b\f\n\r\t': 1}, '{"\\"\\\\\\b\\f\\n\\r\\t":1}'),
        ("\x00\x1f\x1b\x7f ", '"\\u0000\\u001f\\u001b\x7f "'),
        ("\u0001\n\u2028", '"\\u0001\\n\u2028"'),
        ("\ud7ff\ue000", '"\ud7ff\ue000"'),
        ([2**53 - 1, -(2**53 - 1)], "[9007199254740991,-9007199254740991]"),
        ({"b": [None, True, False], "a": [1, "x"]}, '{"a":[1,"x"],"b":[null,true,false]}'),
        (
            {"\uff21": 1, "Z": 3, "za": 4, "z\u00e9": 5, "\u00c9clair": 6},
            '{"Z":3,"za":4,"z\u00e9":5,"\u00c9clair":6,"\uff21":1}',
        ),
        ({}, "{}"),
        ([], "[]"),
        ("", '""'),
        ({"a": {"b": [[], {}]}}, '{"a":{"b":[[],{}]}}'),
    ],
)
def test_the_writer_holds_every_pinned_form(value: object, expected: str) -> None:
    from agentsafe.executor.canonical import _written

    assert _written(value) == expected
    assert canonical_text(value) == expected


@pytest.mark.parametrize("value", [2**53, -(2**53), chr(0xD800), {chr(0xDFFF): 1}, {1: "a"}])
def test_the_writer_refuses_what_has_no_form(value: object) -> None:
    from agentsafe.executor.canonical import _written

    with pytest.raises(CanonicalizationError):
        _written(value)


def test_the_writer_does_not_normalise() -> None:
    from agentsafe.executor.canonical import _written

    assert _written("caf\u00e9") != _written("cafe\u0301")


# Found by mutation testing on the C-encoder source (issue 23, docs/mutation.md).


def _refusal(call: Callable[[Any], object], value: object) -> tuple[str, str]:
    with pytest.raises(CanonicalizationError) as info:
        call(value)
    return (info.value.code, str(info.value))


@pytest.mark.parametrize(
    ("call", "value", "code", "message"),
    [
        (parse_json, '{"a": 1, "a": 2}', "JSON_DUPLICATE_KEY", "a key appears twice in one object"),
        (parse_json, "[NaN]", "NUMBER_NOT_FINITE", "NaN is not a JSON number"),
        (parse_json, "-Infinity", "NUMBER_NOT_FINITE", "-Infinity is not a JSON number"),
        (parse_json, "1e999", "NUMBER_NOT_FINITE", "a number overflows a double"),
        (parse_json, "9" * 5000, "NUMBER_OUT_OF_RANGE", "an integer has too many digits"),
        (parse_json, '["\\ud800"]', "JSON_INVALID", "a string holds a lone surrogate"),
        (canonical_json, "\ud800", "JSON_INVALID", "string contains a lone surrogate"),
        (canonical_json, {"\udfff": 1}, "JSON_INVALID", "key contains a lone surrogate"),
        (format_number, True, "JSON_INVALID", "a boolean is not a number"),
        (
            canonical_json,
            [2**53],
            "NUMBER_OUT_OF_RANGE",
            "integer outside the exactly representable range",
        ),
        (canonical_json, {"n": math.inf}, "NUMBER_NOT_FINITE", "non-finite number"),
        (canonical_json, {1: "a"}, "JSON_INVALID", "object key is not a string"),
        (canonical_json, [b"x"], "JSON_INVALID", "value of type bytes has no JSON form"),
        (canonical_json, {"a": object()}, "JSON_INVALID", "value of type object has no JSON form"),
    ],
)
def test_what_each_refusal_says(
    call: Callable[[Any], object], value: object, code: str, message: str
) -> None:
    """The code is the contract; the words are what an operator reads when a file of theirs is
    refused (the policy loader, the principals file), and they name the rule, never the data."""
    assert _refusal(call, value) == (code, message)


def test_the_depth_refusal_says_what_was_too_deep() -> None:
    deep: object = []
    for _ in range(MAX_DEPTH + 1):
        deep = [deep]
    assert _refusal(canonical_json, deep) == ("JSON_TOO_DEEP", "value nested too deeply")


def test_a_lone_surrogate_after_a_scalar_is_still_found() -> None:
    # the walk pops the last item first: a number, then the string behind it
    for text in ('["\\ud800", 1]', '["\\ud800", null, true]', '{"a": "\\udc00", "b": 2}'):
        with pytest.raises(CanonicalizationError) as info:
            parse_json(text)
        assert info.value.code == "JSON_INVALID"


def test_the_characters_beside_the_surrogate_range_are_read() -> None:
    # an escape anywhere makes the reader look for surrogates; U+D7FF and U+E000 are not ones
    assert parse_json('["\\u0041", "\ue000", "\ud7ff"]') == ["A", "\ue000", "\ud7ff"]
    assert parse_json('{"\\ue000": "\\ud7ff"}') == {"\ue000": "\ud7ff"}


def _nested(leaf: object, levels: int, wrap: Callable[[object], object]) -> object:
    for _ in range(levels):
        leaf = wrap(leaf)
    return leaf


@pytest.mark.parametrize(
    ("wrap", "opening", "closing"),
    [(lambda v: [v], "[", "]"), (lambda v: {"a": v}, '{"a":', "}")],
    ids=["array", "object"],
)
def test_the_writer_nests_to_the_bound_and_refuses_past_it(
    wrap: Callable[[object], object], opening: str, closing: str
) -> None:
    # a float anywhere sends the value to the writer: its own depth bound is the one probed
    deep = _nested(1.5, MAX_DEPTH, wrap)
    assert canonical_text(deep) == opening * MAX_DEPTH + "1.5" + closing * MAX_DEPTH
    with pytest.raises(CanonicalizationError) as info:
        canonical_text(wrap(deep))
    assert info.value.code == "JSON_TOO_DEEP"


PLAIN = [
    None,
    True,
    False,
    1764660000.123,  # a grant's iat, nbf and exp: milliseconds as a float
    -0.5,
    1e-4,
    2.0**51 + 0.5,  # the last binade where a half is a float
    {"iat": 1764660000.001, "exp": 1764660060.999, "nbf": 1764660000.001},
    0,
    2**53 - 1,
    -(2**53 - 1),
    "ascii",
    "caf\u00e9 \u2028 \uffff",
    [1, "x", None],
    (True, "t"),
    {"a": [1, {"b": False}], "\u00e9t\u00e9": None, "\uffff": 0},
    _nested("x", MAX_DEPTH, lambda v: [v]),
    _nested("x", MAX_DEPTH, lambda v: {"k": v}),
]


@pytest.mark.parametrize("value", PLAIN, ids=range(len(PLAIN)))
def test_plain_values_take_the_c_encoder_and_never_the_writer(
    value: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The C route is the measured gain of docs/performance.md: every plain value, to the depth
    bound, with non-ASCII text and keys of the Basic Multilingual Plane and either integer bound,
    takes it; the bytes are the writer's."""
    from agentsafe.executor import canonical

    expected = canonical._written(value)
    assert canonical._plain(value, 0)

    def no_writer(_: object) -> str:
        raise AssertionError("a plain value took the writer")

    monkeypatch.setattr(canonical, "_written", no_writer)
    assert canonical_text(value) == expected


def test_sha256_bytes_digest_names_raw_bytes_and_text_as_utf8() -> None:
    from agentsafe.executor.canonical import sha256_bytes_digest

    abc = "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert sha256_bytes_digest(b"abc") == abc
    assert sha256_bytes_digest("abc") == abc
    assert sha256_bytes_digest("\u00e9") == sha256_bytes_digest(b"\xc3\xa9")
    assert sha256_bytes_digest("\u00e9") == (
        "sha256:" + "4a99557e4033c3539de2eb65472017cad5f9557f7a0625a09f1c3f6e2ba69c4c"
    )


# Issue 34: the walk checks a container's strings and integers itself, the C encoder is built
# once, and the reader's decoder too. Each is held to the code before it, kept here as the oracle.


def _plain_before_issue_34(value: Any, depth: int) -> bool:
    """``canonical._plain`` as it was before issue 34: one call per member."""
    from agentsafe.executor.canonical import (
        _FLOAT_HIGH,
        _FLOAT_LOW,
        _KEY_OUTSIDE_ORDER,
        _SURROGATE,
        MAX_SAFE_INTEGER,
    )

    if depth > MAX_DEPTH:
        return False
    if isinstance(value, str):
        return value.isascii() or _SURROGATE.search(value) is None
    kind = type(value)
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                return False
            if not key.isascii() and _KEY_OUTSIDE_ORDER.search(key) is not None:
                return False
            if not _plain_before_issue_34(item, depth + 1):
                return False
        return True
    if kind is list or kind is tuple:
        for item in value:  # noqa: SIM110
            if not _plain_before_issue_34(item, depth + 1):
                return False
        return True
    if kind is int:
        return bool(-MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER)
    if kind is float:
        return _FLOAT_LOW <= abs(value) < _FLOAT_HIGH and not value.is_integer()
    return value is None or kind is bool


_odd_members = st.sampled_from(
    [2**53, -(2**53), 2**53 - 1, True, None, 2.0, 1.5, "\ud800", "é", "\U0001f600", (), b"x"]
)
_any_values = st.recursive(
    _odd_members | plain_text | st.integers() | st.floats(),
    lambda children: (
        st.lists(children, max_size=5)
        | st.lists(children, max_size=5).map(tuple)
        | st.dictionaries(plain_text | st.sampled_from(["\U0001f600", "\ud800"]), children,
                          max_size=5)
        | st.dictionaries(st.integers(0, 3), children, max_size=2)
    ),
    max_leaves=30,
)  # fmt: skip


@given(_any_values, st.sampled_from([0, 1, MAX_DEPTH - 2, MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1]))
def test_the_walk_answers_what_it_answered_before(value: object, depth: int) -> None:
    from agentsafe.executor.canonical import _plain

    assert _plain(value, depth) == _plain_before_issue_34(value, depth)


@pytest.mark.parametrize("leaf", ["x", 7, 2**53, None, [], {}, "\ud800", 1.5])
@pytest.mark.parametrize("levels", [MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1])
def test_the_walk_stops_at_the_same_depth_as_before(leaf: object, levels: int) -> None:
    from agentsafe.executor.canonical import _plain

    for wrap in (lambda v: [v], lambda v: {"k": v}, lambda v: (v,)):
        value: object = leaf
        for _ in range(levels):
            value = wrap(value)
        assert _plain(value, 0) == _plain_before_issue_34(value, 0)


@given(fractional)
def test_orjson_writes_a_float_with_a_fraction_in_range_as_ecmascript_does(value: float) -> None:
    import orjson

    assert orjson.dumps(value) == format_number(value).encode()


def test_orjson_escapes_every_control_character_as_the_writer_does() -> None:
    from agentsafe.executor.canonical import _compiled, _written

    every = "".join(map(chr, range(0x80))) + "\u2028\u2029\u00e9\ue000\uffff"
    for text in (every, *every):
        assert _compiled(text) == _written(text).encode("utf-8")
        assert _compiled({text: text}) == _written({text: text}).encode("utf-8")


@given(plain_values)
def test_orjson_writes_what_the_writer_writes(value: object) -> None:
    from agentsafe.executor.canonical import _compiled, _plain, _written

    if _plain(value, 0):  # a key beyond U+FFFF is not: orjson would put it in code-point order
        assert _compiled(value) == _written(value).encode("utf-8")
    assert canonical_json(value) == _written(value).encode("utf-8")


@pytest.mark.parametrize("levels", [1, 200, 253, 254, 255, 256, MAX_DEPTH])
def test_a_plain_value_orjson_will_not_nest_takes_the_c_encoder(
    levels: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """orjson refuses past 254 levels; such a value is still plain, and the standard library's
    C encoder writes it: never the writer, and the same bytes."""
    from agentsafe.executor import canonical

    value: object = "x"
    for _ in range(levels):
        value = [value]
    expected = canonical._written(value)

    def no_writer(_: object) -> str:
        raise AssertionError("a plain value took the writer")

    monkeypatch.setattr(canonical, "_written", no_writer)
    assert canonical_text(value) == expected
    assert canonical_json(value) == expected.encode("utf-8")
    assert (canonical._compiled(value) is None) == (levels > 254)


def test_a_plain_value_of_ordinary_depth_is_written_by_orjson(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from agentsafe.executor import canonical

    def no_c_encoder(_: object) -> str:
        raise AssertionError("the C encoder wrote a value orjson takes")

    monkeypatch.setattr(canonical, "_c_written", no_c_encoder)
    line = {"event": "DECISION", "seq": 7, "at": 1.5, "codes": ["A", "\u00e9"], "ok": None}
    assert (
        canonical_text(line)
        == '{"at":1.5,"codes":["A","\u00e9"],"event":"DECISION","ok":null,"seq":7}'
    )


@given(plain_values)
def test_the_c_encoder_built_once_writes_what_encode_writes(value: object) -> None:
    from agentsafe.executor.canonical import _C_ENCODER, _C_WRITE

    assert _C_WRITE is not None  # CPython has the C encoder; the fallback is _C_ENCODER itself
    assert "".join(_C_WRITE(value, 0)) == _C_ENCODER.encode(value)


def _parsed_by_json_loads(text: str | bytes) -> tuple[str, object]:
    from agentsafe.executor import canonical

    try:
        if isinstance(text, bytes | bytearray):
            text = bytes(text).decode("utf-8")
        value = json.loads(
            text,
            object_pairs_hook=canonical._refuse_duplicates,
            parse_constant=canonical._refuse_constant,
            parse_float=canonical._finite_float,
            parse_int=canonical._integer,
        )
        if "\\u" in text:
            canonical._refuse_lone_surrogates(value)
    except Exception as exc:  # the exception is the outcome compared
        return (type(exc).__name__, str(exc))
    return ("value", value)


def _parsed_now(text: str | bytes) -> tuple[str, object]:
    try:
        return ("value", parse_json(text))
    except Exception as exc:  # the exception is the outcome compared
        return (type(exc).__name__, str(exc))


_json_texts = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4)
    ),
    max_leaves=20,
).map(lambda v: json.dumps(v, ensure_ascii=False))


@given(
    _json_texts
    | st.text(max_size=40)
    | st.sampled_from(
        ["\ufeff{}", '{"a":1,"a":2}', "NaN", "1e999", '"\\ud800"', "[1,", "", " 1 ", "\ufeff"]
    )
)
def test_the_reader_built_once_reads_and_refuses_as_json_loads_did(text: str) -> None:
    assert _parsed_now(text) == _parsed_by_json_loads(text)
    assert _parsed_now(text.encode("utf-8", "surrogatepass")) == _parsed_by_json_loads(
        text.encode("utf-8", "surrogatepass")
    )
