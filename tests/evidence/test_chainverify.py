"""Property tests: every single alteration, deletion, insertion, swap or duplication of chain
lines is found by verify_chain at the right seq; resumption gaps and foreign lines are not
tampering; the CLI exits non-zero on a break."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from agentsafe.executor.canonical import canonical_text, sha256_digest
from agentsafe.executor.clock import ManualClock
from agentsafe.executor.events import EVIDENCE_SCHEMA, SECURITY_SCHEMA
from agentsafe.executor.evidence import chainverify as cv
from agentsafe.executor.evidence.chain import GENESIS_HASH, ChainedSink

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def build_chain(n: int, *, schema: str = EVIDENCE_SCHEMA, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = io.StringIO()
    clock = ManualClock()
    sink = ChainedSink(out, stream="evidence", schema=schema, clock=clock)
    for i in range(n):
        clock.advance(0.25)
        sink.emit(
            rng.choice(["PROPOSAL_RECEIVED", "DECISION", "GRANT_CLAIMED", "OUTCOME"]),
            {
                "intent_hash": sha256_digest({"i": i, "seed": seed}),
                "verdict": rng.choice(["ALLOW", "BLOCK", "ESCALATE"]),
                "reason_codes": [rng.choice(["A", "B", "é✓"]) for _ in range(rng.randint(0, 3))],
                "amount": rng.choice([1, 2.5, -0.0, 10**15, None, True]),
                "caller": {"principal": f"p-{rng.randint(0, 9)}", "n": i},
            },
        )
    return out.getvalue().splitlines()


def obj(line: str) -> dict[str, Any]:
    value = json.loads(line)
    assert isinstance(value, dict)
    return value


def forge(seq: int, prev_hash: str, *, schema: str = EVIDENCE_SCHEMA) -> str:
    body: dict[str, Any] = {
        "at": "2027-01-15T08:00:00.000Z",
        "event": "DECISION",
        "verdict": "ALLOW",
        "prev_hash": prev_hash,
        "schema": schema,
        "seq": seq,
    }
    body["hash"] = sha256_digest(body)
    return canonical_text(body)


chain_sizes = st.integers(min_value=3, max_value=25)


def test_an_untouched_chain_is_intact() -> None:
    lines = build_chain(20)
    report = cv.verify_chain(lines, require_genesis=True)
    assert report.ok
    assert report.findings == ()
    summary = report.streams[EVIDENCE_SCHEMA]
    assert (summary.first_seq, summary.last_seq, summary.lines) == (1, 20, 20)
    assert summary.last_hash == obj(lines[-1])["hash"]
    assert obj(lines[0])["genesis"] is True
    assert obj(lines[0])["prev_hash"] == GENESIS_HASH


@SETTINGS
@given(n=chain_sizes, data=st.data())
def test_any_field_alteration_is_found_at_its_seq(n: int, data: st.DataObject) -> None:
    lines = build_chain(n, seed=n)
    i = data.draw(st.integers(0, n - 1), label="line")
    line = obj(lines[i])
    key = data.draw(st.sampled_from(sorted(line)), label="field")
    new = data.draw(
        st.one_of(st.text(max_size=8), st.integers(-5, 10**6), st.booleans(), st.none()),
        label="value",
    )
    assume(new != line[key] or type(new) is not type(line[key]))
    line[key] = new
    lines[i] = canonical_text(line)
    report = cv.verify_chain(lines)
    assert not report.ok
    bad = report.first_bad
    assert bad is not None
    assert bad.seq == i + 1, bad
    assert bad.kind in {cv.ALTERED, cv.MALFORMED}
    if key not in {"seq", "hash", "prev_hash", "event", "at"}:
        assert bad.kind == cv.ALTERED


@SETTINGS
@given(n=chain_sizes, data=st.data())
def test_any_character_change_is_found_at_its_seq(n: int, data: st.DataObject) -> None:
    lines = build_chain(n, seed=n + 1)
    i = data.draw(st.integers(0, n - 1), label="line")
    j = data.draw(st.integers(0, len(lines[i]) - 1), label="position")
    ch = data.draw(st.characters(codec="utf-8", exclude_characters="\n\r"), label="char")
    assume(ch != lines[i][j])
    lines[i] = lines[i][:j] + ch + lines[i][j + 1 :]
    report = cv.verify_chain(lines)
    if i == n - 1 and not lines[i].endswith("}"):
        # The last line's closing brace replaced: indistinguishable from a write torn by a crash,
        # so it is reported as a torn tail (a finding, not tampering) at that line.
        [finding] = report.findings
        assert (finding.kind, finding.seq) == (cv.TRUNCATED_TAIL, n), report
        return
    bad = report.first_bad
    assert bad is not None, report
    assert bad.seq == i + 1, bad
    assert bad.kind in {cv.ALTERED, cv.MALFORMED, cv.TRUNCATED_MIDDLE}


@SETTINGS
@given(n=chain_sizes, data=st.data())
def test_any_deletion_before_the_last_line_is_found(n: int, data: st.DataObject) -> None:
    lines = build_chain(n, seed=n + 2)
    i = data.draw(st.integers(1, n - 2), label="line")
    del lines[i]
    report = cv.verify_chain(lines)
    bad = report.first_bad
    assert bad is not None
    assert (bad.kind, bad.seq) == (cv.REMOVED, i + 1)


def test_deleting_the_first_line_is_found_when_the_log_must_start_at_genesis() -> None:
    lines = build_chain(5)[1:]
    assert cv.verify_chain(lines).ok  # a window may start anywhere
    bad = cv.verify_chain(lines, require_genesis=True).first_bad
    assert bad is not None
    assert (bad.kind, bad.seq) == (cv.REMOVED, 1)


@SETTINGS
@given(n=chain_sizes, data=st.data(), linked=st.booleans())
def test_any_inserted_line_is_found(n: int, data: st.DataObject, linked: bool) -> None:
    lines = build_chain(n, seed=n + 3)
    i = data.draw(st.integers(1, n - 1), label="position")
    prev = obj(lines[i - 1])["hash"] if linked else sha256_digest({"forged": i})
    lines.insert(i, forge(i + 1, prev))
    report = cv.verify_chain(lines)
    bad = report.first_bad
    assert bad is not None
    assert (bad.kind, bad.seq) == (cv.INSERTED, i + 1)


@SETTINGS
@given(n=chain_sizes, data=st.data())
def test_any_swap_of_two_lines_is_found_at_the_first_displaced_seq(
    n: int, data: st.DataObject
) -> None:
    lines = build_chain(n, seed=n + 4)
    i = data.draw(st.integers(0, n - 2), label="first")
    j = data.draw(st.integers(i + 1, n - 1), label="second")
    lines[i], lines[j] = lines[j], lines[i]
    report = cv.verify_chain(lines)
    bad = report.first_bad
    assert bad is not None
    assert (bad.kind, bad.seq) == (cv.REORDERED, i + 1)


@SETTINGS
@given(n=chain_sizes, data=st.data())
def test_any_duplicated_line_is_found(n: int, data: st.DataObject) -> None:
    lines = build_chain(n, seed=n + 5)
    i = data.draw(st.integers(0, n - 1), label="copied")
    k = data.draw(st.integers(0, n), label="inserted at")
    lines.insert(k, lines[i])
    report = cv.verify_chain(lines)
    bad = report.first_bad
    assert bad is not None
    assert (bad.kind, bad.seq) == (cv.DUPLICATE, i + 1)


def test_an_altered_and_rehashed_line_breaks_the_next_link() -> None:
    lines = build_chain(8)
    line = obj(lines[3])
    line["verdict"] = "FORGED"
    del line["hash"]
    line["hash"] = sha256_digest(line)
    lines[3] = canonical_text(line)
    bad = cv.verify_chain(lines).first_bad
    assert bad is not None
    assert (bad.kind, bad.seq) == (cv.ALTERED, 4)


def test_a_torn_last_line_is_reported_apart_and_a_torn_middle_line_is_tampering() -> None:
    lines = build_chain(6)
    torn_tail = [*lines[:-1], lines[-1][:40]]
    report = cv.verify_chain(torn_tail)
    assert report.ok
    assert [f.kind for f in report.findings] == [cv.TRUNCATED_TAIL]
    torn_middle = list(lines)
    torn_middle[2] = lines[2][:40]
    bad = cv.verify_chain(torn_middle).first_bad
    assert bad is not None
    assert (bad.kind, bad.seq) == (cv.TRUNCATED_MIDDLE, 3)
    assert len(cv.verify_chain(torn_middle).findings) == 1


def test_a_line_that_is_not_our_json_is_malformed() -> None:
    lines = build_chain(5)
    line = obj(lines[2])
    line["seq"] = "three"
    lines[2] = json.dumps(line)
    bad = cv.verify_chain(lines).first_bad
    assert bad is not None
    assert (bad.kind, bad.seq) == (cv.MALFORMED, 3)


def test_foreign_lines_are_listed_and_do_not_hide_a_missing_line() -> None:
    lines = build_chain(6)
    mixed = [
        "INFO agentsafe.serve listening on 127.0.0.1:8443",
        lines[0],
        lines[1],
        '{"level": "info", "msg": "json from something else"}',
        lines[2],
        "Traceback (most recent call last):",
        *lines[3:],
    ]
    report = cv.verify_chain(mixed)
    assert report.ok
    assert report.foreign_lines == (1, 4, 6)
    without = [line for line in mixed if line != lines[3]]
    bad = cv.verify_chain(without).first_bad
    assert bad is not None
    assert (bad.kind, bad.seq) == (cv.REMOVED, 4)


def test_interleaved_streams_are_walked_separately() -> None:
    evidence = build_chain(6, schema=EVIDENCE_SCHEMA, seed=1)
    security = build_chain(4, schema=SECURITY_SCHEMA, seed=2)
    mixed = [evidence[0], security[0], evidence[1], evidence[2], security[1], *security[2:]]
    mixed += evidence[3:]
    report = cv.verify_chain(mixed)
    assert report.ok
    assert set(report.streams) == {EVIDENCE_SCHEMA, SECURITY_SCHEMA}
    mixed.remove(security[2])
    bad = cv.verify_chain(mixed).first_bad
    assert bad is not None
    assert (bad.kind, bad.seq, bad.schema) == (cv.REMOVED, 3, SECURITY_SCHEMA)


def _resumed(tmp_path: Path, *, clean: bool) -> list[str]:
    out = io.StringIO()
    clock = ManualClock()
    journal = tmp_path / "journal"
    sink = ChainedSink(
        out,
        stream="evidence",
        schema=EVIDENCE_SCHEMA,
        clock=clock,
        journal_dir=journal,
        checkpoint_lines=4,
    )
    for i in range(6):
        sink.emit("DECISION", {"i": i})
    head = sink.head()
    assert head is not None
    sink.close()
    if not clean:  # what a crash after the checkpoint at seq 5 leaves behind
        (journal / "chain" / "evidence.head.json").write_text(
            canonical_text(
                {
                    "schema": "agent-safe.chain-head/1",
                    "stream": "evidence",
                    "stream_schema": EVIDENCE_SCHEMA,
                    "seq": 5,
                    "hash": obj(out.getvalue().splitlines()[4])["hash"],
                    "clean": False,
                    "checkpoint_lines": 4,
                    "at": "2027-01-15T08:00:00.000Z",
                }
            )
        )
    again = ChainedSink(
        out,
        stream="evidence",
        schema=EVIDENCE_SCHEMA,
        clock=clock,
        journal_dir=journal,
        checkpoint_lines=4,
    )
    again.emit("DECISION", {"i": 99})
    again.close()
    return out.getvalue().splitlines()


def test_a_clean_resumption_is_seamless(tmp_path: Path) -> None:
    lines = _resumed(tmp_path, clean=True)
    report = cv.verify_chain(lines, require_genesis=True)
    assert report.ok
    assert report.findings == ()
    assert [obj(line)["seq"] for line in lines] == list(range(1, 9))
    assert report.streams[EVIDENCE_SCHEMA].resumptions == 1


def test_a_crash_resumption_is_a_gap_not_tampering(tmp_path: Path) -> None:
    lines = _resumed(tmp_path, clean=False)
    resumed = obj(lines[6])
    assert resumed["event"] == "CHAIN_RESUMED"
    assert resumed["gap"] is True
    assert resumed["seq"] == 5 + 4 + 1
    report = cv.verify_chain(lines, require_genesis=True)
    assert report.ok
    assert [(f.kind, f.seq) for f in report.findings] == [(cv.RESUMPTION_GAP, 10)]
    assert report.gaps == report.findings
    # Tampering after the gap is still tampering.
    del lines[6]
    bad = cv.verify_chain(lines).first_bad
    assert bad is not None
    assert bad.kind == cv.REMOVED


def test_a_new_genesis_mid_log_is_a_restart(tmp_path: Path) -> None:
    lines = build_chain(4, seed=1) + build_chain(3, seed=2)
    report = cv.verify_chain(lines)
    assert report.ok
    assert [(f.kind, f.line) for f in report.findings] == [(cv.CHAIN_RESTARTED, 5)]


def test_cli_exit_status_and_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = build_chain(10)
    good = tmp_path / "good.jsonl"
    good.write_text("\n".join(lines) + "\n")
    assert cv.main([str(good)]) == 0
    assert capsys.readouterr().out.startswith("INTACT")
    del lines[4]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    assert cv.main([str(bad)]) == 1
    out = capsys.readouterr().out
    assert "first bad REMOVED at seq 5" in out
    raw = bytearray(good.read_bytes())
    raw[30] = 0xFF  # not UTF-8
    bad.write_bytes(bytes(raw))
    assert cv.main([str(bad)]) == 1
    assert "at seq 1" in capsys.readouterr().out
    empty = tmp_path / "empty.jsonl"
    empty.write_text("just a log line\n")
    assert cv.main([str(empty)]) == 1
    assert cv.main([]) == 2
    assert cv.main([str(tmp_path / "missing.jsonl")]) == 2


@pytest.mark.parametrize("command", [["verify", "chain"], ["verify-chain"]])
def test_the_cli_takes_require_genesis_as_docs_evidence_documents_it(
    tmp_path: Path, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from agentsafe.executor.cli import main

    window = tmp_path / "window.jsonl"
    window.write_text("".join(line + "\n" for line in build_chain(5)[1:]))
    assert main([*command, str(window)]) == 0  # a window may start anywhere
    assert main([*command, "--require-genesis", str(window)]) == 1  # not a whole log
    assert "REMOVED" in capsys.readouterr().out
