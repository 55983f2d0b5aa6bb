"""The ``level`` of each security line (``events.security_level``, issue 22): routine lines and
recoveries are INFO, what the stream exists to report is WARNING, a refusal to start is ERROR."""

from __future__ import annotations

import io
import json

import pytest

from agentsafe.executor.events import SECURITY_SCHEMA, JsonLinesSink, security_level


@pytest.mark.parametrize(
    ("event", "level"),
    [
        ("LISTENING", "INFO"),
        ("HANDLERS_REGISTERED", "INFO"),
        ("STORE_OPENED", "INFO"),
        ("STORE_AVAILABLE", "INFO"),
        ("JOURNAL_RECOVERED", "INFO"),
        ("HALT_CAUSE_LIFTED", "INFO"),
        ("HALTED", "WARNING"),
        ("STORE_UNAVAILABLE", "WARNING"),
        ("JOURNAL_FAILED", "WARNING"),
        ("EGRESS_REFUSED", "WARNING"),
        ("REFUSED_TO_START", "ERROR"),
        ("LEAK_SUSPECTED", "ERROR"),
    ],
)
def test_security_level(event: str, level: str) -> None:
    assert security_level(event) == level


def test_a_security_line_carries_its_level_unless_given_one() -> None:
    stream = io.StringIO()
    sink = JsonLinesSink(stream, schema=SECURITY_SCHEMA)
    sink.emit("STORE_OPENED", {"store": "postgresql"})
    sink.emit("HALTED", {"level": "ERROR"})
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert (first["event"], first["level"]) == ("STORE_OPENED", "INFO")
    assert second["level"] == "ERROR"
