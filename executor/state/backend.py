"""The one store backend a configuration names, behind one value.

Role: :func:`open_backend` opens the store the configuration names -- the embedded SQLite use
store under ``EXECUTOR_STATE_DIR`` (``state/usestore.py``), or the shared PostgreSQL store named
by ``EXECUTOR_STORE_URL`` (``state/pgstore.py``) -- and answers one :class:`Backend`: the use
store, the host-ceiling window (or none: the ceilings keep theirs in memory), the attempts'
mirror (or none: the journal alone is the authority), the lost-writes guard (or none), a ping and
a close. Whoever assembles the executor reads these faces and never asks which backend it is.

Fencing (issue 29, docs/high-availability.md "Fencing") is part of the one interface: every
backend's ``claim_grant`` takes the attempt's fence
(:class:`~agentsafe.executor.state.records.AttemptFence`).
PostgreSQL checks it in the claim's statement; SQLite accepts it trivially, because no attempt of
a SQLite store is ever taken over while the process that opened it lives (its journal's lock is
held until it dies), and its backend has no mirror that would make one.

Callers: ``assembly.py`` (at start; the executor keeps the value, and ``plane.py`` reads its
name, pings it and settles keys through its use store).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..clock import Clock
from ..config import ExecutorConfig
from ..errors import ConfigError
from ..host.secrets import SecretStore
from .lostwrites import LostWritesGuard
from .pgattempts import SharedAttemptMirror
from .pgconn import check_store_url
from .pgstore import PostgresStore, PostgresWindow
from .protocol import UseStore
from .usestore import SQLiteUseStore, SQLiteWindow

__all__ = ["Backend", "open_backend", "open_shared_store"]


async def _always() -> bool:
    return True


@dataclass(frozen=True)
class Backend:
    """The opened store: every face the executor needs, whichever backend holds them."""

    name: str
    """``sqlite`` or ``postgresql`` (the ``store`` field of ``GET /v1/control/status``)."""
    store: UseStore
    window: SQLiteWindow | PostgresWindow | None
    """The ceilings' window (``lifecycle/ceilings.py``'s ``CeilingWindow``) every process of the
    store shares; ``None``: one process keeps its window in memory."""
    attempts: SharedAttemptMirror | None
    """The journal's mirror of open attempts in a store every replica shares; ``None``: the
    journal alone holds them."""
    lost_writes: LostWritesGuard | None
    """Checks each new database server against this replica's journal (issue 29)."""
    opened: Mapping[str, Any] | None
    """The details of the STORE_OPENED security event, for a store that announces itself."""
    ping: Callable[[], Awaitable[bool]]
    """Whether the store answers now (a store that cannot stop answering: always true)."""
    watched: bool
    """Whether the store can stop answering while this process lives (a database across a
    network), so its health is asked once a second."""

    async def close(self) -> None:
        await self.store.close()


async def open_backend(
    config: ExecutorConfig, secrets: SecretStore, *, clock: Clock, shared_window: bool
) -> Backend:
    """Open the store ``config`` names. ``shared_window``: this process is one of
    ``EXECUTOR_WORKERS`` workers, so the ceilings' window lives in the SQLite store they share."""
    if config.executor_store_url.given:
        lost_writes = None
        if config.executor_journal_dir is not None:
            # Every new database server is checked against this replica's journal before any
            # work reaches it (a failover that lost acknowledged claims halts).
            lost_writes = LostWritesGuard(
                Path(config.executor_journal_dir), owner=config.replica_id
            )
        shared = await open_shared_store(
            secrets, lease_seconds=config.executor_attempt_lease_seconds, lost_writes=lost_writes
        )
        return Backend(
            name="postgresql",
            store=shared.use_store,
            window=shared.window,
            attempts=SharedAttemptMirror(
                shared.attempts,
                owner=config.replica_id,
                lease_seconds=config.executor_attempt_lease_seconds,
                dispatch_seconds=config.downstream_timeout_ms / 1000.0,
                now=clock.now,
            ),
            lost_writes=lost_writes,
            opened={"backend": "postgresql", "schema_version": shared.schema_version},
            ping=shared.ping,
            watched=True,
        )
    assert config.executor_state_dir is not None  # the configuration requires it
    store = await SQLiteUseStore.open(Path(config.executor_state_dir), clock=clock)
    return Backend(
        name="sqlite",
        store=store,
        # EXECUTOR_WORKERS: one window for every worker, in the SQLite store they share
        window=SQLiteWindow(store) if shared_window else None,
        attempts=None,
        lost_writes=None,
        opened=None,
        ping=_always,
        watched=False,
    )


async def open_shared_store(
    secrets: SecretStore, *, lease_seconds: float, lost_writes: LostWritesGuard | None = None
) -> PostgresStore:
    """Open (and migrate) the shared store named by ``EXECUTOR_STORE_URL``; ``ConfigError``
    naming the variable, never the URL, when it is not a PostgreSQL URL; ``StoreError`` when the
    database does not answer or its schema is newer than this agentsafe. ``lease_seconds``
    (``EXECUTOR_ATTEMPT_LEASE_SECONDS``) also bounds how long a key's holder has to open its
    attempt."""
    handle = secrets.get("EXECUTOR_STORE_URL")
    if handle is None:
        raise ConfigError("EXECUTOR_STORE_URL", "is set but could not be read")
    with handle.reveal() as value:
        url = bytes(value).decode("utf-8", errors="replace").strip()
    return await PostgresStore.open(
        check_store_url(url), lease_seconds=lease_seconds, server_watch=lost_writes
    )
