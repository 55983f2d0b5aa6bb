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

``--complete`` (issue 34) adds what the steps above leave out and the specification still makes
unavoidable on every request, each in its cheapest form (:class:`Guarantees`): the caller's bearer
token checked against its digest (401 ``AUTH_REQUIRED`` otherwise); the intent's binding built as
the specification names it (tenant, actor and target from configuration, the caller inside the
hashed intent, a fresh intent id, captured and expiry times) and hashed; the action's parameters
checked against the policy's schema (compiled by ``jsonschema-rs``) and its rules evaluated in order
(compiled by the CEL engine the executor uses), so the verdict comes from the policy; one chained
line per lifecycle event (a BLOCK's three: PROPOSAL_RECEIVED, DECISION, EXECUTION_BLOCKED; an
ALLOW's five: those two, GRANT_CLAIMED, DISPATCH, OUTCOME) with the envelope the specification gives
(``schema``, ``seq``, ``at``, ``prev_hash``, ``hash``), every string in it scanned first for the
current secrets by keyed digests of its tokens and for credentials by shape (the least the
specification's redactor does: no normalised forms), the chain's head persisted every 100 lines
(temp file, ``fsync``, rename, ``fsync`` of the directory, on a thread of its own); the answer the
specification shapes, kept with the key's completion so a retry can replay it; and the downstream
credential as a static header on the POST. The verdict decides the path: ``MODE`` must match what
the policy says of the load sent (``allow`` for an amount the example policy allows, ``block`` for
one it refuses), or the answer is 500 ``FLOOR_MODE_MISMATCH``. Both codes are this benchmark's own,
not the executor's.

Callers: ``benchmarks/floor.py`` and ``benchmarks/goals.py``
(``python floor_server.py MODE PORT DIR [PROVIDER_URL] [--store-url URL [--pg-group]]
[--reuse-port] [--complete]``; with ``--complete`` the caller's token is read from the
environment variable ``FLOOR_CALLER_TOKEN``).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import json
import os
import queue
import re
import secrets
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import aiohttp
import cel
import jsonschema_rs
import orjson
import psycopg
import yaml
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
    "CREATE TABLE IF NOT EXISTS idem (k TEXT PRIMARY KEY, h TEXT, state TEXT, answer TEXT)",
    "CREATE TABLE IF NOT EXISTS claims (g TEXT PRIMARY KEY)",
)
"""The floor's two tables, the same in SQLite and PostgreSQL."""


class Store:
    """The floor's three durable writes, in SQLite (one group-commit thread)."""

    INSERT = "INSERT INTO idem VALUES (?, ?, 'OPEN', NULL)"
    CLAIM = "INSERT INTO claims VALUES (?)"
    DONE = "UPDATE idem SET state = 'DONE' WHERE k = ?"
    ANSWERED = "UPDATE idem SET state = 'DONE', answer = ? WHERE k = ?"

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

    INSERT = "INSERT INTO idem VALUES (%s, %s, 'OPEN', NULL)"
    CLAIM = "INSERT INTO claims VALUES (%s)"
    DONE = "UPDATE idem SET state = 'DONE' WHERE k = %s"
    ANSWERED = "UPDATE idem SET state = 'DONE', answer = %s WHERE k = %s"

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


EXAMPLE_POLICY = Path(__file__).resolve().parents[1] / "examples" / "policy.yaml"
EVIDENCE_SCHEMA = "agent-safe.executor-evidence/1"
CHECKPOINT_LINES = 100  # EXECUTOR_AUDIT_CHECKPOINT_LINES' default
# The configured identity a binding takes from configuration, never from the request.
TENANT = "00000000-0000-4000-8000-000000000001"
ACTOR = {"id": "synthetic-payout-agent", "runtime": "agentsafe-demo", "type": "AI_AGENT"}
TARGET = {"endpoint": "POST /payouts", "operation": "payout", "system": "synthetic-bank"}
CALLER = "legacy-caller"
_TOKEN = re.compile(r"[^\s\"'`,;()<>\[\]{}&?|=:/@\\]+")
_SHAPES = re.compile(
    r"(?i)(?<![A-Za-z0-9])bearer\s+[A-Za-z0-9\-._~+/]+=*|-----BEGIN [A-Z0-9 ]{1,64}-----"
    r"|(?<![A-Za-z0-9_\-.])[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{2,}\.[A-Za-z0-9_-]*(?![A-Za-z0-9_\-.])"
)


# Identifiers and digests this process mints itself. The scan would hash only their tokens (a
# uuid is one token of 36 characters; ``sha256:<hex>`` is "sha256" and 64 hex digits), so while
# no secret has one of those lengths (``Guarantees`` checks) it passes such a whole string by.
_MINTED = re.compile(
    r"sha256:[0-9a-f]{64}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
)
_seconds: dict[int, str] = {}  # the text of each recent second


def _format_ms(epoch_seconds: float) -> str:
    seconds, millis = divmod(round(epoch_seconds * 1000), 1000)
    text = _seconds.get(seconds)
    if text is None:
        if len(_seconds) > 256:
            _seconds.clear()
        text = _seconds[seconds] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    return f"{text}.{millis:03d}Z"


class Guarantees:
    """What ``--complete`` adds (the module docstring lists it), each in its cheapest form.

    The secrets are the caller's token, a downstream credential and a third value whose length
    no identifier or digest on a line shares; only their keyed digests and lengths are kept for
    the scan, as the specification's redactor keeps them.
    """

    def __init__(self, own: Path, token: str, out: BinaryIO) -> None:
        self._token_digest = hashlib.sha256(token.encode()).digest()
        self.credential = "Bearer " + secrets.token_urlsafe(32)
        values = (token, self.credential, secrets.token_urlsafe(40))
        self._key = secrets.token_bytes(32)
        self._digests = {self._digest(v.encode()) for v in values}
        self._lengths = {len(v.encode()) for v in values}
        self._minted_clean = not self._lengths & {6, 36, 64}  # see _MINTED
        action = yaml.safe_load(EXAMPLE_POLICY.read_text(encoding="utf-8"))["actions"][0]
        self._parameters = jsonschema_rs.validator_for(action["parameters"])
        self._rules = [
            (cel.compile(rule["when"]), rule["verdict"], rule.get("reasonCode", "POLICY_ALLOWED"))
            for rule in action["rules"]
        ]
        self._out = out  # the evidence file, which the app opens and closes
        self._heads = own / "chain"
        self._heads.mkdir(exist_ok=True)
        self._seq = 0
        self._prev = "sha256:" + "0" * 64
        self._checkpoints: queue.SimpleQueue[tuple[int, str] | None] = queue.SimpleQueue()
        self._checkpointer = threading.Thread(target=self._persist, daemon=True)
        self._checkpointer.start()

    def _digest(self, data: bytes) -> bytes:
        return hmac.digest(self._key, data, "sha256")

    def authenticated(self, header: str | None) -> bool:
        if header is None or not header.startswith("Bearer "):
            return False
        presented = hashlib.sha256(header[7:].encode()).digest()
        return hmac.compare_digest(presented, self._token_digest)

    def binding(self, body: dict[str, Any]) -> dict[str, Any]:
        proposal = body["proposal"]
        if not (
            isinstance(proposal["action"], str)
            and isinstance(proposal["target"], str)
            and isinstance(proposal["parameters"], dict)
            and isinstance(body["idempotency_key"], str)
        ):
            raise ValueError("the proposal's shape")
        now = time.time()
        return {
            "action": {
                "parameters": proposal["parameters"],
                "resource": proposal["target"],
                "type": proposal["action"],
            },
            "actor": ACTOR,
            "captured_at": _format_ms(now),
            "context": {"caller_principal": CALLER},
            "downstream_target": TARGET,
            "expires_at": _format_ms(now + 60),
            "idempotency_key": body["idempotency_key"],
            "intent_id": str(uuid.uuid4()),
            "protocol_version": "agent-safe.intent/1",
            "tenant_id": TENANT,
        }

    def decide(self, parameters: dict[str, Any]) -> tuple[str, str]:
        """The verdict and reason code of the first rule whose ``when`` holds."""
        if not self._parameters.is_valid(parameters):
            return "BLOCK", "PARAMETERS_INVALID"
        context = cel.Context(variables={"params": parameters})
        for program, verdict, reason in self._rules:
            if program.execute(context) is True:
                return verdict, reason
        return "BLOCK", "POLICY_NO_MATCH"

    def _redact(self, value: Any) -> Any:
        if isinstance(value, str):
            if self._minted_clean and _MINTED.fullmatch(value):
                return value
            if _SHAPES.search(value):
                value = _SHAPES.sub("[REDACTED:CREDENTIAL]", value)
            for token in _TOKEN.findall(value):
                data = token.encode()
                if len(data) in self._lengths and self._digest(data) in self._digests:
                    value = value.replace(token, "[REDACTED:SECRET]")
            return value
        if isinstance(value, dict):
            return {key: self._redact(item) for key, item in value.items()}
        if isinstance(value, list):
            return [self._redact(item) for item in value]
        return value

    def emit(self, event: str, fields: dict[str, Any]) -> None:
        line = self._redact(fields)
        self._seq += 1
        line.update(
            at=_format_ms(time.time()),
            event=event,
            prev_hash=self._prev,
            schema=EVIDENCE_SCHEMA,
            seq=self._seq,
        )
        if self._seq == 1:
            line["genesis"] = True
        self._prev = line["hash"] = (
            "sha256:" + hashlib.sha256(orjson.dumps(line, option=orjson.OPT_SORT_KEYS)).hexdigest()
        )
        self._out.write(orjson.dumps(line, option=orjson.OPT_SORT_KEYS) + b"\n")
        self._out.flush()
        if self._seq % CHECKPOINT_LINES == 0:
            self._checkpoints.put((self._seq, self._prev))

    def _persist(self) -> None:
        while (head := self._checkpoints.get()) is not None:
            temporary = self._heads / "evidence.head.tmp"
            with temporary.open("wb") as out:
                out.write(orjson.dumps({"hash": head[1], "seq": head[0]}))
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, self._heads / "evidence.head")
            directory = os.open(self._heads, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)

    def close(self) -> None:
        self._checkpoints.put(None)
        self._checkpointer.join()


