"""The rules between configuration variables: checked once every variable is read.

Role: the cross-field rules of the executor's configuration, in six groups (production, callers,
listener, storage, leases, host ceilings) and the downstream credential kinds. Each refusal is a
:class:`~agentsafe.executor.errors.ConfigError` naming the variable at fault (usually the one
that is missing, or the one that must go), never a value. ``docs/configuration.md`` ("Rules
between variables") lists them for people. :func:`kind_defaults` gives the credential kind's own
choices their defaults before the fields are read.

Callers: ``config/model.py`` (its model validators run :func:`kind_defaults` and :func:`check`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

from ..codes import Code
from ..errors import ConfigError
from .parsing import URL_PLACEHOLDERS, check_downstream_url
from .table import ROWS, SECRET_NAMES
from .values import (
    LEASE_MARGIN_SECONDS,
    LEASE_RENEWALS_PER_LEASE,
    SECRET_FILE_SUFFIX,
    CredentialKind,
    EscalationMode,
    ExecutorMode,
    PostureMode,
    PrivateKeyAlgorithm,
    SecretOrigin,
    SecretSource,
    SigningAlgorithm,
)

if TYPE_CHECKING:
    from .readers import Readers as ExecutorConfig

__all__ = ["check", "kind_defaults"]

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

# The downstream URLs (in the table's order) and the placeholder each must contain.
_DOWNSTREAM_URLS: Final[tuple[tuple[str, str | None], ...]] = tuple(
    (row.attribute, URL_PLACEHOLDERS[row.kind]) for row in ROWS if row.kind in URL_PLACEHOLDERS
)


def kind_defaults(data: object) -> object:
    """The defaults of the kind-specific choices apply only to the kind selected; the other
    kinds' variables stay absent (None) so "must be absent" stays checkable."""
    if isinstance(data, dict):
        data = dict(data)
        kind = data.get("downstream_credential_kind", CredentialKind.STATIC_HEADER)
        if kind == CredentialKind.PRIVATE_KEY_JWT:
            data.setdefault("downstream_private_key_algorithm", PrivateKeyAlgorithm.ES256)
        elif kind == CredentialKind.SIGNED_REQUEST:
            data.setdefault("downstream_signing_algorithm", SigningAlgorithm.ED25519)
    return data


def check(config: ExecutorConfig) -> None:
    """Every rule, in order; raises :class:`ConfigError` at the first one broken."""
    for name in SECRET_NAMES:
        source = config.secret_source(name)
        if source.name != name:
            raise ConfigError(name, "is recorded under another secret's name")
    _production(config)
    _caller(config)
    _listener(config)
    _storage(config)
    _lease(config)
    _ceiling(config)
    _downstream(config)


def _production(config: ExecutorConfig) -> None:
    if not config.production:
        return
    if config.executor_allow_plaintext_listener:
        raise ConfigError(
            "EXECUTOR_ALLOW_PLAINTEXT_LISTENER", "is refused under AGENTSAFE_ENV=production"
        )
    if not config.executor_journal_required:
        raise ConfigError(
            "EXECUTOR_JOURNAL_REQUIRED", "cannot be waived under AGENTSAFE_ENV=production"
        )
    if config.downstream_allow_insecure_loopback:
        raise ConfigError(
            "DOWNSTREAM_ALLOW_INSECURE_LOOPBACK", "is refused under AGENTSAFE_ENV=production"
        )
    if config.executor_approval_webhook_allow_insecure_loopback:
        raise ConfigError(
            "EXECUTOR_APPROVAL_WEBHOOK_ALLOW_INSECURE_LOOPBACK",
            "is refused under AGENTSAFE_ENV=production",
        )
    if config.executor_posture is PostureMode.DEVELOPMENT:
        raise ConfigError(
            "EXECUTOR_POSTURE",
            "this posture is refused under AGENTSAFE_ENV=production",
        )
    if config.legacy_mode and not config.executor_allow_legacy_caller:
        raise ConfigError(
            "EXECUTOR_PRINCIPALS_FILE",
            "is required under AGENTSAFE_ENV=production "
            "(or EXECUTOR_ALLOW_LEGACY_CALLER=true to run on the legacy caller)",
        )
    for name in SECRET_NAMES:
        source = config.secret_source(name)
        if source.origin is SecretOrigin.ENV:
            raise ConfigError(
                name, f"under AGENTSAFE_ENV=production give it as {name}{SECRET_FILE_SUFFIX}"
            )
    if not config.executor_authority_signing_key.given:
        raise ConfigError(
            "EXECUTOR_AUTHORITY_SIGNING_KEY_FILE",
            "is required under AGENTSAFE_ENV=production (no ephemeral grant key)",
        )
    if config.executor_secrets_dir is None and any(
        config.secret_source(name).origin is SecretOrigin.FILE for name in SECRET_NAMES
    ):
        raise ConfigError(
            "EXECUTOR_SECRETS_DIR",
            "is required under AGENTSAFE_ENV=production when a secret file is mounted",
        )


