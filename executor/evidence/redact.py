"""The redactor every line passes before it leaves the process.

It holds no secret value. For each current secret it keeps keyed SHA-256 digests (HMAC-SHA256
under a random per-process key) of the value and of its natural token forms; a line is scanned by
hashing its tokens and comparing digests, so a whole secret value that reaches a line is found
without the redactor ever being able to print one. It also keeps the UTF-8 lengths of those
forms (lengths, not values): a token's form of any other length cannot have a registered digest,
so a scan does not hash it, and the digests it does compare find exactly what hashing every form
would (``tests/evidence/test_redact_differential.py`` holds the scan to the one before issue 34).

A secret also reaches a line transformed, by a provider that reflects it or by code that
normalises what it reports (the forward handler reduces a provider's refusal to UPPER_SNAKE), so
each form is registered in the transformations that keep it whole, and each token is hashed in
the same normalisations:

* case-folded (``str.casefold``), and *squashed*: case-folded with everything but letters and
  digits removed, so ``BEARER_ABC_123`` is ``Bearer abc-123`` (forms of at least
  ``MIN_TOKEN_LENGTH`` once squashed);
* encoded: base64 and base64url (padded and not), hex, and URL percent-encoding (``quote`` and
  ``quote_plus``, either case of the escapes) of the value and of each form.

What is not recognised: a secret cut short or spliced into a longer value before encoding
(``base64("user:" + secret)``), and a transformation not listed here; a bound on what a provider
may choose (``dispatch/seam.py``) is the other half of that defence.

Independently of the secrets it knows, it recognises credentials by shape: ``Bearer <token>``,
PEM blocks, compact JWS and the configured downstream credential header (``<name>: <value>``).

A redaction replaces the value with ``[REDACTED:<kind>]`` and never stops the line; the caller
reports it (``LEAK_SUSPECTED`` on the security stream) naming the kind and where, never the value.

Callers: ``evidence/chain.py`` (``ChainedSink``: every string field of every chained line,
before hashing), ``evidence/bundle.py`` (``export_bundle``: free text), ``serve.py`` (installs
:class:`RedactingLogFilter` on the operational logs, and has the secret store call
:meth:`Redactor.set_secret` on load and on rotation); the seam's registry screens what providers
chose with :meth:`Redactor.screen` (``assembly.py`` hands it over).
Also imported by ``plane.py``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import math
import re
import secrets
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, quote_plus

from ..canonical import MAX_SAFE_INTEGER

__all__ = [
    "KIND_BEARER",
    "KIND_CREDENTIAL_HEADER",
    "KIND_JWS",
    "KIND_PEM",
    "KIND_SECRET",
    "RedactingLogFilter",
    "Redaction",
    "Redactor",
    "clean_line",
]

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
# What lets a text have more candidates than its coarse tokens: an inner delimiter, and the
# characters _FINE stops at and _COARSE does not (see ``_candidates``).
_HAS_INNER = re.compile("[" + re.escape("".join(sorted(_INNER_DELIMITERS))) + "]")
_HAS_FINE_ONLY = re.compile(r"[=:/@\\]")
_BEARER = re.compile(r"(?i)(?<![A-Za-z0-9])bearer\s+([A-Za-z0-9\-._~+/]+=*)")
# The executor's own identifiers and digests, on every line (``_fixed_forms``).
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_SHA256 = re.compile(r"sha256:[0-9a-f]{64}")
_PEM = re.compile(r"-----BEGIN ([A-Z0-9 ]{1,64})-----.*?(?:-----END \1-----|\Z)", re.DOTALL)
_JWS = re.compile(
    r"(?<![A-Za-z0-9_\-.])([A-Za-z0-9_-]{4,})\.([A-Za-z0-9_-]{2,})\.([A-Za-z0-9_-]*)"
    r"(?![A-Za-z0-9_\-.])"
)


@dataclass(frozen=True)
class Redaction:
    """One thing the redactor replaced: its kind and, for a known secret, the secret's name."""

    kind: str
    secret: str | None = None


_CLEAN_TEXT_MAX = 256
_CLEAN_ENTRIES_MAX = 4096


