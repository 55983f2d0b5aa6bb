"""Shared fixtures of the egress tests.

Every guard a test here builds is closed after it (``tests/support/guards.py``), and
``listener`` is a plain HTTP server on loopback that answers ``reached`` to every request and
records the paths it was asked for (the rebinding and plain-HTTP tests of ``test_guard_ssrf.py``
and ``test_guard_memo.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import NamedTuple

import pytest
from aiohttp import web

from tests.support.guards import close_guards

__all__ = ["Listener", "close_guards", "listener"]


class Listener(NamedTuple):
    """The loopback server's port and the request paths it has answered, in order."""

    port: int
    hits: list[str]


@pytest.fixture
async def listener() -> AsyncIterator[Listener]:
    hits: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.Response(text="reached")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield Listener(runner.addresses[0][1], hits)
    await runner.cleanup()
