"""The redactor's hot path (issue 34) held to the redactor as it was, output for output.

The oracle is ``executor/evidence/redact.py`` as it stood at be6ef8f, before issue 34 made it
cheaper, copied below verbatim except for four things: ``Redactor`` is renamed
``OldRedactor`` and ``clean_line`` ``old_clean_line``; ``RedactingLogFilter`` is left out (it
only calls ``redact``); and it uses the production :class:`Redaction` (a frozen dataclass issue
34 did not touch), so results compare with ``==``. Keep it as it is: it is the reference.

What is compared, for every example, with the same secrets and credential headers registered in
both: ``redact`` (with and without JWS, twice, so the second answer comes from the clean cache
when the first found nothing) and ``screen``; ``clean_line`` with and without a redactor, values
compared with their types (``True`` is not ``1`` here, nor ``1`` ``1.0``) and the redactions
found in order. The inputs: arbitrary text; text built from the registered secrets, their
transformed forms (case, squashed, base64, hex, percent-encoded, respaced, cut short) and the
shapes the redactor knows (bearer, PEM, compact JWS, the credential header) among the delimiters
its candidates are cut at; nested structures of every type ``clean_line`` takes; and the lines
a BLOCK and an ALLOW write (captured from a run of ``executor/tools/harness.py``'s workspace),
with fresh identifiers and digests, and with identifiers that equal a registered secret (a UUID
or a hex digest can be one: nothing may take such a shape as safe).

Each shortcut in the new code has a test here that fails when it is wrong, checked by breaking
each in turn: lengths counted in characters, the short-candidate skip applied to non-ASCII
text, the cut and fine-token prechecks narrowed, the lengths of one secret only, the string
fast path without the surrogate repair, no word windows, cuts unbounded, the credential-key
check skipped, the fixed shapes' spans, forms or patterns altered, the bearer and header prechecks
narrowed.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import json
import math
import re
import secrets
import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from urllib.parse import quote, quote_plus

from hypothesis import example, given, settings
from hypothesis import strategies as st

from agentsafe.executor.canonical import MAX_SAFE_INTEGER
from agentsafe.executor.evidence import redact as new
from agentsafe.executor.evidence.redact import Redaction

# ---------------------------------------------------------------------------------------------
# The oracle: executor/evidence/redact.py at be6ef8f (see the module docstring). Do not edit.
# ---------------------------------------------------------------------------------------------

KIND_SECRET = "SECRET"
KIND_BEARER = "BEARER"
KIND_PEM = "PEM"
KIND_JWS = "JWS"
KIND_CREDENTIAL_HEADER = "CREDENTIAL_HEADER"

# When two recognisers claim overlapping text, the merged span is labelled with the earliest here.
_PRIORITY = (KIND_SECRET, KIND_PEM, KIND_CREDENTIAL_HEADER, KIND_JWS, KIND_BEARER)

# Token forms shorter than this are not registered on their own (a secret's words like "Bearer"
# would otherwise redact every occurrence of the word); the whole value is always registered.
MIN_TOKEN_LENGTH = 8

_INNER_DELIMITERS = frozenset("=:@/?&#")
_MAX_CUTS = 16

_SCHEMES = ("bearer", "basic", "token", "apikey", "api-key")

_COARSE = re.compile(r"[^\s\"'`,;()<>\[\]{}&?|]+")
_FINE = re.compile(r"[^\s\"'`,;()<>\[\]{}=:&?/@|\\]+")
_BEARER = re.compile(r"(?i)(?<![A-Za-z0-9])bearer\s+([A-Za-z0-9\-._~+/]+=*)")
_PEM = re.compile(r"-----BEGIN ([A-Z0-9 ]{1,64})-----.*?(?:-----END \1-----|\Z)", re.DOTALL)
_JWS = re.compile(
    r"(?<![A-Za-z0-9_\-.])([A-Za-z0-9_-]{4,})\.([A-Za-z0-9_-]{2,})\.([A-Za-z0-9_-]*)"
    r"(?![A-Za-z0-9_\-.])"
)


_CLEAN_TEXT_MAX = 256
_CLEAN_ENTRIES_MAX = 4096


@dataclass(frozen=True)
class _View:
    """What one scan reads; replaced whole, never changed (see ``Redactor.__init__``)."""

    digests: Mapping[bytes, str]
    word_counts: tuple[int, ...]
    header_re: re.Pattern[str] | None
    generation: int


@dataclass(frozen=True)
class _Span:
    start: int
    end: int
    kind: str
    secret: str | None


class OldRedactor:
    """Recognises secrets by digest and credentials by shape; thread-safe.

    ``credential_headers`` are header names (case-insensitive) whose values are credentials,
    typically ``DOWNSTREAM_CREDENTIAL_HEADER``.
    """

    def __init__(self, *, credential_headers: Iterable[str] = ()) -> None:
        self._inner, self._outer = _hmac_states(secrets.token_bytes(32))
        self._lock = threading.Lock()
        self._digests: dict[bytes, str] = {}
        self._by_name: dict[str, frozenset[bytes]] = {}
        self._word_counts: dict[str, frozenset[int]] = {}
        self._headers: frozenset[str] = frozenset()
        self._header_re: re.Pattern[str] | None = None
        # What a scan reads, rebuilt (never changed in place) whenever a secret or the header
        # changes, so a scan takes a reference instead of copying the digests for each string.
        self._view: _View = _View({}, (), None, 0)
        # Short texts a scan found nothing in under the current view (the fixed vocabulary of
        # event names, codes and actions recurs on every line): only texts with nothing to
        # redact, dropped whenever the view changes, so it never holds what it would replace.
        self._clean: dict[tuple[str, bool], int] = {}
        self.set_credential_headers(credential_headers)

    # -- configuration ------------------------------------------------------------------------

    def set_credential_headers(self, names: Iterable[str]) -> None:
        cleaned = frozenset(n.strip().lower() for n in names if n and n.strip())
        pattern = None
        if cleaned:
            alternatives = "|".join(re.escape(n) for n in sorted(cleaned, key=len, reverse=True))
            pattern = re.compile(
                rf"(?i)(?<![A-Za-z0-9_-])(?:{alternatives})"
                rf"[\"']?[ \t]*[:=][ \t]*[\"']?([^\"'\r\n]+)"
            )
        with self._lock:
            self._headers = cleaned
            self._header_re = pattern
            self._rebuild_view()

    def set_secret(self, name: str, value: bytes | bytearray) -> None:
        """Register (or, on rotation, replace) the digests of secret ``name``; keeps no value."""
        forms: set[bytes] = set()
        word_counts: set[int] = set()
        raw = bytes(value)
        if raw:
            forms.add(self._digest(raw))
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if raw:
            forms.update(self._digest(encoded.encode("ascii")) for encoded in _encodings(raw))
        if text is not None:
            for form, words in _natural_forms(text):
                for variant in _transformed(form):
                    forms.add(self._digest(variant.encode("utf-8", "surrogatepass")))
                if len(form) >= MIN_TOKEN_LENGTH:
                    encoded_form = form.encode("utf-8", "surrogatepass")
                    forms.update(self._digest(e.encode("ascii")) for e in _encodings(encoded_form))
                if words > 1:
                    word_counts.add(words)
        with self._lock:
            self._drop(name)
            frozen = frozenset(forms)
            self._by_name[name] = frozen
            self._word_counts[name] = frozenset(word_counts)
            for d in frozen:
                self._digests[d] = name
            self._rebuild_view()

    def remove_secret(self, name: str) -> None:
        with self._lock:
            self._drop(name)
            self._rebuild_view()

    def secret_names(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(sorted(self._by_name))

    def is_credential_field(self, key: str) -> bool:
        """True when a mapping key names the configured credential header."""
        return key.strip().lower() in self._headers

    # -- scanning -----------------------------------------------------------------------------

    def screen(self, text: str) -> str:
        """What a provider chose (a dispatch's result, a refusal's reason), with every secret
        replaced before it reaches the agent or the evidence (the registry's ``screen``); compact
        JWS shapes stay (a provider's signed effect receipt is one, and is not a secret)."""
        return self.redact(text, jws=False)[0]

    def redact(self, text: str, *, jws: bool = True) -> tuple[str, tuple[Redaction, ...]]:
        """Return ``text`` with every recognised credential replaced, and what was replaced.

        ``jws=False`` leaves compact JWS shapes alone (a provider's signed effect receipt is one,
        and is not a secret); known secrets, bearers, PEM blocks and the credential header are
        still replaced."""
        if not text:
            return text, ()
        view = self._view
        key = (text, jws)
        if self._clean.get(key) == view.generation:
            return text, ()
        spans: list[_Span] = []
        if view.digests:
            spans.extend(self._secret_spans(text, view.digests, view.word_counts))
        spans.extend(_shape_spans(text, view.header_re, jws=jws))
        if not spans:
            if len(text) <= _CLEAN_TEXT_MAX:
                with self._lock:
                    if len(self._clean) >= _CLEAN_ENTRIES_MAX:
                        self._clean.clear()
                    self._clean[key] = view.generation
            return text, ()
        merged = _merge(spans)
        out: list[str] = []
        cursor = 0
        for span in merged:
            out.append(text[cursor : span.start])
            out.append(f"[REDACTED:{span.kind}]")
            cursor = span.end
        out.append(text[cursor:])
        found = tuple(dict.fromkeys(Redaction(s.kind, s.secret) for s in merged))
        return "".join(out), found

    def _rebuild_view(self) -> None:
        """A new view of the digests, word counts and header pattern. Lock held."""
        word_counts = tuple(sorted({n for counts in self._word_counts.values() for n in counts}))
        generation = self._view.generation + 1
        self._view = _View(dict(self._digests), word_counts, self._header_re, generation)
        self._clean = {}

    def _secret_spans(
        self, text: str, digests: Mapping[bytes, str], word_counts: Sequence[int]
    ) -> Iterator[_Span]:
        for start, end in _candidates(text, word_counts):
            candidate = text[start:end]
            forms = [candidate]
            if candidate.split() != [candidate]:  # it holds whitespace (str.isspace's)
                # A secret of several words is registered single-spaced.
                forms.append(" ".join(candidate.split()))
            forms.extend(_normalised(candidate))
            for form in dict.fromkeys(forms):  # a token already in normal form is hashed once
                name = digests.get(self._digest(form.encode("utf-8", "surrogatepass")))
                if name is not None:
                    yield _Span(start, end, KIND_SECRET, name)
                    break

    def _digest(self, data: bytes) -> bytes:
        inner = self._inner.copy()
        inner.update(data)
        outer = self._outer.copy()
        outer.update(inner.digest())
        digest: bytes = outer.digest()
        return digest

    def _drop(self, name: str) -> None:
        for d in self._by_name.pop(name, frozenset()):
            if self._digests.get(d) == name:
                del self._digests[d]
        self._word_counts.pop(name, None)


def _hmac_states(key: bytes) -> tuple[Any, Any]:
    """HMAC-SHA256's (RFC 2104) inner and outer hash states after the padded key, for a key of
    at most one block. :meth:`Redactor._digest` copies them per digest: the same digests as
    ``hmac.new(key, data, sha256)`` at a third of the cost (every token of every evidence line
    is hashed, several times)."""
    padded = key.ljust(64, b"\0")
    inner = hashlib.sha256(bytes(b ^ 0x36 for b in padded))
    outer = hashlib.sha256(bytes(b ^ 0x5C for b in padded))
    return inner, outer


def _natural_forms(text: str) -> Iterator[tuple[str, int]]:
    """The forms a secret takes in a line: whole, trimmed, without a scheme, its long tokens.

    Each long form is also registered without base64 padding, which URL and header encodings drop.
    """
    forms: list[tuple[str, int]] = [(text, 1)]
    stripped = text.strip()
    if stripped:
        forms.append((stripped, 1))
    words = stripped.split()
    if len(words) > 1:
        forms.append((" ".join(words), len(words)))
        if words[0].lower() in _SCHEMES:
            forms.append((" ".join(words[1:]), len(words) - 1))
        forms.extend(
            (word, 1)
            for word in words
            if len(word) >= MIN_TOKEN_LENGTH and word.lower() not in _SCHEMES
        )
    for form, count in forms:
        yield form, count
        unpadded = form.rstrip("=")
        if unpadded != form and len(unpadded) >= MIN_TOKEN_LENGTH:
            yield unpadded, count


_ASCII_NOT_ALNUM = str.maketrans(
    "", "", "".join(c for c in map(chr, range(128)) if not c.isalnum())
)


def _squashed(text: str) -> str:
    folded = text.casefold()
    if folded.isascii():  # most tokens: one C call instead of a loop over characters
        return folded.translate(_ASCII_NOT_ALNUM)
    return "".join(ch for ch in folded if ch.isalnum())


def _transformed(form: str) -> Iterator[str]:
    """A registered form as itself, case-folded and squashed (see the module docstring)."""
    yield form
    yield form.casefold()
    squashed = _squashed(form)
    if len(squashed) >= MIN_TOKEN_LENGTH:
        yield squashed


def _normalised(candidate: str) -> list[str]:
    """The normalisations a token is hashed in besides itself: case-folded and squashed."""
    out = [candidate.casefold()]
    squashed = _squashed(candidate)
    if len(squashed) >= MIN_TOKEN_LENGTH:
        out.append(squashed)
    return out


def _encodings(raw: bytes) -> Iterator[str]:
    """The encodings a value keeps whole in: base64 and base64url (padded and not), hex, and URL
    percent-encoding with either case of escapes."""
    for encoded in (base64.b64encode(raw), base64.urlsafe_b64encode(raw)):
        text = encoded.decode("ascii")
        yield text
        yield text.rstrip("=")
    yield raw.hex()  # upper-case hex is found through case-folding
    try:
        value = raw.decode("utf-8")
    except UnicodeDecodeError:
        return
    for quoted in (quote(value, safe=""), quote_plus(value, safe="")):
        yield quoted
        yield re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(), quoted)


def _candidates(text: str, word_counts: Sequence[int]) -> Iterator[tuple[int, int]]:
    seen: set[tuple[int, int]] = set()

    def once(start: int, end: int) -> Iterator[tuple[int, int]]:
        if end > start and (start, end) not in seen:
            seen.add((start, end))
            yield start, end

    stripped_start = len(text) - len(text.lstrip())
    yield from once(stripped_start, len(text.rstrip()))
    for match in _COARSE.finditer(text):
        start, end = match.span()
        yield from once(start, end)
        # Every stretch between two delimiters of a URL/assignment-like token: the value in
        # `key=VALUE`, `user:VALUE@host`, `/path/VALUE/more` — bounded to keep scanning linear.
        cuts = [start + i for i, ch in enumerate(match.group()) if ch in _INNER_DELIMITERS]
        cuts = cuts[:_MAX_CUTS]
        starts = [start, *(c + 1 for c in cuts)]
        ends = [*cuts, end]
        for s in starts:
            for e in ends:
                yield from once(s, e)
    for match in _FINE.finditer(text):
        yield from once(*match.span())
    if word_counts:
        # Windows of consecutive tokens; the slice is whitespace-normalised before hashing.
        words = [m.span() for m in _COARSE.finditer(text)]
        for count in word_counts:
            for i in range(len(words) - count + 1):
                # Compare the whitespace-normalised window: join its words with single spaces.
                yield from once(words[i][0], words[i + count - 1][1])


def _shape_spans(
    text: str, header_re: re.Pattern[str] | None, *, jws: bool = True
) -> Iterator[_Span]:
    if "-----BEGIN " in text:
        for match in _PEM.finditer(text):
            yield _Span(match.start(), match.end(), KIND_PEM, None)
    if header_re is not None:
        for match in header_re.finditer(text):
            start = match.start(1)
            value = match.group(1).rstrip()
            if value:
                yield _Span(start, start + len(value), KIND_CREDENTIAL_HEADER, None)
    for match in _BEARER.finditer(text):
        yield _Span(*match.span(1), KIND_BEARER, None)
    if jws and "." in text:
        for match in _JWS.finditer(text):
            if _is_jws_header(match.group(1)):
                yield _Span(match.start(), match.end(), KIND_JWS, None)


def _is_jws_header(segment: str) -> bool:
    try:
        decoded = base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))
        header = json.loads(decoded)
    except (binascii.Error, ValueError):
        return False
    return isinstance(header, dict) and "alg" in header


