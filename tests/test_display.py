"""What a person is shown of agent text: inert, exact, and amounts at their currency's scale."""

from __future__ import annotations

import json

import pytest

from agentsafe.executor.display import amount_text, inert, inert_json, inert_value


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain [conceal]x[/conceal] <b>", "plain [conceal]x[/conceal] <b>"),
        ("ansi \x1b[8mhidden", "ansi \\u001b[8mhidden"),
        ("c1 \x85 \x9b", "c1 \\u0085 \\u009b"),
        ("rtl \u202eevil\u202c", "rtl \\u202eevil\\u202c"),
        ("isolate \u2066x\u2069", "isolate \\u2066x\\u2069"),
        ("zero\u200bwidth", "zero\\u200bwidth"),
        ("line\u2028para\u2029", "line\\u2028para\\u2029"),
        ("new\nline\ttab", "new\\u000aline\\u0009tab"),
        ("private \ue000", "private \\ue000"),
        ("tag \U000e0041", "tag \\udb40\\udc41"),
        ("emoji 😀 é ß 東京", "emoji 😀 é ß 東京"),
    ],
)
def test_what_does_not_print_as_itself_is_escaped(text: str, shown: str) -> None:
    assert inert(text) == shown


def test_values_are_json_and_still_the_same_json() -> None:
    value = {"target": "a\u202eb\x1b", "n": 1, "list": ["\u2028"]}
    assert inert_value("x") == '"x"'
    assert inert_value(None) == "null"
    assert json.loads(inert_value(value)) == value
    text = inert_json(value)
    assert json.loads(text) == value
    assert all(ch.isprintable() for line in text.split("\n") for ch in line)
    assert text.startswith("{\n  ")


@pytest.mark.parametrize(
    ("parameters", "shown"),
    [
        ({"amountMinor": 20000, "currency": "EUR"}, "200.00 EUR"),
        ({"amountMinor": 5, "currency": "EUR"}, "0.05 EUR"),
        ({"amountMinor": 123456789, "currency": "CHF"}, "1,234,567.89 CHF"),
        ({"amountMinor": 20000, "currency": "JPY"}, "20,000 JPY"),
        ({"amountMinor": 1234567, "currency": "BHD"}, "1,234.567 BHD"),
        ({"amountMinor": -150, "currency": "USD"}, "-1.50 USD"),
        (
            {"amountMinor": 7, "currency": "XAU"},
            "7 XAU (minor units; the currency has no ISO 4217 scale)",
        ),
        ({"amountMinor": 7, "currency": "ZZZ"}, "7 ZZZ (minor units; not an ISO 4217 currency)"),
    ],
)
def test_amounts_at_their_currency_scale(parameters: dict[str, object], shown: str) -> None:
    assert amount_text(parameters) == shown


@pytest.mark.parametrize(
    "parameters",
    [
        {},
        {"amountMinor": 1},
        {"amountMinor": True, "currency": "EUR"},
        {"amountMinor": 1.5, "currency": "EUR"},
        {"amountMinor": "100", "currency": "EUR"},
        {"amountMinor": 1, "currency": "eur"},
        {"amountMinor": 1, "currency": "EURO"},
    ],
)
def test_no_amount_is_guessed(parameters: dict[str, object]) -> None:
    assert amount_text(parameters) is None
