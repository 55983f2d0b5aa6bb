"""Escalations (``EXECUTOR_ESCALATION=APPROVAL``): the proposer's resume and cancel of the approval
request an ESCALATE opened (``lifecycle/approval_requests.py`` opens it).

:meth:`Escalations.resume` (``POST /v1/escalations``) makes one lookup: pending stays
ESCALATE_PENDING; denied, cancelled or expired is a BLOCK whose reason codes say which
(APPROVAL_DENIED, APPROVAL_CANCELLED, APPROVAL_EXPIRED, with INTENT_EXPIRED once the intent itself
is past its TTL: an approval never revives it); approved goes back to the authority with the
decision, its approver and its verification as evidence, through the pipeline's own path (once per
request id). :meth:`Escalations.cancel` (``POST /v1/escalations/cancel``) lets the proposer
withdraw its own. It sits over the pipeline and uses its steps; the pipeline never imports it.

Callers: ``plane.py`` (builds :class:`Escalations`), ``routes/app.py`` and ``routes/table.py``
(the routes).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..codes import Code
from ..config import EscalationMode
from ..dispatch.seam import Outcome
from ..errors import AgentSafeError, RequestRejected
from ..intent import CapturedIntent, check_intent_owner, intent_from_binding
from ..policy.authority import ESCALATION_TYP, Verdict
from ..principals import Principal, Verification
from ..state.records import (
    ApprovalError,
    ApprovalRecord,
    ApprovalState,
)
from .answers import Answer, decision_answer
from .attempt import Progress
from .pipeline import Pipeline

__all__ = ["Escalations"]


class Escalations:
    """``POST /v1/escalations`` and ``/v1/escalations/cancel``, over the pipeline's path."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    async def resume(self, principal: Principal, escalation: Mapping[str, Any]) -> Answer:
        """``POST /v1/escalations``: one lookup; a fresh decision once the person answered."""
        if self.pipeline.escalation is not EscalationMode.APPROVAL:
            raise RequestRejected(
                Code.ESCALATION_NOT_CONFIGURED,
                "this executor resolves no escalations (EXECUTOR_ESCALATION=NONE); "
                "the hold is the answer",
            )
        halted = self.pipeline.halted(principal)
        if halted is not None:
            return halted
        intent, request_id = self._bound(principal, escalation)
        record = await self.pipeline.store.approval_get(request_id)
        if record is None:
            raise RequestRejected(Code.APPROVAL_NOT_FOUND, "no such approval request")
        state = record.state_at(self.pipeline.clock.now())
        intent_expired = self.pipeline.clock.now() >= intent.expires_at
        common: dict[str, Any] = {
            "mode": self.pipeline.mode.value,
            "intent_id": intent.intent_id,
            "intent_hash": intent.intent_hash,
            "decision_id": None,
            "dossier_id": None,
        }
        if state is ApprovalState.PENDING:
            body = decision_answer(
                **common,
                verdict=Verdict.ESCALATE.value,
                reason_codes=[Code.APPROVAL_PENDING],
                fail_closed=False,
                outcome=Outcome.ESCALATE_PENDING.value,
                executed=False,
                escalation=dict(escalation),
            )
            return Answer(200, body)
        if state is not ApprovalState.APPROVED or intent_expired:
            reasons = [_CLOSED_REASONS.get(state, Code.APPROVAL_EXPIRED)]
            if intent_expired:
                # An approval cannot revive an expired intent: BLOCK, never 409 (issue 21).
                reasons = [Code.APPROVAL_EXPIRED, Code.INTENT_EXPIRED]
            self.pipeline.outcomes.outcome(Outcome.BLOCKED)
            self.pipeline.streams.evidence.emit(
                "EXECUTION_BLOCKED",
                {"intent_id": intent.intent_id, "caller": principal.id, "reason_codes": reasons},
            )
            body = decision_answer(
                **common,
                verdict=Verdict.BLOCK.value,
                reason_codes=reasons,
                fail_closed=False,
                outcome=Outcome.BLOCKED.value,
                executed=False,
            )
            return Answer(200, body)
        return await self._execute_approved(
            principal, intent, record, self.pipeline.handler(intent.action)
        )

    def _bound(
        self, principal: Principal, escalation: Mapping[str, Any]
    ) -> tuple[CapturedIntent, str]:
        """The intent and request id of an escalation object this executor signed for exactly
        that intent, presented by the principal that proposed it."""
        intent = intent_from_binding(escalation.get("intent"))
        token = escalation.get("token")
        request_id = escalation.get("request_id")
        try:
            claims = self.pipeline.signer.verify_token(str(token), typ=ESCALATION_TYP)
        except AgentSafeError:
            claims = {}
        if (
            not isinstance(token, str)
            or not isinstance(request_id, str)
            or claims.get("intent_hash") != intent.intent_hash
            or claims.get("request_id") != request_id
        ):
            raise RequestRejected(
                Code.ESCALATION_BINDING_MISMATCH,
                "the escalation object does not belong to this intent",
            )
        self.pipeline.check(principal, lambda: check_intent_owner(principal, intent))
        return intent, request_id

    async def cancel(
        self, principal: Principal, escalation: Mapping[str, Any], reason: str
    ) -> Answer:
        """``POST /v1/escalations/cancel``: the proposer withdraws its own pending escalation;
        a later resume is BLOCK APPROVAL_CANCELLED. 409 APPROVAL_NOT_CANCELLABLE once decided,
        expired or cancelled."""
        if self.pipeline.escalation is not EscalationMode.APPROVAL:
            raise RequestRejected(
                Code.ESCALATION_NOT_CONFIGURED, "this executor resolves no escalations"
            )
        intent, request_id = self._bound(principal, escalation)
        try:
            record = await self.pipeline.store.approval_cancel(
                request_id, by=principal.id, reason=reason, now=self.pipeline.clock.now()
            )
        except ApprovalError as exc:
            raise RequestRejected(exc.code, exc.message) from None
        self.pipeline.streams.evidence.emit(
            "APPROVAL_CANCELLED",
            {
                "intent_id": intent.intent_id,
                "intent_hash": intent.intent_hash,
                "request_id": record.request.request_id,
                "by": principal.id,
            },
        )
        return Answer(
            200,
            {
                "request_id": record.request.request_id,
                "intent_id": intent.intent_id,
                "intent_hash": intent.intent_hash,
                "state": ApprovalState.CANCELLED.value,
                "cancelled_by": principal.id,
            },
        )

    async def _execute_approved(
        self, principal: Principal, intent: CapturedIntent, record: ApprovalRecord, handler: str
    ) -> Answer:
        """An approved intent runs once: the request id is its own idempotency key."""
        approval = {
            "decision": "APPROVE",
            "approver": record.approver,
            "approver_actor": None,  # checked against the proposer when it was decided
            "request_id": record.request.request_id,
            "intent_hash": intent.intent_hash,
            "verification": (record.verification or Verification.CREDENTIAL).value,
        }

        async def run(progress: Progress) -> Answer:
            return await self.pipeline.decide_and_act(
                intent, principal, handler, progress, approval
            )

        return await self.pipeline.once(
            tenant=intent.tenant_id,
            principal=principal,
            key="approval:" + record.request.request_id,
            payload_digest=intent.intent_hash,
            conflict="this approval belongs to another intent",
            run=run,
        )


_CLOSED_REASONS: dict[ApprovalState, Code] = {
    ApprovalState.DENIED: Code.APPROVAL_DENIED,
    ApprovalState.CANCELLED: Code.APPROVAL_CANCELLED,
    ApprovalState.EXPIRED: Code.APPROVAL_EXPIRED,
}
