"""What a person is shown of agent-controlled text: inert, exact, marked, and amounts at scale.

An escalation is decided by a person reading what an agent proposed, so everything the agent
controls (target, parameters, the whole intent) is shown as inert text, in the approval page, the
API's ``display`` fields, ``agentsafe approvals`` and the webhook alike, by the rules here and
nowhere else:

- values are shown as JSON (:func:`inert_json`, :func:`inert_value`): a string is quoted, so an
  empty or padded target cannot pass for something else;
- every character that would not print as itself is written as its ``\\uXXXX`` escape:
  controls (C0 and C1, ANSI escapes among them), format characters (bidirectional overrides and
  isolates, zero-width joiners), line and paragraph separators, private-use, surrogate and
  unassigned code points (by Unicode general category, as before), and also every
  ``Default_Ignorable_Code_Point`` (variation selectors U+FE00..FE0F and U+E0100..E01EF, the
  combining grapheme joiner U+034F, the Hangul fillers U+115F, U+1160, U+3164 and U+FFA0, tag
  characters), every ``White_Space`` character other than the ASCII space, and the blanks no
  Unicode property names (:data:`BLANK_GLYPHS`: U+2800 BRAILLE PATTERN BLANK, and the Hangul
  fillers again, because they were not default-ignorable in every Unicode version). So a
  right-to-left override cannot reorder what the person reads ("Trojan Source"), a terminal
  sequence cannot restyle it, and no invisible character can pad or split a target unseen;
- look-alikes are written as escapes too, and marked (:func:`value_warnings`): within one word
  (a run of characters between ASCII spaces and ASCII punctuation) a non-ASCII character that
  Unicode's confusables data says looks like an ASCII character (Cyrillic ``а`` for ``a``,
  fullwidth ``ｐ`` for ``p``), or whose compatibility form (NFKC) is ASCII, is escaped when the
  word also holds ASCII letters or digits, mixes scripts, or is made of nothing but look-alikes
  (a whole-script confusable such as Cyrillic ``раура``). A word that mixes scripts beyond what
  UTS #39's "highly restrictive" level allows (Latin with Han and Japanese kana, Bopomofo or
  Hangul) is marked with a warning naming the scripts; so ``p\\u0430yout:beneficiary-1`` shows
  with ``mixed scripts: Cyrillic, Latin; U+0430 CYRILLIC SMALL LETTER A looks like "a"``.
  Ordinary non-Latin text (``Алексей``, ``東京``) is shown as itself;
- the result is text, never markup: the page sets it with ``textContent`` and the command line
  prints it with markup and highlighting off, so ``[conceal]…[/conceal]`` or ``<img …>`` shows
  literally.

The Unicode data comes from maintained packages, never from a hand list (apart from
:data:`BLANK_GLYPHS`, the blanks Unicode assigns no property): ``regex`` (its
``\\p{Default_Ignorable_Code_Point}``, ``\\p{White_Space}`` and general categories follow the
current Unicode release, newer than this Python's ``unicodedata``) and ``confusable-homoglyphs``
(Unicode's ``confusables.txt`` and ``Scripts.txt`` as JSON inside the package; it reads no network
at run time). Python's ``unicodedata`` keeps the category rule and the NFKC check.

:func:`amount_text` shows an integer ``amountMinor`` with its ISO 4217 ``currency`` at the
currency's own scale (2 decimals for EUR, 0 for JPY, 3 for BHD) from the ``iso4217`` data package;
an unknown currency or a currency without minor units is shown as minor units, never guessed.

Ground floor. Callers: ``routes/approvals.py`` (what the page and the API show),
``tools/approvals_cli.py`` (the command line), ``egress/webhook.py`` (the notification).
"""

from __future__ import annotations

import functools
import json
import unicodedata
from collections.abc import Iterator, Mapping
from typing import Any, Final

import regex
from confusable_homoglyphs.categories import alias as _script
from confusable_homoglyphs.confusables import confusables_data as _CONFUSABLES
from iso4217 import Currency

__all__ = [
    "BLANK_GLYPHS",
    "amount_text",
    "field_warnings",
    "inert",
    "inert_json",
    "inert_value",
    "text_warnings",
    "value_warnings",
]