def _merge(spans: list[_Span]) -> list[_Span]:
    ordered = sorted(spans, key=lambda s: (s.start, -s.end))
    merged: list[_Span] = []
    for span in ordered:
        if merged and span.start < merged[-1].end:
            last = merged[-1]
            kind = min(last.kind, span.kind, key=_PRIORITY.index)
            secret = last.secret if last.kind == kind else span.secret
            merged[-1] = _Span(last.start, max(last.end, span.end), kind, secret)
        else:
            merged.append(span)
    return merged


Found = tuple[str, str, str | None]
"""One redaction in a line's fields: the field path, the kind, the secret's name (or ``None``)."""


def old_clean_line(
    fields: Mapping[str, Any], redactor: OldRedactor | None
) -> tuple[dict[str, Any], list[Found]]:
    """A JSON-able, redacted copy of a line's ``fields`` (keys and values, recursively), and
    where each redaction was made; never raises on content. Integers beyond the canonical
    JSON range and non-finite floats become text, lone surrogates are replaced; without a
    redactor only that normalisation is done. The whole walk is made here, once per line
    (``evidence/chain.py`` calls it before hashing)."""
    found: list[Found] = []
    clean: dict[str, Any] = {}
    for raw_key, raw_value in fields.items():
        key = _clean_key(raw_key, redactor, found, "")
        clean[key] = _normalise(raw_value, redactor, found, key)
    return clean, found


