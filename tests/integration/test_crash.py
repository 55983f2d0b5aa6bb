"""A real ``agentsafe serve`` killed with SIGKILL after dispatch, before close, then restarted."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from agentsafe.executor.lifecycle.recovery import RECHECK_SECONDS
from agentsafe.executor.tools.harness import (
    ExecutorProcess,
    ProviderProcess,
    Workspace,
    free_port,
    wait_until,
)

pytestmark = pytest.mark.slow
AGENTSAFE = str(Path(sys.executable).parent / "agentsafe")


async def _kill_mid_dispatch(
    tmp_path: Path, provider: ProviderProcess, extra: dict[str, str] | None = None
) -> tuple[ExecutorProcess, dict[str, str]]:
    workspace = Workspace(tmp_path / "ws")
    env = workspace.environment(provider_url=provider.url, port=free_port(), extra=extra)
    executor = ExecutorProcess(env, tmp_path)
    await executor.start()
    await provider.set_mode("hang")
    async with aiohttp.ClientSession() as session:
        pending = asyncio.ensure_future(executor.propose(session, amount=4000, key="crash-1"))

        async def arrived() -> bool:
            return int((await provider.received())["count"]) == 1

        await wait_until(arrived, timeout=30, what="the provider to receive the payout")
        executor.kill()
        with contextlib.suppress(aiohttp.ClientError):
            await pending
    return executor, env


async def test_restart_reconciles_completed_without_resending(tmp_path: Path) -> None:
    provider = ProviderProcess(tmp_path)
    await provider.start()
    try:
        _, env = await _kill_mid_dispatch(tmp_path, provider)
        await provider.set_mode("normal")
        restarted = ExecutorProcess(env, tmp_path, "executor-2")
        await restarted.start()
        try:
            resolutions = [
                e for e in restarted.stdout_events() if e.get("event") == "RECONCILIATION"
            ]
            assert [e["resolution"] for e in resolutions] == ["RECONCILED_COMPLETED"]
            assert int((await provider.received())["count"]) == 1
            async with aiohttp.ClientSession() as session:
                status, ready = await restarted.get_json(session, "/ready")
                assert (status, ready) == (200, {"ready": True, "code": "READY"})
                # The key now answers with the reconciled outcome, and nothing is sent again.
                status, body = await restarted.propose(session, amount=4000, key="crash-1")
                assert status == 200
                assert body["replayed"] is True
                assert body["outcome"] == "COMPLETED"
                assert body["reason_codes"] == ["RECONCILED_COMPLETED"]
                assert int((await provider.received())["count"]) == 1
        finally:
            assert restarted.terminate() == 0
    finally:
        provider.terminate()


async def test_restart_keeps_an_unknown_attempt_open_and_not_ready(tmp_path: Path) -> None:
    provider = ProviderProcess(tmp_path)
    await provider.start()
    try:
        _, env = await _kill_mid_dispatch(
            tmp_path, provider, {"EXECUTOR_READY_REQUIRES_NO_UNKNOWN_ATTEMPTS": "true"}
        )
        # The provider is gone: nobody can say what happened.
        provider.terminate()
        restarted = ExecutorProcess(env, tmp_path, "executor-2")
        await restarted.start(expect_ready=False)
        try:
            # /health answers while start-up reconciliation still runs: wait for it to end.
            async def reconciled() -> bool:
                async with aiohttp.ClientSession() as session:
                    _, ready = await restarted.get_json(session, "/ready")
                return ready["code"] != "RECONCILING"

            await wait_until(reconciled, timeout=60, what="start-up reconciliation to end")
            resolutions = [
                e for e in restarted.stdout_events() if e.get("event") == "RECONCILIATION"
            ]
            assert [e["resolution"] for e in resolutions] == ["STILL_UNKNOWN"]
            async with aiohttp.ClientSession() as session:
                status, ready = await restarted.get_json(session, "/ready")
            # anonymous /ready says why, never how many (issue 22)
            assert (status, ready) == (503, {"ready": False, "code": "UNKNOWN_ATTEMPTS_OPEN"})
        finally:
            restarted.terminate()
    finally:
        provider.terminate()


async def test_an_unknown_attempt_asked_again_while_running_says_recheck_not_restart(
    tmp_path: Path,
) -> None:
    """Issue 31, item 5: start-up reconciliation is by RESTART; the running process's own
    re-ask (every ``RECHECK_SECONDS``) that settles the attempt later is by RECHECK, in the
    evidence and in the journal, and the offline verifier walks the chain."""
    provider = ProviderProcess(tmp_path)
    await provider.start()
    try:
        _, env = await _kill_mid_dispatch(tmp_path, provider)
        await provider.set_lookups(available=False)  # nobody can say what happened, yet
        await provider.set_mode("normal")
        restarted = ExecutorProcess(env, tmp_path, "executor-2")
        await restarted.start(expect_ready=False)
        try:

            def causes() -> list[tuple[str, str]]:
                return [
                    (str(e.get("resolution")), str(e.get("by")))
                    for e in restarted.stdout_events()
                    if e.get("event") == "RECONCILIATION"
                ]

            async def at_start() -> bool:
                return bool(causes())

            await wait_until(at_start, timeout=60, what="start-up reconciliation")
            assert causes() == [("STILL_UNKNOWN", "RESTART")]
            await provider.set_lookups(available=True)

            async def asked_again() -> bool:
                return len(causes()) > 1

            await wait_until(
                asked_again, timeout=RECHECK_SECONDS * 4, what="the running process to ask again"
            )
            assert causes() == [
                ("STILL_UNKNOWN", "RESTART"),
                ("RECONCILED_COMPLETED", "RECHECK"),
            ]
            journaled = [
                record["by"]
                for path in Path(env["EXECUTOR_JOURNAL_DIR"]).rglob("*.jsonl")
                for record in map(json.loads, path.read_text().splitlines())
                if record.get("record") == "RECONCILED"
            ]
            assert sorted(journaled) == ["RECHECK", "RESTART"]
            verified = await asyncio.to_thread(
                subprocess.run,
                [AGENTSAFE, "verify", "chain", str(restarted.stdout_path)],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert verified.returncode == 0, verified.stdout + verified.stderr
            assert int((await provider.received())["count"]) == 1
        finally:
            restarted.terminate()
    finally:
        provider.terminate()