def build(
    mode: str,
    directory: Path,
    provider_url: str | None,
    store: Store | PostgresStore | None = None,
    own: Path | None = None,
    caller_token: str | None = None,
) -> web.Application:
    """The floor's app; its store in ``directory`` unless ``store`` is given, its evidence and
    journal files in ``own`` (a process of its own, as each worker has its chains and journal)
    or ``directory``. With ``caller_token``, the complete floor (``--complete``)."""
    store = store if store is not None else Store(directory)
    own = own if own is not None else directory
    evidence = (own / "evidence.jsonl").open("ab")
    guarantees = Guarantees(own, caller_token, evidence) if caller_token is not None else None
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
        if guarantees is not None:
            guarantees.close()
        evidence.close()
        os.close(journal_fd)

    app.on_startup.append(start)
    app.on_cleanup.append(stop)

    def line(event: str, intent_hash: str) -> None:
        record = {"event": event, "intent": intent_hash, "prev": head["hash"]}
        text = _canonical(record)
        head["hash"] = hashlib.sha256(text).hexdigest()
        evidence.write(text + b"\n")
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

    async def handle_complete(request: web.Request) -> web.Response:
        assert guarantees is not None
        if not guarantees.authenticated(request.headers.get("authorization")):
            return web.json_response({"error": {"code": "AUTH_REQUIRED"}}, status=401)
        body = await request.json()
        binding = guarantees.binding(body)
        idem = binding["idempotency_key"]
        text = orjson.dumps(binding, option=orjson.OPT_SORT_KEYS)  # RFC 8785 for this ASCII
        intent_hash = "sha256:" + hashlib.sha256(text).hexdigest()
        intent_id = binding["intent_id"]
        journal_writer = state["journal"]
        await store.write(store.INSERT, (idem, intent_hash))
        seen = {"caller": CALLER, "intent_hash": intent_hash, "intent_id": intent_id}
        guarantees.emit("PROPOSAL_RECEIVED", {**seen, "action": binding["action"]["type"]})
        verdict, reason = guarantees.decide(binding["action"]["parameters"])
        decision_id = str(uuid.uuid4())
        guarantees.emit(
            "DECISION",
            {**seen, "decision_id": decision_id, "reason_codes": [reason], "verdict": verdict},
        )
        if verdict != mode.upper():
            return web.json_response({"error": {"code": "FLOOR_MODE_MISMATCH"}}, status=500)
        answer: dict[str, Any] = {
            "decision_id": decision_id,
            "intent_hash": intent_hash,
            "intent_id": intent_id,
            "reason_codes": [reason],
            "verdict": verdict,
        }
        if verdict == "ALLOW":
            grant_id = str(uuid.uuid4())
            grant = _canonical({"grant": grant_id, "intent": intent_hash})
            public.verify(key.sign(grant), grant)
            await store.write(store.CLAIM, (grant_id,))
            await journal_writer.submit(journal({"attempt": grant_id, "state": "OPENED"}))
            guarantees.emit("GRANT_CLAIMED", {**seen, "grant_id": grant_id})
            await journal_writer.submit(journal({"attempt": grant_id, "state": "DISPATCHING"}))
            guarantees.emit("DISPATCH", {"grant_id": grant_id, "intent_id": intent_id})
            async with state["session"].post(
                provider_url,
                json=body["proposal"],
                headers={
                    "authorization": guarantees.credential,
                    "idempotency-key": idem,
                },
            ) as response:
                status = response.status
                await response.read()
            await journal_writer.submit(journal({"attempt": grant_id, "state": "CLOSED"}))
            guarantees.emit(
                "OUTCOME",
                {**seen, "grant_id": grant_id, "outcome": "COMPLETED", "status": status},
            )
            answer.update(executed=True, grant_id=grant_id, outcome="COMPLETED")
        else:
            guarantees.emit(
                "EXECUTION_BLOCKED", {**seen, "decision_id": decision_id, "reason_codes": [reason]}
            )
            answer.update(executed=False, outcome="BLOCKED")
        text = orjson.dumps(answer, option=orjson.OPT_SORT_KEYS)
        await store.write(store.ANSWERED, (text.decode(), idem))
        return web.Response(body=text, content_type="application/json")

    app.router.add_post("/v1/actions", handle if guarantees is None else handle_complete)
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
    parser.add_argument(
        "--complete",
        action="store_true",
        help="also every step the specification makes unavoidable (FLOOR_CALLER_TOKEN: the token)",
    )
    args = parser.parse_args()
    token = os.environ.get("FLOOR_CALLER_TOKEN") if args.complete else None
    if args.complete and not token:
        parser.error("--complete needs FLOOR_CALLER_TOKEN")
    if args.mode == "allow" and not args.provider_url:
        parser.error("allow needs PROVIDER_URL")
    store = PostgresStore(args.store_url, group=args.pg_group) if args.store_url else None
    own = None
    if args.reuse_port:  # another process shares the directory: files of its own
        own = args.directory / f"process-{os.getpid()}"
        own.mkdir()
    app = build(args.mode, args.directory, args.provider_url, store, own, token)
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
