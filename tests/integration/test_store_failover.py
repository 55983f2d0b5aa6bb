"""Real ``agentsafe serve`` replicas across a real PostgreSQL failover (primary + streaming
standby, ``tests/support/pgpair.py``): a synchronous failover is served through without a
restart; an asynchronous one that lost an acknowledged claim halts the replica that made it
(STORE_LOST_WRITES) and the key is never sent again, on any replica."""

from __future__ import annotations

from collections.abc import Iterator
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
from tests.support.pgpair import PostgresPair, running_pair

from .bearer_principals import OPERATOR_ID, BearerPrincipals, principals_env

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("postgres")]

FAILOVER_BOUND_SECONDS = 30.0
"""How long a replica may answer 503 STORE_UNAVAILABLE after the standby was promoted."""


@pytest.fixture
def sync_pair() -> Iterator[PostgresPair]:
    yield from running_pair(synchronous=True)


@pytest.fixture
def async_pair() -> Iterator[PostgresPair]:
    yield from running_pair(synchronous=False)


def _replica(
    tmp_path: Path,
    workspace: Workspace,
    provider: ProviderProcess,
    principals: BearerPrincipals,
    url: str,
    name: str,
) -> ExecutorProcess:
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
        },
    )
    env.pop("EXECUTOR_STATE_DIR")
    env = principals_env(env, principals.write(tmp_path / "principals.json"))
    process = ExecutorProcess(env, tmp_path, name)
    process.token = principals.token("treasury-workflow")
    return process


async def _status(
    replica: ExecutorProcess, session: aiohttp.ClientSession, principals: BearerPrincipals
) -> dict[str, Any]:
    headers = {"authorization": f"Bearer {principals.token(OPERATOR_ID)}"}
    async with session.get(replica.url + "/v1/control/status", headers=headers) as r:
        assert r.status == 200
        body: dict[str, Any] = await r.json()
        return body


@pytest.mark.parametrize("form", ["keyvalue", "uri"])
async def test_a_replica_serves_on_through_a_synchronous_failover_without_a_restart(
    tmp_path: Path, sync_pair: PostgresPair, form: str
) -> None:
    database = sync_pair.create_database()
    provider = ProviderProcess(tmp_path)
    await provider.start()
    principals = BearerPrincipals()
    workspace = Workspace(tmp_path / "ws")
    replica = _replica(
        tmp_path, workspace, provider, principals, sync_pair.url(database, form=form), "r0"
    )
    await replica.start()
    pid = replica.process.pid if replica.process else None
    try:
        async with aiohttp.ClientSession() as session:
            status, body = await replica.propose(session, amount=1200, key="before")
            assert (status, body["outcome"]) == (200, "COMPLETED")
            sync_pair.fail_over()
            seen: set[int] = set()
            keys = iter(range(10_000))

            async def served() -> bool:
                key = f"after-{next(keys)}"
                status, body = await replica.propose(session, amount=1200, key=key)
                seen.add(status)
                return status == 200 and body.get("outcome") == "COMPLETED"

            await wait_until(served, timeout=FAILOVER_BOUND_SECONDS, what="the new primary")
            assert seen <= {200, 503}, seen
            assert replica.running
            assert replica.process is not None
            assert replica.process.pid == pid  # the same process: no restart
            # nothing acknowledged was lost: the key before the failover replays. A 503 is the
            # boundary saying "not now" while its store health check catches up (a loaded
            # machine can miss one ping's deadline just after the failover); it is asked again.
            replay: list[tuple[int, dict[str, Any]]] = []

            async def replayed() -> bool:
                replay.append(await replica.propose(session, amount=1200, key="before"))
                return replay[-1][0] != 503

            await wait_until(replayed, timeout=FAILOVER_BOUND_SECONDS, what="the replay")
            status, body = replay[-1]
            assert (status, body.get("replayed")) == (200, True)
            state = await _status(replica, session, principals)
            assert state["halt"]["halted"] is False
            assert state["store_lost_writes"] == []
            assert int((await provider.received())["count"]) == 2
    finally:
        replica.terminate()
        provider.terminate()


