"""Restart tests with a real process: a clean stop resumes seamlessly; SIGKILL between checkpoints
leaves a visible gap that the verifier reports as a gap, not as tampering."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import pytest

from agentsafe.executor.events import EVIDENCE_SCHEMA, SECURITY_SCHEMA
from agentsafe.executor.evidence import chainverify as cv

CHILD = Path(__file__).resolve().parents[1] / "support" / "chain_child.py"
pytestmark = pytest.mark.slow


def run_child(
    journal: Path, out: IO[bytes], err: IO[bytes], count: int, then: str, checkpoint: int = 10
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(journal), str(count), str(checkpoint), then],
        stdin=subprocess.PIPE if then == "hang" else subprocess.DEVNULL,
        stdout=out,
        stderr=err,
        cwd=str(journal.parent),
    )


def read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_for_lines(path: Path, count: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if len(path.read_bytes().splitlines()) >= count:
            return
        assert proc.poll() is None, "the child exited early"
        time.sleep(0.02)  # polling a file with a deadline, not synchronising on time
    raise AssertionError("the child did not write its lines in time")


def test_clean_stop_then_restart_resumes_seamlessly(tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    out_path, err_path = tmp_path / "stdout.jsonl", tmp_path / "stderr.jsonl"
    with out_path.open("ab") as out, err_path.open("ab") as err:
        for _ in range(2):
            proc = run_child(journal, out, err, 23, "close")
            assert proc.wait(timeout=120) == 0
    evidence = read(out_path)
    assert [line["seq"] for line in evidence] == list(range(1, 48))
    resumed = evidence[23]
    assert resumed["event"] == "CHAIN_RESUMED"
    assert resumed["gap"] is False
    assert resumed["resumed_from"] == {"seq": 23, "hash": evidence[22]["hash"]}
    for path, schema in ((out_path, EVIDENCE_SCHEMA), (err_path, SECURITY_SCHEMA)):
        report = cv.verify_chain_file(path, require_genesis=True)
        assert report.ok, report
        assert report.findings == ()
        assert report.streams[schema].resumptions == 1
    security = read(err_path)
    about_evidence = [s for s in security if s["event"] == "CHAIN_RESUMED" and "stream" in s]
    assert about_evidence[0]["resumption"]["gap"] is False
    head = json.loads((journal / "chain" / "evidence.head.json").read_text())
    assert (head["seq"], head["hash"], head["clean"]) == (47, evidence[-1]["hash"], True)


def test_sigkill_between_checkpoints_leaves_a_visible_gap(tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    out_path, err_path = tmp_path / "stdout.jsonl", tmp_path / "stderr.jsonl"
    with out_path.open("ab") as out, err_path.open("ab") as err:
        proc = run_child(journal, out, err, 25, "hang", checkpoint=10)
        try:
            wait_for_lines(out_path, 25, proc)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
            assert proc.stdin is not None
            proc.stdin.close()
        assert proc.returncode == -signal.SIGKILL
        head = json.loads((journal / "chain" / "evidence.head.json").read_text())
        # Persisted after line 1, then in the background from 8 lines past the persisted head:
        # 9, 17, and 25 (which may or may not have landed when the process died).
        assert head["clean"] is False
        assert head["seq"] in (17, 25)
        last = head["seq"]
        proc = run_child(journal, out, err, 3, "close", checkpoint=10)
        assert proc.wait(timeout=120) == 0
    evidence = read(out_path)
    assert [line["seq"] for line in evidence[:25]] == list(range(1, 26))
    resumed = evidence[25]
    assert resumed["event"] == "CHAIN_RESUMED"
    assert resumed["gap"] is True
    assert resumed["seq"] == last + 10 + 1 > 25  # beyond every line the dead process wrote
    assert resumed["resumed_from"] == {"seq": last, "hash": evidence[last - 1]["hash"]}
    assert resumed["prev_hash"] == evidence[last - 1]["hash"]
    report = cv.verify_chain_file(out_path, require_genesis=True)
    assert report.ok, report
    assert [(f.kind, f.seq) for f in report.findings] == [(cv.RESUMPTION_GAP, last + 11)]
    security_report = cv.verify_chain_file(err_path, require_genesis=True)
    assert security_report.ok
    assert [f.kind for f in security_report.findings] == [cv.RESUMPTION_GAP]
    assert cv.main([str(out_path)]) == 0


def test_a_second_process_cannot_share_a_journal(tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    out_path, err_path = tmp_path / "stdout.jsonl", tmp_path / "stderr.jsonl"
    with out_path.open("ab") as out, err_path.open("ab") as err:
        first = run_child(journal, out, err, 1, "hang")
        try:
            wait_for_lines(out_path, 1, first)
            second = run_child(journal, out, err, 1, "close")
            assert second.wait(timeout=120) != 0
        finally:
            os.kill(first.pid, signal.SIGKILL)
            first.wait(timeout=60)
            assert first.stdin is not None
            first.stdin.close()
    assert "CHAIN_JOURNAL_IN_USE" in err_path.read_text() or "held by another" in (
        err_path.read_text()
    )
