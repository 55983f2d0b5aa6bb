"""``agentsafe store migrate`` against a real PostgreSQL: migrate, then say it is current."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from agentsafe.executor.state.pgschema import SCHEMA_VERSION

# One worker runs every test on the one PostgreSQL server its session starts.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("postgres")]

AGENTSAFE = str(Path(sys.executable).parent / "agentsafe")


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/")}
    return subprocess.run(
        [AGENTSAFE, "store", "migrate", *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_migrate_from_a_url_file_then_current(tmp_path: Path, pg_url: str) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir(mode=0o700)
    url_file = secrets / "store-url"
    url_file.write_text(pg_url + "\n")
    url_file.chmod(0o600)
    env = {
        "AGENTSAFE_ENV": "production",
        "EXECUTOR_SECRETS_DIR": str(secrets),
        "EXECUTOR_STORE_URL_FILE": str(url_file),
    }
    first = _run(env, "-o", "json")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout) == {
        "ok": True,
        "schema_version": SCHEMA_VERSION,
        "schema_version_before": 0,
    }
    again = _run(env)
    assert again.returncode == 0
    assert "current" in again.stdout
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT version FROM agentsafe_schema").fetchall() == [
            (SCHEMA_VERSION,)
        ]


def test_production_refuses_the_url_in_the_environment(pg_url: str) -> None:
    result = _run({"AGENTSAFE_ENV": "production", "EXECUTOR_STORE_URL": pg_url})
    assert result.returncode == 78
    assert "EXECUTOR_STORE_URL" in result.stderr
    assert pg_url not in result.stderr + result.stdout  # the URL is never echoed


def test_no_url_is_a_configuration_error() -> None:
    result = _run({})
    assert result.returncode == 78
    assert "EXECUTOR_STORE_URL_FILE" in result.stderr


def test_a_newer_schema_is_refused(pg_url: str) -> None:
    assert _run({"EXECUTOR_STORE_URL": pg_url}).returncode == 0
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE agentsafe_schema SET version = version + 1")
    result = _run({"EXECUTOR_STORE_URL": pg_url}, "-o", "json")
    assert result.returncode == 1
    assert json.loads(result.stdout)["code"] == "STORE_SCHEMA_UNSUPPORTED"
