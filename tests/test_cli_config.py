"""``agentsafe config``: what resolved and from where, secrets only as <set>; exit 78 if invalid."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from agentsafe.executor.tools.harness import Workspace

AGENTSAFE = str(Path(sys.executable).parent / "agentsafe")


def run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AGENTSAFE, "config"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "COLUMNS": "200"},
    )


def test_config_shows_sources_and_hides_secrets(tmp_path: Path) -> None:
    workspace = Workspace(tmp_path)
    env = workspace.environment(provider_url="http://127.0.0.1:9", port=8443)
    result = run(env)
    assert result.returncode == 0, result.stderr
    assert "EXECUTOR_MODE" in result.stdout
    assert "DOWNSTREAM_URL" in result.stdout
    assert "<set>" in result.stdout
    assert workspace.caller_token not in result.stdout
    assert workspace.downstream_credential not in result.stdout


def test_invalid_configuration_exits_78_naming_the_variable(tmp_path: Path) -> None:
    workspace = Workspace(tmp_path)
    env = workspace.environment(provider_url="http://127.0.0.1:9", port=8443)
    env["EXECUTOR_INTENT_TTL_SECONDS"] = "9999-secret-looking"
    result = run(env)
    assert result.returncode == 78
    assert "EXECUTOR_INTENT_TTL_SECONDS" in result.stderr
    assert "9999-secret-looking" not in result.stderr


def test_serve_refuses_to_start_with_one_line(tmp_path: Path) -> None:
    workspace = Workspace(tmp_path)
    env = workspace.environment(provider_url="http://127.0.0.1:9", port=8443)
    del env["DOWNSTREAM_URL"]
    result = subprocess.run(
        [AGENTSAFE, "serve"], capture_output=True, text=True, timeout=60, env=env
    )
    assert result.returncode == 78
    assert "DOWNSTREAM_URL" in result.stderr
    assert len([line for line in result.stderr.splitlines() if "refused" in line]) == 1
