"""The plan routes: dry run, reviewer-signed approval, one approved step, receipt verification.

- ``POST /v1/plans/dry-run`` (PROPOSER): ``{"plan"}`` -> the dry run and its digest;
- ``POST /v1/plans/approvals`` (APPROVER): ``{"dryRun", "request"}`` -> the signed approval (the
  request may narrow row and byte limits, never widen them);
- ``POST /v1/plans/steps`` (PROPOSER): one approved step through the executor registered for its
  tool and effect -> the frozen value and the signed receipt;
- ``POST /v1/plans/receipts/verify`` (OPERATOR with ``evidence``): verifies a receipt.

Refusals keep the plan library's stable codes; an execution failure that produced a receipt
answers with the receipt beside the error so the host can reconcile.

Callers: ``serve.py`` adds these routes when the policy has a ``plans`` section.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from ..events import Streams
from ..plans.errors import AgentExecutionError, AgentSafetyError
from ..plans.service import PlanService
from ..principals import Principal, Role
from .app import Door, read_json
from .refusals import refusal

__all__ = ["add_plan_routes"]


def add_plan_routes(
    app: web.Application, *, service: PlanService, door: Door, streams: Streams
) -> None:
    def route(
        role: Role,
        scope: str | None,
        event: str,
        run: Callable[[Any, Principal], Awaitable[dict[str, Any]]],
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handler(request: web.Request) -> web.Response:
            principal = await door.authenticate(request, role=role, scope=scope)
            body = await read_json(request)
            try:
                result = await run(body, principal)
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

    app.router.add_post("/v1/plans/dry-run", route(Role.PROPOSER, None, "PLAN_DRY_RUN", dry_run))
    app.router.add_post(
        "/v1/plans/approvals", route(Role.APPROVER, None, "PLAN_APPROVAL_ISSUED", approve)
    )
    app.router.add_post("/v1/plans/steps", route(Role.PROPOSER, None, "PLAN_STEP", step))
    app.router.add_post(
        "/v1/plans/receipts/verify",
        route(Role.OPERATOR, "evidence", "PLAN_RECEIPT_VERIFIED", verify),
    )


def _plain(value: Any) -> Any:
    from ..plans.snapshot import thaw

    return thaw(value) if value is not None else None
