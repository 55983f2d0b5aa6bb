"""The approval page: where a person sees one escalation's exact intent and approves or denies it.

Served under its own prefix (``/approve``, :data:`~agentsafe.executor.lifecycle.pipeline.
APPROVAL_PAGE_PATH`) on the executor's own TLS listener, so it is the same origin as the API it
calls and the relying party of the approvers' passkeys:

- ``GET /approve/{request_id}``: one escalation (the ``approval_url`` of its escalation object);
- ``GET /approve/enrol``: registering a passkey with an operator's one-time enrolment token (the
  token rides in the URL fragment, which a browser never sends).

The page is a static shell: it holds no data and needs no credential to load. Everything it shows
comes from the APPROVER routes (``routes/approvals.py``) through the door, with the credential the
person types (or the client certificate the browser presents), so only an approver the rule names
ever sees or decides an escalation. Every value an agent wrote arrives already inert
(``display``) and is set with ``textContent``, never parsed as markup.

Each response carries its own Content-Security-Policy: ``default-src 'none'``, the one inline
script and style admitted by a fresh nonce, ``connect-src 'self'`` (the API), Trusted Types
required for script sinks, no forms, no frames, no base URI; no third-party asset exists. The
assets live beside this module (``page/``) and are read once.

Callers: ``routes/table.py`` gathers these rows (:func:`page_routes`).
"""

from __future__ import annotations

import secrets
import uuid
from importlib import resources

from aiohttp import web

from ..codes import Code
from ..lifecycle.pipeline import APPROVAL_PAGE_PATH
from .route import Call, Route

__all__ = ["page_csp", "page_routes"]

_ASSETS = resources.files(__package__).joinpath("page")
_SHELL = _ASSETS.joinpath("approve.html").read_text(encoding="utf-8")
_SCRIPT = _ASSETS.joinpath("approve.js").read_text(encoding="utf-8")
_PAGE = _SHELL.replace("{{script}}", _SCRIPT)


def page_csp(nonce: str) -> str:
    """The page's Content-Security-Policy for one response."""
    return "; ".join(
        (
            "default-src 'none'",
            f"script-src 'nonce-{nonce}'",
            f"style-src 'nonce-{nonce}'",
            "connect-src 'self'",
            "img-src 'none'",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
            "require-trusted-types-for 'script'",
        )
    )


def _page() -> web.Response:
    nonce = secrets.token_urlsafe(18)
    response = web.Response(
        text=_PAGE.replace("{{nonce}}", nonce), content_type="text/html", charset="utf-8"
    )
    response.headers["Content-Security-Policy"] = page_csp(nonce)
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["Cross-Origin-Opener-Policy"] = "same-origin"
    return response


def page_routes() -> tuple[Route, ...]:
    async def request_page(call: Call) -> web.StreamResponse:
        try:
            uuid.UUID(call.request.match_info["request_id"], version=4)
        except ValueError:
            raise web.HTTPNotFound() from None
        return _page()

    async def enrol_page(call: Call) -> web.StreamResponse:
        return _page()

    return (
        Route(
            "GET",
            APPROVAL_PAGE_PATH + "/enrol",
            None,
            None,
            None,
            enrol_page,
            summary="The approval page: register a passkey (a static shell)",
            answers={200: None},
            text_media_type="text/html",
        ),
        Route(
            "GET",
            APPROVAL_PAGE_PATH + "/{request_id}",
            None,
            None,
            None,
            request_page,
            summary="The approval page: one escalation's exact intent, Approve and Deny",
            answers={200: None},
            codes=frozenset({Code.NOT_FOUND}),  # a request id that is not a UUID
            text_media_type="text/html",
        ),
    )
