"""The intents the unit tests build, in one place.

- :func:`make_intent` captures a real ``agent-safe.intent/1`` through
  :func:`~agentsafe.executor.intent.capture_intent`: a synthetic payout by a legacy caller, every
  argument overridable.
- :func:`numbered_intent` builds intent number ``n`` straight from its binding, for the journal
  and reconciliation tests, which need many intents with distinct ids, keys and hashes and never
  a full capture.
- :func:`opened_record` is the ATTEMPT_OPENED record of an intent, as the journal hands it to
  the shared store's mirror.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentsafe.executor.intent import (
    CapturedIntent,
    DownstreamTarget,
    capture_intent,
    intent_hash,
)
from agentsafe.executor.principals import Actor, Principal, legacy_principal

__all__ = [
    "PAYOUT_PARAMETERS",
    "PAYOUT_PRINCIPAL",
    "PAYOUT_TARGET",
    "make_intent",
    "numbered_intent",
    "opened_record",
]

PAYOUT_PRINCIPAL = legacy_principal(
    tenant_id="7d1f4a52-3f0e-4d4b-9a57-0c3f7f2f9b11", actor=Actor("agent-1", "ai_agent")
)
PAYOUT_TARGET = DownstreamTarget("synthetic", "payouts.create", "http://127.0.0.1/payouts")
PAYOUT_PARAMETERS: Mapping[str, Any] = {"amountMinor": 5000, "currency": "USD"}


def make_intent(
    *,
    now: float,
    principal: Principal = PAYOUT_PRINCIPAL,
    action: str = "create_payout",
    resource: str = "payout:synthetic-beneficiary-1",
    parameters: Mapping[str, Any] = PAYOUT_PARAMETERS,
    idempotency_key: str = "payout-1-v1",
    target: DownstreamTarget = PAYOUT_TARGET,
    ttl_seconds: int = 60,
) -> CapturedIntent:
    """A captured intent, as the pipeline would capture it at ``now``."""
    return capture_intent(
        principal=principal,
        action=action,
        resource=resource,
        parameters=parameters,
        idempotency_key=idempotency_key,
        target=target,
        now=now,
        ttl_seconds=ttl_seconds,
    )


def numbered_intent(number: int, *, parameters: Mapping[str, Any] | None = None) -> CapturedIntent:
    """Intent ``number``: id ``00000000-0000-4000-8000-<number>``, key ``key-<number>``."""
    binding = {
        "protocol_version": "agent-safe.intent/1",
        "tenant_id": "tenant-1",
        "intent_id": f"00000000-0000-4000-8000-{number:012d}",
        "idempotency_key": f"key-{number}",
        "action": {
            "type": "create_payout",
            "resource": "payout:1",
            "parameters": dict(
                parameters if parameters is not None else {"amountMinor": number, "currency": "USD"}
            ),
        },
        "context": {"caller_principal": "agent-1"},
    }
    return CapturedIntent(binding=binding, intent_hash=intent_hash(binding))


def opened_record(attempt_id: str, intent: CapturedIntent) -> dict[str, Any]:
    """ATTEMPT_OPENED for ``intent``, as the journal hands it to ``SharedAttemptMirror.record``."""
    return {
        "attempt_id": attempt_id,
        "at": "2026-12-01T08:00:00.000Z",
        "intent_hash": intent.intent_hash,
        "intent": intent.binding,
        "caller": "agent",
        "action": intent.action,
    }
