"""The plan routes: dry run, reviewer-signed approval, one approved step, receipt verification.

- ``POST /v1/plans/dry-run`` (PROPOSER): ``{"plan"}`` -> the dry run and its digest;
- ``POST /v1/plans/approvals`` (APPROVER): ``{"dryRun", "request"}`` -> the signed approval (the
  request may narrow row and byte limits, never widen them);
- ``POST /v1/plans/steps`` (PROPOSER): one approved step through the executor registered for its
  tool and effect -> the frozen value and the signed receipt;
- ``POST /v1/plans/receipts/verify`` (OPERATOR with ``evidence``): verifies a receipt.

Two rules are the executor's, not the plan library's, and hold before the library is asked:

* a plan belongs to the principal that proposes it: its ``actor`` must be the calling
  principal's id, on the dry run and on every step (the step reads it from the dry run, which the
  approval signs, so it cannot be swapped): 403 ``PLAN_PRINCIPAL_MISMATCH``, nothing consumed. A
  proposer of another tenant (every principal id is unique) cannot spend an approval given for
  someone else's plan;
* a step is execution, so it stops with the work gate as ``/v1/actions`` does: while halted, with
  the posture degraded or the shared store unreachable it is 503 with that code and
  ``Retry-After``, and nothing is consumed or run.

Refusals keep the plan library's stable codes; an execution failure that produced a receipt
answers with the receipt beside the error so the host can reconcile.

Callers: ``routes/table.py`` gathers these rows (:func:`plan_routes`) when the policy has a
``plans`` section.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from ..codes import WORK_GATE_CODES, Code
from ..events import Streams
from ..plans.errors import AgentExecutionError, AgentSafetyError
from ..plans.service import PlanService
from ..principals import Principal, Role, Scope
from .refusals import refusal
from .route import AnyJson, Call, Link, Route, RouteHandler
from .schemas import plan_body

__all__ = ["plan_routes"]


def plan_routes(
    *, service: PlanService, streams: Streams, work_refusal: Callable[[], Code | None]
) -> tuple[Route, ...]:
    """The plan library checks its own shapes, so each row reads any bounded JSON body.
    ``work_refusal`` is the work gate (a halt, a degraded posture, an unreachable store)."""

    def run(
        event: str,
        work: Callable[[Any, Principal], Awaitable[dict[str, Any]]],
        *,
        gated: bool = False,
    ) -> RouteHandler:
        async def handler(call: Call) -> web.StreamResponse:
            principal = call.caller
            body: AnyJson = call.body
            stopped = work_refusal() if gated else None
            if stopped is not None:
                streams.evidence.emit(event, {"caller": principal.id, "code": stopped})
                return refusal(
                    stopped,
                    "execution is stopped; nothing was consumed or run",
                    headers={"Retry-After": "30"},
                )
            try:
                result = await work(body.root, principal)
            except AgentExecutionError as exc:
                streams.evidence.emit(event, {"caller": principal.id, "code": exc.code})
                return refusal(exc.code, exc.message, extra={"receipt": _plain(exc.receipt)})
            except AgentSafetyError as exc:
                streams.evidence.emit(event, {"caller": principal.id, "code": exc.code})
                return refusal(exc.code, exc.message)
            streams.evidence.emit(event, {"caller": principal.id, "code": "OK"})
            return web.json_response(result)

        return handler

    async def dry_run(body: Any, principal: Principal) -> dict[str, Any]:
        _check_actor(_member(body, "plan"), principal)
        return await service.dry_run(body)

    async def approve(body: Any, principal: Principal) -> dict[str, Any]:
        return await service.approve(body, approver=principal.id)

    async def step(body: Any, principal: Principal) -> dict[str, Any]:
        _check_actor(_member(_member(body, "dryRun"), "plan"), principal, strict=True)
        return await service.execute_step(body)

    async def verify(body: Any, principal: Principal) -> dict[str, Any]:
        return await service.verify_receipt(body)

    def row(
        path: str,
        role: Role,
        scope: Scope | None,
        body: type[AnyJson],
        handler: RouteHandler,
        summary: str,
        *,
        gated: bool = False,
        links: tuple[Link, ...] = (),
    ) -> Route:
        return Route(
            "POST",
            path,
            role,
            scope,
            body,
            handler,
            summary=summary,
            answers={200: AnyJson},
            codes=PLAN_CODES | WORK_GATE_CODES if gated else PLAN_CODES,
            host_codes=True,
            links=links,
        )

    proposer, approver, operator = Role.PROPOSER, Role.APPROVER, Role.OPERATOR
    return (
        row(
            "/v1/plans/dry-run",
            proposer,
            None,
            PlanDryRunBody,
            run("PLAN_DRY_RUN", dry_run),
            "Dry-run a plan: its steps, bindings and digest",
            links=(
                Link(
                    "POST /v1/plans/approvals",
                    body={"dryRun": "$response.body#/dryRun"},
                    description="An APPROVER signs the dry run",
                ),
            ),
        ),
        row(
            "/v1/plans/approvals",
            approver,
            None,
            PlanApprovalBody,
            run("PLAN_APPROVAL_ISSUED", approve),
            "Sign an approval of a dry run (limits may narrow, never widen)",
            links=(
                Link(
                    "POST /v1/plans/steps",
                    body={
                        "dryRun": "$request.body#/dryRun",
                        "approval": "$response.body#/approval",
                    },
                    description="The proposer runs an approved step",
                ),
            ),
        ),
        row(
            "/v1/plans/steps",
            proposer,
            None,
            PlanStepBody,
            run("PLAN_STEP", step, gated=True),
            "Run one approved step: the frozen value and its signed receipt",
            gated=True,
            links=(
                Link(
                    "POST /v1/plans/receipts/verify",
                    body={
                        "receipt": "$response.body#/receipt",
                        "dryRun": "$request.body#/dryRun",
                        "approval": "$request.body#/approval",
                        "context": "$request.body#/context",
                    },
                    description="An OPERATOR verifies the step's receipt",
                ),
                Link("POST /v1/control/evidence-export", description="Export its evidence"),
            ),
        ),
        row(
            "/v1/plans/receipts/verify",
            operator,
            Scope.EVIDENCE,
            PlanReceiptBody,
            run("PLAN_RECEIPT_VERIFIED", verify),
            "Verify a step's signed receipt",
        ),
    )


class PlanDryRunBody(AnyJson):
    """A plan to dry-run; its shape is the plan library's (``executor/plans/``)."""

    model_config = plan_body("plan")


