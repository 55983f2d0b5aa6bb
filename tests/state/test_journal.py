"""The attempt journal: durable appends, group commit, day files, torn lines, reading back."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from agentsafe.executor.canonical import canonical_json
from agentsafe.executor.clock import ManualClock, parse_ms
from agentsafe.executor.codes import Code
from agentsafe.executor.errors import JournalError, StoreError
from agentsafe.executor.intent import CapturedIntent
from agentsafe.executor.state import journal as journal_module
from agentsafe.executor.state.journal import (
    MAX_RECORD_BYTES,
    AttemptJournal,
    ReconciledStatus,
    RecordType,
    scan_journal,
)
from tests.support.intents import numbered_intent

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z
DAY = "2027-01-15"
WRITER_SCRIPT = Path(__file__).resolve().parents[1] / "support" / "journal_writer.py"


def intent_fields(intent: CapturedIntent) -> dict[str, Any]:
    return {
        "intent_id": intent.intent_id,
        "intent_hash": intent.intent_hash,
        "action": intent.action,
        "binding": intent.binding,
    }


async def open_attempt(journal: AttemptJournal, number: int, *, claimed: bool = False) -> None:
    intent = numbered_intent(number)
    await journal.opened(
        attempt_id=f"a-{number}",
        decision_id=f"dec-{number}",
        dossier_id=f"dos-{number}",
        caller="agent-1",
        **intent_fields(intent),
    )
    if claimed:
        await journal.grant_claimed(
            attempt_id=f"a-{number}",
            grant_id=f"g-{number}",
            expires_at=NOW + 30,
            payload_digest=intent.payload_digest,
        )


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(NOW)


@pytest.fixture
async def journal(tmp_path: Path, clock: ManualClock) -> AsyncIterator[AttemptJournal]:
    opened = await AttemptJournal.open(tmp_path / "journal", retain_days=7, clock=clock)
    yield opened
    await opened.close()


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


async def poll(condition: Callable[[], bool], *, deadline_s: float = 30.0) -> None:
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached before the deadline"
        await asyncio.sleep(0.001)


# -- the records -------------------------------------------------------------------------------


async def test_each_record_is_one_canonical_line(journal: AttemptJournal) -> None:
    intent = numbered_intent(7)
    await open_attempt(journal, 7, claimed=True)
    await journal.closed(attempt_id="a-7", outcome="COMPLETED", executed=True, finalization="OK")
    await journal.reconciled(attempt_id="a-7", status="COMPLETED", by="CALLER")

    path = journal.path / f"{DAY}.jsonl"
    raw = path.read_bytes().splitlines()
    assert [canonical_json(json.loads(line)) for line in raw] == raw
    opened, claimed, closed, reconciled = read_lines(path)
    assert opened == {
        "record": "ATTEMPT_OPENED",
        "at": "2027-01-15T08:00:00.000Z",
        "attempt_id": "a-7",
        "intent_id": intent.intent_id,
        "intent_hash": intent.intent_hash,
        "decision_id": "dec-7",
        "dossier_id": "dos-7",
        "caller": "agent-1",
        "action": "create_payout",
        "intent": intent.binding,
    }
    assert claimed == {
        "record": "GRANT_CLAIMED",
        "at": "2027-01-15T08:00:00.000Z",
        "attempt_id": "a-7",
        "grant_id": "g-7",
        "grant_expires_at": "2027-01-15T08:00:30.000Z",
        "payload_digest": intent.payload_digest,
    }
    assert closed["record"] == "ATTEMPT_CLOSED"
    assert (closed["outcome"], closed["executed"], closed["finalization"]) == (
        "COMPLETED",
        True,
        "OK",
    )
    assert (reconciled["record"], reconciled["status"], reconciled["by"]) == (
        "RECONCILED",
        "COMPLETED",
        "CALLER",
    )


async def test_directory_and_files_are_private(tmp_path: Path, clock: ManualClock) -> None:
    root = tmp_path / "journal" / "attempts"
    root.mkdir(parents=True, mode=0o755)
    root.chmod(0o755)
    journal = await AttemptJournal.open(tmp_path / "journal", retain_days=1, clock=clock)
    try:
        await open_attempt(journal, 1)
        assert stat.S_IMODE(root.stat().st_mode) == 0o700
        assert stat.S_IMODE((root / f"{DAY}.jsonl").stat().st_mode) == 0o600
    finally:
        await journal.close()


async def test_a_second_process_cannot_open_the_same_journal(
    tmp_path: Path, clock: ManualClock
) -> None:
    first = await AttemptJournal.open(tmp_path / "j", retain_days=1, clock=clock)
    try:
        with pytest.raises(JournalError) as caught:
            await AttemptJournal.open(tmp_path / "j", retain_days=1, clock=clock)
        assert caught.value.code == "JOURNAL_LOCKED"
    finally:
        await first.close()
    again = await AttemptJournal.open(tmp_path / "j", retain_days=1, clock=clock)
    await again.close()


async def test_a_closed_journal_refuses_appends(tmp_path: Path, clock: ManualClock) -> None:
    journal = await AttemptJournal.open(tmp_path / "j", retain_days=1, clock=clock)
    await journal.close()
    with pytest.raises(JournalError) as caught:
        await open_attempt(journal, 1)
    assert caught.value.code == "JOURNAL_CLOSED"


@pytest.mark.parametrize(("status", "by"), [("DONE", "RESTART"), ("COMPLETED", "SOMEONE")])
async def test_unknown_reconciliation_values_are_refused(
    journal: AttemptJournal, status: str, by: str
) -> None:
    with pytest.raises(JournalError) as caught:
        await journal.reconciled(attempt_id="a-1", status=status, by=by)
    assert caught.value.code == "JOURNAL_RECORD_INVALID"
    assert not (journal.path / f"{DAY}.jsonl").exists()


# -- size limit --------------------------------------------------------------------------------


async def test_a_record_over_256_kib_is_refused_and_one_at_the_limit_is_kept(
    journal: AttemptJournal,
) -> None:
    path = journal.path / f"{DAY}.jsonl"

    async def append(padding: int) -> None:
        memo = {"memo": "x" * padding} if padding else {}
        await journal.opened(
            attempt_id="a-big",
            decision_id="dec",
            dossier_id="dos",
            caller="agent-1",
            **intent_fields(
                numbered_intent(1, parameters={"amountMinor": 1, "currency": "USD"} | memo)
            ),
        )

    await append(0)
    base = len(path.read_bytes()) - 1  # without the newline
    # The padding sits once in the record, in intent.action.parameters.memo; the key, its
    # quotes and a comma are the fixed overhead.
    overhead = len(canonical_json({"memo": ""})) - len(canonical_json({})) + 1  # +1: the comma
    exact = MAX_RECORD_BYTES - base - overhead

    with pytest.raises(JournalError) as caught:
        await append(exact + 1)
    assert caught.value.code == "JOURNAL_RECORD_TOO_LARGE"
    assert len(path.read_bytes().splitlines()) == 1

    await append(exact)
    lines = path.read_bytes().splitlines()
    assert [len(line) for line in lines] == [base, MAX_RECORD_BYTES]


# -- reading back ------------------------------------------------------------------------------


async def test_open_attempts_follow_the_records(journal: AttemptJournal) -> None:
    for number in range(1, 9):
        await open_attempt(journal, number, claimed=number != 1)
    await journal.closed(attempt_id="a-2", outcome="COMPLETED", executed=True, finalization="OK")
    await journal.closed(
        attempt_id="a-3", outcome="UNKNOWN_AFTER_DISPATCH", executed=None, finalization=None
    )
    await journal.reconciled(attempt_id="a-4", status="STILL_UNKNOWN", by="RESTART")
    await journal.reconciled(attempt_id="a-5", status="COMPLETED", by="RESTART")
    await journal.reconciled(attempt_id="a-6", status="NOT_EXECUTED", by="CALLER")
    await journal.reconciled(attempt_id="a-7", status="UNCLAIMED", by="RESTART")
    await journal.closed(
        attempt_id="a-8", outcome="FAILED_BEFORE_DISPATCH", executed=False, finalization=None
    )

    attempts = {a.attempt_id: a for a in await journal.open_attempts()}
    assert sorted(attempts) == ["a-1", "a-3", "a-4"]
    unclaimed, unknown, still = attempts["a-1"], attempts["a-3"], attempts["a-4"]
    assert not unclaimed.grant_claimed
    assert unclaimed.grant_id is None
    assert unknown.grant_claimed
    assert unknown.grant_id == "g-3"
    assert unknown.grant_expires_at == "2027-01-15T08:00:30.000Z"
    assert unknown.payload_digest == numbered_intent(3).payload_digest
    assert unknown.last_status is None
    assert (unknown.closed_unknown, still.closed_unknown) == (True, False)
    assert still.last_status == ReconciledStatus.STILL_UNKNOWN
    intent = numbered_intent(4)
    assert still.binding == intent.binding
    assert still.intent_hash == intent.intent_hash
    assert (still.tenant, still.idempotency_key) == ("tenant-1", "key-4")
    assert (still.decision_id, still.dossier_id, still.principal, still.action) == (
        "dec-4",
        "dos-4",
        "agent-1",
        "create_payout",
    )
    assert still.file == f"attempts/{DAY}.jsonl"


async def test_open_attempts_survive_a_restart(tmp_path: Path, clock: ManualClock) -> None:
    first = await AttemptJournal.open(tmp_path / "j", retain_days=3, clock=clock)
    await open_attempt(first, 1, claimed=True)
    await first.close()
    second = await AttemptJournal.open(tmp_path / "j", retain_days=3, clock=clock)
    try:
        assert [a.attempt_id for a in await second.open_attempts()] == ["a-1"]
        await second.closed(attempt_id="a-1", outcome="COMPLETED", executed=True, finalization="OK")
        assert await second.open_attempts() == []
    finally:
        await second.close()


async def test_a_missing_journal_has_nothing_open(tmp_path: Path) -> None:
    scan = scan_journal(tmp_path / "nothing", retain_days=1, now=NOW)
    assert scan.open_attempts == ()
    assert scan.torn_lines == ()


# -- days --------------------------------------------------------------------------------------


async def test_records_roll_over_to_the_next_utc_day(tmp_path: Path) -> None:
    midnight = datetime(2027, 1, 16, tzinfo=UTC).timestamp()
    clock = ManualClock(midnight - 0.1)
    journal = await AttemptJournal.open(tmp_path / "j", retain_days=2, clock=clock)
    try:
        await open_attempt(journal, 1, claimed=True)
        await open_attempt(journal, 2, claimed=True)
        clock.advance(0.2)
        await journal.closed(attempt_id="a-1", outcome="COMPLETED", executed=True, finalization="")
        await open_attempt(journal, 3)

        day1 = read_lines(journal.path / "2027-01-15.jsonl")
        day2 = read_lines(journal.path / "2027-01-16.jsonl")
        assert [r["record"] for r in day1] == ["ATTEMPT_OPENED", "GRANT_CLAIMED"] * 2
        assert [r["record"] for r in day2] == ["ATTEMPT_CLOSED", "ATTEMPT_OPENED"]
        assert all(parse_ms(r["at"]) < midnight for r in day1)
        assert all(parse_ms(r["at"]) >= midnight for r in day2)
        assert sorted(a.attempt_id for a in await journal.open_attempts()) == ["a-2", "a-3"]

        clock.advance(86_400)  # day 1 falls out of a two-day window: its open attempt is kept
        assert sorted(a.attempt_id for a in await journal.open_attempts()) == ["a-2", "a-3"]
        assert await journal.prune() == ()  # day 1 still holds a-2
        await journal.reconciled(attempt_id="a-2", status="COMPLETED", by="RESTART")
        assert await journal.prune() == ("attempts/2027-01-15.jsonl",)
        assert not (journal.path / "2027-01-15.jsonl").exists()
        scan = await journal.scan()
        assert [a.attempt_id for a in scan.open_attempts] == ["a-3"]
        assert scan.missing_days == ()  # pruned is not missing
    finally:
        await journal.close()


async def test_a_deleted_day_file_is_reported_missing(tmp_path: Path) -> None:
    clock = ManualClock(datetime(2027, 1, 16, 12, tzinfo=UTC).timestamp())
    journal = await AttemptJournal.open(tmp_path / "j", retain_days=2, clock=clock)
    try:
        await open_attempt(journal, 1, claimed=True)
        (journal.path / "2027-01-16.jsonl").unlink()
        scan = await journal.scan()
        assert scan.open_attempts == ()
        assert scan.missing_days == ("2027-01-16",)
    finally:
        await journal.close()


async def test_a_failed_journal_refuses_until_its_storage_recovers(tmp_path: Path) -> None:
    clock = ManualClock(datetime(2027, 1, 16, 12, tzinfo=UTC).timestamp())
    journal = await AttemptJournal.open(tmp_path / "j", retain_days=2, clock=clock)
    try:
        await open_attempt(journal, 1)
        journal.path.chmod(0o500)  # root ignores modes: make the probe fail by a directory
        (journal.path / ".probe").mkdir()
        journal._writer.failed = True  # what a failed write leaves behind
        with pytest.raises(JournalError) as caught:
            await open_attempt(journal, 2)
        assert caught.value.code == Code.JOURNAL_UNAVAILABLE
        assert await journal.recover() is False
        assert journal.failed
        (journal.path / ".probe").rmdir()
        journal.path.chmod(0o700)
        assert await journal.recover() is True
        await open_attempt(journal, 3)
        assert sorted(a.attempt_id for a in await journal.open_attempts()) == ["a-1", "a-3"]
    finally:
        await journal.close()


async def test_a_recovery_its_caller_gave_up_on_leaves_the_writer_running(
    journal: AttemptJournal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recover() cancelled while queued behind a slow append: the writer skips it and goes on."""
    await open_attempt(journal, 0)
    gate, in_fsync = threading.Event(), threading.Event()
    real_fsync = os.fsync

    def gated_fsync(fd: int) -> None:
        in_fsync.set()
        gate.wait(timeout=60)
        real_fsync(fd)

    monkeypatch.setattr(journal_module.os, "fsync", gated_fsync)
    slow = asyncio.create_task(open_attempt(journal, 1))
    assert await asyncio.to_thread(in_fsync.wait, 60)
    journal._writer.failed = True  # what a failed write leaves behind (read by recover())
    given_up = asyncio.create_task(journal.recover())
    await poll(lambda: journal._writer._queue.qsize() == 1)
    given_up.cancel()
    with pytest.raises(asyncio.CancelledError):
        await given_up
    journal._writer.failed = False
    gate.set()
    await slow
    assert await asyncio.wait_for(journal.recover(), timeout=30) is True
    await asyncio.wait_for(open_attempt(journal, 2), timeout=30)  # a dead writer never answers


