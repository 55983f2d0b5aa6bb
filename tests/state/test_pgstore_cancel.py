"""A cancelled store call stays a cancellation, so a stopping executor's loops end.

psycopg, cancelled mid-query, cancels the query and raises an error of its own; reported as
``StoreError`` the cancellation was lost, and the store-health loop ran on after SIGTERM. The
database here is a stand-in (``_ConvertsCancellation``) that does what psycopg does on cancel:
nothing else of PostgreSQL is exercised (tests/state/test_pgstore.py runs the real server).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentsafe.executor.codes import Code
from agentsafe.executor.errors import StoreError
from agentsafe.executor.state.pgstore import PostgresStore


class _ConvertsCancellation:
    """A transaction that, when its task is cancelled, raises the store's error instead."""

    def __init__(self) -> None:
        self.started = asyncio.Event()

    async def __call__(self, fn: Any) -> Any:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise StoreError("the shared store failed", code=Code.STORE_UNAVAILABLE) from None


async def test_a_cancelled_ping_is_cancelled_not_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = PostgresStore(pool=None, secret=b"k" * 32, timeout=1.0, url="stand-in")  # type: ignore[arg-type]
    fake = _ConvertsCancellation()
    monkeypatch.setattr(store, "_ping_once", lambda: fake(None))
    task = asyncio.ensure_future(store.ping())
    await asyncio.wait_for(fake.started.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 10)


async def test_an_unavailable_store_still_pings_false(monkeypatch: pytest.MonkeyPatch) -> None:
    store = PostgresStore(pool=None, secret=b"k" * 32, timeout=1.0, url="stand-in")  # type: ignore[arg-type]

    async def down() -> Any:
        raise StoreError("the shared store failed", code=Code.STORE_UNAVAILABLE)

    monkeypatch.setattr(store, "_ping_once", down)
    assert await store.ping() is False
