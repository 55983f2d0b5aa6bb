"""A PostgreSQL primary with a streaming standby (Debian's PostgreSQL), and a real promotion.

Role: the database side of the nemesis. The primary is an ``initdb`` cluster with WAL for
replication; the standby is a ``pg_basebackup -R`` of it that streams WAL through a toxiproxy
link (so the harness can cut replication and make an asynchronous failover lose writes).
:meth:`PgPair.set_synchronous` switches ``synchronous_standby_names`` (``ALTER SYSTEM`` and a
reload); :meth:`PgPair.failover` stops the primary at once (``-m immediate``: a crash, never a
clean hand-over) and ``pg_ctl promote``s the standby; :meth:`PgPair.rebuild_standby` makes a new
standby of the new primary so that a later failover has somewhere to go.

The failover branch of issue 29 may bring a shared module for this (tests/support/pgpair.py);
until then this one lives here, written for the harness only.

Callers: ``chaos/system.py``.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["PgNode", "PgPair", "PostgresMissing", "find_bindir"]

APPLICATION_NAME = "chaos_standby"


class PostgresMissing(RuntimeError):
    """Debian's PostgreSQL binaries (or, as root, the ``postgres`` user) are absent."""


def find_bindir() -> Path | None:
    for initdb in sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), reverse=True):
        if (initdb.parent / "pg_ctl").exists():
            return initdb.parent
    return None


@dataclass
class PgNode:
    """One PostgreSQL cluster (a data directory and the port it listens on)."""

    bindir: Path
    datadir: Path
    port: int
    user: str | None

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = list(argv)
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--", *command]
        return subprocess.run(command, check=check, capture_output=True, text=True, timeout=120)

    @property
    def data(self) -> Path:
        return self.datadir / "data"

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories="
            f"{self.datadir} -c max_connections=200 -c wal_level=replica -c max_wal_senders=10"
            " -c hot_standby=on -c fsync=on -c synchronous_commit=on -c wal_keep_size=256MB"
        )
        self.run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.datadir / "server.log"),
            "-w",
            "-t",
            "60",
            "start",
        )

    def stop(self, mode: str = "immediate") -> None:
        self.run(
            str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop", check=False
        )

    def promote(self) -> None:
        self.run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-w", "-t", "60", "promote")

    def psql(self, sql: str, database: str = "postgres") -> str:
        return self.run(
            str(self.bindir / "psql"),
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-U",
            "agentsafe",
            "-d",
            database,
            "-v",
            "ON_ERROR_STOP=1",
            "-At",
            "-c",
            sql,
        ).stdout.strip()


@dataclass
class PgPair:
    """A primary and its standby; ``replication_port`` is where the standby reaches the primary
    (a toxiproxy listener the caller points at the primary's real port)."""

    bindir: Path
    root: Path
    user: str | None
    free_port: Callable[[], int]
    nodes: list[PgNode] = field(default_factory=list)
    primary_index: int = 0
    standby_index: int | None = None
    generation: int = 0

    @classmethod
    def create(cls, free_port: Callable[[], int]) -> PgPair:
        bindir = find_bindir()
        if bindir is None:
            raise PostgresMissing("PostgreSQL binaries absent (apt-get install -y postgresql)")
        user: str | None = None
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                raise PostgresMissing("as root the postgres user is needed") from None
            user = "postgres"
        root = Path(tempfile.mkdtemp(prefix="agentsafe-chaos-pg-"))
        if user is not None:
            entry = pwd.getpwnam(user)
            os.chown(root, entry.pw_uid, entry.pw_gid)
        os.chmod(root, 0o700)
        return cls(bindir=bindir, root=root, user=user, free_port=free_port)

    def _new_node(self) -> PgNode:
        self.generation += 1
        datadir = self.root / f"node{self.generation}"
        datadir.mkdir(mode=0o700)
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(datadir, entry.pw_uid, entry.pw_gid)
        node = PgNode(self.bindir, datadir, self.free_port(), self.user)
        self.nodes.append(node)
        return node

    @property
    def primary(self) -> PgNode:
        return self.nodes[self.primary_index]

    @property
    def standby(self) -> PgNode | None:
        return None if self.standby_index is None else self.nodes[self.standby_index]

    def start_primary(self) -> PgNode:
        node = self._new_node()
        node.run(
            str(self.bindir / "initdb"),
            "-D",
            str(node.data),
            "-U",
            "agentsafe",
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
        )
        node.start()
        node.psql("CREATE DATABASE chaos")
        self.primary_index = len(self.nodes) - 1
        return node

    def start_standby(self, replication_port: int) -> PgNode:
        """A new standby of the current primary that streams through ``replication_port``."""
        node = self._new_node()
        node.run(
            str(self.bindir / "pg_basebackup"),
            "-h",
            "127.0.0.1",
            "-p",
            str(self.primary.port),
            "-U",
            "agentsafe",
            "-D",
            str(node.data),
            "-X",
            "stream",
            "-c",
            "fast",
        )
        conninfo = (
            f"host=127.0.0.1 port={replication_port} user=agentsafe"
            f" application_name={APPLICATION_NAME}"
        )
        auto = node.data / "postgresql.auto.conf"
        node.run("sh", "-c", f"echo \"primary_conninfo = '{conninfo}'\" >> {auto}")
        node.run("touch", str(node.data / "standby.signal"))
        node.start()
        self.standby_index = len(self.nodes) - 1
        return node

    def set_synchronous(self, synchronous: bool) -> None:
        names = f"'{APPLICATION_NAME}'" if synchronous else "''"
        self.primary.psql(f"ALTER SYSTEM SET synchronous_standby_names = {names}")
        self.primary.psql("SELECT pg_reload_conf()")

    def streaming(self) -> bool:
        """Whether the standby is connected and caught up (the primary's view)."""
        text = self.primary.psql(
            "SELECT count(*) FROM pg_stat_replication"
            " WHERE state = 'streaming' AND replay_lsn = pg_current_wal_lsn()"
        )
        return text == "1"

    def failover(self) -> PgNode:
        """Crash the primary and promote the standby; returns the new primary."""
        if self.standby_index is None:
            raise RuntimeError("no standby to promote")
        self.primary.stop("immediate")
        new = self.nodes[self.standby_index]
        new.promote()
        deadline = time.monotonic() + 60
        while new.psql("SELECT pg_is_in_recovery()") != "f":
            if time.monotonic() > deadline:
                raise TimeoutError("the promoted standby stays in recovery")
            time.sleep(0.1)
        self.primary_index, self.standby_index = self.standby_index, None
        return new

    def close(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
