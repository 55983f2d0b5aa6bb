"""The shadow report: counts by action and verdict, observation statuses, the closing text."""

from __future__ import annotations

import threading

import pytest

from agentsafe.executor.lifecycle.shadow import ShadowReport


def test_counts_by_action_verdict_and_observation() -> None:
    report = ShadowReport()
    report.record("create_payout", "ALLOW", "OBSERVED")
    report.record("create_payout", "ALLOW", "OBSERVED")
    report.record("create_payout", "BLOCK", "INVALID")
    report.record("refund", "ESCALATE", "OBSERVED")
    report.record("refund", None, "UNAVAILABLE")
    report.record("refund", None, "TIMED_OUT")
    assert report.total == 6
    assert report.as_dict() == {
        "total": 6,
        "actions": {
            "create_payout": {"ALLOW": 2, "BLOCK": 1, "ESCALATE": 0, "NO_VERDICT": 0},
            "refund": {"ALLOW": 0, "BLOCK": 0, "ESCALATE": 1, "NO_VERDICT": 2},
        },
        "observations": {"OBSERVED": 3, "UNAVAILABLE": 1, "TIMED_OUT": 1, "INVALID": 1},
        "enforcement_switch": "EXECUTOR_MODE=ENFORCEMENT",
    }


def test_unknown_verdicts_and_statuses_are_refused() -> None:
    report = ShadowReport()
    with pytest.raises(ValueError):
        report.record("a", "MAYBE", "OBSERVED")
    with pytest.raises(ValueError):
        report.record("a", "ALLOW", "EXECUTED")
    assert report.total == 0


def test_render_lists_every_action_and_ends_with_the_enforcement_switch() -> None:
    report = ShadowReport()
    report.record("create_payout", "ALLOW", "OBSERVED")
    report.record("close_account", "BLOCK", "OBSERVED")
    text = report.render()
    lines = text.rstrip("\n").splitlines()
    assert lines[0].startswith("Shadow report: 2 proposal(s) observed, none executed")
    assert any(line.split()[:2] == ["create_payout", "1"] for line in lines)
    assert any(line.split()[:3] == ["close_account", "0", "1"] for line in lines)
    assert lines[-1].endswith("EXECUTOR_MODE=ENFORCEMENT")
    assert "(no proposals)" in ShadowReport().render()


def test_concurrent_recording_loses_nothing() -> None:
    report = ShadowReport()
    barrier = threading.Barrier(8)

    def worker() -> None:
        barrier.wait()
        for _ in range(500):
            report.record("create_payout", "ALLOW", "OBSERVED")

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert report.as_dict()["actions"]["create_payout"]["ALLOW"] == 4000
    assert report.total == 4000
