"""Issue 17: real ``agentsafe serve`` processes, faults placed exactly, and what a retry is told.

Each fault is placed on a hook the test waits on, never on a sleep:

* the synthetic provider **holds** a payout (``hold``) or a lookup (``lookup hold``) until the test
  releases it, and can make its lookup **lag** its commit (``lag``: 404 for a key it acted on);
* the test holds the **use store's write lock** (``BEGIN IMMEDIATE`` on its SQLite file), so the
  executor blocks on its next store write exactly after a journal record, which the test reads
  from the journal before it sends **SIGKILL**;
* the executor's **stdout is a pipe** the test stops draining and fills, so its next evidence
  line (PROPOSAL_RECEIVED: after the key is IN_PROGRESS, before ATTEMPT_OPENED) blocks in
  write(2), confirmed from ``/proc/PID/syscall``, before **SIGKILL**;
* the journal directory, or the use store's state directory, is a real, size-limited **tmpfs**
  the test fills to ENOSPC (the chain heads live in the journal directory: they fill with it).

Tests that need PostgreSQL start the session's real server (``xdist_group("postgres")``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import json
import os
import select
import sqlite3
import subprocess
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pytest

from agentsafe.executor.state.usestore import DATABASE_NAME
from agentsafe.executor.tools.harness import (
    ExecutorProcess,
    ProviderProcess,
    Workspace,
    free_port,
    wait_until,
)

from .bearer_principals import OPERATOR_ID, BearerPrincipals, principals_env

pytestmark = pytest.mark.slow


# -- hooks ---------------------------------------------------------------------------------------


def journal_records(workspace: Workspace, journal_dir: Path | None = None) -> list[dict[str, Any]]:
    root = (journal_dir or workspace.root / "journal") / "attempts"
    records: list[dict[str, Any]] = []
    for path in sorted(root.glob("*.jsonl")):
        for line in path.read_bytes().split(b"\n"):
            with contextlib.suppress(ValueError):
                value = json.loads(line)
                if isinstance(value, dict):
                    records.append(value)
    return records


@contextlib.contextmanager
def store_write_lock(workspace: Workspace) -> Iterator[None]:
    """Hold the use store's write lock: the executor's next store write waits (busy timeout)."""
    conn = sqlite3.connect(workspace.root / "state" / DATABASE_NAME, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        yield
        conn.execute("ROLLBACK")
    finally:
        conn.close()


async def journal_has(workspace: Workspace, record: str, **fields: Any) -> dict[str, Any]:
    async def seen() -> dict[str, Any] | None:
        for r in journal_records(workspace):
            if r.get("record") == record and all(r.get(k) == v for k, v in fields.items()):
                return r
        return None

    found: dict[str, Any] = await wait_until(seen, timeout=30, what=f"{record} in the journal")
    return found


async def provider_count(provider: ProviderProcess, name: str, value: int) -> None:
    async def reached() -> bool:
        return int((await provider.received())[name]) >= value

    await wait_until(reached, timeout=30, what=f"the provider's {name} to reach {value}")


@pytest.fixture
async def provider(tmp_path: Path) -> AsyncIterator[ProviderProcess]:
    process = ProviderProcess(tmp_path)
    await process.start()
    try:
        yield process
    finally:
        process.terminate()


def environment(
    workspace: Workspace, provider: ProviderProcess, extra: dict[str, str] | None = None
) -> dict[str, str]:
    return workspace.environment(provider_url=provider.url, port=free_port(), extra=extra)


async def kill_mid_dispatch(
    tmp_path: Path,
    provider: ProviderProcess,
    env: dict[str, str],
    keys: list[str],
    *,
    token: str | None = None,
) -> None:
    """Each key's payout reaches the provider, which acts and never answers; then SIGKILL.
    ``token``: the proposer's bearer when ``env`` names a principals file."""
    executor = ExecutorProcess(env, tmp_path, "executor-1")
    if token is not None:
        executor.token = token
    await executor.start()
    await provider.set_mode("hang")
    async with aiohttp.ClientSession() as session:
        pending = [
            asyncio.ensure_future(executor.propose(session, amount=4000, key=key)) for key in keys
        ]
        await provider_count(provider, "count", len(keys))
        executor.kill()
        for task in pending:
            with contextlib.suppress(aiohttp.ClientError):
                await task


async def readiness(
    process: ExecutorProcess, session: aiohttp.ClientSession, operator: dict[str, str]
) -> dict[str, Any]:
    """The readiness details (counts, cause) an OPERATOR reads in ``/v1/control/status``:
    anonymous ``/ready`` answers only ``ready`` and ``code`` (issue 22)."""
    async with session.get(process.url + "/v1/control/status", headers=operator) as r:
        assert r.status == 200, await r.text()
        details: dict[str, Any] = (await r.json())["readiness"]
    return details


def events(process: ExecutorProcess, name: str) -> list[dict[str, Any]]:
    return [e for e in process.stdout_events() + process.stderr_events() if e.get("event") == name]


# -- 1. stuck keys -------------------------------------------------------------------------------