@dataclass(frozen=True)
class _View:
    """What one scan reads; replaced whole, never changed (see ``Redactor.__init__``)."""

    digests: Mapping[bytes, str]
    word_counts: tuple[int, ...]
    header_re: re.Pattern[str] | None
    generation: int
    # The UTF-8 lengths of every registered form, and the least of them: a form of another
    # length cannot have a registered digest, so it is not hashed (see ``_secret_spans``).
    lengths: frozenset[int] = frozenset()
    min_length: int = 0


@dataclass(frozen=True)
class _Span:
    start: int
    end: int
    kind: str
    secret: str | None


class Redactor:
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
        self._lengths: dict[str, frozenset[int]] = {}
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
        lengths: set[int] = set()  # of every form digested: a scan hashes no form of another

        def register(data: bytes) -> None:
            forms.add(self._digest(data))
            lengths.add(len(data))

        word_counts: set[int] = set()
        raw = bytes(value)
        if raw:
            register(raw)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if raw:
            for encoded in _encodings(raw):
                register(encoded.encode("ascii"))
        if text is not None:
            for form, words in _natural_forms(text):
                for variant in _transformed(form):
                    register(variant.encode("utf-8", "surrogatepass"))
                if len(form) >= MIN_TOKEN_LENGTH:
                    encoded_form = form.encode("utf-8", "surrogatepass")
                    for e in _encodings(encoded_form):
                        register(e.encode("ascii"))
                if words > 1:
                    word_counts.add(words)
        with self._lock:
            self._drop(name)
            frozen = frozenset(forms)
            self._by_name[name] = frozen
            self._word_counts[name] = frozenset(word_counts)
            self._lengths[name] = frozenset(lengths)
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
            spans.extend(self._secret_spans(text, view))
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
        lengths = frozenset(n for each in self._lengths.values() for n in each)
        generation = self._view.generation + 1
        self._view = _View(
            dict(self._digests),
            word_counts,
            self._header_re,
            generation,
            lengths,
            min(lengths, default=0),
        )
        self._clean = {}

    def _secret_spans(self, text: str, view: _View) -> Iterator[_Span]:
        """Each candidate's forms are hashed in order and the first registered one names it.

        A form is hashed only if its UTF-8 length is one a registered form has: a digest of any
        other length is not in ``view.digests``, so skipping it finds the same name (the first
        form that matches is still the first). An ASCII candidate shorter than every registered
        form is skipped whole: each of its forms (itself, single-spaced, case-folded, squashed)
        is ASCII and no longer than it."""
        digests, lengths = view.digests, view.lengths
        fixed = _fixed_forms(text)
        if fixed is not None:
            # The same candidates and forms, in the same order, as the walk below (ASCII: a
            # form's length is its UTF-8 length), without building them from the text.
            shortest = view.min_length
            for start, end, shaped in fixed:
                if end - start < shortest:
                    continue
                for form in shaped:
                    if len(form) not in lengths:
                        continue
                    name = digests.get(self._digest(form.encode("ascii")))
                    if name is not None:
                        yield _Span(start, end, KIND_SECRET, name)
                        break
            return
        shortest = view.min_length if text.isascii() else 0
        for start, end in _candidates(text, view.word_counts):
            if end - start < shortest:
                continue
            candidate = text[start:end]
            forms = [candidate]
            if candidate.split() != [candidate]:  # it holds whitespace (str.isspace's)
                # A secret of several words is registered single-spaced.
                forms.append(" ".join(candidate.split()))
            forms.extend(_normalised(candidate))
            for form in dict.fromkeys(forms):  # a token already in normal form is hashed once
                data = form.encode("utf-8", "surrogatepass")
                if len(data) not in lengths:
                    continue
                name = digests.get(self._digest(data))
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
        self._lengths.pop(name, None)


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


