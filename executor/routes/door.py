"""The door as aiohttp sees it: credentials read from the request, refusals as HTTP answers.

:class:`HttpDoor` adapts :class:`~agentsafe.executor.door.door.Door` (which knows nothing of HTTP)
to the routes: it reads every ``Authorization`` header the request carries (more than one is
``AUTH_AMBIGUOUS``), the peer certificate of a TLS connection (a plain connection has none, and
is not asked for one), and the peer address, which keys the window for failed attempts
(``door.source_key``: an anonymous peer that floods fills its own window, never anyone else's;
``docs/door.md``). ``source_key`` is a pure function of the address text; a kept-alive peer
presents the same text on every request, so the adapter remembers the last
:data:`SOURCE_KEYS_REMEMBERED` answers (:data:`remembered_source_key`) rather than parse the
address each time.

Callers: ``assembly.py`` (builds it and hands it to every route, which sees it through the
application's ``Door`` protocol), ``plane.py``.
"""

from __future__ import annotations

import functools

from aiohttp import web

from ..door.door import Door, source_key
from ..host.tlsctx import peer_certificate_der
from ..principals import Principal, Role, Scope

__all__ = ["SOURCE_KEYS_REMEMBERED", "HttpDoor", "remembered_source_key"]

SOURCE_KEYS_REMEMBERED = 4096
#: ``door.source_key``, memoised: the same key for the same text, the least recent forgotten.
remembered_source_key = functools.lru_cache(maxsize=SOURCE_KEYS_REMEMBERED)(source_key)


class HttpDoor:
    def __init__(self, door: Door) -> None:
        self.door = door

    async def authenticate(
        self, request: web.Request, *, role: Role, scope: Scope | None
    ) -> Principal:
        return self.door.authenticate(
            authorization_header=request.headers.getall("Authorization", []),
            peer_cert_der=peer_certificate_der(request.transport) if request.secure else None,
            route_role=role,
            route_scope=scope,
            source=remembered_source_key(request.remote),
        )
