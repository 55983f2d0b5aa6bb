"""The plan routes: dry run, reviewer-signed approval, one approved step, receipt verification.

- ``POST /v1/plans/dry-run`` (PROPOSER): ``{"plan"}`` -> the dry run and its digest;
- ``POST /v1/plans/approvals`` (APPROVER): ``{"dryRun", "request"}`` -> the signed approval (the
  request may narrow row and byte limits, never widen them);
- ``POST /v1/plans/steps`` (PROPOSER): one approved step through the executor registered for its
  tool and effect -> the frozen value and the signed receipt;
- ``POST /v1/plans/receipts/verify`` (OPERATOR with ``evidence``): verifies a receipt.

Refusals keep the plan library's stable codes; an execution failure that produced a receipt
answers with the receipt beside the error so the host can reconcile.

Callers: ``routes/table.py`` gathers these rows (:func:`plan_routes`) when the policy has a
``plans`` section.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from ..events import Streams
from ..plans.errors import AgentExecutionError, AgentSafetyError
from ..plans.service import PlanService
from ..principals import Principal, Role, Scope
from .app import AnyJson, Call, Route, RouteHandler
from .refusals import refusal

__all__ = ["plan_routes"]


def plan_routes(*, service: PlanService, streams: Streams) -> tuple[Route, ...]:
    """The plan library checks its own shapes, so each row reads any bounded JSON body."""

    def run(
        event: str, work: Callable[[Any, Principal], Awaitable[dict[str, Any]]]
    ) -> RouteHandler:
        async def handler(call: Call) -> web.StreamResponse:
            principal = call.caller
            body: AnyJson = call.body
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
        return await service.dry_run(body)

    async def approve(body: Any, principal: Principal) -> dict[str, Any]:
        return await service.approve(body, approver=principal.id)

    async def step(body: Any, principal: Principal) -> dict[str, Any]:
        return await service.execute_step(body)

    async def verify(body: Any, principal: Principal) -> dict[str, Any]:
        return await service.verify_receipt(body)

    proposer, approver, operator = Role.PROPOSER, Role.APPROVER, Role.OPERATOR
    return (
        Route("POST", "/v1/plans/dry-run", proposer, None, AnyJson, run("PLAN_DRY_RUN", dry_run)),
        Route(
            "POST",
            "/v1/plans/approvals",
            approver,
            None,
            AnyJson,
            run("PLAN_APPROVAL_ISSUED", approve),
        ),
        Route("POST", "/v1/plans/steps", proposer, None, AnyJson, run("PLAN_STEP", step)),
        Route(
            "POST",
            "/v1/plans/receipts/verify",
            operator,
            Scope.EVIDENCE,
            AnyJson,
            run("PLAN_RECEIPT_VERIFIED", verify),
        ),
    )


def _plain(value: Any) -> Any:
    from ..plans.snapshot import thaw

    return thaw(value) if value is not None else None
