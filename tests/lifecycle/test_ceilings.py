"""Host ceilings: single limits per currency, the sliding window, and racing commits."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentsafe.executor.clock import ManualClock
from agentsafe.executor.errors import RequestRejected
from agentsafe.executor.lifecycle.ceilings import (
    HostCeilings,
    Payment,
    read_payment,
)
from agentsafe.executor.routes.refusals import status_of


def refusal(fn: Any, *args: Any) -> str:
    with pytest.raises(RequestRejected) as err:
        fn(*args)
    return _checked(err.value)


async def arefusal(fn: Any, *args: Any) -> str:
    with pytest.raises(RequestRejected) as err:
        await fn(*args)
    return _checked(err.value)


def _checked(exc: RequestRejected) -> str:
    assert status_of(exc.code) == 422
    assert "999" not in exc.message  # the amount is never echoed
    return exc.code


@pytest.mark.parametrize(
    "params",
    [
        {"amountMinor": 5},
        {"currency": "USD"},
        {"amountMinor": True, "currency": "USD"},
        {"amountMinor": -1, "currency": "USD"},
        {"amountMinor": 5.0, "currency": "USD"},
        {"amountMinor": "5", "currency": "USD"},
        {"amountMinor": 5, "currency": "usd"},
        {"amountMinor": 5, "currency": "US"},
        {"amountMinor": 5, "currency": "USD\n"},
        {"amountMinor": 5, "currency": None},
    ],
)
async def test_half_or_malformed_amounts_are_refused_not_guessed(params: dict[str, Any]) -> None:
    assert refusal(read_payment, params) == "HARD_LIMIT_AMOUNT_INVALID"
    # even when only the count window is configured, and the amount matters to none of it
    ceilings = HostCeilings(window_seconds=60, window_count=5, clock=ManualClock())
    assert await arefusal(ceilings.check, params) == "HARD_LIMIT_AMOUNT_INVALID"
    assert await arefusal(ceilings.commit, params) == "HARD_LIMIT_AMOUNT_INVALID"
    assert (await ceilings.window_usage()) == (0, 0)


async def test_a_host_without_ceilings_refuses_nothing() -> None:
    ceilings = HostCeilings(clock=ManualClock())
    await ceilings.check({"currency": "usd"})
    reservation = await ceilings.commit({"amountMinor": True})
    await reservation.release()


def test_read_payment() -> None:
    assert read_payment({"to": "x"}) is None
    assert read_payment({"amountMinor": 0, "currency": "JPY"}) == Payment(0, "JPY")


async def test_single_limit_per_currency() -> None:
    ceilings = HostCeilings(single={"USD": 10_000, "EUR": 5_000}, clock=ManualClock())
    await ceilings.check({"amountMinor": 10_000, "currency": "USD"})
    assert await arefusal(ceilings.check, {"amountMinor": 10_001, "currency": "USD"}) == (
        "HARD_LIMIT_EXCEEDED"
    )
    assert await arefusal(ceilings.check, {"amountMinor": 5_001, "currency": "EUR"}) == (
        "HARD_LIMIT_EXCEEDED"
    )
    assert await arefusal(ceilings.commit, {"amountMinor": 1, "currency": "GBP"}) == (
        "HARD_LIMIT_CURRENCY_UNKNOWN"
    )
    await ceilings.check({"note": "not a payment"})


async def test_without_single_limits_any_currency_passes_the_single_check() -> None:
    ceilings = HostCeilings(window_seconds=60, window_count=5, clock=ManualClock())
    await ceilings.commit({"amountMinor": 10**12, "currency": "GBP"})


async def test_check_reserves_nothing_and_commit_fills_the_count_window() -> None:
    clock = ManualClock()
    ceilings = HostCeilings(window_seconds=60, window_count=2, clock=clock)
    for _ in range(5):
        await ceilings.check({"to": "x"})
    await ceilings.commit({"to": "x"})
    await ceilings.commit({"amountMinor": 1, "currency": "USD"})
    assert (await ceilings.window_usage()) == (2, 1)
    assert await arefusal(ceilings.check, {"to": "x"}) == "HARD_LIMIT_WINDOW_COUNT_EXCEEDED"
    assert await arefusal(ceilings.commit, {"to": "x"}) == "HARD_LIMIT_WINDOW_COUNT_EXCEEDED"
    clock.advance(59.9)
    assert await arefusal(ceilings.commit, {"to": "x"}) == "HARD_LIMIT_WINDOW_COUNT_EXCEEDED"
    clock.advance(0.2)
    await ceilings.commit({"to": "x"})
    assert (await ceilings.window_usage()) == (1, 0)


async def test_window_sum_is_one_total_across_currencies() -> None:
    clock = ManualClock()
    ceilings = HostCeilings(window_seconds=60, window_sum_minor=1_000, clock=clock)
    await ceilings.commit({"amountMinor": 600, "currency": "USD"})
    assert await arefusal(ceilings.commit, {"amountMinor": 401, "currency": "JPY"}) == (
        "HARD_LIMIT_WINDOW_SUM_EXCEEDED"
    )
    await ceilings.commit({"amountMinor": 400, "currency": "JPY"})
    await ceilings.commit({"to": "not a payment"})  # a non-payment is bounded by the count alone
    assert (await ceilings.window_usage()) == (3, 1_000)


async def test_release_gives_the_place_back_once() -> None:
    clock = ManualClock()
    ceilings = HostCeilings(window_seconds=60, window_count=1, window_sum_minor=100, clock=clock)
    reservation = await ceilings.commit({"amountMinor": 100, "currency": "USD"})
    assert await arefusal(ceilings.commit, {"to": "x"}) == "HARD_LIMIT_WINDOW_COUNT_EXCEEDED"
    await reservation.release()
    await reservation.release()
    assert reservation.released
    assert (await ceilings.window_usage()) == (0, 0)
    second = await ceilings.commit({"amountMinor": 100, "currency": "USD"})
    clock.advance(61)
    third = await ceilings.commit({"amountMinor": 100, "currency": "USD"})
    await second.release()  # already expired out of the window: releasing it frees nothing else
    assert (await ceilings.window_usage()) == (1, 100)
    assert not third.released


def test_configuration_is_validated() -> None:
    clock = ManualClock()
    with pytest.raises(ValueError):
        HostCeilings(window_count=3, clock=clock)
    with pytest.raises(ValueError):
        HostCeilings(window_seconds=0, window_count=3, clock=clock)
    with pytest.raises(ValueError):
        HostCeilings(single={"USD": -1}, clock=clock)
    assert not HostCeilings(clock=clock).configured
    assert HostCeilings(single={"USD": 1}, clock=clock).configured


async def test_one_hundred_tasks_racing_never_cross_the_count_window() -> None:
    ceilings = HostCeilings(
        window_seconds=60, window_count=10, window_sum_minor=10**9, clock=ManualClock()
    )

    async def attempt(i: int) -> str:
        try:
            await ceilings.check({"amountMinor": i, "currency": "USD"})
            await ceilings.commit({"amountMinor": i, "currency": "USD"})
        except RequestRejected as exc:
            return exc.code
        return "OK"

    results = await asyncio.gather(*(attempt(i) for i in range(100)))
    assert results.count("OK") == 10
    assert set(results) == {"OK", "HARD_LIMIT_WINDOW_COUNT_EXCEEDED"}
    assert (await ceilings.window_usage())[0] == 10


async def test_one_hundred_concurrent_requests_that_all_passed_check_cannot_all_commit() -> None:
    ceilings = HostCeilings(window_seconds=60, window_sum_minor=1_000, clock=ManualClock())
    gate = asyncio.Event()

    async def request() -> str:
        await ceilings.check({"amountMinor": 100, "currency": "EUR"})  # every one passes the check
        await gate.wait()  # ...then all wait on the authority together
        try:
            await ceilings.commit({"amountMinor": 100, "currency": "EUR"})
        except RequestRejected as exc:
            return exc.code
        return "OK"

    tasks = [asyncio.create_task(request()) for _ in range(100)]
    await asyncio.sleep(0)
    gate.set()
    results = await asyncio.gather(*tasks)
    assert results.count("OK") == 10
    assert (await ceilings.window_usage()) == (10, 1_000)


async def test_a_currency_iso_4217_does_not_list_is_refused_even_by_a_window_alone() -> None:
    ceilings = HostCeilings(window_seconds=60, window_count=10, clock=ManualClock())
    code = await arefusal(ceilings.check, {"amountMinor": 100, "currency": "ABC"})
    assert code == "HARD_LIMIT_CURRENCY_UNKNOWN"
    await ceilings.check({"amountMinor": 100, "currency": "JPY"})
