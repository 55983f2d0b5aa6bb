"""Human approval of escalations over HTTP: the APPROVER's routes, passkeys, cancellation.

``EXECUTOR_ESCALATION=APPROVAL`` turns an ESCALATE into a durable approval request in the use
store (shared by every executor process that uses it). A person holding an APPROVER principal
listed by the rule lists what they may decide and decides it once:

- ``GET /v1/approvals?state=PENDING``: the requests this approver may decide;
- ``GET /v1/approvals/{request_id}``: one of them, with the intent it would release, shown inert
  (``display``: :mod:`~agentsafe.executor.display`; ``display.warnings`` names look-alikes, mixed
  scripts and invisible characters), the rule and reason that escalated it, the intent hash, and
  the verification its decision needs;
- ``POST /v1/approvals/{request_id}/challenge`` ``{"decision"}``: WebAuthn request options whose
  challenge is bound to this request, its intent hash and the decision (``door/passkeys.py``);
- ``POST /v1/approvals/{request_id}`` ``{"decision": "APPROVE"|"DENY", "reason": "...",
  "webauthn": {"challenge_token", "credential"}}``: the decision, with the passkey assertion
  when the approver has one or must use one.

A decision must meet the stronger of the rule's ``approval.verification`` and the approver's own
``approval.verification`` (principals file); one below it is 403 APPROVAL_VERIFICATION_REQUIRED,
and the authority checks the rule's level again when the proposer resumes. An approver can never
decide an intent its own actor or id proposed (422 SEPARATION_OF_DUTIES_VIOLATED,
:func:`~agentsafe.executor.intent.check_separation`); a second decision is 409
APPROVAL_ALREADY_DECIDED; an approver the rule does not name gets 404 for every route, so request
ids are no oracle.

Passkey enrolment: an OPERATOR with the ``approvers`` scope issues a one-time token for one
APPROVER (``POST /v1/control/approvers/{principal_id}/enrolment-tokens``); that approver, signed
in with their own credential, registers a passkey with it through the page
(``/v1/approvers/enrolment/options``, ``/v1/approvers/enrolment``). A stolen bearer alone cannot
register a passkey, and a leaked enrolment token is useless to anyone but its approver.

Cancellation: the proposer presents its escalation object (``POST /v1/escalations/cancel``,
``lifecycle/pipeline.py``), an OPERATOR with ``approvers`` names the request
(``POST /v1/control/approvals/{request_id}/cancel``); either way a later resume is BLOCK
APPROVAL_CANCELLED.

The page itself (``routes/approval_page.py``) reads and decides through these same routes.

Callers: ``routes/table.py`` gathers these rows (:func:`approval_routes`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from ..clock import Clock, format_ms
from ..codes import Code
from ..display import amount_text, field_warnings, inert_json, inert_value
from ..door.passkeys import Passkeys
from ..errors import RequestRejected
from ..events import Streams
from ..intent import CapturedIntent, check_separation
from ..lifecycle.answers import Answer
from ..lifecycle.pipeline import APPROVAL_PAGE_PATH, approval_url
from ..principals import Principal, Role, Scope, Verification
from ..state.protocol import UseStore
from ..state.records import ApprovalError, ApprovalRecord, ApprovalState
from .answers import ApprovalList, ApprovalView
from .route import AnyJson, Call, Link, Route
from .schemas import EscalationObject

__all__ = ["approval_routes", "describe_record", "required_verification"]

ENROL_PAGE = APPROVAL_PAGE_PATH + "/enrol"
"""The page where an approver registers a passkey with an enrolment token."""

_Strict = ConfigDict(extra="forbid", strict=True, frozen=True)
_DECISION = r"^(APPROVE|DENY)$"


class WebAuthnAnswer(BaseModel):
    """A passkey assertion (``PublicKeyCredential.toJSON()``) and the token of its challenge."""

    model_config = _Strict
    challenge_token: str = Field(min_length=1, max_length=4096)
    credential: dict[str, Any]


class DecisionRequest(BaseModel):
    """The body of ``POST /v1/approvals/{request_id}``."""

    model_config = _Strict
    decision: str = Field(pattern=_DECISION)
    reason: str = Field(min_length=1, max_length=500)
    webauthn: WebAuthnAnswer | None = None


class ChallengeRequest(BaseModel):
    model_config = _Strict
    decision: str = Field(pattern=_DECISION)


class EnrolmentOptionsRequest(BaseModel):
    model_config = _Strict
    token: str = Field(min_length=16, max_length=256)


class EnrolmentRequest(BaseModel):
    model_config = _Strict
    token: str = Field(min_length=16, max_length=256)
    challenge_token: str = Field(min_length=1, max_length=4096)
    credential: dict[str, Any]


class EnrolmentTokenRequest(BaseModel):
    model_config = _Strict
    ttl_seconds: int | None = Field(default=None, ge=1)


class CancelRequest(BaseModel):
    model_config = _Strict
    reason: str = Field(min_length=1, max_length=500)


class EscalationCancelRequest(BaseModel):
    model_config = _Strict
    escalation: EscalationObject
    reason: str = Field(min_length=1, max_length=500)


DECISION_INVALID = (
    'the body must be {"decision": "APPROVE"|"DENY", "reason": "..."}'
    ' with an optional "webauthn": {"challenge_token", "credential"}'
)
CHALLENGE_INVALID = 'the body must be {"decision": "APPROVE"|"DENY"}'
CANCEL_INVALID = 'the body must be {"reason": "..."} (1-500 characters)'


def required_verification(record: ApprovalRecord, approver: Principal | None) -> Verification:
    """The stronger of what the rule asks and what the approver's principal asks."""
    own = approver.verification if approver is not None else Verification.CREDENTIAL
    return Verification.strongest(record.request.verification, own)


