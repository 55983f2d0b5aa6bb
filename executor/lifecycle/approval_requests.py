"""The approval request an ESCALATE opens (``EXECUTOR_ESCALATION=APPROVAL``), and where a person
decides it.

An ESCALATE stores a durable approval request (the intent, the rule and reason that escalated it,
the verification the rule asks) and answers with an escalation object carrying ``approval_url``;
``on_requested`` is told (the optional webhook, ``egress/webhook.py``).

Callers: ``pipeline.py`` (holds :class:`EscalationRequests`), ``routes/approvals.py`` and
``routes/approval_page.py`` (the page's path).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..clock import Clock
from ..config import EscalationMode
from ..events import Streams
from ..ids import uuid4_text
from ..intent import CapturedIntent
from ..policy.authority import ESCALATION_TYP, Decision
from ..principals import Principal
from ..state.protocol import UseStore
from ..state.records import (
    ApprovalRequest,
)
from .attempt import TokenSigner

__all__ = ["APPROVAL_PAGE_PATH", "EscalationRequests", "approval_url", "no_webhook"]

APPROVAL_PAGE_PATH = "/approve"
"""The approval page's route prefix (``routes/approval_page.py`` serves it)."""


def approval_url(origin: str | None, request_id: str) -> str:
    """Where a person decides ``request_id``: absolute with ``EXECUTOR_APPROVAL_ORIGIN``, else
    the path on this listener."""
    return f"{origin or ''}{APPROVAL_PAGE_PATH}/{request_id}"


def no_webhook(request: ApprovalRequest, url: str) -> None:
    """No ``EXECUTOR_APPROVAL_WEBHOOK_URL``: nobody else is told of a new request."""


@dataclass(frozen=True)
class EscalationRequests:
    """What an ESCALATE opens: a durable approval request and the signed escalation object."""

    mode: EscalationMode
    store: UseStore
    signer: TokenSigner
    clock: Clock
    streams: Streams
    origin: str | None = None
    on_requested: Callable[[ApprovalRequest, str], None] = no_webhook

    async def open(
        self, intent: CapturedIntent, principal: Principal, decision: Decision
    ) -> Mapping[str, Any] | None:
        """With ``EXECUTOR_ESCALATION=APPROVAL``: a durable approval request, and the signed
        object the proposer presents back. Otherwise the hold is the answer."""
        if self.mode is not EscalationMode.APPROVAL:
            return None
        request_id = uuid4_text()
        actor = principal.actor.id if principal.actor is not None else principal.id
        request = ApprovalRequest(
            request_id=request_id,
            intent=dict(intent.binding),
            intent_hash=intent.intent_hash,
            approvers=tuple(decision.approvers),
            proposer_principal=principal.id,
            proposer_actor=actor,
            expires_at=intent.expires_at,
            created_at=self.clock.now(),
            rule=decision.rule,
            reason_codes=tuple(str(code) for code in decision.reason_codes),
            verification=decision.verification,
        )
        await self.store.approval_create(request)
        url = approval_url(self.origin, request_id)
        token = self.signer.sign_token(
            {
                "request_id": request_id,
                "intent_hash": intent.intent_hash,
                "exp": int(intent.expires_at),
            },
            typ=ESCALATION_TYP,
        )
        self.streams.evidence.emit(
            "APPROVAL_REQUESTED",
            {
                "intent_id": intent.intent_id,
                "intent_hash": intent.intent_hash,
                "decision_id": decision.decision_id,
                "request_id": request_id,
                "approvers": list(decision.approvers),
                "verification": decision.verification.value,
                "caller": principal.id,
            },
        )
        self.on_requested(request, url)
        return {
            "mode": "APPROVAL",
            "intent": dict(intent.binding),
            "request_id": request_id,
            "approval_url": url,
            "expires_at": intent.expires_at_text,
            "token": token,
        }