def _fixed_forms(text: str) -> tuple[tuple[int, int, tuple[str, ...]], ...] | None:
    """For a UUID or a ``sha256:`` digest in lower-case hex, alone: each span the walk
    (:func:`_candidates`) would take in it, with the forms ``_secret_spans`` would hash for the
    span, both in the walk's order; ``None`` for any other text.

    Written out because these are most of the text a line brings that the clean cache has not
    seen (each request mints its own identifiers and digests; issue 34), and both follow from the
    shape. A UUID is one token; a digest is one token cut at its ``:`` (the whole, the text
    before, the text after); neither has whitespace, so no window of several words. Lower-case
    hex, ``-`` and ``:`` are unchanged by case-folding, so a span's forms are itself and its
    squashed form (``-`` and ``:`` removed) when that differs and has at least
    :data:`MIN_TOKEN_LENGTH` characters (``sha256`` alone has six). The forms are hashed as any
    other text's, so an identifier that is a secret is still redacted;
    ``tests/evidence/test_redact_differential.py`` holds spans and forms to the walk's."""
    if len(text) == 36 and _UUID.fullmatch(text) is not None:
        return ((0, 36, (text, text.replace("-", ""))),)
    if len(text) == 71 and _SHA256.fullmatch(text) is not None:
        digest = text[7:]
        return ((0, 71, (text, "sha256" + digest)), (0, 6, ("sha256",)), (7, 71, (digest,)))
    return None


def _candidates(text: str, word_counts: Sequence[int]) -> Iterable[tuple[int, int]]:
    """The spans a scan hashes, each once, in the order first found (a dict keeps it). A UUID
    or a ``sha256:`` digest never reaches it (:func:`_fixed_forms`)."""
    spans: dict[tuple[int, int], None] = {}
    stripped_start = len(text) - len(text.lstrip())
    stripped_end = len(text.rstrip())
    if stripped_end > stripped_start:
        spans[stripped_start, stripped_end] = None
    # A text with no inner delimiter has no cuts; one without the characters only _FINE stops
    # at has the same fine tokens as coarse ones (both are the maximal runs of what they take).
    inner = _HAS_INNER.search(text) is not None
    words: list[tuple[int, int]] = []
    for match in _COARSE.finditer(text):
        start, end = span = match.span()
        words.append(span)
        spans[span] = None  # a key already there keeps its place
        if inner:
            # Every stretch between two delimiters of a URL/assignment-like token: the value in
            # `key=VALUE`, `user:VALUE@host`, `/path/VALUE/more` — bounded to keep scanning linear.
            cuts = [m.start() for m in _HAS_INNER.finditer(text, start, end)][:_MAX_CUTS]
            starts = [start, *(c + 1 for c in cuts)]
            ends = [*cuts, end]
            for s in starts:
                for e in ends:
                    if e > s:
                        spans[s, e] = None
    if _HAS_FINE_ONLY.search(text) is not None:
        for match in _FINE.finditer(text):
            spans[match.span()] = None
    # Windows of consecutive tokens; the slice is whitespace-normalised before hashing.
    for count in word_counts:
        for i in range(len(words) - count + 1):
            spans[words[i][0], words[i + count - 1][1]] = None
    return spans


def _shape_spans(
    text: str, header_re: re.Pattern[str] | None, *, jws: bool = True
) -> Iterator[_Span]:
    if "-----BEGIN " in text:
        for match in _PEM.finditer(text):
            yield _Span(match.start(), match.end(), KIND_PEM, None)
    # Each recogniser below runs only where its literal part can be: the header pattern needs a
    # ':' or '=', and "(?i)bearer" matches nothing that lower() does not turn into "bearer"
    # (only ASCII letters case-fold to b, e, a or r in ``re``; the differential test checks
    # every code point).
    if header_re is not None and (":" in text or "=" in text):
        for match in header_re.finditer(text):
            start = match.start(1)
            value = match.group(1).rstrip()
            if value:
                yield _Span(start, start + len(value), KIND_CREDENTIAL_HEADER, None)
    if "bearer" in text.lower():
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


class RedactingLogFilter(logging.Filter):
    """Applies a :class:`Redactor` to operational log records; never drops a record.

    Attach it to the *handler* (not a logger) so records from every logger pass it. The message
    is formatted with its arguments, redacted, and stored back without arguments; exception and
    stack text are formatted and redacted too. ``on_redaction`` (typically raising
    ``LEAK_SUSPECTED`` on the security stream) receives what was found, never the value.
    """

    def __init__(
        self,
        redactor: Redactor,
        *,
        on_redaction: Callable[[tuple[Redaction, ...]], None] | None = None,
    ) -> None:
        super().__init__()
        self._redactor = redactor
        self._on_redaction = on_redaction
        self._formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        found: list[Redaction] = []
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: keep the template only
            message = str(record.msg)
        redacted, hits = self._redactor.redact(message)
        found.extend(hits)
        record.msg = redacted
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = self._formatter.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text, hits = self._redactor.redact(record.exc_text)
            found.extend(hits)
        if record.stack_info:
            record.stack_info, hits = self._redactor.redact(record.stack_info)
            found.extend(hits)
        if found and self._on_redaction is not None:
            self._on_redaction(tuple(dict.fromkeys(found)))
        return True


