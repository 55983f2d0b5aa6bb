"""The HTTP edge's one mapping from a stable code to an HTTP status.

Domain code raises by code (:class:`~agentsafe.executor.codes.Code`) and never picks a status;
every route answers a refusal here, with the status the registry gives the code. A code outside
the registry is only ever a host plan step executor's own refusal, passed through by the plan
boundary: it answers :data:`~agentsafe.executor.codes.HOST_CODE_STATUS` (422), as does a
registry code with no HTTP status of its own that a plan refusal carries.

aiohttp's own HTTP errors (no route, wrong method, body too large) keep aiohttp's status and
take the registry code with that status, else ``REQUEST_REFUSED``.

Every 401 carries ``WWW-Authenticate`` (RFC 9110 §11.6.1, §15.5.2): the Bearer challenge of
RFC 6750 §3, with ``error="invalid_token"`` when a credential was presented and refused (the
code says which; the challenge never echoes the token). A client that reads the challenge, such
as an MCP client, then shows the refusal rather than starting an OAuth flow of its own.

Callers: ``routes/app.py`` (the error middleware, for every route that raises
:class:`~agentsafe.executor.errors.RequestRejected`), ``routes/plans.py``.
Also imported by ``listener.py``, ``tools/mcp_bridge.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from .. import telemetry
from ..codes import HOST_CODE_STATUS, Code
from ..lifecycle.answers import error_body

__all__ = ["BEARER_REALM", "challenge", "code_for_http_error", "refusal", "status_of"]

BEARER_REALM = "agentsafe"
"""The realm every 401's Bearer challenge names."""

_AIOHTTP_ERRORS: dict[int, Code] = {
    code.status: code
    for code in (
        Code.NOT_FOUND,
        Code.METHOD_NOT_ALLOWED,
        Code.REQUEST_TOO_LARGE,
        Code.UNSUPPORTED_MEDIA_TYPE,
    )
    if code.status is not None
}


def status_of(code: str) -> int:
    """The HTTP status a refusal with ``code`` is answered with."""
    member = Code.__members__.get(code)
    if member is None or member.status is None:
        return HOST_CODE_STATUS
    return member.status


def code_for_http_error(status: int) -> Code:
    """The code of one of aiohttp's own HTTP errors, by its status."""
    return _AIOHTTP_ERRORS.get(status, Code.REQUEST_REFUSED)


def challenge(code: str) -> str:
    """The ``WWW-Authenticate`` value of a 401 with ``code``: no ``error`` when no credential
    was presented (RFC 6750 §3.1), ``invalid_token`` otherwise."""
    if code == Code.AUTH_REQUIRED.value:
        return f'Bearer realm="{BEARER_REALM}"'
    return f'Bearer realm="{BEARER_REALM}", error="invalid_token"'


def refusal(
    code: str,
    message: str,
    *,
    status: int | None = None,
    headers: Mapping[str, str] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> web.Response:
    """``{"error": {"code", "message"}}`` (plus ``extra`` fields) with the code's status, or
    ``status`` for aiohttp's own errors, whose status is aiohttp's."""
    body = error_body(code, message)
    telemetry.record_code(code)  # the request's server span, when tracing is on
    if extra:
        body.update(extra)
    answered = status if status is not None else status_of(code)
    response = web.json_response(body, status=answered)
    if headers:
        response.headers.update(headers)
    if answered == 401 and "WWW-Authenticate" not in response.headers:
        response.headers["WWW-Authenticate"] = challenge(code)
    return response
