"""The executor's standard error is JSON lines only, each with a level (issue 22): a real
``agentsafe serve`` through start-up, warnings (``warnings.warn`` and a logger's), requests and
SIGTERM, and a start-up refusal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from agentsafe.executor.tools.harness import (
    ExecutorProcess,
    ProviderProcess,
    Workspace,
    free_port,
)

pytestmark = pytest.mark.slow

AGENTSAFE = str(Path(sys.executable).parent / "agentsafe")

# Loaded by the interpreter before serve's main (PYTHONPATH): it warns inside serve, once before
# the chained streams exist and once after operational logs moved onto the security writer.
SITECUSTOMIZE = """
import logging
import warnings

import agentsafe.executor.serve as serve

_run, _log_through = serve._run, serve._log_through


async def run(environ, guard):
    warnings.warn("test warning before the chain", UserWarning)
    logging.getLogger("agentsafe.test").warning("test log warning before the chain")
    return await _run(environ, guard)


def log_through(*args):
    _log_through(*args)
    warnings.warn("test warning on the chain's writer", UserWarning)
    logging.getLogger("agentsafe.test").error("test log error on the chain's writer")


serve._run, serve._log_through = run, log_through
"""


def _lines(text: str) -> list[dict[str, object]]:
    records = []
    for line in text.splitlines():
        record = json.loads(line)  # raises on any plain text
        assert isinstance(record, dict), line
        records.append(record)
    return records


async def test_serve_writes_only_json_with_a_level_on_stderr(tmp_path: Path) -> None:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    provider = ProviderProcess(tmp_path)
    await provider.start()
    env = Workspace(tmp_path / "ws").environment(provider_url=provider.url, port=free_port())
    env.update({"PYTHONPATH": str(hooks), "AGENTSAFE_LOG_LEVEL": "INFO"})
    executor = ExecutorProcess(env, tmp_path, "executor")
    try:
        await executor.start()
        async with aiohttp.ClientSession() as session:
            status, _ = await executor.propose(session, amount=100, key="json-1")
            assert status == 200
        assert executor.terminate() == 0
    finally:
        executor.kill()
        provider.terminate()
    records = _lines(executor.stderr_path.read_text())
    assert records
    assert all(r.get("level") in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"} for r in records)
    logs = [r for r in records if r["schema"] == "agent-safe.log/1"]
    messages = {(r["level"], r["message"]) for r in logs}
    assert any(level == "WARNING" and "test warning before the chain" in m for level, m in messages)
    assert ("WARNING", "test log warning before the chain") in messages
    assert any(level == "WARNING" and "on the chain's writer" in m for level, m in messages)
    assert ("ERROR", "test log error on the chain's writer") in messages
    assert all(isinstance(r["at"], str) and r["logger"] for r in logs)
    security = [r for r in records if r["schema"] == "agent-safe.security/1"]
    assert any(r["event"] == "STOPPING" for r in security)


def test_a_refusal_to_start_is_one_json_line(tmp_path: Path) -> None:
    env = Workspace(tmp_path).environment(provider_url="http://127.0.0.1:9", port=free_port())
    del env["DOWNSTREAM_URL"]
    result = subprocess.run(
        [AGENTSAFE, "serve"], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path
    )
    assert result.returncode == 78
    records = _lines(result.stderr)
    [refusal] = [r for r in records if r.get("event") == "REFUSED_TO_START"]
    assert refusal["level"] == "ERROR"
    assert refusal["code"] == "CONFIG_INVALID"
    assert "DOWNSTREAM_URL" in str(refusal["message"])
    assert all("level" in r for r in records)
