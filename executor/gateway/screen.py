"""What the gateway relays to its client is screened for credentials first: one truth with serve.

``serve`` screens every string a provider chose with the process's redactor
(``evidence/redact.py``: every current secret by keyed digest, in its case-folded, squashed,
base64, hex and percent-encoded forms, and credentials by shape: ``Bearer``, PEM, the
configured credential header ``name: value``) before it reaches the agent
(``dispatch/seam.py``). The gateway relays an upstream's whole answer, so the same screen reads
all of it (:func:`withheld_field`): every response header as ``name: value``, the body as text
(bytes that are not UTF-8 split tokens, so a secret among binary bytes is still a token), and,
when the body is JSON, every string and key as decoded (a secret written with ``\\u`` escapes).

What the redactor cannot see, a secret cut short, the forwarding handler checks against the
exact credential values it sent with this request (:func:`echoes`): any run of half a value
(at least :data:`MIN_ECHO`) in the answer's bytes or decoded JSON strings.

The answer is then withheld whole, never edited: the client gets 502
``GATEWAY_ANSWER_WITHHELD`` with the upstream's status (so it learns the request was carried
out) and the intent hash, and the security stream one ``PROVIDER_STRING_WITHHELD`` naming the
field, never the value. An edited body would be bytes the upstream never sent, and a redaction
that misses one encoding would still leak; a refusal leaks nothing.

Callers: ``gateway/listener.py`` (every relayed answer), ``gateway/forward.py`` (the values it
sent).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final

from ..canonical import parse_json
from ..egress.transport import HttpResponse
from ..errors import AgentSafeError

__all__ = ["MIN_ECHO", "Screen", "echoes", "withheld_field"]

Screen = Callable[[str], str]
"""The process's redactor as ``serve`` uses it: the text with every credential replaced."""

MIN_ECHO: Final = 8
"""The shortest run of a sent credential value that counts as an echo of it."""

_NOT_TEXT = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffd]")


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


def _texts(response: HttpResponse) -> Iterator[tuple[str, str]]:
    """(field, text) for every part of an answer a client would read."""
    for name, value in response.headers.items():
        yield f"header:{name.lower()}", f"{name}: {value}"
    if not response.body:
        return
    yield "body", _NOT_TEXT.sub(" ", response.body.decode("utf-8", errors="replace"))
    try:
        document = parse_json(response.body)
    except (ValueError, RecursionError, AgentSafeError):
        return
    for text in _strings(document):
        yield "body", text


def withheld_field(response: HttpResponse, screen: Screen) -> str | None:
    """The first field of ``response`` in which ``screen`` finds a credential, or ``None``."""
    for name, text in _texts(response):
        if screen(text) != text:
            return name
    return None


def _runs(value: str) -> Iterator[str]:
    """Every run of half of ``value`` (at least :data:`MIN_ECHO` characters)."""
    size = max(MIN_ECHO, len(value) // 2)
    for start in range(len(value) - size + 1):
        yield value[start : start + size]


def echoes(response: HttpResponse, sent: Iterable[str]) -> str | None:
    """The first field of ``response`` holding a run of a value in ``sent`` (the credential
    headers' values, each word of them at least :data:`MIN_ECHO` long), or ``None``."""
    runs = {
        run
        for value in sent
        for word in value.split()
        if len(word) >= MIN_ECHO
        for run in _runs(word)
    }
    if not runs:
        return None
    for name, text in _texts(response):
        folded = text.casefold()
        if any(run in text or run.casefold() in folded for run in runs):
            return name
    return None