def _caller(config: ExecutorConfig) -> None:
    if not config.legacy_mode:
        excluded = (
            ("EXECUTOR_TENANT_ID", config.executor_tenant_id is not None),
            ("EXECUTOR_ACTOR_ID", config.executor_actor_id is not None),
            ("EXECUTOR_ACTOR_TYPE", config.executor_actor_type is not None),
            ("EXECUTOR_ACTOR_RUNTIME", config.executor_actor_runtime is not None),
            (config.executor_caller_token.variable, config.executor_caller_token.given),
        )
        for variable, present in excluded:
            if present:
                raise ConfigError(
                    variable, "must be absent when EXECUTOR_PRINCIPALS_FILE names the callers"
                )
    else:
        required = (
            ("EXECUTOR_TENANT_ID", config.executor_tenant_id is not None),
            ("EXECUTOR_ACTOR_ID", config.executor_actor_id is not None),
            ("EXECUTOR_ACTOR_TYPE", config.executor_actor_type is not None),
            ("EXECUTOR_CALLER_TOKEN", config.executor_caller_token.given),
        )
        for variable, present in required:
            if not present:
                raise ConfigError(
                    variable, "is required without EXECUTOR_PRINCIPALS_FILE (legacy mode)"
                )
    if config.executor_jwt_audience is not None and config.executor_jwks_file is None:
        raise ConfigError("EXECUTOR_JWKS_FILE", "is required with EXECUTOR_JWT_AUDIENCE")
    if config.executor_jwks_file is not None and config.executor_jwt_audience is None:
        raise ConfigError("EXECUTOR_JWT_AUDIENCE", "is required with EXECUTOR_JWKS_FILE")
    if config.executor_jwks_url is not None and config.executor_jwks_file is None:
        raise ConfigError("EXECUTOR_JWKS_URL", "needs EXECUTOR_JWKS_FILE and EXECUTOR_JWT_AUDIENCE")
    if config.executor_jwks_ca_file is not None and config.executor_jwks_url is None:
        raise ConfigError("EXECUTOR_JWKS_CA_FILE", "is used only with EXECUTOR_JWKS_URL")
    if config.executor_escalation is not EscalationMode.NONE:
        if config.executor_mode is ExecutorMode.SHADOW:
            raise ConfigError(
                "EXECUTOR_ESCALATION", "must be NONE in shadow, which never escalates"
            )
        if config.legacy_mode:
            raise ConfigError(
                "EXECUTOR_ESCALATION",
                "approvals need EXECUTOR_PRINCIPALS_FILE (approvers are principals)",
            )
    approval_settings = (
        ("EXECUTOR_APPROVAL_ORIGIN", config.executor_approval_origin is not None),
        ("EXECUTOR_APPROVAL_WEBHOOK_URL", config.executor_approval_webhook_url is not None),
    )
    for variable, present in approval_settings:
        if present and config.executor_escalation is not EscalationMode.APPROVAL:
            raise ConfigError(variable, "is used only with EXECUTOR_ESCALATION=APPROVAL")
    webhook_extras = (
        ("EXECUTOR_APPROVAL_WEBHOOK_CA_FILE", config.executor_approval_webhook_ca_file),
        (
            "EXECUTOR_APPROVAL_WEBHOOK_ALLOW_INSECURE_LOOPBACK",
            config.executor_approval_webhook_allow_insecure_loopback or None,
        ),
    )
    for variable, value in webhook_extras:
        if value is not None and config.executor_approval_webhook_url is None:
            raise ConfigError(variable, "is used only with EXECUTOR_APPROVAL_WEBHOOK_URL")


def _listener(config: ExecutorConfig) -> None:
    if config.executor_max_connections_per_source > config.executor_max_connections:
        raise ConfigError(
            "EXECUTOR_MAX_CONNECTIONS_PER_SOURCE", "must not exceed EXECUTOR_MAX_CONNECTIONS"
        )
    if config.executor_allow_plaintext_listener:
        tls = (
            ("EXECUTOR_TLS_CERT_FILE", config.executor_tls_cert_file is not None),
            (config.executor_tls_key.variable, config.executor_tls_key.given),
            ("EXECUTOR_TLS_CLIENT_CA_FILE", config.executor_tls_client_ca_file is not None),
        )
        for variable, present in tls:
            if present:
                raise ConfigError(
                    variable, "must be absent with EXECUTOR_ALLOW_PLAINTEXT_LISTENER=true"
                )
        return
    if config.executor_tls_cert_file is None:
        raise ConfigError(
            "EXECUTOR_TLS_CERT_FILE",
            "is required unless EXECUTOR_ALLOW_PLAINTEXT_LISTENER=true",
        )
    if not config.executor_tls_key.given:
        raise ConfigError(
            "EXECUTOR_TLS_KEY", "is required unless EXECUTOR_ALLOW_PLAINTEXT_LISTENER=true"
        )