_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
BLANK_GLYPHS: Final = frozenset("\u2800\u115f\u1160\u3164\uffa0")
"""Characters that render as blank space but that no Unicode property marks as such (U+2800
BRAILLE PATTERN BLANK is a symbol, So), and the Hangul fillers, default-ignorable only since a
later Unicode version than some renderers know."""
_INVISIBLE = regex.compile(
    r"[\p{Default_Ignorable_Code_Point}\p{White_Space}\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}"
    r"\p{Zl}\p{Zp}\p{Zs}]"
)
_WORD_BREAK = regex.compile(r"[\x00-\x2f\x3a-\x40\x5b-\x60\x7b-\x7f]+")
"""Words are split at ASCII spaces, controls and punctuation (``-``, ``:``, ``.``, quotes ...)."""
_NO_SCRIPT = frozenset({"COMMON", "INHERITED", "Unknown"})
_ALLOWED_MIXES = (
    frozenset({"LATIN", "HAN", "HIRAGANA", "KATAKANA"}),
    frozenset({"LATIN", "HAN", "BOPOMOFO"}),
    frozenset({"LATIN", "HAN", "HANGUL"}),
)
"""UTS #39 "highly restrictive": the script mixes that are ordinary writing, never marked."""


def _escape(char: str) -> str:
    code = ord(char)
    if code > 0xFFFF:  # as JSON writes it: a surrogate pair
        code -= 0x10000
        return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
    return f"\\u{code:04x}"


@functools.lru_cache(maxsize=8192)
def _hidden(char: str) -> bool:
    """True for a character that does not print as itself (see the module docstring)."""
    if char == " ":
        return False
    return (
        unicodedata.category(char) in _UNSAFE_CATEGORIES
        or char in BLANK_GLYPHS
        or _INVISIBLE.match(char) is not None
    )


def _shape(glyph: Any) -> str:
    # confusables.txt wraps right-to-left shapes in LEFT-TO-RIGHT MARKs; they are not shape
    return str(glyph.get("c", "")).replace("\u200e", "").replace("\u200f", "")


_LIKE_ASCII: Final[dict[str, str]] = {
    shape: key
    for key, glyphs in _CONFUSABLES.items()
    if key.isascii() and key.isprintable() and not key.isspace()
    for glyph in glyphs
    if len(shape := _shape(glyph)) == 1 and not shape.isascii()
}
"""Every single character the confusables data lists as looking like a printable ASCII one."""


@functools.lru_cache(maxsize=8192)
def _looks_like(char: str) -> str | None:
    """The ASCII character a non-ASCII ``char`` is confusable with, or None."""
    if char.isascii():
        return None
    if char in _LIKE_ASCII:
        return str(_LIKE_ASCII[char])
    for glyph in _CONFUSABLES.get(char) or ():
        shape = _shape(glyph)
        if shape and shape.isascii() and shape.isprintable() and not shape.isspace():
            return shape
    folded = unicodedata.normalize("NFKC", char)
    if folded != char and folded.isascii() and folded.isprintable() and not folded.isspace():
        return folded
    return None


def _scripts(word: str) -> frozenset[str]:
    return frozenset(_script(char) for char in word) - _NO_SCRIPT


def _mixed(scripts: frozenset[str]) -> bool:
    return len(scripts) > 1 and not any(scripts <= allowed for allowed in _ALLOWED_MIXES)


def _words(text: str) -> Iterator[tuple[int, int]]:
    """(start, end) of every word of ``text`` that holds a non-ASCII character."""
    position = 0
    for gap in _WORD_BREAK.finditer(text):
        if gap.start() > position and not text[position : gap.start()].isascii():
            yield position, gap.start()
        position = gap.end()
    if position < len(text) and not text[position:].isascii():
        yield position, len(text)


def _suspect(word: str) -> tuple[frozenset[str] | None, dict[str, str]]:
    """For one word: the scripts it mixes (None when it does not) and the look-alikes to escape,
    each with the ASCII character it looks like."""
    visible = [char for char in word if not _hidden(char)]
    scripts = _scripts("".join(visible))
    mixed = _mixed(scripts)
    alike = {char: shape for char in visible if (shape := _looks_like(char)) is not None}
    if not alike:
        return (scripts if mixed else None), {}
    ascii_alnum = any(char.isascii() and char.isalnum() for char in visible)
    only_alike = all(char in alike or not char.isalnum() for char in visible)
    if mixed or ascii_alnum or only_alike:
        return (scripts if mixed else None), alike
    return None, {}


