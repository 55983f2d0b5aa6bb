"""Reading the attempt journal: every day file, one line at a time, into what it says is open.

Role: :func:`scan_journal` reads ``EXECUTOR_JOURNAL_DIR/attempts`` (the days ``.days`` says were
written, and every day file present), checks each record's fields, and answers the attempts still
open, how the wanted ones were settled, torn last lines and missing days. Pure reading: it never
writes. ``state/journal.py`` is the journal's public face and re-exports :func:`scan_journal`.

Callers: ``state/journal.py`` (at open, ``scan``, ``prune``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..canonical import DuplicateKeyError, parse_json
from ..codes import Code
from ..errors import CanonicalizationError, JournalError
from .journalrecords import (
    ATTEMPTS_DIR,
    CLOSING_STATUSES,
    DAY_FILE,
    DAYS_FILE,
    OPTIONAL,
    REQUIRED,
    UNKNOWN_OUTCOME,
    JournalScan,
    OpenAttempt,
    ReconciledBy,
    ReconciledStatus,
    RecordType,
    Settled,
    TornLine,
)

__all__ = ["read_days", "scan_journal"]


def read_days(root: Path) -> list[str]:
    try:
        text = (root / DAYS_FILE).read_text(encoding="ascii", errors="replace")
    except FileNotFoundError:
        return []
    return [d for d in dict.fromkeys(text.split()) if DAY_FILE.match(d + ".jsonl")]


def scan_journal(
    directory: Path, *, retain_days: int, now: float, wanted: frozenset[str] = frozenset()
) -> JournalScan:
    """Read every day file in ``directory/attempts``, one line at a time, oldest day first.

    ``retain_days`` (as of ``now``) is kept in the signature for the callers that prune; nothing
    present on disk is skipped, so an attempt opened before the window is never silently lost.
    For the attempt ids in ``wanted`` the scan also says whether each was opened and how it was
    settled. Raises :class:`JournalError` ``JOURNAL_CORRUPT`` naming the file and line of a
    damaged record; a torn last line is returned in ``torn_lines`` instead.
    """
    del retain_days, now  # every present day is read; see :func:`_prune_days` for retention
    root = directory / ATTEMPTS_DIR
    try:
        names = sorted(name for name in os.listdir(root) if DAY_FILE.match(name))
    except FileNotFoundError:
        return JournalScan((), ())
    except OSError as exc:
        raise JournalError(
            f"the journal cannot be read: {exc.strerror}", code=Code.JOURNAL_UNAVAILABLE
        ) from None
    present = {name[: -len(".jsonl")] for name in names}
    missing = tuple(day for day in read_days(root) if day not in present)
    builder = _Builder(wanted)
    torn: list[TornLine] = []
    for name in names:
        label = f"{ATTEMPTS_DIR}/{name}"
        try:
            with open(root / name, "rb") as handle:
                for number, line in enumerate(handle, start=1):
                    if not line.endswith(b"\n"):  # the unterminated last line: a torn write
                        torn.append(TornLine(file=label, line=number, length=len(line)))
                        break
                    try:
                        builder.add(_parse_line(line[:-1]), label)
                    except _Damaged as damaged:
                        raise JournalError(
                            f"{label} line {number}: {damaged}", code=Code.JOURNAL_CORRUPT
                        ) from None
        except OSError as exc:
            raise JournalError(
                f"{label} cannot be read: {exc.strerror}", code=Code.JOURNAL_UNAVAILABLE
            ) from None
    return JournalScan(
        builder.open_attempts(),
        tuple(torn),
        settled=dict(builder.settled),
        opened=frozenset(builder.opened_wanted),
        missing_days=missing,
        day_files=tuple(f"{ATTEMPTS_DIR}/{name}" for name in names),
    )


class _Damaged(Exception):
    pass


def _parse_line(line: bytes) -> dict[str, Any]:
    try:
        value = parse_json(line)
    except DuplicateKeyError:
        raise _Damaged("a key appears twice") from None
    except CanonicalizationError as exc:
        raise _Damaged(
            "a non-finite number" if exc.code == Code.NUMBER_NOT_FINITE else "a number out of range"
        ) from None
    except (ValueError, RecursionError):
        raise _Damaged("not valid JSON") from None
    if not isinstance(value, dict):
        raise _Damaged("not a JSON object")
    return value


def _text(record: Mapping[str, Any], name: str, *, optional: bool = False) -> str | None:
    """A required field is a non-empty string; an optional one is a string or null."""
    value = record.get(name)
    if optional and (value is None or isinstance(value, str)):
        return value
    if not isinstance(value, str) or not value:
        raise _Damaged(f"field {name} is missing or not a string")
    return value


class _Builder:
    """Folds records, in file order, into the set of open attempts."""

    def __init__(self, wanted: frozenset[str] = frozenset()) -> None:
        self._open: dict[str, dict[str, Any]] = {}
        self._seen: set[str] = set()
        self._wanted = wanted
        self.settled: dict[str, Settled] = {}
        self.opened_wanted: set[str] = set()

    def add(self, record: dict[str, Any], label: str) -> None:
        try:
            kind = RecordType(str(record.get("record")))
        except ValueError:
            raise _Damaged("unknown record type") from None
        _text(record, "at")
        for name in REQUIRED[kind]:
            _text(record, name)
        for name in OPTIONAL[kind]:
            _text(record, name, optional=True)
        attempt_id: str = record["attempt_id"]
        if kind is RecordType.ATTEMPT_OPENED:
            self._opened(attempt_id, record, label)
            return
        state = self._open.get(attempt_id)
        if kind is RecordType.GRANT_CLAIMED:
            if state is not None:
                state["grant_claimed"] = True
                for name in ("grant_id", "grant_expires_at", "payload_digest"):
                    state[name] = record[name]
        elif kind is RecordType.ATTEMPT_CLOSED:
            if not isinstance(record.get("executed"), bool | None):
                raise _Damaged("field executed is not a boolean or null")
            answer = record.get("answer")
            if answer is not None and not isinstance(answer, dict):
                raise _Damaged("field answer is not an object")
            if record["outcome"] != UNKNOWN_OUTCOME:
                self._open.pop(attempt_id, None)
                if attempt_id in self._wanted:
                    self.settled[attempt_id] = Settled(
                        attempt_id,
                        outcome=record["outcome"],
                        executed=record.get("executed"),
                        answer=answer,
                    )
            elif state is not None:
                state["closed_unknown"] = True
        else:
            try:
                status = ReconciledStatus(str(record.get("status")))
                ReconciledBy(str(record.get("by")))
            except ValueError:
                raise _Damaged("unknown reconciliation status or source") from None
            if status in CLOSING_STATUSES:
                self._open.pop(attempt_id, None)
                if attempt_id in self._wanted:
                    self.settled[attempt_id] = Settled(attempt_id, status=status.value)
            elif state is not None:
                state["last_status"] = status.value

    def _opened(self, attempt_id: str, record: dict[str, Any], label: str) -> None:
        if attempt_id in self._seen:
            raise _Damaged("the attempt was opened twice")
        binding = record.get("intent")
        if not isinstance(binding, dict):
            raise _Damaged("field intent is not an object")
        self._seen.add(attempt_id)
        if attempt_id in self._wanted:
            self.opened_wanted.add(attempt_id)
        self._open[attempt_id] = {
            "intent_id": record.get("intent_id"),
            "decision_id": record.get("decision_id"),
            "dossier_id": record.get("dossier_id"),
            "principal": record.get("caller"),
            "action": record.get("action"),
            "grant_id": record.get("grant_id"),
            "grant_expires_at": record.get("grant_expires_at"),
            "attempt_id": attempt_id,
            "intent_hash": record["intent_hash"],
            "binding": binding,
            "opened_at": record["at"],
            "file": label,
        }

    def open_attempts(self) -> tuple[OpenAttempt, ...]:
        return tuple(OpenAttempt(**state) for state in self._open.values())
