"""The host ceilings' window that ``EXECUTOR_WORKERS`` workers share in one SQLite store: two
stores over one state directory (two connections, as two workers hold) never let more through
than the limits in total, and a released place is free again for either."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agentsafe.executor.clock import ManualClock
from agentsafe.executor.codes import Code
from agentsafe.executor.errors import RequestRejected
from agentsafe.executor.lifecycle.ceilings import HostCeilings
from agentsafe.executor.state.usestore import SQLiteUseStore, SQLiteWindow


async def test_two_stores_share_one_window_count_and_sum(tmp_path: Path) -> None:
    clock = ManualClock(1_772_445_600.0)
    first = await SQLiteUseStore.open(tmp_path, clock=clock)
    second = await SQLiteUseStore.open(tmp_path, clock=clock)
    try:
        windows = [SQLiteWindow(first), SQLiteWindow(second)]
        results = await asyncio.gather(
            *(
                windows[i % 2].reserve(
                    window_seconds=60, amount_minor=100, count_limit=5, sum_limit=None
                )
                for i in range(12)
            )
        )
        taken = [token for full, token in results if full is None]
        assert len(taken) == 5
        assert {full for full, _ in results if full is not None} == {"COUNT"}
        assert await windows[1].usage(60) == (5, 500)
        await windows[1].release(taken[0])  # taken by either; released through the other
        assert await windows[0].usage(60) == (4, 400)
        full, _ = await windows[0].reserve(
            window_seconds=60, amount_minor=1000, count_limit=None, sum_limit=1200
        )
        assert full == "SUM"
        clock.advance(61)
        assert await windows[0].usage(60) == (0, 0)
    finally:
        await first.close()
        await second.close()


async def test_host_ceilings_over_the_shared_window_hold_in_total(tmp_path: Path) -> None:
    clock = ManualClock(1_772_445_600.0)
    stores = [await SQLiteUseStore.open(tmp_path, clock=clock) for _ in range(2)]
    try:
        ceilings = [
            HostCeilings(window_seconds=60, window_count=3, clock=clock, window=SQLiteWindow(store))
            for store in stores
        ]
        payment = {"amountMinor": 100, "currency": "USD"}
        outcomes = await asyncio.gather(
            *(ceilings[i % 2].commit(payment) for i in range(6)), return_exceptions=True
        )
        refused = [o for o in outcomes if isinstance(o, RequestRejected)]
        assert len(refused) == 3
        assert {o.code for o in refused} == {Code.HARD_LIMIT_WINDOW_COUNT_EXCEEDED}
        assert await ceilings[1].window_usage() == (3, 300)
    finally:
        for store in stores:
            await store.close()
