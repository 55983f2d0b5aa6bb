"""What the gateway captures from one HTTP request, and what it refuses before capturing.

Pure functions, no I/O. :func:`refusal_for` refuses, with a code, what cannot be bound to an
intent: a protocol upgrade (``Upgrade``, ``Connection: upgrade``, ``CONNECT``), a method-override
header (:data:`METHOD_OVERRIDE_HEADERS`: the policy judges the method the request line names, and
nothing else may name another), a streaming body (``Transfer-Encoding`` of any kind: its length
is not known before it is read), and a declared body over :data:`MAX_BODY_BYTES`. The framing
attacks (``Content-Length`` with ``Transfer-Encoding``, duplicate ``Content-Length``, folded
headers) never reach here: aiohttp's llhttp parser refuses them, and the executor's listener
answers with ``HTTP_MALFORMED`` (``routes/listener.py``, as for ``serve``).

:func:`normalised_path` is the one path the policy judges and the upstream receives (escapes
of unreserved characters decoded, RFC 3986 section 6.2.2), or ``None`` for a target that could
mean another path to another server (refused: an escaped separator, a dot or empty segment, a
backslash, a path parameter). :func:`read_body` reads the body as the policy reads it: JSON by
the one strict parser whatever the media type, or :data:`UNREADABLE` (refused, never judged as
``null``). :func:`overrides_method` finds the ``_method`` convention in the query or the body.

:func:`capture` is the intent's parameters: the method, the normalised path, the query string,
the SHA-256 of the body bytes, and the body as read. :func:`forwardable_headers` is what is sent
on: the client's headers without the hop-by-hop ones (the standard set and every header its
``Connection`` names, RFC 9110 section 7.6.1) and without anything the executor writes itself
(its content type is kept: it describes the bytes forwarded); :func:`response_headers` the same
for the upstream's answer.

Callers: ``gateway/listener.py``, ``gateway/forward.py``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final
from urllib.parse import unquote_plus

from ..canonical import canonical_json, parse_json
from ..codes import Code
from ..errors import CanonicalizationError
from ..headers import TRACE_HEADERS, is_reserved
from ..intent import MAX_BODY_BYTES

__all__ = [
    "HOP_BY_HOP",
    "MAX_BODY_BYTES",
    "METHOD_OVERRIDE_HEADERS",
    "READ_METHODS",
    "UNREADABLE",
    "WRITE_METHODS",
    "body_digest",
    "capture",
    "forwardable_headers",
    "normalised_path",
    "overrides_method",
    "read_body",
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
METHOD_OVERRIDE_HEADERS: Final = frozenset(
    {"x-http-method-override", "x-http-method", "x-method-override"}
)
"""Headers some frameworks read as the request's real method: refused, never forwarded."""
_METHOD_FIELD = "_method"  # the query/form convention (Rails, Laravel, Symfony)

_UNRESERVED: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
# RFC 3986 pchar without ";" (a path parameter: Tomcat and Spring strip "/..;/" to "/../"),
# plus "/" and the "%" of an escape.
_PATH_CHARS: Final = _UNRESERVED | frozenset("!$&'()*+,=:@/%")
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")


def refusal_for(method: str, headers: Iterable[tuple[str, str]]) -> Code | None:
    """The code refusing this request before its body is read, or ``None``."""
    lowered = [(name.lower(), value) for name, value in headers]
    names = {name for name, _ in lowered}
    connection = ",".join(v.lower() for n, v in lowered if n == "connection")
    if method == "CONNECT" or "upgrade" in names or "upgrade" in connection:
        return Code.GATEWAY_UPGRADE_REFUSED
    if method not in WRITE_METHODS | READ_METHODS:
        return Code.GATEWAY_METHOD_REFUSED
    if names & METHOD_OVERRIDE_HEADERS:
        return Code.GATEWAY_METHOD_OVERRIDE_REFUSED
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


