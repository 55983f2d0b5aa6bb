"""Attempt leases: every open attempt has one live owner, and a dead owner's attempts are taken.

Role: with a shared store, each attempt a replica opens is owned by it under a lease of
``EXECUTOR_ATTEMPT_LEASE_SECONDS`` (on the database's clock). :class:`LeaseKeeper` runs in every
replica; each tick (a third of the lease):

1. writes again the closes the shared store missed (``SharedAttemptMirror.flush``);
2. renews the lease of every attempt this replica still holds open (``SharedAttemptMirror.renew``:
   the local lease deadline of each attempt moves on only when the database renewed it at the
   epoch this replica holds, so a replica whose attempt was taken over never sends for it);
3. takes, one at a time, an open attempt whose lease lapsed -- the row is locked ``FOR UPDATE
   SKIP LOCKED`` and its owner changed and its fencing token (``epoch``) incremented in the same
   transaction, so two replicas never reconcile the same attempt and the previous owner can no
   longer claim its grant -- and resolves it read-only exactly as startup reconciliation does
   (``lifecycle/reconcile.py``), then hands the resolution to the same idempotency settlement, so
   a caller retrying the key on any replica gets that one recorded answer;
4. asks again, at most once per lease, about every attempt this replica owns whose last
   resolution was STILL_UNKNOWN -- one it took over, or one of its own journal that startup
   reconciliation could not resolve -- through the same read-only resolution, until the provider
   says what happened. A taken-over attempt is therefore never left waiting for its new owner to
   die: the new owner keeps asking while it lives.

At start, :meth:`LeaseKeeper.gate` takes each attempt of this replica's own journal before it is
reconciled, and leaves alone one another replica holds under a live lease or already resolved.

A database that fails makes a tick do nothing; the next tick tries again. A provider lookup is
given at most one tick's interval, so a lookup that hangs never keeps the leases from renewing.

Callers: ``assembly.py`` (builds one with a shared store), ``plane.py`` (runs
:meth:`LeaseKeeper.run`, passes :meth:`LeaseKeeper.gate` to startup reconciliation).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from ..config import LEASE_RENEWALS_PER_LEASE
from ..errors import StoreError
from ..events import Streams
from ..state.journal import AttemptJournal, OpenAttempt, ReconciledBy
from ..state.pgattempts import AttemptRow, SharedAttemptMirror
from .reconcile import Checks, Reconciler, Resolution, ResolutionStatus, reconcile_attempt

__all__ = ["LeaseKeeper"]


class LeaseKeeper:
    """Renews this replica's leases and reconciles attempts whose lease lapsed."""

    def __init__(
        self,
        mirror: SharedAttemptMirror,
        journal: AttemptJournal,
        *,
        reconciler: Reconciler,
        streams: Streams,
        on_resolution: Callable[[Resolution], Awaitable[None]],
        monotonic: Callable[[], float] = time.monotonic,
        checks: Checks | None = None,
    ) -> None:
        self._checks = checks if checks is not None else Checks()
        self._mirror = mirror
        self._journal = journal
        self._reconciler = reconciler
        self._streams = streams
        self._on_resolution = on_resolution
        self._monotonic = monotonic
        self._asked: dict[str, float] = {}  # attempt id -> when it was last asked (monotonic)

    @property
    def interval(self) -> float:
        return self._mirror.lease_seconds / LEASE_RENEWALS_PER_LEASE

    async def gate(self, attempt: OpenAttempt) -> bool:
        """Take ``attempt`` (from this replica's journal) for startup reconciliation."""
        sent_at = self._monotonic()
        state, row = await self._mirror.attempts.take(
            attempt.attempt_id, owner=self._mirror.owner, lease_seconds=self._mirror.lease_seconds
        )
        if row is not None:
            self._mirror.held(row, sent_at=sent_at)
        if state in ("HELD", "CLOSED"):
            self._streams.security.emit(
                "RECONCILIATION_SKIPPED",
                {"attempt_id": attempt.attempt_id, "reason": f"SHARED_{state}"},
            )
            return False
        return True

    async def tick(self) -> list[Resolution]:
        """One round: flush, renew, take and resolve what lapsed, ask again about what this
        replica owns and is still unknown. Raises ``StoreError``."""
        await self._mirror.flush()
        await self._mirror.renew()
        resolutions: list[Resolution] = []
        while True:
            sent_at = self._monotonic()
            row = await self._mirror.attempts.take_lapsed(
                owner=self._mirror.owner, lease_seconds=self._mirror.lease_seconds
            )
            if row is None:
                break
            self._mirror.held(row, sent_at=sent_at)
            self._streams.security.emit(
                "ATTEMPT_TAKEN_OVER",
                {"attempt_id": row.attempt_id, "owner": self._mirror.owner},
            )
            resolutions.append(await self._resolve(row))
        now = self._monotonic()
        for row in await self._mirror.attempts.owned_unknown(owner=self._mirror.owner):
            asked = self._asked.get(row.attempt_id)
            if asked is None:  # first seen (resolved at start, or before this process)
                self._asked[row.attempt_id] = now
            elif now - asked >= self._mirror.lease_seconds:
                resolutions.append(await self._resolve(row))
        return resolutions

    async def _resolve(self, row: AttemptRow) -> Resolution:
        resolution = await reconcile_attempt(
            _open_attempt(row),
            self._journal,
            reconciler=self._reconciler,
            streams=self._streams,
            timeout_s=self.interval,
            checks=self._checks,
            by=ReconciledBy.LEASE,  # no restart happened: this process is running (issue 31)
        )
        if resolution.resolution is ResolutionStatus.STILL_UNKNOWN:
            self._asked[row.attempt_id] = self._monotonic()
        else:
            self._asked.pop(row.attempt_id, None)
        await self._on_resolution(resolution)
        return resolution

    async def run(self) -> None:
        while True:
            with contextlib.suppress(StoreError):  # the database is away: next tick tries
                await self.tick()
            await asyncio.sleep(self.interval)


def _open_attempt(row: AttemptRow) -> OpenAttempt:
    return OpenAttempt(
        attempt_id=row.attempt_id,
        intent_id=row.intent_id,
        intent_hash=row.intent_hash,
        decision_id=row.decision_id,
        dossier_id=row.dossier_id,
        principal=row.principal,
        action=row.action,
        binding=row.binding,
        opened_at=row.opened_at,
        file="shared store",
        grant_claimed=row.grant_claimed,
        grant_id=row.grant_id,
        grant_expires_at=row.grant_expires_at,
        payload_digest=row.payload_digest,
        last_status=row.last_status,
    )
