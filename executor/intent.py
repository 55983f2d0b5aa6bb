"""Intent capture: the exact ``agent-safe.intent/1`` binding and its hash.

A proposal becomes an intent here. The binding's fields and order of hashing follow the public
conformance vectors: tenant, actor and downstream target come from configuration (through the
authenticated principal), never from the request; the principal's id travels inside the hashed
intent as ``context.caller_principal``. ``intent_hash = "sha256:" + hex(sha256(JCS(binding)))``.

Also here: the structural bounds every request body passes before any other work
(:func:`check_json_bounds`), and the checks on a captured intent after the door: a reconciliation
or escalation presents only the caller's own intent (:func:`check_intent_owner`), and an approver
never decides an intent it proposed (:func:`check_separation`).

Callers: the HTTP layer (``routes/app.py``), ``lifecycle/pipeline.py``,
``lifecycle/reconcile.py``, ``dispatch/seam.py``, ``policy/authority.py``.
Also imported by ``gateway/intercept.py``, ``lifecycle/attempt.py``, ``policy/trial.py``,
``routes/approvals.py``, ``routes/schemas.py``.
Also imported by ``lifecycle/escalations.py``, ``lifecycle/outcomes.py``,
``lifecycle/reconciliations.py``.
Also imported by ``lifecycle/approval_requests.py``, ``policy/records.py``.

:class:`DownstreamTarget` is defined in the ground-floor module target.py (so the configuration
need not import this module) and re-exported here.
"""

from __future__ import annotations

import hmac
import math
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from .canonical import MAX_SAFE_INTEGER, sha256_digest
from .clock import format_ms, parse_ms
from .codes import Code
from .errors import RequestRejected
from .principals import Principal, Role, same_actor
from .target import DownstreamTarget

__all__ = [
    "FORBIDDEN_KEYS",
    "INTENT_MEMBERS",
    "MAX_ARRAY_LENGTH",
    "MAX_BODY_BYTES",
    "MAX_DEPTH",
    "MAX_ENTRIES",
    "PROTOCOL_VERSION",
    "UUID4",
    "CapturedIntent",
    "DownstreamTarget",
    "capture_intent",
    "check_intent_owner",
    "check_json_bounds",
    "check_separation",
    "execution_payload_digest",
    "intent_from_binding",
    "intent_hash",
]

PROTOCOL_VERSION = "agent-safe.intent/1"
MAX_BODY_BYTES = 100 * 1024
MAX_DEPTH = 20
MAX_ENTRIES = 5000
MAX_ARRAY_LENGTH = 1000
FORBIDDEN_KEYS = frozenset({"__proto__", "prototype", "constructor"})
UUID4 = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
"""A lower-case UUIDv4 (intent, grant, decision and dossier ids); use ``fullmatch``."""


@dataclass(frozen=True)
class CapturedIntent:
    """A captured intent: the binding exactly as hashed, and its hash."""

    binding: Mapping[str, Any]
    intent_hash: str

    @property
    def intent_id(self) -> str:
        return str(self.binding["intent_id"])

    @property
    def tenant_id(self) -> str:
        return str(self.binding["tenant_id"])

    @property
    def idempotency_key(self) -> str:
        return str(self.binding["idempotency_key"])

    @property
    def action(self) -> str:
        return str(self.binding["action"]["type"])

    @property
    def resource(self) -> str:
        return str(self.binding["action"]["resource"])

    @property
    def parameters(self) -> Mapping[str, Any]:
        params: Mapping[str, Any] = self.binding["action"]["parameters"]
        return params

    @property
    def caller_principal(self) -> str | None:
        context = self.binding.get("context") or {}
        value = context.get("caller_principal")
        return str(value) if value is not None else None

    # The binding is pinned by its hash when the intent is made, so what is read from it is
    # read once: the grant, the claim, the seam and the evidence each ask for the payload digest
    # and the expiry (a canonical walk and a hash, a timestamp parse: issue 34).
    @cached_property
    def captured_at(self) -> float:
        return parse_ms(str(self.binding["captured_at"]))

    @cached_property
    def expires_at(self) -> float:
        return parse_ms(str(self.binding["expires_at"]))

    @property
    def expires_at_text(self) -> str:
        return str(self.binding["expires_at"])

    @cached_property
    def payload_digest(self) -> str:
        """``execution_payload_digest``: the digest of exactly what will be sent."""
        return execution_payload_digest(self.parameters)


def intent_hash(binding: Mapping[str, Any]) -> str:
    return sha256_digest(binding)


def execution_payload_digest(parameters: Mapping[str, Any]) -> str:
    return sha256_digest(parameters)


def check_json_bounds(value: Any) -> None:
    """Refuse a parsed JSON body that is too deep, too wide or carries a forbidden key.

    Raises :class:`RequestRejected` (400) with a stable code; never echoes the value.
    """
    entries = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise RequestRejected(Code.REQUEST_TOO_DEEP, f"JSON nests deeper than {MAX_DEPTH}")
        if isinstance(node, dict):
            entries += len(node)
            for key, item in node.items():
                if key in FORBIDDEN_KEYS:
                    raise RequestRejected(Code.REQUEST_INVALID, "a forbidden key was supplied")
                if isinstance(item, dict | list):
                    stack.append((item, depth + 1))
                else:
                    _check_scalar(item)
        elif isinstance(node, list):
            if len(node) > MAX_ARRAY_LENGTH:
                raise RequestRejected(
                    Code.REQUEST_TOO_LARGE, f"an array holds more than {MAX_ARRAY_LENGTH} items"
                )
            entries += len(node)
            for item in node:
                if isinstance(item, dict | list):
                    stack.append((item, depth + 1))
                else:
                    _check_scalar(item)
        else:
            _check_scalar(node)
        if entries > MAX_ENTRIES:
            raise RequestRejected(
                Code.REQUEST_TOO_LARGE, f"JSON holds more than {MAX_ENTRIES} entries"
            )