def _clean_key(key: Any, redactor: OldRedactor | None, found: list[Found], path: str) -> str:
    text = _safe_text(str(key))
    if redactor is None:
        return text
    redacted, hits = redactor.redact(text)
    found.extend((_join(path, "<key>"), f.kind, f.secret) for f in hits)
    return redacted


def _normalise(value: Any, redactor: OldRedactor | None, found: list[Found], path: str) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if abs(value) <= MAX_SAFE_INTEGER else str(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            key = _clean_key(k, redactor, found, path)
            child = _join(path, key)
            if redactor is not None and redactor.is_credential_field(key):
                out[key] = "[REDACTED:CREDENTIAL_HEADER]"
                found.append((child, "CREDENTIAL_HEADER", None))
            else:
                out[key] = _normalise(v, redactor, found, child)
        return out
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=str) if isinstance(value, set | frozenset) else value
        return [_normalise(v, redactor, found, f"{path}[{i}]") for i, v in enumerate(items)]
    text = _safe_text(value if isinstance(value, str) else str(value))
    if redactor is None:
        return text
    redacted, hits = redactor.redact(text)
    found.extend((path, f.kind, f.secret) for f in hits)
    return redacted


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _safe_text(text: str) -> str:
    """Replace lone surrogates, which have no UTF-8 form and no canonical JSON."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


# ---------------------------------------------------------------------------------------------
# The comparison.
# ---------------------------------------------------------------------------------------------

Secrets = list[tuple[str, bytes]]


def pair(secret_values: Secrets, headers: Iterable[str] = ()) -> tuple[new.Redactor, OldRedactor]:
    """A new and an old redactor with the same secrets and credential headers registered."""
    headers = list(headers)
    fresh, old = new.Redactor(credential_headers=headers), OldRedactor(credential_headers=headers)
    for name, value in secret_values:
        fresh.set_secret(name, value)
        old.set_secret(name, value)
    return fresh, old


def same_redaction(fresh: new.Redactor, old: OldRedactor, text: str) -> None:
    for jws in (True, False):
        expected = old.redact(text, jws=jws)
        assert fresh.redact(text, jws=jws) == expected, (text, jws)
        assert fresh.redact(text, jws=jws) == expected, (text, jws)  # the clean cache's answer
    assert fresh.screen(text) == old.screen(text)


def typed(value: Any) -> Any:
    """``value`` with each leaf's type beside it, so equal-but-differently-typed leaves differ."""
    if isinstance(value, dict):
        return ("dict", [(typed(k), typed(v)) for k, v in value.items()])
    if isinstance(value, list):
        return ("list", [typed(v) for v in value])
    if isinstance(value, float) and math.isnan(value):
        return ("float", "nan")
    return (type(value).__name__, value)


