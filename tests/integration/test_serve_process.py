"""A real ``agentsafe serve`` running: the audit hook, signals, secret rotation, TLS (issue 9).

Every test here starts the executor as a subprocess (``python -m agentsafe.executor.cli serve``)
through :mod:`agentsafe.executor.tools.harness`, so the PEP 578 audit hook is really installed first
and everything after it (the listener, the guarded egress client, the journal, the TLS key
loading, the secret watcher) runs under it:

- the hook is installed and effective in a DEVELOPMENT-posture serve, and proposals still run
  through the guarded client to a real provider;
- SIGTERM during a slow dispatch lets the in-flight request finish COMPLETED and journaled, stops
  accepting, exits 0 with clean chain heads (the next start resumes without a gap);
- SIGHUP, and the directory watcher without any signal, pick up a rotated caller-token file;
- a TLS listener serves TLS 1.3 with the key read from a secret file, and refuses plaintext.

The slow provider is the test's own aiohttp server: it receives the POST and answers only when
the test releases it. Every wait polls with a deadline; every process is stopped in ``finally``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from agentsafe.executor.clock import parse_ms
from agentsafe.executor.evidence import chainverify
from agentsafe.executor.host.audithook import GUARD_CHECKS
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

# What a healthy serve says on its security stream, and nothing else.
EXPECTED_SECURITY = frozenset(
    {
        "POSTURE_WAIVED",
        "BEARER_PRINCIPAL_CONFIGURED",
        "LEGACY_PRINCIPAL_MODE",
        "LISTENING",
        "OPERATOR_ACTION",
        "CHAIN_RESUMED",
        "STOPPING",
    }
)


def proposal(key: str, amount: int = 100) -> dict[str, Any]:
    return {
        "proposal": {
            "action": "create_payout",
            "target": "payout:beneficiary-1",
            "parameters": {"amountMinor": amount, "currency": "USD"},
        },
        "idempotency_key": key,
    }


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


async def post_proposal(
    session: aiohttp.ClientSession, url: str, token: str, key: str
) -> tuple[int, dict[str, Any]]:
    async with session.post(url + "/v1/actions", json=proposal(key), headers=bearer(token)) as r:
        return r.status, await r.json()


def journal_records(workspace: Workspace) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for path in sorted((workspace.root / "journal" / "attempts").glob("*.jsonl")):
        records += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return records


def non_json_lines(path: Path) -> list[str]:
    """Lines on a stream that are not JSON: tracebacks, warnings, stray prints."""
    out = []
    for line in path.read_text().splitlines():
        try:
            json.loads(line)
        except ValueError:
            out.append(line)
    return out


async def wait_exit(process: ExecutorProcess, timeout: float = 60.0) -> int:
    """Poll the process until it exits (the event loop keeps serving the test's provider)."""
    popen = process.process
    assert popen is not None

    async def exited() -> bool:
        return popen.poll() is not None

    await wait_until(exited, timeout=timeout, interval=0.05, what=f"{process.name} to exit")
    status = process.terminate()  # already exited: closes the log files, returns the status
    assert status is not None
    return status


async def wait_for_event(
    process: ExecutorProcess, event: str, *, timeout: float, where: str = "stderr"
) -> list[dict[str, Any]]:
    def read() -> list[dict[str, Any]]:
        source = process.stderr_events if where == "stderr" else process.stdout_events
        return [e for e in source() if e.get("event") == event]

    async def seen() -> list[dict[str, Any]]:
        assert process.running, f"{process.name} exited; see {process.stderr_path}"
        return read()

    found: list[dict[str, Any]] = await wait_until(seen, timeout=timeout, what=event)
    return found


# ----------------------------------------------------------------------------- a slow provider


class GatedProvider:
    """A loopback provider that takes a payout and answers only when the test opens the gate."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.arrived: list[str] = []
        self.executed: set[str] = set()
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/", self._root)
        app.router.add_post("/payouts", self._create)
        app.router.add_get("/payouts/{key}", self._lookup)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def stop(self) -> None:
        self.gate.set()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _root(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def _create(self, request: web.Request) -> web.Response:
        key = request.headers.get("Idempotency-Key", "")
        await request.read()
        self.arrived.append(key)
        await self.gate.wait()
        self.executed.add(key)
        return web.json_response({"reference": f"gated_{uuid.uuid4().hex[:8]}"}, status=202)

    async def _lookup(self, request: web.Request) -> web.Response:
        if request.match_info["key"] in self.executed:
            return web.json_response({"reference": "gated", "status": "executed"})
        return web.json_response({"code": "NOT_FOUND"}, status=404)


@pytest.fixture
async def gated() -> AsyncIterator[GatedProvider]:
    provider = GatedProvider()
    await provider.start()
    try:
        yield provider
    finally:
        await provider.stop()


@pytest.fixture
async def synthetic(tmp_path: Path) -> AsyncIterator[ProviderProcess]:
    provider = ProviderProcess(tmp_path)
    await provider.start()
    try:
        yield provider
    finally:
        provider.terminate()


# ----------------------------------------------------------------------------- the audit hook


async def test_a_running_serve_has_the_guard_installed_and_still_executes(
    tmp_path: Path, synthetic: ProviderProcess
) -> None:
    principals = BearerPrincipals()
    workspace = Workspace(tmp_path / "ws")
    env = principals_env(
        workspace.environment(provider_url=synthetic.url, port=free_port()),
        principals.write(tmp_path / "principals.json"),
    )
    assert env["EXECUTOR_POSTURE"] == "DEVELOPMENT"
    executor = ExecutorProcess(env, tmp_path)
    proposer = principals.token("treasury-workflow")
    try:
        await executor.start()
        async with aiohttp.ClientSession() as session:
            for key in ("hook-1", "hook-2"):
                status, body = await post_proposal(session, executor.url, proposer, key)
                assert status == 200, body
                assert (body["outcome"], body["executed"]) == ("COMPLETED", True)
                assert body["result"]["provider_reference"].startswith("syn_")
            received = await synthetic.received()
            async with session.get(
                executor.url + "/v1/control/status", headers=bearer(principals.token(OPERATOR_ID))
            ) as r:
                assert r.status == 200
                posture = (await r.json())["posture"]
    finally:
        status = executor.terminate()
    assert status == 0
    # The provider saw both payouts: the guarded client's connects are let through the hook.
    assert received["keys"] == ["hook-1", "hook-2"]
    # The proof that the hook is installed in this process: its self-test at start observed
    # each forbidden operation refused (DEVELOPMENT would have waived them, not passed them).
    assert posture["mode"] == "DEVELOPMENT"
    assert posture["held"] is True
    for check in GUARD_CHECKS:
        assert posture["checks"][check] == {
            "status": "OK",
            "detail": "the process guard refused the probe",
        }
    # Nothing unexpected on either stream: no tracebacks, no egress refusals, no guard noise.
    assert non_json_lines(executor.stderr_path) == []
    assert non_json_lines(executor.stdout_path) == []
    security = executor.stderr_events()
    assert {e["event"] for e in security} <= EXPECTED_SECURITY, security
    waived = {e["check"] for e in security if e["event"] == "POSTURE_WAIVED"}
    assert not waived & set(GUARD_CHECKS)
    evidence = [e["event"] for e in executor.stdout_events()]
    assert evidence == ["PROPOSAL_RECEIVED", "DECISION", "GRANT_CLAIMED", "DISPATCH", "OUTCOME"] * 2
    for path in (executor.stdout_path, executor.stderr_path):
        report = chainverify.verify_chain_file(path, require_genesis=True)
        assert report.ok, report
        assert report.findings == ()
        text = path.read_text()
        for secret in (*principals.tokens.values(), workspace.downstream_credential):
            assert secret not in text


# ----------------------------------------------------------------------------- SIGTERM


async def test_sigterm_during_a_slow_dispatch_finishes_it_journals_it_and_exits_clean(
    tmp_path: Path, gated: GatedProvider
) -> None:
    workspace = Workspace(tmp_path / "ws")
    env = workspace.environment(provider_url=gated.url, port=free_port())
    first = ExecutorProcess(env, tmp_path, "first")
    second = ExecutorProcess(env, tmp_path, "second")
    token = workspace.caller_token
    try:
        await first.start()
        async with aiohttp.ClientSession() as session:
            in_flight = asyncio.ensure_future(post_proposal(session, first.url, token, "in-flight"))

            async def arrived() -> bool:
                assert not in_flight.done(), "the proposal was answered before it was released"
                return gated.arrived == ["in-flight"]

            await wait_until(arrived, timeout=30, what="the provider to receive the payout")
            assert first.process is not None
            first.process.send_signal(signal.SIGTERM)
            await wait_for_event(first, "STOPPING", timeout=30)

            # It stops accepting: a new connection is refused while the request is in flight.
            async def refusing() -> bool:
                try:
                    async with aiohttp.ClientSession() as probe, probe.get(first.url + "/health"):
                        return False
                except aiohttp.ClientConnectionError:
                    return True

            await wait_until(refusing, timeout=30, what="the listener to stop accepting")
            assert first.running, "it waits for the request in flight"
            assert not in_flight.done()

            gated.gate.set()
            status, body = await asyncio.wait_for(in_flight, timeout=30)
        assert status == 200, body
        assert (body["outcome"], body["executed"]) == ("COMPLETED", True)
        assert body["finalization"] == "RECORDED"
        assert await wait_exit(first) == 0

        records = journal_records(workspace)
        opened = [r for r in records if r["record"] == "ATTEMPT_OPENED"]
        closed = [r for r in records if r["record"] == "ATTEMPT_CLOSED"]
        assert len(opened) == 1
        assert [(r["outcome"], r["executed"]) for r in closed] == [("COMPLETED", True)]
        assert closed[0]["attempt_id"] == opened[0]["attempt_id"]
        outcomes = [e for e in first.stdout_events() if e["event"] == "OUTCOME"]
        assert [e["outcome"] for e in outcomes] == ["COMPLETED"]
        head = json.loads((workspace.root / "journal" / "chain" / "evidence.head.json").read_text())
        assert head["clean"] is True
        assert head["seq"] == first.stdout_events()[-1]["seq"]
        assert non_json_lines(first.stderr_path) == []

        # A restart resumes both chains seamlessly and has nothing to reconcile.
        await second.start()
        resumed = second.stdout_events()
        assert resumed, "the resumption is written at start"
        assert resumed[0]["event"] == "CHAIN_RESUMED"
        assert resumed[0]["gap"] is False
        assert resumed[0]["resumed_from"] == {"seq": head["seq"], "hash": head["hash"]}
        assert [e["event"] for e in second.stderr_events() if e["event"] == "RECONCILED"] == []
        async with aiohttp.ClientSession() as session:
            again_status, again = await post_proposal(session, second.url, token, "in-flight")
        assert again_status == 200
        assert again["replayed"] is True
        assert gated.arrived == ["in-flight"], "nothing was sent twice"
    finally:
        for process in (first, second):
            if process.process is not None:
                process.terminate()
    assert second.process is not None
    assert second.process.returncode == 0
    report = chainverify.verify_chain_file(first.stdout_path, require_genesis=True)
    assert report.ok
    assert report.findings == ()
    combined = first.stdout_path.read_text() + second.stdout_path.read_text()
    assert chainverify.verify_chain(combined.splitlines(), require_genesis=True).findings == ()


# ----------------------------------------------------------------------------- secret rotation


class RotatingToken:
    """A legacy executor whose caller token is a secret file, rotated by write-then-rename."""

    def __init__(self, root: Path, provider_url: str) -> None:
        self.workspace = Workspace(root / "ws")
        self.path = self.workspace.secrets_dir / "caller-token"
        self.old = self.workspace.caller_token
        self.new = "rotated-" + os.urandom(24).hex()
        write_private(self.path, (self.old + "\n").encode())
        env = self.workspace.environment(provider_url=provider_url, port=free_port())
        env.pop("EXECUTOR_CALLER_TOKEN")
        env["EXECUTOR_CALLER_TOKEN_FILE"] = str(self.path)
        self.process = ExecutorProcess(env, root)

    def rotate(self) -> None:
        write_private(self.path, (self.new + "\n").encode())
        assert self.path.stat().st_mode & 0o777 == 0o600

    def assert_no_value(self) -> None:
        for path in (self.process.stdout_path, self.process.stderr_path):
            text = path.read_text()
            assert self.old not in text
            assert self.new not in text

    async def answer(self, session: aiohttp.ClientSession, token: str, key: str) -> int:
        status, _ = await post_proposal(session, self.process.url, token, key)
        return status


def assert_rotated_lines(lines: list[dict[str, Any]]) -> None:
    assert lines
    for line in lines:
        assert line["secret"] == "EXECUTOR_CALLER_TOKEN"
        assert set(line) == {"schema", "event", "at", "level", "seq", "hash", "prev_hash",
                             "secret", "version"}  # fmt: skip


async def rotate_and_wait(
    rotating: RotatingToken, trigger: Callable[[], None], *, timeout: float
) -> list[dict[str, Any]]:
    rotating.rotate()
    trigger()
    return await wait_for_event(rotating.process, "SECRET_ROTATED", timeout=timeout)


async def test_sighup_rereads_a_rotated_caller_token_file_and_names_only_the_secret(
    tmp_path: Path, synthetic: ProviderProcess
) -> None:
    rotating = RotatingToken(tmp_path, synthetic.url)
    process = rotating.process
    try:
        await process.start()
        async with aiohttp.ClientSession() as session:
            assert await rotating.answer(session, rotating.old, "before") == 200

        def sighup() -> None:
            assert process.process is not None
            process.process.send_signal(signal.SIGHUP)

        lines = await rotate_and_wait(rotating, sighup, timeout=30)
        assert_rotated_lines(lines)
        assert lines[0]["version"] == 2
        assert process.running, "SIGHUP reloads; it does not stop the process"
    finally:
        status = process.terminate()
    assert status == 0
    rotating.assert_no_value()
    assert non_json_lines(process.stderr_path) == []


async def test_after_sighup_the_new_caller_token_is_admitted_and_the_old_refused(
    tmp_path: Path, synthetic: ProviderProcess
) -> None:
    rotating = RotatingToken(tmp_path, synthetic.url)
    process = rotating.process
    try:
        await process.start()
        async with aiohttp.ClientSession() as session:
            assert await rotating.answer(session, rotating.old, "before") == 200
            assert await rotating.answer(session, rotating.new, "too-early") == 401

            def sighup() -> None:
                assert process.process is not None
                process.process.send_signal(signal.SIGHUP)

            await rotate_and_wait(rotating, sighup, timeout=30)
            # From the next request: the new value is admitted, the old one refused.
            assert await rotating.answer(session, rotating.new, "after") == 200
            assert await rotating.answer(session, rotating.old, "stale") == 401
    finally:
        process.terminate()
    rotating.assert_no_value()


async def test_the_secrets_watcher_picks_up_a_rotated_file_without_a_signal(
    tmp_path: Path, synthetic: ProviderProcess
) -> None:
    rotating = RotatingToken(tmp_path, synthetic.url)
    process = rotating.process
    try:
        await process.start()
        started = time.monotonic()
        lines = await rotate_and_wait(rotating, lambda: None, timeout=60)
        assert_rotated_lines(lines)
        assert time.monotonic() - started < 60
    finally:
        status = process.terminate()
    assert status == 0
    rotating.assert_no_value()


async def test_after_the_watcher_rotates_the_caller_token_the_new_one_is_admitted(
    tmp_path: Path, synthetic: ProviderProcess
) -> None:
    rotating = RotatingToken(tmp_path, synthetic.url)
    process = rotating.process
    try:
        await process.start()
        await rotate_and_wait(rotating, lambda: None, timeout=60)
        async with aiohttp.ClientSession() as session:
            assert await rotating.answer(session, rotating.new, "after") == 200
            assert await rotating.answer(session, rotating.old, "stale") == 401
    finally:
        process.terminate()


# ----------------------------------------------------------------------------- TLS


async def test_a_tls_serve_answers_tls_13_with_its_key_from_a_secret_file(
    tmp_path: Path,
) -> None:
    ca = TestCA("agentsafe serve test CA")
    server = ca.issue_server()
    workspace = Workspace(tmp_path / "ws")
    cert_file = workspace.root / "listener.crt"
    key_file = workspace.secrets_dir / "listener.key"
    write_private(cert_file, server.cert_pem, mode=0o644)
    write_private(key_file, server.key_pem)
    env = workspace.environment(provider_url="http://127.0.0.1:9", port=free_port())
    env.pop("EXECUTOR_ALLOW_PLAINTEXT_LISTENER")
    env.update({"EXECUTOR_TLS_CERT_FILE": str(cert_file), "EXECUTOR_TLS_KEY_FILE": str(key_file)})
    executor = ExecutorProcess(env, tmp_path)
    https = f"https://127.0.0.1:{executor.port}"
    trusting = ssl.create_default_context(cadata=ca.cert_pem.decode())
    trusting.minimum_version = ssl.TLSVersion.TLSv1_3
    try:
        executor.spawn()
        async with aiohttp.ClientSession() as session:

            async def healthy() -> bool:
                assert executor.running, f"serve exited; see {executor.stderr_path}"
                try:
                    async with session.get(https + "/health", ssl=trusting) as r:
                        return r.status == 200
                except aiohttp.ClientConnectionError:
                    return False

            await wait_until(healthy, timeout=60, what="the TLS listener")
            async with session.get(https + "/ready", ssl=trusting) as r:
                assert r.status == 200

            # The protocol negotiated, seen on a raw connection.
            reader, writer = await asyncio.open_connection("127.0.0.1", executor.port, ssl=trusting)
            try:
                ssl_object = writer.get_extra_info("ssl_object")
                assert ssl_object.version() == "TLSv1.3"
                writer.write(
                    b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
                )
                await writer.drain()
                head = await asyncio.wait_for(reader.readline(), timeout=30)
                assert head.startswith(b"HTTP/1.1 200")
            finally:
                writer.close()
                await writer.wait_closed()

            # Plaintext gets no HTTP answer at all.
            with pytest.raises(aiohttp.ClientError):
                async with session.get(f"http://127.0.0.1:{executor.port}/health") as r:
                    await r.read()
            # A client that does not trust the test CA is refused by its own verification.
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                async with session.get(https + "/health", ssl=ssl.create_default_context()):
                    pass
            # TLS 1.2 is below the default minimum (1.3).
            legacy = ssl.create_default_context(cadata=ca.cert_pem.decode())
            legacy.maximum_version = ssl.TLSVersion.TLSv1_2
            with pytest.raises(aiohttp.ClientError):
                async with session.get(https + "/health", ssl=legacy):
                    pass
            assert executor.running
    finally:
        status = executor.terminate()
    assert status == 0
    listening = [e for e in executor.stderr_events() if e["event"] == "LISTENING"]
    assert [(e["tls"], e["port"]) for e in listening] == [(True, executor.port)]
    assert non_json_lines(executor.stderr_path) == []
    key_text = server.key_pem.decode()
    for path in (executor.stdout_path, executor.stderr_path):
        assert key_text not in path.read_text()


async def test_sigterm_while_the_provider_never_answers_ends_within_the_drain_bound(
    tmp_path: Path, gated: GatedProvider
) -> None:
    """The egress timeout (DOWNSTREAM_TIMEOUT_MS, at most 15 s) is below the drain bound
    (plane.DRAIN_SECONDS, 20 s): a provider that never answers ends the work as
    UNKNOWN_AFTER_DISPATCH, the process exits 0 with the attempt left open, and the next start,
    once the grant's expiry plus the dispatch deadline has passed, reconciles it by asking the
    provider (a short intent TTL bounds the grant's life)."""
    workspace = Workspace(tmp_path / "ws")
    env = workspace.environment(
        provider_url=gated.url,
        port=free_port(),
        extra={"DOWNSTREAM_TIMEOUT_MS": "1500", "EXECUTOR_INTENT_TTL_SECONDS": "5"},
    )
    first = ExecutorProcess(env, tmp_path, "first")
    second = ExecutorProcess(env, tmp_path, "second")
    token = workspace.caller_token
    try:
        await first.start()
        async with aiohttp.ClientSession() as session:
            stuck = asyncio.ensure_future(post_proposal(session, first.url, token, "stuck"))

            async def arrived() -> bool:
                return gated.arrived == ["stuck"]

            await wait_until(arrived, timeout=30, what="the provider to receive the payout")
            assert first.process is not None
            first.process.send_signal(signal.SIGTERM)
            status, body = await asyncio.wait_for(stuck, timeout=30)
        assert status == 200, body
        assert (body["outcome"], body["executed"]) == ("UNKNOWN_AFTER_DISPATCH", None)
        assert await wait_exit(first) == 0
        refused = [e for e in first.stderr_events() if e["event"] == "EGRESS_REFUSED"]
        assert [e["code"] for e in refused] == ["EGRESS_TIMEOUT"]
        # Not closed: an unknown outcome stays open for reconciliation.
        assert [r["record"] for r in journal_records(workspace)] == [
            "ATTEMPT_OPENED",
            "GRANT_CLAIMED",
        ]

        # The provider never executed it. Before the grant's expiry plus the dispatch deadline
        # its "not found" could lag its commit; after it, the next start asks and settles.
        (claimed,) = [r for r in journal_records(workspace) if r["record"] == "GRANT_CLAIMED"]
        settled_at = parse_ms(claimed["grant_expires_at"]) + 1.5

        async def window_passed() -> bool:
            return time.time() >= settled_at

        await wait_until(window_passed, timeout=30, what="the grant's expiry plus the deadline")
        await second.start()
        reconciled = [r for r in journal_records(workspace) if r["record"] == "RECONCILED"]
        assert [(r["by"], r["status"]) for r in reconciled] == [("RESTART", "NOT_EXECUTED")]
        async with aiohttp.ClientSession() as session:
            again_status, again = await post_proposal(session, second.url, token, "stuck")
            async with session.get(second.url + "/ready") as r:
                ready = await r.json()
        assert again_status == 200
        # The key's "unknown" answer was settled by the restart's reconciliation.
        assert (again["outcome"], again["replayed"]) == ("DEFINITELY_NOT_EXECUTED", True)
        assert again["reason_codes"] == ["RECONCILED_NOT_EXECUTED"]
        assert ready == {"ready": True, "code": "READY"}
        assert gated.arrived == ["stuck"], "reconciliation looks up; it never sends again"
    finally:
        for process in (first, second):
            if process.process is not None:
                process.terminate()
