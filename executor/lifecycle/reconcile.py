"""Startup reconciliation: resolve what the last process left open, without re-executing it.

Role: before the listener accepts a connection, every attempt the journal still holds open is
resolved as far as the provider can say. Each stored intent is re-hashed rather than trusted,
and only then is the provider asked, through the handler's read-only ``reconcile``, what it did
with the intent's idempotency key. The :class:`Reconciler` protocol has no execute path, so
nothing here can run an action again.

==========================  =========================================================  =========
resolution                  when                                                       attempt
==========================  =========================================================  =========
BINDING_MISMATCH            the stored intent no longer hashes to its record, or the   open
                            record disagrees with it, or the caller recorded beside
                            it (outside the hash) is not the one the use store's
                            idempotency record names; nothing is asked
UNCLAIMED                   no GRANT_CLAIMED, and the use store never recorded the     closed
                            grant's claim: the provider was never reached
RECONCILED_COMPLETED        the provider says it acted                                 closed
RECONCILED_NOT_EXECUTED     the provider says it did not, and the dispatch can no      closed
                            longer land (now is past the grant's expiry plus the
                            dispatch deadline)
STILL_UNKNOWN               the provider cannot say, failed, did not answer in time,   open
                            or said "not executed" while the dispatch could still
                            land (RECONCILE_TOO_EARLY)
==========================  =========================================================  =========

Before anything is called UNCLAIMED the use store is asked whether the grant recorded in
ATTEMPT_OPENED was claimed: a journal whose GRANT_CLAIMED was cut or damaged must never free a
key the provider may have acted on, so on disagreement the provider is asked
(RECONCILE_STORE_DISAGREES) and its answer decides. Lookups run concurrently, at most
``concurrency`` at a time, each bounded by ``timeout_s``.

Each resolution is written to the journal as RECONCILED (by RESTART at start; by LEASE from the
lease keeper, by RECHECK from ``Executor.recheck_unknown``, in a running process) and emitted as one
``RECONCILIATION`` evidence event naming the attempt, its intent hash and the resolution, never
its parameters. A journal that cannot take the RECONCILED record leaves the attempt open (it is
asked again next start) and says so on the security stream; a torn journal line found while
reading is reported there too. A journal with a damaged line raises ``JOURNAL_CORRUPT``: the
caller decides whether to start.

Callers: ``lifecycle/leases.py`` (an attempt taken over from a lapsed lease), ``plane.py`` at
start (then it updates idempotency records from the returned
:class:`Resolution` list), ``GET /ready`` counts (through the journal).
Also imported by ``tools/demo.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from ..clock import parse_ms
from ..codes import Code
from ..dispatch.seam import ReconcileResult, ReconcileStatus
from ..errors import AgentSafeError, JournalError
from ..events import Streams
from ..intent import execution_payload_digest, intent_hash
from ..state.journal import AttemptJournal, JournalScan, OpenAttempt, ReconciledBy, ReconciledStatus
from ..state.records import OrphanKey

__all__ = [
    "Checks",
    "ClaimRecords",
    "ReconcileResult",
    "ReconcileStatus",
    "Reconciler",
    "Resolution",
    "ResolutionStatus",
    "reconcile_attempt",
    "reconcile_open_attempts",
    "report_scan",
]

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_CONCURRENCY = 8


class ResolutionStatus(StrEnum):
    RECONCILED_COMPLETED = "RECONCILED_COMPLETED"
    RECONCILED_NOT_EXECUTED = "RECONCILED_NOT_EXECUTED"
    STILL_UNKNOWN = "STILL_UNKNOWN"
    UNCLAIMED = "UNCLAIMED"
    BINDING_MISMATCH = "BINDING_MISMATCH"


_JOURNAL_STATUS = {
    ResolutionStatus.RECONCILED_COMPLETED: ReconciledStatus.COMPLETED,
    ResolutionStatus.RECONCILED_NOT_EXECUTED: ReconciledStatus.NOT_EXECUTED,
    ResolutionStatus.STILL_UNKNOWN: ReconciledStatus.STILL_UNKNOWN,
    ResolutionStatus.UNCLAIMED: ReconciledStatus.UNCLAIMED,
    ResolutionStatus.BINDING_MISMATCH: ReconciledStatus.BINDING_MISMATCH,
}


class Reconciler(Protocol):
    """The read path of the handler registry (``seam.Registry`` implements it)."""

    async def reconcile(
        self, action: str, idempotency_key: str, *, intent_hash: str
    ) -> ReconcileResult: ...


class ClaimRecords(Protocol):
    """What the use store knows about an attempt (``UseStore`` implements it)."""

    async def grant_claimed(self, grant_id: str) -> bool: ...

    async def idempotency_for_attempt(self, attempt_id: str) -> OrphanKey | None: ...


@dataclass(frozen=True)
class Checks:
    """What reconciliation cross-checks an attempt against, beyond the journal itself.

    ``store``: the use store (grant claims, the idempotency record naming the caller);
    ``now`` and ``settle_margin_s``: "not executed" is concluded only at or after the grant's
    expiry plus this margin (the dispatch deadline)."""

    store: ClaimRecords | None = None
    now: Callable[[], float] | None = None
    settle_margin_s: float = 0.0


@dataclass(frozen=True)
class Resolution:
    """How one open attempt was resolved, with what the caller needs to update idempotency."""

    attempt_id: str
    resolution: ResolutionStatus
    intent_binding: Mapping[str, Any]
    intent_hash: str  # as recorded in the journal
    idempotency_key: str | None
    principal: str | None
    tenant: str | None
    result: ReconcileResult | None = None  # the provider's answer, when it was asked
    reason_code: str | None = None  # why, when the journal alone did not decide

    @property
    def closed(self) -> bool:
        return _JOURNAL_STATUS[self.resolution] in {
            ReconciledStatus.COMPLETED,
            ReconciledStatus.NOT_EXECUTED,
            ReconciledStatus.UNCLAIMED,
        }


async def reconcile_open_attempts(
    journal: AttemptJournal,
    *,
    reconciler: Reconciler,
    streams: Streams,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    gate: Callable[[OpenAttempt], Awaitable[bool]] | None = None,
    checks: Checks = Checks(),
    scan: JournalScan | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> list[Resolution]:
    """Resolve every open attempt (see the module docstring), at most ``concurrency`` lookups
    at a time; the list is in journal order.

    With a shared store, ``gate`` takes each attempt for this replica first (one row lock) and
    says False for one another replica holds or already resolved: it is left alone here.
    ``scan`` is a scan the caller already made (it then reports torn lines itself).
    """
    if scan is None:
        scan = await journal.scan()
        report_scan(scan, streams)
    bound = asyncio.Semaphore(max(1, concurrency))

    async def one(attempt: OpenAttempt) -> Resolution | None:
        async with bound:
            if gate is not None and not await gate(attempt):
                return None
            return await reconcile_attempt(
                attempt,
                journal,
                reconciler=reconciler,
                streams=streams,
                timeout_s=timeout_s,
                checks=checks,
            )

    results = await asyncio.gather(*(one(attempt) for attempt in scan.open_attempts))
    return [r for r in results if r is not None]


def report_scan(scan: JournalScan, streams: Streams) -> None:
    """Torn lines and missing day files on the security stream (never silently lost)."""
    for torn in scan.torn_lines:
        streams.security.emit(
            "JOURNAL_TORN_LINE", {"file": torn.file, "line": torn.line, "length": torn.length}
        )
    for day in scan.missing_days:
        streams.security.emit("JOURNAL_DAY_FILE_MISSING", {"file": f"attempts/{day}.jsonl"})


async def reconcile_attempt(
    attempt: OpenAttempt,
    journal: AttemptJournal,
    *,
    reconciler: Reconciler,
    streams: Streams,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    checks: Checks = Checks(),
    by: ReconciledBy = ReconciledBy.RESTART,
) -> Resolution:
    """Resolve one open attempt read-only, record RECONCILED and emit it; the same path for this
    process's own journal at start (``by`` RESTART) and for an attempt the lease keeper took
    over or asks about again in a running process (``by`` LEASE, ``lifecycle/leases.py``)."""
    resolution = await _resolve(attempt, reconciler=reconciler, timeout_s=timeout_s, checks=checks)
    await _record(journal, resolution, streams, by)
    _emit(attempt, resolution, streams, by)
    return resolution


async def _resolve(
    attempt: OpenAttempt, *, reconciler: Reconciler, timeout_s: float, checks: Checks
) -> Resolution:
    def resolved(
        status: ResolutionStatus,
        result: ReconcileResult | None = None,
        reason: str | None = None,
    ) -> Resolution:
        return Resolution(
            attempt_id=attempt.attempt_id,
            resolution=status,
            intent_binding=attempt.binding,
            intent_hash=attempt.intent_hash,
            idempotency_key=attempt.idempotency_key,
            principal=attempt.principal,
            tenant=attempt.tenant,
            result=result,
            reason_code=reason or (result.reason_code if result is not None else None),
        )

    action = _binding_consistent(attempt)
    if action is None or attempt.idempotency_key is None:
        return resolved(ResolutionStatus.BINDING_MISMATCH)
    reason: str | None = None
    try:
        if checks.store is not None and not await _caller_consistent(attempt, checks.store):
            return resolved(ResolutionStatus.BINDING_MISMATCH)
        if not attempt.grant_claimed:
            claimed = (
                attempt.grant_id is not None
                and checks.store is not None
                and await checks.store.grant_claimed(attempt.grant_id)
            )
            if not claimed:
                return resolved(ResolutionStatus.UNCLAIMED)
            reason = Code.RECONCILE_STORE_DISAGREES  # the journal lost its GRANT_CLAIMED
    except AgentSafeError:  # the store cannot say: never call it unclaimed
        return resolved(ResolutionStatus.STILL_UNKNOWN, reason=Code.STORE_UNAVAILABLE)
    try:
        answer: object = await asyncio.wait_for(
            reconciler.reconcile(action, attempt.idempotency_key, intent_hash=attempt.intent_hash),
            timeout=timeout_s,
        )
    except Exception:  # a provider that failed or never answered cannot say
        return resolved(ResolutionStatus.STILL_UNKNOWN)
    if not isinstance(answer, ReconcileResult):
        return resolved(ResolutionStatus.STILL_UNKNOWN)
    if answer.status is ReconcileStatus.COMPLETED:
        return resolved(ResolutionStatus.RECONCILED_COMPLETED, answer, reason)
    if answer.status is ReconcileStatus.NOT_EXECUTED:
        if not _dispatch_settled(attempt, checks):
            return resolved(ResolutionStatus.STILL_UNKNOWN, answer, Code.RECONCILE_TOO_EARLY)
        return resolved(ResolutionStatus.RECONCILED_NOT_EXECUTED, answer, reason)
    return resolved(ResolutionStatus.STILL_UNKNOWN, answer, reason)


def _dispatch_settled(attempt: OpenAttempt, checks: Checks) -> bool:
    """Whether a dispatch of ``attempt`` can no longer land: now is at or past the grant's
    expiry plus the dispatch deadline (a lookup before then may lag the provider's commit)."""
    if checks.now is None or attempt.grant_expires_at is None:
        return True
    try:
        expires = parse_ms(attempt.grant_expires_at)
    except ValueError:
        return False
    return checks.now() >= expires + checks.settle_margin_s


async def _caller_consistent(attempt: OpenAttempt, store: ClaimRecords) -> bool:
    """The caller, tenant and key recorded beside the hash agree with the use store's
    idempotency record for this attempt (when the store still keeps one)."""
    record = await store.idempotency_for_attempt(attempt.attempt_id)
    if record is None:
        return True
    key = attempt.idempotency_key
    return (
        record.principal == attempt.principal
        and record.tenant == attempt.tenant
        and (record.key == key or record.key.startswith("approval:"))
    )


def _binding_consistent(attempt: OpenAttempt) -> str | None:
    """The binding's action type if the stored intent still hashes to its record and agrees with
    the other fields recorded beside it; ``None`` if anything disagrees."""
    binding = attempt.binding
    try:
        if intent_hash(binding) != attempt.intent_hash:
            return None
        action = binding["action"]
        action_type, parameters = action["type"], action["parameters"]
        if not isinstance(action_type, str) or not isinstance(parameters, Mapping):
            return None
        if attempt.grant_claimed and attempt.payload_digest != execution_payload_digest(parameters):
            return None
    except (AgentSafeError, KeyError, TypeError):
        return None
    if attempt.action is not None and attempt.action != action_type:
        return None
    if attempt.intent_id is not None and attempt.intent_id != binding.get("intent_id"):
        return None
    return action_type


async def _record(
    journal: AttemptJournal, resolution: Resolution, streams: Streams, by: ReconciledBy
) -> None:
    try:
        await journal.reconciled(
            attempt_id=resolution.attempt_id,
            status=_JOURNAL_STATUS[resolution.resolution],
            by=by,
        )
    except JournalError as exc:
        streams.security.emit(
            "RECONCILIATION_NOT_RECORDED",
            {"attempt_id": resolution.attempt_id, "code": exc.code},
        )


def _emit(attempt: OpenAttempt, resolution: Resolution, streams: Streams, by: ReconciledBy) -> None:
    fields: dict[str, Any] = {
        "attempt_id": attempt.attempt_id,
        "intent_hash": attempt.intent_hash,
        "resolution": resolution.resolution.value,
        "by": by.value,
    }
    if resolution.result is not None and resolution.result.reason_code is not None:
        fields["reason_code"] = resolution.result.reason_code
    if resolution.reason_code is not None:
        fields["reason_code"] = resolution.reason_code
    streams.evidence.emit("RECONCILIATION", fields)
    if resolution.resolution is ResolutionStatus.BINDING_MISMATCH:
        streams.security.emit(
            "JOURNAL_BINDING_MISMATCH",
            {"attempt_id": attempt.attempt_id, "file": attempt.file},
        )
