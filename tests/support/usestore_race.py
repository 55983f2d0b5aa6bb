"""A separate process racing on a shared use store (tests/state/test_usestore.py).

Usage: ``python usestore_race.py STATE_DIR MODE COUNT ARG...``. The process opens the store, prints
``READY``, then blocks reading one line from standard input so the parent can release every
racer at once; it then runs COUNT concurrent operations and prints their results as one JSON list.

Modes: ``claim GRANT_ID`` (booleans), ``begin KEY`` (idempotency kinds),
``decide REQUEST_ID APPROVER`` (``"OK"`` or the refusal code), and ``claim-grouped GRANT_ID``:
the COUNT claims are held back until all are queued, so they form one group commit in this
process; the process exits with status 3 unless exactly one commit carried them.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import threading
import time
from pathlib import Path

from agentsafe.executor.clock import SystemClock
from agentsafe.executor.errors import StoreError
from agentsafe.executor.state.usestore import SQLiteUseStore

NOW = 1_800_000_000.0


async def main(argv: list[str]) -> None:
    state_dir, mode, count, *args = argv
    store = await SQLiteUseStore.open(Path(state_dir), clock=SystemClock())
    try:
        print("READY", flush=True)
        sys.stdin.readline()

        async def one(index: int) -> object:
            if mode == "claim":
                return await store.claim_grant(
                    args[0], binding_digest="sha256:" + "0" * 64, expires_at=NOW + 60, now=NOW
                )
            if mode == "begin":
                state = await store.idempotency_begin(
                    tenant="t", principal="p", key=args[0], payload_digest="sha256:aa", now=NOW
                )
                return state.kind.value
            if mode == "decide":
                try:
                    await store.approval_decide(
                        args[0],
                        decision="APPROVE" if index % 2 == 0 else "DENY",
                        approver=args[1],
                        reason="race",
                        now=NOW,
                    )
                except StoreError as exc:
                    return exc.code
                return "OK"
            raise SystemExit(f"unknown mode {mode}")

        if mode == "claim-grouped":
            results = await _one_group(store, args[0], int(count))
        else:
            results = await asyncio.gather(*(one(i) for i in range(int(count))))
        print(json.dumps(results), flush=True)
    finally:
        await store.close()


async def _one_group(store: SQLiteUseStore, grant_id: str, count: int) -> list[bool]:
    commits = 0
    inner = store._commit

    def counting_commit(conn: sqlite3.Connection) -> None:
        nonlocal commits
        inner(conn)
        commits += 1

    store._commit = counting_commit
    entered, release = threading.Event(), threading.Event()

    def hold(_conn: sqlite3.Connection) -> None:
        entered.set()
        release.wait(timeout=60)

    holder = asyncio.ensure_future(store._run(hold))
    await asyncio.to_thread(entered.wait, 60)
    claims = [
        asyncio.ensure_future(
            store.claim_grant(
                grant_id, binding_digest="sha256:" + "0" * 64, expires_at=NOW + 60, now=NOW
            )
        )
        for _ in range(count)
    ]
    deadline = time.monotonic() + 60
    while len(store._pending) < count:
        if time.monotonic() > deadline:
            raise SystemExit(4)
        await asyncio.sleep(0)
    release.set()
    await holder
    results = list(await asyncio.gather(*claims))
    if commits != 1:
        raise SystemExit(3)
    return results


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