def describe_record(
    record: ApprovalRecord,
    *,
    now: float,
    approver: Principal | None = None,
    origin: str | None = None,
) -> dict[str, Any]:
    """What a person is shown before deciding: the exact intent (raw, and inert in ``display``),
    the proposer, the rule and reason that escalated it, and what a decision needs."""
    intent = record.request.intent
    action = intent.get("action") or {}
    parameters = action.get("parameters")
    proposer = {
        "principal": record.request.proposer_principal,
        "actor": record.request.proposer_actor,
    }
    return {
        "request_id": record.request.request_id,
        "state": record.state_at(now).value,
        "expires_at": format_ms(record.request.expires_at),
        "approval_url": approval_url(origin, record.request.request_id),
        "proposer": proposer,
        "intent": {
            "intent_id": intent.get("intent_id"),
            "intent_hash": record.request.intent_hash,
            "action": action.get("type"),
            "target": action.get("resource"),
            "parameters": parameters,
            "downstream_target": intent.get("downstream_target"),
            "binding": dict(intent),
        },
        "rule": record.request.rule,
        "reason_codes": list(record.request.reason_codes),
        "approvers": list(record.request.approvers),
        "verification": {
            "rule": record.request.verification.value,
            "required": required_verification(record, approver).value,
            "decided_with": record.verification.value if record.verification else None,
        },
        "decided_by": record.approver,
        "decision_reason": record.reason,
        "cancelled_by": record.cancelled_by,
        "cancel_reason": record.cancel_reason,
        "display": {
            "action": inert_value(action.get("type")),
            "target": inert_value(action.get("resource")),
            "amount": amount_text(parameters) if isinstance(parameters, Mapping) else None,
            "parameters": inert_value(parameters),
            "proposer": inert_value(proposer),
            "intent": inert_json(dict(intent)),
            # Look-alikes, mixed scripts and invisible characters, named (issue 30).
            "warnings": field_warnings(
                {
                    "action": action.get("type"),
                    "target": action.get("resource"),
                    "parameters": parameters,
                    "proposer": proposer,
                }
            ),
        },
    }


