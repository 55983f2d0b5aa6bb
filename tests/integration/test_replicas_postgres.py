"""Three real ``agentsafe serve`` replicas on one real PostgreSQL: one execution per key."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import subprocess
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
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
from tests.support.pki import TestCA
from tests.support.postgres import PostgresServer

from .bearer_principals import BearerPrincipals, principals_env

PROPOSER, APPROVER = "treasury-workflow", "treasury-lead"

AGENTSAFE = str(Path(sys.executable).parent / "agentsafe")

# One worker runs every test on the one PostgreSQL server its session starts.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("postgres")]


def _replica_env(
    workspace: Workspace, provider: ProviderProcess, url: str, name: str, **extra: str
) -> dict[str, str]:
    own = workspace.root / name
    for sub in ("journal", "evidence"):
        (own / sub).mkdir(parents=True, exist_ok=True, mode=0o700)
    env = workspace.environment(
        provider_url=provider.url,
        port=free_port(),
        extra={
            "EXECUTOR_STORE_URL": url,
            "EXECUTOR_REPLICA_ID": name,
            "EXECUTOR_JOURNAL_DIR": str(own / "journal"),
            "EXECUTOR_EVIDENCE_DIR": str(own / "evidence"),
            **extra,
        },
    )
    env.pop("EXECUTOR_STATE_DIR")  # optional with the shared store
    return env


async def _start_replicas(
    tmp_path: Path, provider: ProviderProcess, url: str, **extra: str
) -> tuple[Workspace, list[ExecutorProcess]]:
    workspace = Workspace(tmp_path / "ws")
    replicas = [
        ExecutorProcess(_replica_env(workspace, provider, url, f"r{i}", **extra), tmp_path, f"r{i}")
        for i in range(3)
    ]
    await asyncio.gather(*(r.start() for r in replicas))  # three migrate at once
    return workspace, replicas


async def test_300_requests_with_one_key_over_three_replicas_dispatch_once(
    tmp_path: Path, pg_url: str
) -> None:
    provider = ProviderProcess(tmp_path)
    await provider.start()
    _, replicas = await _start_replicas(tmp_path, provider, pg_url)
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            results = await asyncio.gather(
                *(replicas[i % 3].propose(session, amount=1200, key="same-key") for i in range(300))
            )
            statuses = Counter(status for status, _ in results)
            assert int((await provider.received())["count"]) == 1
            assert set(statuses) <= {200, 409}, statuses
            executed = [b for s, b in results if s == 200 and not b.get("replayed")]
            assert len(executed) == 1
            assert executed[0]["outcome"] == "COMPLETED"
            # every replica now answers the one recorded answer
            for replica in replicas:
                status, body = await replica.propose(session, amount=1200, key="same-key")
                assert status == 200
                assert body["replayed"] is True
                assert body["intent_id"] == executed[0]["intent_id"]
            assert int((await provider.received())["count"]) == 1
    finally:
        for replica in replicas:
            replica.terminate()
        provider.terminate()


async def test_the_count_window_is_shared_by_the_replicas(tmp_path: Path, pg_url: str) -> None:
    provider = ProviderProcess(tmp_path)
    await provider.start()
    _, replicas = await _start_replicas(
        tmp_path,
        provider,
        pg_url,
        EXECUTOR_HARD_LIMIT_WINDOW_SECONDS="3600",
        EXECUTOR_HARD_LIMIT_WINDOW_COUNT="4",
    )
    try:
        async with aiohttp.ClientSession() as session:
            results = await asyncio.gather(
                *(replicas[i % 3].propose(session, amount=100, key=f"w-{i}") for i in range(12))
            )
            allowed = [b for s, b in results if s == 200 and b.get("outcome") == "COMPLETED"]
            refused = [b for s, b in results if s == 422]
            assert len(allowed) == 4
            assert len(refused) == 8
            assert int((await provider.received())["count"]) == 4
    finally:
        for replica in replicas:
            replica.terminate()
        provider.terminate()


async def _killed_mid_dispatch(
    provider: ProviderProcess,
    replica: ExecutorProcess,
    session: aiohttp.ClientSession,
    key: str,
    *,
    before_kill: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """``replica`` proposes ``key``; the provider (mode ``hang``) acts on it and holds the
    answer; ``before_kill`` runs, then the replica is SIGKILLed mid-dispatch and the provider
    answers normally again."""
    await provider.set_mode("hang")
    pending = asyncio.ensure_future(replica.propose(session, amount=4000, key=key))

    async def arrived() -> bool:
        return int((await provider.received())["count"]) == 1

    await wait_until(arrived, timeout=30, what="the provider to receive the payout")
    if before_kill is not None:
        await before_kill()
    replica.kill()
    with contextlib.suppress(aiohttp.ClientError):
        await pending
    await provider.set_mode("normal")


async def test_a_replica_killed_mid_dispatch_is_reconciled_by_another_after_its_lease(
    tmp_path: Path, pg_url: str
) -> None:
    provider = ProviderProcess(tmp_path)
    await provider.start()
    _, replicas = await _start_replicas(
        tmp_path,
        provider,
        pg_url,
        EXECUTOR_ATTEMPT_LEASE_SECONDS="5",
        DOWNSTREAM_TIMEOUT_MS="2000",  # the lease must outlive a send (issue 29)
    )
    try:
        async with aiohttp.ClientSession() as session:
            await _killed_mid_dispatch(provider, replicas[0], session, "kill-1")

            async def reconciled() -> bool:
                return any(
                    e.get("event") == "RECONCILIATION"
                    and e.get("resolution") == "RECONCILED_COMPLETED"
                    for r in replicas[1:]
                    for e in r.stdout_events()
                )

            await wait_until(reconciled, timeout=60, what="another replica to reconcile")
            taken = [
                e
                for r in replicas[1:]
                for e in r.stderr_events()
                if e.get("event") == "ATTEMPT_TAKEN_OVER"
            ]
            assert len(taken) == 1

            async def settled() -> bool:
                # The key stays in flight (409) until the reconciled answer is recorded.
                status, _ = await replicas[2].propose(session, amount=4000, key="kill-1")
                return status != 409

            await wait_until(settled, timeout=30, what="the reconciled answer to be recorded")
            for replica in (replicas[1], replicas[2], replicas[1]):
                status, body = await replica.propose(session, amount=4000, key="kill-1")
                assert status == 200
                assert body["replayed"] is True
                assert body["outcome"] == "COMPLETED"
                assert body["reason_codes"] == ["RECONCILED_COMPLETED"]
            assert int((await provider.received())["count"]) == 1
    finally:
        for replica in replicas:
            if replica.running:
                replica.terminate()
        provider.terminate()


async def test_a_taken_over_attempt_still_unknown_is_asked_again_by_its_living_new_owner(
    tmp_path: Path, pg_url: str
) -> None:
    """The provider acted and never answered; its owner is SIGKILLed; while the provider's
    lookups are down the replica that takes the attempt over can only say STILL_UNKNOWN. Once
    lookups return, that same replica -- alive, nobody else dying -- asks again on its own
    schedule and settles the key; nothing is sent twice."""
    provider = ProviderProcess(tmp_path)
    await provider.start()
    workspace, replicas = await _start_replicas(
        tmp_path,
        provider,
        pg_url,
        EXECUTOR_ATTEMPT_LEASE_SECONDS="5",
        DOWNSTREAM_TIMEOUT_MS="2000",  # the lease must outlive a send (issue 29)
    )
    try:
        async with aiohttp.ClientSession() as session:
            await _killed_mid_dispatch(
                provider,
                replicas[0],
                session,
                "ask-1",
                before_kill=lambda: provider.set_lookups(available=False),
            )

            def resolutions(replica: ExecutorProcess) -> list[str]:
                return [
                    str(e.get("resolution"))
                    for e in replica.stdout_events()
                    if e.get("event") == "RECONCILIATION"
                ]

            async def unknown() -> bool:
                return any("STILL_UNKNOWN" in resolutions(r) for r in replicas[1:])

            await wait_until(unknown, timeout=60, what="a replica to take the attempt over")
            (owner,) = [r for r in replicas[1:] if "STILL_UNKNOWN" in resolutions(r)]
            status, body = await owner.propose(session, amount=4000, key="ask-1")
            assert status == 409, body  # in flight: nobody knows yet
            await provider.set_lookups(available=True)

            async def asked_again() -> bool:
                return "RECONCILED_COMPLETED" in resolutions(owner)

            await wait_until(asked_again, timeout=60, what="the new owner to ask again")
            assert owner.running
            taken = [
                e
                for r in replicas[1:]
                for e in r.stderr_events()
                if e.get("event") == "ATTEMPT_TAKEN_OVER"
            ]
            assert len(taken) == 1  # one takeover: the owner never died
            assert all(
                "RECONCILED_COMPLETED" not in resolutions(r) for r in replicas[1:] if r is not owner
            )
            # Nobody restarted: the living owner's evidence says LEASE, never RESTART (issue 31,
            # item 5), in its journal too, and the offline verifier walks its chain.
            causes = {
                e.get("by") for e in owner.stdout_events() if e.get("event") == "RECONCILIATION"
            }
            assert causes == {"LEASE"}, causes
            journaled = {
                record["by"]
                for path in (workspace.root / owner.name / "journal").rglob("*.jsonl")
                for record in map(json.loads, path.read_text().splitlines())
                if record.get("record") == "RECONCILED"
            }
            assert journaled == {"LEASE"}, journaled
            verified = await asyncio.to_thread(
                subprocess.run,
                [AGENTSAFE, "verify", "chain", str(owner.stdout_path)],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert verified.returncode == 0, verified.stdout + verified.stderr

            async def settled() -> bool:
                status, _ = await owner.propose(session, amount=4000, key="ask-1")
                return status != 409

            await wait_until(settled, timeout=30, what="the reconciled answer to be recorded")
            for replica in replicas[1:]:
                status, body = await replica.propose(session, amount=4000, key="ask-1")
                assert status == 200
                assert body["replayed"] is True
                assert body["outcome"] == "COMPLETED"
                assert body["reason_codes"] == ["RECONCILED_COMPLETED"]
            assert int((await provider.received())["count"]) == 1
    finally:
        for replica in replicas:
            if replica.running:
                replica.terminate()
        provider.terminate()


async def test_postgres_stopped_under_load_gives_503s_then_recovers_without_double_execution(
    tmp_path: Path, postgres: PostgresServer, pg_url: str
) -> None:
    provider = ProviderProcess(tmp_path)
    await provider.start()
    _, replicas = await _start_replicas(tmp_path, provider, pg_url)
    try:
        statuses: Counter[int] = Counter()
        sent: list[str] = []
        stop = asyncio.Event()

        async def load(session: aiohttp.ClientSession, worker: int) -> None:
            n = 0
            while not stop.is_set():
                key = f"load-{worker}-{n % 7}"  # keys repeat: retries must never run twice
                n += 1
                sent.append(key)
                try:
                    status, _ = await random.choice(replicas).propose(session, amount=100, key=key)
                except aiohttp.ClientError:
                    continue
                statuses[status] += 1
                await asyncio.sleep(0.01)

        async with aiohttp.ClientSession() as session:
            workers = [asyncio.ensure_future(load(session, w)) for w in range(6)]
            try:
                await _outage(postgres, replicas, session, statuses)
            finally:
                stop.set()
                await asyncio.gather(*workers)
        # zero double executions: the provider saw each idempotency key at most once
        async with (
            aiohttp.ClientSession() as session,
            session.get(provider.url + "/_control/received") as r,
        ):
            received = await r.json()
        keys = received["keys"]
        assert len(keys) == len(set(keys)), "a key reached the provider twice"
        assert set(keys) <= set(sent)
    finally:
        for replica in replicas:
            replica.terminate()
        provider.terminate()


async def _outage(
    postgres: PostgresServer,
    replicas: list[ExecutorProcess],
    session: aiohttp.ClientSession,
    statuses: Counter[int],
) -> None:
    async def flowing() -> bool:
        return statuses[200] >= 10

    await wait_until(flowing, timeout=30, what="load to flow")
    await asyncio.to_thread(postgres.stop)
    try:

        async def refusing() -> bool:
            return statuses[503] >= 5

        await wait_until(refusing, timeout=30, what="503s while the database is down")

        async def none_ready() -> bool:
            answers = [await r.get_json(session, "/ready") for r in replicas]
            return all(status == 503 for status, _ in answers)

        await wait_until(none_ready, timeout=30, what="/ready to be 503 on every replica")
    finally:
        await asyncio.to_thread(postgres.start)
    before = statuses[200]

    async def recovered() -> bool:
        return statuses[200] >= before + 10

    await wait_until(recovered, timeout=60, what="service to resume")

    async def all_ready() -> bool:
        answers = [await r.get_json(session, "/ready") for r in replicas]
        return all(status == 200 for status, _ in answers)

    await wait_until(all_ready, timeout=30, what="/ready to be 200 again")


async def test_an_approval_created_on_one_replica_is_decided_on_a_second_and_resumed_on_a_third(
    tmp_path: Path, pg_url: str
) -> None:
    provider = ProviderProcess(tmp_path)
    await provider.start()
    principals = BearerPrincipals()
    principals_file = principals.write(tmp_path / "principals.json")
    workspace = Workspace(tmp_path / "ws")
    replicas = [
        ExecutorProcess(
            principals_env(
                _replica_env(workspace, provider, pg_url, f"r{i}"),
                principals_file,
                EXECUTOR_ESCALATION="APPROVAL",
            ),
            tmp_path,
            f"r{i}",
        )
        for i in range(3)
    ]
    await asyncio.gather(*(r.start() for r in replicas))
    try:
        async with aiohttp.ClientSession() as session:

            async def call(
                proc: ExecutorProcess, method: str, path: str, who: str, body: object = None
            ) -> tuple[int, Any]:
                headers = {"authorization": f"Bearer {principals.token(who)}"}
                async with session.request(
                    method, proc.url + path, json=body, headers=headers
                ) as r:
                    return r.status, await r.json()

            proposal = {
                "proposal": {
                    "action": "create_payout",
                    "target": "payout:shared",
                    "parameters": {"amountMinor": 20000, "currency": "EUR"},
                },
                "idempotency_key": "approve-across",
            }
            status, held = await call(replicas[0], "POST", "/v1/actions", PROPOSER, proposal)
            assert status == 200
            assert held["outcome"] == "ESCALATE_PENDING"
            escalation = held["escalation"]
            _, listing = await call(replicas[1], "GET", "/v1/approvals?state=PENDING", APPROVER)
            assert [x["request_id"] for x in listing["approvals"]] == [escalation["request_id"]]
            status, decided = await call(
                replicas[1],
                "POST",
                f"/v1/approvals/{escalation['request_id']}",
                APPROVER,
                {"decision": "APPROVE", "reason": "approved on the second replica"},
            )
            assert status == 200
            assert decided["state"] == "APPROVED"
            status, again = await call(
                replicas[0],
                "POST",
                f"/v1/approvals/{escalation['request_id']}",
                APPROVER,
                {"decision": "DENY", "reason": "too late, and on another replica"},
            )
            assert status == 409
            assert again["error"]["code"] == "APPROVAL_ALREADY_DECIDED"
            assert int((await provider.received())["count"]) == 0
            body = {"escalation": escalation}
            status, done = await call(replicas[2], "POST", "/v1/escalations", PROPOSER, body)
            assert status == 200
            assert done["outcome"] == "COMPLETED"
            assert "APPROVED_BY_APPROVER" in done["reason_codes"]
            for replica in replicas:
                _, replay = await call(replica, "POST", "/v1/escalations", PROPOSER, body)
                assert replay["replayed"] is True
            assert int((await provider.received())["count"]) == 1
    finally:
        for replica in replicas:
            replica.terminate()
        provider.terminate()


async def test_serve_refuses_to_start_on_a_schema_newer_than_it_knows(
    tmp_path: Path, postgres: PostgresServer, pg_url: str
) -> None:
    provider = ProviderProcess(tmp_path)
    await provider.start()
    workspace = Workspace(tmp_path / "ws")
    try:
        first = ExecutorProcess(_replica_env(workspace, provider, pg_url, "r0"), tmp_path, "r0")
        await first.start()  # migrates
        assert first.terminate() == 0
        database = pg_url.rsplit("/", 1)[1]
        postgres.psql(database, "UPDATE agentsafe_schema SET version = version + 1")
        newer = ExecutorProcess(_replica_env(workspace, provider, pg_url, "r1"), tmp_path, "r1")
        newer.spawn()

        async def exited() -> bool:
            return not newer.running

        await wait_until(exited, timeout=60, what="the executor to refuse")
        assert newer.terminate() == 78
        assert "STORE_SCHEMA_UNSUPPORTED" in newer.stderr_path.read_text()
    finally:
        provider.terminate()


async def test_a_tls_replica_without_a_state_dir_starts_under_the_guard(
    tmp_path: Path, pg_url: str
) -> None:
    """The listener's key is staged in a directory the audit hook allows (the journal's)."""
    provider = ProviderProcess(tmp_path)
    await provider.start()
    workspace = Workspace(tmp_path / "ws")
    server = TestCA("agentsafe replica test CA").issue_server()
    cert_file = workspace.root / "listener.crt"
    cert_file.write_bytes(server.cert_pem)
    key_file = workspace.secrets_dir / "listener.key"
    key_file.write_bytes(server.key_pem)
    key_file.chmod(0o600)
    env = _replica_env(workspace, provider, pg_url, "tls-0")
    env.pop("EXECUTOR_ALLOW_PLAINTEXT_LISTENER")
    env.update({"EXECUTOR_TLS_CERT_FILE": str(cert_file), "EXECUTOR_TLS_KEY_FILE": str(key_file)})
    replica = ExecutorProcess(env, tmp_path, "tls-0")
    replica.spawn()
    try:

        async def listening() -> bool:
            if not replica.running:
                raise AssertionError(replica.stderr_path.read_text()[-2000:])
            return any(e.get("event") == "LISTENING" for e in replica.stderr_events())

        await wait_until(listening, timeout=60, what="the TLS replica to listen")
        [event] = [e for e in replica.stderr_events() if e.get("event") == "LISTENING"]
        assert event["tls"] is True
    finally:
        assert replica.terminate() == 0
        provider.terminate()
