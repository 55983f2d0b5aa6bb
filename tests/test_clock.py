"""clock.py: the wire's timestamps and the UTC day files are named by."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentsafe.executor.clock import format_ms, parse_ms, utc_day


@pytest.mark.parametrize(
    ("epoch", "text", "day"),
    [
        (0.0, "1970-01-01T00:00:00.000Z", "1970-01-01"),
        (1_786_701_600.0, "2026-08-14T10:00:00.000Z", "2026-08-14"),
        (1_786_751_999.9994, "2026-08-14T23:59:59.999Z", "2026-08-14"),
    ],
)
def test_timestamps_and_days_are_utc(epoch: float, text: str, day: str) -> None:
    assert format_ms(epoch) == text
    assert parse_ms(text) == pytest.approx(epoch, abs=0.001)
    assert utc_day(epoch) == day


def _format_ms_by_strftime(epoch_seconds: float) -> str:
    """The formatting format_ms replaced (one strftime per call): the reference it is held to."""
    from datetime import UTC, datetime

    millis = round(epoch_seconds * 1000)
    dt = datetime.fromtimestamp(millis // 1000, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S") + f".{millis % 1000:03d}Z"


@given(st.lists(st.floats(min_value=0, max_value=253_402_300_000.0), min_size=1, max_size=20))
def test_the_remembered_second_writes_what_strftime_writes(instants: list[float]) -> None:
    # neighbours in one second, across a second, a rounding up into the next, then elsewhere
    for epoch in instants:
        for nearby in (epoch, epoch + 0.0004, epoch + 0.0006, epoch + 0.9995, epoch + 1.0):
            assert format_ms(nearby) == _format_ms_by_strftime(nearby)
