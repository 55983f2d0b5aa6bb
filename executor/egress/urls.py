"""The egress guard's rules for a URL: a destination sealed into a rule, and a URL checked
against the rules before any name is resolved.

Role: the pure part of ``egress/guard.py``: :class:`Destination` (one configured address)
sealed into a :class:`Rule` (:func:`seal`: origin, path prefix, TLS context and pins), and a
request's URL parsed and refused (``_Refusal``, which the guard turns into a
``TransportError``) when it carries credentials, a non-canonical numeric host, an unsupported
scheme or a path whose meaning could change under normalisation (:func:`parse_url`,
:func:`check_path`). :func:`check_request` is the whole check the guard makes before it
resolves a name, in the guard's order: the URL, then the method and the header fields, then the
origin and the path against the rules; it returns the rule the request goes by. The guard
remembers :func:`check_target`, the same check less the header values (a pure function of the
rules, the method, the URL and the header names), checks the values itself, and asks
:func:`check_request` only for a request that one of those refuses, for its first refusal
(issue 32). A request's numeric-host check is remembered per host (a bounded memo of a pure
function, issue 34). It opens no socket.

Callers: ``egress/guard.py`` (every request, and every destination at construction).
"""

from __future__ import annotations

import base64
import functools
import ipaddress
import re
import ssl
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from yarl import URL

from ..codes import Code
from ..errors import ConfigError
from ..headers import HEADER_NAME, TRANSPORT_HEADERS
from .registries import unwrap

__all__ = [
    "HEADER_VALUE",
    "Destination",
    "Rule",
    "check_path",
    "check_request",
    "check_target",
    "header_value_ok",
    "leaves_origin",
    "non_canonical_numeric",
    "origin_of",
    "parse_url",
    "safe_origin",
    "seal",
    "ssl_context_for",
    "under_prefix",
]

_PIN = re.compile(r"^sha256/([A-Za-z0-9+/]{43}=)$")
_NUMERIC_LABEL = re.compile(r"^(0x[0-9a-f]*|[0-9]+)$")
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
HEADER_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]*")
"""What a header field's value may hold (:func:`header_value_ok`, ``fullmatch``)."""


@dataclass(frozen=True)
class Destination:
    """One configured address the executor may reach.

    ``url_prefix`` fixes the origin (scheme, host, port) and the path prefix. ``ca_file`` is the
    trust anchor (None: the platform store). ``spki_pins`` are ``sha256/<base64>`` of a
    SubjectPublicKeyInfo; when given, some certificate in the presented chain must match one.
    ``allow_insecure_loopback`` is a development/test allowance, never for production: the
    destination may answer with a loopback address, and plain ``http`` is allowed when it does.
    """

    url_prefix: str
    ca_file: str | None = None
    spki_pins: tuple[str, ...] = ()
    allow_insecure_loopback: bool = False


@dataclass(frozen=True)
class Rule:
    scheme: str
    host: str
    port: int
    prefix: str
    ssl_context: ssl.SSLContext | None
    pins: frozenset[bytes]
    allow_loopback: bool
    origin: str


class _Refusal(Exception):
    def __init__(self, code: Code, *, sent: bool = False, **extra: Any) -> None:
        super().__init__(code)
        self.code = code
        self.sent = sent
        self.extra = extra


def non_canonical_numeric(host: str) -> bool:
    """True for numeric host spellings other than a canonical dotted quad or compressed IPv6."""
    if ":" in host:
        try:
            ip6 = ipaddress.IPv6Address(host)
        except ValueError:
            return True
        return str(ip6) != host or unwrap(ip6) != ip6
    labels = host.rstrip(".").split(".")
    if all(_NUMERIC_LABEL.match(label) for label in labels) or (
        labels and _NUMERIC_LABEL.match(labels[-1]) and labels[-1].isdigit()
    ):
        try:
            return str(ipaddress.IPv4Address(host)) != host
        except ValueError:
            return True
    return False


_non_canonical_numeric_memo = functools.lru_cache(maxsize=256)(non_canonical_numeric)
""":func:`non_canonical_numeric` remembered for the hosts requests name (issue 34: its
``ipaddress`` parsing was about 9 us of every request to a numeric host): a pure function of
the host, so the answer is the one it would compute; at most 256 hosts are kept, least recently
used first out (``functools.lru_cache``, the standard library's bounded memo)."""


