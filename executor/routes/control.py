"""The operator's routes: status, halt, resume, open attempts, secret reload, metrics, evidence.

Every route passes the door as an OPERATOR with the route's scope; every action is one
``OPERATOR_ACTION`` line on the security stream with the principal and the action, and one count.
The work itself is done by the :class:`ControlPlane` (``serve.Executor``); this module is only the
HTTP shape.

Callers: ``serve.py`` adds these routes to the application.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..codes import Code
from ..errors import RequestRejected
from ..events import Streams
from ..host.halt import HaltCause, HaltState
from ..host.metrics import ExecutorMetrics
from ..principals import Principal, Role
from .app import Door, read_json

__all__ = ["ControlPlane", "add_control_routes"]


class ControlPlane(Protocol):
    halt: HaltState
    metrics: ExecutorMetrics
    streams: Streams

    async def status(self) -> dict[str, Any]: ...

    async def open_attempts(self) -> list[dict[str, Any]]: ...

    async def reload_secrets(self) -> dict[str, Any]: ...

    async def export_evidence(self, *, reason: str, principal: Principal) -> dict[str, Any]: ...


class _Reason(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    reason: str = Field(min_length=1, max_length=500)


async def _reason(request: web.Request) -> str:
    body = await read_json(request)
    try:
        return _Reason.model_validate(body).reason
    except ValidationError:
        raise RequestRejected(
            Code.REQUEST_INVALID, 'the body must be {"reason": "..."} (1-500 characters)'
        ) from None


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def add_control_routes(app: web.Application, *, plane: ControlPlane, door: Door) -> None:
    def operator(
        scope: str, action: str, run: Callable[..., Awaitable[web.StreamResponse]]
    ) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            principal = await door.authenticate(request, role=Role.OPERATOR, scope=scope)
            response = await run(request, principal)
            plane.streams.security.emit(
                "OPERATOR_ACTION", {"principal": principal.id, "action": action}
            )
            plane.metrics.operator_actions.inc(action=action)
            return response

        return handler

    async def status(request: web.Request, principal: Principal) -> web.StreamResponse:
        return web.json_response(await plane.status())

    async def halt(request: web.Request, principal: Principal) -> web.StreamResponse:
        reason = await _reason(request)
        plane.halt.halt(HaltCause.OPERATOR, reason=reason, by=principal.id)
        return web.json_response(plane.halt.status())

    async def resume(request: web.Request, principal: Principal) -> web.StreamResponse:
        reason = await _reason(request)
        plane.halt.resume(reason=reason, by=principal.id)  # 409 HALT_CAUSE_PERSISTS
        return web.json_response(plane.halt.status())

    async def open_attempts(request: web.Request, principal: Principal) -> web.StreamResponse:
        return web.json_response({"open_attempts": await plane.open_attempts()})

    async def reload(request: web.Request, principal: Principal) -> web.StreamResponse:
        return web.json_response(await plane.reload_secrets())

    async def metrics(request: web.Request, principal: Principal) -> web.StreamResponse:
        body, content_type = plane.metrics.render()
        response = web.Response(body=body)
        response.headers["Content-Type"] = content_type
        return response

    async def export(request: web.Request, principal: Principal) -> web.StreamResponse:
        reason = await _reason(request)
        return web.json_response(await plane.export_evidence(reason=reason, principal=principal))

    app.router.add_get("/v1/control/status", operator("status", "status", status))
    app.router.add_post("/v1/control/halt", operator("halt", "halt", halt))
    app.router.add_post("/v1/control/resume", operator("resume", "resume", resume))
    app.router.add_get(
        "/v1/control/open-attempts", operator("status", "open-attempts", open_attempts)
    )
    app.router.add_post(
        "/v1/control/secrets/reload", operator("secrets.reload", "secrets.reload", reload)
    )
    app.router.add_get("/metrics", operator("metrics", "metrics", metrics))
    app.router.add_post("/v1/control/evidence-export", operator("evidence", "evidence", export))