Found = tuple[str, str, str | None]
"""One redaction in a line's fields: the field path, the kind, the secret's name (or ``None``)."""


def clean_line(
    fields: Mapping[str, Any], redactor: Redactor | None
) -> tuple[dict[str, Any], list[Found]]:
    """A JSON-able, redacted copy of a line's ``fields`` (keys and values, recursively), and
    where each redaction was made; never raises on content. Integers beyond the canonical
    JSON range and non-finite floats become text, lone surrogates are replaced; without a
    redactor only that normalisation is done. The whole walk is made here, once per line
    (``evidence/chain.py`` calls it before hashing)."""
    found: list[Found] = []
    clean: dict[str, Any] = {}
    # A top-level key or string value the clean cache holds for the current view is taken as it
    # stands: it is what ``_clean_key`` and ``_text`` would return for it (ASCII: no surrogate
    # to repair; clean: nothing to redact) without their calls (issue 34: a line's keys and most
    # of its values are the same on every request). The cache is read before the view, and a
    # new view replaces the view first and then the cache, so an entry of an older view never
    # passes for the current one. Without a redactor nothing is cached: every field is walked.
    cache: Mapping[tuple[str, bool], int] = {} if redactor is None else redactor._clean
    generation = -1 if redactor is None else redactor._view.generation
    for raw_key, raw_value in fields.items():
        if type(raw_key) is str and raw_key.isascii() and cache.get((raw_key, True)) == generation:
            key = raw_key
        else:
            key = _clean_key(raw_key, redactor, found, "")
        ascii_text = type(raw_value) is str and raw_value.isascii()
        if ascii_text and cache.get((raw_value, True)) == generation:
            clean[key] = raw_value
        else:
            clean[key] = _normalise(raw_value, redactor, found, key)
    return clean, found


def _clean_key(key: Any, redactor: Redactor | None, found: list[Found], path: str) -> str:
    text = _safe_text(str(key))
    if redactor is None:
        return text
    redacted, hits = redactor.redact(text)
    if hits:
        found.extend((_join(path, "<key>"), f.kind, f.secret) for f in hits)
    return redacted


def _normalise(value: Any, redactor: Redactor | None, found: list[Found], path: str) -> Any:
    # The exact types a line holds take their branch first; each is the branch the tests below
    # would choose (a str, dict or list is no None, bool, int or float; bool has no subclass).
    kind = type(value)
    if kind is str:
        return _text(value, redactor, found, path)
    if value is None or kind is bool:
        return value
    if kind is dict:
        return _mapping(value, redactor, found, path)
    if kind is list:
        return [_normalise(v, redactor, found, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, int):
        return value if abs(value) <= MAX_SAFE_INTEGER else str(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        return _mapping(value, redactor, found, path)
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=str) if isinstance(value, set | frozenset) else value
        return [_normalise(v, redactor, found, f"{path}[{i}]") for i, v in enumerate(items)]
    return _text(value if isinstance(value, str) else str(value), redactor, found, path)


def _mapping(
    value: Mapping[Any, Any], redactor: Redactor | None, found: list[Found], path: str
) -> dict[str, Any]:
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


def _text(value: str, redactor: Redactor | None, found: list[Found], path: str) -> str:
    text = _safe_text(value)
    if redactor is None:
        return text
    redacted, hits = redactor.redact(text)
    if hits:
        found.extend((path, f.kind, f.secret) for f in hits)
    return redacted


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _safe_text(text: str) -> str:
    """Replace lone surrogates, which have no UTF-8 form and no canonical JSON."""
    if type(text) is str and text.isascii():  # no surrogate: as it is, without an encoded copy
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text