# -- damage ------------------------------------------------------------------------------------


async def test_a_torn_last_line_is_reported_then_cut_before_the_next_append(
    tmp_path: Path, clock: ManualClock
) -> None:
    journal = await AttemptJournal.open(tmp_path / "j", retain_days=1, clock=clock)
    await open_attempt(journal, 1, claimed=True)
    await journal.close()
    path = journal.path / f"{DAY}.jsonl"
    with path.open("ab") as handle:
        handle.write(b'{"record":"ATTEMPT_CLO')

    scan = scan_journal(tmp_path / "j", retain_days=1, now=NOW)
    assert [a.attempt_id for a in scan.open_attempts] == ["a-1"]
    assert len(scan.torn_lines) == 1
    torn = scan.torn_lines[0]
    assert (torn.file, torn.line, torn.length) == (f"attempts/{DAY}.jsonl", 3, 22)

    reopened = await AttemptJournal.open(tmp_path / "j", retain_days=1, clock=clock)
    try:
        await open_attempt(reopened, 2)
        assert reopened.repaired_torn_lines == (torn,)
        again = await reopened.scan()
        assert again.torn_lines == ()
        assert [a.attempt_id for a in again.open_attempts] == ["a-1", "a-2"]
        assert len(path.read_bytes().splitlines()) == 3
    finally:
        await reopened.close()


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (b"not json", "not valid JSON"),
        (b"[1,2]", "not a JSON object"),
        (b'{"record":"ATTEMPT_EXPLODED","at":"x","attempt_id":"a-9"}', "unknown record type"),
        (b'{"record":"RECONCILED","at":"x","attempt_id":"a","attempt_id":"b"}', "a key appears"),
        (b'{"record":"GRANT_CLAIMED","at":"x","attempt_id":"a-1","grant_id":NaN}', "non-finite"),
        (
            b'{"record":"ATTEMPT_CLOSED","at":"x","attempt_id":"a-1","outcome":"X","executed":1}',
            "executed",
        ),
        (
            b'{"record":"RECONCILED","at":"x","attempt_id":"a-1","status":"MAYBE","by":"RESTART"}',
            "reconciliation status",
        ),
        (
            b'{"record":"ATTEMPT_OPENED","at":"x","attempt_id":"a-1","intent_hash":"h","intent":{}}',
            "opened twice",
        ),
        (b"", "not valid JSON"),
    ],
)
async def test_a_damaged_line_is_an_error_naming_file_and_line(
    tmp_path: Path, clock: ManualClock, line: bytes, problem: str
) -> None:
    journal = await AttemptJournal.open(tmp_path / "j", retain_days=1, clock=clock)
    await open_attempt(journal, 1)
    await journal.close()
    path = journal.path / f"{DAY}.jsonl"
    good = path.read_bytes()
    path.write_bytes(good + line + b"\n" + good.replace(b'"a-1"', b'"a-2"'))

    with pytest.raises(JournalError) as caught:
        scan_journal(tmp_path / "j", retain_days=1, now=NOW)
    assert caught.value.code == "JOURNAL_CORRUPT"
    assert caught.value.message.startswith(f"attempts/{DAY}.jsonl line 2: ")
    assert problem in caught.value.message


