"""What a person is shown of agent-controlled text: inert, exact, and amounts at their scale.

An escalation is decided by a person reading what an agent proposed, so everything the agent
controls (target, parameters, the whole intent) is shown as inert text, in the approval page and
in ``agentsafe approvals`` alike, by the rules here and nowhere else:

- values are shown as JSON (:func:`inert_json`, :func:`inert_value`): a string is quoted, so an
  empty or padded target cannot pass for something else;
- every character that would not print as itself -- controls (C0 and C1, ANSI escapes among
  them), format characters (bidirectional overrides and isolates, zero-width joiners), line and
  paragraph separators, private-use and surrogate code points -- is written as its ``\\uXXXX``
  escape, so a right-to-left override cannot reorder what the person reads ("Trojan Source")
  and a terminal sequence cannot restyle it;
- the result is text, never markup: the page sets it with ``textContent`` and the command line
  prints it with markup and highlighting off, so ``[conceal]…[/conceal]`` or ``<img …>`` shows
  literally.

:func:`amount_text` shows an integer ``amountMinor`` with its ISO 4217 ``currency`` at the
currency's own scale (2 decimals for EUR, 0 for JPY, 3 for BHD) from the ``iso4217`` data package;
an unknown currency or a currency without minor units is shown as minor units, never guessed.

Ground floor. Callers: ``routes/approvals.py`` (what the page and the API show),
``tools/approvals_cli.py`` (the command line), ``egress/webhook.py`` (the notification).
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Mapping
from typing import Any

from iso4217 import Currency

__all__ = ["amount_text", "inert", "inert_json", "inert_value"]

_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def _escape(char: str) -> str:
    code = ord(char)
    if code > 0xFFFF:  # as JSON writes it: a surrogate pair
        code -= 0x10000
        return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
    return f"\\u{code:04x}"


def inert(text: str) -> str:
    """``text`` with every character that does not print as itself written as ``\\uXXXX``.

    Newlines and tabs are escaped too: one value is one line.
    """
    return "".join(
        _escape(char) if unicodedata.category(char) in _UNSAFE_CATEGORIES else char for char in text
    )


def inert_value(value: Any) -> str:
    """One JSON value on one line (a string quoted), inert."""
    return inert(json.dumps(value, ensure_ascii=False, sort_keys=True))


def inert_json(value: Any) -> str:
    """A JSON document, indented, keys sorted, inert: the exact intent as a person reads it.

    JSON escapes C0 controls itself; :func:`inert` escapes what it leaves (C1 controls, format
    characters, separators), and the escapes it writes are JSON's own, so the text is still the
    same JSON value.
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