def normalised_path(target: str) -> str | None:
    """The one path the policy judges and the upstream receives, or ``None`` when the request
    target is ambiguous (refused, ``GATEWAY_PATH_AMBIGUOUS``).

    Normalised (RFC 3986 section 6.2.2): an escape of an unreserved character is decoded
    (``/%61dmin`` is ``/admin``) and every other escape is written in upper case. Ambiguous: a
    target that is not origin-form (``/...``), a character outside RFC 3986's ``pchar`` (a
    backslash, a space, a raw non-ASCII byte) or ``;`` (a path parameter), a malformed escape,
    an escaped ``/``, ``\\``, ``%`` or control character, an empty segment (``//``) and a dot
    segment (``.`` or ``..``, escaped or not): each means different paths to different servers.
    """
    path = target.split("?", 1)[0].split("#", 1)[0]
    if not path.startswith("/") or any(c not in _PATH_CHARS for c in path):
        return None
    if _ESCAPE.sub("", path).count("%"):
        return None  # a "%" that does not start an escape of two hex digits

    def escape(match: re.Match[str]) -> str:
        char = chr(int(match.group(1), 16))
        return char if char in _UNRESERVED else f"%{match.group(1).upper()}"

    normal = _ESCAPE.sub(escape, path)
    lowered = normal.lower()
    if any(f"%{c:02x}" in lowered for c in (*range(0x20), 0x7F, 0x2F, 0x5C, 0x25)):
        return None
    segments = normal.split("/")[1:]
    for n, segment in enumerate(segments):
        if segment in (".", "..") or (segment == "" and n < len(segments) - 1):
            return None
    return normal


UNREADABLE: Final = object()
"""What :func:`read_body` returns for a body the policy could not read."""


_FIELD_MEDIA: Final = ("application/x-www-form-urlencoded", "multipart/")


def read_body(body: bytes, content_type: str | None = None) -> Any:
    """The body as the policy reads it: ``None`` when empty, else the JSON document read by the
    project's one strict parser (``canonical.parse_json``) whatever the declared media type (an
    upstream may read JSON sent as ``text/plain``), and only when it has one canonical form (no
    duplicate key, no number beyond I-JSON); anything else is :data:`UNREADABLE` and the
    request is refused (``GATEWAY_BODY_UNREADABLE``): never judged as if it had no body. A body
    declared as form fields (form-encoded, multipart) is unreadable even when it parses as JSON:
    the upstream reads fields out of it that the policy would not see (the JSON string
    ``"x&amountMinor=900000"`` is a form with an ``amountMinor``)."""
    if not body:
        return None
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media.startswith(_FIELD_MEDIA):
        return UNREADABLE
    try:
        value = parse_json(body)
        canonical_json(value)  # only what has one canonical form is a parameter
    except (ValueError, CanonicalizationError, RecursionError):
        return UNREADABLE
    return value


def overrides_method(query: str, body: Any) -> bool:
    """Whether the query string or the JSON body carries the ``_method`` override convention."""
    # "&" and ";" both separate parameters for some servers; a name is compared decoded.
    fields = [unquote_plus(part.split("=", 1)[0]) for part in re.split(r"[&;]", query)]
    if isinstance(body, dict):
        fields.extend(body)
    return any(name.strip().casefold() == _METHOD_FIELD for name in fields)


def capture(*, method: str, path: str, query: str, body: bytes, value: Any) -> dict[str, Any]:
    """The intent's parameters for one request (see the module docstring); ``value`` is
    :func:`read_body`'s reading of ``body``."""
    return {
        "method": method,
        "path": path,
        "query": query,
        "body_digest": body_digest(body),
        "body": value,
    }


def _connection_named(headers: Iterable[tuple[str, str]]) -> frozenset[str]:
    """The header names a ``Connection`` header lists (RFC 9110 section 7.6.1): hop-by-hop."""
    return frozenset(
        token.strip().lower()
        for name, value in headers
        if name.lower() == "connection"
        for token in value.split(",")
        if token.strip()
    )


def forwardable_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The client's end-to-end headers (comma-joined if repeated): not the hop-by-hop set, not
    a header its ``Connection`` names, nothing the executor writes itself but the caller's
    ``traceparent``/``tracestate``."""
    headers = list(headers)
    named = _connection_named(headers)
    out: dict[str, str] = {}
    for name, value in headers:
        key = name.lower()
        if key in HOP_BY_HOP or key in named:
            continue
        # the caller's W3C Trace Context passes (the forward replaces it while tracing is on)
        if is_reserved(key) and key != "content-type" and key not in TRACE_HEADERS:
            continue
        out[key] = f"{out[key]}, {value}" if key in out else value
    return out


def response_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The upstream's response headers a client may see (no hop-by-hop, none its
    ``Connection`` names, no framing)."""
    named = _connection_named(headers.items())
    return {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP | named}
