"""One row of the wire contract: :class:`Route`, and what a row is made of.

Role: the declarative shape every route is written in (method, path, role, scope, body model,
handler, answers, refusal codes, links), the :class:`Call` a handler receives, and
:data:`RouteHandler`. It holds data only: it imports neither the application nor the contract
checks, so ``routes/contract.py`` and ``routes/app.py`` both read a row without importing each
other (this module ended the wing's one import cycle).

Callers: ``routes/app.py`` builds the application from rows; ``routes/contract.py`` checks a
refusal against its row; ``routes/table.py``, ``routes/control.py``, ``routes/approvals.py``,
``routes/approval_page.py``, ``routes/plans.py``, ``routes/catalog.py`` and
``routes/openapi.py`` write or read rows.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from pydantic import BaseModel, RootModel

from ..codes import Code
from ..principals import Principal, Role, Scope

__all__ = ["AnyJson", "Call", "Link", "Route", "RouteHandler"]


@dataclass(frozen=True)
class Call:
    """One request as a route's handler receives it: past the door and the body check."""

    request: web.Request
    principal: Principal | None
    """The authenticated caller; ``None`` only on a route open to anyone."""
    body: Any
    """The request body as the row's model parsed it; ``None`` when the row reads no body."""
    query: Any = None
    """The query string as the row's ``query`` model parsed it; ``None`` when it reads none."""

    @property
    def caller(self) -> Principal:
        if self.principal is None:
            raise RuntimeError("a route open to anyone has no caller")
        return self.principal


RouteHandler = Callable[[Call], Awaitable[web.StreamResponse]]


class AnyJson(RootModel[Any]):
    """A bounded JSON body that the route's own library checks (the plan routes)."""


@dataclass(frozen=True)
class Link:
    """What a client does next with an answer of this row: one OpenAPI link, which
    schemathesis's stateful phase follows (``routes/openapi.py`` writes it and checks it).

    ``target`` is the other row, ``"METHOD /path"``; a link whose target is not served (an
    optional section that is off) is left out. ``parameters`` maps the target's path parameters
    and ``body`` fields of its JSON body (nested as in the body) to a runtime expression:
    ``$response.body#/pointer`` (this row's answer) or ``$request.body#/pointer`` (the request
    it answered)."""

    target: str
    parameters: Mapping[str, str] = field(default_factory=dict)
    body: Mapping[str, Any] = field(default_factory=dict)
    status: int = 200
    description: str = ""


@dataclass(frozen=True)
class Route:
    """One row of the wire contract."""

    method: str
    path: str
    role: Role | None
    """The role the door requires; ``None``: open to anyone, the door is not asked."""
    scope: Scope | None
    """The operator scope the door requires as well (OPERATOR routes)."""
    body: type[BaseModel] | None
    """The strict model the JSON body must match; ``None``: the route reads no body."""
    handler: RouteHandler
    invalid: str | None = None
    """The REQUEST_INVALID message when the body does not match; ``None``: name where."""
    summary: str = ""
    """One line for people: what the route does (the OpenAPI operation's summary)."""
    answers: Mapping[int, type[BaseModel] | None] = field(default_factory=lambda: {200: AnyJson})
    """The model of each answer that is not a refusal, by status; ``None``: a text body
    (``text_media_type``)."""
    codes: frozenset[Code] = frozenset()
    """The refusal codes of the handler itself; those of the door and the body reader are
    derived from ``role``, ``scope`` and ``body`` (``routes/contract.py``)."""
    query: type[BaseModel] | None = None
    """The strict model of the query string; ``None``: the route reads none."""
    host_codes: bool = False
    """The handler passes a host's own codes through (answered 422), besides ``codes``."""
    text_media_type: str | tuple[str, ...] = "text/plain"
    """The media type of a text answer, or the media types it is negotiated between."""
    links: tuple[Link, ...] = ()
    """The next steps a client takes with an answer (besides those ``routes/openapi.py`` infers
    from a path parameter the answer carries)."""
