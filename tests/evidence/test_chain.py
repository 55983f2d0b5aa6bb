"""ChainedSink in one process: line format, genesis, window, checkpoints and their failure,
reserved names, odd values, concurrency, and whole lines beside operational logs."""

from __future__ import annotations

import datetime
import io
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentsafe.executor.canonical import canonical_text, sha256_digest
from agentsafe.executor.clock import ManualClock, format_ms
from agentsafe.executor.events import EVIDENCE_SCHEMA, SECURITY_SCHEMA, EventSink
from agentsafe.executor.evidence import chain as chain_module
from agentsafe.executor.evidence.chain import (
    GENESIS_HASH,
    ChainedSink,
    ChainError,
    LineWriter,
    LineWriterHandler,
    open_chained_streams,
)
from agentsafe.executor.evidence.chainverify import verify_chain


def sink(out: io.StringIO, **kwargs: Any) -> ChainedSink:
    kwargs.setdefault("clock", ManualClock())
    return ChainedSink(out, stream="evidence", schema=EVIDENCE_SCHEMA, **kwargs)


def lines_of(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_lines_are_canonical_hash_linked_and_start_at_genesis() -> None:
    out = io.StringIO()
    clock = ManualClock()
    s = sink(out, clock=clock)
    as_sink: EventSink = s  # the protocol the executor's components take
    assert as_sink is s
    s.emit("PROPOSAL_RECEIVED", {"intent_id": "i-1", "reason_codes": ["B", "A"]})
    clock.advance(1.5)
    s.emit("DECISION", {"verdict": "ALLOW"})
    raw = out.getvalue()
    assert raw.endswith("\n")
    first, second = lines_of(out)
    assert raw.splitlines()[0] == canonical_text(first)
    assert first["schema"] == EVIDENCE_SCHEMA
    assert (first["seq"], first["prev_hash"], first["genesis"]) == (1, GENESIS_HASH, True)
    assert first["at"] == format_ms(1_800_000_000.0)
    assert first["hash"] == sha256_digest({k: v for k, v in first.items() if k != "hash"})
    assert second["prev_hash"] == first["hash"]
    assert second["seq"] == 2
    assert "genesis" not in second
    assert second["at"] == format_ms(1_800_000_001.5)
    head = s.head()
    assert head is not None
    assert (head.seq, head.hash) == (2, second["hash"])


def test_window_keeps_the_last_lines_and_snapshot_matches_the_head() -> None:
    out = io.StringIO()
    s = sink(out, window_lines=3)
    for i in range(7):
        s.emit("E", {"i": i})
    snap = s.snapshot()
    assert [json.loads(line)["seq"] for line in snap.lines] == [5, 6, 7]
    assert snap.lines == tuple(out.getvalue().splitlines()[-3:])
    assert snap.head is not None
    assert snap.head.hash == json.loads(snap.lines[-1])["hash"]
    assert verify_chain(snap.lines).ok


def test_reserved_fields_and_events_are_refused_and_write_nothing() -> None:
    out = io.StringIO()
    s = sink(out)
    for field in ("seq", "hash", "prev_hash", "schema", "gap", "resumed_from", "genesis"):
        with pytest.raises(ChainError) as info:
            s.emit("E", {field: 1})
        assert info.value.code == "FIELD_RESERVED"
    with pytest.raises(ChainError) as info:
        s.emit("CHAIN_RESUMED", {})
    assert info.value.code == "EVENT_RESERVED"
    assert out.getvalue() == ""


def test_values_without_a_json_form_never_stop_a_line() -> None:
    out = io.StringIO()
    s = sink(out)
    s.emit(
        "E",
        {
            "when": datetime.datetime(2026, 3, 2, tzinfo=datetime.UTC),
            "big": 2**60,
            "nan": float("nan"),
            "tags": {"b", "a"},
            "surrogate": "x\ud800y",
            "nested": ({"k": (1, 2)},),
            7: "int key",
        },
    )
    (line,) = lines_of(out)
    assert line["big"] == str(2**60)
    assert line["nan"] == "nan"
    assert line["tags"] == ["a", "b"]
    assert line["surrogate"] == "x?y"
    assert line["nested"] == [{"k": [1, 2]}]
    assert line["7"] == "int key"
    assert verify_chain(out.getvalue().splitlines()).ok


def test_concurrent_emitters_produce_one_unbroken_chain() -> None:
    out = io.StringIO()
    s = sink(out)

    def work(t: int) -> None:
        for i in range(150):
            s.emit("E", {"t": t, "i": i, "pad": "x" * (i % 40)})

    threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    text = out.getvalue().splitlines()
    assert len(text) == 900
    report = verify_chain(text, require_genesis=True)
    assert report.ok
    assert report.findings == ()


def test_operational_logs_share_the_stream_but_never_a_line() -> None:
    stream = io.StringIO()
    writer = LineWriter.for_stream(stream)
    assert LineWriter.for_stream(stream) is writer
    security = ChainedSink(writer, stream="security", schema=SECURITY_SCHEMA, clock=ManualClock())
    logger = logging.getLogger("agentsafe.test.interleave")
    logger.propagate = False
    handler = LineWriterHandler(writer)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:

        def chain_work() -> None:
            for i in range(200):
                security.emit("AUTH_FAILED", {"i": i, "pad": "y" * 300})

        def log_work() -> None:
            for i in range(200):
                logger.info("operational message %d %s", i, "z" * 300)

        threads = [threading.Thread(target=chain_work), threading.Thread(target=log_work)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        logger.removeHandler(handler)
        handler.close()
    text = stream.getvalue().splitlines()
    assert len(text) == 400
    assert all(
        line.startswith("INFO agentsafe.test.interleave operational message")
        or json.loads(line)["schema"] == SECURITY_SCHEMA
        for line in text
    )
    report = verify_chain(text)
    assert report.ok
    assert len(report.foreign_lines) == 200


def test_checkpoints_after_the_first_line_every_interval_and_clean_at_close(
    tmp_path: Path,
) -> None:
    out = io.StringIO()
    s = sink(out, journal_dir=tmp_path, checkpoint_lines=5)
    head_file = tmp_path / "chain" / "evidence.head.json"
    seen: list[int] = []
    for _ in range(12):
        s.emit("E", {})
        s.wait_checkpoint()
        seen.append(json.loads(head_file.read_text())["seq"])
    # The first line at once; then from three quarters of the interval past the persisted head
    # (here 4 lines), in the background.
    assert seen == [1, 1, 1, 1, 5, 5, 5, 5, 9, 9, 9, 9]
    assert json.loads(head_file.read_text())["clean"] is False
    s.close()
    s.close()  # idempotent
    stored = json.loads(head_file.read_text())
    assert (stored["seq"], stored["clean"], stored["checkpoint_lines"]) == (12, True, 5)
    assert stored["hash"] == lines_of(out)[-1]["hash"]
    assert oct(tmp_path.joinpath("chain").stat().st_mode & 0o777) == oct(0o700)
    with pytest.raises(ChainError) as info:
        s.emit("E", {})
    assert info.value.code == "CHAIN_CLOSED"


def test_a_checkpoint_on_the_disk_holds_back_only_the_line_past_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = io.StringIO()
    s = sink(out, journal_dir=tmp_path, checkpoint_lines=4)
    s.emit("E", {})  # persisted at seq 1, by the caller
    disk = threading.Event()
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:  # the checkpoint thread's fsync waits for the test
        if threading.current_thread().name.startswith("agentsafe-chain"):
            assert disk.wait(30)
        real_fsync(fd)

    monkeypatch.setattr(chain_module.os, "fsync", slow_fsync)
    for _ in range(4):  # seq 2..5: the checkpoint of seq 4 starts, and nobody waits for it
        s.emit("E", {})
    assert [line["seq"] for line in lines_of(out)] == [1, 2, 3, 4, 5]
    past = threading.Thread(target=s.emit, args=("E", {}))
    past.start()  # seq 6 would be 5 past the persisted 1: it waits for the checkpoint
    past.join(timeout=0.3)
    assert past.is_alive()
    assert [line["seq"] for line in lines_of(out)] == [1, 2, 3, 4, 5]
    disk.set()
    past.join(timeout=30)
    assert not past.is_alive()
    assert [line["seq"] for line in lines_of(out)] == [1, 2, 3, 4, 5, 6]
    assert json.loads((tmp_path / "chain" / "evidence.head.json").read_text())["seq"] == 4
    s.close()
    stored = json.loads((tmp_path / "chain" / "evidence.head.json").read_text())
    assert (stored["seq"], stored["clean"]) == (6, True)


def test_a_resumed_process_persists_its_head_at_once(tmp_path: Path) -> None:
    """A crash right after a clean resumption must not look clean on the next start."""
    out = io.StringIO()
    first = sink(out, journal_dir=tmp_path)
    first.emit("E", {})
    first.close()
    second = sink(out, journal_dir=tmp_path)
    stored = json.loads((tmp_path / "chain" / "evidence.head.json").read_text())
    assert (stored["seq"], stored["clean"]) == (2, False)
    second.close()


def test_an_unreadable_head_refuses_to_open(tmp_path: Path) -> None:
    (tmp_path / "chain").mkdir()
    (tmp_path / "chain" / "evidence.head.json").write_text('{"seq": "x"')
    with pytest.raises(ChainError) as info:
        sink(io.StringIO(), journal_dir=tmp_path)
    assert info.value.code == "CHAIN_HEAD_UNREADABLE"
    (tmp_path / "chain" / "evidence.head.json").write_text(
        json.dumps({"schema": "agent-safe.chain-head/1", "stream": "security", "seq": 1})
    )
    with pytest.raises(ChainError) as info:
        sink(io.StringIO(), journal_dir=tmp_path)
    assert info.value.code == "CHAIN_HEAD_UNREADABLE"


def test_one_journal_one_writer(tmp_path: Path) -> None:
    first = sink(io.StringIO(), journal_dir=tmp_path)
    with pytest.raises(ChainError) as info:
        sink(io.StringIO(), journal_dir=tmp_path)
    assert info.value.code == "CHAIN_JOURNAL_IN_USE"
    first.close()
    sink(io.StringIO(), journal_dir=tmp_path).close()


def test_a_failing_checkpoint_stops_lines_beyond_the_crash_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = io.StringIO()
    s = sink(out, journal_dir=tmp_path, checkpoint_lines=3)
    s.emit("E", {})  # persisted at seq 1

    def broken_fsync(fd: int) -> None:  # simulated disk failure: cannot be produced here
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(chain_module.os, "fsync", broken_fsync)
    for _ in range(3):  # seq 2..4; the checkpoint at 4 fails but the line is out
        s.emit("E", {})
    with pytest.raises(ChainError) as info:
        s.emit("E", {})  # seq 5 would exceed 1 + 3 + ... the persisted bound
    assert info.value.code == "CHAIN_JOURNAL"
    assert [line["seq"] for line in lines_of(out)] == [1, 2, 3, 4]
    monkeypatch.undo()
    s.emit("E", {})  # the disk is back: persisted first, then written
    assert lines_of(out)[-1]["seq"] == 5
    assert json.loads((tmp_path / "chain" / "evidence.head.json").read_text())["seq"] >= 4
    s.close()


def test_an_unpersisted_head_is_reported_on_every_line_until_a_probe_lands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29: a failed checkpoint makes the sink ``failed`` and calls ``on_failure`` after
    each line, written or refused, before any line is refused (the halt has room); the synced
    probe (``recover``) clears it once the disk takes writes again."""
    out = io.StringIO()
    s = sink(out, journal_dir=tmp_path, checkpoint_lines=8)
    calls: list[bool] = []
    s.on_failure = lambda: calls.append(s.failed)
    s.emit("E", {})  # persisted at seq 1
    assert (s.failed, calls) == (False, [])

    def broken_fsync(fd: int) -> None:  # simulated disk failure (the process test fills one)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(chain_module.os, "fsync", broken_fsync)
    for _ in range(6):  # seq 2..7: the checkpoint started at 7 (1 + 8 - 2) fails
        s.emit("E", {})
    s.wait_checkpoint()
    assert s.failed
    before = len(calls)  # 0, or 1 when the thread failed before line 7's emit returned
    assert before <= 1
    s.emit("E", {})  # seq 8: written (still within the bound), and the failure reported
    assert calls == [True] * (before + 1)
    assert s.recover() is False  # the probe fails while the disk does
    s.emit("E", {})  # seq 9, the bound
    with pytest.raises(ChainError):
        s.emit("E", {})  # seq 10 would pass it: refused, and reported
    assert calls == [True] * (before + 3)
    monkeypatch.undo()
    assert s.recover() is True
    assert not s.failed
    s.emit("E", {})
    assert [line["seq"] for line in lines_of(out)] == list(range(1, 11))
    assert len(calls) == before + 3  # nothing reported once the head persists again
    s.close()


def test_streams_record_the_evidence_resumption_on_the_security_stream(tmp_path: Path) -> None:
    ev, se = io.StringIO(), io.StringIO()
    clock = ManualClock()
    streams = open_chained_streams(
        evidence_out=ev, security_out=se, clock=clock, journal_dir=tmp_path
    )
    streams.evidence.emit("DECISION", {})
    assert set(streams.heads()) == {"evidence", "security"}
    streams.close()
    streams = open_chained_streams(
        evidence_out=ev, security_out=se, clock=clock, journal_dir=tmp_path
    )
    streams.close()
    evidence = lines_of(ev)
    security = lines_of(se)
    assert evidence[-1]["event"] == "CHAIN_RESUMED"
    records = [s for s in security if s.get("stream") == "evidence"]
    assert records[0]["event"] == "CHAIN_RESUMED"
    assert records[0]["resumption"]["seq"] == evidence[-1]["seq"]
    assert verify_chain(ev.getvalue().splitlines()).ok
    assert verify_chain(se.getvalue().splitlines()).ok


_JSON_LEAF = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
    | st.sampled_from(["hash", "sha256:" + "0" * 64, '"hash":"', chain_module._HASH_PLACEHOLDER])
)
_JSON = st.recursive(
    _JSON_LEAF,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.text(max_size=8) | st.sampled_from(["hash", "h", "i"]), inner, max_size=4
        )
    ),
    max_leaves=12,
)


@given(
    st.dictionaries(
        st.text(max_size=10).filter(lambda k: k not in chain_module.RESERVED_FIELDS),
        _JSON,
        max_size=6,
    ),
    st.booleans(),
)
def test_one_canonicalisation_gives_the_hash_and_text_of_two(
    fields: dict[str, Any], genesis: bool
) -> None:
    """The shortcut in ``_hashed_text`` against the code it replaced: ``sha256_digest`` of the
    line without ``hash``, then ``canonical_text`` of the line with it."""
    line: dict[str, Any] = {
        **fields,
        "schema": EVIDENCE_SCHEMA,
        "seq": 7,
        "at": "2026-08-14T10:00:00.000Z",
        "event": "E",
        "prev_hash": "sha256:" + "1" * 64,
    }
    if genesis:
        line["genesis"] = True
    expected = dict(line)
    expected["hash"] = sha256_digest(expected)
    assert chain_module._hashed_text(line) == canonical_text(expected)
    assert line == expected


def test_a_field_holding_the_placeholder_takes_the_two_canonicalisations() -> None:
    line = {"note": chain_module._HASH_PLACEHOLDER, "at": "a", "event": "E", "seq": 1}
    line.update({"prev_hash": "p", "schema": "s"})
    expected = dict(line)
    expected["hash"] = sha256_digest(expected)
    assert chain_module._hashed_text(line) == canonical_text(expected)
