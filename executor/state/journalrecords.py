"""The attempt journal's records: their types, required fields and what a scan answers.

Role: the vocabulary the journal writes and reads (``RecordType``, the reconciled statuses, the
fields each record needs), the files under ``EXECUTOR_JOURNAL_DIR/attempts``, the values a scan
answers (:class:`OpenAttempt`, :class:`Settled`, :class:`JournalScan`) and the protocol of the
shared store's mirror (:class:`AttemptMirror`). ``state/journal.py`` is the journal's public face
and re-exports the public names.

Callers: ``state/journal.py`` (the appends), ``state/journalwriter.py`` (the writer thread),
``state/journalscan.py`` (the reader).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Final, Protocol

if TYPE_CHECKING:
    from .records import AttemptFence

ATTEMPTS_DIR = "attempts"
MAX_RECORD_BYTES = 256 * 1024
DAY_FILE = re.compile(r"^(\d{4}-\d{2}-\d{2})\.jsonl$")
LOCK_FILE = ".lock"
UNKNOWN_OUTCOME = "UNKNOWN_AFTER_DISPATCH"


class RecordType(StrEnum):
    ATTEMPT_OPENED = "ATTEMPT_OPENED"
    GRANT_CLAIMED = "GRANT_CLAIMED"
    ATTEMPT_CLOSED = "ATTEMPT_CLOSED"
    RECONCILED = "RECONCILED"


class ReconciledStatus(StrEnum):
    COMPLETED = "COMPLETED"
    NOT_EXECUTED = "NOT_EXECUTED"
    STILL_UNKNOWN = "STILL_UNKNOWN"
    UNCLAIMED = "UNCLAIMED"
    BINDING_MISMATCH = "BINDING_MISMATCH"


class ReconciledBy(StrEnum):
    RESTART = "RESTART"  # startup reconciliation of this process's own journal
    LEASE = "LEASE"  # the lease keeper, in a running process (``lifecycle/leases.py``)
    RECHECK = "RECHECK"  # a running process's own re-ask (``Executor.recheck_unknown``)
    CALLER = "CALLER"
    OPERATOR = "OPERATOR"  # a person recorded a decision (``POST /v1/control/open-attempts/...``)


CLOSING_STATUSES = frozenset(
    {ReconciledStatus.COMPLETED, ReconciledStatus.NOT_EXECUTED, ReconciledStatus.UNCLAIMED}
)
"""RECONCILED statuses that close an attempt; STILL_UNKNOWN and BINDING_MISMATCH keep it open."""

# What the writer insists on and the reader checks: the two must agree.
REQUIRED: dict[RecordType, tuple[str, ...]] = {
    RecordType.ATTEMPT_OPENED: ("attempt_id", "intent_hash"),
    RecordType.GRANT_CLAIMED: ("attempt_id", "grant_id", "grant_expires_at", "payload_digest"),
    RecordType.ATTEMPT_CLOSED: ("attempt_id", "outcome"),
    RecordType.RECONCILED: ("attempt_id", "status", "by"),
}
SHARED_STORE: Final = "shared"
"""GRANT_CLAIMED's ``store`` when the claim was acknowledged by the shared store."""

OPTIONAL: dict[RecordType, tuple[str, ...]] = {
    RecordType.ATTEMPT_OPENED: (
        "intent_id",
        "decision_id",
        "dossier_id",
        "caller",
        "action",
        "grant_id",
        "grant_expires_at",
    ),
    # "store": "shared" when the claim was acknowledged by the shared store (issue 29: only those
    # are the lost-writes check's witnesses; a claim made on SQLite before the journal served a
    # shared store never was in that database)
    RecordType.GRANT_CLAIMED: ("store",),
    RecordType.ATTEMPT_CLOSED: ("finalization",),
    RecordType.RECONCILED: ("reason", "decided_by"),
}
IDENTITY_FILE = ".identity"
DAYS_FILE = ".days"


@dataclass(frozen=True)
class TornLine:
    """An unterminated last line: a write the crash interrupted (never acknowledged)."""

    file: str  # e.g. "attempts/2026-08-14.jsonl"
    line: int  # 1-based line number
    length: int  # bytes


@dataclass(frozen=True)
class OpenAttempt:
    """An attempt the journal cannot call finished, with what was recorded about it."""

    attempt_id: str
    intent_id: str | None
    intent_hash: str
    decision_id: str | None
    dossier_id: str | None
    principal: str | None  # the caller recorded in ATTEMPT_OPENED
    action: str | None
    binding: Mapping[str, Any]  # the captured intent binding as stored (not trusted: re-hash)
    opened_at: str
    file: str
    grant_claimed: bool = False
    grant_id: str | None = None
    grant_expires_at: str | None = None
    payload_digest: str | None = None
    last_status: str | None = None  # the last non-closing RECONCILED status, if any
    closed_unknown: bool = False  # an ATTEMPT_CLOSED said UNKNOWN_AFTER_DISPATCH

    @property
    def tenant(self) -> str | None:
        value = self.binding.get("tenant_id")
        return value if isinstance(value, str) else None

    @property
    def idempotency_key(self) -> str | None:
        value = self.binding.get("idempotency_key")
        return value if isinstance(value, str) else None


@dataclass(frozen=True)
class Settled:
    """How a finished attempt ended, as the journal recorded it (asked for by attempt id)."""

    attempt_id: str
    outcome: str | None = None  # ATTEMPT_CLOSED's outcome
    executed: bool | None = None
    answer: Mapping[str, Any] | None = None  # the answer the caller was given, when recorded
    status: str | None = None  # a closing RECONCILED status (COMPLETED, NOT_EXECUTED, UNCLAIMED)


@dataclass(frozen=True)
class JournalScan:
    open_attempts: tuple[OpenAttempt, ...]
    torn_lines: tuple[TornLine, ...]
    settled: Mapping[str, Settled] = field(default_factory=dict)  # of the ids asked for
    opened: frozenset[str] = frozenset()  # of the ids asked for, those ever opened
    missing_days: tuple[str, ...] = ()  # day files the writer created that are gone
    day_files: tuple[str, ...] = ()  # every day file read, oldest first


class AttemptMirror(Protocol):
    """Where each journaled step is also written (the shared store's open-attempt state)."""

    async def record(self, kind: RecordType, record: Mapping[str, Any]) -> None: ...

    def fence(self, attempt_id: str) -> AttemptFence | None:
        """The fencing token of an attempt this process holds (issue 29), if the mirror keeps
        leases; the attempt's grant claim is made under it."""
        ...