def _visible(record: ApprovalRecord | None, approver: Principal) -> ApprovalRecord:
    if record is None or approver.id not in record.request.approvers:
        # Not listed: indistinguishable from absent, so ids are no oracle.
        raise RequestRejected(Code.APPROVAL_NOT_FOUND, "no such approval request for you")
    return record


def approval_routes(
    *,
    store: UseStore,
    streams: Streams,
    clock: Clock,
    passkeys: Passkeys | None = None,
    principal_named: Callable[[str], Principal | None] = lambda principal_id: None,
    cancel_escalation: Callable[[Principal, Mapping[str, Any], str], Awaitable[Answer]]
    | None = None,
    origin: str | None = None,
) -> tuple[Route, ...]:
    """The rows; ``passkeys`` is ``None`` only in tests that never decide with a passkey."""

    def need_passkeys() -> Passkeys:
        if passkeys is None or not passkeys.configured:
            raise RequestRejected(
                Code.WEBAUTHN_NOT_CONFIGURED,
                "passkeys need EXECUTOR_APPROVAL_ORIGIN (the approval page's https origin)",
            )
        return passkeys

    def describe(record: ApprovalRecord, approver: Principal | None = None) -> dict[str, Any]:
        return describe_record(record, now=clock.now(), approver=approver, origin=origin)

    async def listing(call: Call) -> web.StreamResponse:
        try:
            state = ApprovalState(call.request.query.get("state", "PENDING"))
        except ValueError:
            raise RequestRejected(
                Code.REQUEST_INVALID,
                "state must be PENDING, APPROVED, DENIED, EXPIRED or CANCELLED",
            ) from None
        records = await store.approval_list(state=state, now=clock.now(), approver=call.caller.id)
        return web.json_response({"approvals": [describe(r, call.caller) for r in records]})

    async def one(call: Call) -> web.StreamResponse:
        request_id = call.request.match_info["request_id"]
        record = _visible(await store.approval_get(request_id), call.caller)
        body = describe(record, call.caller)
        body["passkeys"] = (
            len(await passkeys.credentials(call.caller.id))
            if passkeys is not None and passkeys.configured
            else 0
        )
        return web.json_response(body)

    async def challenge(call: Call) -> web.StreamResponse:
        parsed: ChallengeRequest = call.body
        record = _visible(
            await store.approval_get(call.request.match_info["request_id"]), call.caller
        )
        options = await need_passkeys().assertion_options(
            call.caller,
            request_id=record.request.request_id,
            intent_hash=record.request.intent_hash,
            decision=parsed.decision,
        )
        return web.json_response(options)

    async def decide(call: Call) -> web.StreamResponse:
        approver = call.caller
        parsed: DecisionRequest = call.body
        request_id = call.request.match_info["request_id"]
        record = _visible(await store.approval_get(request_id), approver)
        check_separation(
            approver,
            CapturedIntent(binding=record.request.intent, intent_hash=record.request.intent_hash),
        )
        achieved = Verification.CREDENTIAL
        if parsed.webauthn is not None:
            achieved = await need_passkeys().verify_assertion(
                approver,
                request_id=record.request.request_id,
                intent_hash=record.request.intent_hash,
                decision=parsed.decision,
                challenge_token=parsed.webauthn.challenge_token,
                credential=parsed.webauthn.credential,
            )
        required = required_verification(record, approver)
        if not achieved.meets(required):
            streams.security.emit(
                "APPROVAL_VERIFICATION_REFUSED",
                {"request_id": record.request.request_id, "approver": approver.id},
            )
            raise RequestRejected(
                Code.APPROVAL_VERIFICATION_REQUIRED,
                f"this decision needs {required.value} verification: decide it on the approval"
                " page with your passkey",
            )
        try:
            decided = await store.approval_decide(
                record.request.request_id,
                decision=parsed.decision,
                approver=approver.id,
                reason=parsed.reason,
                now=clock.now(),
                verification=achieved,
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
                "verification": achieved.value,
            },
        )
        return web.json_response(describe(decided, approver))

    # -- enrolment ---------------------------------------------------------------------------

    async def issue_enrolment(call: Call) -> web.StreamResponse:
        parsed: EnrolmentTokenRequest = call.body
        principal_id = call.request.match_info["principal_id"]
        principal = principal_named(principal_id)
        if principal is None or principal.role is not Role.APPROVER:
            raise RequestRejected(
                Code.ENROLMENT_PRINCIPAL_INVALID,
                "enrolment tokens are issued only for an APPROVER of the principals file",
            )
        enrolment = await need_passkeys().issue_enrolment(
            principal, issued_by=call.caller.id, ttl_seconds=parsed.ttl_seconds
        )
        streams.security.emit(
            "ENROLMENT_TOKEN_ISSUED",
            {
                "principal": principal.id,
                "by": call.caller.id,
                "expires_at": format_ms(enrolment.expires_at),
            },
        )
        return web.json_response(
            {
                "principal": principal.id,
                "token": enrolment.token,
                "expires_at": format_ms(enrolment.expires_at),
                # The token rides in the fragment: a browser never sends it to a server or a log.
                "enrolment_url": f"{origin or ''}{ENROL_PAGE}#token={enrolment.token}",
            },
            status=201,
        )

    async def enrolment_options(call: Call) -> web.StreamResponse:
        parsed: EnrolmentOptionsRequest = call.body
        approver = call.caller
        name = approver.actor.id if approver.actor is not None else approver.id
        options = await need_passkeys().registration_options(parsed.token, display_name=name)
        if options["principal"] != approver.id:
            raise RequestRejected(
                Code.ENROLMENT_TOKEN_INVALID, "this enrolment token was issued for someone else"
            )
        return web.json_response(options)

    async def enrol(call: Call) -> web.StreamResponse:
        parsed: EnrolmentRequest = call.body
        approver = call.caller
        keys = need_passkeys()
        passkey = await keys.register(
            parsed.token,
            challenge_token=parsed.challenge_token,
            credential=parsed.credential,
            principal=approver,
        )
        streams.security.emit(
            "PASSKEY_ENROLLED", {"principal": approver.id, "credential_id": passkey.credential_id}
        )
        return web.json_response(
            {"principal": approver.id, "credential_id": passkey.credential_id}, status=201
        )

    # -- cancellation ------------------------------------------------------------------------

    async def operator_cancel(call: Call) -> web.StreamResponse:
        parsed: CancelRequest = call.body
        request_id = call.request.match_info["request_id"]
        try:
            record = await store.approval_cancel(
                request_id, by=call.caller.id, reason=parsed.reason, now=clock.now()
            )
        except ApprovalError as exc:
            raise RequestRejected(exc.code, exc.message) from None
        streams.evidence.emit(
            "APPROVAL_CANCELLED",
            {
                "request_id": record.request.request_id,
                "intent_hash": record.request.intent_hash,
                "by": call.caller.id,
            },
        )
        return web.json_response(describe(record))

    async def proposer_cancel(call: Call) -> web.StreamResponse:
        parsed: EscalationCancelRequest = call.body
        if cancel_escalation is None:
            raise RequestRejected(
                Code.ESCALATION_NOT_CONFIGURED, "no escalations are resolved here"
            )
        answer = await cancel_escalation(call.caller, parsed.escalation, parsed.reason)
        return web.json_response(dict(answer.body), status=answer.status)

    approver_role = Role.APPROVER
    one_path = "/v1/approvals/{request_id}"
    operator = Role.OPERATOR
    request_id = {"request_id": "$response.body#/request_id"}
    read_back = Link(f"GET {one_path}", request_id, description="Read it back")
    return (
        Route(
            "GET",
            "/v1/approvals",
            approver_role,
            None,
            None,
            listing,
            summary="The approval requests this approver may decide, in one state",
            answers={200: ApprovalList},
            codes=frozenset({Code.REQUEST_INVALID, Code.STORE_UNAVAILABLE}),
        ),
        Route(
            "GET",
            one_path,
            approver_role,
            None,
            None,
            one,
            summary="One approval request, with the intent it would release",
            answers={200: ApprovalView},
            codes=frozenset({Code.APPROVAL_NOT_FOUND, Code.STORE_UNAVAILABLE}),
            links=(
                Link(f"POST {one_path}", request_id, description="Decide it"),
                Link(f"POST {one_path}/challenge", request_id, description="Decide it by passkey"),
            ),
        ),
        Route(
            "POST",
            one_path,
            approver_role,
            None,
            DecisionRequest,
            decide,
            DECISION_INVALID,
            summary="Decide an approval request once: APPROVE or DENY, with a reason",
            answers={200: ApprovalView},
            codes=DECIDE_CODES | PASSKEY_CODES,
            links=(read_back,),
        ),
        Route(
            "POST",
            one_path + "/challenge",
            approver_role,
            None,
            ChallengeRequest,
            challenge,
            CHALLENGE_INVALID,
            summary="WebAuthn options bound to this request, its intent hash and the decision",
            codes=DECIDE_CODES | PASSKEY_CODES,
        ),
        Route(
            "POST",
            "/v1/approvers/enrolment/options",
            approver_role,
            None,
            EnrolmentOptionsRequest,
            enrolment_options,
            summary="Passkey registration options, with a one-time enrolment token",
            codes=PASSKEY_CODES,
        ),
        Route(
            "POST",
            "/v1/approvers/enrolment",
            approver_role,
            None,
            EnrolmentRequest,
            enrol,
            summary="Register the passkey (uses the enrolment token up)",
            answers={201: AnyJson},
            codes=PASSKEY_CODES,
        ),
        Route(
            "POST",
            "/v1/control/approvers/{principal_id}/enrolment-tokens",
            operator,
            Scope.APPROVERS,
            EnrolmentTokenRequest,
            issue_enrolment,
            summary="A one-time passkey enrolment token for one APPROVER",
            answers={201: AnyJson},
            codes=PASSKEY_CODES,
        ),
        Route(
            "POST",
            "/v1/control/approvals/{request_id}/cancel",
            operator,
            Scope.APPROVERS,
            CancelRequest,
            operator_cancel,
            CANCEL_INVALID,
            summary="Cancel a pending escalation, with a reason",
            answers={200: ApprovalView},
            codes=DECIDE_CODES,
            links=(read_back,),
        ),
        Route(
            "POST",
            "/v1/escalations/cancel",
            Role.PROPOSER,
            None,
            EscalationCancelRequest,
            proposer_cancel,
            summary="The caller's own escalation: cancel it while pending",
            answers={200: AnyJson, 503: AnyJson},
            codes=DECIDE_CODES | CANCEL_CODES,
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
        Code.APPROVAL_VERIFICATION_REQUIRED,
        Code.APPROVAL_NOT_CANCELLABLE,
        Code.APPROVAL_CANCELLED,
        Code.STORE_UNAVAILABLE,
    }
)
"""What deciding or cancelling a request refuses with (``check_separation``, the use store)."""
PASSKEY_CODES = frozenset(
    {
        Code.WEBAUTHN_NOT_CONFIGURED,
        Code.WEBAUTHN_NO_CREDENTIAL,
        Code.WEBAUTHN_CHALLENGE_INVALID,
        Code.WEBAUTHN_ASSERTION_INVALID,
        Code.WEBAUTHN_REGISTRATION_INVALID,
        Code.ENROLMENT_PRINCIPAL_INVALID,
        Code.ENROLMENT_TOKEN_INVALID,
        Code.STORE_UNAVAILABLE,
    }
)
"""What a passkey step refuses with (``door/passkeys.py``)."""
CANCEL_CODES = frozenset(
    {
        Code.ESCALATION_NOT_CONFIGURED,
        Code.ESCALATION_BINDING_MISMATCH,
        Code.INTENT_PRINCIPAL_MISMATCH,
    }
)
"""What a proposer's cancellation refuses with besides a decision's (the escalation object)."""
