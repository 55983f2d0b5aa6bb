"""RFC 8785 (JSON Canonicalization Scheme) and the digests built on it.

The canonical form is what every hash in agentsafe is taken over: the intent hash, the execution
payload digest, evidence line hashes and plan digests. It must match other implementations byte for
byte (see ``tests/conformance``), so it follows ECMAScript's ``JSON.stringify`` exactly:

* object keys sorted by UTF-16 code units, no Unicode normalisation;
* strings escaped as ECMAScript does (only ``"``, ``\\`` and control characters);
* numbers in ECMAScript ``Number.prototype.toString`` form, ``-0`` written ``0``.

Python-specific choices, all fail-closed: ``bool`` is never a number; integers outside the
IEEE-754 exact range (|n| > 2**53 - 1) are refused rather than silently rounded; NaN and the
infinities are refused; lone surrogates are refused (they have no UTF-8 form); only ``dict`` with
``str`` keys, ``list``/``tuple``, ``str``, ``int``, ``float``, ``bool`` and ``None`` are accepted.

The canonical form is defined for I-JSON (RFC 7493) only, so :func:`parse_json` is the one strict
reader every JSON input we hash, sign or trust goes through: UTF-8 only; a key named twice in one
object (:class:`DuplicateKeyError`) and numbers that are not finite (``NaN``, ``Infinity``,
``1e999``: ``NUMBER_NOT_FINITE``) are refused, where Python's ``json`` would keep the last value
and read infinities; so is a ``\\u`` escape of a lone surrogate in any string or key
(``JSON_INVALID``), which Python's ``json`` reads into a ``str`` that has no UTF-8 form and that
would fail only later, when it is hashed. Each caller maps the refusal to its own code.

Writing takes one of two routes to the same bytes. Most values the executor hashes (evidence
lines, intents, journal records, grants) hold only strings, safe integers, floats with a
fraction between 1e-4 and 2**53 (a grant's times), booleans, ``None``, lists and plain ``dict``
objects with keys inside the Basic Multilingual Plane: for those, and only after a walk has
checked exactly that, a compiled encoder writes the form. It is ``orjson`` (a maintained
library, issue 34: a seventh of the standard library's C encoder's time on an evidence line),
with the standard library's C encoder for the rare value nested deeper than ``orjson`` goes (it
refuses past 254 levels). Both write such values as ECMAScript does: the same escapes (only
``"``, ``\\`` and control characters, in the same forms), no spaces, keys in code-point order
(UTF-16 order inside the plane), and such a float in its shortest round-trip digits, positional.
Everything else (any other float, a key beyond U+FFFF, whose UTF-16 order differs from
code-point order, any other type, a lone surrogate, nesting past :data:`MAX_DEPTH`) goes
through the writer below, which refuses what has no canonical form. ``tests/test_canonical.py``
holds the routes to the same output (hypothesis, and every control character and bound).

Callers: intent capture, grants, the journal, evidence chains and bundles, plans, the policy
loader, the request body reader (``routes/app.py``), the provider's verifier.
These are the main callers: it is imported across the wings, and its other importers are not
listed.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

import orjson

from .codes import Code
from .errors import CanonicalizationError

__all__ = [
    "MAX_DEPTH",
    "MAX_SAFE_INTEGER",
    "DuplicateKeyError",
    "canonical_json",
    "canonical_text",
    "format_number",
    "parse_json",
    "sha256_digest",
    "sha256_hex",
]

MAX_SAFE_INTEGER = 2**53 - 1
MAX_DEPTH = 500
"""Deepest nesting written; well below Python's recursion limit, so a deeper value is refused
with ``JSON_TOO_DEEP`` instead of escaping as ``RecursionError`` (found by mutation testing)."""


class DuplicateKeyError(CanonicalizationError):
    """A JSON text names one key twice in an object. ``key`` is for an operator's own files; a
    caller's request never has it echoed."""

    code = Code.JSON_DUPLICATE_KEY

    def __init__(self, key: str) -> None:
        super().__init__("a key appears twice in one object")
        self.key = key


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKeyError(key)
        out[key] = value
    return out