def same_clean_line(fresh: new.Redactor, old: OldRedactor, fields: Mapping[str, Any]) -> None:
    expected, expected_found = old_clean_line(fields, old)
    for _ in range(2):  # the second time, what was clean comes from the clean cache
        got, got_found = new.clean_line(fields, fresh)
        assert typed(got) == typed(expected)
        assert got_found == expected_found
    expected, expected_found = old_clean_line(fields, None)
    got, got_found = new.clean_line(fields, None)
    assert typed(got) == typed(expected)
    assert got_found == expected_found == []


# -- strategies ---------------------------------------------------------------------------------

# Secrets mix what tokens are made of with characters whose case-folding or UTF-8 form changes
# their length (ß -> ss, İ -> i̇, the ligature ﬁ -> fi, final sigma), non-ASCII letters and
# digits (squashing keeps them), and the delimiters candidates are cut at.
SECRET_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.~+/=:@ßİﬁΣσςéÉ٣ǅ "
TOKEN_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

secret_texts = st.one_of(
    st.text(st.sampled_from(SECRET_CHARS), min_size=1, max_size=40),
    st.text(st.sampled_from(TOKEN_CHARS), min_size=8, max_size=48),
    st.text(st.sampled_from(TOKEN_CHARS), min_size=8, max_size=40).map(lambda t: "Bearer " + t),
    st.lists(
        st.text(st.sampled_from("abcdefghij"), min_size=2, max_size=7), min_size=2, max_size=4
    ).map(" ".join),
    st.uuids().map(str),
    st.binary(min_size=32, max_size=32).map(bytes.hex),
    st.binary(min_size=16, max_size=16).map(bytes.hex),
)
secret_value = st.one_of(
    secret_texts.map(lambda t: t.encode("utf-8")),
    st.binary(min_size=1, max_size=24),  # often not UTF-8: only its encodings are registered
)
secret_sets = st.lists(secret_value, max_size=3).map(
    lambda values: [(f"SECRET_{i}", v) for i, v in enumerate(values)]
)
header_sets = st.lists(
    st.sampled_from(["X-Provider-Key", "authorization", "sha256", "intent_id", "k"]),
    max_size=2,
)


def transformations(value: bytes) -> list[str]:
    """The forms a secret reaches a line in (the redactor's module docstring), and near misses."""
    out = [base64.b64encode(value).decode(), base64.urlsafe_b64encode(value).decode()]
    out += [out[0].rstrip("="), out[1].rstrip("="), value.hex(), value.hex().upper()]
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return out
    snake = re.sub(r"[^0-9A-Za-z]+", "_", text).upper()
    out += [
        text,
        text.upper(),
        text.lower(),
        text.swapcase(),
        text.casefold(),
        snake,
        snake.lower(),
        "  ".join(text.split()),
        "\t".join(text.split()),
        quote(text, safe=""),
        quote_plus(text, safe=""),
        re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(), quote(text, safe="")),
        text[: len(text) // 2],
        text[1:],
        text + "x",
    ]
    for word in text.split():
        out += [word, base64.b64encode(word.encode()).decode().rstrip("=")]
    return out


