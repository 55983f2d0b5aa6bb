"""What a person is shown of agent text: inert, exact, and amounts at their currency's scale."""

from __future__ import annotations

import json

import pytest

from agentsafe.executor.display import (
    amount_text,
    field_warnings,
    inert,
    inert_json,
    inert_value,
    text_warnings,
)


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


# Issue 30, item 9: invisible characters that escaped the category rule (Lo, Mn, So).
@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("hangul \u3164filler", "hangul \\u3164filler"),
        ("choseong \u115f jungseong \u1160", "choseong \\u115f jungseong \\u1160"),
        ("halfwidth \uffa0", "halfwidth \\uffa0"),
        ("cgj a\u034fb", "cgj a\\u034fb"),
        ("vs16 x\ufe0f", "vs16 x\\ufe0f"),
        ("vs17 x\U000e0100", "vs17 x\\udb40\\udd00"),
        ("braille \u2800blank", "braille \\u2800blank"),
        ("nbsp a\u00a0b ideographic\u3000", "nbsp a\\u00a0b ideographic\\u3000"),
        ("soft\u00adhyphen", "soft\\u00adhyphen"),
    ],
)
def test_every_invisible_or_blank_character_is_escaped(text: str, shown: str) -> None:
    assert inert(text) == shown
    assert inert_value(text) == f'"{shown}"'
    assert text_warnings(text)  # and the person is told


# Issue 30, item 10: look-alikes and mixed scripts are escaped and marked.
def test_a_cyrillic_a_in_a_latin_word_is_escaped_and_marked() -> None:
    target = "p\u0430yout:beneficiary-1"
    assert inert(target) == "p\\u0430yout:beneficiary-1"
    assert inert_value(target) == '"p\\u0430yout:beneficiary-1"'
    [warning] = text_warnings(target)
    assert "mixed scripts: Cyrillic, Latin" in warning
    assert "U+0430 CYRILLIC SMALL LETTER A" in warning
    assert field_warnings({"target": target}) == [f"target: {warning}"]
    assert json.loads(inert_value({"t": target})) == {"t": target}  # still the same JSON


@pytest.mark.parametrize(
    ("text", "shown", "marked"),
    [
        ("\u0440\u0430\u0443\u0440\u0430l", "\\u0440\\u0430\\u0443\\u0440\\u0430l", "Cyrillic"),
        ("\u0440\u0430\u0443\u0440\u0430", "\\u0440\\u0430\\u0443\\u0440\\u0430", "LETTER ER"),
        ("\uff50ayout", "\\uff50ayout", "FULLWIDTH"),
        ("acc\u03bfunt-7", "acc\\u03bfunt-7", "Greek, Latin"),
        ("IBAN DE89\u0661", "IBAN DE89\\u0661", "Arabic, Latin"),
    ],
)
def test_look_alikes_are_escaped(text: str, shown: str, marked: str) -> None:
    assert inert(text) == shown
    assert any(marked in w for w in text_warnings(text))


@pytest.mark.parametrize(
    "text",
    ["\u0410\u043b\u0435\u043a\u0441\u0435\u0439 P", "東京 tokyo", "日本語テキストabc", "café"],
)
def test_ordinary_writing_is_shown_as_itself(text: str) -> None:
    assert inert(text) == text
    assert text_warnings(text) == []
