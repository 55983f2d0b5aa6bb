"""The floor server (benchmarks/floor_server.py) does every step it claims, durably.

A floor that skipped a write would make the executor look slower than the guarantees make it,
so each step is checked in what it leaves behind: the idempotency rows completed, the claims,
the journal's records, the chained evidence lines and what the provider received. Speed is not
asserted here.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import psycopg
import pytest
from aiohttp import web

from agentsafe.executor.evidence.chainverify import verify_chain

from .scripts import load


def _floor_server() -> ModuleType:
    return load("floor_server")


async def _site(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


COUNT = 12


async def _drive(
    mode: str, directory: Path, stores: list[Any], owns: list[Path | None]
) -> list[dict[str, Any]]:
    """``COUNT`` requests spread over one floor app per store (all on one directory); what the
    provider received. Every answer is 200 with the mode's decision."""
    received: list[dict[str, Any]] = []

    async def provider(request: web.Request) -> web.Response:
        received.append({**await request.json(), "key": request.headers.get("idempotency-key")})
        return web.json_response({"ok": True})

    provider_app = web.Application()
    provider_app.router.add_post("/pay", provider)
    provider_runner, provider_url = await _site(provider_app)
    floor = _floor_server()
    sites = [
        await _site(floor.build(mode, directory, provider_url + "/pay", store, own))
        for store, own in zip(stores, owns, strict=True)
    ]
    try:
        async with aiohttp.ClientSession() as session:

            async def one(i: int) -> dict[str, Any]:
                body = {"proposal": {"target": f"t-{i}"}, "idempotency_key": f"k-{i}"}
                url = sites[i % len(sites)][1]
                async with session.post(url + "/v1/actions", json=body) as answer:
                    assert answer.status == 200
                    result: dict[str, Any] = await answer.json()
                    return result

            answers = await asyncio.gather(*(one(i) for i in range(COUNT)))
    finally:
        for runner, _ in sites:
            await runner.cleanup()
        await provider_runner.cleanup()
    assert {a["decision"] for a in answers} == {mode.upper()}
    return received


def _check_files(mode: str, own: Path, count: int) -> None:
    """``count`` requests' chained evidence lines and journal records in ``own``."""
    journal = (own / "journal.jsonl").read_text().splitlines()
    lines = (own / "evidence.jsonl").read_text().splitlines()
    prev = "0" * 64
    for line in lines:
        assert json.loads(line)["prev"] == prev
        prev = hashlib.sha256(line.encode()).hexdigest()
    assert len(lines) == 2 * count
    assert len(journal) == (3 * count if mode == "allow" else 0)


def _check_received(mode: str, received: list[dict[str, Any]]) -> None:
    if mode == "allow":
        assert sorted(r["target"] for r in received) == sorted(f"t-{i}" for i in range(COUNT))
        assert sorted(r["key"] for r in received) == sorted(f"k-{i}" for i in range(COUNT))
    else:
        assert received == []


def _check_sqlite(mode: str, directory: Path) -> None:
    db = sqlite3.connect(directory / "floor.db")
    assert db.execute("SELECT count(*) FROM idem WHERE state = 'DONE'").fetchone() == (COUNT,)
    claims = db.execute("SELECT count(*) FROM claims").fetchone()
    db.close()
    assert claims == ((COUNT,) if mode == "allow" else (0,))


@pytest.mark.parametrize("mode", ["block", "allow"])
async def test_every_step_leaves_its_record(mode: str, tmp_path: Path) -> None:
    received = await _drive(mode, tmp_path, [None], [None])
    _check_sqlite(mode, tmp_path)
    _check_files(mode, tmp_path, COUNT)
    _check_received(mode, received)


