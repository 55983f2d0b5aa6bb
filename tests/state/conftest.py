"""The store tests' fixtures: one use store on each backend, behind the one protocol.

``store`` is parametrized: the SQLite backend always, and the PostgreSQL backend on a fresh
database of the session's real server (Debian's binaries, found as ``tests/support/postgres.py``
finds them; skipped with one line where they are not installed). A test that takes ``store``
asserts what the :class:`~agentsafe.executor.state.protocol.UseStore` protocol promises, so it
runs on both. Tests of one engine's internals take their own fixture in their own module.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentsafe.executor.clock import ManualClock
from agentsafe.executor.state.pgstore import PostgresStore
from agentsafe.executor.state.protocol import UseStore
from agentsafe.executor.state.usestore import SQLiteUseStore

NOW = 1_800_000_000.0
"""The clock the SQLite store is opened on (the tests pass their own ``now`` to every call)."""


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgresql", marks=[pytest.mark.slow, pytest.mark.xdist_group("postgres")]),
    ]
)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[UseStore]:
    """A use store on each backend, empty and open; closed after the test."""
    if request.param == "sqlite":
        sqlite = await SQLiteUseStore.open(tmp_path / "state", clock=ManualClock(NOW))
        try:
            yield sqlite
        finally:
            await sqlite.close()
        return
    shared = await PostgresStore.open(request.getfixturevalue("pg_url"))
    try:
        yield shared.use_store
    finally:
        await shared.close()
