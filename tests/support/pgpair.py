"""A real PostgreSQL primary with a streaming standby, for failover tests (Debian's binaries).

:func:`postgres_pair` starts a primary (``tools/pgserver.py``'s :class:`PostgresServer`, on a
free loopback port) and a standby cloned from it with ``pg_basebackup -R`` (streaming, hot
standby, its own free port), and stops both at the end of the ``with`` block. With
``synchronous=True`` the primary waits for the standby on every commit
(``synchronous_standby_names = 'FIRST 1 (agentsafe_standby)'``, ``synchronous_commit = on``):
a failover loses nothing acknowledged. With ``synchronous=False`` (asynchronous, most installs'
default) a commit returns before the standby has it.

What a test does with the pair:

- :meth:`PostgresPair.url` -- one connection string naming both servers with
  ``target_session_attrs=read-write`` (key=value or URL form): a client follows the primary.
- :meth:`PostgresPair.wait_caught_up` -- the standby has replayed everything the primary wrote.
- :meth:`PostgresPair.detach_standby` -- the standby stops streaming (``primary_conninfo`` empty,
  reloaded), keeping what it has: later commits on an asynchronous primary are acknowledged and
  never reach it (the writes a failover then loses). On a synchronous pair commits would wait.
- :meth:`PostgresPair.fail_over` -- the primary stops (``immediate``: a crash) and the standby is
  promoted (``pg_ctl promote``); it is the new primary, on a new timeline, and (no standby being
  left) stops waiting for a synchronous one.

Without the binaries the test is skipped with one line, unless ``AGENTSAFE_E2E=require`` or
``CI`` is set (as ``tests/support/postgres.py``).

Callers: ``tests/integration/test_store_failover.py``; the chaos harness reuses it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentsafe.executor.tools.harness import free_port
from agentsafe.executor.tools.pgserver import (
    PostgresServer,
    PostgresUnavailable,
    postgres_server,
)

__all__ = ["STANDBY_NAME", "PostgresPair", "postgres_pair", "running_pair"]

STANDBY_NAME = "agentsafe_standby"
"""The standby's ``application_name``, which ``synchronous_standby_names`` names."""


def _wait(predicate: object, *, timeout: float, what: str) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise TimeoutError(f"timed out waiting for {what}")


@dataclass
class PostgresPair:
    """A primary and its streaming standby; after :meth:`fail_over` the standby is primary."""

    primary: PostgresServer
    standby: PostgresServer
    synchronous: bool
    database: str = "postgres"

    def url(self, database: str | None = None, *, form: str = "keyvalue") -> str:
        """Both servers, the primary first, ``target_session_attrs=read-write``."""
        name = database or self.database
        ports = (self.primary.port, self.standby.port)
        if form == "uri":
            hosts = ",".join(f"127.0.0.1:{p}" for p in ports)
            return f"postgresql://agentsafe@{hosts}/{name}?target_session_attrs=read-write"
        return (
            f"host=127.0.0.1,127.0.0.1 port={ports[0]},{ports[1]} user=agentsafe dbname={name}"
            " target_session_attrs=read-write connect_timeout=2"
        )

    def create_database(self) -> str:
        """A fresh database on the primary (replicated); its name. The standby has it once
        :meth:`wait_caught_up` returns."""
        url = self.primary.create_database()
        self.database = url.rsplit("/", 1)[1]
        self.wait_caught_up()
        return self.database

    def wait_caught_up(self, timeout: float = 30.0) -> None:
        target = self.primary.psql("postgres", "SELECT pg_current_wal_lsn()").strip()

        def replayed() -> bool:
            done = self.standby.psql(
                "postgres", f"SELECT pg_last_wal_replay_lsn() >= '{target}'::pg_lsn"
            ).strip()
            return done == "t"

        _wait(replayed, timeout=timeout, what="the standby to replay the primary's WAL")

    def detach_standby(self, timeout: float = 30.0) -> None:
        """Stop streaming: the standby keeps what it replayed and receives nothing more."""
        self.standby.psql("postgres", "ALTER SYSTEM SET primary_conninfo = ''")
        self.standby.psql("postgres", "SELECT pg_reload_conf()")

        def detached() -> bool:
            return (
                self.primary.psql("postgres", "SELECT count(*) FROM pg_stat_replication").strip()
                == "0"
            )

        _wait(detached, timeout=timeout, what="the standby to stop streaming")

    def fail_over(self, timeout: float = 60.0) -> None:
        """The primary crashes (``immediate``), the standby is promoted and takes writes."""
        self.primary.stop("immediate")
        self.standby._run(
            str(self.standby.bindir / "pg_ctl"),
            "-D",
            str(self.standby.datadir / "data"),
            "-w",
            "-t",
            str(int(timeout)),
            "promote",
        )

        def writable() -> bool:
            return self.standby.psql("postgres", "SELECT pg_is_in_recovery()").strip() == "f"

        _wait(writable, timeout=timeout, what="the promoted standby to take writes")
        # The copy carried the primary's synchronous_standby_names: the new primary has no
        # standby left, and would hold every commit for ever (what CloudNativePG's
        # ``dataDurability: required`` does with no standby left; docs/high-availability.md).
        self.standby.psql("postgres", "ALTER SYSTEM RESET synchronous_standby_names")
        self.standby.psql("postgres", "SELECT pg_reload_conf()")


