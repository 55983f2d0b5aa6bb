"""``EXECUTOR_WORKERS``: every chained line names its worker; the verifier walks the interleaved
chains of several workers apart (a collected log), finds tampering in any one of them and names
its worker; a bundle of one worker's chains verifies, and claims its worker."""

from __future__ import annotations

import io
import itertools
import json
from pathlib import Path

import pytest

from agentsafe.executor.clock import ManualClock
from agentsafe.executor.events import EVIDENCE_SCHEMA
from agentsafe.executor.evidence import bundle as b
from agentsafe.executor.evidence.chain import ChainedSink, ChainError, open_chained_streams
from agentsafe.executor.evidence.chainverify import (
    ALTERED,
    REMOVED,
    chain_key,
    verify_chain,
)


def worker_lines(worker: int, count: int, clock: ManualClock) -> list[str]:
    out = io.StringIO()
    sink = ChainedSink(out, stream="evidence", schema=EVIDENCE_SCHEMA, clock=clock, worker=worker)
    for i in range(count):
        sink.emit("DECISION", {"intent_id": f"w{worker}-{i}"})
    return out.getvalue().splitlines()


def interleaved(clock: ManualClock) -> list[str]:
    zero, one = worker_lines(0, 6, clock), worker_lines(1, 6, clock)
    return [line for pair in itertools.zip_longest(zero, one) for line in pair if line]


def test_every_line_names_its_worker_and_the_field_is_the_chains_own() -> None:
    clock = ManualClock(1_772_445_600.0)
    lines = worker_lines(3, 2, clock)
    assert [json.loads(line)["worker"] for line in lines] == [3, 3]
    sink = ChainedSink(io.StringIO(), stream="evidence", schema=EVIDENCE_SCHEMA, clock=clock)
    with pytest.raises(ChainError):
        sink.emit("DECISION", {"worker": 1})
    assert "worker" not in json.loads(worker_lines_single(clock)[0])


def worker_lines_single(clock: ManualClock) -> list[str]:
    out = io.StringIO()
    ChainedSink(out, stream="evidence", schema=EVIDENCE_SCHEMA, clock=clock).emit("X", {})
    return out.getvalue().splitlines()


def test_interleaved_chains_of_two_workers_verify_as_two_intact_chains() -> None:
    report = verify_chain(interleaved(ManualClock(1_772_445_600.0)), require_genesis=True)
    assert report.ok, report.findings
    assert report.findings == ()
    assert set(report.streams) == {chain_key(EVIDENCE_SCHEMA, 0), chain_key(EVIDENCE_SCHEMA, 1)}
    assert [s.lines for s in report.streams.values()] == [6, 6]
    assert {s.worker for s in report.streams.values()} == {0, 1}


def test_a_line_removed_from_one_workers_chain_is_found_and_names_that_worker() -> None:
    lines = interleaved(ManualClock(1_772_445_600.0))
    removed = next(i for i, line in enumerate(lines) if '"seq":3' in line and '"worker":1' in line)
    del lines[removed]
    report = verify_chain(lines)
    assert not report.ok
    bad = report.first_bad
    assert bad is not None
    assert (bad.kind, bad.worker, bad.seq) == (REMOVED, 1, 3)
    assert "worker 1" in bad.describe()


def test_a_line_moved_to_another_workers_chain_is_altered() -> None:
    lines = interleaved(ManualClock(1_772_445_600.0))
    index = next(i for i, line in enumerate(lines) if '"seq":2' in line and '"worker":0' in line)
    lines[index] = lines[index].replace('"worker":0', '"worker":1')
    report = verify_chain(lines)
    assert not report.ok
    assert {f.kind for f in report.findings if f.tampering} >= {ALTERED}


def test_a_bundle_of_one_workers_chains_verifies_and_claims_the_worker(tmp_path: Path) -> None:
    clock = ManualClock(1_772_445_600.0)
    streams = open_chained_streams(
        evidence_out=io.StringIO(), security_out=io.StringIO(), clock=clock, worker=1
    )
    streams.evidence.emit("DECISION", {"intent_id": "i-1"})
    streams.security.emit("HALTED", {"cause": "OPERATOR", "reason": "drill", "by": "ops"})
    manifest = b.export_bundle(
        evidence_dir=tmp_path,
        reason="drill",
        streams=streams.sinks(),
        open_attempts=[],
        posture={},
        config_digest="sha256:" + "00" * 32,
        image_digest=None,
        secret_rotations={},
        signing_key=None,
        clock=clock,
    )
    assert {c["worker"] for c in manifest.document["chains"].values()} == {1}
    report = b.verify_bundle(manifest.directory, public_key=None)
    assert report.ok, report.problems

    # A manifest that claims another worker than its lines name is caught.
    document = json.loads((manifest.directory / "manifest.json").read_text())
    document["chains"]["evidence"]["worker"] = 0
    (manifest.directory / "manifest.json").write_text(json.dumps(document))
    assert not b.verify_bundle(manifest.directory, public_key=None).ok
