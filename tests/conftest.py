"""Fixtures every test directory may use: a real PostgreSQL server for the shared store."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.postgres import PostgresServer, running_postgres


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the session (skipped, or failed under CI, without binaries)."""
    yield from running_postgres()


@pytest.fixture
def pg_url(postgres: PostgresServer) -> str:
    """A fresh empty database on the session's server."""
    return postgres.create_database()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say where the browser tests' screenshots are (tests/support/browser.py)."""
    from tests.support.browser import ARTIFACTS

    shots = sorted(ARTIFACTS.rglob("*.png")) if ARTIFACTS.is_dir() else []
    if shots:
        terminalreporter.write_line(f"approval page screenshots: {ARTIFACTS} ({len(shots)} files)")
