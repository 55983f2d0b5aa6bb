"""The floor server (benchmarks/floor_server.py) does every step it claims, durably.

A floor that skipped a write would make the executor look slower than the guarantees make it,
so each step is checked in what it leaves behind: the idempotency rows completed, the claims,
the journal's records, the chained evidence lines and what the provider received. Speed is not
asserted here.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import json
import sqlite3
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import pytest
from aiohttp import web

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _floor_server() -> ModuleType:
    spec = importlib.util.spec_from_file_location("floor_server", BENCHMARKS / "floor_server.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def _site(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("mode", ["block", "allow"])
async def test_every_step_leaves_its_record(mode: str, tmp_path: Path) -> None:
    received: list[dict[str, Any]] = []

    async def provider(request: web.Request) -> web.Response:
        received.append({**await request.json(), "key": request.headers.get("idempotency-key")})
        return web.json_response({"ok": True})

    provider_app = web.Application()
    provider_app.router.add_post("/pay", provider)
    provider_runner, provider_url = await _site(provider_app)
    runner, url = await _site(_floor_server().build(mode, tmp_path, provider_url + "/pay"))
    count = 12
    try:
        async with aiohttp.ClientSession() as session:

            async def one(i: int) -> dict[str, Any]:
                body = {"proposal": {"target": f"t-{i}"}, "idempotency_key": f"k-{i}"}
                async with session.post(url + "/v1/actions", json=body) as answer:
                    assert answer.status == 200
                    result: dict[str, Any] = await answer.json()
                    return result

            answers = await asyncio.gather(*(one(i) for i in range(count)))
    finally:
        await runner.cleanup()
        await provider_runner.cleanup()

    assert {a["decision"] for a in answers} == {mode.upper()}
    db = sqlite3.connect(tmp_path / "floor.db")
    assert db.execute("SELECT count(*) FROM idem WHERE state = 'DONE'").fetchone() == (count,)
    claims = db.execute("SELECT count(*) FROM claims").fetchone()
    db.close()
    journal = (tmp_path / "journal.jsonl").read_text().splitlines()
    lines = (tmp_path / "evidence.jsonl").read_text().splitlines()
    prev = "0" * 64
    for line in lines:
        assert json.loads(line)["prev"] == prev
        prev = hashlib.sha256(line.encode()).hexdigest()
    assert len(lines) == 2 * count
    if mode == "allow":
        assert claims == (count,)
        assert len(journal) == 3 * count
        assert sorted(r["target"] for r in received) == sorted(f"t-{i}" for i in range(count))
        assert sorted(r["key"] for r in received) == sorted(f"k-{i}" for i in range(count))
    else:
        assert claims == (0,)
        assert journal == []
        assert received == []
