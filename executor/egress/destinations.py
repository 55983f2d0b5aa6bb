"""What the executor may reach: every address its configuration names, each with its own trust
anchor and pins, and the one guarded client built over them.

:func:`destinations` reads the configuration (the downstream addresses up to their first
placeholder, the token endpoint, ``EXECUTOR_JWKS_URL``, ``EXECUTOR_APPROVAL_WEBHOOK_URL``);
:func:`build_transport` is the :class:`~agentsafe.executor.egress.guard.GuardedClient` every
outbound connection goes through.

Callers: ``assembly.py`` (the executor's transport; it re-exports both for the gateway and
the doctor).
"""

from __future__ import annotations

from collections.abc import Callable

from ..config import IDEMPOTENCY_KEY_PLACEHOLDER, PROVIDER_REFERENCE_PLACEHOLDER, ExecutorConfig
from ..events import Streams
from .guard import Destination, GuardedClient

__all__ = ["PLACEHOLDERS", "build_transport", "destinations"]

PLACEHOLDERS = (IDEMPOTENCY_KEY_PLACEHOLDER, PROVIDER_REFERENCE_PLACEHOLDER)


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
    if config.executor_approval_webhook_url:
        ca = config.executor_approval_webhook_ca_file
        out.append(
            Destination(
                config.executor_approval_webhook_url,
                ca_file=str(ca) if ca else None,
                allow_insecure_loopback=config.executor_approval_webhook_allow_insecure_loopback,
            )
        )
    return out


def build_transport(
    config: ExecutorConfig, streams: Streams, *, on_refusal: Callable[[str], None]
) -> GuardedClient:
    return GuardedClient(
        destinations(config),
        streams,
        max_response_bytes=config.executor_egress_max_response_bytes,
        on_refusal=on_refusal,
        allowed_networks=config.executor_egress_allow_cidrs,
    )
