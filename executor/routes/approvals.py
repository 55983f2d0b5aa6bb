"""Human approval of escalations over HTTP: the APPROVER's routes.

``EXECUTOR_ESCALATION=APPROVAL`` turns an ESCALATE into a durable approval request in the use
store (shared by every executor process that uses it). A person holding an APPROVER principal
listed by the rule lists what they may decide and decides it once:

- ``GET /v1/approvals?state=PENDING``: the requests this approver may decide;
- ``GET /v1/approvals/{request_id}``: one of them, with the intent it would release;
- ``POST /v1/approvals/{request_id}`` ``{"decision": "APPROVE"|"DENY", "reason": "..."}``.

An approver can never decide an intent its own actor proposed (422
SEPARATION_OF_DUTIES_VIOLATED); a second decision is 409 APPROVAL_ALREADY_DECIDED. The proposer
then presents its escalation object to ``POST /v1/escalations`` (``pipeline.py``).

Callers: ``serve.py`` adds these routes.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..clock import Clock, format_ms
from ..codes import Code
from ..errors import RequestRejected
from ..events import Streams
from ..principals import Principal, Role
from ..state.usestore import ApprovalError, ApprovalRecord, ApprovalState, UseStore
from .app import Door, read_json

__all__ = ["add_approval_routes", "describe_record"]


class _Decision(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    decision: str = Field(pattern=r"^(APPROVE|DENY)$")
    reason: str = Field(min_length=1, max_length=500)


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


def add_approval_routes(
    app: web.Application, *, door: Door, store: UseStore, streams: Streams, clock: Clock
) -> None:
    async def listing(request: web.Request) -> web.Response:
        approver = await door.authenticate(request, role=Role.APPROVER, scope=None)
        try:
            state = ApprovalState(request.query.get("state", "PENDING"))
        except ValueError:
            raise RequestRejected(
                Code.REQUEST_INVALID, "state must be PENDING, APPROVED, DENIED or EXPIRED"
            ) from None
        now = clock.now()
        records = await store.approval_list(state=state, now=now, approver=approver.id)
        return web.json_response({"approvals": [describe_record(r, now=now) for r in records]})

    async def one(request: web.Request) -> web.Response:
        approver = await door.authenticate(request, role=Role.APPROVER, scope=None)
        record = _visible(await store.approval_get(request.match_info["request_id"]), approver)
        return web.json_response(describe_record(record, now=clock.now()))

    async def decide(request: web.Request) -> web.Response:
        approver = await door.authenticate(request, role=Role.APPROVER, scope=None)
        body = await read_json(request)
        try:
            parsed = _Decision.model_validate(body)
        except ValidationError:
            raise RequestRejected(
                Code.REQUEST_INVALID,
                'the body must be {"decision": "APPROVE"|"DENY", "reason": "..."}',
            ) from None
        record = _visible(await store.approval_get(request.match_info["request_id"]), approver)
        actor = approver.actor.id if approver.actor is not None else None
        if approver.id == record.request.proposer_principal or (
            actor is not None and actor == record.request.proposer_actor
        ):
            raise RequestRejected(
                Code.SEPARATION_OF_DUTIES_VIOLATED,
                "an approver cannot decide an intent its own actor proposed",
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

    app.router.add_get("/v1/approvals", listing)
    app.router.add_get("/v1/approvals/{request_id}", one)
    app.router.add_post("/v1/approvals/{request_id}", decide)
