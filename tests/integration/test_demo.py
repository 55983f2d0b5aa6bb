"""``agentsafe demo --no-wait`` end to end, as a person runs it (real processes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_demo_runs_every_case_and_exits_cleanly() -> None:
    agentsafe = str(Path(sys.executable).parent / "agentsafe")
    result = subprocess.run(
        [agentsafe, "demo", "--no-wait"],
        capture_output=True,
        text=True,
        timeout=240,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "160", "TERM": "dumb"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for case in (
        "ALLOW 50.00 USD",
        "same idempotency key again",
        "over policy",
        "needs a person",
        "SHADOW",
        "SIGKILL",
        "EFFECT_MISMATCH",
    ):
        assert case in out
    assert "✗" not in out
    assert out.count("✓") == 7
