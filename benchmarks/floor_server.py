"""The durable floor for benchmarks/floor.py: the least a request can cost and keep the guarantees.

Not the executor: a bare aiohttp endpoint doing only the steps that issue 18's guarantees make
unavoidable, each in its cheapest Python form, so the benchmark can say how much of the gap
between the executor and the raw baseline is the executor's and how much is the guarantees' own.

``block`` mode, per request: parse the JSON body; RFC 8785-style canonical bytes through the C
encoder and their SHA-256 (the intent hash); an idempotency row inserted and then completed in
SQLite (WAL, ``synchronous=FULL``: two durable commits, each shared with the concurrent
requests' writes by one group-commit thread, as the use store does); one hash-chained evidence
line written to a file; the JSON answer.

``allow`` mode adds: an Ed25519 grant signed and verified; the single-use claim as a third
durable commit; three journal records appended with ``fsync`` (also grouped); and one POST to a
loopback provider over a kept-alive connection, carrying the request's idempotency key in an
``idempotency-key`` header (as the executor's does, so that the synthetic provider,
``benchmarks/goals.py``'s, takes its new-payout path for the floor too).

Two variants stand for the executor's other shapes (issue 34's goals 2 and 4), each as cheap:

* ``--store-url URL``: the same three durable writes on PostgreSQL instead of SQLite, each its
  own autocommit statement on a psycopg async pool of 10 connections, as the shared store sends
  them (``state/pgconn.py``: a statement is its own transaction, committed when its answer
  arrives). With ``--pg-group`` instead, one thread sends every write waiting when it wakes in
  one transaction, pipelined (one round trip and one commit per group): the cheapest client-side
  form, and a different design (one failure fails the group).
* ``--reuse-port``: the listening socket is opened with ``SO_REUSEPORT``, so two floor processes
  can share one port and one SQLite database, as ``EXECUTOR_WORKERS=2`` shares its use store.

Callers: ``benchmarks/floor.py`` and ``benchmarks/goals.py``
(``python floor_server.py MODE PORT DIR [PROVIDER_URL] [--store-url URL [--pg-group]]
[--reuse-port]``).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import queue
import sqlite3
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from psycopg_pool import AsyncConnectionPool

Work = Callable[[Any], None]


class GroupCommitter:
    """One thread; every job waiting when it wakes shares one commit (or one ``fsync``)."""

    def __init__(self, run_batch: Callable[[list[Work]], None]) -> None:
        self._jobs: queue.SimpleQueue[tuple[Work, asyncio.Future[None]] | None] = (
            queue.SimpleQueue()
        )
        self._run_batch = run_batch
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join()

    async def submit(self, work: Work) -> None:
        future: asyncio.Future[None] = self._loop.create_future()
        self._jobs.put((work, future))
        await future

    def _serve(self) -> None:
        while True:
            first = self._jobs.get()
            if first is None:
                return
            batch = [first]
            while True:
                try:
                    item = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    return
                batch.append(item)
            self._run_batch([work for work, _ in batch])
            for _, future in batch:
                self._loop.call_soon_threadsafe(_settle, future)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _canonical(value: Any) -> bytes:
    return json.dumps(
        value, ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False
    ).encode()


TABLES = (
    "CREATE TABLE IF NOT EXISTS idem (k TEXT PRIMARY KEY, h TEXT, state TEXT)",
    "CREATE TABLE IF NOT EXISTS claims (g TEXT PRIMARY KEY)",
)
"""The floor's two tables, the same in SQLite and PostgreSQL."""


class Store:
    """The floor's three durable writes, in SQLite (one group-commit thread)."""

    INSERT = "INSERT INTO idem VALUES (?, ?, 'OPEN')"
    CLAIM = "INSERT INTO claims VALUES (?)"
    DONE = "UPDATE idem SET state = 'DONE' WHERE k = ?"

    def __init__(self, directory: Path) -> None:
        self.db = sqlite3.connect(
            directory / "floor.db", check_same_thread=False, isolation_level=None, timeout=30
        )
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        for table in TABLES:
            self.db.execute(table)
        self._committer: GroupCommitter | None = None

    async def start(self) -> None:
        self._committer = GroupCommitter(self._batch)

    def _batch(self, batch: list[Work]) -> None:
        self.db.execute("BEGIN IMMEDIATE")
        for work in batch:
            work(self.db)
        self.db.execute("COMMIT")

    async def write(self, sql: str, params: tuple[str, ...]) -> None:
        assert self._committer is not None
        await self._committer.submit(lambda c: c.execute(sql, params))

    async def close(self) -> None:
        if self._committer is not None:
            self._committer.close()
        self.db.close()


