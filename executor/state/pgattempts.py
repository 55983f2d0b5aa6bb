"""The shared store's attempts: the journal's open-attempt state, owned by replicas under leases.

Role: with ``EXECUTOR_STORE_URL``, :class:`PostgresAttempts` keeps every open attempt with its
owner, lease and fencing token (``epoch``), and :class:`SharedAttemptMirror` is the journal's
mirror of them: it records each attempt's steps (opened, grant claimed, closed) in the shared
database, keeps the fence (``state/records.py``'s ``AttemptFence``) of every attempt this
replica holds, and renews their leases. Every takeover increments the epoch in the transaction
that changes the owner, so what the previous owner still holds is fenced off (issue 29; the
statements are listed in ``state/pgstore.py``).

Callers: ``state/pgstore.py`` (a :class:`~agentsafe.executor.state.pgstore.PostgresStore`
holds its :class:`PostgresAttempts`), ``state/backend.py`` (builds the mirror the journal is
given as its ``AttemptMirror``), ``lifecycle/leases.py`` (the mirror and its rows).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from psycopg.rows import TupleRow

from ..canonical import canonical_text
from ..codes import Code
from ..config import LEASE_MARGIN_SECONDS
from ..errors import StoreError
from .journal import CLOSING_STATUSES, ReconciledStatus, RecordType
from .pgconn import HELD_KEY, NOW, STILL_OPEN, Conn, HeldKey, PostgresPool
from .records import AttemptFence, closing_response
from .statements import canonical_or_store_error, load_object

__all__ = ["OPENING_EPOCH", "AttemptRow", "PostgresAttempts", "SharedAttemptMirror"]

OPENING_EPOCH: Final = 1
"""An attempt's fencing token when it opens; every takeover increments it (issue 29)."""
_SETTLE_FENCE: Final = (
    " AND (%s::text IS NULL OR owner = %s) AND (%s::bigint IS NULL OR epoch = %s)"
)
"""A close's fence: with an owner and epoch, only the row still theirs changes."""


@dataclass(frozen=True)
class AttemptRow:
    """An open attempt as the shared store holds it (the fields of ATTEMPT_OPENED and after)."""

    attempt_id: str
    owner: str
    lease_until: float
    intent_id: str | None
    intent_hash: str
    decision_id: str | None
    dossier_id: str | None
    principal: str | None
    action: str | None
    binding: Mapping[str, Any]
    opened_at: str
    grant_claimed: bool
    grant_id: str | None
    grant_expires_at: str | None
    payload_digest: str | None
    last_status: str | None
    epoch: int = OPENING_EPOCH
    """The fencing token: incremented by every takeover, with the owner."""


_ATTEMPT_COLUMNS = (
    "attempt_id, owner, lease_until, intent_id, intent_hash, decision_id, dossier_id, principal,"
    " action, binding, opened_at, grant_claimed, grant_id, grant_expires_at, payload_digest,"
    " last_status, epoch"
)


def _attempt_from_row(row: TupleRow) -> AttemptRow:
    values = list(row)
    values[2] = float(values[2])
    values[9] = load_object(values[9])
    values[11] = bool(values[11])
    values[16] = int(values[16])
    return AttemptRow(*values)


