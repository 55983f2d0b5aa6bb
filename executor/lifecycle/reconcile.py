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
                            record disagrees with it; nothing is asked
UNCLAIMED                   no GRANT_CLAIMED: the provider was never reached; the      closed
                            authority's lease owns the grant; nothing is asked
RECONCILED_COMPLETED        the provider says it acted                                 closed
RECONCILED_NOT_EXECUTED     the provider says it did not                               closed
STILL_UNKNOWN               the provider cannot say, failed, or did not answer in time open
==========================  =========================================================  =========

Each resolution is written to the journal as RECONCILED (by RESTART) and emitted as one
``RECONCILIATION`` evidence event naming the attempt, its intent hash and the resolution, never
its parameters. A journal that cannot take the RECONCILED record leaves the attempt open (it is
asked again next start) and says so on the security stream; a torn journal line found while
reading is reported there too. A journal with a damaged line raises ``JOURNAL_CORRUPT``: the
caller decides whether to start.

Callers: ``lifecycle/leases.py`` (an attempt taken over from a lapsed lease), ``plane.py`` at
start (then it updates idempotency records from the returned
:class:`Resolution` list), ``GET /ready`` counts (through the journal).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from ..dispatch.seam import ReconcileResult, ReconcileStatus
from ..errors import AgentSafeError, JournalError
from ..events import Streams
from ..intent import execution_payload_digest, intent_hash
from ..state.journal import AttemptJournal, OpenAttempt, ReconciledBy, ReconciledStatus

__all__ = [
    "ReconcileResult",
    "ReconcileStatus",
    "Reconciler",
    "Resolution",
    "ResolutionStatus",
    "reconcile_attempt",
    "reconcile_open_attempts",
]

DEFAULT_TIMEOUT_S = 30.0


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
) -> list[Resolution]:
    """Resolve every open attempt in journal order (see the module docstring).

    With a shared store, ``gate`` takes each attempt for this replica first (one row lock) and
    says False for one another replica holds or already resolved: it is left alone here.
    """
    scan = await journal.scan()
    for torn in scan.torn_lines:
        streams.security.emit(
            "JOURNAL_TORN_LINE", {"file": torn.file, "line": torn.line, "length": torn.length}
        )
    resolutions: list[Resolution] = []
    for attempt in scan.open_attempts:
        if gate is not None and not await gate(attempt):
            continue
        resolutions.append(
            await reconcile_attempt(
                attempt, journal, reconciler=reconciler, streams=streams, timeout_s=timeout_s
            )
        )
    return resolutions


async def reconcile_attempt(
    attempt: OpenAttempt,
    journal: AttemptJournal,
    *,
    reconciler: Reconciler,
    streams: Streams,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Resolution:
    """Resolve one open attempt read-only, record RECONCILED (by RESTART) and emit it; the same
    path for this process's own journal at start and for an attempt taken over from a replica
    whose lease lapsed (``lifecycle/leases.py``)."""
    resolution = await _resolve(attempt, reconciler=reconciler, timeout_s=timeout_s)
    await _record(journal, resolution, streams)
    _emit(attempt, resolution, streams)
    return resolution


async def _resolve(attempt: OpenAttempt, *, reconciler: Reconciler, timeout_s: float) -> Resolution:
    def resolved(status: ResolutionStatus, result: ReconcileResult | None = None) -> Resolution:
        return Resolution(
            attempt_id=attempt.attempt_id,
            resolution=status,
            intent_binding=attempt.binding,
            intent_hash=attempt.intent_hash,
            idempotency_key=attempt.idempotency_key,
            principal=attempt.principal,
            tenant=attempt.tenant,
            result=result,
        )

    action = _binding_consistent(attempt)
    if action is None or attempt.idempotency_key is None:
        return resolved(ResolutionStatus.BINDING_MISMATCH)
    if not attempt.grant_claimed:
        return resolved(ResolutionStatus.UNCLAIMED)
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
        return resolved(ResolutionStatus.RECONCILED_COMPLETED, answer)
    if answer.status is ReconcileStatus.NOT_EXECUTED:
        return resolved(ResolutionStatus.RECONCILED_NOT_EXECUTED, answer)
    return resolved(ResolutionStatus.STILL_UNKNOWN, answer)


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


async def _record(journal: AttemptJournal, resolution: Resolution, streams: Streams) -> None:
    try:
        await journal.reconciled(
            attempt_id=resolution.attempt_id,
            status=_JOURNAL_STATUS[resolution.resolution],
            by=ReconciledBy.RESTART,
        )
    except JournalError as exc:
        streams.security.emit(
            "RECONCILIATION_NOT_RECORDED",
            {"attempt_id": resolution.attempt_id, "code": exc.code},
        )


def _emit(attempt: OpenAttempt, resolution: Resolution, streams: Streams) -> None:
    fields: dict[str, Any] = {
        "attempt_id": attempt.attempt_id,
        "intent_hash": attempt.intent_hash,
        "resolution": resolution.resolution.value,
        "by": ReconciledBy.RESTART.value,
    }
    if resolution.result is not None and resolution.result.reason_code is not None:
        fields["reason_code"] = resolution.result.reason_code
    streams.evidence.emit("RECONCILIATION", fields)
    if resolution.resolution is ResolutionStatus.BINDING_MISMATCH:
        streams.security.emit(
            "JOURNAL_BINDING_MISMATCH",
            {"attempt_id": attempt.attempt_id, "file": attempt.file},
        )
