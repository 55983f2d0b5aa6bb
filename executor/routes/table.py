"""The route table: every row of the wire contract this executor serves, in one place.

:func:`route_table` gathers the rows of each route module (the agent's own routes, the operator's
control routes, the approval routes and the approval page with ``EXECUTOR_ESCALATION=APPROVAL``,
the plan routes when the policy has a ``plans`` section), and the row that serves the OpenAPI
document of them all (``routes/openapi.py``); :func:`~agentsafe.executor.routes.app.build_app`
builds the application from them. The README's wire-contract table lists the same rows (method,
path, role, scope), and ``tests/routes/test_table.py`` keeps the two equal.

Callers: ``plane.py``; tests.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..clock import Clock
from ..door.passkeys import Passkeys
from ..events import Streams
from ..lifecycle.answers import Answer
from ..lifecycle.pipeline import Pipeline
from ..plans.service import PlanService
from ..principals import Principal
from ..state.protocol import UseStore
from .app import ReadyState, core_routes
from .approval_page import page_routes
from .approvals import approval_routes
from .catalog import catalog_routes
from .control import ControlPlane, control_routes
from .openapi import openapi_route
from .plans import plan_routes
from .route import Route

__all__ = ["Approvals", "route_table"]


@dataclass(frozen=True)
class Approvals:
    """What the approval routes need (``EXECUTOR_ESCALATION=APPROVAL``)."""

    store: UseStore
    streams: Streams
    clock: Clock
    passkeys: Passkeys | None = None
    principal_named: Callable[[str], Principal | None] = lambda principal_id: None
    cancel_escalation: Callable[[Principal, Mapping[str, Any], str], Awaitable[Answer]] | None = (
        None
    )
    origin: str | None = None
    """``EXECUTOR_APPROVAL_ORIGIN``: the page's origin, the passkeys' relying party."""


def route_table(
    *,
    pipeline: Pipeline,
    readiness: Callable[[], ReadyState],
    jwks: Callable[[], Mapping[str, Any]],
    plane: ControlPlane,
    plans: PlanService | None,
    approvals: Approvals | None,
) -> tuple[Route, ...]:
    """Every route this executor serves; ``plans`` and ``approvals`` are ``None`` when off."""
    rows = [
        *core_routes(pipeline=pipeline, readiness=readiness, jwks=jwks),
        *catalog_routes(plane),
        *control_routes(plane),
    ]
    if plans is not None:
        rows.extend(
            plan_routes(service=plans, streams=plane.streams, work_refusal=plane.work_refusal)
        )
    if approvals is not None:
        rows.extend(
            approval_routes(
                store=approvals.store,
                streams=approvals.streams,
                clock=approvals.clock,
                passkeys=approvals.passkeys,
                principal_named=approvals.principal_named,
                cancel_escalation=approvals.cancel_escalation,
                origin=approvals.origin,
            )
        )
        rows.extend(page_routes())
    rows.append(openapi_route(lambda: table))
    table = tuple(rows)
    return table