class PostgresAttempts:
    """The journal's open-attempt state, owned by replicas under leases.

    ``opened`` inserts the attempt owned by this replica at :data:`OPENING_EPOCH` (and, in the
    same statement, makes the key its request holds the attempt's, or refuses if that key was
    taken over); ``grant_claimed`` and ``settle`` update it, fenced by its owner and epoch when
    given; ``close_answering`` closes it as ``settle`` does and completes its request's key in
    the same statement; ``renew`` extends every lease this replica holds; ``take_lapsed`` moves
    one attempt whose lease ran out to this replica (one row lock); ``take`` does the same for a
    named attempt. Every move increments the attempt's ``epoch`` in the transaction that changes its
    owner, so whatever the previous owner still holds is fenced off.
    """

    def __init__(self, store: PostgresPool) -> None:
        self._store = store

    async def opened(
        self,
        *,
        owner: str,
        lease_seconds: float,
        attempt_id: str,
        fields: Mapping[str, Any],
        binding: Mapping[str, Any],
        opened_at: str,
    ) -> None:
        binding_text = canonical_text(dict(binding))
        held = HELD_KEY.get()
        row = (
            attempt_id,
            owner,
            lease_seconds,
            fields.get("intent_id"),
            fields["intent_hash"],
            fields.get("decision_id"),
            fields.get("dossier_id"),
            fields.get("caller"),
            fields.get("action"),
            binding_text,
            opened_at,
        )
        columns = (
            "INSERT INTO attempts (attempt_id, owner, lease_until, state, intent_id,"
            " intent_hash, decision_id, dossier_id, principal, action, binding, opened_at)"
        )
        if held is None:
            await self._store.statement(
                f"{columns} VALUES (%s, %s, {NOW} + %s, 'OPEN', %s, %s, %s, %s, %s, %s, %s, %s)",
                row,
            )
            return
        # The key this request holds becomes the attempt's, and the attempt is inserted, in one
        # statement (one transaction): the INSERT takes its row only from the UPDATE's, so
        # nothing opens unless the key's holder is still this request's.
        (tenant, principal, key), holder = held.scope, held.holder
        inserted, _ = await self._store.statement(
            "WITH fenced AS (UPDATE idempotency SET opened_attempt = %s WHERE tenant = %s"  # noqa: S608
            " AND principal = %s AND key = %s AND holder = %s AND state = 'IN_PROGRESS'"
            f" RETURNING 1) {columns} SELECT %s, %s, {NOW} + %s, 'OPEN', %s, %s, %s, %s, %s,"
            " %s, %s, %s FROM fenced",
            (attempt_id, tenant, principal, key, holder, *row),
        )
        if inserted != 1:
            raise StoreError("a later request took this key over", code=Code.IDEMPOTENCY_TAKEN_OVER)

    async def grant_claimed(
        self,
        *,
        attempt_id: str,
        grant_id: str,
        grant_expires_at: str,
        payload_digest: str,
        owner: str | None = None,
        epoch: int | None = None,
    ) -> None:
        """Record GRANT_CLAIMED (when the claim itself did not: an unfenced claim). With
        ``owner`` (and ``epoch``), only on the row still theirs and open: ``ATTEMPT_FENCED``
        otherwise."""
        updated, _ = await self._store.statement(
            "UPDATE attempts SET grant_claimed = true, grant_id = %s, grant_expires_at = %s,"  # noqa: S608
            " payload_digest = %s WHERE attempt_id = %s AND (%s::text IS NULL OR (owner = %s"
            f" AND {STILL_OPEN})) AND (%s::bigint IS NULL OR epoch = %s)",
            (grant_id, grant_expires_at, payload_digest, attempt_id, owner, owner, epoch, epoch),
        )
        if updated != 1:
            if owner is not None:
                raise StoreError(
                    "the attempt is no longer this replica's", code=Code.ATTEMPT_FENCED
                )
            raise StoreError("the attempt is not in the shared store", code=Code.STORE_UNAVAILABLE)

    async def settle(
        self,
        *,
        attempt_id: str,
        closed: bool,
        status: str,
        owner: str | None = None,
        epoch: int | None = None,
    ) -> int:
        """Close the attempt, or record the status that leaves it open. With ``owner`` and
        ``epoch``, only while the row is still theirs (a close from a holder that was taken over
        changes nothing: the new owner resolves it). How many rows changed."""
        fence = _SETTLE_FENCE
        if closed:
            updated, _ = await self._store.statement(
                f"UPDATE attempts SET state = 'CLOSED', last_status = %s, closed_at = {NOW}"  # noqa: S608
                " WHERE attempt_id = %s" + fence,
                (status, attempt_id, owner, owner, epoch, epoch),
            )
        else:
            updated, _ = await self._store.statement(
                "UPDATE attempts SET last_status = %s WHERE attempt_id = %s" + fence,  # noqa: S608
                (status, attempt_id, owner, owner, epoch, epoch),
            )
        return updated

    async def close_answering(
        self,
        *,
        attempt_id: str,
        status: str,
        owner: str | None,
        epoch: int | None,
        key: HeldKey,
        response: str,
        now: float,
    ) -> bool:
        """Close the attempt, fenced as :meth:`settle` closes it, and give the key its request
        holds the final answer (``response``, canonical JSON), in one statement: one transaction,
        one synced commit. The key takes it only while it is IN_PROGRESS under this request's
        holder, and its attempt is this one (what ``idempotency_complete``'s own statement
        requires); True when it did. Otherwise the close still holds, and the request's
        ``idempotency_complete`` says why the key cannot take its answer, as it does without
        this statement."""
        (tenant, principal, key_name), holder = key.scope, key.holder
        done, _ = await self._store.statement(
            "WITH closed AS (UPDATE attempts SET state = 'CLOSED', last_status = %s,"  # noqa: S608
            f" closed_at = {NOW} WHERE attempt_id = %s" + _SETTLE_FENCE + " RETURNING 1)"
            " UPDATE idempotency SET state = 'DONE', response = %s, completed_at = %s"
            " WHERE tenant = %s AND principal = %s AND key = %s AND state <> 'DONE'"
            " AND (holder IS NULL OR holder = %s) AND opened_attempt = %s",
            (
                status,
                attempt_id,
                owner,
                owner,
                epoch,
                epoch,
                response,
                now,
                tenant,
                principal,
                key_name,
                holder,
                attempt_id,
            ),
        )
        return done == 1

    async def renew(
        self, *, owner: str, lease_seconds: float, held: Mapping[str, int]
    ) -> list[tuple[str, int]]:
        """Extend the lease of each open attempt in ``held`` (attempt id -> epoch) that
        ``owner`` still holds at that epoch; the ``(attempt_id, epoch)`` of each one renewed.

        Only the attempts this process holds a fence for: an attempt of the same
        ``EXECUTOR_REPLICA_ID`` that this process knows nothing of (its predecessor's, after a
        restart, or one taken over and not resolved before a crash) is left to lapse, so another
        replica takes it and reconciles it, rather than being renewed for ever with nobody to
        resolve it (found by the protocol model, docs/protocol.md, GAP_RENEW_ALL)."""
        if not held:
            return []
        ids, epochs = list(held), [held[attempt_id] for attempt_id in held]

        async def work(conn: Conn) -> list[tuple[str, int]]:
            cur = await conn.execute(
                f"UPDATE attempts a SET lease_until = {NOW} + %s"  # noqa: S608
                " FROM unnest(%s::text[], %s::bigint[]) AS h(attempt_id, epoch)"
                " WHERE a.attempt_id = h.attempt_id AND a.epoch = h.epoch AND a.owner = %s"
                f" AND a.{STILL_OPEN} RETURNING a.attempt_id, a.epoch",
                (lease_seconds, ids, epochs, owner),
            )
            return [(str(r[0]), int(r[1])) for r in await cur.fetchall()]

        return await self._store.transaction(work)

    async def take_lapsed(self, *, owner: str, lease_seconds: float) -> AttemptRow | None:
        """Take the oldest open attempt whose lease lapsed, if any: its row is locked (others
        skip it) and its owner and lease changed in one transaction."""

        async def work(conn: Conn) -> AttemptRow | None:
            cur = await conn.execute(
                f"SELECT attempt_id FROM attempts WHERE state = 'OPEN' AND lease_until < {NOW}"  # noqa: S608
                " ORDER BY opened_at, attempt_id LIMIT 1 FOR UPDATE SKIP LOCKED"
            )
            row = await cur.fetchone()
            if row is None:
                return None
            return await _move(conn, str(row[0]), owner, lease_seconds)

        return await self._store.transaction(work)

    async def take(
        self, attempt_id: str, *, owner: str, lease_seconds: float
    ) -> tuple[str, AttemptRow | None]:
        """Take a named attempt for reconciliation: ``("TAKEN", row)`` when it is open and its
        lease is this replica's or lapsed; ``("HELD", None)`` when another replica's lease is
        live; ``("CLOSED", None)`` when it was resolved; ``("ABSENT", None)``."""

        async def work(conn: Conn) -> tuple[str, AttemptRow | None]:
            cur = await conn.execute(
                f"SELECT state, owner, lease_until < {NOW} FROM attempts"  # noqa: S608
                " WHERE attempt_id = %s FOR UPDATE",
                (attempt_id,),
            )
            row = await cur.fetchone()
            if row is None:
                return "ABSENT", None
            if row[0] == "CLOSED":
                return "CLOSED", None
            if row[1] != owner and not row[2]:
                return "HELD", None
            return "TAKEN", await _move(conn, attempt_id, owner, lease_seconds)

        return await self._store.transaction(work)

    async def owned_unknown(self, *, owner: str) -> list[AttemptRow]:
        """The open attempts ``owner`` holds whose last resolution was STILL_UNKNOWN (the lease
        keeper asks about them again)."""

        async def work(conn: Conn) -> list[AttemptRow]:
            cur = await conn.execute(
                f"SELECT {_ATTEMPT_COLUMNS} FROM attempts WHERE state = 'OPEN'"  # noqa: S608
                " AND owner = %s AND last_status = %s ORDER BY opened_at, attempt_id",
                (owner, ReconciledStatus.STILL_UNKNOWN.value),
            )
            return [_attempt_from_row(row) for row in await cur.fetchall()]

        return await self._store.transaction(work)

    async def open_attempts(self) -> list[AttemptRow]:
        async def work(conn: Conn) -> list[AttemptRow]:
            cur = await conn.execute(
                f"SELECT {_ATTEMPT_COLUMNS} FROM attempts WHERE state = 'OPEN'"  # noqa: S608
                " ORDER BY opened_at, attempt_id"
            )
            return [_attempt_from_row(row) for row in await cur.fetchall()]

        return await self._store.transaction(work)


