"""A separate process racing on a shared use store (tests/test_usestore.py).

Usage: ``python usestore_race.py STATE_DIR MODE COUNT ARG...``. The process opens the store, prints
``READY``, then blocks reading one line from standard input so the parent can release every
racer at once; it then runs COUNT concurrent operations and prints their results as one JSON list.

Modes: ``claim GRANT_ID`` (booleans), ``begin KEY`` (idempotency kinds),
``decide REQUEST_ID APPROVER`` (``"OK"`` or the refusal code).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from agentsafe.executor.clock import SystemClock
from agentsafe.executor.errors import StoreError
from agentsafe.executor.usestore import SQLiteUseStore

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

        results = await asyncio.gather(*(one(i) for i in range(int(count))))
        print(json.dumps(results), flush=True)
    finally:
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