def check_path(raw_path: str) -> str:
    """Refuse paths whose meaning could change under normalisation; return the path."""
    if not raw_path.startswith("/") or "\\" in raw_path:
        raise _Refusal(Code.EGRESS_PATH_NOT_ALLOWED)
    lowered = raw_path.lower()
    if any(enc in lowered for enc in ("%2f", "%5c", "%00", "%25")):
        raise _Refusal(Code.EGRESS_PATH_NOT_ALLOWED)
    for segment in raw_path.split("/"):
        if unquote(segment) in (".", ".."):
            raise _Refusal(Code.EGRESS_PATH_NOT_ALLOWED)
    if "//" in raw_path:
        raise _Refusal(Code.EGRESS_PATH_NOT_ALLOWED)
    return raw_path


def under_prefix(path: str, prefix: str) -> bool:
    if prefix in ("", "/"):
        return True
    base = prefix.rstrip("/")
    return path == base or path.startswith(base + "/")


def origin_of(url: URL) -> str:
    host = url.raw_host or ""
    if ":" in host:
        host = f"[{host}]"
    return f"{url.scheme}://{host}:{url.port}"


def ssl_context_for(ca_file: str | None, variable: str) -> ssl.SSLContext:
    try:
        context = ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(variable, "the CA file cannot be read as PEM certificates") from exc
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = True
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def safe_origin(url: str) -> str:
    """The origin to report for ``url`` (credentials, path and query left out), or "invalid"."""
    try:
        parsed = URL(url, encoded=True)
        if parsed.scheme and parsed.raw_host and parsed.port is not None:
            return origin_of(parsed)
    except (TypeError, ValueError):
        pass
    return "invalid"


def parse_url(url: str) -> tuple[URL, str]:
    if not isinstance(url, str) or any(ord(c) <= 0x20 or ord(c) == 0x7F for c in url):
        raise _Refusal(Code.EGRESS_INIT_UNSUPPORTED)
    try:
        parsed = URL(url, encoded=True)
    except (TypeError, ValueError):
        raise _Refusal(Code.EGRESS_INIT_UNSUPPORTED) from None
    if not parsed.is_absolute() or not parsed.raw_host:
        raise _Refusal(Code.EGRESS_INIT_UNSUPPORTED)
    origin = origin_of(parsed) if parsed.port is not None else f"{parsed.scheme}://invalid"
    if parsed.user is not None or parsed.password is not None or "@" in url.split("/")[2]:
        raise _Refusal(Code.EGRESS_ORIGIN_NOT_ALLOWED)
    if parsed.scheme not in ("https", "http"):
        raise _Refusal(Code.EGRESS_SCHEME_NOT_ALLOWED)
    if _non_canonical_numeric_memo(parsed.raw_host.lower()):
        raise _Refusal(Code.EGRESS_ADDRESS_REFUSED, reason="non-canonical numeric host")
    if parsed.port is None or not 0 < parsed.port < 65536:
        raise _Refusal(Code.EGRESS_INIT_UNSUPPORTED)
    return parsed, origin


def check_request(
    rules: Sequence[Rule], method: str, url: str, headers: Mapping[str, str]
) -> tuple[URL, str, Rule]:
    """The request checked before any name is resolved: the URL parsed (:func:`parse_url`),
    then the method and every header field, then the origin and the path against ``rules``.
    Returns the parsed URL, its origin and the rule it goes by (the longest matching prefix of
    its origin); raises ``_Refusal`` with the first check's code that fails."""
    parsed, origin = parse_url(url)
    _check_fields(method, headers, headers.values())
    return parsed, origin, _rule_for(rules, parsed)


def check_target(
    rules: Sequence[Rule], method: str, url: str, names: Sequence[str]
) -> tuple[URL, str, Rule]:
    """:func:`check_request` less the header values: a pure function of the rules, the method,
    the URL and the header names, which the guard remembers (issue 32) and completes with
    :func:`header_value_ok` of each value; a request it refuses is checked again whole, for
    the refusal :func:`check_request` raises first."""
    parsed, origin = parse_url(url)
    _check_fields(method, names, ())
    return parsed, origin, _rule_for(rules, parsed)


