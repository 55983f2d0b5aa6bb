"""The operator's routes: status, halt, resume, open attempts, secret reload, metrics, evidence.

Every route passes the door as an OPERATOR with the route's scope; every action is one
``OPERATOR_ACTION`` line on the security stream with the principal and the action, and one count.
A scrape of ``GET /metrics`` is the exception: it reads and changes nothing, and arrives every
few seconds, so it is counted (``agentsafe_metrics_scrapes_total``) and writes no chained line.
An action whose line a failing chain refuses (cause ``CHAIN_HEADS``) is still answered: it was
done, and the operator must be able to read the halt.
The work itself is done by the :class:`ControlPlane` (``plane.Executor``); this module is only the
HTTP shape.

Callers: ``routes/table.py`` gathers these rows (:func:`control_routes`).
Also imported by ``catalog.py``.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from ..codes import Code
from ..errors import AgentSafeError
from ..events import Streams
from ..host.halt import HaltCause, HaltState
from ..host.metrics import ExecutorMetrics, StateSnapshot
from ..principals import Principal, Role, Scope
from .answers import (
    AttemptDecided,
    EvidenceManifest,
    HaltStatus,
    OpenAttempts,
    SecretsReload,
    Status,
)
from .route import Call, Route, RouteHandler

__all__ = ["ControlPlane", "control_routes"]

log = logging.getLogger(__name__)


class ControlPlane(Protocol):
    halt: HaltState
    metrics: ExecutorMetrics
    streams: Streams

    async def status(self) -> dict[str, Any]: ...

    def work_refusal(self) -> Code | None:
        """Why new work is refused right now (the work gate), ``None`` when it is not."""
        ...

    async def open_attempts(self) -> list[dict[str, Any]]: ...

    async def metrics_state(self) -> StateSnapshot:
        """What the state gauges show now (taken at each scrape)."""
        ...

    async def decide_attempt(
        self, *, attempt_id: str, executed: bool, reason: str, principal: Principal
    ) -> dict[str, Any]: ...

    async def reload_secrets(self) -> dict[str, Any]: ...

    async def export_evidence(self, *, reason: str, principal: Principal) -> dict[str, Any]: ...

    def action_catalog(self, principal: Principal) -> list[dict[str, Any]]: ...


class Reason(BaseModel):
    """The body of halt, resume and evidence export."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    reason: str = Field(min_length=1, max_length=500)


REASON_INVALID = 'the body must be {"reason": "..."} (1-500 characters)'


