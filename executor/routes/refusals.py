"""The HTTP edge's one mapping from a stable code to an HTTP status.

Domain code raises by code (:class:`~agentsafe.executor.codes.Code`) and never picks a status;
every route answers a refusal here, with the status the registry gives the code. A code outside
the registry is only ever a host plan step executor's own refusal, passed through by the plan
boundary: it answers :data:`~agentsafe.executor.codes.HOST_CODE_STATUS` (422), as does a
registry code with no HTTP status of its own that a plan refusal carries.

aiohttp's own HTTP errors (no route, wrong method, body too large) keep aiohttp's status and
take the registry code with that status, else ``REQUEST_REFUSED``.

Callers: ``routes/app.py`` (the error middleware, for every route that raises
:class:`~agentsafe.executor.errors.RequestRejected`), ``routes/plans.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from ..codes import HOST_CODE_STATUS, Code
from ..lifecycle.answers import error_body

__all__ = ["code_for_http_error", "refusal", "status_of"]

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
    if extra:
        body.update(extra)
    response = web.json_response(body, status=status if status is not None else status_of(code))
    if headers:
        response.headers.update(headers)
    return response