def header_value_ok(value: object) -> bool:
    """Whether a header field's value may be sent: a string of tab, visible ASCII, space and
    obs-text only (the guard inlines it on its remembered path: keep the two alike)."""
    return isinstance(value, str) and HEADER_VALUE.fullmatch(value) is not None


def _check_fields(method: str, names: Iterable[str], values: Iterable[object]) -> None:
    """The method and the header fields (every refusal here is the same code)."""
    if method not in _METHODS:
        raise _Refusal(Code.EGRESS_INIT_UNSUPPORTED)
    for name in names:
        if not HEADER_NAME.fullmatch(name) or name.lower() in TRANSPORT_HEADERS:
            raise _Refusal(Code.EGRESS_INIT_UNSUPPORTED)
    for value in values:
        if not header_value_ok(value):
            raise _Refusal(Code.EGRESS_INIT_UNSUPPORTED)


def _rule_for(rules: Sequence[Rule], parsed: URL) -> Rule:
    """The rule a parsed URL goes by: the longest matching prefix of its origin."""
    host = (parsed.raw_host or "").lower()
    same_origin = [
        r for r in rules if (r.scheme, r.host, r.port) == (parsed.scheme, host, parsed.port)
    ]
    if not same_origin:
        if parsed.scheme == "http" and any(r.host == host for r in rules):
            raise _Refusal(Code.EGRESS_SCHEME_NOT_ALLOWED)
        raise _Refusal(Code.EGRESS_ORIGIN_NOT_ALLOWED)
    path = check_path(parsed.raw_path)
    for rule in sorted(same_origin, key=lambda r: len(r.prefix), reverse=True):
        if under_prefix(path, rule.prefix):
            return rule
    raise _Refusal(Code.EGRESS_PATH_NOT_ALLOWED)


def leaves_origin(url: URL, location: str | None) -> bool:
    if not location:
        return False
    try:
        target = url.join(URL(location, encoded=True))
    except (TypeError, ValueError):
        return True
    return (target.scheme, (target.raw_host or "").lower(), target.port) != (
        url.scheme,
        (url.raw_host or "").lower(),
        url.port,
    )


def seal(destination: Destination) -> Rule:
    variable = "EGRESS_DESTINATION"
    try:
        parsed = URL(destination.url_prefix, encoded=True)
    except (TypeError, ValueError) as exc:
        raise ConfigError(variable, "not a URL") from exc
    host = (parsed.raw_host or "").lower()
    if not parsed.is_absolute() or not host or parsed.port is None:
        raise ConfigError(variable, "not an absolute URL")
    if parsed.user is not None or parsed.password is not None:
        raise ConfigError(variable, "credentials in the URL")
    if parsed.raw_query_string or parsed.fragment:
        raise ConfigError(variable, "a destination is an origin and a path prefix only")
    if non_canonical_numeric(host):
        raise ConfigError(variable, "a non-canonical numeric host")
    if parsed.scheme == "http":
        if not destination.allow_insecure_loopback:
            raise ConfigError(variable, "plain http needs the explicit loopback allowance")
    elif parsed.scheme != "https":
        raise ConfigError(variable, "scheme must be https")
    try:
        prefix = check_path(parsed.raw_path or "/")
    except _Refusal as exc:
        raise ConfigError(variable, "path prefix has dot segments or encoded separators") from exc
    pins: set[bytes] = set()
    for pin in destination.spki_pins:
        match = _PIN.match(pin)
        if not match:
            raise ConfigError("DOWNSTREAM_SPKI_PINS", "each pin is sha256/<base64 of 32 bytes>")
        pins.add(base64.b64decode(match.group(1)))
    context = (
        ssl_context_for(destination.ca_file, "DOWNSTREAM_CA_FILE")
        if parsed.scheme == "https"
        else None
    )
    return Rule(
        scheme=parsed.scheme,
        host=host,
        port=parsed.port,
        prefix=prefix,
        ssl_context=context,
        pins=frozenset(pins),
        allow_loopback=destination.allow_insecure_loopback,
        origin=origin_of(parsed),
    )
