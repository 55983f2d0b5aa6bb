"""``EXECUTOR_WORKERS=2``: a real ``agentsafe serve`` supervisor, two worker processes, one port.

Every test drives real processes on loopback (the synthetic provider, the supervisor, its
workers). A connection reaches whichever worker the kernel picks (``SO_REUSEPORT``); a test
that needs a given worker opens connections until ``GET /v1/control/status`` on one names it,
and keeps that kept-alive connection (:func:`pinned`). Every wait polls with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import signal
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from agentsafe.executor.clock import SystemClock
from agentsafe.executor.events import EVIDENCE_SCHEMA, SECURITY_SCHEMA
from agentsafe.executor.evidence.bundle import verify_bundle
from agentsafe.executor.evidence.chainverify import chain_key, verify_chain_file
from agentsafe.executor.state.journal import AttemptJournal
from agentsafe.executor.tools.harness import (
    ExecutorProcess,
    ProviderProcess,
    Workspace,
    free_port,
    wait_until,
)
from tests.support.pki import TestCA

from .bearer_principals import OPERATOR_ID, BearerPrincipals, principals_env
from .estate import write_private

pytestmark = pytest.mark.slow

AGENT = "treasury-workflow"


@pytest.fixture
async def provider(tmp_path: Path) -> AsyncIterator[ProviderProcess]:
    process = ProviderProcess(tmp_path)
    await process.start()
    try:
        yield process
    finally:
        process.terminate()


class Group:
    """One supervisor and what a test needs to reach its workers."""

    def __init__(
        self,
        tmp_path: Path,
        provider: ProviderProcess,
        *,
        workers: int = 2,
        name: str = "executor",
        workspace: Workspace | None = None,
        principals: BearerPrincipals | None = None,
    ) -> None:
        self.workspace = workspace or Workspace(tmp_path / "ws")
        self.principals = principals or BearerPrincipals()
        env = principals_env(
            self.workspace.environment(
                provider_url=provider.url,
                port=free_port(),
                extra={"EXECUTOR_WORKERS": str(workers)},
            ),
            self.principals.write(tmp_path / f"principals-{name}.json"),
        )
        self.env = env
        self.process = ExecutorProcess(env, tmp_path, name)
        self.journal = self.workspace.root / "journal"

    def headers(self, principal: str) -> dict[str, str]:
        return {"authorization": f"Bearer {self.principals.token(principal)}"}

    @property
    def ops(self) -> dict[str, str]:
        return self.headers(OPERATOR_ID)

    async def pinned(self, index: int) -> aiohttp.ClientSession:
        """A session whose one kept-alive connection reached worker ``index``."""

        async def attempt() -> aiohttp.ClientSession | None:
            session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1))
            try:
                status, body = await self.get(session, "/v1/control/status")
                if status == 200 and body.get("worker") == index:
                    return session
            except aiohttp.ClientError:
                pass
            await session.close()
            return None

        pinned: aiohttp.ClientSession = await wait_until(
            attempt, timeout=60, what=f"a connection that reaches worker {index}"
        )
        return pinned

    async def get(
        self, session: aiohttp.ClientSession, path: str, *, accept: str | None = None
    ) -> tuple[int, Any]:
        headers = self.ops if accept is None else {**self.ops, "accept": accept}
        async with session.get(self.process.url + path, headers=headers) as r:
            text = await r.text()
            return r.status, (json.loads(text) if r.content_type == "application/json" else text)

    async def post(
        self, session: aiohttp.ClientSession, path: str, body: Any, *, principal: str = OPERATOR_ID
    ) -> tuple[int, dict[str, Any]]:
        headers = self.headers(principal)
        async with session.post(self.process.url + path, json=body, headers=headers) as r:
            payload: dict[str, Any] = await r.json()
            return r.status, payload

    async def propose(
        self, session: aiohttp.ClientSession, *, key: str, amount: int = 1200
    ) -> tuple[int, dict[str, Any]]:
        body = {
            "proposal": {
                "action": "create_payout",
                "target": "payout:synthetic-beneficiary-1",
                "parameters": {"amountMinor": amount, "currency": "USD"},
            },
            "idempotency_key": key,
        }
        return await self.post(session, "/v1/actions", body, principal=AGENT)

    async def roster(self, session: aiohttp.ClientSession) -> list[dict[str, Any]]:
        status, body = await self.get(session, "/v1/control/status")
        assert status == 200, body
        workers: list[dict[str, Any]] = body["workers"]
        return workers

    async def all_ready(self) -> None:
        """Every worker published that it is ready (its start-up reconciliation done)."""

        async def ready() -> bool:
            async with aiohttp.ClientSession() as session:
                try:
                    roster = await self.roster(session)
                except (aiohttp.ClientError, AssertionError):
                    return False
            return all(w["published"] and w.get("ready") for w in roster)

        await wait_until(ready, timeout=60, what="every worker to become ready")

    def supervisor_events(self, event: str) -> list[dict[str, Any]]:
        return [
            e
            for e in self.process.stderr_events()
            if e.get("logger") == "agentsafe.executor.supervisor" and e.get("event") == event
        ]


async def received(provider: ProviderProcess) -> int:
    return int((await provider.received())["count"])


async def test_two_workers_answer_on_one_port_and_every_view_names_both(
    tmp_path: Path, provider: ProviderProcess
) -> None:
    group = Group(tmp_path, provider)
    await group.process.start()
    await group.all_ready()
    sessions: list[aiohttp.ClientSession] = []
    try:
        sessions = [await group.pinned(0), await group.pinned(1)]
        for index, session in enumerate(sessions):
            status, body = await group.propose(session, key=f"via-{index}")
            assert (status, body["outcome"], body["executed"]) == (200, "COMPLETED", True)
        assert await received(provider) == 2

        # The status, from either worker, names both (pid, state, halted, open attempts).
        for index, session in enumerate(sessions):
            roster = await group.roster(session)
            assert [w["index"] for w in roster] == [0, 1]
            assert len({w["pid"] for w in roster}) == 2
            assert all(w["state"] == "running" and w["published"] for w in roster)
            assert all(w["halted"] is False and w["open_attempts"] == 0 for w in roster)
            assert [w["this_worker"] for w in roster] == [index == 0, index == 1]

        # A scrape of one worker counts the proposals both answered.
        status, text = await group.get(
            sessions[0], "/metrics", accept="application/openmetrics-text; version=1.0.0"
        )
        assert status == 200
        allowed = [
            s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "agentsafe_proposals_total" and s.labels == {"verdict": "ALLOW"}
        ]
        assert allowed == [2.0]

        # SIGHUP reaches every worker: each re-reads the principals file (here: refuses it).
        principals_file = Path(group.env["EXECUTOR_PRINCIPALS_FILE"])
        good = principals_file.read_text()
        principals_file.write_text("{not json")
        assert group.process.process is not None
        group.process.process.send_signal(signal.SIGHUP)

        async def both_reloaded() -> bool:
            refused = [
                e["worker"]
                for e in group.process.stderr_events()
                if e.get("event") == "PRINCIPALS_RELOAD_REFUSED"
            ]
            return sorted(refused) == [0, 1]

        await wait_until(both_reloaded, timeout=20, what="both workers to re-read their secrets")
        principals_file.write_text(good)
    finally:
        for session in sessions:
            await session.close()
        assert group.process.terminate() == 0

    # The forwarded streams interleave two chains per stream, each whole and intact.
    for path, schema in (
        (group.process.stdout_path, EVIDENCE_SCHEMA),
        (group.process.stderr_path, SECURITY_SCHEMA),
    ):
        report = verify_chain_file(path, require_genesis=True)
        assert report.ok, report.findings
        assert set(report.streams) == {chain_key(schema, 0), chain_key(schema, 1)}
    for index in (0, 1):
        heads = group.journal / f"worker-{index}" / "chain"
        assert json.loads((heads / "security.head.json").read_text())["clean"] is True


async def test_a_halt_on_one_worker_halts_every_worker_and_a_resume_lifts_it(
    tmp_path: Path, provider: ProviderProcess
) -> None:
    group = Group(tmp_path, provider)
    await group.process.start()
    await group.all_ready()
    first, second = await group.pinned(0), await group.pinned(1)
    try:
        status, _ = await group.post(first, "/v1/control/halt", {"reason": "incident 7"})
        assert status == 200

        async def halted_on_second() -> bool:
            async with second.get(group.process.url + "/ready") as r:
                return r.status == 503 and (await r.json())["code"] == "EXECUTOR_HALTED"

        await wait_until(halted_on_second, timeout=10, what="the second worker to halt")
        status, body = await group.propose(second, key="during-halt")
        assert status == 503
        assert body["reason_codes"] == ["EXECUTOR_HALTED"]
        roster = await group.roster(second)
        assert [w["halted"] for w in roster] == [True, True]

        status, _ = await group.post(second, "/v1/control/resume", {"reason": "all clear"})
        assert status == 200

        async def ready_on_first() -> bool:
            async with first.get(group.process.url + "/ready") as r:
                return r.status == 200

        await wait_until(ready_on_first, timeout=10, what="the first worker to resume")
        status, body = await group.propose(first, key="after-resume")
        assert (status, body["outcome"]) == (200, "COMPLETED")
        assert await received(provider) == 1
    finally:
        await first.close()
        await second.close()
        assert group.process.terminate() == 0
    security = group.process.stderr_events()
    halted = [e for e in security if e.get("event") == "HALTED"]
    assert {(e["worker"], e.get("from_worker")) for e in halted} == {(0, None), (1, 0)}
    resumed = [e for e in security if e.get("event") == "RESUMED"]
    assert {(e["worker"], e.get("from_worker")) for e in resumed} == {(1, None), (0, 1)}


async def test_the_same_key_raced_through_both_workers_executes_once(
    tmp_path: Path, provider: ProviderProcess
) -> None:
    group = Group(tmp_path, provider)
    await group.process.start()
    await group.all_ready()
    first, second = await group.pinned(0), await group.pinned(1)
    try:
        await provider.set_mode("hold")  # the first dispatch waits at the provider
        pending = asyncio.ensure_future(group.propose(first, key="raced"))

        async def dispatched() -> bool:
            return await received(provider) == 1

        await wait_until(dispatched, timeout=30, what="the first worker's dispatch")
        status, body = await group.propose(second, key="raced")
        assert status == 409, body
        assert body["error"]["code"] == "IDEMPOTENCY_IN_PROGRESS"
        await provider.release()
        status, body = await pending
        assert (status, body["outcome"]) == (200, "COMPLETED")
        await provider.set_mode("normal")
        # Settled: the other worker replays the answer and sends nothing.
        status, body = await group.propose(second, key="raced")
        assert (status, body["replayed"], body["outcome"]) == (200, True, "COMPLETED")

        # The same proposal at once through both workers: one execution, whoever won.
        replies = await asyncio.gather(*(group.propose(s, key="burst") for s in (first, second)))
        executed = [body for status, body in replies if status == 200 and not body["replayed"]]
        assert len(executed) == 1, replies
        assert all(status in (200, 409) for status, _ in replies), replies
        assert await received(provider) == 2
    finally:
        await first.close()
        await second.close()
        assert group.process.terminate() == 0


async def test_sigkill_of_a_worker_mid_load_restarts_it_and_reconciles_its_attempt(
    tmp_path: Path, provider: ProviderProcess
) -> None:
    group = Group(tmp_path, provider)
    await group.process.start()
    await group.all_ready()
    first, second = await group.pinned(0), await group.pinned(1)
    try:
        victim = (await group.roster(first))[1]["pid"]
        await provider.set_mode("hold")
        doomed = asyncio.ensure_future(group.propose(second, key="doomed"))
        await wait_until(lambda: _count_is(provider, 1), timeout=30, what="worker 1's dispatch")
        os.kill(victim, signal.SIGKILL)
        with contextlib.suppress(aiohttp.ClientError):
            await doomed
        await provider.set_mode("normal")
        await provider.release()

        # The other worker keeps serving while worker 1 is down and coming back.
        load = [await group.propose(first, key=f"load-{i}") for i in range(5)]
        assert all(status == 200 and body["executed"] for status, body in load)

        async def restarted() -> bool:
            worker = (await group.roster(first))[1]
            return bool(worker["pid"] != victim and worker.get("published") and worker.get("ready"))

        await wait_until(restarted, timeout=60, what="worker 1 to restart and become ready")
        roster = await group.roster(first)
        assert roster[1]["restarts"] == 1
        assert roster[1]["open_attempts"] == 0
        assert await received(provider) == 6  # nothing sent twice, nothing lost

        # Its journal was reconciled at its start: the key answers with the outcome.
        status, body = await group.propose(first, key="doomed")
        assert (status, body["replayed"], body["outcome"]) == (200, True, "COMPLETED")
        assert await received(provider) == 6
    finally:
        await first.close()
        await second.close()
        assert group.process.terminate() == 0
    reconciled = [e for e in group.process.stdout_events() if e.get("event") == "RECONCILIATION"]
    assert [(e["worker"], e["resolution"]) for e in reconciled] == [(1, "RECONCILED_COMPLETED")]
    exited = group.supervisor_events("WORKER_EXITED")
    assert [(e["worker"], e["pid"], e["status"]) for e in exited] == [(1, victim, -9)]
    # The restarted worker's chains resume past the crash, announced; nothing is tampered with.
    report = verify_chain_file(group.process.stdout_path)
    assert report.ok, report.findings
    assert [g.worker for g in report.gaps] == [1]


async def _count_is(provider: ProviderProcess, count: int) -> bool:
    return await received(provider) == count


async def test_sigterm_drains_every_worker_and_exits_0(
    tmp_path: Path, provider: ProviderProcess
) -> None:
    group = Group(tmp_path, provider)
    await group.process.start()
    await group.all_ready()
    first, second = await group.pinned(0), await group.pinned(1)
    try:
        await provider.set_mode("hold")
        inflight = [
            asyncio.ensure_future(group.propose(first, key="drain-0")),
            asyncio.ensure_future(group.propose(second, key="drain-1")),
        ]
        await wait_until(lambda: _count_is(provider, 2), timeout=30, what="both dispatches")
        assert group.process.process is not None
        group.process.process.send_signal(signal.SIGTERM)
        await wait_until(
            lambda: _async(bool(group.supervisor_events("SUPERVISOR_STOPPING"))),
            timeout=10,
            what="the supervisor to forward SIGTERM",
        )
        await provider.release()
        for future in inflight:
            status, body = await future
            assert (status, body["outcome"], body["executed"]) == (200, "COMPLETED", True)
    finally:
        await first.close()
        await second.close()
    assert group.process.terminate() == 0
    assert [e["status"] for e in group.supervisor_events("WORKER_STOPPED")] == [0, 0]
    for index in (0, 1):
        directory = group.journal / f"worker-{index}"
        journal = await AttemptJournal.open(directory, retain_days=30, clock=SystemClock())
        try:
            assert (await journal.scan()).open_attempts == ()
        finally:
            await journal.close()
        head = json.loads((directory / "chain" / "evidence.head.json").read_text())
        assert head["clean"] is True


async def _async(value: bool) -> bool:
    return value


async def test_a_worker_refusing_to_start_stops_the_group_with_one_clear_line(
    tmp_path: Path, provider: ProviderProcess
) -> None:
    group = Group(tmp_path, provider)
    attempts = group.journal / "worker-1" / "attempts"
    attempts.mkdir(parents=True, mode=0o700)
    # Another process holds worker 1's journal: that worker refuses (JOURNAL_LOCKED, exit 78).
    lock = os.open(attempts / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        group.process.spawn()
        assert group.process.process is not None
        status = await asyncio.to_thread(group.process.process.wait, 60)
    finally:
        os.close(lock)
        group.process.terminate()
    assert status == 78
    refusals = group.supervisor_events("REFUSED_TO_START")
    assert [r["code"] for r in refusals] == ["WORKER_REFUSED_TO_START"]
    assert [r["worker"] for r in group.supervisor_events("WORKER_REFUSED")] == [1]
    worker_refusal = [
        e
        for e in group.process.stderr_events()
        if e.get("event") == "REFUSED_TO_START" and e.get("code") == "JOURNAL_LOCKED"
    ]
    assert len(worker_refusal) == 1
    assert group.supervisor_events("WORKER_EXITED") == []  # refused: never restarted


async def test_a_journal_left_by_a_larger_group_refuses_the_start_until_it_is_settled(
    tmp_path: Path, provider: ProviderProcess
) -> None:
    group = Group(tmp_path, provider)
    await group.process.start()
    await group.all_ready()
    second = await group.pinned(1)
    try:
        pids = [w["pid"] for w in await group.roster(second)]
        await provider.set_mode("hold")
        doomed = asyncio.ensure_future(group.propose(second, key="left-open"))
        await wait_until(lambda: _count_is(provider, 1), timeout=30, what="worker 1's dispatch")
        group.process.kill()  # the supervisor first (SIGKILL), then each worker
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(aiohttp.ClientError):
            await doomed
    finally:
        await second.close()
    await provider.set_mode("normal")
    await provider.release()

    async def gone() -> bool:
        alive = []
        for pid in pids:
            try:
                os.kill(pid, 0)
                alive.append(pid)
            except ProcessLookupError:
                pass
        return not alive

    await wait_until(gone, timeout=30, what="the killed workers to exit")

    # One process over the same journal directory would never read worker-1's open attempt.
    single = Group(
        tmp_path,
        provider,
        workers=1,
        name="single",
        workspace=group.workspace,
        principals=group.principals,
    )
    single.process.spawn()
    assert single.process.process is not None
    assert await asyncio.to_thread(single.process.process.wait, 60) == 78
    single.process.terminate()
    refusal = [e for e in single.process.stderr_events() if e.get("event") == "REFUSED_TO_START"]
    assert [e["code"] for e in refusal] == ["WORKER_JOURNAL_UNSETTLED"]
    assert "EXECUTOR_JOURNAL_DIR/worker-1" in refusal[0]["message"]
    assert "EXECUTOR_WORKERS=2" in refusal[0]["message"]

    # The group that left it settles it at start (worker 1 reconciles), then stops cleanly...
    again = Group(
        tmp_path, provider, name="again", workspace=group.workspace, principals=group.principals
    )
    await again.process.start()
    await again.all_ready()
    session = aiohttp.ClientSession()
    try:
        status, body = await again.propose(session, key="left-open")
        assert (status, body["outcome"]) == (200, "COMPLETED")
    finally:
        await session.close()
    assert again.process.terminate() == 0
    assert await received(provider) == 1
    # ... and then one process starts over the same directory.
    after = Group(
        tmp_path, provider, workers=1, name="after", workspace=group.workspace,
        principals=group.principals,
    )  # fmt: skip
    await after.process.start()
    assert after.process.terminate() == 0
    reconciled = [e for e in again.process.stdout_events() if e.get("event") == "RECONCILIATION"]
    assert [(e["worker"], e["resolution"]) for e in reconciled] == [(1, "RECONCILED_COMPLETED")]


@pytest.mark.xdist_group("postgres")
async def test_on_postgresql_the_same_key_through_both_workers_executes_once(
    tmp_path: Path, provider: ProviderProcess, pg_url: str
) -> None:
    group = Group(tmp_path, provider)
    group.env["EXECUTOR_STORE_URL"] = pg_url
    group.env.pop("EXECUTOR_STATE_DIR")  # optional with the shared store
    group.process = ExecutorProcess(group.env, tmp_path, "executor-pg")
    await group.process.start()
    await group.all_ready()
    first, second = await group.pinned(0), await group.pinned(1)
    try:
        replies = await asyncio.gather(
            *(group.propose(s, key="pg-same") for s in (first, second) for _ in range(10))
        )
        executed = [body for status, body in replies if status == 200 and not body["replayed"]]
        assert len(executed) == 1, replies
        assert {status for status, _ in replies} <= {200, 409}
        assert await received(provider) == 1
        roster = await group.roster(second)
        assert [w["state"] for w in roster] == ["running", "running"]
    finally:
        await first.close()
        await second.close()
        assert group.process.terminate() == 0
    assert await received(provider) == 1


async def test_both_workers_answer_on_the_tls_listener(
    tmp_path: Path, provider: ProviderProcess
) -> None:
    ca = TestCA("agentsafe workers test CA")
    server = ca.issue_server()
    group = Group(tmp_path, provider)
    cert_file = group.workspace.root / "listener.crt"
    key_file = group.workspace.secrets_dir / "listener.key"
    write_private(cert_file, server.cert_pem, mode=0o644)
    write_private(key_file, server.key_pem)
    group.env.pop("EXECUTOR_ALLOW_PLAINTEXT_LISTENER")
    group.env.update(
        {"EXECUTOR_TLS_CERT_FILE": str(cert_file), "EXECUTOR_TLS_KEY_FILE": str(key_file)}
    )
    group.process = ExecutorProcess(group.env, tmp_path, "executor-tls")
    group.process.url = f"https://127.0.0.1:{group.process.port}"
    trusting = ssl.create_default_context(cadata=ca.cert_pem.decode())
    group.process.spawn()
    try:
        seen: set[int] = set()

        async def both_seen() -> bool:
            connector = aiohttp.TCPConnector(ssl=trusting, force_close=True)
            async with aiohttp.ClientSession(connector=connector) as session:
                with contextlib.suppress(aiohttp.ClientError, json.JSONDecodeError):
                    status, body = await group.get(session, "/v1/control/status")
                    if status == 200:
                        seen.add(body["worker"])
            assert group.process.running, "the supervisor exited"
            return seen == {0, 1}

        await wait_until(both_seen, timeout=60, what="both workers over TLS")
    finally:
        assert group.process.terminate() == 0


async def test_an_evidence_export_from_one_worker_holds_every_workers_chains(
    tmp_path: Path, provider: ProviderProcess
) -> None:
    group = Group(tmp_path, provider)
    await group.process.start()
    await group.all_ready()
    first, second = await group.pinned(0), await group.pinned(1)
    try:
        for index, session in enumerate((first, second)):
            status, _ = await group.propose(session, key=f"export-{index}")
            assert status == 200
        status, manifest = await group.post(
            second, "/v1/control/evidence-export", {"reason": "drill"}
        )
        assert status == 200, manifest
    finally:
        await first.close()
        await second.close()
        assert group.process.terminate() == 0
    assert manifest["workers"] == {"exported_by": 1, "count": 2, "not_answered": []}
    assert {name: c.get("worker") for name, c in manifest["chains"].items()} == {
        "evidence": 1,
        "security": 1,
        "evidence@worker-0": 0,
        "security@worker-0": 0,
    }
    (bundle,) = [p for p in (group.workspace.root / "evidence").iterdir() if p.is_dir()]
    report = verify_bundle(bundle, public_key=None)
    assert report.ok, report.problems
    # Each worker's DECISION for its own proposal is in the bundle, in that worker's file.
    for index, filename in ((1, "evidence.jsonl"), (0, "evidence.worker-0.jsonl")):
        lines = [json.loads(line) for line in (bundle / filename).read_text().splitlines()]
        assert {line["worker"] for line in lines} == {index}
        assert any(line["event"] == "DECISION" for line in lines)
    # A line removed from the other worker's window is found.
    peer = bundle / "evidence.worker-0.jsonl"
    kept = peer.read_text().splitlines()
    peer.write_text("\n".join(kept[:2] + kept[3:]) + "\n")
    assert not verify_bundle(bundle, public_key=None).ok


async def test_once_a_halt_is_answered_no_worker_of_three_starts_new_work(
    tmp_path: Path, provider: ProviderProcess
) -> None:
    """Issue 30, item 14: the halt's 200 means no worker starts new work. Right after the
    answer, 24 proposals (8 through each of the three workers) are all refused and the
    provider receives none (before: the other workers executed them until their next poll)."""
    group = Group(tmp_path, provider, workers=3)
    await group.process.start()
    await group.all_ready()
    sessions = [await group.pinned(index) for index in range(3)]
    try:
        status, _ = await group.post(sessions[0], "/v1/control/halt", {"reason": "incident 14"})
        assert status == 200
        answers = await asyncio.gather(
            *(
                group.propose(sessions[n % 3], key=f"after-halt-{n}", amount=100 + n)
                for n in range(24)
            )
        )
        assert [a[0] for a in answers] == [503] * 24, answers
        assert all(a[1]["reason_codes"] == ["EXECUTOR_HALTED"] for a in answers)
        assert await received(provider) == 0
    finally:
        for session in sessions:
            await session.close()
        assert group.process.terminate() == 0
