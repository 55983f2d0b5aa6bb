"""``GET /v1/actions``: the actions the calling proposer may propose, as data.

A PROPOSER (authenticated by the door like every other route) reads which actions it may
propose here, each with its strict parameter schema and whether it is destructive; an agent's
tool layer (``agentsafe mcp``) turns each into a tool. Nothing here decides or executes: a
proposal is still ``POST /v1/actions``.

Callers: ``routes/table.py`` gathers this row (:func:`catalog_routes`).
"""

from __future__ import annotations

from aiohttp import web

from ..principals import Role
from .answers import ActionCatalog
from .control import ControlPlane
from .route import Call, Link, Route

__all__ = ["catalog_routes"]


def catalog_routes(plane: ControlPlane) -> tuple[Route, ...]:
    async def actions(call: Call) -> web.StreamResponse:
        return web.json_response({"actions": plane.action_catalog(call.caller)})

    propose = Link(
        "POST /v1/actions",
        body={"proposal": {"action": "$response.body#/actions/0/name"}},
        description="Propose one of them",
    )
    return (
        Route(
            "GET",
            "/v1/actions",
            Role.PROPOSER,
            None,
            None,
            actions,
            summary="The actions the calling proposer may propose, with their parameter schemas",
            answers={200: ActionCatalog},
            links=(propose,),
        ),
    )