def _refuse_constant(name: str) -> Any:
    raise CanonicalizationError(f"{name} is not a JSON number", code=Code.NUMBER_NOT_FINITE)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 overflows to infinity
        raise CanonicalizationError("a number overflows a double", code=Code.NUMBER_NOT_FINITE)
    return value


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:  # more digits than the interpreter converts (sys.get_int_max_str_digits)
        raise CanonicalizationError(
            "an integer has too many digits", code=Code.NUMBER_OUT_OF_RANGE
        ) from None


_DECODER = json.JSONDecoder(
    object_pairs_hook=_refuse_duplicates,
    parse_constant=_refuse_constant,
    parse_float=_finite_float,
    parse_int=_integer,
)
"""The decoder ``json.loads`` builds from the same hooks on every call (issue 34: 2 us a call);
it keeps no state between calls."""


def parse_json(text: str | bytes) -> Any:
    """Parse I-JSON: the one strict JSON reader (see the module docstring).

    Raises :class:`DuplicateKeyError`, or :class:`CanonicalizationError` for a number that is
    not finite (``NUMBER_NOT_FINITE``: ``NaN``, ``Infinity``, ``1e999``), has more digits than
    Python converts (``NUMBER_OUT_OF_RANGE``) or for a lone surrogate (``JSON_INVALID``);
    ``UnicodeDecodeError`` (bytes that are not UTF-8)
    or ``json.JSONDecodeError`` (not JSON), both ``ValueError``; ``RecursionError`` for nesting
    deeper than the interpreter's limit. Integers beyond 2**53 - 1 are read; hashing them is
    refused later (:func:`canonical_json`).
    """
    if isinstance(text, bytes | bytearray):
        text = bytes(text).decode("utf-8")
    if type(text) is str and not text.startswith("\ufeff"):
        # what json.loads does with these hooks, without building a decoder per call
        value = _DECODER.decode(text)
    else:  # a BOM, a str subclass or no text at all: json.loads's own refusals and errors
        value = json.loads(
            text,
            object_pairs_hook=_refuse_duplicates,
            parse_constant=_refuse_constant,
            parse_float=_finite_float,
            parse_int=_integer,
        )
    if "\\u" in text:  # a surrogate can only arrive escaped: UTF-8 has no form for one
        _refuse_lone_surrogates(value)
    return value


def _refuse_lone_surrogates(value: Any) -> None:
    """Refuse a string (or key) holding a surrogate that ``json`` did not pair into one
    character; iterative, so a deep value never recurses."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            strings: Sequence[str] = (item,)
        elif isinstance(item, dict):
            strings = tuple(item)
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
            continue
        else:
            continue
        for string in strings:
            if not string.isascii() and any(0xD800 <= ord(ch) <= 0xDFFF for ch in string):
                raise CanonicalizationError(
                    "a string holds a lone surrogate", code=Code.JSON_INVALID
                )


_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
}


def _escape_string(value: str) -> str:
    out: list[str] = ['"']
    for ch in value:
        code = ord(ch)
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif code < 0x20:
            out.append(f"\\u{code:04x}")
        elif 0xD800 <= code <= 0xDFFF:
            raise CanonicalizationError("string contains a lone surrogate", code=Code.JSON_INVALID)
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def format_number(value: int | float) -> str:
    """Format a number as ECMAScript's ``Number.prototype.toString`` would."""
    if isinstance(value, bool):
        raise CanonicalizationError("a boolean is not a number", code=Code.JSON_INVALID)
    if isinstance(value, int):
        if abs(value) > MAX_SAFE_INTEGER:
            raise CanonicalizationError(
                "integer outside the exactly representable range", code=Code.NUMBER_OUT_OF_RANGE
            )
        return str(value)
    if not math.isfinite(value):
        raise CanonicalizationError("non-finite number", code=Code.NUMBER_NOT_FINITE)
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    # repr() is the shortest string that round-trips, as ECMAScript requires.
    _, digits_tuple, exponent = Decimal(repr(abs(value))).as_tuple()
    digits = "".join(str(d) for d in digits_tuple).rstrip("0") or "0"
    assert isinstance(exponent, int)
    # value = 0.digits * 10**n  (ECMAScript's n), k = len(digits)
    k = len(digits)
    n = exponent + len(digits_tuple)
    if k <= n <= 21:
        text = digits + "0" * (n - k)
    elif 0 < n <= 21:
        text = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        text = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        exp = f"e{'+' if e >= 0 else '-'}{abs(e)}"
        text = digits + exp if k == 1 else digits[0] + "." + digits[1:] + exp
    return sign + text


