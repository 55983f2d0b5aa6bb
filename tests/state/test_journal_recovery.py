"""Reading the journal back after a crash: the edges mutation testing found untested (issue 23).

- An attempt that was only opened reads back with what was recorded (its intent id and hash, when
  and where it was opened) and no grant: ``grant_claimed`` is ``False`` and
  the grant's fields and the last reconciliation are ``None`` (not a falsy stand-in: the restart
  reconciler and ``GET /v1/control/open-attempts`` print them as they are).
- A day file the crash left empty, with one byte of a first record, or with a torn second record
  is appended to cleanly: the empty and the whole file are not "torn", a torn tail is cut off
  after the last complete line and reported with its line number and length.
- A damaged line's error says exactly what is wrong (each rule of the reader: JSON, an object, a
  known record type, a required field a non-empty string, an optional one a string or null, the
  closing and reconciliation values, an attempt opened once with its intent), and an unreadable
  journal says which part; null and text are what an optional field may hold.
- An :class:`OpenAttempt` is immutable.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from agentsafe.executor.clock import ManualClock
from agentsafe.executor.errors import JournalError
from agentsafe.executor.state.journal import ATTEMPTS_DIR, AttemptJournal, TornLine, scan_journal
from tests.support.intents import numbered_intent

from .test_journal import DAY, NOW, open_attempt


async def test_an_attempt_only_opened_reads_back_with_no_grant(tmp_path: Path) -> None:
    journal = await AttemptJournal.open(tmp_path / "j", retain_days=2, clock=ManualClock(NOW))
    try:
        await open_attempt(journal, 1)
    finally:
        await journal.close()
    (attempt,) = scan_journal(tmp_path / "j", retain_days=2, now=NOW).open_attempts
    intent = numbered_intent(1)
    assert (attempt.attempt_id, attempt.intent_id, attempt.intent_hash) == (
        "a-1",
        intent.intent_id,
        intent.intent_hash,
    )
    assert (attempt.opened_at, attempt.file) == (
        "2027-01-15T08:00:00.000Z",
        f"{ATTEMPTS_DIR}/{DAY}.jsonl",
    )
    assert attempt.grant_claimed is False
    assert (attempt.grant_id, attempt.grant_expires_at, attempt.payload_digest) == (
        None,
        None,
        None,
    )
    assert attempt.last_status is None
    assert attempt.closed_unknown is False  # nothing closed it, not even as UNKNOWN
    with pytest.raises(dataclasses.FrozenInstanceError):
        attempt.grant_claimed = True  # type: ignore[misc]


@pytest.mark.parametrize(
    ("left", "torn"), [(b"", ()), (b"{", (TornLine(f"{ATTEMPTS_DIR}/{DAY}.jsonl", 1, 1),))]
)
async def test_a_day_file_a_crash_left_empty_or_torn_at_its_first_byte(
    tmp_path: Path, left: bytes, torn: tuple[TornLine, ...]
) -> None:
    root = tmp_path / "j" / ATTEMPTS_DIR
    root.mkdir(parents=True, mode=0o700)
    day_file = root / f"{DAY}.jsonl"
    day_file.write_bytes(left)
    day_file.chmod(0o600)
    journal = await AttemptJournal.open(tmp_path / "j", retain_days=2, clock=ManualClock(NOW))
    try:
        await open_attempt(journal, 1)
        assert journal.repaired_torn_lines == torn
    finally:
        await journal.close()
    lines = day_file.read_bytes().split(b"\n")
    assert lines[-1] == b""
    assert [json.loads(line)["attempt_id"] for line in lines[:-1]] == ["a-1"]


async def test_a_torn_second_line_is_cut_and_the_first_kept(tmp_path: Path) -> None:
    first = await AttemptJournal.open(tmp_path / "j", retain_days=2, clock=ManualClock(NOW))
    try:
        await open_attempt(first, 1)
    finally:
        await first.close()
    day_file = tmp_path / "j" / ATTEMPTS_DIR / f"{DAY}.jsonl"
    whole = day_file.read_bytes()
    day_file.write_bytes(whole + b'{"record":"ATT')  # the crash tore the second record
    second = await AttemptJournal.open(tmp_path / "j", retain_days=2, clock=ManualClock(NOW))
    try:
        await open_attempt(second, 2)
        assert second.repaired_torn_lines == (
            TornLine(f"{ATTEMPTS_DIR}/{DAY}.jsonl", 2, len(b'{"record":"ATT')),
        )
    finally:
        await second.close()
    lines = day_file.read_bytes().split(b"\n")
    assert [json.loads(line)["attempt_id"] for line in lines[:-1]] == ["a-1", "a-2"]


async def test_a_whole_file_is_appended_to_without_a_repair(tmp_path: Path) -> None:
    for number in (1, 2):
        journal = await AttemptJournal.open(tmp_path / "j", retain_days=2, clock=ManualClock(NOW))
        try:
            await open_attempt(journal, number)
            assert journal.repaired_torn_lines == ()
        finally:
            await journal.close()
    day_file = tmp_path / "j" / ATTEMPTS_DIR / f"{DAY}.jsonl"
    lines = day_file.read_bytes().split(b"\n")
    assert [json.loads(line)["attempt_id"] for line in lines[:-1]] == ["a-1", "a-2"]


_CLAIM = b'"record":"GRANT_CLAIMED","at":"x","attempt_id":"a-1"'
_CLOSE = b'"record":"ATTEMPT_CLOSED","at":"x","attempt_id":"a-1"'
_OPEN = b'"record":"ATTEMPT_OPENED","at":"x","intent_hash":"h"'


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (b"not json", "not valid JSON"),
        (b"", "not valid JSON"),
        (b"[1,2]", "not a JSON object"),
        (b'{"record":"ATTEMPT_EXPLODED","at":"x","attempt_id":"a-9"}', "unknown record type"),
        (
            b'{"record":"RECONCILED","at":"x","attempt_id":"a","attempt_id":"b"}',
            "a key appears twice",
        ),
        (b"{" + _CLAIM + b',"n":NaN}', "a non-finite number"),
        (
            b"{" + _CLAIM + b',"n":' + b"1" * 4301 + b"}",
            "a number out of range",  # more digits than an int converts
        ),
        # A required field is a non-empty string: never null, never "", never absent.
        (
            b"{" + _CLAIM + b',"grant_id":null,"grant_expires_at":"t","payload_digest":"d"}',
            "field grant_id is missing or not a string",
        ),
        (b"{" + _CLOSE + b',"outcome":""}', "field outcome is missing or not a string"),
        (
            b'{"record":"RECONCILED","attempt_id":"a-1","status":"COMPLETED","by":"RESTART"}',
            "field at is missing or not a string",
        ),
        # An optional field is a string or null, never a number.
        (
            b"{" + _CLOSE + b',"outcome":"COMPLETED","finalization":7}',
            "field finalization is missing or not a string",
        ),
        (
            b"{" + _CLOSE + b',"outcome":"COMPLETED","executed":1}',
            "field executed is not a boolean or null",
        ),
        (
            b"{" + _CLOSE + b',"outcome":"COMPLETED","answer":[1]}',
            "field answer is not an object",
        ),
        (
            b'{"record":"RECONCILED","at":"x","attempt_id":"a-1","status":"MAYBE","by":"RESTART"}',
            "unknown reconciliation status or source",
        ),
        (
            b'{"record":"RECONCILED","at":"x","attempt_id":"a-1","status":"COMPLETED","by":"ME"}',
            "unknown reconciliation status or source",
        ),
        (b"{" + _OPEN + b',"attempt_id":"a-1","intent":{}}', "the attempt was opened twice"),
        (b"{" + _OPEN + b',"attempt_id":"a-9","intent":[]}', "field intent is not an object"),
    ],
)
async def test_a_damaged_line_says_exactly_what_is_wrong(
    tmp_path: Path, line: bytes, problem: str
) -> None:
    """The message is what an operator repairs the journal by: the file, the line, the rule."""
    journal = await AttemptJournal.open(tmp_path / "j", retain_days=1, clock=ManualClock(NOW))
    await open_attempt(journal, 1)
    await journal.close()
    day_file = journal.path / f"{DAY}.jsonl"
    day_file.write_bytes(day_file.read_bytes() + line + b"\n")
    with pytest.raises(JournalError) as caught:
        scan_journal(tmp_path / "j", retain_days=1, now=NOW)
    assert (caught.value.code, caught.value.message) == (
        "JOURNAL_CORRUPT",
        f"{ATTEMPTS_DIR}/{DAY}.jsonl line 2: {problem}",
    )


async def test_optional_fields_read_back_as_null_or_text(tmp_path: Path) -> None:
    """The other side of the rule: null and a string are what an optional field may hold."""
    journal = await AttemptJournal.open(tmp_path / "j", retain_days=1, clock=ManualClock(NOW))
    await open_attempt(journal, 1)
    await open_attempt(journal, 2)
    await journal.close()
    day_file = journal.path / f"{DAY}.jsonl"
    lines = [
        b"{" + _CLOSE + b',"outcome":"COMPLETED","executed":true,"finalization":null}',
        b'{"record":"RECONCILED","at":"x","attempt_id":"a-2","status":"STILL_UNKNOWN",'
        b'"by":"OPERATOR","reason":"asked the bank","decided_by":null}',
    ]
    day_file.write_bytes(day_file.read_bytes() + b"\n".join(lines) + b"\n")
    scan = scan_journal(tmp_path / "j", retain_days=1, now=NOW, wanted=frozenset({"a-1"}))
    (still,) = scan.open_attempts
    assert (still.attempt_id, still.last_status) == ("a-2", "STILL_UNKNOWN")
    settled = scan.settled["a-1"]
    assert (settled.outcome, settled.executed, settled.answer) == ("COMPLETED", True, None)


def test_a_journal_that_cannot_be_read_says_which_part(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / ATTEMPTS_DIR).write_bytes(b"")  # a file where the directory should be
    with pytest.raises(JournalError) as caught:
        scan_journal(tmp_path / "a", retain_days=1, now=NOW)
    assert (caught.value.code, caught.value.message) == (
        "JOURNAL_UNAVAILABLE",
        "the journal cannot be read: Not a directory",
    )
    (tmp_path / "b" / ATTEMPTS_DIR / f"{DAY}.jsonl").mkdir(parents=True)  # a directory, not a file
    with pytest.raises(JournalError) as caught:
        scan_journal(tmp_path / "b", retain_days=1, now=NOW)
    assert (caught.value.code, caught.value.message) == (
        "JOURNAL_UNAVAILABLE",
        f"{ATTEMPTS_DIR}/{DAY}.jsonl cannot be read: Is a directory",
    )


async def test_the_attempts_asked_for_read_back_how_each_was_opened_and_settled(
    tmp_path: Path,
) -> None:
    """``wanted`` ids: which were ever opened, and how each that finished was settled (a close,
    or a closing reconciliation); an id not asked for is never reported."""
    journal = await AttemptJournal.open(tmp_path / "j", retain_days=1, clock=ManualClock(NOW))
    for number in (1, 2, 3):
        await open_attempt(journal, number)
    await journal.reconciled(attempt_id="a-1", status="COMPLETED", by="RESTART")
    await journal.reconciled(attempt_id="a-3", status="NOT_EXECUTED", by="RESTART")
    await journal.close()
    wanted = frozenset({"a-1", "a-2", "a-9"})
    scan = scan_journal(tmp_path / "j", retain_days=1, now=NOW, wanted=wanted)
    assert scan.opened == frozenset({"a-1", "a-2"})
    assert set(scan.settled) == {"a-1"}
    assert (scan.settled["a-1"].status, scan.settled["a-1"].outcome) == ("COMPLETED", None)
    assert [a.attempt_id for a in scan.open_attempts] == ["a-2"]


async def test_a_grant_recorded_when_the_attempt_opened_reads_back(tmp_path: Path) -> None:
    journal = await AttemptJournal.open(tmp_path / "j", retain_days=1, clock=ManualClock(NOW))
    intent = numbered_intent(1)
    await journal.opened(
        attempt_id="a-1",
        intent_id=intent.intent_id,
        intent_hash=intent.intent_hash,
        decision_id="dec-1",
        dossier_id="dos-1",
        caller="agent-1",
        action=intent.action,
        binding=intent.binding,
        grant_id="g-1",
        grant_expires_at=NOW + 30,
    )
    await journal.close()
    (attempt,) = scan_journal(tmp_path / "j", retain_days=1, now=NOW).open_attempts
    assert (attempt.grant_id, attempt.grant_expires_at) == ("g-1", "2027-01-15T08:00:30.000Z")
