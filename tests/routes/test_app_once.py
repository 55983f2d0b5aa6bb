"""routes/app.py: what is now made once per process, not per request (issue 34), writes the
headers it wrote before, byte for byte.

``_security_headers_as_before`` and ``_respond_as_before`` are the code the module had, kept
here as the oracle; each is run beside the module's own on fresh responses that already carry
headers of every kind a route may set (the security headers' own names in other cases, a strict
or a weak policy of the route's own, a ``Server``, an answer's extra headers), and the headers'
names, spelled as they go on the wire, their values and their order must be the same.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from agentsafe.executor.lifecycle.answers import Answer
from agentsafe.executor.routes import app
from agentsafe.executor.routes.app import SECURITY_HEADERS, SERVER_HEADER, VERDICT_KEY


async def _security_headers_as_before(request: web.Request, response: web.StreamResponse) -> None:
    own = response.headers.get("Content-Security-Policy", "")
    response.headers.update(SECURITY_HEADERS)
    response.headers["Server"] = SERVER_HEADER
    if own.startswith("default-src 'none';") and "frame-ancestors 'none'" in own:
        response.headers["Content-Security-Policy"] = own


def _respond_as_before(answer: Answer) -> web.Response:
    response = web.json_response(dict(answer.body), status=answer.status)
    response.headers.update(answer.headers)
    verdict = answer.body.get("verdict")
    if isinstance(verdict, str):
        response[VERDICT_KEY] = verdict
    return response


def _wire(response: web.StreamResponse) -> list[tuple[str, str]]:
    """The headers as aiohttp writes them: each stored name as spelled, its value, in order."""
    return [(str(name), value) for name, value in response.headers.items()]


_NAMES = st.sampled_from(
    [
        *SECURITY_HEADERS,
        *(name.lower() for name in SECURITY_HEADERS),
        *(name.upper() for name in SECURITY_HEADERS),
        "Server", "server", "Retry-After", "WWW-Authenticate", "X-Request-Id", "Allow",
    ]
)  # fmt: skip
_VALUES = st.sampled_from(
    [
        "default-src 'none'; frame-ancestors 'none'; script-src 'nonce-abc'",  # strict, kept
        "default-src 'none'; script-src 'self'",  # no frame-ancestors: replaced
        "default-src 'self'; frame-ancestors 'none'",  # not 'none': replaced
        "no-cache", "SAMEORIGIN", "5", "Bearer", "x",
    ]
)  # fmt: skip
_HEADERS = st.lists(st.tuples(_NAMES, _VALUES), max_size=6)


def _response(headers: list[tuple[str, str]]) -> web.Response:
    response = web.json_response({"ok": True})
    for name, value in headers:
        response.headers.add(name, value)
    return response


@settings(max_examples=300, deadline=None)
@given(_HEADERS)
def test_the_security_headers_are_written_as_before(headers: list[tuple[str, str]]) -> None:
    ours, before = _response(headers), _response(headers)
    request: Any = None  # neither reads the request
    asyncio.run(app._security_headers(request, ours))
    asyncio.run(_security_headers_as_before(request, before))
    assert _wire(ours) == _wire(before)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from([200, 409, 503]),
    st.dictionaries(
        st.sampled_from(["verdict", "outcome", "code"]),
        st.sampled_from(["ALLOW", "BLOCK", 3, None]),
    ),
    st.lists(st.tuples(_NAMES, _VALUES), max_size=3).map(dict),
)
def test_an_answer_is_written_as_before(
    status: int, body: dict[str, Any], headers: dict[str, str]
) -> None:
    answer = Answer(status, body, headers)
    ours, before = app._respond(answer), _respond_as_before(answer)
    for response in (ours, before):
        asyncio.run(app._security_headers(None, response))  # type: ignore[arg-type]
    assert (ours.status, ours.body, _wire(ours)) == (before.status, before.body, _wire(before))
    assert ours.get(VERDICT_KEY) == before.get(VERDICT_KEY)