def _utf16_key(key: str) -> bytes:
    try:
        return key.encode("utf-16-be")
    except UnicodeEncodeError as exc:
        raise CanonicalizationError(
            "key contains a lone surrogate", code=Code.JSON_INVALID
        ) from exc


def _write(value: Any, out: list[str], depth: int) -> None:
    if depth > MAX_DEPTH:
        raise CanonicalizationError("value nested too deeply", code=Code.JSON_TOO_DEEP)
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, str):
        out.append(_escape_string(value))
    elif isinstance(value, int | float):
        out.append(format_number(value))
    elif isinstance(value, Mapping):
        items = []
        for key, item in value.items():
            if not isinstance(key, str):
                raise CanonicalizationError("object key is not a string", code=Code.JSON_INVALID)
            items.append((_utf16_key(key), key, item))
        items.sort(key=lambda triple: triple[0])
        out.append("{")
        for index, (_, key, item) in enumerate(items):
            if index:
                out.append(",")
            out.append(_escape_string(key))
            out.append(":")
            _write(item, out, depth + 1)
        out.append("}")
    elif isinstance(value, Sequence) and not isinstance(value, bytes | bytearray):
        out.append("[")
        for index, item in enumerate(value):
            if index:
                out.append(",")
            _write(item, out, depth + 1)
        out.append("]")
    else:
        raise CanonicalizationError(
            f"value of type {type(value).__name__} has no JSON form", code=Code.JSON_INVALID
        )


_FLOAT_LOW = 1e-4
_FLOAT_HIGH = float(2**53)
_SURROGATE = re.compile("[\ud800-\udfff]")
_KEY_OUTSIDE_ORDER = re.compile("[\ud800-\udfff\U00010000-\U0010ffff]")
_C_ENCODER = json.JSONEncoder(
    ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False
)
_C_MAKE_ENCODER: Callable[..., Any] | None = getattr(json.encoder, "c_make_encoder", None)
_C_WRITE = (
    None
    if _C_MAKE_ENCODER is None
    else _C_MAKE_ENCODER(
        None,  # no circular check: a value reaches it only after _plain bounded its depth
        _C_ENCODER.default,
        json.encoder.encode_basestring,
        _C_ENCODER.indent,
        _C_ENCODER.key_separator,
        _C_ENCODER.item_separator,
        _C_ENCODER.sort_keys,
        _C_ENCODER.skipkeys,
        _C_ENCODER.allow_nan,
    )
)
"""The C encoder :meth:`json.JSONEncoder.encode` builds for ``_C_ENCODER`` on every call,
built once (issue 34: about 1 us of each of the two dozen texts of an ALLOW); the same
function with the same arguments, except the check for circular values, which ``_plain``
makes needless. ``None`` where the interpreter has no C encoder: then ``_C_ENCODER`` writes."""


