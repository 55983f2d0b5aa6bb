"""What the gateway relays to its client is screened for credentials first: one truth with serve.

``serve`` screens every string a provider chose with the process's redactor
(``evidence/redact.py``: every current secret by keyed digest, in its case-folded, squashed,
base64, hex and percent-encoded forms, and credentials by shape: ``Bearer``, PEM, the
configured credential header ``name: value``) before it reaches the agent
(``dispatch/seam.py``). The gateway relays an upstream's whole answer, so the same screen reads
it (:func:`withheld_field`): every response header as ``name: value`` (a challenge's scheme
name, ``WWW-Authenticate: Bearer realm=...``, is not a token), and a body of at most
:data:`SCREENED_BODY_BYTES` as text (bytes that are not UTF-8 split tokens, so a secret among
binary bytes is still a token) and, when it is JSON with escapes, every string and key as
decoded (a secret written with ``\\u`` escapes). The redactor hashes every token, so a larger
body is left to the second check.

The second check needs no redactor: the forwarding handler looks for the exact credential
values it has just sent (:func:`echoes`), in every header and the whole body whatever its size,
as text and as decoded JSON, in their base64, base64url, hex and percent-encoded forms, case
folded: half a value (at least :data:`MIN_ECHO` characters) is an echo, which also finds a
secret cut short (the redactor does not).

The answer is then withheld whole, never edited: the client gets 502
``GATEWAY_ANSWER_WITHHELD`` with the upstream's status (so it learns the request was carried
out) and the intent hash, and the security stream one ``PROVIDER_STRING_WITHHELD`` naming the
field, never the value. An edited body would be bytes the upstream never sent, and a redaction
that misses one encoding would still leak; a refusal leaks nothing.

Callers: ``gateway/listener.py`` (every relayed answer), ``gateway/forward.py`` (the values it
sent).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final
from urllib.parse import quote

from ..canonical import parse_json
from ..egress.transport import HttpResponse
from ..errors import AgentSafeError

__all__ = ["MIN_ECHO", "SCREENED_BODY_BYTES", "Screen", "echoes", "withheld_field"]

Screen = Callable[[str], str]
"""The process's redactor as ``serve`` uses it: the text with every credential replaced."""

MIN_ECHO: Final = 8
"""The shortest run of a sent credential value that counts as an echo of it."""

SCREENED_BODY_BYTES: Final = 64 * 1024
"""The largest body the redactor reads (it hashes every token: about 6 us a byte); a larger
body is checked by :func:`echoes` only, and its headers by the redactor as always."""

_NOT_TEXT = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffd]")
# A challenge names its scheme before its parameters (``Bearer realm="api"``): not a token.
_CHALLENGE = re.compile(r"(?i)\bbearer(?=\s+[!#$%&'*+.^_`|~0-9A-Za-z-]+\s*=)")


def _strings(value: Any) -> Iterator[str]:
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            yield from item
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)


def _json(body: bytes) -> Any:
    """The body as JSON when it is JSON with an escape in it (else its text says it all)."""
    if b"\\" not in body:
        return None
    try:
        return parse_json(body)
    except (ValueError, RecursionError, AgentSafeError):
        return None


def _header_texts(response: HttpResponse) -> Iterator[tuple[str, str]]:
    for name, value in response.headers.items():
        lowered = name.lower()
        if lowered in ("www-authenticate", "proxy-authenticate"):
            value = _CHALLENGE.sub("", value)
        yield f"header:{lowered}", f"{name}: {value}"


def _body_text(body: bytes) -> str:
    return _NOT_TEXT.sub(" ", body.decode("utf-8", errors="replace"))


def withheld_field(response: HttpResponse, screen: Screen) -> str | None:
    """The first field of ``response`` in which ``screen`` finds a credential, or ``None``:
    every header as ``name: value``; a body up to :data:`SCREENED_BODY_BYTES` as text and, when
    it is JSON with escapes, each string and key as decoded. CPU-bound: run it in a thread."""
    for name, text in _header_texts(response):
        if screen(text) != text:
            return name
    body = response.body
    if not body or len(body) > SCREENED_BODY_BYTES:
        return None
    text = _body_text(body)
    if screen(text) != text:
        return "body"
    document = _json(body)
    if document is not None and any(screen(t) != t for t in _strings(document)):
        return "body"
    return None


def _forms(value: str) -> Iterator[str]:
    """``value`` as an answer may carry it: itself and base64, base64url, hex, percent-encoded."""
    raw = value.encode("utf-8", "surrogatepass")
    yield value
    for encoded in (base64.b64encode(raw), base64.urlsafe_b64encode(raw)):
        yield encoded.decode("ascii").rstrip("=")
    yield raw.hex()
    yield quote(value, safe="")


def _holds_half_of(form: str, text: str) -> bool:
    """Whether ``text`` holds a run of ``form`` of half its length (at least :data:`MIN_ECHO`).

    Anchors of length ``a`` every ``h - a + 1`` characters (and one at the end) put a whole
    anchor inside every run of length ``h``; each anchor found is extended to a full run."""
    size = len(form)
    h = max(MIN_ECHO, size // 2)
    if size < h:
        return False
    a = max(MIN_ECHO, h // 2)
    step = h - a + 1
    offsets = sorted({*range(0, size - a + 1, step), size - a})
    for o in offsets:
        anchor = form[o : o + a]
        p = text.find(anchor)
        while p != -1:
            for start in range(max(0, o + a - h), min(o, size - h) + 1):
                at = p - (o - start)
                if at >= 0 and text[at : at + h] == form[start : start + h]:
                    return True
            p = text.find(anchor, p + 1)
    return False


def echoes(response: HttpResponse, sent: Iterable[str]) -> str | None:
    """The first field of ``response`` holding half of a value in ``sent`` (each word of the
    credential headers' values at least :data:`MIN_ECHO` long), in any of its :func:`_forms`,
    case-insensitively; or ``None``. Linear in the answer's size, whatever its size."""
    forms = {
        form.casefold()
        for value in sent
        for word in value.split()
        if len(word) >= MIN_ECHO
        for form in _forms(word)
    }
    if not forms:
        return None
    texts = list(_header_texts(response))
    if response.body:
        texts.append(("body", _body_text(response.body)))
        document = _json(response.body)
        if document is not None:
            texts.append(("body", json.dumps(document, ensure_ascii=False)))
    for name, text in texts:
        folded = text.casefold()
        if any(_holds_half_of(form, folded) for form in forms):
            return name
    return None
