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


def test_config_shows_the_tracing_variables_and_never_the_collectors_headers(
    tmp_path: Path,
) -> None:
    from agentsafe.executor.config import load_config
    from agentsafe.executor.tools.config_view import describe_config

    workspace = Workspace(tmp_path)
    env = workspace.environment(provider_url="http://127.0.0.1:9", port=8443)
    env.update(
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_TRACES_SAMPLER_ARG="0.01",
        OTEL_EXPORTER_OTLP_HEADERS="authorization=Bearer collector-secret-value",
    )
    rows = {row.key: row for row in describe_config(env)}
    assert (rows["OTEL_TRACES_EXPORTER"].source, rows["OTEL_TRACES_EXPORTER"].value) == (
        "env",
        "otlp",
    )
    assert rows["OTEL_TRACES_SAMPLER_ARG"].value == "0.01"
    assert rows["OTEL_SDK_DISABLED"].source == "unset"
    assert "OTEL_EXPORTER_OTLP_HEADERS" not in rows
    # what telemetry.configure is given: the rows that were set, read once by the config
    assert load_config(env).tracing_environment() == {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_TRACES_SAMPLER_ARG": "0.01",
    }
    result = run(env)
    assert result.returncode == 0, result.stderr
    assert "OTEL_TRACES_EXPORTER" in result.stdout
    assert "collector-secret-value" not in result.stdout


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


def test_an_invalid_policy_exits_78_with_its_code_and_path(tmp_path: Path) -> None:
    """serve refuses such a policy at start-up; config says so as well, never exit 0 (issue 22)."""
    workspace = Workspace(tmp_path)
    env = workspace.environment(provider_url="http://127.0.0.1:9", port=8443)
    policy = tmp_path / "broken-policy.yaml"
    policy.write_text("version: 1\nactions:\n  - name: create_payout\n    rules: 7\n")
    env["EXECUTOR_POLICY_FILE"] = str(policy)
    result = run(env)
    assert result.returncode == 78, result.stdout
    assert "EXECUTOR_POLICY_FILE" in result.stdout  # the table is still printed
    lines = result.stderr.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("agentsafe: policy invalid: POLICY_INVALID: ")


def test_an_unreadable_policy_exits_78(tmp_path: Path) -> None:
    workspace = Workspace(tmp_path)
    env = workspace.environment(provider_url="http://127.0.0.1:9", port=8443)
    env["EXECUTOR_POLICY_FILE"] = str(tmp_path / "missing.yaml")
    result = run(env)
    assert result.returncode == 78
    assert "POLICY_FILE_UNREADABLE" in result.stderr