JWS_HEADER = base64.urlsafe_b64encode(b'{"alg":"EdDSA"}').decode().rstrip("=")
SHAPES = [
    "Bearer ",
    "bearer\t",
    "BEARER ",
    "-----BEGIN PRIVATE KEY-----\n",
    "-----END PRIVATE KEY-----",
    "-----BEGIN ",
    JWS_HEADER,
    JWS_HEADER + ".eyJhIjoxfQ.c2ln",
    "x-provider-key: ",
    "X-Provider-Key=",
    "authorization: ",
    '"sha256": "',
    "intent_id=",
    "sha256:",
    "https://user:",
    "@host/path/",
    "?key=",
    "&next=1",
]
DELIMITERS = [*"=:@/?&#.\\,;\"'`()<>[]{}| \t\n\r", "\u2003", "\x1c", "\x85", "\u3000"]


def fragments(values: Sequence[bytes]) -> st.SearchStrategy[str]:
    forms = [form for value in values for form in transformations(value)]
    choices: list[st.SearchStrategy[str]] = [
        st.sampled_from(SHAPES),
        st.sampled_from(DELIMITERS),
        st.uuids().map(str),
        st.uuids().map(lambda u: str(u).upper()),
        st.binary(min_size=32, max_size=32).map(lambda b: "sha256:" + b.hex()),
        st.binary(min_size=1, max_size=40).map(bytes.hex),
        st.text(st.sampled_from(SECRET_CHARS), max_size=10),
        st.text(max_size=6),
    ]
    if forms:
        choices.append(st.sampled_from(forms))
    return st.one_of(choices)


# -- text -----------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(secret_sets, header_sets, st.one_of(st.text(), st.text(st.characters(codec=None))))
@example([], [], "")
@example([("S", b"SSSSSSSS")], [], "\u00df\u00df\u00df\u00df")  # casefolds to a longer form
@example([("S", b"tok-12345678")], [], "x\\tok-12345678")  # a fine token, no inner delimiter
@example([("S", b"tok-12345678")], [], "key#tok-12345678")  # an inner delimiter, no fine one
def test_arbitrary_text(secret_values: Secrets, headers: list[str], text: str) -> None:
    fresh, old = pair(secret_values, headers)
    same_redaction(fresh, old, text)


@settings(max_examples=400, deadline=None)
@given(secret_sets, header_sets, st.data())
def test_text_built_from_secrets_and_shapes(
    secret_values: Secrets, headers: list[str], data: st.DataObject
) -> None:
    fresh, old = pair(secret_values, headers)
    parts = data.draw(st.lists(fragments([v for _, v in secret_values]), max_size=14))
    same_redaction(fresh, old, "".join(parts))


@settings(max_examples=150, deadline=None)
@given(secret_sets, header_sets, st.data())
def test_the_view_follows_rotation_removal_and_headers(
    secret_values: Secrets, headers: list[str], data: st.DataObject
) -> None:
    """Each change rebuilds what a scan reads (digests, lengths, windows, the header pattern):
    both redactors take the same changes between scans of the same texts."""
    fresh, old = pair(secret_values, headers)
    texts = data.draw(
        st.lists(st.lists(fragments([v for _, v in secret_values]), max_size=8).map("".join))
    )
    for _ in range(data.draw(st.integers(0, 4))):
        for text in texts:
            same_redaction(fresh, old, text)
        change = data.draw(st.sampled_from(["rotate", "add", "remove", "headers"]))
        if change == "headers":
            names = data.draw(header_sets)
            fresh.set_credential_headers(names)
            old.set_credential_headers(names)
        elif change == "remove" and secret_values:
            name = data.draw(st.sampled_from([n for n, _ in secret_values]))
            fresh.remove_secret(name)
            old.remove_secret(name)
        else:
            name = "SECRET_0" if change == "rotate" else f"ADDED_{len(texts)}"
            value = data.draw(secret_value)
            fresh.set_secret(name, value)
            old.set_secret(name, value)
            texts += [form for form in transformations(value)[:8]]
    for text in texts:
        same_redaction(fresh, old, text)


def test_a_form_longer_once_case_folded_is_still_found() -> None:
    """'ßßßß' is four characters and eight UTF-8 bytes; case-folded it is 'ssssssss', a
    registered form: a candidate is skipped for its length only when it is ASCII."""
    fresh, old = pair([("S", b"SSSSSSSS")])
    assert old.redact("x \u00df\u00df\u00df\u00df y")[0] == "x [REDACTED:SECRET] y"
    same_redaction(fresh, old, "x \u00df\u00df\u00df\u00df y")
    fresh, old = pair([("S", "ßßßßßßßß".encode())])  # 8 characters, 16 bytes
    same_redaction(fresh, old, "ssssssssssssssss")
    assert old.redact("x ßßßßßßßß y")[0] == "x [REDACTED:SECRET] y"
    same_redaction(fresh, old, "x ßßßßßßßß y")
    fresh, old = pair([("S", "éééééééé".encode())])  # folds to itself: 8 characters, 16 bytes
    assert old.redact("x éééééééé y")[0] == "x [REDACTED:SECRET] y"  # a length is in bytes
    same_redaction(fresh, old, "x éééééééé y")


def test_every_secret_lengths_count() -> None:
    """The lengths a scan hashes are those of every registered secret, kept across rotation
    and removal of the others."""
    fresh, old = pair([("A", b"short-secret-1"), ("B", b"a-much-longer-secret-value-2")])
    for text in ("x short-secret-1 y", "x a-much-longer-secret-value-2 y"):
        assert old.redact(text)[1]
        same_redaction(fresh, old, text)
    for redactor in (fresh, old):
        redactor.set_secret("A", b"rotated-to-another-length-3")
        redactor.remove_secret("B")
    for text in ("short-secret-1", "a-much-longer-secret-value-2", "rotated-to-another-length-3"):
        same_redaction(fresh, old, text)


