"""The configuration's constants, enumerations and small values (no parsing, no rules).

Role: the bounds other parts state too (the operator's AgentPolicy schema imports them, never
copies them), the enumerations a variable may take, and :class:`SecretSource`, which records
whether and how a secret was given and never its value.

Callers: ``config/__init__.py`` (the public face re-exports every name), ``config/table.py``
(the rows' types and defaults), ``config/parsing.py``, ``config/model.py``, ``config/rules.py``,
``config/loading.py``, ``tools/config_view.py``.
Also imported by ``tools/config_docs.py`` and ``config/readers.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from ..windows import LockoutRule, RateRule

__all__ = [
    "BODY_TIMEOUT_SECONDS_DEFAULT",
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
    "WORKERS_DEFAULT",
    "WORKERS_MAX",
    "CredentialKind",
    "EffectMismatchAction",
    "EscalationMode",
    "ExecutorMode",
    "PostureMode",
    "PrivateKeyAlgorithm",
    "SecretOrigin",
    "SecretSource",
    "SigningAlgorithm",
    "TlsMinVersion",
    "rule_text",
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
# this margin off its local view of a lease (clock rates differ slightly); see rules.py.
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


def rule_text(rule: RateRule | LockoutRule) -> str:
    """A window rule as its variable writes it (``20/60``, ``10/60/300``)."""
    if isinstance(rule, LockoutRule):
        return f"{rule.failures}/{rule.seconds}/{rule.lock_seconds}"
    return f"{rule.count}/{rule.seconds}"
