"""clock.py: the wire's timestamps and the UTC day files are named by."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

import pytest
from hypothesis import given, settings
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
    """``format_ms`` as it was before issue 34 (a ``datetime`` and a ``strftime`` per call):
    the oracle the remembered second is held to."""
    from datetime import UTC, datetime

    millis = round(epoch_seconds * 1000)
    dt = datetime.fromtimestamp(millis // 1000, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S") + f".{millis % 1000:03d}Z"


def _outcome(function: Callable[[float], str], epoch: float) -> tuple[str, str]:
    """What ``function`` does with ``epoch``: its text, or its exception's type and message."""
    try:
        return ("text", function(epoch))
    except Exception as exc:  # the exception is the outcome compared
        return (type(exc).__name__, str(exc))


# Every float: negative, huge (past year 9999, past what ``fromtimestamp`` takes), NaN and the
# infinities; and the instants a timestamp is near in practice, to the microsecond.
_ANY_FLOAT = st.floats(allow_nan=True, allow_infinity=True)
_NEAR_NOW = st.floats(min_value=1_700_000_000.0, max_value=1_900_000_000.0)
_WHOLE_RANGE = st.floats(min_value=-62_135_596_800.0, max_value=253_402_300_800.0)


@settings(max_examples=300)
@given(st.lists(st.one_of(_ANY_FLOAT, _NEAR_NOW, _WHOLE_RANGE), min_size=1, max_size=20))
def test_the_remembered_second_writes_what_strftime_writes(instants: list[float]) -> None:
    # each instant, then its neighbours: the same second, a rounding at .5 ms either way, the
    # last millisecond of the second, a rounding up into the next second, the next second,
    # back to the first (the remembered second replaced, then needed again)
    for epoch in instants:
        for nearby in (
            epoch,
            epoch + 0.0004,
            epoch + 0.0005,
            epoch - 0.0005,
            epoch + 0.9994,
            epoch + 0.9995,
            epoch + 1.0,
            epoch,
            -epoch,
        ):
            assert _outcome(format_ms, nearby) == _outcome(_format_ms_by_strftime, nearby)


@pytest.mark.parametrize(
    "epoch",
    [
        0.0,
        -0.0,
        -0.0004,
        -0.0005,
        -0.0006,
        -1.0,
        -1.0005,
        0.0005,  # round() of 0.5 ms: half to even, as before
        0.0015,
        1_786_751_999.9995,  # rounds into the next second, the next day
        1_786_751_999.9994,
        951_782_400.0,  # 2000-02-29
        -62_135_596_800.0,  # 0001-01-01, the first second datetime has (strftime's %Y unpadded)
        -62_135_596_800.0005,  # before it: fromtimestamp refuses
        253_402_300_799.999,  # 9999-12-31T23:59:59.999Z
        253_402_300_799.9995,  # rounds into year 10000: fromtimestamp refuses
        1e300,
        -1e300,
        float("inf"),
        float("-inf"),
        float("nan"),
        2.0**53,
    ],
)
def test_the_edges_write_or_raise_what_strftime_did(epoch: float) -> None:
    for _ in range(2):  # the second formatted, then remembered
        assert _outcome(format_ms, epoch) == _outcome(_format_ms_by_strftime, epoch)


def test_a_request_alternating_between_seconds_formats_each_second_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a request's timestamps alternate between "now" and the later seconds of its intent's and
    # its grant's expiry: each second is formatted once, then kept (one remembered second
    # formatted again on 9 of an ALLOW's 13 calls)
    from agentsafe.executor import clock

    formatted: list[float] = []
    real = clock.datetime

    class Counting:
        @staticmethod
        def fromtimestamp(seconds: float, tz: object) -> object:
            formatted.append(seconds)
            return real.fromtimestamp(seconds, tz=tz)  # type: ignore[arg-type]

    monkeypatch.setattr(clock, "datetime", Counting)
    monkeypatch.setattr(clock, "_seconds", {})
    now = 1_786_701_600.25
    for step in range(40):
        for epoch in (now + step * 0.001, now + 300.5, now + 60.5):
            assert format_ms(epoch) == _format_ms_by_strftime(epoch)
    assert sorted(formatted) == [1_786_701_600, 1_786_701_660, 1_786_701_900]