def test_the_candidate_cuts_are_unchanged() -> None:
    value = b"tok-12345678"
    fresh, old = pair([("S", value)])
    for text in (
        "x\\tok-12345678",
        "https://user:tok-12345678@host/a/b?c=d",
        "a#tok-12345678#b",
        "=" * 20 + "tok-12345678",
        "/".join(["p"] * 20) + "/tok-12345678",  # past the bound on cuts
        "/".join(["p"] * 14) + "/tok-12345678/x",
        "#".join(["p"] * 20) + "#tok-12345678",  # '#' cuts, bounded; no fine token there
        "#".join(["p"] * 10) + "#tok-12345678#x",
        "k=tok-12345678&l=m",
    ):
        same_redaction(fresh, old, text)


def test_a_passphrase_in_any_spacing() -> None:
    fresh, old = pair([("P", b"correct horse battery staple")])
    for text in (
        "pw is correct  horse\tbattery staple, ok",
        "correct horse battery staple",
        "[correct\nhorse battery\u2003staple]",
        "correct horse battery",
    ):
        same_redaction(fresh, old, text)
    assert old.redact("a correct horse\tbattery staple")[1]


def test_the_shapes_with_either_separator() -> None:
    fresh, old = pair([], ["X-Provider-Key", "intent_id"])
    for text in (
        "X-Provider-Key=abc",
        "x-provider-key: abc",
        "intent_id='value'",
        "Authorization: BEARER abc.def",
        "\u0130 bearer xyz",
    ):
        assert old.redact(text)[1], text
        same_redaction(fresh, old, text)


def test_a_credential_header_named_by_a_key() -> None:
    fresh, old = pair([("S", b"tok-12345678")], ["X-Provider-Key"])
    fields = {"nested": {" x-provider-key": "v", "list": [{"X-PROVIDER-KEY": {"a": 1}}]}}
    assert old_clean_line(fields, old)[0]["nested"][" x-provider-key"].startswith("[REDACTED")
    same_clean_line(fresh, old, fields)


def test_lone_surrogates_in_a_line() -> None:
    fresh, old = pair([("S", b"tok-12345678")])
    same_clean_line(fresh, old, {"detail": "a\ud800b", "k\udfff": ["\ud800tok-12345678"]})


# -- the shortcuts' own proofs ------------------------------------------------------------------


def test_the_shape_prechecks_hold_for_every_code_point() -> None:
    """``_shape_spans`` runs the bearer pattern only where ``text.lower()`` holds "bearer", and
    the header pattern only where ':' or '=' is: sound because in ``re`` (as the patterns are
    compiled, case-insensitive) only the ASCII letters in either case match b, e, a and r, only
    ':' and '=' match themselves, and no other character lowers to one of those letters."""
    letters = re.compile("(?i)[bear]")
    separators = re.compile("(?i)[:=]")
    matched_letters, matched_separators, lowered = set(), set(), set()
    for code in range(0x110000):
        ch = chr(code)
        if letters.match(ch):
            matched_letters.add(ch)
        if separators.match(ch):
            matched_separators.add(ch)
        if ch not in "bearBEAR" and any(c in ch.lower() for c in "bear"):
            lowered.add(ch)
    assert matched_letters == set("bearBEAR")
    assert matched_separators == set(":=")
    assert lowered == set()


def fixed_shapes() -> st.SearchStrategy[str]:
    """UUIDs and digests, and strings that merely look like them."""
    uuids = st.uuids().map(str)
    digests = st.binary(min_size=32, max_size=32).map(lambda b: "sha256:" + b.hex())

    def near(text: str, data: st.DataObject) -> str:
        i = data.draw(st.integers(0, len(text) - 1))
        c = data.draw(st.sampled_from(["", "G", "A", "-", ":", " ", "\n", "=", "\u0660", "0"]))
        return text[:i] + c + text[i + 1 :]

    def variants(base: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            base,
            base.map(str.upper),
            base.map(lambda t: t + "\n"),
            base.map(lambda t: " " + t),
            st.tuples(base, st.data()).map(lambda pair: near(*pair)),
        )

    # the shapes' lengths, from their alphabets and a few characters that are not in them
    alphabet = st.sampled_from("0123456789abcdef" * 4 + "-:AF g=\n\u0660./#@\\")
    look_alikes = st.one_of(
        st.text(alphabet, min_size=36, max_size=36),
        st.text(alphabet, min_size=64, max_size=64).map(lambda t: "sha256:" + t),
        st.text(alphabet, min_size=71, max_size=71),
    )
    return st.one_of(variants(uuids), variants(digests), look_alikes)


@settings(max_examples=500, deadline=None)
@given(fixed_shapes(), st.sampled_from([(), (2,), (2, 3, 4)]))
@example("sha256:" + "0" * 64, (2,))
@example("00000000-0000-0000-0000-000000000000", (2,))
def test_fixed_shapes_take_the_spans_and_forms_of_the_walk(
    text: str, word_counts: tuple[int, ...]
) -> None:
    """A UUID or digest takes the spans the oracle's walk finds in it, each with the forms the
    oracle hashes for it, in order; any other text takes the walk, whose spans are the oracle's."""
    fixed = new._fixed_forms(text)
    shaped = re.fullmatch(r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}|sha256:[0-9a-f]{64}", text)
    assert (fixed is not None) == (shaped is not None)
    if fixed is None:
        assert list(new._candidates(text, word_counts)) == list(_candidates(text, word_counts))
        return
    assert [(start, end) for start, end, _ in fixed] == list(_candidates(text, word_counts))
    for start, end, forms in fixed:
        candidate = text[start:end]
        walked = [candidate]
        if candidate.split() != [candidate]:
            walked.append(" ".join(candidate.split()))
        walked.extend(_normalised(candidate))
        assert forms == tuple(dict.fromkeys(walked))