class PostgresStore:
    """The same writes on PostgreSQL: each its own autocommit statement on an async pool (the
    shared store's shape), or with ``group`` every waiting write in one pipelined transaction."""

    INSERT = "INSERT INTO idem VALUES (%s, %s, 'OPEN')"
    CLAIM = "INSERT INTO claims VALUES (%s)"
    DONE = "UPDATE idem SET state = 'DONE' WHERE k = %s"

    def __init__(self, url: str, *, group: bool) -> None:
        self._url = url
        self._group = group
        with psycopg.connect(url, autocommit=True) as conn:
            for table in TABLES:
                conn.execute(table)
        self._committer: GroupCommitter | None = None
        self._pool: AsyncConnectionPool[Any] | None = None
        self._conn: psycopg.Connection[Any] | None = None

    async def start(self) -> None:
        if self._group:
            self._conn = psycopg.connect(self._url, autocommit=True)
            self._committer = GroupCommitter(self._batch)
        else:
            self._pool = AsyncConnectionPool(
                self._url, min_size=10, max_size=10, kwargs={"autocommit": True}, open=False
            )
            await self._pool.open(wait=True)

    def _batch(self, batch: list[Work]) -> None:
        assert self._conn is not None
        with self._conn.transaction(), self._conn.pipeline():
            for work in batch:
                work(self._conn)

    async def write(self, sql: str, params: tuple[str, ...]) -> None:
        if self._committer is not None:
            await self._committer.submit(lambda c: c.execute(sql, params))
            return
        assert self._pool is not None
        async with self._pool.connection() as conn:
            await conn.execute(sql, params)

    async def close(self) -> None:
        if self._committer is not None:
            self._committer.close()
        if self._conn is not None:
            self._conn.close()
        if self._pool is not None:
            await self._pool.close()


def build(
    mode: str,
    directory: Path,
    provider_url: str | None,
    store: Store | PostgresStore | None = None,
    own: Path | None = None,
) -> web.Application:
    """The floor's app; its store in ``directory`` unless ``store`` is given, its evidence and
    journal files in ``own`` (a process of its own, as each worker has its chains and journal)
    or ``directory``."""
    store = store if store is not None else Store(directory)
    own = own if own is not None else directory
    evidence = (own / "evidence.jsonl").open("a", encoding="utf-8")
    journal_fd = os.open(own / "journal.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    key = Ed25519PrivateKey.generate()
    public = key.public_key()
    head = {"hash": "0" * 64}

    def journal_batch(batch: list[Work]) -> None:
        for work in batch:
            work(journal_fd)
        os.fsync(journal_fd)

    app = web.Application()
    state: dict[str, Any] = {}

    async def start(app: web.Application) -> None:
        await store.start()
        state["journal"] = GroupCommitter(journal_batch)
        state["session"] = aiohttp.ClientSession()

    async def stop(app: web.Application) -> None:
        await state["session"].close()
        await store.close()
        state["journal"].close()
        evidence.close()
        os.close(journal_fd)

    app.on_startup.append(start)
    app.on_cleanup.append(stop)

    def line(event: str, intent_hash: str) -> None:
        record = {"event": event, "intent": intent_hash, "prev": head["hash"]}
        text = _canonical(record)
        head["hash"] = hashlib.sha256(text).hexdigest()
        evidence.write(text.decode() + "\n")
        evidence.flush()

    def journal(record: dict[str, Any]) -> Work:
        data = _canonical(record) + b"\n"
        return lambda fd: os.write(fd, data) and None

    async def handle(request: web.Request) -> web.Response:
        body = await request.json()
        idem = str(body["idempotency_key"])
        intent_hash = hashlib.sha256(_canonical(body["proposal"])).hexdigest()
        journal_writer = state["journal"]
        await store.write(store.INSERT, (idem, intent_hash))
        line("PROPOSAL_RECEIVED", intent_hash)
        if mode == "allow":
            grant_id = str(uuid.uuid4())
            grant = _canonical({"grant": grant_id, "intent": intent_hash})
            public.verify(key.sign(grant), grant)
            await store.write(store.CLAIM, (grant_id,))
            await journal_writer.submit(journal({"attempt": grant_id, "state": "OPENED"}))
            await journal_writer.submit(journal({"attempt": grant_id, "state": "DISPATCHING"}))
            async with state["session"].post(
                provider_url, json=body["proposal"], headers={"idempotency-key": idem}
            ) as answer:
                await answer.read()
            await journal_writer.submit(journal({"attempt": grant_id, "state": "CLOSED"}))
            line("EXECUTED", intent_hash)
        else:
            line("BLOCKED", intent_hash)
        await store.write(store.DONE, (idem,))
        return web.json_response({"decision": mode.upper(), "intent_hash": intent_hash})

    app.router.add_post("/v1/actions", handle)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("block", "allow"))
    parser.add_argument("port", type=int)
    parser.add_argument("directory", type=Path)
    parser.add_argument("provider_url", nargs="?")
    parser.add_argument("--store-url", help="the three writes on this PostgreSQL database")
    parser.add_argument("--pg-group", action="store_true", help="one transaction per group")
    parser.add_argument("--reuse-port", action="store_true", help="share the port (SO_REUSEPORT)")
    args = parser.parse_args()
    if args.mode == "allow" and not args.provider_url:
        parser.error("allow needs PROVIDER_URL")
    store = PostgresStore(args.store_url, group=args.pg_group) if args.store_url else None
    own = None
    if args.reuse_port:  # another process shares the directory: files of its own
        own = args.directory / f"process-{os.getpid()}"
        own.mkdir()
    app = build(args.mode, args.directory, args.provider_url, store, own)
    web.run_app(
        app,
        host="127.0.0.1",
        port=args.port,
        print=None,
        access_log=None,
        reuse_port=args.reuse_port or None,
    )


if __name__ == "__main__":
    main()