async def test_two_floors_share_one_database_and_keep_their_own_files(tmp_path: Path) -> None:
    # goals.py's two-process row: one SQLite database (its write lock taken in turn), each
    # process its own chain and journal, as each executor worker has.
    owns = [tmp_path / "one", tmp_path / "two"]
    for own in owns:
        own.mkdir()
    floor = _floor_server()
    received = await _drive("allow", tmp_path, [floor.Store(tmp_path), floor.Store(tmp_path)], owns)
    _check_sqlite("allow", tmp_path)
    for own in owns:
        _check_files("allow", own, COUNT // 2)  # requests alternate between the two
    _check_received("allow", received)


@pytest.mark.parametrize("group", [False, True])
async def test_the_postgresql_floor_makes_the_same_writes(
    group: bool, pg_url: str, tmp_path: Path
) -> None:
    store = _floor_server().PostgresStore(pg_url, group=group)
    received = await _drive("allow", tmp_path, [store], [None])
    _check_files("allow", tmp_path, COUNT)
    _check_received("allow", received)
    assert not (tmp_path / "floor.db").exists()
    with psycopg.connect(pg_url) as conn:
        done = conn.execute("SELECT count(*) FROM idem WHERE state = 'DONE'").fetchone()
        claims = conn.execute("SELECT count(*) FROM claims").fetchone()
    assert (done, claims) == ((COUNT,), (COUNT,))


TOKEN = "floor-caller-token-0123456789abcdefghijklmnop"
CHECKPOINT_LINES = 10  # the floor's 100 (the specification's default), fewer for the test


async def _drive_complete(
    mode: str, directory: Path, bodies: list[dict[str, Any]], token: str = TOKEN
) -> tuple[list[tuple[int, dict[str, Any]]], list[dict[str, Any]]]:
    """Each body posted in turn to a ``--complete`` floor; every (status, answer), and what the
    provider received (with the headers the floor sent)."""
    received: list[dict[str, Any]] = []

    async def provider(request: web.Request) -> web.Response:
        received.append({**await request.json(), "headers": dict(request.headers)})
        return web.json_response({"ok": True}, status=202)

    provider_app = web.Application()
    provider_app.router.add_post("/pay", provider)
    provider_runner, provider_url = await _site(provider_app)
    floor = _floor_server()
    floor.CHECKPOINT_LINES = CHECKPOINT_LINES
    app = floor.build(mode, directory, provider_url + "/pay", caller_token=TOKEN)
    runner, url = await _site(app)
    answers = []
    try:
        async with aiohttp.ClientSession() as session:
            for body in bodies:
                headers = {"authorization": f"Bearer {token}"}
                async with session.post(url + "/v1/actions", json=body, headers=headers) as r:
                    answers.append((r.status, await r.json()))
    finally:
        await runner.cleanup()
        await provider_runner.cleanup()
    return answers, received


def _payout(i: int, amount: int, action: str = "create_payout") -> dict[str, Any]:
    return {
        "proposal": {
            "action": action,
            "target": f"payout:{i}",
            "parameters": {"amountMinor": amount, "currency": "EUR"},
        },
        "idempotency_key": f"k-{i}",
    }


@pytest.mark.parametrize(
    ("mode", "amount", "events"),
    [
        ("block", 900000, ["PROPOSAL_RECEIVED", "DECISION", "EXECUTION_BLOCKED"]),
        ("allow", 100, ["PROPOSAL_RECEIVED", "DECISION", "GRANT_CLAIMED", "DISPATCH", "OUTCOME"]),
    ],
)
async def test_the_complete_floor_decides_by_policy_and_chains_every_lifecycle_line(
    mode: str, amount: int, events: list[str], tmp_path: Path
) -> None:
    # The complete floor is what goals.py's "complete floor" rows measure: if it skipped a
    # step, the executor would look slower beside it than the specification makes it.
    answers, received = await _drive_complete(
        mode, tmp_path, [_payout(i, amount) for i in range(COUNT)]
    )
    verdict = mode.upper()
    assert [status for status, _ in answers] == [200] * COUNT
    assert {answer["verdict"] for _, answer in answers} == {verdict}
    reason = "AMOUNT_ABOVE_POLICY" if mode == "block" else "POLICY_ALLOWED"
    assert {tuple(answer["reason_codes"]) for _, answer in answers} == {(reason,)}
    lines = (tmp_path / "evidence.jsonl").read_text().splitlines()
    report = verify_chain(lines, require_genesis=True)
    assert report.ok
    assert not report.findings
    assert [json.loads(line)["event"] for line in lines] == events * COUNT
    # The last head persisted is the last line whose seq is a multiple of the interval.
    last = json.loads(lines[len(lines) // CHECKPOINT_LINES * CHECKPOINT_LINES - 1])
    head = json.loads((tmp_path / "chain" / "evidence.head").read_text())
    assert head == {"hash": last["hash"], "seq": last["seq"]}
    db = sqlite3.connect(tmp_path / "floor.db")
    kept = dict(db.execute("SELECT k, answer FROM idem WHERE state = 'DONE'").fetchall())
    claims = db.execute("SELECT count(*) FROM claims").fetchone()
    db.close()
    assert {key: json.loads(text) for key, text in kept.items()} == {
        f"k-{i}": answer for i, (_, answer) in enumerate(answers)
    }
    assert claims == ((COUNT,) if mode == "allow" else (0,))
    journal = (tmp_path / "journal.jsonl").read_text().splitlines()
    assert len(journal) == (3 * COUNT if mode == "allow" else 0)
    if mode == "allow":
        assert len(received) == COUNT
        assert {r["headers"]["Authorization"].startswith("Bearer ") for r in received} == {True}
    else:
        assert received == []


async def test_the_complete_floor_checks_the_caller_and_redacts_a_secret(tmp_path: Path) -> None:
    refused, _ = await _drive_complete("block", tmp_path, [_payout(0, 900000)], token="wrong")
    assert refused == [(401, {"error": {"code": "AUTH_REQUIRED"}})]
    assert not (tmp_path / "evidence.jsonl").read_text()
    # The caller's token as the action's name reaches PROPOSAL_RECEIVED; the line holds the
    # redaction, never the value, and still chains.
    answers, _ = await _drive_complete("block", tmp_path, [_payout(1, 900000, action=TOKEN)])
    assert [status for status, _ in answers] == [200]
    text = (tmp_path / "evidence.jsonl").read_text()
    assert TOKEN not in text
    first = json.loads(text.splitlines()[0])
    assert first["action"] == "[REDACTED:SECRET]"
    assert verify_chain(text.splitlines()).ok


async def test_the_complete_floor_refuses_a_load_its_mode_does_not_match(tmp_path: Path) -> None:
    # An ALLOW floor driven with an amount the policy refuses would measure a BLOCK: it says so.
    answers, received = await _drive_complete("allow", tmp_path, [_payout(0, 900000)])
    assert answers == [(500, {"error": {"code": "FLOOR_MODE_MISMATCH"}})]
    assert received == []
