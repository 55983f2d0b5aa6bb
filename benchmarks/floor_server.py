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

Callers: ``benchmarks/floor.py`` and ``benchmarks/goals.py``
(``python floor_server.py MODE PORT DIR [PROVIDER_URL]``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import queue
import sqlite3
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

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


def build(mode: str, directory: Path, provider_url: str | None) -> web.Application:
    db = sqlite3.connect(directory / "floor.db", check_same_thread=False, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE IF NOT EXISTS idem (k TEXT PRIMARY KEY, h TEXT, state TEXT)")
    db.execute("CREATE TABLE IF NOT EXISTS claims (g TEXT PRIMARY KEY)")
    evidence = (directory / "evidence.jsonl").open("a", encoding="utf-8")
    journal_fd = os.open(directory / "journal.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    key = Ed25519PrivateKey.generate()
    public = key.public_key()
    head = {"hash": "0" * 64}

    def store_batch(batch: list[Work]) -> None:
        db.execute("BEGIN IMMEDIATE")
        for work in batch:
            work(db)
        db.execute("COMMIT")

    def journal_batch(batch: list[Work]) -> None:
        for work in batch:
            work(journal_fd)
        os.fsync(journal_fd)

    app = web.Application()
    state: dict[str, Any] = {}

    async def start(app: web.Application) -> None:
        state["store"] = GroupCommitter(store_batch)
        state["journal"] = GroupCommitter(journal_batch)
        state["session"] = aiohttp.ClientSession()

    async def stop(app: web.Application) -> None:
        await state["session"].close()
        state["store"].close()
        state["journal"].close()
        db.close()
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
        store, journal_writer = state["store"], state["journal"]
        await store.submit(
            lambda c: c.execute("INSERT INTO idem VALUES (?, ?, 'OPEN')", (idem, intent_hash))
        )
        line("PROPOSAL_RECEIVED", intent_hash)
        if mode == "allow":
            grant_id = str(uuid.uuid4())
            grant = _canonical({"grant": grant_id, "intent": intent_hash})
            public.verify(key.sign(grant), grant)
            await store.submit(lambda c: c.execute("INSERT INTO claims VALUES (?)", (grant_id,)))
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
        await store.submit(
            lambda c: c.execute("UPDATE idem SET state = 'DONE' WHERE k = ?", (idem,))
        )
        return web.json_response({"decision": mode.upper(), "intent_hash": intent_hash})

    app.router.add_post("/v1/actions", handle)
    return app


def main() -> None:
    mode, port, directory = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    provider_url = sys.argv[4] if len(sys.argv) > 4 else None
    if mode not in ("block", "allow") or (mode == "allow" and not provider_url):
        raise SystemExit("usage: floor_server.py block|allow PORT DIR [PROVIDER_URL]")
    app = build(mode, directory, provider_url)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


if __name__ == "__main__":
    main()
