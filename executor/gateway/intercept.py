"""What the gateway captures from one HTTP request, and what it refuses before capturing.

Pure functions, no I/O. :func:`refusal_for` refuses, with a code, what cannot be bound to an
intent: a protocol upgrade (``Upgrade``, ``Connection: upgrade``, ``CONNECT``), a streaming body
(``Transfer-Encoding`` of any kind: its length is not known before it is read), and a declared
body over :data:`MAX_BODY_BYTES`. The framing attacks (``Content-Length`` with
``Transfer-Encoding``, duplicate ``Content-Length``, folded headers) never reach here: aiohttp's
llhttp parser refuses them, and the executor's listener answers with ``HTTP_MALFORMED``
(``routes/listener.py``, as for ``serve``).

:func:`capture` is the intent's parameters: the method, the path, the query string, the SHA-256
of the body bytes, and the body parsed as JSON when it is a JSON document (else ``null``; the
digest binds it either way). :func:`forwardable_headers` is what is sent on: the client's headers
without the hop-by-hop ones and without anything the executor writes itself (its content type is
kept: it describes the bytes forwarded).

Callers: ``gateway/listener.py``, ``gateway/forward.py``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

from ..canonical import canonical_json
from ..codes import Code
from ..errors import CanonicalizationError
from ..headers import is_reserved
from ..intent import MAX_BODY_BYTES

__all__ = [
    "HOP_BY_HOP",
    "MAX_BODY_BYTES",
    "READ_METHODS",
    "WRITE_METHODS",
    "body_digest",
    "capture",
    "forwardable_headers",
    "refusal_for",
    "response_headers",
]

WRITE_METHODS: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})
READ_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})
HOP_BY_HOP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)


def refusal_for(method: str, headers: Iterable[tuple[str, str]]) -> Code | None:
    """The code refusing this request before its body is read, or ``None``."""
    lowered = [(name.lower(), value) for name, value in headers]
    names = {name for name, _ in lowered}
    connection = ",".join(v.lower() for n, v in lowered if n == "connection")
    if method == "CONNECT" or "upgrade" in names or "upgrade" in connection:
        return Code.GATEWAY_UPGRADE_REFUSED
    if method not in WRITE_METHODS | READ_METHODS:
        return Code.GATEWAY_METHOD_REFUSED
    if "transfer-encoding" in names:
        return Code.GATEWAY_STREAMING_REFUSED
    lengths = [v for n, v in lowered if n == "content-length"]
    if lengths:
        value = lengths[0].strip()
        if not value.isdigit():
            return Code.HTTP_MALFORMED
        if int(value) > MAX_BODY_BYTES:
            return Code.GATEWAY_BODY_TOO_LARGE
    return None


def body_digest(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


def _json_body(body: bytes, content_type: str | None) -> Any:
    if not body or content_type is None:
        return None
    media = content_type.split(";", 1)[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        return None
    try:
        value = json.loads(body)
        canonical_json(value)  # only what has one canonical form is a parameter
    except (ValueError, UnicodeDecodeError, CanonicalizationError, RecursionError):
        return None
    return value


def capture(
    *, method: str, path: str, query: str, body: bytes, content_type: str | None
) -> dict[str, Any]:
    """The intent's parameters for one request (see the module docstring)."""
    return {
        "method": method,
        "path": path,
        "query": query,
        "body_digest": body_digest(body),
        "body": _json_body(body, content_type),
    }


def forwardable_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The client's end-to-end headers (first value of each, comma-joined if repeated)."""
    out: dict[str, str] = {}
    for name, value in headers:
        key = name.lower()
        if key in HOP_BY_HOP or (is_reserved(key) and key != "content-type"):
            continue
        out[key] = f"{out[key]}, {value}" if key in out else value
    return out


def response_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The upstream's response headers a client may see (no hop-by-hop, no framing)."""
    return {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP}
