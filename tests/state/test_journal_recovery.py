"""Reading the journal back after a crash: the edges mutation testing found untested (issue 23).

- An attempt that was only opened reads back with no grant: ``grant_claimed`` is ``False`` and
  the grant's fields and the last reconciliation are ``None`` (not a falsy stand-in: the restart
  reconciler and ``GET /v1/control/open-attempts`` print them as they are).
- A day file the crash left empty, or with one byte of a first record, is appended to cleanly:
  the empty file is not "torn", the lone byte is cut off and reported.
- An :class:`OpenAttempt` is immutable.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from agentsafe.executor.clock import ManualClock
from agentsafe.executor.state.journal import ATTEMPTS_DIR, AttemptJournal, TornLine, scan_journal

from .test_journal import DAY, NOW, open_attempt


async def test_an_attempt_only_opened_reads_back_with_no_grant(tmp_path: Path) -> None:
    journal = await AttemptJournal.open(tmp_path / "j", retain_days=2, clock=ManualClock(NOW))
    try:
        await open_attempt(journal, 1)
    finally:
        await journal.close()
    (attempt,) = scan_journal(tmp_path / "j", retain_days=2, now=NOW).open_attempts
    assert attempt.grant_claimed is False
    assert (attempt.grant_id, attempt.grant_expires_at, attempt.payload_digest) == (
        None,
        None,
        None,
    )
    assert attempt.last_status is None
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