async def test_a_kill_after_attempt_closed_replays_the_journals_answer(
    tmp_path: Path, provider: ProviderProcess
) -> None:
    workspace = Workspace(tmp_path / "ws")
    env = environment(workspace, provider)
    executor = ExecutorProcess(env, tmp_path, "executor-1")
    await executor.start()
    await provider.set_mode("hold")
    async with aiohttp.ClientSession() as session:
        pending = asyncio.ensure_future(executor.propose(session, amount=4000, key="closed-1"))
        await provider_count(provider, "held", 1)
        with store_write_lock(workspace):
            await provider.release()
            closed = await journal_has(workspace, "ATTEMPT_CLOSED", outcome="COMPLETED")
            executor.kill()  # ATTEMPT_CLOSED is on disk; the key's answer is not
        with contextlib.suppress(aiohttp.ClientError):
            await pending
    assert closed["answer"]["outcome"] == "COMPLETED"

    restarted = ExecutorProcess(env, tmp_path, "executor-2")
    await restarted.start()
    try:
        async with aiohttp.ClientSession() as session:
            status, body = await restarted.propose(session, amount=4000, key="closed-1")
        assert status == 200, body
        assert body["replayed"] is True
        assert body["outcome"] == "COMPLETED"
        assert body["result"] == closed["answer"]["result"]  # the provider's own reference
        assert int((await provider.received())["count"]) == 1
    finally:
        assert restarted.terminate() == 0


async def test_a_kill_during_startup_reconciliation_still_settles_the_key(
    tmp_path: Path, provider: ProviderProcess
) -> None:
    workspace = Workspace(tmp_path / "ws")
    env = environment(workspace, provider)
    await kill_mid_dispatch(tmp_path, provider, env, ["recon-1"])
    await provider.set_mode("normal")  # the lookup will say it acted
    await provider.set_lookup("hold")

    second = ExecutorProcess(env, tmp_path, "executor-2")
    await second.start(expect_ready=False)  # /health answers while reconciliation runs
    await provider_count(provider, "lookups_waiting", 1)
    with store_write_lock(workspace):
        await provider.release()
        await journal_has(workspace, "RECONCILED", status="COMPLETED", by="RESTART")
        second.kill()  # RECONCILED is on disk; the key was not settled yet
    await provider.set_lookup("normal")

    third = ExecutorProcess(env, tmp_path, "executor-3")
    await third.start()
    try:
        async with aiohttp.ClientSession() as session:
            status, body = await third.propose(session, amount=4000, key="recon-1")
        assert status == 200, body
        assert body["replayed"] is True
        assert body["outcome"] == "COMPLETED"
        assert int((await provider.received())["count"]) == 1
        settled = events(third, "IDEMPOTENCY_KEY_SETTLED")
        assert [e["resolution"] for e in settled] == ["COMPLETED"]
    finally:
        assert third.terminate() == 0


# -- 3. a damaged journal ------------------------------------------------------------------------


async def test_a_grant_claimed_cut_mid_record_asks_the_provider_instead_of_paying_again(
    tmp_path: Path, provider: ProviderProcess
) -> None:
    workspace = Workspace(tmp_path / "ws")
    env = environment(workspace, provider)
    await kill_mid_dispatch(tmp_path, provider, env, ["cut-1"])
    await provider.set_mode("normal")
    (day,) = sorted((workspace.root / "journal" / "attempts").glob("*.jsonl"))
    content = day.read_bytes()
    line_start = content.rfind(b"\n", 0, content.index(b"GRANT_CLAIMED")) + 1
    day.write_bytes(content[: line_start + 40])  # the GRANT_CLAIMED line, cut mid-record

    restarted = ExecutorProcess(env, tmp_path, "executor-2")
    await restarted.start()
    try:
        (reconciliation,) = events(restarted, "RECONCILIATION")
        assert reconciliation["resolution"] == "RECONCILED_COMPLETED"
        assert reconciliation["reason_code"] == "RECONCILE_STORE_DISAGREES"
        async with aiohttp.ClientSession() as session:
            status, body = await restarted.propose(session, amount=4000, key="cut-1")
        assert status == 200, body
        assert body["outcome"] == "COMPLETED"
        assert body["replayed"] is True
        assert int((await provider.received())["count"]) == 1  # never paid twice
    finally:
        assert restarted.terminate() == 0


# -- 6. start-up outlasting the liveness probe --------------------------------------------------


async def test_health_answers_while_concurrent_lookups_hold_ready(
    tmp_path: Path, provider: ProviderProcess
) -> None:
    workspace = Workspace(tmp_path / "ws")
    env = environment(workspace, provider)
    await kill_mid_dispatch(tmp_path, provider, env, ["slow-1", "slow-2", "slow-3"])
    await provider.set_mode("normal")
    await provider.set_lookup("hold")

    restarted = ExecutorProcess(env, tmp_path, "executor-2")
    await restarted.start(expect_ready=False)
    try:
        await provider_count(provider, "lookups_waiting", 3)  # all three asked at once
        async with aiohttp.ClientSession() as session:
            status, ready = await restarted.get_json(session, "/ready")
            assert (status, ready) == (503, {"ready": False, "code": "RECONCILING"})
            status, _ = await restarted.get_json(session, "/health")
            assert status == 200
            status, body = await restarted.propose(session, amount=4000, key="new-1")
            assert status == 503
            assert body["reason_codes"] == ["EXECUTOR_RECONCILING"]
            await provider.release()

            async def ready_now() -> bool:
                return (await restarted.get_json(session, "/ready"))[0] == 200

            await wait_until(ready_now, timeout=30, what="ready after reconciliation")
        resolutions = [e["resolution"] for e in events(restarted, "RECONCILIATION")]
        assert resolutions == ["RECONCILED_COMPLETED"] * 3
    finally:
        assert restarted.terminate() == 0


# -- 7. a provider whose lookup lags its commit -------------------------------------------------


