"""Counting windows on a hand-moved clock: rates, lockouts, spikes, bounded memory."""

from __future__ import annotations

import pytest

from agentsafe.executor.clock import ManualClock
from agentsafe.executor.windows import (
    DoorWindows,
    KeyedWindow,
    Lockout,
    LockoutRule,
    RateRule,
    SpikeDetector,
    ceiling_verdict,
)


@pytest.mark.parametrize("text", ["", "20", "20/", "/60", "a/b", "20/60/1", "0/60", "5/0", "-1/5"])
def test_malformed_rate_rules_are_refused(text: str) -> None:
    with pytest.raises(ValueError) as info:
        RateRule.parse(text)
    assert text not in str(info.value) or text == ""


def test_rate_rules_parse() -> None:
    assert RateRule.parse("120/60") == RateRule(120, 60)
    assert LockoutRule.parse("10/60/300") == LockoutRule(10, 60, 300)
    assert not LockoutRule.parse("0/60/300").enabled
    assert not LockoutRule.parse("0").enabled
    with pytest.raises(ValueError):
        LockoutRule.parse("10/60")


def test_sliding_window_admits_count_then_refuses_until_the_oldest_leaves() -> None:
    clock = ManualClock()
    window = KeyedWindow(RateRule(3, 60), clock=clock)
    assert [window.admit("k") for _ in range(4)] == [True, True, True, False]
    assert window.retry_after("k") == 60
    clock.advance(30)
    assert not window.admit("k")
    assert window.admit("other")
    clock.advance(30)  # the first three are now exactly 60 s old: out of the window
    assert window.admit("k")
    assert window.count("k") == 1


def test_window_forgets_the_least_recent_key_beyond_its_cap() -> None:
    clock = ManualClock()
    window = KeyedWindow(RateRule(1, 60), clock=clock, max_keys=3)
    for key in ("a", "b", "c", "d"):
        window.hit(key)
    assert len(window) == 3
    assert not window.full("a")  # forgotten
    assert window.full("d")


def test_lockout_places_one_lock_and_it_ends_only_by_expiry() -> None:
    clock = ManualClock()
    lockout = Lockout(LockoutRule(3, 60, 300), clock=clock)
    assert [lockout.record_failure("p") for _ in range(3)] == [False, False, True]
    assert lockout.locked("p")
    assert not lockout.record_failure("p")  # already locked: no second lock
    clock.advance(299)
    assert lockout.locked("p")
    assert lockout.locked_keys() == ("p",)
    clock.advance(1)
    assert not lockout.locked("p")


def test_lockout_failures_outside_the_window_do_not_add_up() -> None:
    clock = ManualClock()
    lockout = Lockout(LockoutRule(3, 60, 300), clock=clock)
    lockout.record_failure("p")
    lockout.record_failure("p")
    clock.advance(61)
    assert not lockout.record_failure("p")
    assert not lockout.locked("p")


def test_disabled_lockout_never_locks() -> None:
    clock = ManualClock()
    lockout = Lockout(LockoutRule.parse("0/60/300"), clock=clock)
    assert not any(lockout.record_failure("p") for _ in range(100))
    assert not lockout.locked("p")


def test_spike_detector_fires_once_until_reset() -> None:
    clock = ManualClock()
    spike = SpikeDetector(RateRule(3, 10), clock=clock)
    assert [spike.hit() for _ in range(5)] == [False, False, True, False, False]
    spike.reset()
    assert [spike.hit() for _ in range(3)] == [False, False, True]


def test_spike_detector_needs_the_events_inside_the_window() -> None:
    clock = ManualClock()
    spike = SpikeDetector(RateRule(3, 10), clock=clock)
    for _ in range(5):
        assert not spike.hit()
        clock.advance(6)


def test_door_windows_from_configuration_and_per_principal_rules() -> None:
    clock = ManualClock()
    windows = DoorWindows.from_config(
        clock=clock, rate_limit_unauthenticated="2/60", auth_lockout="0/1/1"
    )
    assert windows.unauthenticated.rule == RateRule(2, 60)
    assert not windows.lockout.rule.enabled
    first = windows.principal_window("p", RateRule(1, 60))
    assert windows.principal_window("p", RateRule(1, 60)) is first
    assert windows.principal_window("p", RateRule(2, 60)) is not first
    with pytest.raises(ValueError):
        DoorWindows.from_config(clock=clock, rate_limit_unauthenticated="lots")


# -- the host ceilings' one window rule (memory, SQLite and PostgreSQL all apply it) -------------


@pytest.mark.parametrize(
    ("count", "total", "amount", "count_limit", "sum_limit", "verdict"),
    [
        (0, 0, 100, None, None, None),  # no bound at all
        (2, 0, 1, 3, None, None),  # the third of three fits
        (3, 0, 1, 3, None, "COUNT"),  # a fourth does not
        (0, 900, 100, None, 1000, None),  # exactly reaching the sum fits
        (0, 900, 101, None, 1000, "SUM"),  # passing it by one minor unit does not
        (3, 1000, 1, 3, 1000, "COUNT"),  # both full: the count is named first
        (1, 1000, 1, 3, 1000, "SUM"),
        (0, 0, 1, 0, None, "COUNT"),  # a count limit of zero admits nothing
        (0, 0, 0, None, 0, None),  # a zero amount never passes a sum
    ],
)
def test_the_ceiling_verdict_names_the_bound_one_more_action_would_pass(
    count: int,
    total: int,
    amount: int,
    count_limit: int | None,
    sum_limit: int | None,
    verdict: str | None,
) -> None:
    assert (
        ceiling_verdict(
            count, total, amount_minor=amount, count_limit=count_limit, sum_limit=sum_limit
        )
        == verdict
    )
