"""How one configuration value is read: the parsers and checks each row of the table names.

Role: every parser here turns one raw string into its typed value or raises ``ValueError`` in
our own words, never repeating the input. :class:`Kind` names them; a row of ``config/table.py``
says which kind its variable is, and ``config/model.py`` runs the kind's parser before pydantic's
own type check and its check after it (:data:`KINDS`). :func:`check_downstream_url` is the one
validation of a downstream URL, which the operator's admission and reconcile use too.

Callers: ``config/__init__.py``, ``config/model.py`` (the field validators), ``config/rules.py``
(the downstream URLs' https-or-loopback rule), ``config/loading.py`` (:func:`is_production`),
``config/table.py`` (the kinds), ``tools/config_docs.py`` (how each kind is documented).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping
from enum import StrEnum
from pathlib import Path
from typing import Final
from urllib.parse import SplitResult, urlsplit

from iso4217 import Currency

from .. import base64url
from ..canonical import MAX_SAFE_INTEGER
from ..headers import HEADER_NAME, is_reserved
from ..windows import LockoutRule, RateRule
from .values import (
    CURRENCY_PATTERN,
    IDEMPOTENCY_KEY_PLACEHOLDER,
    MAX_TEXT,
    PRODUCTION,
    PROVIDER_REFERENCE_PLACEHOLDER,
)

__all__ = [
    "KINDS",
    "URL_PLACEHOLDERS",
    "Kind",
    "check_downstream_url",
    "is_production",
    "iso4217_listed",
]

_DIGITS = re.compile(r"[0-9]{1,19}")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_CURRENCY = re.compile(CURRENCY_PATTERN)
_REPLICA_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
_OCI_DIGEST = re.compile(
    r"(?:[^\s@]+@)?[a-z0-9]+(?:[+._-][a-z0-9]+)*:[0-9a-fA-F]{32,128}",
)


def _parse_bool(value: object) -> object:
    if isinstance(value, str):
        if value == "true":
            return True
        if value == "false":
            return False
        raise ValueError("must be true or false")
    return value


def _parse_int(value: object) -> object:
    if isinstance(value, str):
        if not _DIGITS.fullmatch(value):
            raise ValueError("must be a whole number written in decimal digits")
        return int(value)
    if isinstance(value, bool):
        raise ValueError("must be a whole number")
    return value


def _check_text(value: object) -> object:
    if isinstance(value, str):
        if len(value) > MAX_TEXT:
            raise ValueError(f"must be at most {MAX_TEXT} characters")
        if value != value.strip():
            raise ValueError("must not begin or end with white space")
        if not value.isprintable():
            raise ValueError("must not contain control characters")
    return value


def _check_path(value: object) -> object:
    if isinstance(value, str):
        if "\x00" in value or any(not ch.isprintable() for ch in value):
            raise ValueError("must be a path without control characters")
        return Path(value)
    return value


def _parse_url(value: str, *, placeholder: str | None = None) -> SplitResult:
    if any(ch.isspace() or not ch.isprintable() for ch in value):
        raise ValueError("must be a URL without white space")
    probe = value
    if placeholder is not None:
        if placeholder not in value:
            raise ValueError(f"must contain {placeholder}")
        probe = value.replace(placeholder, "placeholder")
    try:
        parts = urlsplit(probe)
        if parts.port == 0:  # .port itself raises ValueError on a malformed port
            raise ValueError("port 0")
    except ValueError:
        raise ValueError("must be an absolute https URL with a valid port") from None
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise ValueError("must be an absolute https URL")
    if parts.username is not None or parts.password is not None:
        raise ValueError("must not carry credentials")
    if parts.fragment or value.endswith("#"):
        raise ValueError("must not carry a fragment")
    if placeholder is not None and placeholder in urlsplit(value).netloc:
        raise ValueError(f"must carry {placeholder} in its path or query, not its host")
    return parts


def check_downstream_url(
    value: str, *, placeholder: str | None = None, allow_insecure_loopback: bool = False
) -> None:
    """The one validation of a downstream URL (``DOWNSTREAM_URL``, ``DOWNSTREAM_LOOKUP_URL``,
    ``DOWNSTREAM_LOOKUP_BY_REFERENCE_URL``, ``DOWNSTREAM_TOKEN_URL``): an absolute URL without
    white space, credentials (``user:password@``) or a fragment, with a valid port (1-65535),
    ``placeholder`` in its path or query when one is required, and https, or plain http only to
    a loopback literal with ``allow_insecure_loopback``. Raises ``ValueError`` whose words never
    hold the value. The configuration loader (:class:`ExecutorConfig`), and the operator's
    ``spec.downstream`` model (``operator/models.py``, so its admission review and its
    reconcile) use it."""
    parts = _parse_url(value, placeholder=placeholder)
    if parts.scheme == "https":
        return
    if not _is_loopback_literal(parts.hostname or ""):
        raise ValueError("must be https (plain http only to a loopback address)")
    if not allow_insecure_loopback:
        raise ValueError("plain http to loopback needs DOWNSTREAM_ALLOW_INSECURE_LOOPBACK=true")


def _is_loopback_literal(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def iso4217_listed(code: object) -> bool:
    """Whether ``code`` is an alphabetic code the ``iso4217`` data package lists (three
    capitals alone are not enough: ``ABC`` is no currency)."""
    if not isinstance(code, str) or not _CURRENCY.fullmatch(code):
        return False
    try:
        Currency(code)
    except ValueError:
        return False
    return True


def _parse_ceilings(text: str) -> dict[str, int]:
    ceilings: dict[str, int] = {}
    for entry in text.split(","):
        currency, sep, amount = entry.partition(":")
        if not sep or not iso4217_listed(currency) or not _DIGITS.fullmatch(amount):
            raise ValueError(
                "must be <ISO 4217 code>:<minor units>, comma-separated, without blanks"
            )
        if currency in ceilings:
            raise ValueError("names a currency twice")
        minor = int(amount)
        if not 1 <= minor <= MAX_SAFE_INTEGER:
            raise ValueError(f"each amount must be from 1 to {MAX_SAFE_INTEGER}")
        ceilings[currency] = minor
    return ceilings


def _parse_pins(text: str) -> tuple[str, ...]:
    pins = tuple(text.split(","))
    for pin in pins:
        algorithm, sep, encoded = pin.partition("/")
        if algorithm != "sha256" or not sep:
            raise ValueError("each pin must be sha256/<base64 of the SPKI digest>")
        try:
            raw = base64url.decode_standard(encoded)
        except ValueError:
            raise ValueError("each pin must be sha256/<base64 of the SPKI digest>") from None
        if len(raw) != 32:
            raise ValueError("each pin must be the base64 of a 32-byte SHA-256 digest")
    if len(pins) < 2:
        raise ValueError("needs two or more pins (a current and a backup key)")
    if len(set(pins)) != len(pins):
        raise ValueError("names a pin twice")
    return pins


def _parse_cidrs(text: str) -> tuple[str, ...]:
    """``EXECUTOR_EGRESS_ALLOW_CIDRS``: comma-separated CIDRs, host bits clear, never a ``/0``;
    returned in canonical form."""
    out: list[str] = []
    for entry in text.split(","):
        try:
            network = ipaddress.ip_network(entry, strict=True)
        except ValueError:
            raise ValueError(
                "must be CIDRs with host bits clear, comma-separated, without blanks"
            ) from None
        if network.prefixlen == 0:
            raise ValueError("must not contain a /0, which would open every private network")
        if str(network) in out:
            raise ValueError("names a network twice")
        out.append(str(network))
    return tuple(out)


def is_production(environ: Mapping[str, str]) -> bool:
    """``AGENTSAFE_ENV=production``; any case and surrounding blanks count (fail towards it)."""
    return environ.get("AGENTSAFE_ENV", "").strip().lower() == PRODUCTION


_HANDLER_REFERENCE: Final = re.compile(
    r"^(?:[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*"
    r"(?:\.[A-Za-z_][A-Za-z0-9_]*)*|[A-Za-z0-9][A-Za-z0-9_.-]{0,127})$"
)


def _parse_handler_references(value: str) -> tuple[str, ...]:
    """``EXECUTOR_HANDLERS``: comma-separated ``module:function`` references or entry-point
    names of the ``agentsafe.handlers`` group, each once (``dispatch/registration.py`` loads
    them)."""
    refs = tuple(part.strip() for part in value.split(","))
    if any(not r or not _HANDLER_REFERENCE.match(r) for r in refs):
        raise ValueError("must be comma-separated module:function references or entry-point names")
    if len(set(refs)) != len(refs):
        raise ValueError("names a registration twice")
    return refs


def _list_of(parse: Callable[[str], tuple[str, ...]]) -> Check:
    """A comma-separated list: parsed from text, or re-checked when given as a sequence."""

    def check(value: object) -> object:
        if isinstance(value, str):
            return parse(value)
        if isinstance(value, list | tuple):
            return parse(",".join(str(v) for v in value))
        return value

    return check


def _absolute(value: object) -> object:
    if isinstance(value, Path) and not value.is_absolute():
        raise ValueError("must be an absolute path")
    return value


def _bind_address(value: object) -> object:
    if isinstance(value, str):
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ValueError("must be an IPv4 or IPv6 address") from None
    return value


def _tenant(value: object) -> object:
    if isinstance(value, str) and not _UUID.fullmatch(value):
        raise ValueError("must be a UUID in lower-case canonical form")
    return value


def _replica_id(value: object) -> object:
    if isinstance(value, str) and not _REPLICA_ID.fullmatch(value):
        raise ValueError("must be 1-253 letters, digits, '.', '_' or '-' (a pod name)")
    return value


def _image_digest(value: object) -> object:
    if isinstance(value, str) and not _OCI_DIGEST.fullmatch(value):
        raise ValueError("must be an image digest such as sha256:<hex>, optionally name@")
    return value


def _rate_rule(value: object) -> object:
    return RateRule.parse(value) if isinstance(value, str) else value


def _lockout_rule(value: object) -> object:
    return LockoutRule.parse(value) if isinstance(value, str) else value


def _ceilings(value: object) -> object:
    if isinstance(value, str):
        return _parse_ceilings(value)
    if isinstance(value, Mapping):
        _parse_ceilings(",".join(f"{k}:{v}" for k, v in value.items()))
    return value


def _downstream_url(placeholder: str | None) -> Check:
    def check(value: object) -> object:
        if isinstance(value, str):  # the shape here; https or loopback in rules.py
            check_downstream_url(value, placeholder=placeholder, allow_insecure_loopback=True)
        return value

    return check


def _https_url(value: object) -> object:
    if isinstance(value, str) and _parse_url(value).scheme != "https":
        raise ValueError("must be an https URL")
    return value


def _https_origin(value: object) -> object:
    if not isinstance(value, str):
        return value
    parts = _parse_url(value)
    if parts.scheme != "https":
        raise ValueError("must be an https origin (https://host[:port])")
    if parts.path not in ("", "/") or parts.query or parts.fragment or "@" in parts.netloc:
        raise ValueError("must be an origin only: no path, query, fragment or credentials")
    return value.rstrip("/")


def _header_name(value: object) -> object:
    if not isinstance(value, str):
        return value
    if not HEADER_NAME.fullmatch(value) or len(value) > 128:
        raise ValueError("must be an HTTP header name")
    if is_reserved(value):
        raise ValueError("names a header the executor sets itself")
    return value


class Kind(StrEnum):
    """What a variable's value is, and so how it is read (a row of the table names one)."""

    TEXT = "text"
    PATH = "path"
    ABSOLUTE_PATH = "absolute path"
    BOOL = "boolean"
    INT = "integer"
    ENUM = "enumeration"
    SECRET = "secret"
    BIND_ADDRESS = "IPv4/IPv6 address"
    TENANT = "lower-case UUID"
    REPLICA_ID = "replica id"
    IMAGE_DIGEST = "image digest"
    RATE_RULE = "rate rule"
    LOCKOUT_RULE = "lockout rule"
    CEILINGS = "ceilings"
    HANDLERS = "handler references"
    CIDRS = "CIDRs"
    PINS = "SPKI pins"
    DOWNSTREAM_URL = "downstream URL"
    LOOKUP_URL = "lookup URL"
    REFERENCE_URL = "read-back URL"
    HTTPS_URL = "https URL"
    HTTPS_ORIGIN = "https origin"
    HEADER_NAME = "header name"