class AttemptDecision(BaseModel):
    """The body of an operator's decision for an open attempt, or for an in-flight key listed
    ``JOURNAL_RECORD_MISSING`` (its journal record is gone), each named by the ``attempt_id``
    ``GET /v1/control/open-attempts`` lists it under."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    attempt_id: str = Field(min_length=1, max_length=128)
    executed: bool
    reason: str = Field(min_length=1, max_length=500)


DECISION_INVALID = (
    'the body must be {"attempt_id": "...", "executed": true|false, "reason": "..."}'
    " (a reason of 1-500 characters)"
)


def control_routes(plane: ControlPlane) -> tuple[Route, ...]:
    def operator(action: str, run: RouteHandler) -> RouteHandler:
        """After the work: one OPERATOR_ACTION line and one count."""

        async def handler(call: Call) -> web.StreamResponse:
            response = await run(call)
            plane.metrics.operator_actions.inc(action=action)
            try:
                plane.streams.security.emit(
                    "OPERATOR_ACTION", {"principal": call.caller.id, "action": action}
                )
            except AgentSafeError as exc:  # a chain that refuses lines (CHAIN_HEADS): the
                # action was done; its answer stands, so the operator can read the halt
                log.error("OPERATOR_ACTION %s was not recorded (%s)", action, exc.code)
            return response

        return handler

    async def status(call: Call) -> web.StreamResponse:
        return web.json_response(await plane.status())

    async def halt(call: Call) -> web.StreamResponse:
        body: Reason = call.body
        plane.halt.halt(HaltCause.OPERATOR, reason=body.reason, by=call.caller.id)
        return web.json_response(plane.halt.status())

    async def resume(call: Call) -> web.StreamResponse:
        body: Reason = call.body
        plane.halt.resume(reason=body.reason, by=call.caller.id)  # 409 HALT_CAUSE_PERSISTS
        return web.json_response(plane.halt.status())

    async def open_attempts(call: Call) -> web.StreamResponse:
        return web.json_response({"open_attempts": await plane.open_attempts()})

    async def decide(call: Call) -> web.StreamResponse:
        body: AttemptDecision = call.body
        return web.json_response(
            await plane.decide_attempt(
                attempt_id=body.attempt_id,
                executed=body.executed,
                reason=body.reason,
                principal=call.caller,
            )
        )

    async def reload(call: Call) -> web.StreamResponse:
        return web.json_response(await plane.reload_secrets())

    async def metrics(call: Call) -> web.StreamResponse:
        plane.metrics.scrapes.inc()
        plane.metrics.set_state(await plane.metrics_state())
        body, content_type = plane.metrics.render(call.request.headers.get("Accept"))
        response = web.Response(body=body)
        response.headers["Content-Type"] = content_type
        return response

    async def export(call: Call) -> web.StreamResponse:
        body: Reason = call.body
        return web.json_response(
            await plane.export_evidence(reason=body.reason, principal=call.caller)
        )

    op = Role.OPERATOR
    return (
        Route(
            "GET",
            "/v1/control/status",
            op,
            Scope.STATUS,
            None,
            operator("status", status),
            summary="The executor at a glance: mode, principals, halt, posture, open attempts",
            answers={200: Status},
        ),
        Route(
            "POST",
            "/v1/control/halt",
            op,
            Scope.HALT,
            Reason,
            operator("halt", halt),
            REASON_INVALID,
            summary="Halt: refuse every new execution until resumed",
            answers={200: HaltStatus},
            codes=frozenset({Code.REASON_REQUIRED}),
        ),
        Route(
            "POST",
            "/v1/control/resume",
            op,
            Scope.RESUME,
            Reason,
            operator("resume", resume),
            REASON_INVALID,
            summary="Resume after an operator's halt (409 while another cause stands)",
            answers={200: HaltStatus},
            codes=frozenset({Code.REASON_REQUIRED, Code.HALT_CAUSE_PERSISTS}),
        ),
        Route(
            "GET",
            "/v1/control/open-attempts",
            op,
            Scope.STATUS,
            None,
            operator("open-attempts", open_attempts),
            summary="The attempts the journal holds open",
            answers={200: OpenAttempts},
        ),
        Route(
            "POST",
            "/v1/control/open-attempts/decision",
            op,
            Scope.RESUME,
            AttemptDecision,
            operator("open-attempts.decision", decide),
            DECISION_INVALID,
            summary=(
                "Record an operator's decision for an open attempt, or a key whose journal"
                " record is missing, that nobody else can resolve"
            ),
            answers={200: AttemptDecided},
            codes=frozenset({Code.ATTEMPT_NOT_OPEN, Code.ATTEMPT_ALREADY_DECIDED}),
        ),
        Route(
            "POST",
            "/v1/control/secrets/reload",
            op,
            Scope.SECRETS_RELOAD,
            None,
            operator("secrets.reload", reload),
            summary="Re-read the secret files, the principals file, the JWKS and TLS material",
            answers={200: SecretsReload},
        ),
        Route(
            "GET",
            "/metrics",
            op,
            Scope.METRICS,
            None,
            metrics,
            summary="Prometheus metrics (OpenMetrics or the text format, as Accept asks)",
            answers={200: None},
            text_media_type=("application/openmetrics-text", "text/plain"),
        ),
        Route(
            "POST",
            "/v1/control/evidence-export",
            op,
            Scope.EVIDENCE,
            Reason,
            operator("evidence", export),
            REASON_INVALID,
            summary="Write a signed evidence bundle of the chained streams",
            answers={200: EvidenceManifest},
            codes=EVIDENCE_CODES,
        ),
    )


EVIDENCE_CODES = frozenset(
    {
        Code.EVIDENCE_NOT_CONFIGURED,
        Code.EVIDENCE_NOT_CHAINED,
        Code.EVIDENCE_KEY_INVALID,
        Code.EVIDENCE_DIR,
        Code.EVIDENCE_EXPORT_FAILED,
        Code.EVIDENCE_REASON_INVALID,
    }
)
"""What an evidence export refuses with (``plane.export_evidence``, ``evidence/bundle.py``)."""