# -- durability --------------------------------------------------------------------------------


async def test_two_hundred_concurrent_appends_share_fsyncs(
    journal: AttemptJournal, monkeypatch: pytest.MonkeyPatch
) -> None:
    await open_attempt(journal, 0)  # the day file exists: only record fsyncs are counted below
    gate = threading.Event()
    calls: list[int] = []
    real_fsync = os.fsync

    def gated_fsync(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 1:
            gate.wait(timeout=60)
        real_fsync(fd)

    monkeypatch.setattr(journal_module.os, "fsync", gated_fsync)
    tasks = [asyncio.create_task(open_attempt(journal, n)) for n in range(1, 201)]
    await poll(lambda: journal.submitted == 201)
    gate.set()
    await asyncio.gather(*tasks)

    # The first batch blocks in fsync while the rest queue up; the rest share one fsync.
    assert 1 <= len(calls) <= 2
    records = read_lines(journal.path / f"{DAY}.jsonl")
    assert len(records) == 201
    ids = [r["attempt_id"] for r in records]
    assert sorted(ids) == sorted(f"a-{n}" for n in range(201))


async def test_appends_sharing_an_fsync_wake_their_loop_once(
    journal: AttemptJournal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer answers a whole fsynced batch in one cross-thread wakeup, not one per record."""
    await open_attempt(journal, 0)
    gate = threading.Event()
    calls: list[int] = []
    real_fsync = os.fsync

    def gated_fsync(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 1:
            gate.wait(timeout=60)
        real_fsync(fd)

    loop = asyncio.get_running_loop()
    inner = loop.call_soon_threadsafe
    from_writer = 0

    def counting(callback: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal from_writer
        if threading.current_thread().name == "agentsafe-journal":
            from_writer += 1
        return inner(callback, *args, **kwargs)

    monkeypatch.setattr(journal_module.os, "fsync", gated_fsync)
    monkeypatch.setattr(loop, "call_soon_threadsafe", counting)
    tasks = [asyncio.create_task(open_attempt(journal, n)) for n in range(1, 101)]
    await poll(lambda: journal.submitted == 101)
    gate.set()
    await asyncio.gather(*tasks)
    assert from_writer == len(calls) <= 2  # one wakeup per fsynced batch


async def test_an_append_whose_caller_gave_up_is_written_and_the_writer_goes_on(
    journal: AttemptJournal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller cancelled while its record waits for the fsync: the record is journaled (it was
    submitted) and the writer answers the next append (it once raised on a cancelled future)."""
    await open_attempt(journal, 0)
    gate = threading.Event()
    in_fsync = threading.Event()
    real_fsync = os.fsync

    def gated_fsync(fd: int) -> None:
        in_fsync.set()
        gate.wait(timeout=60)
        real_fsync(fd)

    monkeypatch.setattr(journal_module.os, "fsync", gated_fsync)
    abandoned = asyncio.create_task(open_attempt(journal, 1))
    assert await asyncio.to_thread(in_fsync.wait, 60)
    abandoned.cancel()
    with pytest.raises(asyncio.CancelledError):
        await abandoned
    gate.set()
    await asyncio.wait_for(open_attempt(journal, 2), timeout=30)  # a dead writer never answers
    ids = [r["attempt_id"] for r in read_lines(journal.path / f"{DAY}.jsonl")]
    assert ids == ["a-0", "a-1", "a-2"]
    assert not journal.failed


async def test_an_append_fails_if_fsync_fails_and_the_journal_stays_failed(
    journal: AttemptJournal, monkeypatch: pytest.MonkeyPatch
) -> None:
    await open_attempt(journal, 0)

    def broken_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "I/O error")

    failures: list[bool] = []
    journal.on_failure = lambda: failures.append(journal.failed)
    with monkeypatch.context() as patch:
        patch.setattr(journal_module.os, "fsync", broken_fsync)
        with pytest.raises(JournalError) as caught:
            await open_attempt(journal, 1)
        assert caught.value.code == "JOURNAL_UNAVAILABLE"
    assert failures == [True]  # told by the failing append itself, before it raised
    with pytest.raises(JournalError) as later:
        await open_attempt(journal, 2)  # fsync works again, but nothing is trusted after EIO
    assert later.value.code == "JOURNAL_UNAVAILABLE"
    assert failures == [True]  # a refusal of an already-failed journal is not a new failure


@pytest.mark.slow
def test_every_acknowledged_record_survives_sigkill(tmp_path: Path) -> None:
    directory = tmp_path / "j"
    child = subprocess.Popen(
        [sys.executable, str(WRITER_SCRIPT), str(directory)],
        stdout=subprocess.PIPE,
        cwd=tmp_path,
    )
    assert child.stdout is not None
    acknowledged: set[tuple[str, str]] = set()
    try:
        while len(acknowledged) < 200:
            line = child.stdout.readline()
            assert line, "the writer stopped before it was killed"
            _, attempt_id, record = line.decode().split()
            acknowledged.add((attempt_id, record))
        child.send_signal(signal.SIGKILL)
        # Acknowledgements already in the pipe were acknowledged before the kill.
        for line in child.stdout.read().splitlines():
            parts = line.decode(errors="replace").split()
            if len(parts) == 3:
                acknowledged.add((parts[1], parts[2]))
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()

    on_disk: set[tuple[str, str]] = set()
    for path in sorted((directory / "attempts").glob("*.jsonl")):
        content = path.read_bytes()
        complete = content[: content.rfind(b"\n") + 1]
        for line in complete.splitlines():
            record = json.loads(line)
            on_disk.add((record["attempt_id"], record["record"]))
    missing = acknowledged - on_disk
    assert not missing
    assert len(on_disk) >= len(acknowledged)
    # And the journal reads back (a torn tail, if any, is reported, not fatal).
    scan = scan_journal(directory, retain_days=2, now=time.time())
    assert len(scan.torn_lines) <= 1


async def test_records_the_reader_would_refuse_are_refused_on_write(
    journal: AttemptJournal,
) -> None:
    attempts = [
        journal.grant_claimed(attempt_id="a-1", grant_id="", expires_at=NOW, payload_digest="d"),
        journal.closed(attempt_id="", outcome="COMPLETED", executed=True, finalization=None),
        journal.closed(attempt_id="a-1", outcome="", executed=True, finalization=None),
        journal.closed(attempt_id="a-1", outcome="X", executed=1, finalization=None),  # type: ignore[arg-type]
    ]
    for attempt in attempts:
        with pytest.raises(JournalError) as caught:
            await attempt
        assert caught.value.code == "JOURNAL_RECORD_INVALID"
    assert not (journal.path / f"{DAY}.jsonl").exists()


async def test_an_opened_record_whose_binding_does_not_hash_is_refused(
    journal: AttemptJournal,
) -> None:
    fields = intent_fields(numbered_intent(1))
    fields["intent_hash"] = numbered_intent(2).intent_hash
    with pytest.raises(JournalError) as caught:
        await journal.opened(
            attempt_id="a-1", decision_id="d", dossier_id="s", caller="agent-1", **fields
        )
    assert caught.value.code == "JOURNAL_RECORD_INVALID"
    assert not (journal.path / f"{DAY}.jsonl").exists()


# -- the shared store's mirror -------------------------------------------------------------------


class _Mirror:
    """An AttemptMirror that records what it is given and fails the kinds it is told to."""

    def __init__(self, failing: frozenset[RecordType] = frozenset()) -> None:
        self.failing = failing
        self.records: list[tuple[RecordType, dict[str, Any]]] = []

    def fence(self, attempt_id: str) -> None:
        return None

    async def record(self, kind: RecordType, record: Any) -> None:
        if kind in self.failing:
            raise StoreError("the database is away", code="STORE_UNAVAILABLE")
        self.records.append((kind, dict(record)))


async def test_each_step_reaches_the_mirror_after_the_device(
    tmp_path: Path, clock: ManualClock
) -> None:
    mirror = _Mirror()
    journal = await AttemptJournal.open(
        tmp_path / "journal", retain_days=7, clock=clock, mirror=mirror
    )
    try:
        await open_attempt(journal, 1, claimed=True)
        assert [kind for kind, _ in mirror.records] == [
            RecordType.ATTEMPT_OPENED,
            RecordType.GRANT_CLAIMED,
        ]
        day_file = next((tmp_path / "journal" / "attempts").glob("*.jsonl"))
        assert [line["record"] for line in read_lines(day_file)] == [
            "ATTEMPT_OPENED",
            "GRANT_CLAIMED",
        ]
        assert mirror.records[1][1]["grant_id"] == "g-1"
    finally:
        await journal.close()


async def test_a_grant_claim_the_shared_store_cannot_take_fails_the_append(
    tmp_path: Path, clock: ManualClock
) -> None:
    mirror = _Mirror(frozenset({RecordType.GRANT_CLAIMED}))
    journal = await AttemptJournal.open(
        tmp_path / "journal", retain_days=7, clock=clock, mirror=mirror
    )
    try:
        with pytest.raises(JournalError) as err:
            await open_attempt(journal, 2, claimed=True)
        # the seam turns this into FAILED_BEFORE_DISPATCH: the handler body never runs
        assert err.value.code == "JOURNAL_UNAVAILABLE"
        assert "STORE_UNAVAILABLE" in err.value.message
    finally:
        await journal.close()


async def test_an_opened_record_with_a_mirror_hands_back_its_fence(
    tmp_path: Path, clock: ManualClock
) -> None:
    """The fencing token the mirror keeps for the attempt is the value of ATTEMPT_OPENED (the
    attempt claims its grant under it, issue 29); without a mirror the value is None."""

    class Fencing(_Mirror):
        def fence(self, attempt_id: str) -> Any:
            return ("fence", attempt_id) if self.records else None

    journal = await AttemptJournal.open(
        tmp_path / "journal", retain_days=7, clock=clock, mirror=Fencing()
    )
    plain = await AttemptJournal.open(tmp_path / "plain", retain_days=7, clock=clock)
    try:
        intent = numbered_intent(1)
        fields = {"decision_id": "d", "dossier_id": "s", "caller": "agent-1"}
        fence = await journal.opened(attempt_id="a-1", **fields, **intent_fields(intent))
        assert fence == ("fence", "a-1")  # asked once the mirror holds the record
        assert await plain.opened(attempt_id="a-1", **fields, **intent_fields(intent)) is None
    finally:
        await journal.close()
        await plain.close()


# -- the append's awaitable (issue 32) ----------------------------------------------------------


async def test_without_a_mirror_or_a_span_an_append_is_the_writers_future(
    journal: AttemptJournal,
) -> None:
    """No journal frame waits on the fsync: the caller awaits the writer's future itself, and
    the record is on the device (and counted open) once it is done."""
    intent = numbered_intent(1)
    appended = journal.opened(
        attempt_id="a-1", decision_id="d", dossier_id="s", caller="agent-1", **intent_fields(intent)
    )
    assert isinstance(appended, asyncio.Future)
    assert await appended is None
    assert [r["record"] for r in read_lines(journal.path / f"{DAY}.jsonl")] == ["ATTEMPT_OPENED"]
    assert journal.open_count == 1
    closing = journal.closed(
        attempt_id="a-1", outcome="COMPLETED", executed=True, finalization="RECORDED"
    )
    assert isinstance(closing, asyncio.Future)
    await closing
    assert journal.open_count == 0
    refused = journal.closed(attempt_id="", outcome="COMPLETED", executed=True, finalization=None)
    assert isinstance(refused, asyncio.Future)  # refused before the writer: raises when awaited
    with pytest.raises(JournalError) as caught:
        await refused
    assert caught.value.code == "JOURNAL_RECORD_INVALID"


class _Span:
    def __init__(self) -> None:
        self.attributes: dict[str, object] = {}

    def set_attribute(self, key: str, value: object) -> None:
        self.attributes[key] = value


async def test_a_recording_span_covers_the_append_up_to_its_fsync(
    journal: AttemptJournal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside a traced request the append is a coroutine whose span is current over it and ends
    once the record is on the device; a refusal's code is on the span."""
    events: list[str] = []
    spans: list[_Span] = []

    @contextlib.contextmanager
    def span(name: str, attributes: Any, *, child_only: bool) -> Iterator[_Span]:
        assert (name, dict(attributes), child_only) == (
            "agentsafe.journal.append",
            {"agentsafe.record": "ATTEMPT_OPENED"},
            True,
        )
        spans.append(_Span())
        events.append("span starts")
        try:
            yield spans[-1]
        finally:
            events.append("span ends")

    real_fsync = os.fsync

    def noted_fsync(fd: int) -> None:
        real_fsync(fd)
        events.append("fsync")

    journal.span = span
    monkeypatch.setattr(journal_module.os, "fsync", noted_fsync)
    intent = numbered_intent(1)
    fields = {"decision_id": "d", "dossier_id": "s", "caller": "agent-1"}
    appended = journal.opened(attempt_id="a-1", **fields, **intent_fields(intent))
    assert not isinstance(appended, asyncio.Future)
    await appended
    assert events[0] == "span starts"
    assert events[-2:] == ["fsync", "span ends"]
    assert journal.open_count == 1
    await journal.close()
    with pytest.raises(JournalError):
        await journal.opened(attempt_id="a-2", **fields, **intent_fields(intent))
    assert spans[-1].attributes == {"agentsafe.code": "JOURNAL_CLOSED"}
    assert events[-1] == "span ends"


# -- the live count the metrics read -----------------------------------------------------------


async def test_the_live_open_count_agrees_with_a_scan_across_a_restart(
    tmp_path: Path, clock: ManualClock
) -> None:
    first = await AttemptJournal.open(tmp_path / "j", retain_days=7, clock=clock)
    await first.scan()
    for number in (1, 2, 3, 4):
        await open_attempt(first, number, claimed=number > 1)
    await first.closed(attempt_id="a-1", outcome="COMPLETED", executed=True, finalization=None)
    await first.closed(
        attempt_id="a-2", outcome="UNKNOWN_AFTER_DISPATCH", executed=None, finalization=None
    )  # recorded, still open
    await first.reconciled(attempt_id="a-3", status="STILL_UNKNOWN", by="RESTART")
    assert first.open_count == 3
    assert first.size_bytes() == sum(p.stat().st_size for p in first.path.glob("*.jsonl"))
    assert first.size_bytes() > 0
    await first.close()

    second = await AttemptJournal.open(tmp_path / "j", retain_days=7, clock=clock)
    try:
        assert second.open_count == 0  # not seeded before the first scan
        scan = await second.scan()
        assert second.open_count == len(scan.open_attempts) == 3
        await second.reconciled(attempt_id="a-4", status="UNCLAIMED", by="RESTART")
        await second.reconciled(attempt_id="a-3", status="NOT_EXECUTED", by="OPERATOR")
        assert second.open_count == 1
        assert [a.attempt_id for a in (await second.scan()).open_attempts] == ["a-2"]
        assert second.open_count == 1
    finally:
        await second.close()


async def test_a_reconciliation_by_the_lease_keeper_is_its_own_cause_and_read_back(
    journal: AttemptJournal, clock: ManualClock
) -> None:
    """Issue 31, item 5: the lease keeper's re-ask in a running process is journaled as LEASE,
    not RESTART, and a reader (the next start, or an offline look) accepts it and closes."""
    await open_attempt(journal, 1)
    await open_attempt(journal, 2)
    await journal.reconciled(attempt_id="a-1", status="COMPLETED", by="LEASE")
    await journal.reconciled(attempt_id="a-2", status="STILL_UNKNOWN", by="LEASE")
    records = read_lines(journal.path / f"{DAY}.jsonl")
    assert [r["by"] for r in records if r["record"] == "RECONCILED"] == ["LEASE", "LEASE"]
    await journal.close()
    reopened = await AttemptJournal.open(journal.path.parent, retain_days=7, clock=clock)
    try:
        attempts = {a.attempt_id: a for a in await reopened.open_attempts()}
        assert sorted(attempts) == ["a-2"]
        assert attempts["a-2"].last_status == ReconciledStatus.STILL_UNKNOWN
    finally:
        await reopened.close()
