"""benchmarks/goals.py (issue 34) in one small run: every goal row is there, with numbers.

Tiny numbers, the Python client and no PostgreSQL, so it runs anywhere the suite does; the
figures themselves mean nothing at this size and speed is never asserted. What is checked is the
instrument: each row ran against its own process with every answer the expected status (the
provider alone answers 202 to a new key per request), every goal row has its measured value, what
it is set against, a ratio and a verdict, and the PostgreSQL goal says why it was skipped.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from .scripts import BENCHMARKS, load_goals

GOAL_ROWS = {
    "block-cpu": 1,
    "allow-cpu": 1,
    "block-cpu-complete": 1,
    "allow-cpu-complete": 1,
    "workers-cpu": 2,
    "workers-tail": 2,
    "floor-workers-cpu": 2,
    "floor-workers-tail": 2,
    "c1-allow-p50": 3,
    "c1-allow-p50-complete": 3,
    "c1-allow-p99": 3,
    "c1-block-p50": 3,
    "c1-block-p99": 3,
    "postgres-allow-cpu": 4,
    "postgres-server-cpu": 4,
    "floor-postgres-cpu": 4,
    "postgres-vs-floor-postgres": 4,
    "postgres-vs-floor-complete": 4,
}
WITH_A_LIMIT = {"block-cpu", "allow-cpu", "workers-cpu", "workers-tail", "c1-allow-p50"}
MEASURED_ROWS = {
    "floor-block",
    "floor-allow",
    "complete-block",
    "complete-allow",
    "complete-block-c1",
    "complete-allow-c1",
    "executor-block",
    "executor-allow",
    "provider-c1",
    "floor-block-c1",
    "floor-allow-c1",
    "executor-block-c1",
    "executor-allow-c1",
    "workers-allow",
    "floor-workers-allow",
}


def test_one_small_run_reports_every_goal_with_numbers(tmp_path: Path) -> None:
    # Run as a script, from elsewhere: benchmarks/ is not a package and the repository root must
    # not reach sys.path.
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "goals.py"), "--requests", "30", "--concurrency", "4",
         "--client", "python", "--skip-postgres", "-o", "json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=170,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert "[1/15] floor, BLOCK, c=4" in done.stderr  # progress as each row runs

    rows = {row["key"]: row for row in report["rows"]}
    assert set(rows) == MEASURED_ROWS
    assert report["unexpected_answers"] == {}
    for key, row in rows.items():
        assert row["n"] == 30, key
        assert row["failures"] == 0, key
        assert 0 < row["p50"] <= row["p99"], key
        assert (key == "provider-c1") == ("cpu_ms" not in row), key
    assert report["provider_subtracted_ms"] == rows["provider-c1"]["p50"]

    goals = {entry["key"]: entry for entry in report["goals"]}
    assert {key: entry["goal"] for key, entry in goals.items()} == GOAL_ROWS
    for key, entry in goals.items():
        if entry["goal"] == 4:
            assert entry["skipped"] == "--skip-postgres"
            assert entry["measured"] is None
            assert entry["met"] is None
            continue
        assert entry["skipped"] is None
        assert isinstance(entry["measured"], float), key
        assert isinstance(entry["against"], float), key
        assert isinstance(entry["ratio"], float), key
        if key in WITH_A_LIMIT:
            assert isinstance(entry["limit"], float), key
            assert entry["met"] is (entry["ratio"] <= entry["limit"]), key
        else:
            assert entry["limit"] is None
            assert entry["met"] is None
    # The provider's time comes off both sides of the c=1 ALLOW goal.
    provider = rows["provider-c1"]["p50"]
    allow = goals["c1-allow-p50"]
    assert allow["measured"] == rows["executor-allow-c1"]["p50"] - provider
    assert allow["against"] == rows["floor-allow-c1"]["p50"] - provider
    complete = goals["c1-allow-p50-complete"]
    assert complete["against"] == rows["complete-allow-c1"]["p50"] - provider
    # The complete floor's rows are references beside the goals, never the goals' own floor.
    assert goals["block-cpu"]["against"] == rows["floor-block"]["cpu_ms"]
    assert goals["block-cpu-complete"]["against"] == rows["complete-block"]["cpu_ms"]
    assert report["postgres"] == {"skipped": "--skip-postgres", "settings": {}}


def _goals_module() -> ModuleType:
    return load_goals()


def _entry(key: str, ratio: float | None, limit: float | None = 2.0) -> dict[str, Any]:
    return {
        "key": key,
        "goal": 1,
        "what": key,
        "measured": None if ratio is None else ratio * 10,
        "against": 10.0,
        "against_what": "floor",
        "ratio": ratio,
        "limit": limit,
        "met": None if ratio is None or limit is None else ratio <= limit,
        "skipped": None,
    }


def test_repeated_runs_are_judged_on_the_median_ratio() -> None:
    goals = _goals_module()
    runs = [
        [_entry("block-cpu", 2.6), _entry("allow-cpu", 1.9), _entry("tail", 2.5, None)],
        [_entry("block-cpu", 1.8), _entry("allow-cpu", 2.3), _entry("tail", None, None)],
        [_entry("block-cpu", 1.9), _entry("allow-cpu", 2.2), _entry("tail", 3.5, None)],
    ]
    block, allow, tail = goals.combined(runs)
    # Alone, the runs say no, met, met for BLOCK and met, no, no for ALLOW: the median decides.
    assert (block["ratio"], block["met"]) == (1.9, True)
    assert block["ratios"] == [2.6, 1.8, 1.9]
    assert (block["measured"], block["against"]) == (19.0, 10.0)
    assert (allow["ratio"], allow["met"]) == (2.2, False)
    assert (tail["ratio"], tail["met"]) == (3.0, None)  # a run without a ratio is left out
    assert tail["ratios"] == [2.5, None, 3.5]
    (one,) = goals.combined([[_entry("block-cpu", 2.1)]])
    assert (one["ratio"], one["ratios"], one["met"]) == (2.1, [2.1], False)


def test_repeat_refuses_no_runs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        _goals_module().main(["--repeat", "0"])
    assert exited.value.code == 2
    assert "--repeat needs at least one run" in capsys.readouterr().err