def test_the_kept_seconds_stay_bounded() -> None:
    from agentsafe.executor import clock

    for n in range(10 * clock._SECONDS_KEPT):
        epoch = 1_786_701_600.0 + n
        assert format_ms(epoch) == _format_ms_by_strftime(epoch)
        assert len(clock._seconds) <= clock._SECONDS_KEPT


def test_threads_formatting_other_seconds_at_once_each_write_their_own() -> None:
    # a second and its text are kept together: a thread never pairs another thread's second
    # with its own milliseconds
    starts = [1_786_701_600.0 + 7 * n for n in range(8)]
    wrong: list[tuple[float, str]] = []

    def work(start: float) -> None:
        for step in range(3000):
            epoch = start + (step % 5) * 1.25 + 0.001 * step
            text = format_ms(epoch)
            if text != _format_ms_by_strftime(epoch):
                wrong.append((epoch, text))

    threads = [threading.Thread(target=work, args=(start,)) for start in starts]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter will
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert wrong == []


def _parse_ms_by_strptime(text: str) -> float:
    """``parse_ms`` as it was before issue 34 (a ``strptime`` per call): the oracle the kept
    seconds are held to."""
    from datetime import UTC, datetime

    if len(text) != 24 or text[-1] != "Z" or text[19] != ".":
        raise ValueError("not a millisecond UTC timestamp")
    dt = datetime.strptime(text[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    return dt.timestamp() + int(text[20:23]) / 1000


def _parsed(function: Callable[[str], float], text: str) -> tuple[str, object]:
    try:
        return ("value", function(text))
    except Exception as exc:  # the exception is the outcome compared
        return (type(exc).__name__, str(exc))


# Texts format_ms writes, and texts that look like them but are not: one character replaced
# (a digit out of range, a space, a non-ASCII digit, a sign), a field shortened and the text
# padded back to 24, any 24 characters.
_STAMP_CHARS = st.sampled_from("0123456789-:TZ. +\u0661x")


@st.composite
def _near_stamps(draw: st.DrawFn) -> str:
    text = format_ms(draw(st.one_of(_NEAR_NOW, st.floats(-62_135_596_800.0, 253_402_300_799.0))))
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(text) - 1))
        text = text[:at] + draw(_STAMP_CHARS) + text[at + 1 :]
    return text


@settings(max_examples=500)
@given(
    st.lists(
        st.one_of(_near_stamps(), st.text(_STAMP_CHARS, min_size=24, max_size=24), st.text()),
        min_size=1,
        max_size=10,
    )
)
def test_the_kept_seconds_parse_what_strptime_parsed(texts: list[str]) -> None:
    for text in [*texts, *texts]:  # each parsed, then parsed again from the kept second
        assert _parsed(parse_ms, text) == _parsed(_parse_ms_by_strptime, text)


@pytest.mark.parametrize(
    "text",
    [
        "2026-08-14T10:00:00.000Z",
        "2000-02-29T23:59:59.999Z",
        "2001-02-29T00:00:00.000Z",  # no such day: strptime refuses
        "2026-13-01T00:00:00.000Z",
        "2026-08-14T24:00:00.000Z",
        "2026-08-14T10:00:61.000Z",  # strptime reads %S up to 61
        "2026-08-14T10:00:60.000Z",
        "2026-8-14T10:00:00.0000Z",  # %m reads one digit, the fraction is then "00Z"[:3]
        "0001-01-01T00:00:00.000Z",
        "9999-12-31T23:59:59.999Z",
        "2026-08-14T10:00:00.-01Z",
        "2026-08-14T10:00:00. 1 Z",
    ],
)
def test_the_edges_parse_or_raise_what_strptime_did(text: str) -> None:
    for _ in range(2):
        assert _parsed(parse_ms, text) == _parsed(_parse_ms_by_strptime, text)
