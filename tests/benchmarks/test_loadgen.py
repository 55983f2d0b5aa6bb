"""The compiled load generator (benchmarks/loadgen) against a real loopback server.

It must send exactly the requests it says, each with its own idempotency key (warm-up first,
then the measured ones), keep ``concurrency`` requests in flight, and count every answer that
is not the expected status. Speed is not asserted here; only what it measures and sends.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from aiohttp import web

from .scripts import load

pytestmark = pytest.mark.skipif(shutil.which("go") is None, reason="needs the Go toolchain")


def _loadclient() -> ModuleType:
    return load("loadclient")


@pytest.fixture(scope="module")
def loadgen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    binary: Path = _loadclient().build_loadgen(tmp_path_factory.mktemp("cache"))
    return binary


class Recorder:
    def __init__(self) -> None:
        self.keys: list[str] = []
        self.headers: list[str | None] = []
        self.idempotency: list[str | None] = []
        self.in_flight = 0
        self.most_in_flight = 0

    async def handle(self, request: web.Request) -> web.Response:
        body: dict[str, Any] = await request.json()
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(0.002)
        self.in_flight -= 1
        key = body["idempotency_key"]
        self.keys.append(key)
        self.headers.append(request.headers.get("Authorization"))
        self.idempotency.append(request.headers.get("Idempotency-Key"))
        if key.endswith("7"):
            return web.json_response({"error": "refused"}, status=409)
        return web.json_response({"ok": True})


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, Recorder]]:
    recorder = Recorder()
    app = web.Application()
    app.router.add_post("/v1/actions", recorder.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}/v1/actions", recorder
    await runner.cleanup()


async def _run(loadgen: Path, *argv: str) -> tuple[int, dict[str, Any], str]:
    proc = await asyncio.create_subprocess_exec(
        str(loadgen), *argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, json.loads(out) if out else {}, err.decode()


async def test_every_request_has_its_own_key_and_unexpected_answers_are_counted(
    loadgen: Path, server: tuple[str, Recorder]
) -> None:
    url, recorder = server
    template = _loadclient().proposal_template("k", 100)
    status, result, err = await _run(
        loadgen,
        "-url", url,
        "-requests", "200",
        "-warmup", "20",
        "-concurrency", "8",
        "-body", template,
        "-header", "Authorization: Bearer t0ken",
    )  # fmt: skip
    assert status == 0, err
    assert len(recorder.keys) == 220
    assert set(recorder.keys) == {f"k-{i}" for i in range(220)}
    assert set(recorder.headers) == {"Bearer t0ken"}
    assert 1 < recorder.most_in_flight <= 8
    assert result["requests"] == 200
    assert result["concurrency"] == 8
    # Measured requests are 20..219; those whose index ends in 7 were answered 409.
    refused = sum(1 for i in range(20, 220) if str(i).endswith("7"))
    assert result["unexpected"] == refused
    assert result["by_status"] == {"200": 200 - refused, "409": refused}
    assert 0 < result["p50_ms"] <= result["p99_ms"] <= result["max_ms"]
    assert result["rps"] > 0
    # The first unexpected answer is shown once, so a misconfigured run says why.
    assert err.count("status 409") == 1


async def test_a_header_value_is_numbered_like_the_body(
    loadgen: Path, server: tuple[str, Recorder]
) -> None:
    # A provider driven directly (benchmarks/goals.py) takes its key in a header, one per request.
    url, recorder = server
    status, result, err = await _run(
        loadgen,
        "-url", url,
        "-requests", "30",
        "-warmup", "5",
        "-concurrency", "4",
        "-body", '{"idempotency_key":"b-{i}"}',
        "-header", "Idempotency-Key: h-{i}",
        "-header", "Authorization: Bearer t0ken",
        "-expect", "409",
    )  # fmt: skip
    assert status == 0, err
    assert sorted(recorder.idempotency) == sorted(f"h-{i}" for i in range(35))
    assert [f"h-{k[2:]}" for k in recorder.keys] == recorder.idempotency
    assert set(recorder.headers) == {"Bearer t0ken"}
    # -expect: only the answers whose index ends in 7 (409) were expected.
    assert result["unexpected"] == sum(1 for i in range(5, 35) if not str(i).endswith("7"))


async def test_a_transport_failure_is_counted_not_hidden(loadgen: Path) -> None:
    from agentsafe.executor.tools.harness import free_port

    status, result, _ = await _run(
        loadgen, "-url", f"http://127.0.0.1:{free_port()}/", "-requests", "5", "-warmup", "0"
    )
    assert status == 0
    assert result["unexpected"] == 5
    assert result["by_status"] == {"error": 5}


async def test_bad_arguments_say_what_is_needed(loadgen: Path) -> None:
    status, _, err = await _run(loadgen, "-requests", "5")
    assert status == 2
    assert "-url is required" in err


def test_the_build_is_cached_by_source(tmp_path: Path) -> None:
    loadclient = _loadclient()
    first = loadclient.build_loadgen(tmp_path)
    stamp = first.stat().st_mtime_ns
    again = loadclient.build_loadgen(tmp_path)
    assert again == first
    assert again.stat().st_mtime_ns == stamp
    assert first.parent == tmp_path / "bench"