@settings(max_examples=300, deadline=None)
@given(secret_sets, header_sets, st.lists(fixed_shapes(), min_size=1, max_size=3))
def test_fixed_shapes_redact_as_before(
    secret_values: Secrets, headers: list[str], texts: list[str]
) -> None:
    fresh, old = pair(secret_values, headers)
    for text in texts:
        same_redaction(fresh, old, text)


def test_an_identifier_that_is_a_secret_is_redacted() -> None:
    identifier, digest = str(uuid.uuid4()), secrets.token_hex(32)
    fresh, old = pair([("ID", identifier.encode()), ("HEX", digest.encode()), ("W", b"sha256")])
    for text in (identifier, "sha256:" + digest, identifier.replace("-", ""), "sha256:" + "a" * 64):
        same_redaction(fresh, old, text)
    assert fresh.redact(identifier)[0] == "[REDACTED:SECRET]"
    assert fresh.redact("sha256:" + digest)[0] == "[REDACTED:SECRET]:[REDACTED:SECRET]"
    assert fresh.redact("sha256:" + "a" * 64)[0] == "[REDACTED:SECRET]:" + "a" * 64
    fresh, old = pair([], ["sha256"])  # a header named like the digest's prefix
    assert old.redact("sha256:" + digest)[0] == "sha256:[REDACTED:CREDENTIAL_HEADER]"
    same_redaction(fresh, old, "sha256:" + digest)


# -- structures -----------------------------------------------------------------------------------


class Colour(enum.StrEnum):
    RED = "red"
    TOKEN = "tok-12345678"


class Level(enum.IntEnum):
    LOW = 1


leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**60), max_value=2**60),
    st.sampled_from([MAX_SAFE_INTEGER, MAX_SAFE_INTEGER + 1, -MAX_SAFE_INTEGER - 1]),
    st.floats(),
    st.sampled_from([Colour.RED, Colour.TOKEN, Level.LOW, Decimal("1.5"), b"bytes", 1j]),
    st.text(),
    st.text(st.sampled_from("ab\ud800\udfff\u00df ")),
)


def structures(texts: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    keys = st.one_of(
        texts,
        st.text(max_size=6),
        st.integers(),
        st.none(),
        st.sampled_from(["X-Provider-Key", " authorization ", "AUTHORIZATION", Colour.TOKEN]),
    )
    return st.recursive(
        st.one_of(leaves, texts),
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.lists(children, max_size=3).map(tuple),
            st.frozensets(st.one_of(st.text(max_size=6), st.integers(), texts), max_size=3),
            st.sets(st.one_of(st.text(max_size=6), texts), max_size=3),
            st.dictionaries(keys, children, max_size=4),
        ),
        max_leaves=12,
    )


@settings(max_examples=300, deadline=None)
@given(secret_sets, header_sets, st.data())
def test_nested_structures(secret_values: Secrets, headers: list[str], data: st.DataObject) -> None:
    fresh, old = pair(secret_values, headers)
    texts = st.lists(fragments([v for _, v in secret_values]), max_size=6).map("".join)
    keys = st.one_of(texts, st.sampled_from(["detail", "X-Provider-Key", "authorization"]))
    fields = data.draw(st.dictionaries(keys, structures(texts), max_size=5))
    same_clean_line(fresh, old, fields)


# -- the lines a BLOCK and an ALLOW write ---------------------------------------------------------

# Captured from one run of the harness's workspace (a start-up, an ALLOW, a BLOCK); the
# identifiers and digests are placeholders each example fills: <uuid:n>, <digest:n>.
REAL_LINES: list[dict[str, Any]] = [
    {"check": "ROOT_UID", "detail": "effective user is root"},
    {"check": "CWD_WRITABLE", "detail": "working directory /work/wt/redact34 is writable"},
    {"check": "AGENTSAFE_ENV", "detail": "AGENTSAFE_ENV is not production"},
    {"check": "SOCKET_GUARD_ABSENT", "detail": "the process guard's self-test did not run"},
    {"principal": "legacy-caller"},
    {
        "address": "127.0.0.1",
        "port": 34415,
        "tls": False,
        "header_timeout_seconds": 10.0,
        "body_timeout_seconds": 10.0,
        "max_connections": 1024,
        "max_connections_per_source": 128,
    },
    # ALLOW: PROPOSAL_RECEIVED, DECISION, GRANT_ISSUED, GRANT_CLAIMED, OUTCOME
    {
        "intent_id": "<uuid:0>",
        "intent_hash": "<digest:0>",
        "action": "create_payout",
        "caller": "legacy-caller",
        "payload_digest": "<digest:1>",
    },
    {
        "intent_id": "<uuid:0>",
        "intent_hash": "<digest:0>",
        "decision_id": "<uuid:1>",
        "dossier_id": "<uuid:2>",
        "verdict": "ALLOW",
        "reason_codes": ["POLICY_ALLOWED"],
        "caller": "legacy-caller",
    },
    {
        "intent_id": "<uuid:0>",
        "decision_id": "<uuid:1>",
        "grant_id": "<uuid:3>",
        "payload_digest": "<digest:1>",
        "caller": "legacy-caller",
    },
    {"intent_id": "<uuid:0>", "grant_id": "<uuid:3>"},
    {
        "intent_id": "<uuid:0>",
        "decision_id": "<uuid:1>",
        "grant_id": "<uuid:3>",
        "outcome": "COMPLETED",
        "executed": True,
        "reason_codes": [],
        "finalization": "RECORDED",
        "caller": "legacy-caller",
        "effect_report": {
            "effect_evidence": "NONE",
            "record_digest": None,
            "receipt": "ABSENT",
            "receipt_digest": None,
            "receipt_reason": None,
        },
    },
    # an OUTCOME with its effect fields filled (a signed receipt, a provider's refusal)
    {
        "intent_id": "<uuid:0>",
        "decision_id": "<uuid:1>",
        "grant_id": "<uuid:3>",
        "outcome": "FAILED",
        "executed": True,
        "reason_codes": ["PROVIDER_REFUSED_422", "<text:0>"],
        "finalization": "RECORDED",
        "caller": "legacy-caller",
        "provider_error": "<text:1>",
        "effect_report": {
            "effect_evidence": "SIGNED_RECEIPT",
            "record_digest": "<digest:2>",
            "receipt": "VERIFIED",
            "receipt_digest": "<digest:3>",
            "receipt_reason": "EFFECT_RECEIPT_INVALID",
        },
    },
    # BLOCK: PROPOSAL_RECEIVED, DECISION, EXECUTION_BLOCKED
    {
        "intent_id": "<uuid:4>",
        "intent_hash": "<digest:4>",
        "action": "create_payout",
        "caller": "legacy-caller",
        "payload_digest": "<digest:5>",
    },
    {
        "intent_id": "<uuid:4>",
        "intent_hash": "<digest:4>",
        "decision_id": "<uuid:5>",
        "dossier_id": "<uuid:6>",
        "verdict": "BLOCK",
        "reason_codes": ["AMOUNT_ABOVE_POLICY"],
        "caller": "legacy-caller",
    },
    {
        "intent_id": "<uuid:4>",
        "decision_id": "<uuid:5>",
        "caller": "legacy-caller",
        "reason_codes": ["AMOUNT_ABOVE_POLICY"],
    },
]