class PlanApprovalBody(AnyJson):
    """A dry run and the approval request an APPROVER signs (the plan library's shapes)."""

    model_config = plan_body("dryRun", "request")


class PlanStepBody(AnyJson):
    """One approved step to run (the plan library's shapes)."""

    model_config = plan_body("dryRun", "approval", "context", "stepId", "operation", "executionId")


class PlanReceiptBody(AnyJson):
    """A step's receipt to verify (the plan library's shapes)."""

    model_config = plan_body("receipt", "dryRun", "approval", "context")


PLAN_CODES = frozenset(
    {
        Code.AGENT_SAFETY_REFUSED,
        Code.APPROVAL_ALREADY_USED,
        Code.APPROVAL_AMBIGUOUS_NARROWING,
        Code.APPROVAL_BINDING_MISMATCH,
        Code.APPROVAL_CLOCK_SKEW,
        Code.APPROVAL_EXPIRED,
        Code.APPROVAL_KEY_MISMATCH,
        Code.APPROVAL_LIFETIME_EXCEEDED,
        Code.APPROVAL_MALFORMED,
        Code.APPROVAL_NOT_YET_VALID,
        Code.APPROVAL_REQUEST_INVALID,
        Code.APPROVAL_SIGNATURE_INVALID,
        Code.APPROVAL_WIDENS,
        Code.APPROVER_MISMATCH,
        Code.AUDIT_COMPLETE_FAILED,
        Code.AUDIT_SINK_INVALID,
        Code.AUDIT_START_FAILED,
        Code.CANCEL_INVALID,
        Code.CITATION_REFUSED,
        Code.CLOCK_INVALID,
        Code.CONSUMPTION_INVALID,
        Code.CONSUMPTION_MISMATCH,
        Code.CONSUMPTION_UNVERIFIED,
        Code.CONTEXT_INVALID,
        Code.CONTEXT_MISMATCH,
        Code.CONTEXT_STALE,
        Code.DRY_RUN_MISMATCH,
        Code.EVIDENCE_EXCEEDS_APPROVAL,
        Code.EVIDENCE_INVALID,
        Code.EXECUTION_FAILED,
        Code.EXECUTION_ID_INVALID,
        Code.EXECUTOR_DUPLICATE,
        Code.EXECUTOR_FAILED,
        Code.EXECUTOR_INVALID,
        Code.EXECUTOR_MISMATCH,
        Code.EXECUTOR_NOT_REGISTERED,
        Code.JSON_COLLECTION_TOO_LONG,
        Code.JSON_INVALID,
        Code.JSON_NUMBER_INVALID,
        Code.JSON_TOO_DEEP,
        Code.JSON_TOO_LARGE,
        Code.JSON_TOO_MANY_CONTAINERS,
        Code.JSON_TOO_MANY_NODES,
        Code.JSON_TYPE_REFUSED,
        Code.MCP_ARGUMENTS_INVALID,
        Code.MCP_COUNT_ROWS_REQUIRED,
        Code.MCP_RESULT_UNCOUNTED,
        Code.MCP_TIMEOUT_INVALID,
        Code.MCP_TOOL_ERROR,
        Code.MCP_TOOL_NAME_INVALID,
        Code.MCP_TOOL_NOT_READ_ONLY,
        Code.MCP_TOOL_UNKNOWN,
        Code.OPERATION_ABORTED,
        Code.OPERATION_INVALID,
        Code.OPERATION_MISMATCH,
        Code.OPERATION_PARAMETERS_EXCEEDED,
        Code.PLAN_BINDING_CONFLICT,
        Code.PLAN_BINDING_DRIFT,
        Code.PLAN_DUPLICATE,
        Code.PLAN_EFFECT_NOT_ALLOWED,
        Code.PLAN_FIELD_NOT_ALLOWED,
        Code.PLAN_INVALID,
        Code.PLAN_LIMIT_EXCEEDED,
        Code.PLAN_OPERATION_DIGEST_MISMATCH,
        Code.PLAN_PRINCIPAL_MISMATCH,
        Code.PLAN_PROVENANCE_INVALID,
        Code.PLAN_PROVENANCE_STALE,
        Code.PLAN_SOURCE_UNKNOWN,
        Code.PLAN_TOOL_NOT_ALLOWED,
        Code.POLICY_DIGEST_MISMATCH,
        Code.POLICY_INVALID,
        Code.RECEIPT_KEY_MISMATCH,
        Code.RECEIPT_MALFORMED,
        Code.RECEIPT_MISMATCH,
        Code.RECEIPT_REFUSED,
        Code.RECEIPT_SIGNATURE_INVALID,
        Code.REGISTRY_SEALED,
        Code.REQUEST_INVALID,
        Code.RESULT_BYTES_EXCEEDED,
        Code.RESULT_INVALID,
        Code.RESULT_ROWS_EXCEEDED,
        Code.RESULT_UNCOUNTED,
        Code.SIGNER_FAILED,
        Code.SIGNER_INVALID,
        Code.SKEW_INVALID,
        Code.STEP_UNKNOWN,
        Code.TIMESTAMP_INVALID,
        Code.TIME_INVALID,
        Code.USE_STORE_FAILED,
        Code.USE_STORE_INVALID,
        Code.VERIFIER_FAILED,
        Code.VERIFIER_INVALID,
    }
)
"""Every registry code the plan library refuses with (``executor/plans/``; a drift test scans
it); a host step executor's own code is passed through as well (``host_codes``)."""


def _member(value: Any, name: str) -> Any:
    return value.get(name) if isinstance(value, dict) else None


def _check_actor(plan: Any, principal: Principal, *, strict: bool = False) -> None:
    """The plan's ``actor`` is the calling principal's id. On a dry run a plan without one is
    left to the library, which refuses it as malformed; a step's dry run must name it."""
    actor = _member(plan, "actor")
    if (strict or actor is not None) and actor != principal.id:
        raise AgentSafetyError(
            "a plan's actor must be the calling principal's id", code=Code.PLAN_PRINCIPAL_MISMATCH
        )


def _plain(value: Any) -> Any:
    from ..plans.snapshot import thaw

    return thaw(value) if value is not None else None
