"""The door as aiohttp sees it: credentials read from the request, refusals as HTTP answers.

:class:`HttpDoor` adapts :class:`~agentsafe.executor.door.door.Door` (which knows nothing of HTTP)
to the routes: it reads the ``Authorization`` header and the peer certificate of the TLS connection.
Failed attempts that never became a principal share one window, as the specification says, so the
``source`` is one constant rather than the peer address.

Callers: ``assembly.py`` (builds it and hands it to every route, which sees it through the
application's ``Door`` protocol), ``plane.py``.
"""

from __future__ import annotations

from aiohttp import web

from ..door.door import Door
from ..host.tlsctx import peer_certificate_der
from ..principals import Principal, Role, Scope

__all__ = ["UNAUTHENTICATED_SOURCE", "HttpDoor"]

UNAUTHENTICATED_SOURCE = "unauthenticated"


class HttpDoor:
    def __init__(self, door: Door) -> None:
        self.door = door

    async def authenticate(
        self, request: web.Request, *, role: Role, scope: Scope | None
    ) -> Principal:
        return self.door.authenticate(
            authorization_header=request.headers.get("Authorization"),
            peer_cert_der=peer_certificate_der(request.transport),
            route_role=role,
            route_scope=scope,
            source=UNAUTHENTICATED_SOURCE,
        )
