"""The synthetic provider: payment-API idempotency, modes, lookups, control routes, its CLI."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from agentsafe.executor.tools.synthetic import SyntheticProvider


@pytest.fixture
async def provider() -> AsyncIterator[SyntheticProvider]:
    synthetic = SyntheticProvider()
    await synthetic.start()
    yield synthetic
    await synthetic.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def post(
    http: aiohttp.ClientSession, url: str, body: object, key: str | None
) -> tuple[int, bytes]:
    headers = {"content-type": "application/json"}
    if key is not None:
        headers["idempotency-key"] = key
    async with http.post(url, data=json.dumps(body), headers=headers) as response:
        return response.status, await response.read()


async def test_it_says_it_is_synthetic(
    provider: SyntheticProvider, http: aiohttp.ClientSession
) -> None:
    async with http.get(provider.base_url + "/") as response:
        body = await response.json()
    assert body["synthetic"] is True
    assert "SYNTHETIC" in body["description"]
    assert SyntheticProvider.__module__ == "agentsafe.executor.tools.synthetic"
    assert "SYNTHETIC" in (sys.modules[SyntheticProvider.__module__].__doc__ or "")


async def test_a_key_is_acted_on_once_and_answered_the_same_again(
    provider: SyntheticProvider, http: aiohttp.ClientSession
) -> None:
    url = provider.base_url + "/payouts"
    first = await post(http, url, {"amountMinor": 5}, "k1")
    again = await post(http, url, {"amountMinor": 5}, "k1")
    assert first[0] == 202
    assert again == first
    assert json.loads(first[1])["reference"].startswith("syn_")
    assert provider.executed_keys() == ["k1"]
    other = await post(http, url, {"amountMinor": 6}, "k1")
    assert other == (409, b'{"code": "IDEMPOTENCY_KEY_REUSED"}')
    missing = await post(http, url, {"amountMinor": 5}, None)
    assert missing[0] == 400
    async with http.get(provider.base_url + "/_control/received") as response:
        seen = await response.json()
    assert seen == {
        "count": 4,
        "keys": ["k1", "k1", "k1", None],
        "mode": "normal",
        "held": 0,
        "lookups": 0,
        "lookups_waiting": 0,
        "refusals": [],
    }


async def test_modes_and_lookups(provider: SyntheticProvider, http: aiohttp.ClientSession) -> None:
    base = provider.base_url
    async with http.post(base + "/_control/mode", json={"mode": "refuse"}) as response:
        assert response.status == 200
    async with http.post(base + "/_control/mode", json={"mode": "explode"}) as response:
        assert response.status == 400
    refused = await post(http, base + "/payouts", {"a": 1}, "r1")
    assert refused == (422, b'{"code": "INSUFFICIENT_FUNDS"}')
    assert await post(http, base + "/payouts", {"a": 1}, "r1") == refused
    errored = await post(http, base + "/payouts?mode=error", {"a": 1}, "e1")
    assert errored == (500, b"")
    normal = await post(http, base + "/payouts", {"synthetic_mode": "normal"}, "n1")
    assert normal[0] == 202

    async def lookup(key: str) -> int:
        async with http.get(base + "/payouts/" + key) as response:
            return response.status

    assert [await lookup(k) for k in ("r1", "e1", "n1", "unknown")] == [404, 404, 200, 404]
    # Lookups switched off: nobody can learn anything, whatever happened; then on again.
    async with http.post(base + "/_control/lookups", json={"available": False}) as response:
        assert response.status == 200
    async with http.post(base + "/_control/lookups", json={"available": "no"}) as response:
        assert response.status == 400
    assert [await lookup(k) for k in ("n1", "unknown")] == [503, 503]
    async with http.post(base + "/_control/lookups", json={"available": True}) as response:
        assert response.status == 200
    assert [await lookup(k) for k in ("n1", "unknown")] == [200, 404]


async def test_a_hung_request_is_recorded_as_executed_and_released_on_stop(
    http: aiohttp.ClientSession,
) -> None:
    synthetic = SyntheticProvider()
    base = await synthetic.start()
    synthetic.set_mode("hang")
    pending = asyncio.create_task(post(http, base + "/payouts", {"a": 1}, "h1"))
    try:
        async with asyncio.timeout(10):
            while synthetic.executed_keys() != ["h1"]:
                await asyncio.sleep(0.01)
        assert not pending.done()
        async with http.get(base + "/payouts/h1") as response:
            assert response.status == 200
            assert (await response.json())["status"] == "executed"
    finally:
        await synthetic.stop()
    # stop() releases the hung handler: the client sees a 503 or a dropped connection, no payout
    try:
        status: int | None = (await pending)[0]
    except aiohttp.ClientError:
        status = None
    assert status in (503, None)


def test_it_binds_loopback_only() -> None:
    with pytest.raises(ValueError, match="loopback"):
        SyntheticProvider(host="0.0.0.0")


async def test_the_module_runs_and_prints_its_url(http: aiohttp.ClientSession) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agentsafe.executor.tools.synthetic",
        "--port",
        "0",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(60):
            line = (await process.stdout.readline()).decode().strip()
        assert line.startswith("http://127.0.0.1:")
        async with http.get(line + "/") as response:
            assert (await response.json())["synthetic"] is True
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(60):
            await process.communicate()
    assert process.returncode == 0


async def test_the_module_refuses_a_non_loopback_host() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agentsafe.executor.tools.synthetic",
        "--host",
        "0.0.0.0",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(60):
        out, err = await process.communicate()
    assert process.returncode == 2
    assert b"loopback" in err
    assert out == b""


async def test_the_record_file_has_every_payout_request_once_received_and_once_answered(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    record = tmp_path / "record.jsonl"
    synthetic = SyntheticProvider(record=record)
    await synthetic.start()
    try:
        url = synthetic.base_url + "/payouts"
        headers = {"x-agent-safe-grant-id": "g-1", "authorization": "Bearer not-recorded"}
        async with http.post(
            url, json={"amountMinor": 5}, headers={**headers, "idempotency-key": "k1"}
        ) as response:
            assert response.status == 202
        await post(http, url, {"amountMinor": 5}, "k1")
        await post(http, url, {"amountMinor": 5}, "k2")
    finally:
        await synthetic.stop()
    text = record.read_text()
    assert "not-recorded" not in text
    lines = [json.loads(line) for line in text.splitlines()]
    received = [(e["key"], e["first"]) for e in lines if e["event"] == "received"]
    assert received == [("k1", True), ("k1", False), ("k2", True)]
    assert [e["status"] for e in lines if e["event"] == "answered"] == [202, 202, 202]
    assert lines[0]["grant_id"] == "g-1"
    assert lines[1]["event"] == "answered"
    assert lines[1]["serial"] == lines[0]["serial"] == 0
