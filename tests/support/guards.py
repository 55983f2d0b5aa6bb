"""Closes every egress guard a test built, at the test's end.

The guard keeps provider connections alive between requests (``egress/guard.py``, the pool), so
one a test drops without ``close()`` would leave an open aiohttp session behind, which pytest
(``filterwarnings=error``) reports as an unclosed resource. The fixture records each
:class:`GuardedClient` as it is built and closes them after the test; the modules that build
guards in numbers take it through their directory's ``conftest.py``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from agentsafe.executor.egress.guard import GuardedClient


@pytest.fixture(autouse=True)
async def close_guards(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[None]:
    built: list[GuardedClient] = []
    post_init = GuardedClient.__post_init__

    def recording(self: GuardedClient) -> None:
        post_init(self)
        built.append(self)

    monkeypatch.setattr(GuardedClient, "__post_init__", recording)
    yield
    for guard in built:
        await guard.close()