async def test_a_lagging_lookup_is_not_taken_for_not_executed_while_the_grant_lives(
    tmp_path: Path, provider: ProviderProcess
) -> None:
    workspace = Workspace(tmp_path / "ws")
    principals = BearerPrincipals()
    env = principals_env(
        environment(workspace, provider), principals.write(tmp_path / "principals.json")
    )
    proposer = principals.token("treasury-workflow")
    operator = {"authorization": f"Bearer {principals.token(OPERATOR_ID)}"}
    await kill_mid_dispatch(tmp_path, provider, env, ["lag-1"], token=proposer)
    await provider.set_mode("normal")
    await provider.set_lookup("lag")  # 404, although it acted

    restarted = ExecutorProcess(env, tmp_path, "executor-2")
    restarted.token = proposer
    await restarted.start()
    try:
        (reconciliation,) = events(restarted, "RECONCILIATION")
        assert reconciliation["resolution"] == "STILL_UNKNOWN"
        assert reconciliation["reason_code"] == "RECONCILE_TOO_EARLY"
        async with aiohttp.ClientSession() as session:
            status, body = await restarted.propose(session, amount=4000, key="lag-1")
            assert status == 409  # still in flight: never "not executed", never freed
            assert body["error"]["code"] == "IDEMPOTENCY_IN_PROGRESS"
            status, ready = await restarted.get_json(session, "/ready")
            # readiness does not require none here; the count is the operator's to read
            assert (status, ready) == (200, {"ready": True, "code": "READY"})
            assert (await readiness(restarted, session, operator))["unknown_attempts"] == 1
    finally:
        assert restarted.terminate() == 0


# -- 5. /ready counts unknown attempts live ------------------------------------------------------


async def test_ready_follows_a_runtime_unknown_attempt_and_its_reconciliation(
    tmp_path: Path, provider: ProviderProcess
) -> None:
    workspace = Workspace(tmp_path / "ws")
    env = environment(workspace, provider, {"EXECUTOR_READY_REQUIRES_NO_UNKNOWN_ATTEMPTS": "true"})
    executor = ExecutorProcess(env, tmp_path)
    await executor.start()
    try:
        await provider.set_mode("reset")  # acts, then drops the connection
        async with aiohttp.ClientSession() as session:
            status, body = await executor.propose(session, amount=4000, key="unk-1")
            assert (status, body["outcome"]) == (200, "UNKNOWN_AFTER_DISPATCH")
            status, ready = await executor.get_json(session, "/ready")
            assert (status, ready) == (503, {"ready": False, "code": "UNKNOWN_ATTEMPTS_OPEN"})
            headers = {"authorization": f"Bearer {executor.token}"}
            async with session.post(
                executor.url + "/v1/reconciliations",
                json={"recovery": body["recovery"]},
                headers=headers,
            ) as r:
                assert r.status == 200
                assert (await r.json())["outcome"] == "COMPLETED"
            status, ready = await executor.get_json(session, "/ready")
            assert (status, ready) == (200, {"ready": True, "code": "READY"})
    finally:
        assert executor.terminate() == 0


