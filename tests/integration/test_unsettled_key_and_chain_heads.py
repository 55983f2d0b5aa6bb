"""Issue 29, item 5: two single-process gaps, each on real ``agentsafe serve`` processes.

* A key whose journal record is gone (a deleted day file) is listed ``JOURNAL_RECORD_MISSING``
  and counted; an OPERATOR settles it through ``POST /v1/control/open-attempts/decision`` by the
  attempt id it is listed under, the retry gets the settled answer, and the decision is
  evidence (the journal's RECONCILED by OPERATOR, a chained ATTEMPT_DECIDED line) that verifies
  offline. The fault is placed on a hook, never a sleep: the synthetic provider acts on the
  payout and never answers, the test sees it and sends SIGKILL.
* The chain heads on a real full disk: ``<journal>/chain`` is its own size-limited **tmpfs**
  (we are root) that the test fills to ENOSPC, so only the heads fail (the attempt journal
  beside them keeps writing). The executor halts with cause ``CHAIN_HEADS`` (a security event,
  ``/ready`` 503, proposals refused 503 ``EXECUTOR_HALTED``, never a bare 500), and the cause
  lifts by itself once the disk takes a synced write again (``CHAIN_HEADS_RECOVERED``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agentsafe.executor.tools.harness import (
    ExecutorProcess,
    ProviderProcess,
    Workspace,
    free_port,
    wait_until,
)

from .bearer_principals import OPERATOR_ID, BearerPrincipals, principals_env

pytestmark = pytest.mark.slow

AGENTSAFE = str(Path(sys.executable).parent / "agentsafe")


def verify_chain(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AGENTSAFE, "verify", "chain", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )


def journal_records(journal_dir: Path) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for path in sorted((journal_dir / "attempts").glob("*.jsonl")):
        for line in path.read_bytes().split(b"\n"):
            with contextlib.suppress(ValueError):
                value = json.loads(line)
                if isinstance(value, dict):
                    records.append(value)
    return records


def events(process: ExecutorProcess, name: str) -> list[dict[str, Any]]:
    return [e for e in process.stdout_events() + process.stderr_events() if e.get("event") == name]


@pytest.fixture
async def provider(tmp_path: Path) -> AsyncIterator[ProviderProcess]:
    process = ProviderProcess(tmp_path)
    await process.start()
    try:
        yield process
    finally:
        process.terminate()


async def provider_count(provider: ProviderProcess, value: int) -> None:
    async def reached() -> bool:
        return int((await provider.received())["count"]) >= value

    await wait_until(reached, timeout=30, what=f"the provider's count to reach {value}")


# -- a key nobody could settle -----------------------------------------------------------------


async def test_an_operator_settles_a_key_whose_journal_record_is_missing(
    tmp_path: Path, provider: ProviderProcess
) -> None:
    workspace = Workspace(tmp_path / "ws")
    principals = BearerPrincipals()
    env = principals_env(
        workspace.environment(provider_url=provider.url, port=free_port()),
        principals.write(tmp_path / "principals.json"),
    )
    proposer = principals.token("treasury-workflow")
    operator = {"authorization": f"Bearer {principals.token(OPERATOR_ID)}"}
    journal_dir = workspace.root / "journal"

    # The payout reaches the provider, which acts and never answers; SIGKILL.
    first = ExecutorProcess(env, tmp_path, "executor-1")
    first.token = proposer
    await first.start()
    await provider.set_mode("hang")
    async with aiohttp.ClientSession() as session:
        pending = asyncio.ensure_future(first.propose(session, amount=4000, key="lost-1"))
        await provider_count(provider, 1)
        first.kill()
        with contextlib.suppress(aiohttp.ClientError):
            await pending
    await provider.set_mode("normal")
    (opened,) = [r for r in journal_records(journal_dir) if r["record"] == "ATTEMPT_OPENED"]
    attempt_id = opened["attempt_id"]
    for day in (journal_dir / "attempts").glob("*.jsonl"):
        day.unlink()  # the key's journal record is gone

    second = ExecutorProcess(env, tmp_path, "executor-2")
    second.token = proposer
    await second.start()
    try:
        assert events(second, "JOURNAL_DAY_FILE_MISSING")
        async with aiohttp.ClientSession() as session:
            open_url = second.url + "/v1/control/open-attempts"
            async with session.get(open_url, headers=operator) as r:
                (listed,) = (await r.json())["open_attempts"]
            assert (listed["attempt_id"], listed["state"]) == (attempt_id, "JOURNAL_RECORD_MISSING")
            status, body = await second.propose(session, amount=4000, key="lost-1")
            assert (status, body["error"]["code"]) == (409, "IDEMPOTENCY_IN_PROGRESS")

            decision_url = second.url + "/v1/control/open-attempts/decision"
            async with session.post(
                decision_url,
                json={"attempt_id": attempt_id, "executed": True, "reason": "checked"},
                headers={"authorization": f"Bearer {proposer}"},
            ) as r:
                assert r.status == 403  # only an operator decides
            reason = "the provider's ledger shows payout lost-1 executed once"
            async with session.post(
                decision_url,
                json={"attempt_id": attempt_id, "executed": True, "reason": reason},
                headers=operator,
            ) as r:
                assert r.status == 200, await r.text()
                decided = await r.json()
            assert decided == {"attempt_id": attempt_id, "status": "COMPLETED", "by": "OPERATOR"}

            status, body = await second.propose(session, amount=4000, key="lost-1")
            assert status == 200, body
            assert (body["outcome"], body["executed"], body["replayed"]) == (
                "COMPLETED",
                True,
                True,
            )
            async with session.get(open_url, headers=operator) as r:
                assert (await r.json())["open_attempts"] == []
            async with session.get(second.url + "/v1/control/status", headers=operator) as r:
                assert (await r.json())["unknown_attempts"] == 0

            # Decided once: a later decision cannot turn "executed" into "not executed".
            async with session.post(
                decision_url,
                json={"attempt_id": attempt_id, "executed": False, "reason": "second thoughts"},
                headers=operator,
            ) as r:
                assert r.status == 404
                assert (await r.json())["error"]["code"] == "ATTEMPT_NOT_OPEN"
            status, body = await second.propose(session, amount=4000, key="lost-1")
            assert (status, body["outcome"], body["executed"]) == (200, "COMPLETED", True)
    finally:
        assert second.terminate() == 0

    # The evidence of who decided: the journal's record and a chained line.
    (recorded,) = [
        r
        for r in journal_records(journal_dir)
        if r.get("record") == "RECONCILED" and r.get("by") == "OPERATOR"
    ]
    assert (recorded["attempt_id"], recorded["status"]) == (attempt_id, "COMPLETED")
    assert (recorded["decided_by"], recorded["reason"]) == (OPERATOR_ID, reason)
    (line,) = events(second, "ATTEMPT_DECIDED")
    assert (line["attempt_id"], line["by"], line["status"]) == (
        attempt_id,
        OPERATOR_ID,
        "COMPLETED",
    )
    assert (line["record"], line["reason"]) == ("JOURNAL_RECORD_MISSING", reason)
    for path in (second.stdout_path, second.stderr_path):
        result = verify_chain(path)
        assert result.returncode == 0, result.stdout + result.stderr

    # The next start settles nothing again and lists nothing: the key keeps its answer.
    third = ExecutorProcess(env, tmp_path, "executor-3")
    third.token = proposer
    await third.start()
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(third.url + "/v1/control/open-attempts", headers=operator) as r:
                assert (await r.json())["open_attempts"] == []
            status, body = await third.propose(session, amount=4000, key="lost-1")
            assert (status, body["outcome"], body["executed"]) == (200, "COMPLETED", True)
        assert int((await provider.received())["count"]) == 1
    finally:
        assert third.terminate() == 0


# -- the chain heads on a full disk --------------------------------------------------------------


@pytest.fixture
def heads_fs(tmp_path: Path) -> Iterator[tuple[Workspace, Path]]:
    """A workspace whose ``journal/chain`` (where the chain heads live) is a real 1 MiB tmpfs
    of its own (we are root), unmounted afterwards; the attempt journal stays on its disk."""
    workspace = Workspace(tmp_path / "ws")
    mount = workspace.root / "journal" / "chain"
    mount.mkdir(mode=0o700)
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mount)],
        capture_output=True,
        check=False,
    )
    if result.returncode != 0:
        pytest.skip("cannot mount a tmpfs here: " + result.stderr.decode(errors="replace"))
    try:
        yield workspace, mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(mount: Path) -> Path:
    """Write until ENOSPC; returns the filler file."""
    filler = mount / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        block = b"\0" * 65536
        while True:
            try:
                os.write(fd, block)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
        while True:  # the last few bytes
            try:
                os.write(fd, b"\0")
            except OSError:
                break
    finally:
        os.close(fd)
    return filler


@pytest.mark.parametrize("checkpoint_lines", ["100", "8"])
async def test_full_chain_heads_halt_with_their_own_cause_and_lift_when_the_disk_recovers(
    tmp_path: Path,
    provider: ProviderProcess,
    heads_fs: tuple[Workspace, Path],
    checkpoint_lines: str,
) -> None:
    """With the default interval the halt lands between proposals. With 8 lines it lands in
    the middle of one: a proposal writes five evidence lines, the head persisted at line 1, the
    checkpoint started at line 7 fails, and line 10 (the second proposal's OUTCOME, after its
    dispatch) is past the bound and refused. Every answer is still coded and true to the
    provider's record."""
    workspace, mount = heads_fs
    principals = BearerPrincipals()
    env = principals_env(
        workspace.environment(
            provider_url=provider.url,
            port=free_port(),
            extra={"EXECUTOR_AUDIT_CHECKPOINT_LINES": checkpoint_lines},
        ),
        principals.write(tmp_path / "principals.json"),
    )
    proposer = principals.token("treasury-workflow")
    operator = {"authorization": f"Bearer {principals.token(OPERATOR_ID)}"}
    executor = ExecutorProcess(env, tmp_path)
    executor.token = proposer
    await executor.start()
    answers: dict[str, tuple[int, dict[str, Any]]] = {}
    try:
        async with aiohttp.ClientSession() as session:
            status, body = await executor.propose(session, amount=4000, key="heads-0")
            assert (status, body["outcome"]) == (200, "COMPLETED"), body
            filler = fill(mount)  # the heads' next replacement hits ENOSPC

            # Propose until the halt: every answer is coded, never a bare 500.
            for n in range(1, 120):
                key = f"heads-{n}"
                status, body = await executor.propose(session, amount=4000, key=key)
                answers[key] = (status, body)
                assert status in (200, 503), body
                if status == 503 and body.get("reason_codes") == ["EXECUTOR_HALTED"]:
                    assert (body["outcome"], body["executed"]) == ("BLOCKED", False)
                    break
                if status == 503:
                    assert body["error"]["code"] == "CHAIN_HEADS_UNAVAILABLE", body
            else:
                raise AssertionError("full chain heads never halted the executor")

            status, ready = await executor.get_json(session, "/ready")
            assert (status, ready) == (503, {"ready": False, "code": "EXECUTOR_HALTED"}), ready
            # More refusals, and operator reads, than the chains have room for before their
            # bound: each stays coded, and the operator can read the halt.
            for n in range(40):
                key = f"halted-{n}"
                status, body = await executor.propose(session, amount=4000, key=key)
                answers[key] = (status, body)
                assert (status, body["reason_codes"]) == (503, ["EXECUTOR_HALTED"]), body
                async with session.get(executor.url + "/v1/control/status", headers=operator) as r:
                    assert r.status == 200, await r.text()
                    halt = (await r.json())["halt"]
                assert [c["cause"] for c in halt["causes"]] == ["CHAIN_HEADS"]

            # What each answer said is what the provider did.
            executed = set((await provider.received())["keys"])
            for key, (status, body) in answers.items():
                if status == 200 and body["outcome"] == "COMPLETED":
                    assert key in executed, key
                elif status == 200 and body["outcome"] == "UNKNOWN_AFTER_DISPATCH":
                    assert body["recovery"]["reference"], key
                elif body.get("executed") is False or "error" in body:
                    assert key not in executed, (key, body)

            filler.unlink()  # the disk takes writes again

            async def ready_again() -> bool:
                return (await executor.get_json(session, "/ready"))[0] == 200

            await wait_until(ready_again, timeout=30, what="the chain heads to recover")
            status, body = await executor.propose(session, amount=4000, key="heads-99")
            assert (status, body["outcome"]) == (200, "COMPLETED"), body
    finally:
        assert executor.terminate() == 0
    names = [e.get("event") for e in executor.stderr_events()]
    assert "CHAIN_HEADS_FAILED" in names
    assert "CHAIN_HEADS_RECOVERED" in names
    (halted,) = [e for e in executor.stderr_events() if e.get("event") == "HALTED"]
    assert halted["cause"] == "CHAIN_HEADS"
    (lifted,) = [e for e in executor.stderr_events() if e.get("event") == "HALT_CAUSE_LIFTED"]
    assert lifted["cause"] == "CHAIN_HEADS"
    for path in (executor.stdout_path, executor.stderr_path):
        result = verify_chain(path)
        assert result.returncode == 0, result.stdout + result.stderr
