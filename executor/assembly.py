"""Builders that turn a checked configuration into the executor's components.

Each function here is small and pure-ish: it takes the configuration and what it needs, and
returns one component or raises :class:`~agentsafe.executor.errors.ConfigError` naming the
variable. ``serve.py`` calls them in the start order.

Callers: ``serve.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .clock import Clock
from .config import CredentialKind, ExecutorConfig
from .door.door import Door, LegacyCaller
from .door.principals_file import PrincipalSet, load_principals_file
from .door.workload import JwksSource, WorkloadVerifier
from .egress.credentials import (
    DownstreamCredential,
    PrivateKeyJwtCredential,
    SignedRequestCredential,
    StaticHeaderCredential,
)
from .egress.guard import Destination, GuardedClient
from .errors import ConfigError
from .events import Streams
from .host.halt import HaltState
from .host.metrics import ExecutorMetrics
from .host.secrets import SecretStore
from .host.tlsctx import ReloadingTlsContext, TlsSettings
from .principals import legacy_principal
from .windows import DoorWindows

__all__ = [
    "build_credential",
    "build_door",
    "build_tls",
    "build_transport",
    "destinations",
    "load_principals",
]

PLACEHOLDERS = ("{idempotency_key}", "{provider_reference}")


def _prefix(url: str) -> str:
    """The configured address up to its first placeholder: the path prefix the guard allows."""
    cut = min((url.index(p) for p in PLACEHOLDERS if p in url), default=len(url))
    return url[:cut]


def destinations(config: ExecutorConfig) -> list[Destination]:
    """Every address the configuration names, each with its own trust anchor and pins."""
    anchor = str(config.downstream_ca_file) if config.downstream_ca_file else None
    pins = tuple(config.downstream_spki_pins or ())
    loopback = config.downstream_allow_insecure_loopback
    urls = [
        config.downstream_url,
        config.downstream_lookup_url,
        config.downstream_lookup_by_reference_url,
        config.downstream_token_url,
    ]
    out = [
        Destination(_prefix(url), ca_file=anchor, spki_pins=pins, allow_insecure_loopback=loopback)
        for url in urls
        if url
    ]
    if config.executor_jwks_url:
        jwks_anchor = str(config.executor_jwks_ca_file) if config.executor_jwks_ca_file else None
        out.append(Destination(config.executor_jwks_url, ca_file=jwks_anchor))
    return out


def build_transport(
    config: ExecutorConfig, streams: Streams, *, on_refusal: Callable[[str], None]
) -> GuardedClient:
    return GuardedClient(
        destinations(config),
        streams,
        max_response_bytes=config.executor_egress_max_response_bytes,
        on_refusal=on_refusal,
    )


def build_credential(
    config: ExecutorConfig, secrets: SecretStore, transport: GuardedClient, clock: Clock
) -> DownstreamCredential:
    kind = config.downstream_credential_kind
    if kind is CredentialKind.STATIC_HEADER:
        if secrets.get("DOWNSTREAM_CREDENTIAL") is None or not config.downstream_credential_header:
            raise ConfigError("DOWNSTREAM_CREDENTIAL", "is required for STATIC_HEADER")
        return StaticHeaderCredential(
            config.downstream_credential_header, secrets.current("DOWNSTREAM_CREDENTIAL")
        )
    if kind is CredentialKind.PRIVATE_KEY_JWT:
        handle = secrets.current("DOWNSTREAM_PRIVATE_KEY")
        if (
            secrets.get("DOWNSTREAM_PRIVATE_KEY") is None
            or not config.downstream_token_url
            or not config.downstream_client_id
        ):
            raise ConfigError("DOWNSTREAM_PRIVATE_KEY", "is required for PRIVATE_KEY_JWT")
        algorithm = config.downstream_private_key_algorithm
        return PrivateKeyJwtCredential(
            client_id=config.downstream_client_id,
            token_url=config.downstream_token_url,
            private_key=handle,
            transport=transport,
            algorithm="PS256" if algorithm is not None and algorithm.value == "PS256" else "ES256",
            audience=config.downstream_token_audience,
            key_id=config.downstream_private_key_id,
            scope=config.downstream_token_scope,
            clock=clock,
        )
    handle = secrets.current("DOWNSTREAM_SIGNING_KEY")
    if secrets.get("DOWNSTREAM_SIGNING_KEY") is None or not config.downstream_signing_key_id:
        raise ConfigError("DOWNSTREAM_SIGNING_KEY", "is required for SIGNED_REQUEST")
    algorithm_name = config.downstream_signing_algorithm
    return SignedRequestCredential(
        key_id=config.downstream_signing_key_id,
        signing_key=handle,
        algorithm=(
            "hmac-sha256"
            if algorithm_name is not None and algorithm_name.value == "hmac-sha256"
            else "ed25519"
        ),
        clock=clock,
    )


def load_principals(config: ExecutorConfig, actions: Sequence[str]) -> PrincipalSet:
    assert config.executor_principals_file is not None
    return load_principals_file(
        config.executor_principals_file,
        registered_actions=actions,
        jwt_configured=bool(config.executor_jwt_audience and config.executor_jwks_file),
        client_ca_configured=config.executor_tls_client_ca_file is not None,
    )


def build_door(
    config: ExecutorConfig,
    *,
    secrets: SecretStore,
    actions: Sequence[str],
    streams: Streams,
    metrics: ExecutorMetrics,
    clock: Clock,
    halt: HaltState,
    jwks_fetch: Any = None,
) -> tuple[Door, JwksSource | None]:
    """The door for a principals file, or for the one legacy caller."""
    windows = DoorWindows(
        clock=clock,
        unauthenticated=config.executor_rate_limit_unauthenticated,
        lockout=config.executor_auth_lockout,
    )
    jwks: JwksSource | None = None
    workload: WorkloadVerifier | None = None
    if config.executor_jwks_file is not None and config.executor_jwt_audience:
        jwks = JwksSource(
            config.executor_jwks_file,
            security=streams.security,
            fetch=jwks_fetch,
            refresh_seconds=config.executor_jwks_refresh_seconds,
        )
        workload = WorkloadVerifier(
            jwks,
            audience=config.executor_jwt_audience,
            clock=clock,
            clock_tolerance_seconds=config.executor_jwt_clock_tolerance_seconds,
        )
    principals: PrincipalSet | LegacyCaller
    if config.executor_principals_file is not None:
        principals = load_principals(config, actions)
        for principal_id in principals.bearer_principal_ids():
            streams.security.emit("BEARER_PRINCIPAL_CONFIGURED", {"principal": principal_id})
    else:
        token = secrets.current("EXECUTOR_CALLER_TOKEN")
        actor = config.legacy_actor
        if (
            secrets.get("EXECUTOR_CALLER_TOKEN") is None
            or actor is None
            or config.executor_tenant_id is None
        ):
            raise ConfigError("EXECUTOR_CALLER_TOKEN", "legacy mode needs the caller token")
        principals = LegacyCaller(
            legacy_principal(tenant_id=config.executor_tenant_id, actor=actor),
            token,
            require_client_certificate=config.executor_tls_client_ca_file is not None,
        )
        streams.security.emit("LEGACY_PRINCIPAL_MODE", {"principal": principals.principal.id})
    door = Door(
        principals,
        windows=windows,
        clock=clock,
        security=streams.security,
        workload=workload,
        metrics=metrics,
        on_refusal=halt.record_auth_refusal,
    )
    return door, jwks


def build_tls(
    config: ExecutorConfig, secrets: SecretStore, streams: Streams, metrics: ExecutorMetrics
) -> ReloadingTlsContext | None:
    if config.executor_allow_plaintext_listener:
        return None
    if config.executor_tls_cert_file is None:
        raise ConfigError("EXECUTOR_TLS_CERT_FILE", "is required unless the listener is plaintext")

    def key() -> Any:
        handle = secrets.get("EXECUTOR_TLS_KEY")
        if handle is None:
            raise ConfigError("EXECUTOR_TLS_KEY", "is required with a certificate")
        return handle

    settings = TlsSettings(
        cert_file=Path(config.executor_tls_cert_file),
        key=key,
        min_version="1.2" if config.executor_tls_min_version.value == "1.2" else "1.3",
        client_ca_file=(
            Path(config.executor_tls_client_ca_file) if config.executor_tls_client_ca_file else None
        ),
        key_dir=Path(config.executor_state_dir) if config.executor_state_dir else None,
    )
    return ReloadingTlsContext(settings, security=streams.security, metrics=metrics)
