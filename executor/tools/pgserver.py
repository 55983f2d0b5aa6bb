"""A throwaway PostgreSQL server: initdb into a temporary directory, a free loopback port.

For tests and benchmarks of the shared store, never for production (``trust`` authentication on
loopback; ``fsync=off`` unless ``durable=True``, which a benchmark of a durable path needs:
``fsync``, ``synchronous_commit`` and ``full_page_writes`` on, :data:`DURABILITY_SETTINGS`).
The binaries come from the Debian ``postgresql`` package (``/usr/lib/postgresql/<v>/bin``);
PostgreSQL refuses to run as root, so as root the server runs as the ``postgres`` user the
package creates. :meth:`PostgresServer.stop` and :meth:`PostgresServer.start` make the database
go away and come back.

``postgres_server(listen=(...))`` also listens on the addresses given (the end-to-end node's
bridge address, so its pods reach it); :meth:`PostgresServer.allow_network` then admits one
network with a password (``scram-sha-256``), never ``trust``.

Callers: ``tests/support/postgres.py`` (the test fixture), ``benchmarks/shared_store.py``,
``e2e/test_scenario.py`` (a database the node's executor pods share).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .harness import free_port

__all__ = [
    "DURABILITY_SETTINGS",
    "PostgresServer",
    "PostgresUnavailable",
    "find_binaries",
    "postgres_server",
]

#: What a ``durable`` server is started with: every commit on the disk before it returns.
DURABILITY_SETTINGS = (("fsync", "on"), ("synchronous_commit", "on"), ("full_page_writes", "on"))


def find_binaries() -> Path | None:
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), reverse=True)
    for initdb in candidates:
        if (initdb.parent / "pg_ctl").exists():
            return initdb.parent
    found = shutil.which("initdb")
    return Path(found).resolve().parent if found else None


class PostgresUnavailable(Exception):
    """The binaries (or, as root, the ``postgres`` user) are absent; the message says what to
    install."""


@dataclass
class PostgresServer:
    """One running cluster; :meth:`stop` and :meth:`start` simulate the database going away."""

    bindir: Path
    datadir: Path
    port: int
    user: str | None  # run as this user (when the tests run as root)
    listen: tuple[str, ...] = ()  # addresses beside 127.0.0.1
    durable: bool = False  # DURABILITY_SETTINGS, else fsync=off (tests: the protocol, not a disk)

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = list(argv)
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--", *command]
        return subprocess.run(command, check=check, capture_output=True, text=True, timeout=120)

    def initdb(self) -> None:
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.datadir / "data"),
            "-U",
            "agentsafe",
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
        )

    def start(self) -> None:
        addresses = ",".join(("127.0.0.1", *self.listen))
        settings = DURABILITY_SETTINGS if self.durable else (("fsync", "off"),)
        options = (
            f"-p {self.port} -c listen_addresses={addresses} -c unix_socket_directories="
            f"{self.datadir} {' '.join(f'-c {k}={v}' for k, v in settings)} "
            "-c max_connections=200"
        )
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.datadir / "data"),
            "-o",
            options,
            "-l",
            str(self.datadir / "server.log"),
            "-w",
            "-t",
            "60",
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        self._run(
            str(self.bindir / "pg_ctl"), "-D", str(self.datadir / "data"), "-m", mode, "-w", "stop"
        )

    def settings(self, *names: str) -> dict[str, str]:
        """The running server's values of ``names`` (``SHOW``): what it really runs with."""
        return {name: self.psql("postgres", f"SHOW {name}").strip() for name in names}

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://agentsafe@127.0.0.1:{self.port}/{database}"

    def allow_network(self, cidr: str, password: str) -> None:
        """Admit connections from ``cidr`` (to any database, as ``agentsafe``) that present
        ``password``; the server reloads its rules. Loopback stays ``trust``."""
        if not password.isalnum():
            raise ValueError("the password must be letters and digits")
        self.psql("postgres", f"ALTER ROLE agentsafe PASSWORD '{password}'")
        hba = self.datadir / "data" / "pg_hba.conf"
        with hba.open("a", encoding="utf-8") as rules:
            rules.write(f"host all agentsafe {cidr} scram-sha-256\n")
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.datadir / "data"), "reload")

    def create_database(self) -> str:
        """A fresh, empty database; returns its URL."""
        name = "t_" + uuid.uuid4().hex[:16]
        self.psql("postgres", f"CREATE DATABASE {name}")
        return self.url(name)

    def psql(self, database: str, sql: str) -> str:
        result = self._run(
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
        )
        return result.stdout


@contextlib.contextmanager
def postgres_server(
    *, listen: tuple[str, ...] = (), durable: bool = False, port: int | None = None
) -> Iterator[PostgresServer]:
    """Start a server for the ``with`` block (on loopback and ``listen``, at ``port`` or a free
    one; with ``durable``, :data:`DURABILITY_SETTINGS`); :class:`PostgresUnavailable` without
    binaries."""
    bindir = find_binaries()
    if bindir is None:
        raise PostgresUnavailable("PostgreSQL binaries absent (apt-get install -y postgresql)")
    user: str | None = None
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            raise PostgresUnavailable(
                "running as root needs the postgres user (apt-get install -y postgresql)"
            ) from None
        user = "postgres"
    # Not under a private temporary tree: the server may run as another user.
    datadir = Path(tempfile.mkdtemp(prefix="agentsafe-pg-"))
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(datadir, entry.pw_uid, entry.pw_gid)
    os.chmod(datadir, 0o700)
    server = PostgresServer(
        bindir=bindir,
        datadir=datadir,
        port=free_port() if port is None else port,
        user=user,
        listen=listen,
        durable=durable,
    )
    try:
        server.initdb()
        server.start()
        yield server
    finally:
        with contextlib.suppress(Exception):
            server.stop("immediate")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                shutil.rmtree(datadir)
                break
            except OSError:
                time.sleep(0.1)