async def test_an_asynchronous_failover_that_lost_a_claim_halts_and_never_sends_it_again(
    tmp_path: Path, async_pair: PostgresPair
) -> None:
    database = async_pair.create_database()
    provider = ProviderProcess(tmp_path)
    await provider.start()
    principals = BearerPrincipals()
    workspace = Workspace(tmp_path / "ws")
    url = async_pair.url(database, form="uri")
    owner = _replica(tmp_path, workspace, provider, principals, url, "r0")
    other = _replica(tmp_path, workspace, provider, principals, url, "r1")
    await owner.start()
    await other.start()
    try:
        async with aiohttp.ClientSession() as session:
            async_pair.wait_caught_up()  # the schema and both replicas' start are on the standby
            async_pair.detach_standby()  # what follows is acknowledged by the primary alone
            status, body = await owner.propose(session, amount=4000, key="lost-1")
            assert (status, body["outcome"]) == (200, "COMPLETED")
            assert int((await provider.received())["count"]) == 1
            async_pair.fail_over()  # the promoted standby never had lost-1

            async def halted() -> bool:
                try:
                    state = await _status(owner, session, principals)
                except (aiohttp.ClientError, AssertionError):
                    return False
                causes = {c["cause"] for c in state["halt"]["causes"]}
                return "STORE_LOST_WRITES" in causes

            await wait_until(halted, timeout=FAILOVER_BOUND_SECONDS, what="STORE_LOST_WRITES")
            state = await _status(owner, session, principals)
            (lost,) = state["store_lost_writes"]
            assert lost["idempotency_key"] == "lost-1"
            assert lost["rerun_elsewhere"] is False
            assert state["readiness"]["store_lost_writes"] == 1
            events = [
                e
                for e in owner.stdout_events() + owner.stderr_events()
                if e.get("event") == "STORE_LOST_WRITES"
            ]
            assert events
            assert events[0]["code"] == "STORE_LOST_WRITES"

            # the retry, on the halted replica and on the other one, is never sent
            status, body = await owner.propose(session, amount=4000, key="lost-1")
            assert status == 503, body
            retried: set[int] = set()

            async def other_answers() -> bool:
                status, _ = await other.propose(session, amount=4000, key="lost-1")
                retried.add(status)
                return status != 503

            await wait_until(other_answers, timeout=FAILOVER_BOUND_SECONDS, what="r1 to answer")
            assert retried <= {409, 503, 200}, retried
            # a lease keeper takes the reasserted attempt and asks the provider (read-only):
            # the key settles COMPLETED, and every retry replays that answer
            answers: list[dict[str, Any]] = []

            async def settled() -> bool:
                status, body = await other.propose(session, amount=4000, key="lost-1")
                assert status in (200, 409), body
                answers.append(body)
                return status == 200

            await wait_until(settled, timeout=60, what="the lost key to be reconciled")
            assert answers[-1]["replayed"] is True
            assert answers[-1]["outcome"] == "COMPLETED"
            assert int((await provider.received())["count"]) == 1
            # only an OPERATOR lifts the halt: anonymous, or as the proposer, it is refused
            reason = {"reason": "incident 42: lost-1 reconciled with the provider"}
            async with session.post(owner.url + "/v1/control/resume", json=reason) as r:
                assert r.status == 401
            proposer = {"authorization": f"Bearer {owner.token}"}
            async with session.post(
                owner.url + "/v1/control/resume", json=reason, headers=proposer
            ) as r:
                assert r.status == 403
            assert (await _status(owner, session, principals))["halt"]["halted"] is True
            operator = {"authorization": f"Bearer {principals.token(OPERATOR_ID)}"}
            async with session.post(
                owner.url + "/v1/control/resume", json=reason, headers=operator
            ) as r:
                assert r.status == 200
            state = await _status(owner, session, principals)
            assert state["halt"]["halted"] is False
            assert state["store_lost_writes"] == []
            status, body = await owner.propose(session, amount=4000, key="lost-1")
            assert (status, body.get("replayed")) == (200, True)
            assert int((await provider.received())["count"]) == 1
    finally:
        owner.terminate()
        other.terminate()
        provider.terminate()


async def test_a_replica_down_during_the_failover_finds_its_lost_claim_at_start(
    tmp_path: Path, async_pair: PostgresPair
) -> None:
    database = async_pair.create_database()
    provider = ProviderProcess(tmp_path)
    await provider.start()
    principals = BearerPrincipals()
    workspace = Workspace(tmp_path / "ws")
    url = async_pair.url(database)
    owner = _replica(tmp_path, workspace, provider, principals, url, "r0")
    other = _replica(tmp_path, workspace, provider, principals, url, "r1")
    await owner.start()
    await other.start()
    restarted: ExecutorProcess | None = None
    try:
        async with aiohttp.ClientSession() as session:
            async_pair.wait_caught_up()
            async_pair.detach_standby()
            status, body = await owner.propose(session, amount=4000, key="lost-2")
            assert (status, body["outcome"]) == (200, "COMPLETED")
            assert owner.terminate() == 0  # down through the failover
            async_pair.fail_over()
            restarted = ExecutorProcess(owner.env, tmp_path, "r0-again")
            restarted.token = owner.token
            await restarted.start(expect_ready=False)  # halted from its first connection
            state = await _status(restarted, session, principals)
            assert [c["cause"] for c in state["halt"]["causes"]] == ["STORE_LOST_WRITES"]
            (lost,) = state["store_lost_writes"]
            assert lost["idempotency_key"] == "lost-2"
            status, _ = await restarted.propose(session, amount=4000, key="lost-2")
            assert status == 503

            async def settled() -> bool:
                status, body = await other.propose(session, amount=4000, key="lost-2")
                assert status in (200, 409, 503), body
                return status == 200 and body.get("replayed") is True

            await wait_until(settled, timeout=60, what="the lost key to be reconciled")
            assert int((await provider.received())["count"]) == 1
    finally:
        if restarted is not None:
            restarted.terminate()
        other.terminate()
        provider.terminate()
