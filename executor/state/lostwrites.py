"""Lost writes: a shared database that went back in time is detected, never trusted.

Role: after a failover with asynchronous replication, a promoted standby may lack writes the old
primary had already acknowledged. The one that matters is a grant's claim: a key whose claim the
database forgot looks new, and a retry would be sent to the provider a second time. This
replica's own journal is the witness: its GRANT_CLAIMED record is appended only after the
database acknowledged the grant's claim (``authority.claim`` precedes ``journal.grant_claimed``),
so every GRANT_CLAIMED in the journal names a ``grant_claims`` row the database must still hold
(until its retention, ``usestore.RETENTION_SECONDS`` after the grant's expiry).

When it runs. :class:`LostWritesGuard` is the store's ``server_watch``
(``PostgresStore.open``): it reads the server's identity on every new connection -- the WAL
timeline of the current insert position (a promotion starts a new one) and the postmaster's
start time (a restart) -- and when that identity is not the last one it verified, it checks the
journal against the database on that connection before the pool lends it. The first connection
(start-up's migration) always checks. Concurrent new connections wait for the one check, so no
work reaches a server that has not been checked.

What a lost claim does. For each GRANT_CLAIMED (grant not yet past retention) whose
``grant_claims`` row is absent, in one transaction:

1. the claim is asserted again (``INSERT INTO grant_claims ... ON CONFLICT DO NOTHING``): the
   grant can never be claimed a second time;
2. the attempt is asserted again OPEN with its grant claimed, owned by no living replica
   (``STORE_LOST_WRITES:<replica>``, so nobody renews it), its lease lapsed, its fencing token
   (``epoch``) raised when the row survived, and its last status ``STORE_LOST_WRITES``
   (``INSERT ... ON CONFLICT (attempt_id) DO UPDATE``): a lease keeper of any replica takes it
   and asks the provider, read-only, exactly as for a replica that died
   (``lifecycle/leases.py``), and that settles the key;
3. the key is asserted again IN_PROGRESS for that attempt (``INSERT INTO idempotency ... ON
   CONFLICT DO UPDATE ... WHERE state = 'IN_PROGRESS'``): a retry on any replica finds a key
   whose attempt opened and claimed its grant, so it answers 409 IDEMPOTENCY_IN_PROGRESS and is
   never taken over, until reconciliation records the provider's answer, which is then replayed.

The replica then halts with cause ``STORE_LOST_WRITES`` (``on_lost``; ``plane.py``), the keys are
listed by ``GET /v1/control/status`` (``store_lost_writes``) and counted for the operator. A key
that a retry on another replica had already taken over between the promotion and this check
(its row names another attempt, or is DONE) cannot be reasserted: it is listed with
``rerun_elsewhere: true`` (it may have reached the provider twice; the playbook says what to do).

What it cannot see: a claim acknowledged by a replica that is dead or partitioned while others
serve (no living journal holds it), and a retry that reaches another replica before the
acknowledging replica checked. Both are why more than one replica requires synchronous
replication (docs/high-availability.md, "Fault model").

Callers: ``state/backend.py`` (builds one per process with a shared store and hands it to the
store's ``PostgresStore.open`` as its ``server_watch``, which awaits it with each new
connection), ``plane.py`` (halts on it, lists its keys).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import psycopg
from psycopg.rows import TupleRow

from ..canonical import canonical_text, sha256_digest
from ..clock import format_ms
from ..codes import Code
from .journal import ATTEMPTS_DIR, SHARED_STORE, RecordType
from .records import RETENTION_SECONDS

__all__ = ["LOST_STATUS", "LostClaim", "LostWritesGuard", "ServerIdentity", "journal_claims"]

log = logging.getLogger("agentsafe.store")

_Conn = psycopg.AsyncConnection[TupleRow]

LOST_STATUS: Final = Code.STORE_LOST_WRITES.value
"""The ``last_status`` of an attempt asserted again after the database lost its claim."""
_MARGIN_SECONDS: Final = 3600.0
"""Claims this close to their retention are not checked (the database may purge them)."""
_BATCH: Final = 500
_NOW: Final = "extract(epoch from clock_timestamp())::double precision"


@dataclass(frozen=True)
class ServerIdentity:
    """Which history a server holds: its WAL timeline and when its postmaster started."""

    timeline: str
    started: str


@dataclass(frozen=True)
class JournalClaim:
    """A GRANT_CLAIMED of this journal and what its ATTEMPT_OPENED said."""

    attempt_id: str
    grant_id: str
    grant_expires_at: str
    payload_digest: str
    claimed_at: str
    opened: Mapping[str, Any]


@dataclass(frozen=True)
class LostClaim:
    """A claim this replica acknowledged that the database no longer held."""

    attempt_id: str
    grant_id: str
    tenant: str | None
    principal: str | None
    idempotency_key: str | None
    claimed_at: str
    rerun_elsewhere: bool  # the key had already been taken by another attempt

    def as_dict(self) -> dict[str, Any]:
        return {
            "attempt_id": self.attempt_id,
            "grant_id": self.grant_id,
            "tenant": self.tenant,
            "principal": self.principal,
            "idempotency_key": self.idempotency_key,
            "claimed_at": self.claimed_at,
            "rerun_elsewhere": self.rerun_elsewhere,
        }


def _parse_ms(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


def _records(root: Path, since: datetime) -> Iterator[dict[str, Any]]:
    """Every record of the day files from ``since``'s UTC day on, oldest first; an unreadable
    or damaged line is skipped (start-up's scan reports those)."""
    first = since.date().isoformat()
    try:
        names = sorted(
            p.name for p in root.iterdir() if p.name.endswith(".jsonl") and p.name[:-6] >= first
        )
    except OSError:
        return
    for name in names:
        try:
            with (root / name).open("rb") as lines:
                for line in lines:
                    try:
                        value = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(value, dict):
                        yield value
        except OSError:
            continue


def journal_claims(journal_dir: Path, *, now: float) -> list[JournalClaim]:
    """The claims of the journal under ``journal_dir`` the database must still hold at
    ``now``: every GRANT_CLAIMED whose grant expired less than the retention (less a margin)
    ago, except an attempt that closed FAILED_BEFORE_DISPATCH (never sent). Blocking: call it
    in a thread."""
    horizon = now - RETENTION_SECONDS + _MARGIN_SECONDS
    root = journal_dir / ATTEMPTS_DIR
    opened: dict[str, dict[str, Any]] = {}
    claims: dict[str, JournalClaim] = {}
    since = datetime.fromtimestamp(now, UTC) - timedelta(seconds=RETENTION_SECONDS)
    for record in _records(root, since):
        kind = record.get("record")
        attempt_id = record.get("attempt_id")
        if not isinstance(attempt_id, str):
            continue
        if kind == RecordType.ATTEMPT_OPENED.value:
            opened[attempt_id] = record
        elif kind == RecordType.GRANT_CLAIMED.value:
            if record.get("store") != SHARED_STORE:
                continue  # claimed on this journal's own store (SQLite) before it served this one
            fields = [record.get(n) for n in ("grant_id", "grant_expires_at", "payload_digest")]
            if not all(isinstance(f, str) for f in fields):
                continue
            try:
                if _parse_ms(str(fields[1])) < horizon:
                    continue
            except ValueError:
                continue
            claims[attempt_id] = JournalClaim(
                attempt_id,
                str(fields[0]),
                str(fields[1]),
                str(fields[2]),
                str(record.get("at", "")),
                opened.get(attempt_id, {}),
            )
        elif kind == RecordType.ATTEMPT_CLOSED.value and (
            record.get("outcome") == "FAILED_BEFORE_DISPATCH" and record.get("executed") is False
        ):
            claims.pop(attempt_id, None)
    return list(claims.values())


async def server_identity(conn: _Conn) -> ServerIdentity:
    """The timeline of the server's current WAL insert position and its postmaster's start."""
    cur = await conn.execute(
        "SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8),"
        " pg_postmaster_start_time()::text"
    )
    row = await cur.fetchone()
    assert row is not None
    return ServerIdentity(str(row[0]), str(row[1]))


class LostWritesGuard:
    """Checks this replica's acknowledged claims against each new server it connects to.

    ``on_lost`` is called (on the event loop) with every lost claim found, once per check that
    found some; :attr:`lost` keeps every one found since start, for the status route."""

    def __init__(self, journal_dir: Path, *, owner: str) -> None:
        self._journal_dir = journal_dir
        self._owner = owner
        self._verified: ServerIdentity | None = None
        self._lock = asyncio.Lock()
        self.lost: dict[str, LostClaim] = {}
        self.checks = 0
        self.on_lost: Callable[[list[LostClaim]], None] | None = None

    @property
    def verified(self) -> ServerIdentity | None:
        return self._verified

    async def __call__(self, conn: _Conn) -> None:
        """The store's ``server_watch``: check ``conn``'s server unless it was verified."""
        identity = await server_identity(conn)
        if identity == self._verified:
            return
        async with self._lock:
            if identity == self._verified:
                return
            found = await self.check(conn)
            self._verified = identity
        if found and self.on_lost is not None:
            self.on_lost(found)

    async def check(self, conn: _Conn) -> list[LostClaim]:
        """Compare the journal's claims with ``conn``'s database; assert the lost ones again
        (see the module docstring). Returns the claims newly found lost."""
        cur = await conn.execute(f"SELECT {_NOW}")
        row = await cur.fetchone()
        assert row is not None
        claims = await asyncio.to_thread(journal_claims, self._journal_dir, now=float(row[0]))
        self.checks += 1
        found: list[LostClaim] = []
        for start in range(0, len(claims), _BATCH):
            batch = claims[start : start + _BATCH]
            cur = await conn.execute(
                "SELECT grant_id FROM grant_claims WHERE grant_id = ANY(%s)",
                ([c.grant_id for c in batch],),
            )
            present = {str(r[0]) for r in await cur.fetchall()}
            for claim in batch:
                if claim.grant_id not in present:
                    lost = await self._reassert(conn, claim)
                    if claim.attempt_id not in self.lost:
                        self.lost[claim.attempt_id] = lost
                        found.append(lost)
        if found:
            log.error(
                "the shared store lacks %d grant claim(s) this replica acknowledged: halted"
                " (cause STORE_LOST_WRITES)",
                len(found),
            )
        return found

    async def _reassert(self, conn: _Conn, claim: JournalClaim) -> LostClaim:
        opened = claim.opened
        binding = opened.get("intent")
        binding = binding if isinstance(binding, dict) else {}
        tenant = binding.get("tenant_id")
        key = binding.get("idempotency_key")
        principal = opened.get("caller")
        action = binding.get("action")
        digest = None
        if isinstance(action, dict):
            digest = sha256_digest(
                {
                    "action": action.get("type"),
                    "target": action.get("resource"),
                    "parameters": action.get("parameters"),
                }
            )
        expires = _parse_ms(claim.grant_expires_at)
        rerun = False
        async with conn.transaction():
            await conn.execute(
                f"INSERT INTO grant_claims (grant_id, binding_digest, expires_at, claimed_at)"  # noqa: S608
                f" VALUES (%s, %s, %s, {_NOW}) ON CONFLICT (grant_id) DO NOTHING",
                (claim.grant_id, LOST_STATUS, expires),
            )
            if opened.get("intent_hash"):
                await conn.execute(
                    "INSERT INTO attempts (attempt_id, owner, lease_until, state, intent_id,"  # noqa: S608
                    " intent_hash, decision_id, dossier_id, principal, action, binding,"
                    " opened_at, grant_claimed, grant_id, grant_expires_at, payload_digest,"
                    f" last_status) VALUES (%s, %s, {_NOW} - 1, 'OPEN', %s, %s, %s, %s, %s, %s,"
                    " %s, %s, true, %s, %s, %s, %s) ON CONFLICT (attempt_id) DO UPDATE SET"
                    " owner = EXCLUDED.owner, epoch = attempts.epoch + 1,"
                    f" state = 'OPEN', lease_until = {_NOW} - 1, grant_claimed = true,"
                    " grant_id = EXCLUDED.grant_id, grant_expires_at = EXCLUDED.grant_expires_at,"
                    " payload_digest = EXCLUDED.payload_digest, last_status = %s,"
                    " closed_at = NULL",
                    (
                        claim.attempt_id,
                        # Owned by no living replica (none renews it): the first lease keeper
                        # to tick takes it, this replica's included.
                        f"{LOST_STATUS}:{self._owner}",
                        opened.get("intent_id"),
                        opened["intent_hash"],
                        opened.get("decision_id"),
                        opened.get("dossier_id"),
                        principal,
                        opened.get("action"),
                        canonical_text(binding),
                        str(opened.get("at", claim.claimed_at)),
                        claim.grant_id,
                        claim.grant_expires_at,
                        claim.payload_digest,
                        LOST_STATUS,
                        LOST_STATUS,
                    ),
                )
            if isinstance(tenant, str) and isinstance(key, str) and isinstance(principal, str):
                cur = await conn.execute(
                    "INSERT INTO idempotency (tenant, principal, key, payload_digest, state,"  # noqa: S608
                    " created_at, holder, lease_until, attempt_id, owner, opened_attempt)"
                    f" VALUES (%s, %s, %s, %s, 'IN_PROGRESS', {_NOW}, NULL, {_NOW}, %s, '', %s)"
                    " ON CONFLICT (tenant, principal, key) DO UPDATE SET opened_attempt ="
                    " EXCLUDED.opened_attempt, attempt_id = EXCLUDED.attempt_id, holder = NULL"
                    " WHERE idempotency.state = 'IN_PROGRESS' AND (idempotency.opened_attempt"
                    " IS NULL OR idempotency.opened_attempt = EXCLUDED.opened_attempt)",
                    (
                        tenant,
                        principal,
                        key,
                        digest or LOST_STATUS,
                        claim.attempt_id,
                        claim.attempt_id,
                    ),
                )
                rerun = cur.rowcount != 1
        return LostClaim(
            attempt_id=claim.attempt_id,
            grant_id=claim.grant_id,
            tenant=tenant if isinstance(tenant, str) else None,
            principal=principal if isinstance(principal, str) else None,
            idempotency_key=key if isinstance(key, str) else None,
            claimed_at=claim.claimed_at or format_ms(0),
            rerun_elsewhere=rerun,
        )