Check = Callable[[object], object]
"""A parser or check: the value in, the value (perhaps converted) out, or ``ValueError``."""

KINDS: Final[Mapping[Kind, tuple[Check | None, Check | None]]] = {
    # kind: (before pydantic's type check, after it)
    Kind.TEXT: (_check_text, None),
    Kind.PATH: (_check_path, None),
    Kind.ABSOLUTE_PATH: (_check_path, _absolute),
    Kind.BOOL: (_parse_bool, None),
    Kind.INT: (_parse_int, None),
    Kind.ENUM: (None, None),
    Kind.SECRET: (None, None),
    Kind.BIND_ADDRESS: (_bind_address, None),
    Kind.TENANT: (_tenant, None),
    Kind.REPLICA_ID: (_check_text, _replica_id),
    Kind.IMAGE_DIGEST: (_check_text, _image_digest),
    Kind.RATE_RULE: (_rate_rule, None),
    Kind.LOCKOUT_RULE: (_lockout_rule, None),
    Kind.CEILINGS: (_ceilings, None),
    Kind.HANDLERS: (_list_of(_parse_handler_references), None),
    Kind.CIDRS: (_list_of(_parse_cidrs), None),
    Kind.PINS: (_list_of(_parse_pins), None),
    Kind.DOWNSTREAM_URL: (None, _downstream_url(None)),
    Kind.LOOKUP_URL: (None, _downstream_url(IDEMPOTENCY_KEY_PLACEHOLDER)),
    Kind.REFERENCE_URL: (None, _downstream_url(PROVIDER_REFERENCE_PLACEHOLDER)),
    Kind.HTTPS_URL: (None, _https_url),
    Kind.HTTPS_ORIGIN: (None, _https_origin),
    Kind.HEADER_NAME: (None, _header_name),
}

URL_PLACEHOLDERS: Final[Mapping[Kind, str | None]] = {
    Kind.DOWNSTREAM_URL: None,
    Kind.LOOKUP_URL: IDEMPOTENCY_KEY_PLACEHOLDER,
    Kind.REFERENCE_URL: PROVIDER_REFERENCE_PLACEHOLDER,
}
"""The downstream URL kinds and the placeholder each must contain (rules.py's https check)."""
