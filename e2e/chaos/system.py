"""The system under test: the database pair, toxiproxy, the provider and three replicas.

Role: start and stop the real processes of a chaos run and give the nemesis handles on them.
Every replica ``rN`` reaches the database through two proxies (``rN-db1``, ``rN-db2``: the two
hosts of its multi-host store URL with ``target_session_attrs=read-write``) and the provider
through ``rN-provider``; the standby streams from the primary through ``replication``. Replica
``r2`` runs under libfaketime (Debian's ``faketime`` package; ``LD_PRELOAD``) with a timestamp
file the nemesis rewrites to step its wall clock (realtime only; the monotonic clock is left
alone, ``FAKETIME_DONT_FAKE_MONOTONIC=1``). The nemesis also reads the database directly
(:meth:`System.attempt_state`) to hit a lifecycle point; the checker never does.

Callers: ``chaos/run.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psycopg

from agentsafe.executor.tools.harness import (
    ExecutorProcess,
    ProviderProcess,
    Workspace,
    free_port,
)

from .pgpair import PgPair
from .toxiproxy import Toxiproxy

__all__ = ["FAKETIME_LIBRARY", "REPLICAS", "System", "SystemSettings"]

REPLICAS = 3
FAKETIME_LIBRARY = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
CLOCK_REPLICA = 2


@dataclass(frozen=True)
class SystemSettings:
    lease_seconds: int = 5
    intent_ttl_seconds: int = 30
    downstream_timeout_ms: int = 2000


@dataclass
class System:
    root: Path
    toxiproxy_binary: Path
    settings: SystemSettings = field(default_factory=SystemSettings)
    pg: PgPair | None = None
    proxy: Toxiproxy | None = None
    provider: ProviderProcess | None = None
    replicas: list[ExecutorProcess] = field(default_factory=list)
    workspace: Workspace | None = None
    ports: dict[str, int] = field(default_factory=dict)
    clock_file: Path | None = None
    paused: set[int] = field(default_factory=set)
    primary_link: str = "db1"
    restarting: dict[int, asyncio.Future[None]] = field(default_factory=dict)
    #: Another interpreter for the replicas (``--replica-python``: another checkout's venv, to
    #: run the same schedule against other code); None: this one.
    replica_python: str | None = None

    @property
    def record_path(self) -> Path:
        return self.root / "provider-record.jsonl"

    def journal_dir(self, index: int) -> Path:
        return self.root / "ws" / f"r{index}" / "journal"

    def evidence_dir(self, index: int) -> Path:
        return self.root / "ws" / f"r{index}" / "evidence"

    def stdout_path(self, index: int) -> Path:
        return self.root / f"r{index}.stdout.jsonl"

    async def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.pg = PgPair.create(free_port)
        primary = self.pg.start_primary()
        self.proxy = Toxiproxy(self.toxiproxy_binary, free_port(), self.root / "toxiproxy.log")
        self.proxy.start()
        self.ports["replication"] = free_port()
        self.proxy.create("replication", self.ports["replication"], primary.port)
        standby = self.pg.start_standby(self.ports["replication"])
        self.provider = ProviderProcess(self.root, args=("--record", str(self.record_path)))
        await self.provider.start()
        for index in range(REPLICAS):
            for link, upstream in (
                ("db1", primary.port),
                ("db2", standby.port),
                ("provider", self.provider.port),
            ):
                name = f"r{index}-{link}"
                self.ports[name] = free_port()
                self.proxy.create(name, self.ports[name], upstream)
        self.workspace = Workspace(self.root / "ws")
        self.clock_file = self.root / "faketime-r2"
        self.clock_file.write_text("+0\n")
        for index in range(REPLICAS):
            replica = ExecutorProcess(self._replica_env(index), self.root, f"r{index}")
            if self.replica_python is not None:  # another checkout's code (--replica-python)
                replica.argv[0] = self.replica_python
            self.replicas.append(replica)
        await asyncio.gather(*(replica.start(timeout=120) for replica in self.replicas))

    def halted_for_lost_writes(self) -> list[str]:
        """The replicas whose own security stream (stderr) says HALTED with cause
        STORE_LOST_WRITES: they stay halted until an operator resumes them (the playbook)."""
        halted: list[str] = []
        for index in range(REPLICAS):
            path = self.root / f"r{index}.stderr.jsonl"
            try:
                lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
            except OSError:
                continue
            for line in lines:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if event.get("event") == "HALTED" and event.get("cause") == "STORE_LOST_WRITES":
                    halted.append(f"r{index}")
                    break
        return halted

    def store_url(self, index: int) -> str:
        db1, db2 = self.ports[f"r{index}-db1"], self.ports[f"r{index}-db2"]
        return (
            f"postgresql://agentsafe@127.0.0.1:{db1},127.0.0.1:{db2}/chaos"
            "?target_session_attrs=read-write&connect_timeout=3"
        )

    def _replica_env(self, index: int) -> dict[str, str]:
        assert self.workspace is not None
        own = self.root / "ws" / f"r{index}"
        for sub in ("journal", "evidence"):
            (own / sub).mkdir(parents=True, exist_ok=True, mode=0o700)
        provider_url = f"http://127.0.0.1:{self.ports[f'r{index}-provider']}"
        env: dict[str, str] = self.workspace.environment(
            provider_url=provider_url,
            port=free_port(),
            extra={
                "EXECUTOR_STORE_URL": self.store_url(index),
                "EXECUTOR_REPLICA_ID": f"r{index}",
                "EXECUTOR_JOURNAL_DIR": str(own / "journal"),
                "EXECUTOR_EVIDENCE_DIR": str(own / "evidence"),
                "EXECUTOR_ATTEMPT_LEASE_SECONDS": str(self.settings.lease_seconds),
                "EXECUTOR_INTENT_TTL_SECONDS": str(self.settings.intent_ttl_seconds),
                "DOWNSTREAM_TIMEOUT_MS": str(self.settings.downstream_timeout_ms),
            },
        )
        env.pop("EXECUTOR_STATE_DIR")
        if index == CLOCK_REPLICA and self.clock_file is not None:
            env.update(
                {
                    "LD_PRELOAD": str(FAKETIME_LIBRARY),
                    "FAKETIME_TIMESTAMP_FILE": str(self.clock_file),
                    "FAKETIME_DONT_FAKE_MONOTONIC": "1",
                    "FAKETIME_CACHE_DURATION": "1",
                }
            )
        return env

    # -- faults ------------------------------------------------------------------------------
    def pause(self, index: int) -> None:
        process = self.replicas[index].process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGSTOP)
            self.paused.add(index)

    def resume(self, index: int) -> None:
        process = self.replicas[index].process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGCONT)
        self.paused.discard(index)

    def kill(self, index: int) -> None:
        self.replicas[index].kill()
        self.paused.discard(index)

    def restart_soon(self, index: int) -> None:
        """Start a killed replica again without waiting for it (see :meth:`ready`)."""
        replica = self.replicas[index]
        if not replica.running and index not in self.restarting:
            self.restarting[index] = asyncio.ensure_future(
                replica.start(timeout=120, expect_ready=False)
            )

    async def ready(self, index: int, timeout: float = 20.0) -> None:
        """The replica runs (a restart under way is awaited) and, within ``timeout``, says it is
        ready (a restarted replica reconciles first: a fault aimed at it meanwhile would find
        its keys refused, not in flight). Past ``timeout`` the episode goes on regardless."""
        self.restart_soon(index)
        pending = self.restarting.pop(index, None)
        if pending is not None:
            await pending
        url = self.replicas[index].url + "/ready"
        deadline = asyncio.get_running_loop().time() + timeout
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as session:
            while asyncio.get_running_loop().time() < deadline:
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with session.get(url) as response:
                        if response.status == 200:
                            return
                await asyncio.sleep(0.1)

    def step_clock(self, offset_seconds: int) -> None:
        assert self.clock_file is not None
        staging = self.clock_file.with_suffix(".tmp")
        staging.write_text(f"{offset_seconds:+d}\n")
        staging.replace(self.clock_file)

    def links(self, index: int, *, database: bool) -> list[str]:
        return [f"r{index}-db1", f"r{index}-db2"] if database else [f"r{index}-provider"]

    def heal_all(self) -> None:
        assert self.proxy is not None
        for name in list(self.ports):
            with contextlib.suppress(Exception):
                self.proxy.heal(name)
                self.proxy.clear(name)
        for index in list(self.paused):
            self.resume(index)
        if self.clock_file is not None:
            self.step_clock(0)

    def failover(self) -> None:
        """Crash the primary, promote the standby, build a new standby behind the other host."""
        assert self.pg is not None
        assert self.proxy is not None
        dead_link = self.primary_link
        new_primary = self.pg.failover()
        self.proxy.retarget("replication", new_primary.port)
        self.proxy.heal("replication")
        standby = self.pg.start_standby(self.ports["replication"])
        # The host that named the dead primary now names the new standby.
        self.primary_link = "db2" if dead_link == "db1" else "db1"
        for index in range(REPLICAS):
            self.proxy.retarget(f"r{index}-{dead_link}", standby.port)

    # -- the nemesis's view of the database ----------------------------------------------------
    async def attempt_state(self, key: str) -> dict[str, Any] | None:
        """The key's idempotency row and its attempt, read on the primary (nemesis only)."""
        assert self.pg is not None
        url = f"postgresql://agentsafe@127.0.0.1:{self.pg.primary.port}/chaos"
        try:
            async with await psycopg.AsyncConnection.connect(url, connect_timeout=3) as conn:
                cur = await conn.execute(
                    "SELECT i.state, i.attempt_id, a.state, a.grant_claimed, a.owner,"
                    " (SELECT count(*) FROM grant_claims g WHERE g.grant_id = a.grant_id)"
                    " FROM idempotency i LEFT JOIN attempts a ON a.attempt_id = i.attempt_id"
                    " WHERE i.key = %s",
                    (key,),
                )
                row = await cur.fetchone()
        except psycopg.Error:
            return None
        if row is None:
            return None
        return {
            "key_state": row[0],
            "attempt_id": row[1],
            "attempt_state": row[2],
            "grant_claimed_mirror": row[3],
            "owner": row[4],
            "grant_claims": int(row[5] or 0),
        }

    async def stop(self) -> None:
        for index in range(len(self.replicas)):
            self.resume(index)
        for replica in self.replicas:
            with contextlib.suppress(Exception):
                replica.terminate(timeout=15)
        if self.provider is not None:
            self.provider.terminate()
        if self.proxy is not None:
            self.proxy.stop()
        if self.pg is not None:
            self.pg.close()


def faketime_available() -> bool:
    return FAKETIME_LIBRARY.exists() and os.access(FAKETIME_LIBRARY, os.R_OK)
