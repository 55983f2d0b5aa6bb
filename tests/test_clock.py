"""clock.py: the wire's timestamps and the UTC day files are named by."""

from __future__ import annotations

import pytest

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
