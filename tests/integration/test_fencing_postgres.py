"""Issue 29's reproduction with real processes: a replica paused between opening its attempt and
claiming its grant never sends once its lease lapsed and another replica ran the key.

Three real ``agentsafe serve`` replicas on one real PostgreSQL, a 5 s lease. Replica A is
stopped at a point the test can observe, with no hook in the product: the test holds a SHARE
lock on ``attempts``, so A's statement that opens its attempt (an ``INSERT INTO attempts``)
waits on it in the database; ``pg_stat_activity`` shows it waiting; A is SIGSTOPped; the lock
is let go, so the database runs A's statement (the attempt is open, A's lease starts) while A
itself stays stopped before it reads the answer, i.e. after its attempt opened and before it
claims. The lease lapses, another replica takes the attempt over (UNCLAIMED), the caller
retries the key on replica B, B runs it; A is SIGCONTed. Before the fence A then claimed its
own grant and sent a second POST; now its claim is fenced out: one POST, and A's answer is the
refusal ATTEMPT_FENCED, never "not executed".
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pytest

from agentsafe.executor.tools.harness import ExecutorProcess, ProviderProcess, wait_until

from .test_replicas_postgres import _start_replicas

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("postgres")]

LEASE = {"EXECUTOR_ATTEMPT_LEASE_SECONDS": "5", "DOWNSTREAM_TIMEOUT_MS": "2000"}


def _pid(replica: ExecutorProcess) -> int:
    assert replica.process is not None
    return replica.process.pid


async def _opening_waits_on_the_lock(conn: psycopg.AsyncConnection[Any]) -> bool:
    cur = await conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        " AND query LIKE '%INSERT INTO attempts%'"
    )
    row = await cur.fetchone()
    return row is not None and int(row[0]) == 1


async def test_a_replica_paused_before_its_claim_never_sends_after_another_ran_the_key(
    tmp_path: Path, pg_url: str
) -> None:
    provider = ProviderProcess(tmp_path)
    await provider.start()
    _, replicas = await _start_replicas(tmp_path, provider, pg_url, **LEASE)
    a, b = replicas[0], replicas[1]
    stopped = False
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session,
            await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as watcher,
            await psycopg.AsyncConnection.connect(pg_url) as locker,
        ):
            await locker.execute("LOCK TABLE attempts IN SHARE MODE")
            pending = asyncio.ensure_future(a.propose(session, amount=4200, key="K"))

            async def waiting() -> bool:
                if pending.done():
                    raise AssertionError(f"A answered before it opened: {pending.result()}")
                return await _opening_waits_on_the_lock(watcher)

            await wait_until(waiting, timeout=60, what="A's attempt to wait on the lock")
            os.kill(_pid(a), signal.SIGSTOP)
            stopped = True
            await locker.rollback()  # A's statement runs in the database; A stays stopped

            async def opened() -> bool:
                cur = await watcher.execute(
                    "SELECT count(*) FROM attempts WHERE owner = 'r0' AND state = 'OPEN'"
                )
                row = await cur.fetchone()
                return row is not None and int(row[0]) == 1

            await wait_until(opened, timeout=30, what="A's attempt to open in the database")

            def unclaimed() -> bool:
                return any(
                    e.get("event") == "RECONCILIATION" and e.get("resolution") == "UNCLAIMED"
                    for r in replicas[1:]
                    for e in r.stdout_events()
                )

            async def taken_over() -> bool:
                return unclaimed()

            await wait_until(taken_over, timeout=60, what="another replica to take A's attempt")
            ran: dict[str, Any] = {}

            async def b_ran() -> bool:
                status, body = await b.propose(session, amount=4200, key="K")
                if status == 409:  # the key is still settling
                    return False
                ran.update(status=status, body=body)
                return True

            await wait_until(b_ran, timeout=60, what="B to run the retried key")
            assert ran["status"] == 200, ran
            assert ran["body"]["outcome"] == "COMPLETED", ran
            assert int((await provider.received())["count"]) == 1

            os.kill(_pid(a), signal.SIGCONT)
            stopped = False
            status, answer = await asyncio.wait_for(pending, timeout=120)
            # One POST for K; A's answer is a refusal, never "not executed" for a key that ran.
            assert int((await provider.received())["count"]) == 1, (status, answer)
            assert status == 409, answer
            assert answer["error"]["code"] == "ATTEMPT_FENCED"
            fenced = [e for e in a.stdout_events() if e.get("event") == "ATTEMPT_FENCED"]
            assert len(fenced) == 1
            # The key's one answer is B's run, on every replica (A included).
            for replica in replicas:
                status, body = await replica.propose(session, amount=4200, key="K")
                assert status == 200, body
                assert body["replayed"] is True
                assert body["outcome"] == "COMPLETED"
                assert body["intent_id"] == ran["body"]["intent_id"]
            assert int((await provider.received())["count"]) == 1
    finally:
        if stopped:
            os.kill(_pid(a), signal.SIGCONT)
        for replica in replicas:
            if replica.running:
                replica.terminate()
        provider.terminate()


async def test_a_send_in_flight_when_the_lease_lapses_is_reconciled_never_sent_again(
    tmp_path: Path, pg_url: str
) -> None:
    """A is stopped while its POST is at the provider (which acted and holds its answer); its
    lease lapses, another replica takes the attempt and asks the provider (COMPLETED); a retry
    replays that; A resumes: still one POST, and A's own answer never says "not executed"."""
    provider = ProviderProcess(tmp_path)
    await provider.start()
    _, replicas = await _start_replicas(tmp_path, provider, pg_url, **LEASE)
    a, b = replicas[0], replicas[1]
    stopped = False
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
            await provider.set_mode("hang")
            pending = asyncio.ensure_future(a.propose(session, amount=4300, key="F"))

            async def arrived() -> bool:
                return int((await provider.received())["count"]) == 1

            await wait_until(arrived, timeout=30, what="the provider to receive A's POST")
            os.kill(_pid(a), signal.SIGSTOP)
            stopped = True
            await provider.set_mode("normal")

            async def reconciled() -> bool:
                return any(
                    e.get("event") == "RECONCILIATION"
                    and e.get("resolution") == "RECONCILED_COMPLETED"
                    for r in replicas[1:]
                    for e in r.stdout_events()
                )

            await wait_until(reconciled, timeout=60, what="another replica to reconcile")

            async def settled() -> bool:
                status, _ = await b.propose(session, amount=4300, key="F")
                return status != 409

            await wait_until(settled, timeout=30, what="the reconciled answer to be recorded")
            status, body = await b.propose(session, amount=4300, key="F")
            assert status == 200, body
            assert (body["replayed"], body["outcome"]) == (True, "COMPLETED")
            os.kill(_pid(a), signal.SIGCONT)
            stopped = False
            status, answer = await asyncio.wait_for(pending, timeout=120)
            assert status == 200, answer
            assert answer["outcome"] in ("COMPLETED", "UNKNOWN_AFTER_DISPATCH"), answer
            assert answer["executed"] is not False
            assert int((await provider.received())["count"]) == 1
    finally:
        if stopped:
            os.kill(_pid(a), signal.SIGCONT)
        for replica in replicas:
            if replica.running:
                replica.terminate()
        provider.terminate()