def _plain(value: Any, depth: int) -> bool:
    """Whether the compiled encoders write ``value`` exactly as :func:`_write` would (see the
    module docstring); anything unusual answers False and takes the writer, which may refuse it.

    A container checks its strings and integers itself rather than calling this function once
    per member (issue 34: most of a request's values are such members); the checks are the
    ones a call would make, and a member past :data:`MAX_DEPTH` is never plain, as a call for it
    would answer. The dict and the list loops are written out each, not shared through a helper:
    a helper would be a second frame per level, and a value nested to :data:`MAX_DEPTH` would
    then pass the interpreter's recursion limit (``tests/test_canonical.py``, the nesting
    bound)."""
    if depth > MAX_DEPTH:
        return False
    if isinstance(value, str):
        return value.isascii() or _SURROGATE.search(value) is None
    kind = type(value)
    if kind is dict:
        if depth == MAX_DEPTH:
            return not value  # every member would be past the depth
        for key, item in value.items():
            if type(key) is not str:
                return False
            if not key.isascii() and _KEY_OUTSIDE_ORDER.search(key) is not None:
                return False
            member = type(item)
            if member is str:
                if not item.isascii() and _SURROGATE.search(item) is not None:
                    return False
            elif member is int:
                if not -MAX_SAFE_INTEGER <= item <= MAX_SAFE_INTEGER:
                    return False
            elif not _plain(item, depth + 1):
                return False
        return True
    if kind is list or kind is tuple:
        if depth == MAX_DEPTH:
            return not value
        for item in value:
            member = type(item)
            if member is str:
                if not item.isascii() and _SURROGATE.search(item) is not None:
                    return False
            elif member is int:
                if not -MAX_SAFE_INTEGER <= item <= MAX_SAFE_INTEGER:
                    return False
            elif not _plain(item, depth + 1):
                return False
        return True
    if kind is int:
        return bool(-MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER)
    if kind is float:
        # Both compiled encoders write a float's shortest round-trip digits, as ECMAScript's form
        # (format_number) does, and all three write them positionally when a finite float with
        # a fraction lies in [1e-4, 2**53); outside it they part: repr (the C encoder's) uses
        # exponents below 1e-4 and from 1e16, ECMAScript below 1e-6 and from 1e21, and a whole
        # float is "2.0" to the encoders, "2" to ECMAScript (every float from 2**53 on is
        # whole). Those take the writer.
        return _FLOAT_LOW <= abs(value) < _FLOAT_HIGH and not value.is_integer()
    return value is None or kind is bool


def _written(value: Any) -> str:
    """The writer's route: every type and refusal rule, in Python."""
    out: list[str] = []
    _write(value, out, 0)
    return "".join(out)


def _compiled(value: Any) -> bytes | None:
    """A plain value's canonical UTF-8 bytes from ``orjson``; ``None`` for one nested past its
    bound (254 levels), which the standard library's C encoder then writes."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        return None


def _c_written(value: Any) -> str:
    """A plain value's canonical text from the standard library's C encoder."""
    if _C_WRITE is None:
        return _C_ENCODER.encode(value)
    return "".join(_C_WRITE(value, 0))


def _plain_json(value: Any) -> bytes:
    """A plain value's canonical UTF-8 bytes, from whichever compiled encoder takes it."""
    data = _compiled(value)
    return _c_written(value).encode("utf-8") if data is None else data


def canonical_text(value: Any) -> str:
    """The RFC 8785 canonical JSON text of ``value``."""
    return _plain_json(value).decode("utf-8") if _plain(value, 0) else _written(value)


def canonical_json(value: Any) -> bytes:
    """The RFC 8785 canonical JSON of ``value`` as UTF-8 bytes."""
    return _plain_json(value) if _plain(value, 0) else _written(value).encode("utf-8")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_digest(value: Any) -> str:
    """``"sha256:" + hex(sha256(JCS(value)))``, the form every agentsafe digest takes."""
    return "sha256:" + sha256_hex(canonical_json(value))


def sha256_bytes_digest(data: bytes | str) -> str:
    """``"sha256:" + hex(sha256(data))`` of raw bytes (a text as UTF-8): a provider's body or a
    token named by its digest rather than by its JSON value."""
    return "sha256:" + sha256_hex(data.encode("utf-8") if isinstance(data, str) else data)
