"""One chaos run: start the system, drive clients, play the schedule, heal, check, report.

Role: the nemesis and the clients. Each key is driven by a client that retries with the same
idempotency key (first on the replica the schedule names, then on the others in turn, 4 s per
request, 0.5 s between tries) until it gets a final answer (:func:`chaos.checker.is_final`); after
the faults heal, every key is asked once more (a client whose answer was lost does that) and
driven to a final answer again. Background keys arrive about once a second on random replicas.
Every answer goes to ``answers.jsonl`` (status, outcome, code, grant id; never a token).

How a point-targeted fault finds its point (the nemesis may look at the database; the checker
never does): the target replica's database links get a 500 ms downstream latency toxic, so each
answer the database sends it takes that long to arrive (what the database committed is visible at
once, the replica learns it 500 ms later), and the nemesis polls the primary. A replica paused
there finds the answer waiting in its socket when it resumes and carries on from that point:

=============  ==================================================================================
before-open    the key's idempotency row exists and its attempt row does not yet
after-open     the attempt row is OPEN and no grant claim exists yet
after-claim    the grant claim row exists (the mirror and the send come after)
during-send    the provider's record has the request (the answer back is delayed 1200 ms)
after-send     the provider's record has its answer (closing the attempt is a statement away)
=============  ==================================================================================

A pause lasts longer than the attempt lease (lease + 1 s + the episode's hold); a killed replica
restarts after the episode's hold. Partitions disable the replica's proxies for the lease plus the
hold (the provider partition strikes while a request is in flight). A failover crashes the primary
while a burst of keys is in flight (asynchronous: with the replication link cut first, so the
promoted standby really lacks acknowledged writes), promotes the standby and builds a new one.
A clock step moves ``r2``'s wall clock by the episode's offset for a while.

Callers: ``chaos/__main__.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from . import checker
from .schedule import Episode
from .system import REPLICAS, System, SystemSettings

__all__ = ["RunOptions", "run"]

DB_LATENCY_MS = 500
SEND_LATENCY_MS = 1200
REQUEST_TIMEOUT = 8.0
RETRY_PAUSE = 0.5
#: After the faults heal, every key must have a final answer within this many seconds: the
#: lease, the grant's lifetime (a claimed grant whose send never happened is concluded
#: not-executed only after it expired) plus the dispatch deadline, and the reconciliation period.
BOUND_SECONDS = 90
#: The halt cause of a replica that found the database lacking a claim it acknowledged.
LOST_WRITES = "STORE_LOST_WRITES"


@dataclass
class RunOptions:
    seed: int
    schedule: list[Episode]
    out: Path
    toxiproxy: Path
    bound_seconds: float = BOUND_SECONDS
    settings: SystemSettings = field(default_factory=SystemSettings)
    background_interval: float = 1.0
    replica_python: str | None = None


class _Log:
    def __init__(self) -> None:
        self.started = time.monotonic()

    def __call__(self, message: str) -> None:
        elapsed = time.monotonic() - self.started
        print(f"[chaos {time.strftime('%H:%M:%S')} +{elapsed:5.1f}s] {message}", flush=True)


class Clients:
    """Clients that retry with the same key; every answer is one line of ``answers.jsonl``."""

    def __init__(self, system: System, path: Path, log: _Log) -> None:
        self.system = system
        self.path = path
        self.log = log
        self.amounts: dict[str, int] = {}
        self.final: dict[str, dict[str, Any]] = {}
        self.tasks: list[asyncio.Task[None]] = []
        self.stop = asyncio.Event()
        self.session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Clients:
        self.session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT),
            connector=aiohttp.TCPConnector(limit=0, force_close=True),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.session is not None:
            await self.session.close()

    def _write(self, entry: dict[str, Any]) -> None:
        with self.path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(entry, sort_keys=True) + "\n")

    async def ask(self, key: str, replica: int, phase: str) -> dict[str, Any]:
        assert self.session is not None
        target = self.system.replicas[replica]
        sent = time.time()
        entry: dict[str, Any] = {"key": key, "replica": f"r{replica}", "sent": sent, "phase": phase}
        try:
            status, body = await target.propose(self.session, amount=self.amounts[key], key=key)
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            entry.update({"status": None, "error": type(error).__name__})
        else:
            entry.update(
                {
                    "status": status,
                    "outcome": body.get("outcome"),
                    "executed": body.get("executed"),
                    "code": _code(body),
                    "reason_codes": body.get("reason_codes"),
                    "replayed": body.get("replayed"),
                    "grant_id": (body.get("authorization") or {}).get("grant_id"),
                    "lost_writes": LOST_WRITES in json.dumps(body),
                }
            )
        entry["at"] = time.time()
        self._write(entry)
        return entry

    async def drive(self, key: str, first: int, phase: str = "run") -> None:
        """Ask until a final answer (or the run stops), first ``first`` then the others."""
        attempt = 0
        while not self.stop.is_set():
            replica = (first + attempt) % REPLICAS
            attempt += 1
            answer = await self.ask(key, replica, phase)
            if checker.is_final(answer):
                self.final.setdefault(key, answer)
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), RETRY_PAUSE)

    def start(self, key: str, amount: int, first: int, phase: str = "run") -> asyncio.Task[None]:
        self.amounts.setdefault(key, amount)
        task = asyncio.ensure_future(self.drive(key, first, phase))
        self.tasks.append(task)
        return task


def _code(body: dict[str, Any]) -> Any:
    error = body.get("error")
    if isinstance(error, dict):
        return error.get("code")
    return body.get("code")


async def _poll(predicate: Callable[[], Awaitable[bool]], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(0.02)
    return False


def _provider_events(system: System, key: str) -> list[str]:
    events: list[str] = []
    with contextlib.suppress(OSError):
        for line in system.record_path.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                entry = json.loads(line)
                if entry.get("key") == key:
                    events.append(str(entry.get("event")))
    return events


class Nemesis:
    def __init__(self, system: System, clients: Clients, log: _Log, rng: random.Random) -> None:
        self.system = system
        self.clients = clients
        self.log = log
        self.rng = rng

    @property
    def proxy(self) -> Any:
        return self.system.proxy

    async def _observed(self, key: str) -> str:
        state = await self.system.attempt_state(key)
        provider = _provider_events(self.system, key)
        if state is None:
            db = "no key row"
        else:
            db = (
                f"key {state['key_state']}, attempt {state['attempt_state']},"
                f" grant claims {state['grant_claims']}"
            )
        return (
            f"db: {db}; provider: {provider.count('received')} received,"
            f" {provider.count('answered')} answered"
        )

    async def _reached(self, point: str, key: str, task: asyncio.Task[None] | None = None) -> bool:
        """Whether ``key`` is at ``point``; also True once its client is done (the key settled
        some other way, say refused: waiting longer would find nothing)."""
        if task is not None and task.done():
            return True
        if point in ("during-send", "after-send"):
            wanted = "received" if point == "during-send" else "answered"
            return wanted in _provider_events(self.system, key)
        state = await self.system.attempt_state(key)
        if state is None:
            return False
        if point == "before-open":
            return state["attempt_state"] is None
        if point == "after-open":
            return bool(state["attempt_state"] == "OPEN" and state["grant_claims"] == 0)
        return bool(state["grant_claims"])  # after-claim

    async def _settle(self, task: asyncio.Task[None], timeout: float = 5.0) -> None:
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(task), timeout)

    async def play(self, episode: Episode) -> str:
        handler = {
            "pause": self._at_point,
            "kill": self._at_point,
            "partition-db": self._partition_db,
            "partition-provider": self._partition_provider,
            "failover-sync": self._failover,
            "failover-async": self._failover,
            "clock-step": self._clock_step,
        }[episode.kind if "@" in episode.fault else episode.fault]
        await self.system.ready(episode.replica)
        return await handler(episode)

    async def _at_point(self, episode: Episode) -> str:
        system, index, key = self.system, episode.replica, episode.key
        point = episode.point or "after-open"
        if point == "during-send":
            self.proxy.latency(f"r{index}-provider", SEND_LATENCY_MS, stream="downstream")
        else:
            for link in system.links(index, database=True):
                self.proxy.latency(link, DB_LATENCY_MS, stream="downstream")
        task = self.clients.start(key, episode.amount, index)
        reached = await _poll(lambda: self._reached(point, key, task), 30)
        if episode.kind == "pause":
            system.pause(index)
        else:
            system.kill(index)
        observed = await self._observed(key)
        if task.done():
            observed = f"the key settled before its point; struck anyway; {observed}"
        elif not reached:
            observed = f"point not seen within 30 s; struck anyway; {observed}"
        for link in [*system.links(index, database=True), *system.links(index, database=False)]:
            self.proxy.clear(link)
        if episode.kind == "pause":
            await asyncio.sleep(system.settings.lease_seconds + 1 + episode.hold_seconds)
            system.resume(index)
        else:
            await asyncio.sleep(episode.hold_seconds)
            system.restart_soon(index)
        await self._settle(task)
        return observed

    async def _partition_db(self, episode: Episode) -> str:
        system, index, key = self.system, episode.replica, episode.key
        for link in system.links(index, database=True):
            self.proxy.latency(link, DB_LATENCY_MS, stream="downstream")
        task = self.clients.start(key, episode.amount, index)
        await _poll(lambda: self._reached("before-open", key, task), 20)
        for link in system.links(index, database=True):
            self.proxy.partition(link)
            self.proxy.clear(link)
        observed = await self._observed(key)
        await asyncio.sleep(system.settings.lease_seconds + episode.hold_seconds)
        for link in system.links(index, database=True):
            self.proxy.heal(link)
        await self._settle(task)
        return observed

    async def _partition_provider(self, episode: Episode) -> str:
        system, index, key = self.system, episode.replica, episode.key
        link = f"r{index}-provider"
        self.proxy.latency(link, SEND_LATENCY_MS, stream="downstream")
        task = self.clients.start(key, episode.amount, index)
        await _poll(lambda: self._reached("during-send", key, task), 20)
        self.proxy.partition(link)
        self.proxy.clear(link)
        observed = await self._observed(key)
        await asyncio.sleep(system.settings.lease_seconds + episode.hold_seconds)
        self.proxy.heal(link)
        await self._settle(task)
        return observed

    async def _failover(self, episode: Episode) -> str:
        system = self.system
        assert system.pg is not None
        synchronous = episode.fault == "failover-sync"
        await asyncio.to_thread(system.pg.set_synchronous, synchronous)
        if synchronous:
            await _poll(lambda: asyncio.to_thread(system.pg.streaming), 20)  # type: ignore[union-attr]
        else:
            self.proxy.partition("replication")
        keys = [f"{episode.key}-{n}" for n in range(4)]
        tasks = [
            self.clients.start(key, episode.amount + n, (episode.replica + n) % REPLICAS)
            for n, key in enumerate(keys)
        ]

        async def two_sent() -> bool:
            return sum("received" in _provider_events(system, k) for k in keys) >= 2

        await _poll(two_sent, 20)
        sent = sum("received" in _provider_events(system, k) for k in keys)
        await asyncio.to_thread(system.failover)
        await asyncio.to_thread(system.pg.set_synchronous, False)
        for task in tasks:
            await self._settle(task, 15)
        mode = "synchronous" if synchronous else "asynchronous, replication cut"
        return f"{mode}; {sent} of {len(keys)} burst keys at the provider when the primary crashed"

    async def _clock_step(self, episode: Episode) -> str:
        system, index = self.system, episode.replica
        system.step_clock(episode.clock_offset)
        await asyncio.sleep(1.5)  # libfaketime re-reads its file at most once a second
        tasks = [
            self.clients.start(f"{episode.key}-{n}", episode.amount + n, index) for n in range(2)
        ]
        await asyncio.sleep(4 + episode.hold_seconds)
        system.step_clock(0)
        await asyncio.sleep(1.5)  # until r2 has read its clock back
        for task in tasks:
            await self._settle(task)
        return (
            f"r{index} wall clock {episode.clock_offset:+d} s for {4 + episode.hold_seconds:.1f} s"
        )


async def _background(clients: Clients, seed: int, interval: float) -> None:
    rng = random.Random(seed * 7919 + 1)
    n = 0
    while not clients.stop.is_set():
        clients.start(f"s{seed}-bg-{n}", 100 + rng.randrange(900), rng.randrange(REPLICAS))
        n += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(clients.stop.wait(), interval * rng.uniform(0.5, 1.5))


def _agentsafe() -> str | None:
    candidate = Path(sys.executable).parent / "agentsafe"
    return str(candidate) if candidate.exists() else shutil.which("agentsafe")


async def run(options: RunOptions) -> int:
    """Run ``options.schedule``; returns 0 when every property holds, 1 otherwise."""
    log = _Log()
    out = options.out
    out.mkdir(parents=True, exist_ok=True)
    log(f"seed {options.seed}: {len(options.schedule)} episodes; history in {out}")
    for episode in options.schedule:
        log(f"  {episode.describe()}")
    system = System(
        out / "system", options.toxiproxy, options.settings, replica_python=options.replica_python
    )
    meta: dict[str, Any] = {
        "seed": options.seed,
        "schedule": [e.as_dict() for e in options.schedule],
        "bound_seconds": options.bound_seconds,
        "replica_python": options.replica_python or sys.executable,
        "settings": {
            "lease_seconds": options.settings.lease_seconds,
            "intent_ttl_seconds": options.settings.intent_ttl_seconds,
            "downstream_timeout_ms": options.settings.downstream_timeout_ms,
        },
    }
    answers = out / "answers.jsonl"
    answers.unlink(missing_ok=True)
    try:
        log("starting PostgreSQL primary + standby, toxiproxy, the provider, 3 replicas")
        await system.start()
        log("system up")
        async with Clients(system, answers, log) as clients:
            background = asyncio.ensure_future(
                _background(clients, options.seed, options.background_interval)
            )
            nemesis = Nemesis(system, clients, log, random.Random(options.seed))
            for number, episode in enumerate(options.schedule, 1):
                log(f"episode {number}/{len(options.schedule)}: {episode.describe()}")
                try:
                    observed = await nemesis.play(episode)
                except Exception as error:  # a fault that could not be played is reported
                    observed = f"NEMESIS ERROR {type(error).__name__}: {error}"
                    system.heal_all()
                meta["schedule"][episode.index]["observed"] = observed
                log(f"  observed: {observed}")
            clients.stop.set()
            background.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await background
            for task in clients.tasks:
                task.cancel()
            await asyncio.gather(*clients.tasks, return_exceptions=True)
            clients.tasks.clear()
            clients.stop.clear()
            log("healing: every proxy enabled, toxics cleared, clocks reset, replicas running")
            system.heal_all()
            for index in range(REPLICAS):
                await system.ready(index, timeout=10)
            meta["healed_at"] = time.time()
            meta["halted_for_lost_writes"] = system.halted_for_lost_writes()
            if meta["halted_for_lost_writes"]:
                log(
                    "halted for lost writes until an operator resumes them (not played here):"
                    f" {', '.join(meta['halted_for_lost_writes'])}"
                )
            keys = sorted(clients.amounts)
            log(
                f"after the heal: asking all {len(keys)} keys again until final"
                f" (bound {options.bound_seconds:.0f} s)"
            )
            rng = random.Random(options.seed + 1)
            for key in keys:
                clients.start(key, clients.amounts[key], rng.randrange(REPLICAS), "after-heal")
            pending = list(clients.tasks)
            done, _ = await asyncio.wait(pending, timeout=options.bound_seconds)
            log(f"  {len(done)} of {len(pending)} keys final")
            clients.stop.set()
            # Read again at the end: a replica finds lost writes only when it next reaches the
            # store, which can be after the heal (CI, seed 29: one replica by the heal, all
            # three within 0.2 s after it).
            at_heal = meta["halted_for_lost_writes"]
            meta["halted_for_lost_writes"] = system.halted_for_lost_writes()
            if meta["halted_for_lost_writes"] != at_heal:
                log(
                    "halted for lost writes by the end of the run:"
                    f" {', '.join(meta['halted_for_lost_writes'])}"
                )
    finally:
        await system.stop()
    meta["chains"] = [str(system.stdout_path(i)) for i in range(REPLICAS)]
    (out / "history.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    with contextlib.suppress(OSError):
        shutil.copy2(system.record_path, out / "provider-record.jsonl")
    history = checker.load_history(out)
    results = checker.check(history, agentsafe=_agentsafe())
    print(checker.format_report(history, results), flush=True)
    return 1 if any(r.status == "FAIL" for r in results) else 0


def default_out(seed: int) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"agentsafe-chaos-{seed}-"))
