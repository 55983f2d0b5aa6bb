"""Citation URLs: strict parsing and the canonical form that is hashed and compared.

A citation is an ``https`` URL with no user info, query or fragment. Its path is percent-decoded
repeatedly (at most ``maxPercentDecodeRounds`` rounds; still encoded after that is refused),
normalised to Unicode NFC, refused if any segment is empty, ``.`` or ``..`` or contains a
backslash or control character, and re-encoded in one canonical spelling. Two spellings of the
same resource therefore have one identity, and ``/incidents/%252e%252e/secrets`` cannot slip
past a ``/incidents`` prefix.

A citation must match one of its source policy's exact origins (scheme, lower-cased host, port
other than 443) and one of its decoded resource prefixes, segment-wise: ``/incidents`` admits
``/incidents`` and ``/incidents/7`` but not ``/incidents-archive``.

This module does not recognise secrets embedded in opaque path text; narrow prefixes do.

Callers: ``policy.py`` (origins and prefixes), ``dryrun.py`` (source bindings).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from urllib.parse import quote, unquote, urlsplit

from ..codes import Code
from .errors import AgentSafetyError
from .limits import AGENT_SAFETY_HARD_LIMITS

__all__ = [
    "canonical_citation",
    "canonical_origin",
    "canonical_resource_prefix",
    "citation_allowed",
]

_MAX_LENGTH = AGENT_SAFETY_HARD_LIMITS["maxCitationLength"]
_MAX_ROUNDS = AGENT_SAFETY_HARD_LIMITS["maxPercentDecodeRounds"]
_HOST = re.compile(
    r"^(?=.{1,253}$)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*$"
)
_PERCENT = re.compile(r"%[0-9A-Fa-f]{2}")
_SAFE = "/-._~!$&'()*+,;=:@"


def _refuse(message: str) -> AgentSafetyError:
    return AgentSafetyError(message, code=Code.CITATION_REFUSED)


def _split_origin(text: str) -> tuple[str, str]:
    """(canonical origin, raw path) of an https URL with nothing but origin and path."""
    if type(text) is not str or not text or len(text) > _MAX_LENGTH:
        raise _refuse("a citation URL is missing or too long")
    if not text.isascii() or any(ord(ch) <= 0x20 or ord(ch) == 0x7F for ch in text):
        raise _refuse("a citation URL contains characters outside printable ASCII")
    if "?" in text or "#" in text:
        raise _refuse("a citation URL may not carry a query or fragment")
    if "\\" in text:
        raise _refuse("a citation URL may not contain a backslash")
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        raise _refuse("a citation URL does not parse") from None
    if parts.scheme.lower() != "https":
        raise _refuse("a citation URL must be https")
    if "@" in parts.netloc or parts.username is not None or parts.password is not None:
        raise _refuse("a citation URL may not carry user info")
    host = (parts.hostname or "").lower()
    if not _HOST.match(host):
        raise _refuse("a citation URL's host is not a DNS name")
    if port == 0:
        raise _refuse("a citation URL's port is invalid")
    origin = f"https://{host}" if port in (None, 443) else f"https://{host}:{port}"
    return origin, parts.path


def _decode_path(raw: str) -> str:
    path = raw
    for _ in range(_MAX_ROUNDS):
        if not _PERCENT.search(path):
            break
        path = unquote(path, encoding="utf-8", errors="strict")
    else:
        if _PERCENT.search(path):
            raise _refuse("a citation path is encoded too many times")
    if "%" in path:
        raise _refuse("a citation path has a stray percent sign")
    path = unicodedata.normalize("NFC", path)
    if any(unicodedata.category(ch).startswith("C") for ch in path) or "\\" in path:
        raise _refuse("a citation path contains control or backslash characters")
    return path


def _check_segments(path: str, *, allow_root: bool) -> None:
    if not path.startswith("/"):
        raise _refuse("a citation path must be absolute")
    if path == "/":
        if allow_root:
            return
        raise _refuse("a citation must name a resource")
    body = path[1:-1] if path.endswith("/") and allow_root else path[1:]
    for segment in body.split("/"):
        if segment in ("", ".", ".."):
            raise _refuse("a citation path has an empty or traversal segment")


def _encode(path: str) -> str:
    return quote(path, safe=_SAFE, encoding="utf-8", errors="strict")


def canonical_citation(text: str) -> tuple[str, str, str]:
    """Return ``(canonical URL, origin, decoded path)`` or raise ``CITATION_REFUSED``."""
    origin, raw_path = _split_origin(text)
    try:
        path = _decode_path(raw_path)
    except UnicodeError:
        raise _refuse("a citation path is not UTF-8") from None
    _check_segments(path, allow_root=False)
    return origin + _encode(path), origin, path


def canonical_origin(text: str) -> str:
    """The canonical form of a policy origin (``https://host[:port]``, nothing else)."""
    origin, raw_path = _split_origin(text)
    if raw_path not in ("", "/"):
        raise _refuse("an origin may not carry a path")
    return origin


def canonical_resource_prefix(text: str) -> str:
    """The decoded, normalised form of a policy resource prefix (an absolute path)."""
    if type(text) is not str or not text or len(text) > _MAX_LENGTH or not text.isascii():
        raise _refuse("a resource prefix is missing, too long or not ASCII")
    if "?" in text or "#" in text:
        raise _refuse("a resource prefix may not carry a query or fragment")
    try:
        path = _decode_path(text)
    except UnicodeError:
        raise _refuse("a resource prefix is not UTF-8") from None
    _check_segments(path, allow_root=True)
    return path


def citation_allowed(
    origin: str, path: str, *, origins: Iterable[str], prefixes: Iterable[str]
) -> bool:
    """True if a canonical citation's origin is one of ``origins`` exactly and its decoded
    path lies under one of ``prefixes`` segment-wise (all already canonical)."""
    if origin not in set(origins):
        return False
    for prefix in prefixes:
        base = prefix.rstrip("/")
        if path in (prefix, base) or path.startswith(base + "/"):
            return True
    return False
