"""What each route may answer: the refusal codes and statuses of one row of the route table.

A row (:class:`~agentsafe.executor.routes.route.Route`) names the codes its own handler refuses
with (``codes``) and the models of its answers (``answers``); the codes every route shares come
from what stands in front of the handler, so they are derived here, never listed per row:

- every route may answer 500 ``INTERNAL_ERROR`` (:data:`EVERY_ROUTE`);
- a route behind the door may answer every refusal of the door (:data:`DOOR`), and
  ``SCOPE_FORBIDDEN`` when its row names a scope, and 503 ``CHAIN_HEADS_UNAVAILABLE`` (a chained
  line it needed was refused: the chain heads cannot be persisted, :data:`CHAINED`);
- a route that reads a body may answer every refusal of the body reader (:data:`BODY`).

Two readers use the same sets, so the description and the server cannot drift apart:
``routes/openapi.py`` writes them into the OpenAPI document (one response per status, the
refusal's ``code`` an ``enum`` of the codes with that status), and ``routes/app.py`` checks every
refusal a route answers against them: a code its row does not declare raises the
:class:`UndeclaredRefusal` warning (the answer itself is unchanged), and so does a status
(:func:`declared_statuses`, taken once per row). The test suite turns
warnings into errors, so a handler that learns a new refusal fails every test that reaches it
until its row declares the code (and ``docs/openapi.json`` is regenerated).

Callers: ``routes/app.py`` (the check), ``routes/openapi.py`` (the document), tests.
"""

from __future__ import annotations

import warnings

from ..codes import HOST_CODE_STATUS, Code
from ..errors import AgentSafeError
from .route import Route

__all__ = [
    "BODY",
    "CHAINED",
    "DOOR",
    "EVERY_ROUTE",
    "UndeclaredRefusal",
    "check_refusal",
    "check_status",
    "declared_statuses",
    "refusal_codes",
    "refusal_statuses",
]

EVERY_ROUTE: frozenset[Code] = frozenset({Code.INTERNAL_ERROR})
"""What any route may answer: the error middleware's 500 for a fault nobody foresaw."""

CHAINED: frozenset[Code] = frozenset({Code.CHAIN_HEADS_UNAVAILABLE})
"""What a route behind the door may answer when a chain refuses a line it writes (the door's
refusals, an operator's action, a proposal's evidence): the error middleware's 503 while the
chain heads cannot be persisted (the executor halts, cause ``CHAIN_HEADS``)."""

DOOR: frozenset[Code] = frozenset(
    {
        Code.RATE_LIMITED,
        Code.AUTH_REQUIRED,
        Code.AUTH_FAILED,
        Code.AUTH_AMBIGUOUS,
        Code.PRINCIPAL_LOCKED,
        Code.ROLE_FORBIDDEN,
        Code.JWT_ALGORITHM_REFUSED,
        Code.JWT_AUDIENCE_MISMATCH,
        Code.JWT_CLAIM_MISMATCH,
        Code.JWT_EXPIRED,
        Code.JWT_ISSUER_UNKNOWN,
        Code.JWT_SIGNATURE_INVALID,
        Code.JWT_SUBJECT_UNKNOWN,
    }
)
"""The door's refusals (``door/door.py``, ``door/workload.py``), before the route's scope."""

BODY: frozenset[Code] = frozenset(
    {
        Code.UNSUPPORTED_MEDIA_TYPE,
        Code.REQUEST_TOO_LARGE,
        Code.REQUEST_MALFORMED,
        Code.REQUEST_INVALID,
        Code.REQUEST_TOO_DEEP,
        Code.REQUEST_TIMEOUT,
    }
)
"""The body reader's refusals (``routes/app.read_json``, ``intent.check_json_bounds``) and the
strict model's ``REQUEST_INVALID``."""


class UndeclaredRefusal(AgentSafeError, RuntimeWarning):
    """A route answered a code or a status its row does not declare (the OpenAPI document
    does not list it). A warning, so the answer itself is unchanged; pytest makes it an error."""

    code = Code.ROUTE_CONTRACT_VIOLATED


def refusal_codes(route: Route) -> frozenset[Code]:
    """Every registry code ``route`` may refuse with."""
    codes = set(EVERY_ROUTE) | set(route.codes)
    if route.role is not None:
        codes |= DOOR | CHAINED
        if route.scope is not None:
            codes.add(Code.SCOPE_FORBIDDEN)
    if route.body is not None or route.query is not None:
        codes |= BODY if route.body is not None else {Code.REQUEST_INVALID}
    return frozenset(codes)


def refusal_statuses(route: Route) -> dict[int, list[str]]:
    """The refusal codes of ``route`` by HTTP status, each list sorted; a row that passes
    host codes through (``host_codes``) adds them under :data:`HOST_CODE_STATUS`."""
    by_status: dict[int, list[str]] = {}
    for code in refusal_codes(route):
        if code.status is None:
            continue
        by_status.setdefault(code.status, []).append(code.value)
    if route.host_codes:
        by_status.setdefault(HOST_CODE_STATUS, [])
    return {status: sorted(codes) for status, codes in sorted(by_status.items())}


def check_refusal(route: Route, code: str) -> None:
    """Warn when ``route`` refuses with a code its row does not declare."""
    declared = refusal_codes(route)
    if code in declared:
        return
    if route.host_codes and Code.__members__.get(code) is None:
        return
    warnings.warn(
        UndeclaredRefusal(
            f"{route.method} {route.path} refused with {code}, which its row does not declare"
        ),
        stacklevel=2,
    )


def declared_statuses(route: Route) -> frozenset[int]:
    """Every status ``route`` may answer: its answers' and its refusals' (``routes/app.py``
    takes it once per row, when it builds the application, and checks each answer against it)."""
    return frozenset(route.answers) | frozenset(refusal_statuses(route))


def check_status(route: Route, status: int) -> None:
    """Warn when ``route`` answers a status its row declares neither as an answer nor as the
    status of one of its refusals."""
    if status in declared_statuses(route):
        return
    warnings.warn(
        UndeclaredRefusal(
            f"{route.method} {route.path} answered {status}, which its row does not declare"
        ),
        stacklevel=2,
    )