def _check_scalar(item: Any) -> None:
    if isinstance(item, float) and not math.isfinite(item):
        raise RequestRejected(Code.REQUEST_INVALID, "numbers must be finite")
    if isinstance(item, int) and not isinstance(item, bool) and abs(item) > MAX_SAFE_INTEGER:
        raise RequestRejected(Code.REQUEST_INVALID, "an integer is outside the exact range")


def capture_intent(
    *,
    principal: Principal,
    action: str,
    resource: str,
    parameters: Mapping[str, Any],
    idempotency_key: str,
    target: DownstreamTarget,
    now: float,
    ttl_seconds: int,
    correlation_id: str | None = None,
    intent_id: str | None = None,
) -> CapturedIntent:
    """Build the binding for a proposal from the principal and configuration, and hash it."""
    if principal.tenant_id is None or principal.actor is None:
        raise RequestRejected(Code.ROLE_FORBIDDEN, "this principal cannot propose")
    context: dict[str, Any] = {"caller_principal": principal.id}
    if correlation_id is not None:
        context["correlation_id"] = correlation_id
    binding: dict[str, Any] = {
        "protocol_version": PROTOCOL_VERSION,
        "tenant_id": principal.tenant_id,
        "intent_id": intent_id or str(uuid.uuid4()),
        "idempotency_key": idempotency_key,
        "captured_at": format_ms(now),
        "expires_at": format_ms(now + ttl_seconds),
        "actor": principal.actor.as_binding(),
        "action": {"type": action, "resource": resource, "parameters": dict(parameters)},
        "context": context,
        "downstream_target": target.as_binding(),
    }
    return CapturedIntent(binding=binding, intent_hash=intent_hash(binding))


INTENT_MEMBERS = (
    "protocol_version",
    "tenant_id",
    "intent_id",
    "idempotency_key",
    "captured_at",
    "expires_at",
    "actor",
    "action",
    "context",
    "downstream_target",
)


def intent_from_binding(binding: Any) -> CapturedIntent:
    """Re-hash a presented binding (reconciliations, escalations); refuses a malformed one."""
    if not isinstance(binding, dict) or set(binding) != set(INTENT_MEMBERS):
        raise RequestRejected(Code.REQUEST_INVALID, "the intent is not an agent-safe.intent/1")
    if binding["protocol_version"] != PROTOCOL_VERSION:
        raise RequestRejected(Code.REQUEST_INVALID, "unknown intent protocol version")
    if not isinstance(binding["intent_id"], str) or not UUID4.fullmatch(binding["intent_id"]):
        raise RequestRejected(Code.REQUEST_INVALID, "intent_id is not a UUIDv4")
    try:
        parse_ms(binding["captured_at"])
        parse_ms(binding["expires_at"])
    except (TypeError, ValueError):
        raise RequestRejected(Code.REQUEST_INVALID, "intent timestamps are malformed") from None
    action = binding["action"]
    if (
        not isinstance(action, dict)
        or set(action) != {"type", "resource", "parameters"}
        or not isinstance(action["parameters"], dict)
        or not isinstance(binding["context"], dict)
        or not isinstance(binding["actor"], dict)
        or not isinstance(binding["downstream_target"], dict)
    ):
        raise RequestRejected(Code.REQUEST_INVALID, "the intent is not an agent-safe.intent/1")
    check_json_bounds(binding)
    return CapturedIntent(binding=binding, intent_hash=intent_hash(binding))


def check_intent_owner(principal: Principal, intent: CapturedIntent) -> None:
    """A reconciliation or escalation may present only the caller's own intent (403).

    Exact, on purpose: this check admits, and a near spelling never grants (see
    :func:`~agentsafe.executor.principals.same_actor`)."""
    owner = intent.caller_principal
    if owner is None or not hmac.compare_digest(owner.encode(), principal.id.encode()):
        raise RequestRejected(
            Code.INTENT_PRINCIPAL_MISMATCH, "the intent belongs to another principal"
        )


def check_separation(approver: Principal, intent: CapturedIntent) -> None:
    """An approver may never decide an intent its own actor (or id) proposed (422).

    Names are compared under :func:`~agentsafe.executor.principals.actor_key` (Unicode
    compatibility caseless match): ``Mallory@Bank.example`` proposed what ``mallory@bank.example``
    would approve (issue 30)."""
    proposer_actor = intent.binding.get("actor")
    proposer_actor_id = proposer_actor.get("id") if isinstance(proposer_actor, dict) else None
    names = [approver.id]
    if approver.actor is not None:
        names.append(approver.actor.id)
    if approver.role is not Role.APPROVER:
        raise RequestRejected(Code.ROLE_FORBIDDEN, "only an approver may decide")
    proposers = [
        name for name in (proposer_actor_id, intent.caller_principal) if isinstance(name, str)
    ]
    if any(same_actor(name, names) for name in proposers):
        raise RequestRejected(
            Code.SEPARATION_OF_DUTIES_VIOLATED,
            "an approver may not decide an intent it proposed",
        )