def _render(text: str) -> tuple[str, list[str]]:
    escape = {index for index, char in enumerate(text) if _hidden(char)}
    notes: list[str] = []
    if escape:
        notes.append(f"{len(escape)} invisible or control character(s) written as \\uXXXX")
    for start, end in _words(text):
        word = text[start:end]
        scripts, alike = _suspect(word)
        if scripts is None and not alike:
            continue
        escape.update(start + i for i, char in enumerate(word) if char in alike)
        shown = "".join(_escape(char) if char in alike or _hidden(char) else char for char in word)
        parts = []
        if scripts is not None:
            parts.append("mixed scripts: " + ", ".join(sorted(s.title() for s in scripts)))
        parts.extend(
            f"U+{ord(char):04X} {unicodedata.name(char, 'unnamed')} looks like {shape!r}"
            for char, shape in sorted(alike.items())
        )
        notes.append(f"{shown}: " + "; ".join(parts))
    rendered = "".join(
        _escape(char) if index in escape else char for index, char in enumerate(text)
    )
    return rendered, notes


def inert(text: str) -> str:
    """``text`` with every character that does not print as itself, and every look-alike in a
    suspect word, written as ``\\uXXXX``.

    Newlines and tabs are escaped too: one value is one line.
    """
    if text.isascii() and text.isprintable():
        return text
    return _render(text)[0]


def text_warnings(text: str) -> list[str]:
    """What a person should be told about ``text`` besides its inert form: invisible characters,
    mixed scripts and look-alikes, each naming the word (inert) and the code points."""
    if text.isascii() and text.isprintable():
        return []
    return _render(text)[1]


def inert_value(value: Any) -> str:
    """One JSON value on one line (a string quoted), inert."""
    return inert(json.dumps(value, ensure_ascii=False, sort_keys=True))


def value_warnings(value: Any) -> list[str]:
    """:func:`text_warnings` of the value as :func:`inert_value` shows it."""
    return text_warnings(json.dumps(value, ensure_ascii=False, sort_keys=True))


def field_warnings(fields: Mapping[str, Any]) -> list[str]:
    """``"<field>: <warning>"`` for every warning of every named value, in the given order."""
    return [f"{name}: {note}" for name, value in fields.items() for note in value_warnings(value)]


def inert_json(value: Any) -> str:
    """A JSON document, indented, keys sorted, inert: the exact intent as a person reads it.

    JSON escapes C0 controls itself; :func:`inert` escapes what it leaves (C1 controls, format
    characters, separators, invisible characters, look-alikes inside strings), and the escapes
    it writes are JSON's own, so the text is still the same JSON value.
    """
    return "\n".join(
        inert(line)
        for line in json.dumps(value, ensure_ascii=False, sort_keys=True, indent=2).split("\n")
    )


def amount_text(parameters: Mapping[str, Any]) -> str | None:
    """``"200.00 EUR"`` for ``{"amountMinor": 20000, "currency": "EUR"}``; ``None`` when the
    parameters carry no integer ``amountMinor`` with a three-letter ``currency``."""
    minor = parameters.get("amountMinor")
    currency = parameters.get("currency")
    if isinstance(minor, bool) or not isinstance(minor, int) or not isinstance(currency, str):
        return None
    if len(currency) != 3 or not currency.isascii() or not currency.isupper():
        return None
    try:
        exponent = Currency(currency).exponent
    except ValueError:
        return f"{minor} {currency} (minor units; not an ISO 4217 currency)"
    if exponent is None:
        return f"{minor} {currency} (minor units; the currency has no ISO 4217 scale)"
    sign = "-" if minor < 0 else ""
    whole, fraction = divmod(abs(minor), 10**exponent)
    digits = f"{whole:,}" + (f".{fraction:0{exponent}d}" if exponent else "")
    return f"{sign}{digits} {currency}"