_PLACEHOLDER = re.compile(r"<(uuid|digest|text):(\d+)>")


def filled(lines: list[dict[str, Any]], values: dict[tuple[str, int], str]) -> list[Any]:
    def fill(value: Any) -> Any:
        if isinstance(value, str):
            return _PLACEHOLDER.sub(lambda m: values[m.group(1), int(m.group(2))], value)
        if isinstance(value, dict):
            return {k: fill(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fill(v) for v in value]
        return value

    return [fill(line) for line in lines]


def identifiers(values: Sequence[bytes]) -> st.SearchStrategy[dict[tuple[str, int], str]]:
    """Fresh identifiers and digests, or ones that equal (or nearly equal) a registered secret."""
    texts = [v.decode("utf-8", "replace") for v in values]
    uuids = st.one_of(
        st.uuids().map(str),
        st.uuids().map(lambda u: str(u).upper()),
        st.uuids().map(lambda u: str(u) + "0"),
        st.uuids().map(lambda u: str(u).replace("-", "")),
        *([st.sampled_from(texts)] if texts else []),
    )
    near = [v.hex()[:64].ljust(64, "0") for v in values] + texts
    hexes = st.one_of(
        st.binary(min_size=32, max_size=32).map(bytes.hex),
        *([st.sampled_from(near)] if near else []),
    )
    digests = hexes.map(lambda h: "sha256:" + h)
    free = st.lists(fragments(values), max_size=5).map("".join)
    return st.fixed_dictionaries(
        {
            **{("uuid", i): uuids for i in range(7)},
            **{("digest", i): digests for i in range(6)},
            **{("text", i): free for i in range(2)},
        }
    )


@settings(max_examples=200, deadline=None)
@given(secret_sets, header_sets, st.data())
def test_the_lines_a_block_and_an_allow_write(
    secret_values: Secrets, headers: list[str], data: st.DataObject
) -> None:
    values = [v for _, v in secret_values]
    fresh, old = pair(secret_values, headers)
    for fields in filled(REAL_LINES, data.draw(identifiers(values))):
        same_clean_line(fresh, old, fields)


def test_a_clean_line_again_after_a_secret_is_added() -> None:
    """A key or value cleaned before (so in the clean cache) is scanned again once a secret is
    registered: the cache's entries belong to the view they were made under."""
    fresh = new.Redactor()
    fresh.set_secret("FIRST", b"first-secret-value")
    line = {"caller": "legacy-caller", "note": "later-secret-value", "later-secret-key": 1}
    for _ in range(2):
        assert new.clean_line(line, fresh) == (line, [])
    fresh.set_secret("LATER", b"later-secret-value")
    fresh.set_secret("KEY", b"later-secret-key")
    got, found = new.clean_line(line, fresh)
    assert got == {"caller": "legacy-caller", "note": "[REDACTED:SECRET]", "[REDACTED:SECRET]": 1}
    assert found == [("note", "SECRET", "LATER"), ("<key>", "SECRET", "KEY")]


def test_the_harness_workspace_redactor_on_its_lines() -> None:
    """The secrets the harness registers (a caller token, ``Bearer <32 hex>``, a PEM key):
    the 32-hex token's length is a UUID's squashed length and its hex a digest's, so those
    forms are still hashed; one line carries the token as an identifier and is redacted."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    token = secrets.token_hex(16)
    pem = ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    registered = [
        ("EXECUTOR_CALLER_TOKEN", secrets.token_urlsafe(32).encode()),
        ("DOWNSTREAM_CREDENTIAL", f"Bearer {token}".encode()),
        ("EXECUTOR_AUTHORITY_SIGNING_KEY", pem),
    ]
    fresh, old = pair(registered, ["authorization"])
    for _ in range(50):
        ids = {("uuid", i): str(uuid.uuid4()) for i in range(7)}
        ids |= {("digest", i): "sha256:" + secrets.token_hex(32) for i in range(6)}
        ids |= {("text", 0): "AMOUNT_ABOVE_POLICY", ("text", 1): "upstream said no"}
        for fields in filled(REAL_LINES, ids):
            same_clean_line(fresh, old, fields)
    squashed_uuid = str(uuid.UUID(token))
    ids[("uuid", 3)] = squashed_uuid  # the token, as a UUID: its squashed form is the token
    ids[("digest", 2)] = "sha256:" + token.encode().hex()  # the token's hex
    for fields in filled(REAL_LINES, ids):
        same_clean_line(fresh, old, fields)
    line = filled(REAL_LINES, ids)[9]
    assert new.clean_line(line, fresh)[0]["grant_id"] == "[REDACTED:SECRET]"