def _standby(primary: PostgresServer) -> PostgresServer:
    datadir = Path(tempfile.mkdtemp(prefix="agentsafe-pg-standby-"))
    if primary.user is not None:
        entry = pwd.getpwnam(primary.user)
        os.chown(datadir, entry.pw_uid, entry.pw_gid)
    os.chmod(datadir, 0o700)
    standby = PostgresServer(
        bindir=primary.bindir, datadir=datadir, port=free_port(), user=primary.user
    )
    standby._run(
        str(primary.bindir / "pg_basebackup"),
        "-h",
        "127.0.0.1",
        "-p",
        str(primary.port),
        "-U",
        "agentsafe",
        "-D",
        str(datadir / "data"),
        "-R",
        "-X",
        "stream",
        "-c",
        "fast",
        "--no-sync",
    )
    conninfo = f"host=127.0.0.1 port={primary.port} user=agentsafe application_name={STANDBY_NAME}"
    auto = datadir / "data" / "postgresql.auto.conf"
    # The primary's ALTER SYSTEM settings came with the copy; the standby streams under its name.
    standby._run("sh", "-c", f"printf \"%s\\n\" \"primary_conninfo = '{conninfo}'\" >> '{auto}'")
    standby.start()
    return standby


@contextlib.contextmanager
def postgres_pair(*, synchronous: bool) -> Iterator[PostgresPair]:
    """A primary and a streaming standby for the ``with`` block (synchronous or not);
    :class:`PostgresUnavailable` without the binaries."""
    with postgres_server() as primary:
        if shutil.which("pg_basebackup", path=str(primary.bindir)) is None:
            raise PostgresUnavailable("pg_basebackup absent (apt-get install -y postgresql)")
        if synchronous:
            primary.psql(
                "postgres",
                f"ALTER SYSTEM SET synchronous_standby_names = 'FIRST 1 ({STANDBY_NAME})'",
            )
            primary.psql("postgres", "ALTER SYSTEM SET synchronous_commit = 'on'")
            primary.psql("postgres", "SELECT pg_reload_conf()")
        standby = _standby(primary)
        try:
            pair = PostgresPair(primary=primary, standby=standby, synchronous=synchronous)
            _wait(
                lambda: (
                    primary.psql(
                        "postgres",
                        "SELECT count(*) FROM pg_stat_replication"
                        f" WHERE application_name = '{STANDBY_NAME}' AND state = 'streaming'",
                    ).strip()
                    == "1"
                ),
                timeout=60,
                what="the standby to stream",
            )
            yield pair
        finally:
            with contextlib.suppress(Exception):
                standby.stop("immediate")
            shutil.rmtree(standby.datadir, ignore_errors=True)


def running_pair(*, synchronous: bool) -> Iterator[PostgresPair]:
    """:func:`postgres_pair` for a fixture: skipped without the binaries (failed under CI)."""
    try:
        with postgres_pair(synchronous=synchronous) as pair:
            yield pair
    except PostgresUnavailable as exc:
        if os.environ.get("AGENTSAFE_E2E") == "require" or os.environ.get("CI"):
            pytest.fail(f"{exc}; AGENTSAFE_E2E=require or CI is set")
        pytest.skip(str(exc))
