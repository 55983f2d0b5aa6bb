"""The onboarding commands: init, doctor, status, test, --version and -o json, as a user runs them
(the installed console script, real processes, a real synthetic provider on loopback)."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from dotenv import dotenv_values

from agentsafe.executor.assembly import assemble
from agentsafe.executor.config import load_config
from agentsafe.executor.events import MemorySink, Streams
from agentsafe.executor.tools.harness import Workspace, free_port
from agentsafe.executor.tools.init_cli import SHAPES, write_configuration
from agentsafe.executor.tools.synthetic import SyntheticProvider
from tests.integration.bearer_principals import OPERATOR_ID, BearerPrincipals, principals_env

AGENTSAFE = str(Path(sys.executable).parent / "agentsafe")
BASE_ENV = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}


def cli(
    *argv: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AGENTSAFE, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**BASE_ENV, **(env or {}), "COLUMNS": "200"},
    )


def test_version(tmp_path: Path) -> None:
    result = cli("--version", cwd=tmp_path)
    assert result.returncode == 0
    assert result.stdout.strip() == "agentsafe 0.1.0"


@pytest.mark.parametrize("shape", SHAPES)
def test_init_writes_a_commented_configuration_that_parses(tmp_path: Path, shape: str) -> None:
    result = cli("init", "--shape", shape, "--dir", "conf", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    root = tmp_path / "conf"
    env_text = (root / "agentsafe.env").read_text()
    assert env_text.count("\n# ") > 10, "every group of variables is explained"
    assert "# " in (root / "policy.yaml").read_text()
    values = {k: v for k, v in dotenv_values(root / "agentsafe.env").items() if v is not None}
    config = load_config(values)
    assert config.executor_mode.value == "SHADOW"
    for name in ("secrets", "state", "journal", "evidence"):
        assert stat.S_IMODE((root / name).stat().st_mode) == 0o700
    for secret in (root / "secrets").iterdir():
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600, secret
    # every shape has an operator (issue 31: legacy had none, so `agentsafe status` could not ask)
    document = json.loads((root / "principals.json").read_text())
    kinds = {p["id"]: p["credential"]["kind"] for p in document["principals"]}
    agent = {"legacy": "BEARER", "mtls": "MTLS", "workload": "WORKLOAD_JWT"}[shape]
    assert kinds == {"payout-agent": agent, "treasury-lead": "BEARER", "ops-oncall": "BEARER"}
    roles = {p["id"]: p["role"] for p in document["principals"]}
    assert roles["ops-oncall"] == "OPERATOR"
    for name in ("operator-token", "approver-token") + (
        ("caller-token",) if shape == "legacy" else ()
    ):
        token = (root / "secrets" / name).read_text().strip()
        assert token not in (root / "principals.json").read_text(), "digests only"
    assert stat.S_IMODE((root / "principals.json").stat().st_mode) == 0o600
    again = cli("init", "--shape", shape, "--dir", "conf", cwd=tmp_path)
    assert again.returncode == 1
    assert "--force" in again.stderr


@pytest.fixture
async def provider() -> AsyncIterator[str]:
    synthetic = SyntheticProvider()
    url = await synthetic.start()
    yield url
    await synthetic.stop()


def _legacy_env(tmp_path: Path, provider_url: str) -> Path:
    root = tmp_path / "conf"
    write_configuration("legacy", root)
    env_file = root / "agentsafe.env"
    text = env_file.read_text()
    text = text.replace("https://payments.bank.example", provider_url)
    env_file.write_text(text + "DOWNSTREAM_ALLOW_INSECURE_LOOPBACK=true\n")
    return env_file


async def _cli(*argv: str, cwd: Path, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        AGENTSAFE,
        *argv,
        cwd=cwd,
        env={**BASE_ENV, **(env or {}), "COLUMNS": "200"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_doctor_passes_a_good_configuration_one_line_per_check(
    tmp_path: Path, provider: str
) -> None:
    env_file = _legacy_env(tmp_path, provider)
    code, out, err = await _cli("doctor", "--env-file", str(env_file), cwd=tmp_path)
    assert code == 0, out + err
    lines = {line.split()[1]: line for line in out.splitlines() if line[:4] in ("ok  ", "warn")}
    for check in ("install", "config", "secrets", "handlers", "policy", "downstream", "lookup"):
        assert lines[check].startswith("ok"), lines.get(check)
    assert "404" in lines["lookup"]
    assert lines["principals"].startswith("ok")
    assert lines["tls"].startswith("warn")
    assert "->" in lines["tls"], "a check that is not ok says what to do next"
    assert "ready for agentsafe serve" in out
    token = (env_file.parent / "secrets" / "caller-token").read_text().strip()
    assert token not in out


async def test_doctor_json_names_a_readable_secret_and_an_unreachable_downstream(
    tmp_path: Path, provider: str
) -> None:
    env_file = _legacy_env(tmp_path, provider)
    os.chmod(env_file.parent / "secrets" / "authority-signing-key.pem", 0o644)
    unreachable = f"http://127.0.0.1:{free_port()}"
    env_file.write_text(env_file.read_text().replace(provider, unreachable))
    code, out, _ = await _cli("doctor", "--env-file", str(env_file), "-o", "json", cwd=tmp_path)
    assert code == 1
    report = json.loads(out)
    assert report["ok"] is False
    by_check: dict[str, list[dict[str, Any]]] = {}
    for check in report["checks"]:
        by_check.setdefault(check["check"], []).append(check)
    secret = by_check["secrets"][0]
    assert secret["status"] == "fail"
    assert "EXECUTOR_AUTHORITY_SIGNING_KEY_FILE" in secret["detail"]
    assert "SECRET_FILE_MODE" in secret["detail"]
    assert secret["next"]
    assert by_check["handlers"][0]["status"] == "skip"


async def test_doctor_checks_the_tracing_variables(tmp_path: Path) -> None:
    env_file = _legacy_env(tmp_path, "http://127.0.0.1:9")
    env_file.write_text(
        env_file.read_text() + "OTEL_TRACES_EXPORTER=otlp\nOTEL_TRACES_SAMPLER=sometimes\n"
    )
    code, out, _ = await _cli("doctor", "--env-file", str(env_file), cwd=tmp_path)
    assert code == 1
    assert any(
        line.startswith("fail  config") and "OTEL_TRACES_SAMPLER" in line
        for line in out.splitlines()
    )
    assert "sometimes" not in out


async def test_doctor_reports_an_invalid_variable_and_config_json(tmp_path: Path) -> None:
    env_file = _legacy_env(tmp_path, "http://127.0.0.1:9")
    env_file.write_text(env_file.read_text() + "EXECUTOR_INTENT_TTL_SECONDS=9999\n")
    code, out, _ = await _cli("doctor", "--env-file", str(env_file), cwd=tmp_path)
    assert code == 1
    assert any(
        line.startswith("fail  config") and "EXECUTOR_INTENT_TTL_SECONDS" in line
        for line in out.splitlines()
    )
    code, out, _ = await _cli("config", "--env-file", str(env_file), "-o", "json", cwd=tmp_path)
    assert code == 78
    assert json.loads(out)["error"]["variable"] == "EXECUTOR_INTENT_TTL_SECONDS"
    env_file.write_text(env_file.read_text().replace("EXECUTOR_INTENT_TTL_SECONDS=9999\n", ""))
    code, out, _ = await _cli("config", "--env-file", str(env_file), "-o", "json", cwd=tmp_path)
    assert code == 0
    rows = {row["key"]: row for row in json.loads(out)["variables"]}
    assert rows["EXECUTOR_MODE"] == {"key": "EXECUTOR_MODE", "value": "SHADOW", "source": "env"}
    assert rows["EXECUTOR_AUTHORITY_SIGNING_KEY"]["value"] == "<set>"
    token = (env_file.parent / "secrets" / "caller-token").read_text().strip()
    assert token not in out


async def test_every_judge_refuses_a_loose_schema_naming_the_action_and_path(
    tmp_path: Path, provider: str
) -> None:
    """doctor, policy lint, config and serve judge a policy with one function (issue 31): a
    parameter schema without additionalProperties: false, on an action the reference handler
    runs, is SCHEMA_NOT_STRICT at actions[0].parameters everywhere, never "ready"."""
    env_file = _legacy_env(tmp_path, provider)
    policy = env_file.parent / "policy.yaml"
    text = policy.read_text()
    assert "additionalProperties: false" in text
    policy.write_text(text.replace("additionalProperties: false", "additionalProperties: true", 1))
    where = "actions[0].parameters"

    code, out, err = await _cli("policy", "lint", str(policy), cwd=tmp_path)
    assert code != 0, out + err
    assert "SCHEMA_NOT_STRICT" in out + err
    assert where in out + err

    code, out, err = await _cli("config", "--env-file", str(env_file), cwd=tmp_path)
    assert code == 78, out + err
    assert "SCHEMA_NOT_STRICT" in out + err
    assert where in out + err

    code, out, err = await _cli("doctor", "--env-file", str(env_file), cwd=tmp_path)
    assert code == 1, out + err
    [line] = [line for line in out.splitlines() if line.startswith("fail  policy")]
    assert "SCHEMA_NOT_STRICT" in line, line
    assert where in line, line
    assert "ready for agentsafe serve" not in out

    environ = dict(
        line.split("=", 1)
        for line in env_file.read_text().splitlines()
        if line and not line.startswith("#")
    )
    code, out, err = await _cli("serve", cwd=tmp_path, env=environ)
    assert code == 78, out + err
    assert "SCHEMA_NOT_STRICT" in err, err
    assert where in err, err


async def test_status_asks_a_running_executor_and_ends_with_the_shadow_report(
    tmp_path: Path, provider: str
) -> None:
    principals = BearerPrincipals()
    workspace = Workspace(tmp_path / "ws")
    env = principals_env(
        workspace.environment(provider_url=provider, port=free_port(), mode="SHADOW"),
        principals.write(tmp_path / "principals.json"),
    )
    executor = await assemble(env, streams=Streams(evidence=MemorySink(), security=MemorySink()))
    try:
        await executor.reconcile_at_start()
        await executor.listen()
        url = f"http://127.0.0.1:{executor.port}"
        proposer = {"authorization": f"Bearer {principals.token('treasury-workflow')}"}
        async with aiohttp.ClientSession() as session:
            for key, amount in (("s-1", 100), ("s-2", 20000), ("s-3", 900000)):
                body = {
                    "proposal": {
                        "action": "create_payout",
                        "target": "payout:b-1",
                        "parameters": {"amountMinor": amount, "currency": "USD"},
                    },
                    "idempotency_key": key,
                }
                async with session.post(url + "/v1/actions", json=body, headers=proposer) as r:
                    assert r.status == 200, await r.text()
        token_file = tmp_path / "operator-token"
        token_file.write_text(principals.token(OPERATOR_ID))
        code, out, err = await _cli(
            "status", "--url", url, "--token-file", str(token_file), cwd=tmp_path
        )
        assert code == 0, err
        assert "mode          SHADOW" in out
        assert "halt          not halted" in out
        assert "ready         yes (READY)" in out
        assert "open attempts 0" in out
        assert "chain head" in out
        assert out.rstrip().endswith(
            "To enforce these decisions, restart with EXECUTOR_MODE=ENFORCEMENT"
        )
        row = next(line for line in out.splitlines() if line.startswith("create_payout"))
        assert row.split()[1:] == ["1", "1", "1", "0"]
        code, out, _ = await _cli(
            "status", "--url", url, "--token-file", str(token_file), "-o", "json", cwd=tmp_path
        )
        assert code == 0
        status = json.loads(out)
        report = status["shadow_report"]
        assert report["actions"]["create_payout"] == {
            "ALLOW": 1,
            "BLOCK": 1,
            "ESCALATE": 1,
            "NO_VERDICT": 0,
        }
        assert report["enforcement_switch"] == "EXECUTOR_MODE=ENFORCEMENT"
        # a proposer's credential is refused by the control route, and status says so
        token_file.write_text(principals.token("treasury-workflow"))
        code, _, err = await _cli(
            "status", "--url", url, "--token-file", str(token_file), cwd=tmp_path
        )
        assert code == 2
        assert "ROLE_FORBIDDEN" in err
    finally:
        await executor.close()


async def test_status_without_an_executor_says_what_to_do(tmp_path: Path) -> None:
    token_file = tmp_path / "t"
    token_file.write_text("x")
    url = f"http://127.0.0.1:{free_port()}"
    code, _, err = await _cli("status", "--url", url, "--token-file", str(token_file), cwd=tmp_path)
    assert code == 2
    assert "is it running" in err


async def test_agentsafe_test_shows_what_enforcement_prevents(tmp_path: Path) -> None:
    code, out, err = await _cli("test", "-o", "json", cwd=tmp_path)
    assert code == 0, err
    report = json.loads(out)
    assert report["ok"] is True
    assert report["synthetic"] is True
    rows = report["rows"]
    assert all(row["without_boundary"] == 1 for row in rows)
    assert [row["with_agentsafe"] for row in rows] == [1, 0, 0, 0, 0, 0]
    assert "BLOCK" in rows[3]["answer"]
    assert "AUTH_FAILED" in rows[5]["answer"]
    code, out, _ = await _cli("test", cwd=tmp_path)
    assert code == 0
    assert "SYNTHETIC" in out
    assert "through agentsafe 1 did" in out
