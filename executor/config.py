"""The executor's configuration: every variable in one list, parsed once, checked as a whole.

Role: turn the process environment into one frozen :class:`ExecutorConfig` that every other
component reads (``config.executor_mode``, ``config.downstream_url``, ...), or refuse to start with
a :class:`~agentsafe.executor.errors.ConfigError` that names the variable and never its value
(exit status 78). ``CONFIG_KEYS`` is the list of every variable; ``docs/configuration.md`` is its
table for people.

Callers: ``assembly.py`` (start order: configuration comes second, after the audit hook),
``plane.py``, ``cli.py`` (``agentsafe config`` through :func:`describe_config` and
:func:`render_config_table`), ``host/secrets.py`` (which secrets were given and how, through
:meth:`ExecutorConfig.secret_source`), ``host/posture.py``, and the operator, which renders an
executor's environment from the same list.
These are the main callers: it is imported across the wings, and its other importers are not
listed.

Why a plain pydantic model and not pydantic-settings: the environment is taken as an explicit
mapping (tests and ``agentsafe config`` pass their own), every ``EXECUTOR_*``/``DOWNSTREAM_*``
variable we do not know must be refused rather than ignored, a secret's value must never enter
this object (only whether it was given, as ``<NAME>`` or ``<NAME>_FILE``), the provenance of each
value (environment, file, default) is reported, and error messages must never carry an input
value. pydantic-settings reads ``os.environ``, ``.env`` files and secret directories itself and
would read secret values; each of those would have to be switched off or worked around. So
:func:`load_config` does the environment-specific work (unknown names, empty values, secret
sources) and hands a dict of raw strings to an ordinary frozen pydantic model whose validators
parse strictly (booleans are ``true``/``false`` only, integers are plain decimal digits, enums
match exactly) and whose model validator applies the cross-field rules. pydantic's
``ValidationError`` is translated into a ``ConfigError`` built from our own words and the field's
declared constraints, never from the input.

A note for deployments: Kubernetes injects ``<SERVICE>_SERVICE_HOST``/``<SERVICE>_PORT_*``
variables for every Service in the namespace. A Service named ``executor`` or ``downstream``
would therefore inject unknown ``EXECUTOR_*``/``DOWNSTREAM_*`` variables, which are refused; pods
run with ``enableServiceLinks: false``.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum, StrEnum
from io import StringIO
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import SplitResult, urlsplit

import annotated_types
from iso4217 import Currency
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from . import base64url
from .canonical import MAX_SAFE_INTEGER, sha256_digest
from .codes import Code
from .errors import ConfigError
from .headers import HEADER_NAME, is_reserved
from .intent import DownstreamTarget
from .principals import Actor
from .windows import LockoutRule, RateRule

if TYPE_CHECKING:
    from rich.console import Console

__all__ = [
    "BODY_TIMEOUT_SECONDS_DEFAULT",
    "CONFIG_KEYS",
    "CURRENCY_PATTERN",
    "DOWNSTREAM_TIMEOUT_MS_DEFAULT",
    "DOWNSTREAM_TIMEOUT_MS_MAX",
    "HARD_LIMIT_WINDOW_COUNT_MAX",
    "HARD_LIMIT_WINDOW_SECONDS_MAX",
    "HEADER_TIMEOUT_SECONDS_DEFAULT",
    "IDEMPOTENCY_KEY_PLACEHOLDER",
    "INTENT_TTL_SECONDS_DEFAULT",
    "INTENT_TTL_SECONDS_MAX",
    "LEASE_MARGIN_SECONDS",
    "LEASE_RENEWALS_PER_LEASE",
    "MAX_CONNECTIONS_DEFAULT",
    "MAX_CONNECTIONS_PER_SOURCE_DEFAULT",
    "MAX_TEXT",
    "PRODUCTION",
    "PROVIDER_REFERENCE_PLACEHOLDER",
    "SECRET_FILE_SUFFIX",
    "SECRET_NAMES",
    "WORKERS_DEFAULT",
    "WORKERS_MAX",
    "ConfigRow",
    "CredentialKind",
    "EffectMismatchAction",
    "EscalationMode",
    "ExecutorConfig",
    "ExecutorMode",
    "LockoutRule",
    "PostureMode",
    "PrivateKeyAlgorithm",
    "RateRule",
    "SecretOrigin",
    "SecretSource",
    "SigningAlgorithm",
    "TlsMinVersion",
    "check_downstream_url",
    "describe_config",
    "is_production",
    "iso4217_listed",
    "load_config",
    "render_config_table",
]

PRODUCTION: Final = "production"
IDEMPOTENCY_KEY_PLACEHOLDER: Final = "{idempotency_key}"
"""What ``DOWNSTREAM_LOOKUP_URL`` must contain: the lookup is by the idempotency key."""
PROVIDER_REFERENCE_PLACEHOLDER: Final = "{provider_reference}"
"""What ``DOWNSTREAM_LOOKUP_BY_REFERENCE_URL`` must contain: the read-back is by reference."""
SECRET_FILE_SUFFIX: Final = "_FILE"

# Rules the operator's AgentPolicy schema states too: it imports these, never copies them.
INTENT_TTL_SECONDS_DEFAULT: Final = 60
INTENT_TTL_SECONDS_MAX: Final = 300
DOWNSTREAM_TIMEOUT_MS_DEFAULT: Final = 10_000
# Fencing (issue 29): a replica renews its attempts' leases this many times per lease, and takes
# this margin off its local view of a lease (clock rates differ slightly); see _lease_rules.
LEASE_RENEWALS_PER_LEASE: Final = 3
LEASE_MARGIN_SECONDS: Final = 1.0
HEADER_TIMEOUT_SECONDS_DEFAULT: Final = 10
BODY_TIMEOUT_SECONDS_DEFAULT: Final = 10
MAX_CONNECTIONS_DEFAULT: Final = 1024
MAX_CONNECTIONS_PER_SOURCE_DEFAULT: Final = 128
# EXECUTOR_WORKERS (worker processes behind one listener): its bounds, stated once for both.
WORKERS_DEFAULT: Final = 1
WORKERS_MAX: Final = 16
DOWNSTREAM_TIMEOUT_MS_MAX: Final = 15_000
HARD_LIMIT_WINDOW_SECONDS_MAX: Final = 2_592_000
HARD_LIMIT_WINDOW_COUNT_MAX: Final = 1_000_000_000
CURRENCY_PATTERN: Final = "[A-Z]{3}"
"""An ISO 4217 alphabetic code, as ``EXECUTOR_HARD_LIMIT_SINGLE_MINOR`` names a currency."""
MAX_TEXT: Final = 512
"""The longest text value (an actor, a downstream system or operation name, ...)."""

# --------------------------------------------------------------------------------------------
# Enumerations


class ExecutorMode(StrEnum):
    SHADOW = "SHADOW"
    ENFORCEMENT = "ENFORCEMENT"


class EscalationMode(StrEnum):
    """How an ESCALATE is resolved. NONE: the hold is the answer. APPROVAL: durable approvals by
    APPROVER principals (this project's replacement for the specification's DIRECT/MANAGED)."""

    NONE = "NONE"
    APPROVAL = "APPROVAL"


class PostureMode(StrEnum):
    ENFORCED = "ENFORCED"
    DEVELOPMENT = "DEVELOPMENT"


class TlsMinVersion(StrEnum):
    TLS_1_3 = "1.3"
    TLS_1_2 = "1.2"


class CredentialKind(StrEnum):
    STATIC_HEADER = "STATIC_HEADER"
    PRIVATE_KEY_JWT = "PRIVATE_KEY_JWT"
    SIGNED_REQUEST = "SIGNED_REQUEST"


class PrivateKeyAlgorithm(StrEnum):
    ES256 = "ES256"
    PS256 = "PS256"


class SigningAlgorithm(StrEnum):
    ED25519 = "ed25519"
    HMAC_SHA256 = "hmac-sha256"


class EffectMismatchAction(StrEnum):
    HALT = "HALT"
    ALERT = "ALERT"


class SecretOrigin(StrEnum):
    ENV = "env"
    FILE = "file"
    ABSENT = "absent"


# --------------------------------------------------------------------------------------------
# Small parsed values


@dataclass(frozen=True)
class SecretSource:
    """Whether a secret was given and how; never its value (``secrets.py`` reads that)."""

    name: str
    origin: SecretOrigin = SecretOrigin.ABSENT
    path: str | None = None

    @property
    def given(self) -> bool:
        return self.origin is not SecretOrigin.ABSENT

    @property
    def variable(self) -> str:
        """The variable that carried it: ``<NAME>`` or ``<NAME>_FILE``."""
        return self.name + SECRET_FILE_SUFFIX if self.origin is SecretOrigin.FILE else self.name

    def describe(self) -> str:
        if self.origin is SecretOrigin.FILE:
            return f"file:{self.path}"
        return self.origin.value


@dataclass(frozen=True)
class ConfigRow:
    """One line of ``agentsafe config``: the variable, what it resolved to, and from where.

    ``source`` is ``env``, ``file:<path>`` (secrets), ``default`` or ``unset``; ``value`` is
    ``None`` when unset and ``<set>`` for every secret that was given.
    """

    key: str
    value: str | None
    source: str


# --------------------------------------------------------------------------------------------
# The list of variables


SECRET_NAMES: Final[tuple[str, ...]] = (
    "EXECUTOR_CALLER_TOKEN",
    "EXECUTOR_TLS_KEY",
    "EXECUTOR_AUTHORITY_SIGNING_KEY",
    "EXECUTOR_EVIDENCE_SIGNING_KEY",
    "DOWNSTREAM_CREDENTIAL",
    "DOWNSTREAM_PRIVATE_KEY",
    "DOWNSTREAM_SIGNING_KEY",
    "EXECUTOR_STORE_URL",
)

# Every variable, in the order of docs/configuration.md. A secret appears twice: as ``<NAME>``
# (the value, outside production only) and as ``<NAME>_FILE`` (the path of a mounted file).
CONFIG_KEYS: Final[tuple[str, ...]] = (
    # process and listener
    "AGENTSAFE_ENV",
    "EXECUTOR_MODE",
    "EXECUTOR_POLICY_FILE",
    "EXECUTOR_STATE_DIR",
    "EXECUTOR_BIND_ADDRESS",
    "PORT",
    "EXECUTOR_WORKERS",
    "EXECUTOR_HEADER_TIMEOUT_SECONDS",
    "EXECUTOR_BODY_TIMEOUT_SECONDS",
    "EXECUTOR_MAX_CONNECTIONS",
    "EXECUTOR_MAX_CONNECTIONS_PER_SOURCE",
    "EXECUTOR_INTENT_TTL_SECONDS",
    "EXECUTOR_HANDLERS",
    "EXECUTOR_AUTHORITY_SIGNING_KEY",
    "EXECUTOR_AUTHORITY_SIGNING_KEY_FILE",
    # callers
    "EXECUTOR_PRINCIPALS_FILE",
    "EXECUTOR_ALLOW_LEGACY_CALLER",
    "EXECUTOR_TENANT_ID",
    "EXECUTOR_ACTOR_ID",
    "EXECUTOR_ACTOR_TYPE",
    "EXECUTOR_ACTOR_RUNTIME",
    "EXECUTOR_CALLER_TOKEN",
    "EXECUTOR_CALLER_TOKEN_FILE",
    "EXECUTOR_JWT_AUDIENCE",
    "EXECUTOR_JWKS_FILE",
    "EXECUTOR_JWKS_URL",
    "EXECUTOR_JWKS_CA_FILE",
    "EXECUTOR_JWKS_REFRESH_SECONDS",
    "EXECUTOR_JWT_CLOCK_TOLERANCE_SECONDS",
    "EXECUTOR_RATE_LIMIT_UNAUTHENTICATED",
    "EXECUTOR_AUTH_LOCKOUT",
    "EXECUTOR_ESCALATION",
    "EXECUTOR_APPROVAL_ORIGIN",
    "EXECUTOR_APPROVAL_WEBHOOK_URL",
    "EXECUTOR_APPROVAL_WEBHOOK_CA_FILE",
    "EXECUTOR_APPROVAL_WEBHOOK_ALLOW_INSECURE_LOOPBACK",
    # host posture and secrets
    "EXECUTOR_POSTURE",
    "EXECUTOR_POSTURE_INTERVAL_SECONDS",
    "EXECUTOR_SECRETS_DIR",
    # TLS listener
    "EXECUTOR_TLS_CERT_FILE",
    "EXECUTOR_TLS_KEY",
    "EXECUTOR_TLS_KEY_FILE",
    "EXECUTOR_TLS_CLIENT_CA_FILE",
    "EXECUTOR_TLS_MIN_VERSION",
    "EXECUTOR_ALLOW_PLAINTEXT_LISTENER",
    # egress
    "EXECUTOR_EGRESS_MAX_RESPONSE_BYTES",
    "EXECUTOR_EGRESS_ALLOW_CIDRS",
    # journal
    "EXECUTOR_JOURNAL_DIR",
    "EXECUTOR_JOURNAL_REQUIRED",
    "EXECUTOR_JOURNAL_RETAIN_DAYS",
    "EXECUTOR_HOUSEKEEPING_INTERVAL_SECONDS",
    "EXECUTOR_READY_REQUIRES_NO_UNKNOWN_ATTEMPTS",
    # shared store and replicas
    "EXECUTOR_STORE_URL",
    "EXECUTOR_STORE_URL_FILE",
    "EXECUTOR_REPLICA_ID",
    "EXECUTOR_ATTEMPT_LEASE_SECONDS",
    # halt
    "EXECUTOR_HALT_FILE",
    "EXECUTOR_HALT_ON_AUTH_FAILURES",
    "EXECUTOR_HALT_ON_EGRESS_REFUSALS",
    # host ceilings
    "EXECUTOR_HARD_LIMIT_SINGLE_MINOR",
    "EXECUTOR_HARD_LIMIT_WINDOW_SECONDS",
    "EXECUTOR_HARD_LIMIT_WINDOW_COUNT",
    "EXECUTOR_HARD_LIMIT_WINDOW_SUM_MINOR",
    # clocks
    "EXECUTOR_MAX_CLOCK_SKEW_MS",
    # evidence
    "EXECUTOR_AUDIT_CHECKPOINT_LINES",
    "EXECUTOR_EVIDENCE_DIR",
    "EXECUTOR_EVIDENCE_WINDOW_LINES",
    "EXECUTOR_EVIDENCE_SIGNING_KEY",
    "EXECUTOR_EVIDENCE_SIGNING_KEY_FILE",
    "EXECUTOR_IMAGE_DIGEST",
    "EXECUTOR_ON_EFFECT_MISMATCH",
    "BANKING_ADAPTER_ID",
    "BANKING_ADAPTER_VERSION",
    # downstream
    "DOWNSTREAM_URL",
    "DOWNSTREAM_ALLOW_INSECURE_LOOPBACK",
    "DOWNSTREAM_LOOKUP_URL",
    "DOWNSTREAM_LOOKUP_BY_REFERENCE_URL",
    "DOWNSTREAM_SYSTEM",
    "DOWNSTREAM_OPERATION",
    "DOWNSTREAM_ENVIRONMENT",
    "DOWNSTREAM_TIMEOUT_MS",
    "DOWNSTREAM_CA_FILE",
    "DOWNSTREAM_SPKI_PINS",
    "DOWNSTREAM_CREDENTIAL_KIND",
    "DOWNSTREAM_CREDENTIAL",
    "DOWNSTREAM_CREDENTIAL_FILE",
    "DOWNSTREAM_CREDENTIAL_HEADER",
    "DOWNSTREAM_TOKEN_URL",
    "DOWNSTREAM_CLIENT_ID",
    "DOWNSTREAM_PRIVATE_KEY",
    "DOWNSTREAM_PRIVATE_KEY_FILE",
    "DOWNSTREAM_PRIVATE_KEY_ID",
    "DOWNSTREAM_PRIVATE_KEY_ALGORITHM",
    "DOWNSTREAM_TOKEN_AUDIENCE",
    "DOWNSTREAM_TOKEN_SCOPE",
    "DOWNSTREAM_SIGNING_KEY",
    "DOWNSTREAM_SIGNING_KEY_FILE",
    "DOWNSTREAM_SIGNING_KEY_ID",
    "DOWNSTREAM_SIGNING_ALGORITHM",
)

# Prefixes whose every variable must be one we know: a typo must not fall back to a default.
_OWNED_PREFIXES: Final = ("EXECUTOR_", "DOWNSTREAM_")

# Which variables belong to which downstream credential kind (the others' must be absent).
_KIND_KEYS: Final[Mapping[CredentialKind, tuple[str, ...]]] = {
    CredentialKind.STATIC_HEADER: ("DOWNSTREAM_CREDENTIAL", "DOWNSTREAM_CREDENTIAL_HEADER"),
    CredentialKind.PRIVATE_KEY_JWT: (
        "DOWNSTREAM_TOKEN_URL",
        "DOWNSTREAM_CLIENT_ID",
        "DOWNSTREAM_PRIVATE_KEY",
        "DOWNSTREAM_PRIVATE_KEY_ID",
        "DOWNSTREAM_PRIVATE_KEY_ALGORITHM",
        "DOWNSTREAM_TOKEN_AUDIENCE",
        "DOWNSTREAM_TOKEN_SCOPE",
    ),
    CredentialKind.SIGNED_REQUEST: (
        "DOWNSTREAM_SIGNING_KEY",
        "DOWNSTREAM_SIGNING_KEY_ID",
        "DOWNSTREAM_SIGNING_ALGORITHM",
    ),
}
_KIND_REQUIRED: Final[Mapping[CredentialKind, tuple[str, ...]]] = {
    CredentialKind.STATIC_HEADER: ("DOWNSTREAM_CREDENTIAL_HEADER", "DOWNSTREAM_CREDENTIAL"),
    CredentialKind.PRIVATE_KEY_JWT: (
        "DOWNSTREAM_TOKEN_URL",
        "DOWNSTREAM_CLIENT_ID",
        "DOWNSTREAM_PRIVATE_KEY",
    ),
    CredentialKind.SIGNED_REQUEST: ("DOWNSTREAM_SIGNING_KEY", "DOWNSTREAM_SIGNING_KEY_ID"),
}

# --------------------------------------------------------------------------------------------
# Parsing helpers (messages are ours; they never repeat the input)

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


# Field groups for the shared validators.
_BOOL_FIELDS: Final = (
    "executor_allow_legacy_caller",
    "executor_allow_plaintext_listener",
    "executor_journal_required",
    "executor_ready_requires_no_unknown_attempts",
    "downstream_allow_insecure_loopback",
    "executor_approval_webhook_allow_insecure_loopback",
)
_INT_FIELDS: Final = (
    "port",
    "executor_workers",
    "executor_header_timeout_seconds",
    "executor_body_timeout_seconds",
    "executor_max_connections",
    "executor_max_connections_per_source",
    "executor_intent_ttl_seconds",
    "executor_jwks_refresh_seconds",
    "executor_jwt_clock_tolerance_seconds",
    "executor_posture_interval_seconds",
    "executor_egress_max_response_bytes",
    "executor_journal_retain_days",
    "executor_housekeeping_interval_seconds",
    "executor_attempt_lease_seconds",
    "executor_hard_limit_window_seconds",
    "executor_hard_limit_window_count",
    "executor_hard_limit_window_sum_minor",
    "executor_max_clock_skew_ms",
    "executor_audit_checkpoint_lines",
    "executor_evidence_window_lines",
    "downstream_timeout_ms",
)
_TEXT_FIELDS: Final = (
    "agentsafe_env",
    "executor_actor_id",
    "executor_actor_type",
    "executor_actor_runtime",
    "executor_jwt_audience",
    "executor_replica_id",
    "executor_image_digest",
    "banking_adapter_id",
    "banking_adapter_version",
    "downstream_system",
    "downstream_operation",
    "downstream_environment",
    "downstream_client_id",
    "downstream_private_key_id",
    "downstream_token_audience",
    "downstream_token_scope",
    "downstream_signing_key_id",
)
_PATH_FIELDS: Final = (
    "executor_policy_file",
    "executor_state_dir",
    "executor_principals_file",
    "executor_jwks_file",
    "executor_jwks_ca_file",
    "executor_approval_webhook_ca_file",
    "executor_secrets_dir",
    "executor_tls_cert_file",
    "executor_tls_client_ca_file",
    "executor_journal_dir",
    "executor_halt_file",
    "executor_evidence_dir",
    "downstream_ca_file",
)
# Directories (and the halt file) the process writes or watches: absolute, so the working
# directory never decides where state lands.
_ABSOLUTE_FIELDS: Final = (
    "executor_state_dir",
    "executor_secrets_dir",
    "executor_journal_dir",
    "executor_halt_file",
    "executor_evidence_dir",
)

# Comma-separated lists and their parsers.
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


_LIST_FIELDS: Final[Mapping[str, Callable[[str], tuple[str, ...]]]] = {
    "executor_handlers": _parse_handler_references,
    "executor_egress_allow_cidrs": _parse_cidrs,
    "downstream_spki_pins": _parse_pins,
}

# The downstream URLs and the placeholder each must contain.
_DOWNSTREAM_URLS: Final[Mapping[str, str | None]] = {
    "downstream_url": None,
    "downstream_lookup_url": IDEMPOTENCY_KEY_PLACEHOLDER,
    "downstream_lookup_by_reference_url": PROVIDER_REFERENCE_PLACEHOLDER,
    "downstream_token_url": None,
}


# --------------------------------------------------------------------------------------------
# The model


class ExecutorConfig(BaseModel):
    """Every configuration variable of the executor, typed; attribute = lower-cased variable.

    Secrets are :class:`SecretSource` records (given or not, from the environment or a file),
    never values. Build one with :func:`load_config`; constructing it directly runs the same
    field and cross-field rules.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=False)

    # process and listener
    agentsafe_env: str | None = None
    executor_mode: ExecutorMode
    executor_policy_file: Path
    # Required in both modes unless EXECUTOR_STORE_URL names the shared store: the use store
    # (claims, idempotency, approvals) lives there.
    executor_state_dir: Path | None = None
    executor_bind_address: str = "127.0.0.1"
    port: int = Field(default=8443, ge=0, le=65535)
    # The listener's read deadlines and connection caps (routes/listener.py).
    executor_header_timeout_seconds: int = Field(
        default=HEADER_TIMEOUT_SECONDS_DEFAULT, ge=1, le=300
    )
    executor_body_timeout_seconds: int = Field(default=BODY_TIMEOUT_SECONDS_DEFAULT, ge=1, le=300)
    executor_workers: int = Field(default=WORKERS_DEFAULT, ge=1, le=WORKERS_MAX)
    executor_max_connections: int = Field(default=MAX_CONNECTIONS_DEFAULT, ge=1, le=65_535)
    executor_max_connections_per_source: int = Field(
        default=MAX_CONNECTIONS_PER_SOURCE_DEFAULT, ge=1, le=65_535
    )
    executor_intent_ttl_seconds: int = Field(
        default=INTENT_TTL_SECONDS_DEFAULT, ge=1, le=INTENT_TTL_SECONDS_MAX
    )
    executor_handlers: tuple[str, ...] | None = None
    executor_authority_signing_key: SecretSource = SecretSource("EXECUTOR_AUTHORITY_SIGNING_KEY")

    # callers
    executor_principals_file: Path | None = None
    executor_allow_legacy_caller: bool = False
    executor_tenant_id: str | None = None
    executor_actor_id: str | None = None
    executor_actor_type: str | None = None
    executor_actor_runtime: str | None = None
    executor_caller_token: SecretSource = SecretSource("EXECUTOR_CALLER_TOKEN")
    executor_jwt_audience: str | None = None
    executor_jwks_file: Path | None = None
    executor_jwks_url: str | None = None
    executor_jwks_ca_file: Path | None = None
    executor_jwks_refresh_seconds: int = Field(default=300, ge=60, le=86_400)
    executor_jwt_clock_tolerance_seconds: int = Field(default=30, ge=0, le=300)
    executor_rate_limit_unauthenticated: RateRule = RateRule(20, 60)
    executor_auth_lockout: LockoutRule = LockoutRule(10, 60, 300)
    executor_escalation: EscalationMode = EscalationMode.NONE
    executor_approval_origin: str | None = None
    executor_approval_webhook_url: str | None = None
    executor_approval_webhook_ca_file: Path | None = None
    executor_approval_webhook_allow_insecure_loopback: bool = False

    # host posture and secrets
    executor_posture: PostureMode = PostureMode.ENFORCED
    executor_posture_interval_seconds: int = Field(default=60, ge=10, le=600)
    executor_secrets_dir: Path | None = None

    # TLS listener
    executor_tls_cert_file: Path | None = None
    executor_tls_key: SecretSource = SecretSource("EXECUTOR_TLS_KEY")
    executor_tls_client_ca_file: Path | None = None
    executor_tls_min_version: TlsMinVersion = TlsMinVersion.TLS_1_3
    executor_allow_plaintext_listener: bool = False

    # egress
    executor_egress_max_response_bytes: int = Field(
        default=1024 * 1024, ge=1024, le=16 * 1024 * 1024
    )
    executor_egress_allow_cidrs: tuple[str, ...] = ()

    # journal
    executor_journal_dir: Path | None = None
    executor_journal_required: bool = True
    executor_journal_retain_days: int = Field(default=7, ge=1, le=366)
    executor_housekeeping_interval_seconds: int = Field(default=600, ge=1, le=86_400)
    executor_ready_requires_no_unknown_attempts: bool = False

    # shared store and replicas
    executor_store_url: SecretSource = SecretSource("EXECUTOR_STORE_URL")
    executor_replica_id: str | None = None
    executor_attempt_lease_seconds: int = Field(default=30, ge=5, le=3600)

    # halt
    executor_halt_file: Path | None = None
    executor_halt_on_auth_failures: RateRule = RateRule(50, 60)
    executor_halt_on_egress_refusals: RateRule = RateRule(5, 60)

    # host ceilings
    executor_hard_limit_single_minor: dict[str, int] = Field(default_factory=dict)
    executor_hard_limit_window_seconds: int | None = Field(
        default=None, ge=1, le=HARD_LIMIT_WINDOW_SECONDS_MAX
    )
    executor_hard_limit_window_count: int | None = Field(
        default=None, ge=1, le=HARD_LIMIT_WINDOW_COUNT_MAX
    )
    executor_hard_limit_window_sum_minor: int | None = Field(
        default=None, ge=1, le=MAX_SAFE_INTEGER
    )

    # clocks
    executor_max_clock_skew_ms: int = Field(default=2000, ge=100, le=60_000)

    # evidence
    executor_audit_checkpoint_lines: int = Field(default=100, ge=1, le=100_000)
    executor_evidence_dir: Path | None = None
    executor_evidence_window_lines: int = Field(default=5000, ge=100, le=200_000)
    executor_evidence_signing_key: SecretSource = SecretSource("EXECUTOR_EVIDENCE_SIGNING_KEY")
    executor_image_digest: str | None = None
    executor_on_effect_mismatch: EffectMismatchAction = EffectMismatchAction.HALT
    banking_adapter_id: str = "AGENTSAFE_CORE_BANKING"
    banking_adapter_version: str = "0.1.0"

    # downstream
    downstream_url: str
    downstream_allow_insecure_loopback: bool = False
    downstream_lookup_url: str | None = None
    downstream_lookup_by_reference_url: str | None = None
    downstream_system: str
    downstream_operation: str
    downstream_environment: str | None = None
    downstream_timeout_ms: int = Field(
        default=DOWNSTREAM_TIMEOUT_MS_DEFAULT, ge=1, le=DOWNSTREAM_TIMEOUT_MS_MAX
    )
    downstream_ca_file: Path | None = None
    downstream_spki_pins: tuple[str, ...] | None = None
    downstream_credential_kind: CredentialKind = CredentialKind.STATIC_HEADER
    downstream_credential: SecretSource = SecretSource("DOWNSTREAM_CREDENTIAL")
    downstream_credential_header: str | None = None
    downstream_token_url: str | None = None
    downstream_client_id: str | None = None
    downstream_private_key: SecretSource = SecretSource("DOWNSTREAM_PRIVATE_KEY")
    downstream_private_key_id: str | None = None
    downstream_private_key_algorithm: PrivateKeyAlgorithm | None = None
    downstream_token_audience: str | None = None
    downstream_token_scope: str | None = None
    downstream_signing_key: SecretSource = SecretSource("DOWNSTREAM_SIGNING_KEY")
    downstream_signing_key_id: str | None = None
    downstream_signing_algorithm: SigningAlgorithm | None = None

    # ---- field parsing ------------------------------------------------------------------

    @field_validator(*_BOOL_FIELDS, mode="before")
    @classmethod
    def _bools(cls, value: object) -> object:
        return _parse_bool(value)

    @field_validator(*_INT_FIELDS, mode="before")
    @classmethod
    def _ints(cls, value: object) -> object:
        return _parse_int(value)

    @field_validator(*_TEXT_FIELDS, mode="before")
    @classmethod
    def _texts(cls, value: object) -> object:
        return _check_text(value)

    @field_validator(*_PATH_FIELDS, mode="before")
    @classmethod
    def _paths(cls, value: object) -> object:
        return _check_path(value)

    @field_validator(*_ABSOLUTE_FIELDS, mode="after")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_absolute():
            raise ValueError("must be an absolute path")
        return value

    @field_validator("executor_bind_address", mode="before")
    @classmethod
    def _bind_address(cls, value: object) -> object:
        if isinstance(value, str):
            try:
                ipaddress.ip_address(value)
            except ValueError:
                raise ValueError("must be an IPv4 or IPv6 address") from None
        return value

    @field_validator("executor_tenant_id", mode="before")
    @classmethod
    def _tenant(cls, value: object) -> object:
        if isinstance(value, str) and not _UUID.fullmatch(value):
            raise ValueError("must be a UUID in lower-case canonical form")
        return value

    @field_validator("executor_replica_id", mode="after")
    @classmethod
    def _replica_id(cls, value: str | None) -> str | None:
        if value is not None and not _REPLICA_ID.fullmatch(value):
            raise ValueError("must be 1-253 letters, digits, '.', '_' or '-' (a pod name)")
        return value

    @field_validator("executor_image_digest", mode="after")
    @classmethod
    def _image_digest(cls, value: str | None) -> str | None:
        if value is not None and not _OCI_DIGEST.fullmatch(value):
            raise ValueError("must be an image digest such as sha256:<hex>, optionally name@")
        return value

    @field_validator(
        "executor_rate_limit_unauthenticated",
        "executor_halt_on_auth_failures",
        "executor_halt_on_egress_refusals",
        mode="before",
    )
    @classmethod
    def _rate_rules(cls, value: object) -> object:
        return RateRule.parse(value) if isinstance(value, str) else value

    @field_validator("executor_auth_lockout", mode="before")
    @classmethod
    def _lockout(cls, value: object) -> object:
        return LockoutRule.parse(value) if isinstance(value, str) else value

    @field_validator("executor_hard_limit_single_minor", mode="before")
    @classmethod
    def _ceilings(cls, value: object) -> object:
        if isinstance(value, str):
            return _parse_ceilings(value)
        if isinstance(value, Mapping):
            _parse_ceilings(",".join(f"{k}:{v}" for k, v in value.items()))
        return value

    @field_validator(*_LIST_FIELDS, mode="before")
    @classmethod
    def _lists(cls, value: object, info: ValidationInfo) -> object:
        parse = _LIST_FIELDS[str(info.field_name)]
        if isinstance(value, str):
            return parse(value)
        if isinstance(value, list | tuple):
            return parse(",".join(str(v) for v in value))
        return value

    @field_validator(*_DOWNSTREAM_URLS, mode="after")
    @classmethod
    def _downstream_urls(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None:  # the shape here; https or loopback in _downstream_rules
            check_downstream_url(
                value,
                placeholder=_DOWNSTREAM_URLS[str(info.field_name)],
                allow_insecure_loopback=True,
            )
        return value

    @field_validator("executor_jwks_url", mode="after")
    @classmethod
    def _jwks_url(cls, value: str | None) -> str | None:
        if value is not None and _parse_url(value).scheme != "https":
            raise ValueError("must be an https URL")
        return value

    @field_validator("executor_approval_origin", mode="after")
    @classmethod
    def _approval_origin(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = _parse_url(value)
        if parts.scheme != "https":
            raise ValueError("must be an https origin (https://host[:port])")
        if parts.path not in ("", "/") or parts.query or parts.fragment or "@" in parts.netloc:
            raise ValueError("must be an origin only: no path, query, fragment or credentials")
        return value.rstrip("/")

    @field_validator("executor_approval_webhook_url", mode="after")
    @classmethod
    def _approval_webhook_url(cls, value: str | None) -> str | None:
        if value is not None and _parse_url(value).scheme != "https":
            raise ValueError("must be an https URL")
        return value

    @field_validator("downstream_credential_header", mode="after")
    @classmethod
    def _header(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not HEADER_NAME.fullmatch(value) or len(value) > 128:
            raise ValueError("must be an HTTP header name")
        if is_reserved(value):
            raise ValueError("names a header the executor sets itself")
        return value

    @model_validator(mode="before")
    @classmethod
    def _kind_defaults(cls, data: object) -> object:
        # The defaults of the kind-specific choices apply only to the kind selected; the other
        # kinds' variables stay absent (None) so "must be absent" stays checkable.
        if isinstance(data, dict):
            data = dict(data)
            kind = data.get("downstream_credential_kind", CredentialKind.STATIC_HEADER)
            if kind == CredentialKind.PRIVATE_KEY_JWT:
                data.setdefault("downstream_private_key_algorithm", PrivateKeyAlgorithm.ES256)
            elif kind == CredentialKind.SIGNED_REQUEST:
                data.setdefault("downstream_signing_algorithm", SigningAlgorithm.ED25519)
        return data

    # ---- cross-field rules --------------------------------------------------------------

    @model_validator(mode="after")
    def _rules(self) -> ExecutorConfig:
        for name in SECRET_NAMES:
            source = self.secret_source(name)
            if source.name != name:
                raise ConfigError(name, "is recorded under another secret's name")
        self._production_rules()
        self._caller_rules()
        self._listener_rules()
        self._storage_rules()
        self._lease_rules()
        self._ceiling_rules()
        self._downstream_rules()
        return self

    def _production_rules(self) -> None:
        if not self.production:
            return
        if self.executor_allow_plaintext_listener:
            raise ConfigError(
                "EXECUTOR_ALLOW_PLAINTEXT_LISTENER", "is refused under AGENTSAFE_ENV=production"
            )
        if not self.executor_journal_required:
            raise ConfigError(
                "EXECUTOR_JOURNAL_REQUIRED", "cannot be waived under AGENTSAFE_ENV=production"
            )
        if self.downstream_allow_insecure_loopback:
            raise ConfigError(
                "DOWNSTREAM_ALLOW_INSECURE_LOOPBACK", "is refused under AGENTSAFE_ENV=production"
            )
        if self.executor_approval_webhook_allow_insecure_loopback:
            raise ConfigError(
                "EXECUTOR_APPROVAL_WEBHOOK_ALLOW_INSECURE_LOOPBACK",
                "is refused under AGENTSAFE_ENV=production",
            )
        if self.executor_posture is PostureMode.DEVELOPMENT:
            raise ConfigError(
                "EXECUTOR_POSTURE",
                "this posture is refused under AGENTSAFE_ENV=production",
            )
        if self.legacy_mode and not self.executor_allow_legacy_caller:
            raise ConfigError(
                "EXECUTOR_PRINCIPALS_FILE",
                "is required under AGENTSAFE_ENV=production "
                "(or EXECUTOR_ALLOW_LEGACY_CALLER=true to run on the legacy caller)",
            )
        for name in SECRET_NAMES:
            source = self.secret_source(name)
            if source.origin is SecretOrigin.ENV:
                raise ConfigError(
                    name, f"under AGENTSAFE_ENV=production give it as {name}{SECRET_FILE_SUFFIX}"
                )
        if not self.executor_authority_signing_key.given:
            raise ConfigError(
                "EXECUTOR_AUTHORITY_SIGNING_KEY_FILE",
                "is required under AGENTSAFE_ENV=production (no ephemeral grant key)",
            )
        if self.executor_secrets_dir is None and any(
            self.secret_source(name).origin is SecretOrigin.FILE for name in SECRET_NAMES
        ):
            raise ConfigError(
                "EXECUTOR_SECRETS_DIR",
                "is required under AGENTSAFE_ENV=production when a secret file is mounted",
            )

    def _caller_rules(self) -> None:
        if not self.legacy_mode:
            excluded = (
                ("EXECUTOR_TENANT_ID", self.executor_tenant_id is not None),
                ("EXECUTOR_ACTOR_ID", self.executor_actor_id is not None),
                ("EXECUTOR_ACTOR_TYPE", self.executor_actor_type is not None),
                ("EXECUTOR_ACTOR_RUNTIME", self.executor_actor_runtime is not None),
                (self.executor_caller_token.variable, self.executor_caller_token.given),
            )
            for variable, present in excluded:
                if present:
                    raise ConfigError(
                        variable, "must be absent when EXECUTOR_PRINCIPALS_FILE names the callers"
                    )
        else:
            required = (
                ("EXECUTOR_TENANT_ID", self.executor_tenant_id is not None),
                ("EXECUTOR_ACTOR_ID", self.executor_actor_id is not None),
                ("EXECUTOR_ACTOR_TYPE", self.executor_actor_type is not None),
                ("EXECUTOR_CALLER_TOKEN", self.executor_caller_token.given),
            )
            for variable, present in required:
                if not present:
                    raise ConfigError(
                        variable, "is required without EXECUTOR_PRINCIPALS_FILE (legacy mode)"
                    )
        if self.executor_jwt_audience is not None and self.executor_jwks_file is None:
            raise ConfigError("EXECUTOR_JWKS_FILE", "is required with EXECUTOR_JWT_AUDIENCE")
        if self.executor_jwks_file is not None and self.executor_jwt_audience is None:
            raise ConfigError("EXECUTOR_JWT_AUDIENCE", "is required with EXECUTOR_JWKS_FILE")
        if self.executor_jwks_url is not None and self.executor_jwks_file is None:
            raise ConfigError(
                "EXECUTOR_JWKS_URL", "needs EXECUTOR_JWKS_FILE and EXECUTOR_JWT_AUDIENCE"
            )
        if self.executor_jwks_ca_file is not None and self.executor_jwks_url is None:
            raise ConfigError("EXECUTOR_JWKS_CA_FILE", "is used only with EXECUTOR_JWKS_URL")
        if self.executor_escalation is not EscalationMode.NONE:
            if self.executor_mode is ExecutorMode.SHADOW:
                raise ConfigError(
                    "EXECUTOR_ESCALATION", "must be NONE in shadow, which never escalates"
                )
            if self.legacy_mode:
                raise ConfigError(
                    "EXECUTOR_ESCALATION",
                    "approvals need EXECUTOR_PRINCIPALS_FILE (approvers are principals)",
                )
        approval_settings = (
            ("EXECUTOR_APPROVAL_ORIGIN", self.executor_approval_origin is not None),
            ("EXECUTOR_APPROVAL_WEBHOOK_URL", self.executor_approval_webhook_url is not None),
        )
        for variable, present in approval_settings:
            if present and self.executor_escalation is not EscalationMode.APPROVAL:
                raise ConfigError(variable, "is used only with EXECUTOR_ESCALATION=APPROVAL")
        webhook_extras = (
            ("EXECUTOR_APPROVAL_WEBHOOK_CA_FILE", self.executor_approval_webhook_ca_file),
            (
                "EXECUTOR_APPROVAL_WEBHOOK_ALLOW_INSECURE_LOOPBACK",
                self.executor_approval_webhook_allow_insecure_loopback or None,
            ),
        )
        for variable, value in webhook_extras:
            if value is not None and self.executor_approval_webhook_url is None:
                raise ConfigError(variable, "is used only with EXECUTOR_APPROVAL_WEBHOOK_URL")

    def _listener_rules(self) -> None:
        if self.executor_max_connections_per_source > self.executor_max_connections:
            raise ConfigError(
                "EXECUTOR_MAX_CONNECTIONS_PER_SOURCE", "must not exceed EXECUTOR_MAX_CONNECTIONS"
            )
        if self.executor_allow_plaintext_listener:
            tls = (
                ("EXECUTOR_TLS_CERT_FILE", self.executor_tls_cert_file is not None),
                (self.executor_tls_key.variable, self.executor_tls_key.given),
                ("EXECUTOR_TLS_CLIENT_CA_FILE", self.executor_tls_client_ca_file is not None),
            )
            for variable, present in tls:
                if present:
                    raise ConfigError(
                        variable, "must be absent with EXECUTOR_ALLOW_PLAINTEXT_LISTENER=true"
                    )
            return
        if self.executor_tls_cert_file is None:
            raise ConfigError(
                "EXECUTOR_TLS_CERT_FILE",
                "is required unless EXECUTOR_ALLOW_PLAINTEXT_LISTENER=true",
            )
        if not self.executor_tls_key.given:
            raise ConfigError(
                "EXECUTOR_TLS_KEY", "is required unless EXECUTOR_ALLOW_PLAINTEXT_LISTENER=true"
            )

    def _storage_rules(self) -> None:
        if self.executor_state_dir is None and not self.executor_store_url.given:
            raise ConfigError("EXECUTOR_STATE_DIR", "is required without EXECUTOR_STORE_URL")
        if (
            self.executor_mode is ExecutorMode.ENFORCEMENT
            and self.executor_journal_dir is None
            and self.executor_journal_required
        ):
            raise ConfigError(
                "EXECUTOR_JOURNAL_DIR",
                "is required in enforcement unless EXECUTOR_JOURNAL_REQUIRED=false",
            )
        if self.executor_workers > 1 and self.executor_journal_dir is None:
            raise ConfigError(
                "EXECUTOR_WORKERS",
                "above 1 needs EXECUTOR_JOURNAL_DIR (each worker journals in its own directory)",
            )
        if self.executor_evidence_signing_key.given and self.executor_evidence_dir is None:
            raise ConfigError(
                self.executor_evidence_signing_key.variable, "needs EXECUTOR_EVIDENCE_DIR"
            )

    def _lease_rules(self) -> None:
        """Fencing (issue 29, docs/high-availability.md "Fencing"): with a shared store a
        replica sends only while its attempt's lease, renewed every third of it, outlives the
        dispatch deadline by :data:`LEASE_MARGIN_SECONDS`. Between two renewals a lease has at
        least two thirds of itself left, so ``lease * 2/3 >= dispatch + margin`` lets a healthy
        replica dispatch at any moment; a shorter lease would withhold sends, or tempt a longer
        one, and is refused here."""
        if not self.executor_store_url.given:
            return
        dispatch = self.downstream_timeout_ms / 1000.0
        needed = (
            LEASE_RENEWALS_PER_LEASE
            / (LEASE_RENEWALS_PER_LEASE - 1)
            * (dispatch + LEASE_MARGIN_SECONDS)
        )
        if self.executor_attempt_lease_seconds < needed:
            raise ConfigError(
                "EXECUTOR_ATTEMPT_LEASE_SECONDS",
                f"must be at least 1.5 x (DOWNSTREAM_TIMEOUT_MS in seconds"
                f" + {LEASE_MARGIN_SECONDS:g}) = {needed:g} with a shared store, so a send always"
                " ends under a live lease: raise it, or lower DOWNSTREAM_TIMEOUT_MS",
                code=Code.ATTEMPT_LEASE_TOO_SHORT,
            )

    def _ceiling_rules(self) -> None:
        windowed = (
            self.executor_hard_limit_window_count is not None
            or self.executor_hard_limit_window_sum_minor is not None
        )
        if windowed and self.executor_hard_limit_window_seconds is None:
            raise ConfigError(
                "EXECUTOR_HARD_LIMIT_WINDOW_SECONDS",
                "is required with EXECUTOR_HARD_LIMIT_WINDOW_COUNT or _WINDOW_SUM_MINOR",
            )
        if not windowed and self.executor_hard_limit_window_seconds is not None:
            raise ConfigError(
                "EXECUTOR_HARD_LIMIT_WINDOW_SECONDS",
                "bounds nothing without EXECUTOR_HARD_LIMIT_WINDOW_COUNT or _WINDOW_SUM_MINOR",
            )

    def _downstream_rules(self) -> None:
        for attribute, placeholder in _DOWNSTREAM_URLS.items():
            url = getattr(self, attribute)
            if url is None:
                continue
            try:
                check_downstream_url(
                    url,
                    placeholder=placeholder,
                    allow_insecure_loopback=self.downstream_allow_insecure_loopback,
                )
            except ValueError as exc:
                raise ConfigError(attribute.upper(), str(exc)) from None
        kind = self.downstream_credential_kind
        for other, keys in _KIND_KEYS.items():
            if other is kind:
                continue
            for variable in keys:
                if self._present(variable):
                    shown = (
                        self.secret_source(variable).variable
                        if variable in SECRET_NAMES
                        else variable
                    )
                    raise ConfigError(
                        shown, "belongs to another DOWNSTREAM_CREDENTIAL_KIND and must be absent"
                    )
        for variable in _KIND_REQUIRED[kind]:
            if not self._present(variable):
                raise ConfigError(variable, "is required by the DOWNSTREAM_CREDENTIAL_KIND chosen")

    def _present(self, variable: str) -> bool:
        value = getattr(self, variable.lower())
        if isinstance(value, SecretSource):
            return value.given
        return value is not None

    # ---- what the rest of the code reads ------------------------------------------------

    @property
    def replica_id(self) -> str:
        """``EXECUTOR_REPLICA_ID``, or this host's name (the pod name on Kubernetes)."""
        return self.executor_replica_id or os.uname().nodename

    @property
    def production(self) -> bool:
        return (self.agentsafe_env or "").strip().lower() == PRODUCTION

    @property
    def legacy_mode(self) -> bool:
        """No principals file: one PROPOSER synthesised from the EXECUTOR_TENANT_ID/ACTOR_*."""
        return self.executor_principals_file is None

    @property
    def enforcement(self) -> bool:
        return self.executor_mode is ExecutorMode.ENFORCEMENT

    @property
    def legacy_actor(self) -> Actor | None:
        """The actor legacy mode's one caller names, or ``None`` with a principals file."""
        if not self.legacy_mode or self.executor_actor_id is None:
            return None
        assert self.executor_actor_type is not None
        return Actor(self.executor_actor_id, self.executor_actor_type, self.executor_actor_runtime)

    @property
    def downstream_endpoint(self) -> str:
        """``POST <path of DOWNSTREAM_URL>``: the endpoint the intent's target names."""
        return f"POST {urlsplit(self.downstream_url).path or '/'}"

    def downstream_target(self) -> DownstreamTarget:
        return DownstreamTarget(
            system=self.downstream_system,
            operation=self.downstream_operation,
            endpoint=self.downstream_endpoint,
            environment=self.downstream_environment,
        )

    def secret_source(self, name: str) -> SecretSource:
        """How the secret ``name`` (one of :data:`SECRET_NAMES`) was given."""
        if name not in SECRET_NAMES:
            raise KeyError(name)
        source: SecretSource = getattr(self, name.lower())
        return source

    def secret_sources(self) -> tuple[SecretSource, ...]:
        return tuple(self.secret_source(name) for name in SECRET_NAMES)

    def public_view(self) -> dict[str, Any]:
        """The configuration as JSON values, secrets only as their source (for digests, status).

        Holds no secret value and no digest of one.
        """
        view: dict[str, Any] = {}
        for attribute in type(self).model_fields:
            view[attribute.upper()] = _json_value(getattr(self, attribute))
        return view

    def digest(self) -> str:
        """``sha256:<hex>`` of :meth:`public_view` in canonical JSON (the evidence manifest's)."""
        return sha256_digest(self.public_view())


def _json_value(value: object) -> Any:
    if isinstance(value, SecretSource):
        return {"origin": value.origin.value, "path": value.path}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, RateRule | LockoutRule):
        return _rule_text(value)
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, dict):
        return dict(value)
    return value


def _rule_text(rule: RateRule | LockoutRule) -> str:
    if isinstance(rule, LockoutRule):
        return f"{rule.failures}/{rule.seconds}/{rule.lock_seconds}"
    return f"{rule.count}/{rule.seconds}"


def _display(value: object) -> str | None:
    """How ``agentsafe config`` shows a resolved non-secret value."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, RateRule | LockoutRule):
        return _rule_text(value)
    if isinstance(value, dict):
        return ",".join(f"{k}:{v}" for k, v in value.items()) or None
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)


# --------------------------------------------------------------------------------------------
# Loading


_FILE_KEYS: Final = frozenset(name + SECRET_FILE_SUFFIX for name in SECRET_NAMES)
_KNOWN: Final = frozenset(CONFIG_KEYS)
_ATTRIBUTE_TO_KEY: Final = {key.lower(): key for key in CONFIG_KEYS if key not in _FILE_KEYS}


def _relevant(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables this module reads; refuses unknown owned names and empty values."""
    unknown = sorted(
        key for key in environ if key.startswith(_OWNED_PREFIXES) and key not in _KNOWN
    )
    if unknown:
        raise ConfigError(unknown[0], "is not a variable the executor knows (a typo?)")
    relevant: dict[str, str] = {}
    for key in CONFIG_KEYS:
        if key not in environ:
            continue
        value = environ[key]
        if value == "":
            raise ConfigError(key, "is set but empty; give a value or unset it")
        relevant[key] = value
    return relevant


def _secret_sources(env: Mapping[str, str], *, production: bool) -> dict[str, SecretSource]:
    sources: dict[str, SecretSource] = {}
    for name in SECRET_NAMES:
        file_key = name + SECRET_FILE_SUFFIX
        if name in env and file_key in env:
            raise ConfigError(name, f"give either {name} or {file_key}, never both")
        if file_key in env:
            path = env[file_key]
            if "\x00" in path or any(not ch.isprintable() for ch in path):
                raise ConfigError(file_key, "must be a path without control characters")
            sources[name.lower()] = SecretSource(name, SecretOrigin.FILE, path)
        elif name in env:
            if production:
                raise ConfigError(name, f"under AGENTSAFE_ENV=production give it as {file_key}")
            sources[name.lower()] = SecretSource(name, SecretOrigin.ENV)
    return sources


def load_config(environ: Mapping[str, str]) -> ExecutorConfig:
    """Parse and check the executor's configuration from ``environ``.

    Raises :class:`ConfigError` naming the first variable at fault, never its value.
    """
    env = _relevant(environ)
    production = is_production(env)
    data: dict[str, Any] = {
        key.lower(): value
        for key, value in env.items()
        if key not in _FILE_KEYS and key not in SECRET_NAMES
    }
    data.update(_secret_sources(env, production=production))
    try:
        return ExecutorConfig.model_validate(data)
    except ValidationError as exc:
        raise _translate(exc, env) from None


def _translate(exc: ValidationError, env: Mapping[str, str]) -> ConfigError:
    error = exc.errors(include_url=False, include_input=False)[0]
    loc = error.get("loc") or ()
    attribute = str(loc[0]) if loc else ""
    variable = _ATTRIBUTE_TO_KEY.get(attribute, attribute.upper() or "configuration")
    problem = _problem(error, attribute)
    raw = env.get(variable)
    if raw is not None and len(raw) >= 8 and raw in problem:
        problem = "has an invalid value"
    return ConfigError(variable, problem)


def _problem(error: Mapping[str, Any], attribute: str) -> str:
    kind = str(error.get("type", ""))
    ctx: Mapping[str, Any] = error.get("ctx") or {}
    if kind == "missing":
        return "is required"
    if kind in ("value_error", "assertion_error"):
        message = str(ctx.get("error", "")) or str(error.get("msg", ""))
        return message or "has an invalid value"
    if kind in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
        low, high = _bounds(attribute)
        if low is not None and high is not None:
            return f"must be a whole number from {low} to {high}"
        return "is out of range"
    if kind == "enum":
        expected = str(ctx.get("expected", "")).replace("'", "")
        return f"must be {expected}" if expected else "is not one of the allowed values"
    if kind.startswith("int"):
        return "must be a whole number written in decimal digits"
    if kind.startswith("bool"):
        return "must be true or false"
    return "has an invalid value"


def _bounds(attribute: str) -> tuple[int | None, int | None]:
    field = ExecutorConfig.model_fields.get(attribute)
    low: int | None = None
    high: int | None = None
    for item in field.metadata if field is not None else ():
        if isinstance(item, annotated_types.Ge):
            low = int(item.ge)  # type: ignore[call-overload]
        elif isinstance(item, annotated_types.Le):
            high = int(item.le)  # type: ignore[call-overload]
    return low, high


# --------------------------------------------------------------------------------------------
# agentsafe config


def describe_config(environ: Mapping[str, str]) -> list[ConfigRow]:
    """What resolved and from where, one row per variable (a secret's two forms are one row).

    A secret's value is never read here and is shown only as ``<set>``. Raises
    :class:`ConfigError` exactly as :func:`load_config` does.
    """
    config = load_config(environ)
    rows: list[ConfigRow] = []
    for key in CONFIG_KEYS:
        if key in _FILE_KEYS:
            continue
        value = getattr(config, key.lower())
        if isinstance(value, SecretSource):
            if value.given:
                rows.append(ConfigRow(key, "<set>", value.describe()))
            else:
                rows.append(ConfigRow(key, None, "unset"))
            continue
        shown = _display(value)
        if key in environ:
            source = "env"
        elif shown is None:
            source = "unset"
        else:
            source = "default"
        rows.append(ConfigRow(key, shown, source))
    return rows


def render_config_table(rows: Iterable[ConfigRow], *, console: Console | None = None) -> str:
    """Render rows as a table with rich; print it to ``console`` too when one is given.

    Values are passed as plain ``Text`` so nothing in them is read as rich markup.
    """
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(title="agentsafe configuration", show_lines=False)
    table.add_column("variable", no_wrap=True)
    table.add_column("value", overflow="fold")
    table.add_column("source", overflow="fold")
    for row in rows:
        value = Text(row.value) if row.value is not None else Text("-", style="dim")
        table.add_row(Text(row.key), value, Text(row.source))
    buffer = StringIO()
    Console(file=buffer, width=160, color_system=None, force_terminal=False).print(table)
    if console is not None:
        console.print(table)
    return buffer.getvalue()
