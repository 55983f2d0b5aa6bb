"""The real PostgreSQL server the shared-store tests use (``tools/pgserver.py``).

Without the binaries the tests that need a server are skipped with one line, unless
``AGENTSAFE_E2E=require`` or ``CI`` is set (``.ci/run`` installs the package), when they fail.

Callers: ``tests/conftest.py`` (the session fixture).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from agentsafe.executor.tools.pgserver import PostgresServer, PostgresUnavailable, postgres_server

__all__ = ["PostgresServer", "running_postgres"]


def running_postgres() -> Iterator[PostgresServer]:
    try:
        with postgres_server() as server:
            yield server
    except PostgresUnavailable as exc:
        if os.environ.get("AGENTSAFE_E2E") == "require" or os.environ.get("CI"):
            pytest.fail(f"{exc}; AGENTSAFE_E2E=require or CI is set")
        pytest.skip(str(exc))