def _storage(config: ExecutorConfig) -> None:
    if config.executor_state_dir is None and not config.executor_store_url.given:
        raise ConfigError("EXECUTOR_STATE_DIR", "is required without EXECUTOR_STORE_URL")
    if (
        config.executor_mode is ExecutorMode.ENFORCEMENT
        and config.executor_journal_dir is None
        and config.executor_journal_required
    ):
        raise ConfigError(
            "EXECUTOR_JOURNAL_DIR",
            "is required in enforcement unless EXECUTOR_JOURNAL_REQUIRED=false",
        )
    if config.executor_workers > 1 and config.executor_journal_dir is None:
        raise ConfigError(
            "EXECUTOR_WORKERS",
            "above 1 needs EXECUTOR_JOURNAL_DIR (each worker journals in its own directory)",
        )
    if config.executor_evidence_signing_key.given and config.executor_evidence_dir is None:
        raise ConfigError(
            config.executor_evidence_signing_key.variable, "needs EXECUTOR_EVIDENCE_DIR"
        )


def _lease(config: ExecutorConfig) -> None:
    """Fencing (issue 29, docs/high-availability.md "Fencing"): with a shared store a
    replica sends only while its attempt's lease, renewed every third of it, outlives the
    dispatch deadline by :data:`LEASE_MARGIN_SECONDS`. Between two renewals a lease has at
    least two thirds of itself left, so ``lease * 2/3 >= dispatch + margin`` lets a healthy
    replica dispatch at any moment; a shorter lease would withhold sends, or tempt a longer
    one, and is refused here."""
    if not config.executor_store_url.given:
        return
    dispatch = config.downstream_timeout_ms / 1000.0
    needed = (
        LEASE_RENEWALS_PER_LEASE
        / (LEASE_RENEWALS_PER_LEASE - 1)
        * (dispatch + LEASE_MARGIN_SECONDS)
    )
    if config.executor_attempt_lease_seconds < needed:
        raise ConfigError(
            "EXECUTOR_ATTEMPT_LEASE_SECONDS",
            f"must be at least 1.5 x (DOWNSTREAM_TIMEOUT_MS in seconds"
            f" + {LEASE_MARGIN_SECONDS:g}) = {needed:g} with a shared store, so a send always"
            " ends under a live lease: raise it, or lower DOWNSTREAM_TIMEOUT_MS",
            code=Code.ATTEMPT_LEASE_TOO_SHORT,
        )


def _ceiling(config: ExecutorConfig) -> None:
    windowed = (
        config.executor_hard_limit_window_count is not None
        or config.executor_hard_limit_window_sum_minor is not None
    )
    if windowed and config.executor_hard_limit_window_seconds is None:
        raise ConfigError(
            "EXECUTOR_HARD_LIMIT_WINDOW_SECONDS",
            "is required with EXECUTOR_HARD_LIMIT_WINDOW_COUNT or _WINDOW_SUM_MINOR",
        )
    if not windowed and config.executor_hard_limit_window_seconds is not None:
        raise ConfigError(
            "EXECUTOR_HARD_LIMIT_WINDOW_SECONDS",
            "bounds nothing without EXECUTOR_HARD_LIMIT_WINDOW_COUNT or _WINDOW_SUM_MINOR",
        )


def _downstream(config: ExecutorConfig) -> None:
    for attribute, placeholder in _DOWNSTREAM_URLS:
        url = getattr(config, attribute)
        if url is None:
            continue
        try:
            check_downstream_url(
                url,
                placeholder=placeholder,
                allow_insecure_loopback=config.downstream_allow_insecure_loopback,
            )
        except ValueError as exc:
            raise ConfigError(attribute.upper(), str(exc)) from None
    kind = config.downstream_credential_kind
    for other, keys in _KIND_KEYS.items():
        if other is kind:
            continue
        for variable in keys:
            if _present(config, variable):
                shown = (
                    config.secret_source(variable).variable
                    if variable in SECRET_NAMES
                    else variable
                )
                raise ConfigError(
                    shown, "belongs to another DOWNSTREAM_CREDENTIAL_KIND and must be absent"
                )
    for variable in _KIND_REQUIRED[kind]:
        if not _present(config, variable):
            raise ConfigError(variable, "is required by the DOWNSTREAM_CREDENTIAL_KIND chosen")


def _present(config: ExecutorConfig, variable: str) -> bool:
    value = getattr(config, variable.lower())
    if isinstance(value, SecretSource):
        return value.given
    return value is not None