# -- 2 and 4. a full disk after dispatch, a dead journal -----------------------------------------


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A real 4 MiB tmpfs (we are root), unmounted afterwards."""
    mount = tmp_path / "small"
    mount.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(mount)],
        capture_output=True,
        check=False,
    )
    if result.returncode != 0:
        pytest.skip("cannot mount a tmpfs here: " + result.stderr.decode(errors="replace"))
    try:
        yield mount
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


async def test_a_full_journal_disk_after_dispatch_answers_completed_then_halts_and_recovers(
    tmp_path: Path, provider: ProviderProcess, small_fs: Path
) -> None:
    workspace = Workspace(tmp_path / "ws")
    journal_dir = small_fs / "journal"
    env = environment(workspace, provider, {"EXECUTOR_JOURNAL_DIR": str(journal_dir)})
    executor = ExecutorProcess(env, tmp_path)
    await executor.start()
    try:
        await provider.set_mode("hold")
        async with aiohttp.ClientSession() as session:
            pending = asyncio.ensure_future(executor.propose(session, amount=4000, key="full-1"))
            await provider_count(provider, "held", 1)
            filler = fill(small_fs)  # the journal and the chain heads now hit ENOSPC
            await provider.release()
            status, body = await pending
            # The provider paid: the answer is never "not executed".
            assert status == 200, body
            assert body["outcome"] in ("COMPLETED", "UNKNOWN_AFTER_DISPATCH")
            assert body["executed"] is not False
            if body["outcome"] == "UNKNOWN_AFTER_DISPATCH":
                assert body["recovery"]["reference"]

            # tmpfs fills a page already allocated: the next records that need a new page
            # fail. Propose until the journal fails; every answer stays true to the provider.
            await provider.set_mode("normal")
            completed = 1 if body["outcome"] == "COMPLETED" else 0
            refused = False
            for n in range(2, 12):
                status, answer = await executor.propose(session, amount=4000, key=f"full-{n}")
                assert status in (200, 500, 503), answer
                if status == 200 and answer["outcome"] == "COMPLETED":
                    completed += 1
                elif status == 500:
                    assert "not executed" not in answer["error"]["message"]
                if status != 200 or "JOURNAL_UNAVAILABLE" in answer.get("reason_codes", []):
                    refused = True
                    break
            assert refused, "the journal never failed"

            # The failing append halted the executor itself: no poll to wait for.
            status, ready = await executor.get_json(session, "/ready")
            assert (status, ready) == (503, {"ready": False, "code": "EXECUTOR_HALTED"}), ready
            assert int((await provider.received())["count"]) >= completed

            filler.unlink()  # the storage recovers

            async def ready_again() -> bool:
                return (await executor.get_json(session, "/ready"))[0] == 200

            await wait_until(ready_again, timeout=30, what="the journal to recover")
            status, body = await executor.propose(session, amount=4000, key="full-99")
            assert (status, body["outcome"]) == (200, "COMPLETED"), body["reason_codes"]
        names = [e.get("event") for e in executor.stderr_events()]
        assert "JOURNAL_RECOVERED" in names
        halts = [e for e in executor.stderr_events() if e.get("event") == "HALT_CAUSE_LIFTED"]
        assert halts
        assert halts[0]["cause"] == "JOURNAL"
    finally:
        executor.terminate()


# -- 9. the right cause ------------------------------------------------------------------------


async def test_a_second_process_on_one_journal_is_refused_naming_the_lock(
    tmp_path: Path, provider: ProviderProcess
) -> None:
    workspace = Workspace(tmp_path / "ws")
    env = environment(workspace, provider)
    first = ExecutorProcess(env, tmp_path, "first")
    await first.start()
    try:
        second_env = dict(env, PORT=str(free_port()))
        second = ExecutorProcess(second_env, tmp_path, "second")
        second.spawn()
        assert second.process is not None
        assert second.process.wait(timeout=60) == 78
        second.terminate()
        stderr = second.stderr_path.read_text()
        assert "JOURNAL_LOCKED" in stderr
        assert "locked by another agentsafe process" in stderr
        assert "cannot be opened for appending" not in stderr
    finally:
        assert first.terminate() == 0


# -- 1. a SIGKILL before ATTEMPT_OPENED ----------------------------------------------------------

F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ (Linux), named here for Python before 3.10's constant


class StalledStdout:
    """The executor's stdout (its evidence stream) is a pipe this test drains into the usual log
    file; :meth:`stall` stops draining and fills the pipe, so the executor's next evidence line
    blocks in write(2) on fd 1, on the event loop thread, until the test acts.

    A proposal's first evidence line, PROPOSAL_RECEIVED, comes after the idempotency key is
    claimed IN_PROGRESS and before anything is journaled: a stall there holds the process
    exactly between the two."""

    def __init__(self, log_path: Path) -> None:
        self.read_fd, self.write_fd = os.pipe()
        fcntl.fcntl(self.write_fd, F_SETPIPE_SZ, 4096)
        # A second open file description of the write end: O_NONBLOCK here, never on the
        # executor's (a shared description would make its writes fail instead of block).
        self._filler = os.open(f"/proc/self/fd/{self.write_fd}", os.O_WRONLY | os.O_NONBLOCK)
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in close()
        self._paused = threading.Event()
        self._idle = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while not self._stop.is_set():
            if self._paused.is_set():
                self._idle.set()
                self._stop.wait(0.01)
                continue
            ready, _, _ = select.select([self.read_fd], [], [], 0.01)
            if ready:
                chunk = os.read(self.read_fd, 65536)
                if not chunk:
                    return
                self._log.write(chunk)
                self._log.flush()

    def stall(self) -> None:
        self._paused.set()
        assert self._idle.wait(10), "the drain thread did not pause"
        for size in (4096, 1):  # whole pages, then the last bytes: nothing left to write into
            while True:
                try:
                    os.write(self._filler, b"\n" * size)
                except BlockingIOError:
                    break

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for fd in (self._filler, self.read_fd, self.write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._log.close()


class StallableExecutor(ExecutorProcess):
    """An executor whose stdout is a :class:`StalledStdout` pipe."""

    stdout_pipe: StalledStdout | None = None

    def spawn(self) -> None:
        self.stdout_pipe = StalledStdout(self.stdout_path)
        err = open(self.stderr_path, "ab")  # noqa: SIM115 - closed in _close_files
        self._files = [err]
        self.process = subprocess.Popen(
            self.argv,
            env=self.env,
            stdout=self.stdout_pipe.write_fd,
            stderr=err,
            stdin=subprocess.DEVNULL,
            cwd=self.stdout_path.parent,
        )

    def _close_files(self) -> None:
        super()._close_files()
        if self.stdout_pipe is not None:
            self.stdout_pipe.close()
            self.stdout_pipe = None


async def blocked_writing_stdout(pid: int) -> bool:
    """The main thread is inside write(2) on fd 1 (x86-64 syscall 1), read from /proc."""
    fields = Path(f"/proc/{pid}/syscall").read_text().split()
    return fields[:2] == ["1", "0x1"]


async def kill_before_attempt_opened(
    tmp_path: Path,
    env: dict[str, str],
    key: str,
    in_flight: Callable[[], Awaitable[str | None]],
    journal: Callable[[], list[dict[str, Any]]],
) -> str:
    """Propose ``key``, hold the process after its key is IN_PROGRESS and before ATTEMPT_OPENED
    (confirmed from the store, the journal and /proc), SIGKILL it; returns the attempt id."""
    executor = StallableExecutor(env, tmp_path, "stalled")
    await executor.start()
    assert executor.stdout_pipe is not None
    assert executor.process is not None
    executor.stdout_pipe.stall()
    async with aiohttp.ClientSession() as session:
        pending = asyncio.ensure_future(executor.propose(session, amount=4000, key=key))
        attempt_id: str = await wait_until(in_flight, timeout=30, what="the key IN_PROGRESS")
        pid = executor.process.pid
        await wait_until(
            lambda: blocked_writing_stdout(pid), timeout=30, what="the executor blocked in write"
        )
        assert not [r for r in journal() if r.get("attempt_id") == attempt_id]
        executor.kill()
        with contextlib.suppress(aiohttp.ClientError):
            await pending
    return attempt_id


def sqlite_key(workspace: Workspace, key: str) -> tuple[str, str | None] | None:
    conn = sqlite3.connect(f"file:{workspace.root / 'state' / DATABASE_NAME}?mode=ro", uri=True)
    try:
        row = conn.execute(
            "SELECT state, attempt_id FROM idempotency WHERE key = ?", (key,)
        ).fetchone()
    finally:
        conn.close()
    return None if row is None else (str(row[0]), row[1])


async def test_a_kill_before_attempt_opened_frees_the_key_and_the_retry_runs_once(
    tmp_path: Path, provider: ProviderProcess
) -> None:
    workspace = Workspace(tmp_path / "ws")
    env = environment(workspace, provider)

    async def in_flight() -> str | None:
        row = sqlite_key(workspace, "early-1")
        return row[1] if row is not None and row[0] == "IN_PROGRESS" else None

    attempt_id = await kill_before_attempt_opened(
        tmp_path, env, "early-1", in_flight, lambda: journal_records(workspace)
    )
    assert sqlite_key(workspace, "early-1") == ("IN_PROGRESS", attempt_id)  # what SIGKILL left
    assert int((await provider.received())["count"]) == 0

    restarted = ExecutorProcess(env, tmp_path, "executor-2")
    await restarted.start()
    try:
        settled = events(restarted, "IDEMPOTENCY_KEY_SETTLED")
        assert [(e["attempt_id"], e["resolution"]) for e in settled] == [
            (attempt_id, "NEVER_STARTED")
        ]
        async with aiohttp.ClientSession() as session:
            status, body = await restarted.propose(session, amount=4000, key="early-1")
        assert status == 200, body
        assert (body["outcome"], body["replayed"]) == ("COMPLETED", False)
        received = await provider.received()
        assert (received["count"], received["keys"]) == (1, ["early-1"])
    finally:
        assert restarted.terminate() == 0


# -- 1. kills at natural timing just after the provider answered --------------------------------


async def test_kills_just_after_the_provider_answered_leave_no_stuck_key_and_no_second_dispatch(
    tmp_path: Path, provider: ProviderProcess
) -> None:
    workspace = Workspace(tmp_path / "ws")
    env = environment(workspace, provider)
    keys = [f"natural-{n}" for n in range(6)]
    await provider.set_mode("hold")
    executor = ExecutorProcess(env, tmp_path, "executor-0")
    await executor.start()
    positions: list[str] = []
    try:
        async with aiohttp.ClientSession() as session:
            for n, key in enumerate(keys):
                pending = asyncio.ensure_future(executor.propose(session, amount=4000, key=key))
                await provider_count(provider, "held", 1)
                await provider.release()  # the provider answers now ...
                executor.kill()  # ... and the kill follows at once, wherever the executor is
                with contextlib.suppress(aiohttp.ClientError):
                    await pending
                positions.append(kill_position(workspace, key))
                executor = ExecutorProcess(env, tmp_path, f"executor-{n + 1}")
                await executor.start()
            await provider.set_mode("normal")
            for key in keys:
                status, body = await executor.propose(session, amount=4000, key=key)
                assert status == 200, (key, body)  # never 409 IDEMPOTENCY_IN_PROGRESS
                assert (body["outcome"], body["replayed"]) == ("COMPLETED", True), (key, body)
        received = await provider.received()
        assert sorted(received["keys"]) == sorted(keys)  # each paid once, none twice
        print(f"kill positions: {positions}")
    finally:
        assert executor.terminate() == 0


def kill_position(workspace: Workspace, key: str) -> str:
    """Where a kill left ``key``: DONE (the store has its answer), CLOSED (ATTEMPT_CLOSED is
    journaled, the key still in flight) or OPEN (the provider answered, nothing recorded)."""
    row = sqlite_key(workspace, key)
    assert row is not None, key
    if row[0] == "DONE":
        return "DONE"
    records = [r.get("record") for r in journal_records(workspace) if r.get("attempt_id") == row[1]]
    return "CLOSED" if "ATTEMPT_CLOSED" in records else "OPEN"


@pytest.mark.xdist_group("postgres")
async def test_on_postgresql_a_kill_before_attempt_opened_frees_the_key_and_the_retry_runs_once(
    tmp_path: Path, provider: ProviderProcess, pg_url: str
) -> None:
    workspace = Workspace(tmp_path / "ws")
    env = environment(
        workspace, provider, {"EXECUTOR_STORE_URL": pg_url, "EXECUTOR_REPLICA_ID": "r0"}
    )
    env.pop("EXECUTOR_STATE_DIR")  # the shared store holds the keys

    def pg_key(key: str) -> tuple[str, str | None] | None:
        with psycopg.connect(pg_url) as conn:
            row = conn.execute(
                "SELECT state, attempt_id FROM idempotency WHERE key = %s", (key,)
            ).fetchone()
        return None if row is None else (str(row[0]), row[1])

    async def in_flight() -> str | None:
        row = pg_key("pg-early-1")
        return row[1] if row is not None and row[0] == "IN_PROGRESS" else None

    attempt_id = await kill_before_attempt_opened(
        tmp_path, env, "pg-early-1", in_flight, lambda: journal_records(workspace)
    )
    assert pg_key("pg-early-1") == ("IN_PROGRESS", attempt_id)  # what SIGKILL left

    restarted = ExecutorProcess(env, tmp_path, "executor-2")
    await restarted.start()
    try:
        settled = events(restarted, "IDEMPOTENCY_KEY_SETTLED")
        assert [(e["attempt_id"], e["resolution"]) for e in settled] == [
            (attempt_id, "NEVER_STARTED")
        ]
        async with aiohttp.ClientSession() as session:
            status, body = await restarted.propose(session, amount=4000, key="pg-early-1")
        assert status == 200, body
        assert (body["outcome"], body["replayed"]) == ("COMPLETED", False)
        assert (await provider.received())["keys"] == ["pg-early-1"]
        row = pg_key("pg-early-1")
        assert row is not None
        assert row[0] == "DONE"
    finally:
        assert restarted.terminate() == 0


@pytest.mark.xdist_group("postgres")
async def test_on_postgresql_a_kill_after_the_provider_answered_settles_the_key_at_restart(
    tmp_path: Path, provider: ProviderProcess, pg_url: str
) -> None:
    workspace = Workspace(tmp_path / "ws")
    env = environment(
        workspace, provider, {"EXECUTOR_STORE_URL": pg_url, "EXECUTOR_REPLICA_ID": "r0"}
    )
    env.pop("EXECUTOR_STATE_DIR")
    await kill_mid_dispatch(tmp_path, provider, env, ["pg-mid-1"])
    await provider.set_mode("normal")  # its lookup says it acted
    restarted = ExecutorProcess(env, tmp_path, "executor-2")
    await restarted.start()
    try:
        async with aiohttp.ClientSession() as session:
            status, body = await restarted.propose(session, amount=4000, key="pg-mid-1")
        assert status == 200, body  # never 409 IDEMPOTENCY_IN_PROGRESS
        assert (body["outcome"], body["replayed"]) == ("COMPLETED", True)
        assert (await provider.received())["keys"] == ["pg-mid-1"]
    finally:
        assert restarted.terminate() == 0


# -- 5. an operator's decision for a BINDING_MISMATCH -------------------------------------------


async def test_an_operators_decision_settles_a_binding_mismatch_and_ready_returns(
    tmp_path: Path, provider: ProviderProcess
) -> None:
    workspace = Workspace(tmp_path / "ws")
    principals = BearerPrincipals()
    env = principals_env(
        environment(workspace, provider),
        principals.write(tmp_path / "principals.json"),
        EXECUTOR_READY_REQUIRES_NO_UNKNOWN_ATTEMPTS="true",
    )
    proposer = principals.token("treasury-workflow")
    operator = {"authorization": f"Bearer {principals.token(OPERATOR_ID)}"}

    first = ExecutorProcess(env, tmp_path, "executor-1")
    first.token = proposer
    await first.start()
    await provider.set_mode("hang")
    async with aiohttp.ClientSession() as session:
        pending = asyncio.ensure_future(first.propose(session, amount=4000, key="mismatch-1"))
        await provider_count(provider, "count", 1)
        first.kill()
        with contextlib.suppress(aiohttp.ClientError):
            await pending
    await provider.set_mode("normal")
    # The caller recorded beside the hash no longer matches the key's record.
    (day,) = sorted((workspace.root / "journal" / "attempts").glob("*.jsonl"))
    content = day.read_bytes()
    assert content.count(b'"caller":"treasury-workflow"') == 1
    day.write_bytes(content.replace(b'"caller":"treasury-workflow"', b'"caller":"someone-else"'))

    second = ExecutorProcess(env, tmp_path, "executor-2")
    second.token = proposer
    await second.start(expect_ready=False)
    try:
        async with aiohttp.ClientSession() as session:

            async def settled_start() -> dict[str, Any] | None:
                _, ready = await second.get_json(session, "/ready")
                return None if ready["code"] == "RECONCILING" else ready

            ready = await wait_until(settled_start, timeout=60, what="start-up reconciliation")
            assert ready == {"ready": False, "code": "UNKNOWN_ATTEMPTS_OPEN"}
            assert (await readiness(second, session, operator))["unknown_attempts"] == 1
            (reconciliation,) = events(second, "RECONCILIATION")
            assert reconciliation["resolution"] == "BINDING_MISMATCH"
            async with session.get(second.url + "/v1/control/open-attempts", headers=operator) as r:
                (attempt,) = (await r.json())["open_attempts"]
            assert attempt["state"] == "BINDING_MISMATCH"
            status, body = await second.propose(session, amount=4000, key="mismatch-1")
            assert (status, body["error"]["code"]) == (409, "IDEMPOTENCY_IN_PROGRESS")

            decision_url = second.url + "/v1/control/open-attempts/decision"
            async with session.post(
                decision_url,
                json={"attempt_id": "no-such-attempt", "executed": True, "reason": "checked"},
                headers=operator,
            ) as r:
                assert r.status == 404
                assert (await r.json())["error"]["code"] == "ATTEMPT_NOT_OPEN"
            async with session.post(
                decision_url, json={"attempt_id": attempt["attempt_id"]}, headers=operator
            ) as r:
                assert r.status == 400  # no decision, no reason: nothing recorded
            async with session.post(
                decision_url,
                json={"attempt_id": attempt["attempt_id"], "executed": True, "reason": "checked"},
                headers={"authorization": f"Bearer {proposer}"},
            ) as r:
                assert r.status == 403  # only an operator decides
            async with session.post(
                decision_url,
                json={
                    "attempt_id": attempt["attempt_id"],
                    "executed": True,
                    "reason": "the bank statement shows payout mismatch-1",
                },
                headers=operator,
            ) as r:
                assert r.status == 200, await r.text()
                decided = await r.json()
            assert decided == {
                "attempt_id": attempt["attempt_id"],
                "status": "COMPLETED",
                "by": "OPERATOR",
            }
            status, ready = await second.get_json(session, "/ready")
            assert (status, ready) == (200, {"ready": True, "code": "READY"})
            assert (await readiness(second, session, operator))["unknown_attempts"] == 0
            async with session.get(second.url + "/v1/control/open-attempts", headers=operator) as r:
                assert (await r.json())["open_attempts"] == []
            status, body = await second.propose(session, amount=4000, key="mismatch-1")
            assert status == 200, body
            assert (body["outcome"], body["replayed"]) == ("COMPLETED", True)
        (recorded,) = [
            r
            for r in journal_records(workspace)
            if r.get("record") == "RECONCILED" and r.get("by") == "OPERATOR"
        ]
        assert (recorded["status"], recorded["decided_by"]) == ("COMPLETED", OPERATOR_ID)
        assert recorded["reason"] == "the bank statement shows payout mismatch-1"
        (decision_line,) = events(second, "ATTEMPT_DECIDED")
        assert (decision_line["by"], decision_line["status"]) == (OPERATOR_ID, "COMPLETED")
        assert int((await provider.received())["count"]) == 1
    finally:
        assert second.terminate() == 0

    # The decision is the journal's: the next start finds nothing open and is ready.
    third = ExecutorProcess(env, tmp_path, "executor-3")
    third.token = proposer
    await third.start()
    try:
        assert events(third, "RECONCILIATION") == []
    finally:
        assert third.terminate() == 0


# -- 8. housekeeping on a schedule ---------------------------------------------------------------


async def test_housekeeping_purges_the_store_and_prunes_old_days_but_keeps_an_open_attempt(
    tmp_path: Path, provider: ProviderProcess
) -> None:
    workspace = Workspace(tmp_path / "ws")
    principals = BearerPrincipals()
    env = principals_env(
        environment(workspace, provider),
        principals.write(tmp_path / "principals.json"),
        EXECUTOR_HOUSEKEEPING_INTERVAL_SECONDS="1",
    )
    proposer = principals.token("treasury-workflow")
    operator = {"authorization": f"Bearer {principals.token(OPERATOR_ID)}"}
    attempts = workspace.root / "journal" / "attempts"
    database = workspace.root / "state" / DATABASE_NAME

    # A finished payout and one whose outcome nobody knows (killed mid-dispatch).
    first = ExecutorProcess(env, tmp_path, "executor-1")
    first.token = proposer
    await first.start()
    async with aiohttp.ClientSession() as session:
        status, done = await first.propose(session, amount=4000, key="done-1")
        assert (status, done["outcome"]) == (200, "COMPLETED")
        await provider.set_mode("hang")
        pending = asyncio.ensure_future(first.propose(session, amount=4000, key="open-1"))
        await provider_count(provider, "count", 2)
        first.kill()
        with contextlib.suppress(aiohttp.ClientError):
            await pending
    await provider.set_mode("normal")

    # Age them: the finished attempt's records move to a day past retention, the open one's to
    # another (its caller altered, so it stays open: BINDING_MISMATCH); the store's rows for the
    # finished payout are made older than the store's retention.
    (today,) = sorted(attempts.glob("*.jsonl"))
    lines = [line for line in today.read_bytes().split(b"\n") if line]
    opened = {json.loads(line)["attempt_id"] for line in lines}
    done_id = next(
        json.loads(line)["attempt_id"] for line in lines if b'"record":"ATTEMPT_CLOSED"' in line
    )
    (open_id,) = opened - {done_id}
    old_closed, old_open = attempts / "2020-01-01.jsonl", attempts / "2020-01-02.jsonl"
    old_closed.write_bytes(b"".join(x + b"\n" for x in lines if done_id.encode() in x))
    old_open.write_bytes(
        b"".join(
            x.replace(b'"caller":"treasury-workflow"', b'"caller":"someone-else"') + b"\n"
            for x in lines
            if open_id.encode() in x
        )
    )
    today.unlink()
    (attempts / ".days").write_text("2020-01-01\n2020-01-02\n")
    (grant_id,) = [
        json.loads(x)["grant_id"]
        for x in lines
        if done_id.encode() in x and b'"record":"GRANT_CLAIMED"' in x
    ]
    three_days = 3 * 86400
    with contextlib.closing(sqlite3.connect(database)) as conn, conn:
        conn.execute(
            "UPDATE idempotency SET completed_at = completed_at - ? WHERE key = 'done-1'",
            (three_days,),
        )
        conn.execute(
            "UPDATE grant_claims SET expires_at = expires_at - ? WHERE grant_id = ?",
            (three_days, grant_id),
        )

    def keys_in_store() -> set[str]:
        with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as conn:
            return {str(r[0]) for r in conn.execute("SELECT key FROM idempotency")}

    assert keys_in_store() == {"done-1", "open-1"}

    second = ExecutorProcess(env, tmp_path, "executor-2")
    second.token = proposer
    await second.start(expect_ready=False)
    try:

        async def pruned() -> list[dict[str, Any]]:
            return events(second, "HOUSEKEEPING")

        (first_run,) = await wait_until(pruned, timeout=60, what="the first housekeeping")
        assert first_run["pruned_files"] == ["attempts/2020-01-01.jsonl"]
        assert first_run["purged_rows"] == 2  # the finished key and its grant's claim
        assert not old_closed.exists()
        assert old_open.exists()  # past retention, but it holds an open attempt
        assert keys_in_store() == {"open-1"}  # an in-flight key is never purged
        async with aiohttp.ClientSession() as session:
            async with session.get(second.url + "/v1/control/open-attempts", headers=operator) as r:
                listed = (await r.json())["open_attempts"]
            assert [(a["attempt_id"], a["state"]) for a in listed] == [
                (open_id, "BINDING_MISMATCH")
            ]
        assert events(second, "JOURNAL_DAY_FILE_MISSING") == []

        # Housekeeping runs again on its interval: more that is old goes the same way.
        planted = attempts / "2020-01-03.jsonl"
        planted.write_text(
            json.dumps(
                {
                    "record": "ATTEMPT_CLOSED",
                    "at": "2020-01-03T00:00:00.000Z",
                    "attempt_id": "planted-1",
                    "outcome": "COMPLETED",
                    "executed": True,
                    "finalization": "RECORDED",
                },
                separators=(",", ":"),
            )
            + "\n"
        )
        with contextlib.closing(sqlite3.connect(database, timeout=30)) as conn, conn:
            conn.execute(
                "INSERT INTO idempotency (tenant, principal, key, payload_digest, state,"
                " response, created_at, completed_at) VALUES (?, ?, ?, ?, 'DONE', '{}', ?, ?)",
                ("t", "p", "planted-key", "d", 1_600_000_000.0, 1_600_000_000.0),
            )

        async def swept() -> bool:
            return len(events(second, "HOUSEKEEPING")) >= 2  # written after the run's work

        await wait_until(swept, timeout=60, what="the next housekeeping run")
        assert not planted.exists()
        assert "planted-key" not in keys_in_store()
        assert old_open.exists()
    finally:
        assert second.terminate() == 0

    # The pruned days are gone from the writer's list too: a restart reports nothing missing
    # and still holds the open attempt.
    third = ExecutorProcess(env, tmp_path, "executor-3")
    third.token = proposer
    await third.start(expect_ready=False)
    try:

        async def reconciled() -> list[dict[str, Any]]:
            return events(third, "RECONCILIATION")

        (again,) = await wait_until(reconciled, timeout=60, what="start-up reconciliation")
        assert (again["attempt_id"], again["resolution"]) == (open_id, "BINDING_MISMATCH")
        assert events(third, "JOURNAL_DAY_FILE_MISSING") == []
    finally:
        assert third.terminate() == 0


# -- 2. a full use-store disk after dispatch ----------------------------------------------------


async def test_a_full_use_store_disk_after_dispatch_answers_completed_and_the_key_replays_it(
    tmp_path: Path, provider: ProviderProcess, small_fs: Path
) -> None:
    workspace = Workspace(tmp_path / "ws")
    state_dir = small_fs / "state"
    env = environment(
        workspace,
        provider,
        {"EXECUTOR_STATE_DIR": str(state_dir), "EXECUTOR_HOUSEKEEPING_INTERVAL_SECONDS": "1"},
    )
    database = state_dir / DATABASE_NAME

    def key_state(key: str) -> str | None:
        with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as conn:
            row = conn.execute("SELECT state FROM idempotency WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    executor = ExecutorProcess(env, tmp_path)
    await executor.start()
    try:
        await provider.set_mode("hold")
        async with aiohttp.ClientSession() as session:
            pending = asyncio.ensure_future(executor.propose(session, amount=4000, key="sfull-1"))
            await provider_count(provider, "held", 1)  # key claimed, grant claimed, dispatched
            filler = fill(small_fs)  # the use store's next write (its WAL grows) hits ENOSPC
            await provider.release()
            status, body = await pending
            # The provider paid: the answer is never "not executed".
            assert status == 200, body
            assert (body["outcome"], body["executed"]) == ("COMPLETED", True), body
            assert key_state("sfull-1") == "IN_PROGRESS"  # the store did not take the answer
            logged = executor.stderr_path.read_text()
            assert "the final answer was not recorded" in logged  # ... and it said so

            # A retry gets exactly the answer given, while the disk is still full.
            status, again = await executor.propose(session, amount=4000, key="sfull-1")
            assert status == 200, again
            assert (again["outcome"], again["replayed"]) == ("COMPLETED", True)
            assert again["result"] == body["result"]

            # New work cannot claim a key on a full disk: refused before anything is sent,
            # and the refusal never claims anything about execution.
            await provider.set_mode("normal")
            status, refused = await executor.propose(session, amount=4000, key="sfull-2")
            assert status >= 500 or refused.get("executed") is False, refused
            if status == 500:
                assert "not executed" not in refused["error"]["message"]
            assert (await provider.received())["keys"] == ["sfull-1"]

            filler.unlink()  # the storage recovers; housekeeping records the answer

            async def recorded() -> bool:
                return key_state("sfull-1") == "DONE"

            await wait_until(recorded, timeout=30, what="the answer recorded once there is room")
            status, replay = await executor.propose(session, amount=4000, key="sfull-1")
            assert (status, replay["outcome"], replay["replayed"]) == (200, "COMPLETED", True)
            assert replay["result"] == body["result"]
            assert int((await provider.received())["count"]) == 1
    finally:
        assert executor.terminate() == 0