async def _move(conn: Conn, attempt_id: str, owner: str, lease_seconds: float) -> AttemptRow:
    """Make ``owner`` the attempt's owner under a new lease and increment its fencing token,
    in the caller's transaction (the row is already locked ``FOR UPDATE``)."""
    cur = await conn.execute(
        f"UPDATE attempts SET owner = %s, lease_until = {NOW} + %s, epoch = epoch + 1"  # noqa: S608
        f" WHERE attempt_id = %s RETURNING {_ATTEMPT_COLUMNS}",
        (owner, lease_seconds, attempt_id),
    )
    row = await cur.fetchone()
    assert row is not None
    return _attempt_from_row(row)


class SharedAttemptMirror:
    """The journal's :class:`~agentsafe.executor.state.journal.AttemptMirror` on the shared
    store: every step of an attempt this replica journals, owned by ``owner`` under a lease.

    ATTEMPT_OPENED and GRANT_CLAIMED must reach the store (a failure fails the append, before
    dispatch). A close or reconciliation that cannot be written is never allowed to turn a known
    outcome into an error: it is kept and written again by :meth:`flush` (the lease keeper calls
    it), and until then the attempt stays open, renewed by this replica.

    Fencing (issue 29): for every attempt this replica opened (at :data:`OPENING_EPOCH`) or took
    over (:meth:`held`), the mirror keeps an :class:`AttemptFence`: :meth:`fence` hands it to the
    attempt, whose grant claim is fenced by it; :meth:`renew` moves its local lease deadline on
    only for the attempts the database renewed at the same epoch. GRANT_CLAIMED is written by the
    fenced claim itself (nothing more here); closes are fenced by owner and epoch.

    A close that carries the caller's answer, in the task of a request that holds its key
    (``state/pgconn.py`` ``HeldKey``), also completes that key, in the same statement
    (:meth:`PostgresAttempts.close_answering`, issue 34).
    """

    def __init__(
        self,
        attempts: PostgresAttempts,
        *,
        owner: str,
        lease_seconds: float,
        dispatch_seconds: float = 0.0,
        monotonic: Callable[[], float] = time.monotonic,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.attempts = attempts
        self.owner = owner
        self.lease_seconds = lease_seconds
        self.dispatch_seconds = dispatch_seconds
        """The dispatch deadline (``DOWNSTREAM_TIMEOUT_MS``): a send must end under the lease."""
        self._monotonic = monotonic
        self._now = now
        """The wall clock a key completed with its attempt's close records (``completed_at``)."""
        self._backlog: list[tuple[str, bool, str]] = []
        self._fences: dict[str, AttemptFence] = {}

    @property
    def backlog(self) -> int:
        return len(self._backlog)

    def fence(self, attempt_id: str) -> AttemptFence | None:
        """The fencing token of an attempt this replica opened or took over, if it holds one."""
        return self._fences.get(attempt_id)

    def held(self, row: AttemptRow, *, sent_at: float) -> AttemptFence:
        """Remember the fence of an attempt this replica just took (``take``/``take_lapsed``,
        whose statement was sent at ``sent_at``)."""
        fence = self._new_fence(row.attempt_id, row.epoch, sent_at)
        fence.claimed = row.grant_claimed
        return fence

    def _new_fence(self, attempt_id: str, epoch: int, sent_at: float) -> AttemptFence:
        fence = AttemptFence(
            attempt_id=attempt_id,
            owner=self.owner,
            epoch=epoch,
            lease_seconds=self.lease_seconds,
            dispatch_seconds=self.dispatch_seconds,
            margin_seconds=LEASE_MARGIN_SECONDS,
            sent_at=sent_at,
            monotonic=self._monotonic,
        )
        self._fences[attempt_id] = fence
        return fence

    async def renew(self) -> int:
        """Extend every lease this replica holds; the local deadline of each attempt renewed at
        the epoch this replica holds moves on (one taken from it does not). How many."""
        sent_at = self._monotonic()
        held = {attempt_id: fence.epoch for attempt_id, fence in self._fences.items()}
        renewed = await self.attempts.renew(
            owner=self.owner, lease_seconds=self.lease_seconds, held=held
        )
        for attempt_id, epoch in renewed:
            fence = self._fences.get(attempt_id)
            if fence is not None and fence.epoch == epoch:
                fence.renewed(sent_at)
        return len(renewed)

    async def record(self, kind: RecordType, record: Mapping[str, Any]) -> None:
        attempt_id = str(record["attempt_id"])
        if kind is RecordType.ATTEMPT_OPENED:
            sent_at = self._monotonic()
            await self.attempts.opened(
                owner=self.owner,
                lease_seconds=self.lease_seconds,
                attempt_id=attempt_id,
                fields=record,
                binding=record["intent"],
                opened_at=str(record["at"]),
            )
            self._new_fence(attempt_id, OPENING_EPOCH, sent_at)
        elif kind is RecordType.GRANT_CLAIMED:
            fence = self._fences.get(attempt_id)
            if fence is not None and fence.claimed:
                return  # the fenced claim wrote it, in the claim's own statement
            await self.attempts.grant_claimed(
                attempt_id=attempt_id,
                grant_id=str(record["grant_id"]),
                grant_expires_at=str(record["grant_expires_at"]),
                payload_digest=str(record["payload_digest"]),
                owner=self.owner,
                epoch=fence.epoch if fence is not None else None,
            )
            if fence is not None:
                fence.claimed = True
        elif kind is RecordType.ATTEMPT_CLOSED:
            outcome = str(record["outcome"])
            closed = outcome != "UNKNOWN_AFTER_DISPATCH"
            answer = record.get("answer")
            held = HELD_KEY.get()
            if closed and held is not None and isinstance(answer, Mapping):
                await self._close_answering(attempt_id, outcome, held, answer)
            else:
                await self._settle(attempt_id, closed, outcome)
        else:
            status = str(record["status"])
            await self._settle(attempt_id, status in CLOSING_STATUSES, status)

    async def _settle(self, attempt_id: str, closed: bool, status: str) -> None:
        try:
            await self._write_settle(attempt_id, closed, status)
        except StoreError:
            self._backlog.append((attempt_id, closed, status))

    async def _close_answering(
        self, attempt_id: str, outcome: str, held: HeldKey, answer: Mapping[str, Any]
    ) -> None:
        """The close of an attempt whose request holds its key, with the answer the caller is
        given: the attempt's close and the key's completion in one statement (one commit
        fewer per ALLOW than the close and ``idempotency_complete`` apart). The response is
        noted on ``held``, so the request's ``idempotency_complete`` sends nothing more. A
        statement that fails leaves the close to the backlog, as :meth:`_settle` does, and the
        key to ``idempotency_complete``; one that may have committed before failing is
        harmless (the close is written again, the key finds its own answer)."""
        response = closing_response(answer)
        try:
            text = canonical_or_store_error(response)
        except StoreError:
            await self._settle(attempt_id, True, outcome)
            return
        fence = self._fences.get(attempt_id)
        try:
            answered = await self.attempts.close_answering(
                attempt_id=attempt_id,
                status=outcome,
                owner=self.owner if fence is not None else None,
                epoch=fence.epoch if fence is not None else None,
                key=held,
                response=text,
                now=self._now(),
            )
        except StoreError:
            self._backlog.append((attempt_id, True, outcome))
            return
        self._fences.pop(attempt_id, None)
        if answered:
            held.recorded = response

    async def _write_settle(self, attempt_id: str, closed: bool, status: str) -> None:
        """A close of an attempt this replica holds a fence for is fenced by it: once another
        replica took the attempt, the close changes nothing (the new owner resolves it)."""
        fence = self._fences.get(attempt_id)
        await self.attempts.settle(
            attempt_id=attempt_id,
            closed=closed,
            status=status,
            owner=self.owner if fence is not None else None,
            epoch=fence.epoch if fence is not None else None,
        )
        if closed:
            self._fences.pop(attempt_id, None)

    async def flush(self) -> int:
        """Write the kept closes again, in order; returns how many are still kept."""
        while self._backlog:
            attempt_id, closed, status = self._backlog[0]
            try:
                await self._write_settle(attempt_id, closed, status)
            except StoreError:
                break
            self._backlog.pop(0)
        return len(self._backlog)
