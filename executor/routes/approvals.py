"""Human approval of escalations over HTTP: the APPROVER's routes.

``EXECUTOR_ESCALATION=APPROVAL`` turns an ESCALATE into a durable approval request in the use
store (shared by every executor process that uses it). A person holding an APPROVER principal
listed by the rule lists what they may decide and decides it once:

- ``GET /v1/approvals?state=PENDING``: the requests this approver may decide;
- ``GET /v1/approvals/{request_id}``: one of them, with the intent it would release;
- ``POST /v1/approvals/{request_id}`` ``{"decision": "APPROVE"|"DENY", "reason": "..."}``.

An approver can never decide an intent its own actor or id proposed (422
SEPARATION_OF_DUTIES_VIOLATED, :func:`~agentsafe.executor.intent.check_separation`); a second
decision is 409 APPROVAL_ALREADY_DECIDED. The proposer then presents its escalation object to
``POST /v1/escalations`` (``pipeline.py``).

Callers: ``routes/table.py`` gathers these rows (:func:`approval_routes`).
"""

from __future__ import annotations

from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from ..clock import Clock, format_ms
from ..codes import Code
from ..errors import RequestRejected
from ..events import Streams
from ..intent import CapturedIntent, check_separation
from ..principals import Principal, Role
from ..state.usestore import ApprovalError, ApprovalRecord, ApprovalState, UseStore
from .answers import ApprovalList, ApprovalView
from .app import Call, Route

__all__ = ["approval_routes", "describe_record"]


class DecisionRequest(BaseModel):
    """The body of ``POST /v1/approvals/{request_id}``."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    decision: str = Field(pattern=r"^(APPROVE|DENY)$")
    reason: str = Field(min_length=1, max_length=500)


class ListingQuery(BaseModel):
    """The query of ``GET /v1/approvals``."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    state: Literal["PENDING", "APPROVED", "DENIED", "EXPIRED"] = "PENDING"


DECISION_INVALID = 'the body must be {"decision": "APPROVE"|"DENY", "reason": "..."}'


def describe_record(record: ApprovalRecord, *, now: float) -> dict[str, Any]:
    """What a person is shown before deciding: the action, target, parameters and proposer."""
    intent = record.request.intent
    action = intent.get("action") or {}
    return {
        "request_id": record.request.request_id,
        "state": record.state_at(now).value,
        "expires_at": format_ms(record.request.expires_at),
        "proposer": {
            "principal": record.request.proposer_principal,
            "actor": record.request.proposer_actor,
        },
        "intent": {
            "intent_id": intent.get("intent_id"),
            "intent_hash": record.request.intent_hash,
            "action": action.get("type"),
            "target": action.get("resource"),
            "parameters": action.get("parameters"),
            "downstream_target": intent.get("downstream_target"),
        },
        "approvers": list(record.request.approvers),
        "decided_by": record.approver,
        "decision_reason": record.reason,
    }


def _visible(record: ApprovalRecord | None, approver: Principal) -> ApprovalRecord:
    if record is None or approver.id not in record.request.approvers:
        # Not listed: indistinguishable from absent, so ids are no oracle.
        raise RequestRejected(Code.APPROVAL_NOT_FOUND, "no such approval request for you")
    return record


def approval_routes(*, store: UseStore, streams: Streams, clock: Clock) -> tuple[Route, ...]:
    async def listing(call: Call) -> web.StreamResponse:
        query: ListingQuery = call.query
        now = clock.now()
        records = await store.approval_list(
            state=ApprovalState(query.state), now=now, approver=call.caller.id
        )
        return web.json_response({"approvals": [describe_record(r, now=now) for r in records]})

    async def one(call: Call) -> web.StreamResponse:
        request_id = call.request.match_info["request_id"]
        record = _visible(await store.approval_get(request_id), call.caller)
        return web.json_response(describe_record(record, now=clock.now()))

    async def decide(call: Call) -> web.StreamResponse:
        approver = call.caller
        parsed: DecisionRequest = call.body
        request_id = call.request.match_info["request_id"]
        record = _visible(await store.approval_get(request_id), approver)
        check_separation(
            approver,
            CapturedIntent(binding=record.request.intent, intent_hash=record.request.intent_hash),
        )
        try:
            decided = await store.approval_decide(
                record.request.request_id,
                decision=parsed.decision,
                approver=approver.id,
                reason=parsed.reason,
                now=clock.now(),
            )
        except ApprovalError as exc:
            raise RequestRejected(exc.code, exc.message) from None
        streams.evidence.emit(
            "APPROVAL_DECIDED",
            {
                "request_id": decided.request.request_id,
                "intent_hash": decided.request.intent_hash,
                "decision": parsed.decision,
                "approver": approver.id,
            },
        )
        return web.json_response(describe_record(decided, now=clock.now()))

    approver = Role.APPROVER
    one_path = "/v1/approvals/{request_id}"
    return (
        Route(
            "GET",
            "/v1/approvals",
            approver,
            None,
            None,
            listing,
            summary="The approval requests this approver may decide, in one state",
            answers={200: ApprovalList},
            codes=frozenset({Code.STORE_UNAVAILABLE}),
            query=ListingQuery,
        ),
        Route(
            "GET",
            one_path,
            approver,
            None,
            None,
            one,
            summary="One approval request, with the intent it would release",
            answers={200: ApprovalView},
            codes=frozenset({Code.APPROVAL_NOT_FOUND, Code.STORE_UNAVAILABLE}),
        ),
        Route(
            "POST",
            one_path,
            approver,
            None,
            DecisionRequest,
            decide,
            DECISION_INVALID,
            summary="Decide an approval request once: APPROVE or DENY, with a reason",
            answers={200: ApprovalView},
            codes=DECIDE_CODES,
        ),
    )


DECIDE_CODES = frozenset(
    {
        Code.APPROVAL_NOT_FOUND,
        Code.SEPARATION_OF_DUTIES_VIOLATED,
        Code.APPROVAL_ALREADY_DECIDED,
        Code.APPROVAL_EXPIRED,
        Code.APPROVAL_NOT_PERMITTED,
        Code.APPROVAL_DECISION_INVALID,
        Code.STORE_UNAVAILABLE,
    }
)
"""What a decision refuses with (``check_separation``, ``UseStore.approval_decide``)."""
