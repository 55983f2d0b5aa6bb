"""``agentsafe proxy`` as a real process between a real HTTP client and a real upstream, and the
request-smuggling shapes over raw sockets."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from agentsafe.executor.gateway.demo import BANNER
from agentsafe.executor.tools.harness import free_port, wait_until

AGENTSAFE = str(Path(sys.executable).parent / "agentsafe")


@dataclass
class Upstream:
    """A real HTTP upstream that records exactly what reached it."""

    received: list[tuple[str, str, bytes, dict[str, str]]] = field(default_factory=list)
    runner: web.AppRunner | None = None
    url: str = ""

    async def start(self) -> None:
        async def anything(request: web.Request) -> web.Response:
            body = await request.read()
            headers = {k.lower(): v for k, v in request.headers.items()}
            self.received.append((request.method, request.path_qs, body, headers))
            return web.json_response(
                {"upstream": "real", "n": len(self.received)},
                status=201 if request.method == "POST" else 200,
                headers={"x-upstream": "yes"},
            )

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", anything)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


@dataclass
class Proxy:
    process: subprocess.Popen[bytes]
    url: str
    port: int
    out: Path

    def events(self) -> list[dict[str, Any]]:
        """Standard output, every line a JSON object (issue 31, item 9: no plain text)."""
        return [json.loads(line) for line in self.out.read_text(encoding="utf-8").splitlines()]

    def lines(self) -> list[str]:
        return [str(event["message"]) for event in self.events()]

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    server = Upstream()
    await server.start()
    yield server
    await server.stop()


async def start_proxy(
    tmp_path: Path, upstream: Upstream, *extra: str, settings: dict[str, str] | None = None
) -> Proxy:
    port = free_port()
    out = tmp_path / "proxy.out"
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
    env.update(settings or {})
    with out.open("wb") as stdout, (tmp_path / "proxy.err").open("wb") as stderr:
        process = subprocess.Popen(
            [AGENTSAFE, "proxy", "--upstream", upstream.url, "--port", str(port), *extra],
            stdout=stdout,
            stderr=stderr,
            env=env,
            cwd=tmp_path,
        )
    proxy = Proxy(process, f"http://127.0.0.1:{port}", port, out)

    async def listening() -> bool:
        if process.poll() is not None:
            raise RuntimeError((tmp_path / "proxy.err").read_text())
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return False
        writer.close()
        return True

    await wait_until(listening, timeout=60, what="agentsafe proxy to listen")
    return proxy


@pytest.fixture
async def enforcing(tmp_path: Path, upstream: Upstream) -> AsyncIterator[Proxy]:
    proxy = await start_proxy(tmp_path, upstream, "--enforce")
    yield proxy
    proxy.stop()


async def raw(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(65536), timeout=30)
    writer.close()
    return data


def status_and_json(data: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body)


async def test_allow_is_forwarded_byte_for_byte_once_under_a_grant(
    enforcing: Proxy, upstream: Upstream, tmp_path: Path
) -> None:
    body = b'{"amountMinor":  100 ,\n "note": "caf\\u00e9"}'
    async with aiohttp.ClientSession() as session:
        headers = {
            "content-type": "application/json",
            "idempotency-key": "order-1",
            "x-client-thing": "kept",
        }
        async with session.post(f"{enforcing.url}/pay?x=1", data=body, headers=headers) as r:
            assert r.status == 201, await r.text()
            assert (await r.json())["upstream"] == "real"
            assert r.headers["x-upstream"] == "yes"
            assert r.headers["x-agentsafe-authority"] == "demo"
            intent_hash = r.headers["x-agentsafe-intent-hash"]
        assert len(upstream.received) == 1
        method, path, sent, seen = upstream.received[0]
        assert (method, path) == ("POST", "/pay?x=1")
        assert sent == body, "the body is forwarded byte for byte"
        assert seen["x-client-thing"] == "kept"
        assert seen["idempotency-key"] == "order-1"
        assert seen["x-agent-safe-intent-hash"] == intent_hash
        assert seen["x-agent-safe-grant-id"]
        # the same key again: answered from the record, nothing sent twice
        async with session.post(f"{enforcing.url}/pay?x=1", data=body, headers=headers) as r:
            assert r.status == 200
            assert (await r.json())["replayed"] is True
        assert len(upstream.received) == 1
        # the same key with another body is a conflict, refused with its code
        async with session.post(
            f"{enforcing.url}/pay?x=1", data=b'{"amountMinor": 101}', headers=headers
        ) as r:
            assert r.status == 409
            assert (await r.json())["error"]["code"] == "IDEMPOTENCY_KEY_CONFLICT"
    assert len(upstream.received) == 1
    lines = enforcing.lines()
    started = enforcing.events()[0]
    assert started["event"] == "GATEWAY_LISTENING"
    assert started["schema"] == "agent-safe.log/1"
    assert started["level"] == "INFO"
    assert started["port"] == enforcing.port
    assert started["mode"] == "ENFORCEMENT"
    where = Path(started["evidence_dir"])
    events = [
        json.loads(line)["event"]
        for line in (where / "gateway-evidence.jsonl").read_text().splitlines()
    ]
    assert "DECISION" in events
    journal = "".join(p.read_text() for p in (where / "attempts").glob("*.jsonl"))
    assert "GRANT_CLAIMED" in journal, "the attempt was journaled before it was sent"
    assert lines
    assert all(
        e["authority"] == "demo" and e["notice"] == BANNER.rstrip(" |") for e in enforcing.events()
    ), "the demo says so on every line"
    assert any("forwarded once under a claimed grant" in line for line in lines)


async def test_block_escalate_and_reads(enforcing: Proxy, upstream: Upstream) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{enforcing.url}/pay", json={"amountMinor": 900000}) as r:
            assert r.status == 403
            refused = await r.json()
            assert refused["error"]["code"] == "GATEWAY_BLOCKED"
            assert refused["reason_codes"] == ["DEMO_AMOUNT_ABOVE_LIMIT"]
        async with session.post(f"{enforcing.url}/admin/users", json={}) as r:
            assert r.status == 403
            assert (await r.json())["reason_codes"] == ["DEMO_ADMIN_PATH"]
        async with session.delete(f"{enforcing.url}/accounts/7") as r:
            assert r.status == 202
            held = await r.json()
            assert held["state"] == "ESCALATE_PENDING"
            assert held["escalation"]["intent_hash"] == held["intent_hash"]
        assert upstream.received == [], "nothing refused or held reached the upstream"
        async with session.get(f"{enforcing.url}/accounts?page=2") as r:
            assert r.status == 200
        assert [(m, p) for m, p, _, _ in upstream.received] == [("GET", "/accounts?page=2")]


async def test_streaming_oversize_and_upgrades_are_refused_with_a_code(
    enforcing: Proxy, upstream: Upstream
) -> None:
    chunked = (
        b"POST /pay HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
    )
    status, body = status_and_json(await raw(enforcing.port, chunked))
    assert (status, body["error"]["code"]) == (411, "GATEWAY_STREAMING_REFUSED")
    big = b"x" * (100 * 1024 + 1)
    oversize = b"POST /pay HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(big) + big
    status, body = status_and_json(await raw(enforcing.port, oversize))
    assert (status, body["error"]["code"]) == (413, "GATEWAY_BODY_TOO_LARGE")
    upgrade = (
        b"GET /socket HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    status, body = status_and_json(await raw(enforcing.port, upgrade))
    assert (status, body["error"]["code"]) == (400, "GATEWAY_UPGRADE_REFUSED")
    assert upstream.received == []


@pytest.mark.parametrize(
    ("shape", "request_bytes"),
    [
        (
            "CL+TE",
            b"POST /pay HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n",
        ),
        (
            "TE+CL",
            b"POST /pay HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
            b"Content-Length: 4\r\n\r\n5c\r\nGPOST /smuggled HTTP/1.1\r\n\r\n0\r\n\r\n",
        ),
        (
            "duplicate Content-Length",
            b"POST /pay HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 40\r\n\r\n"
            b"{}GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n",
        ),
        (
            "folded header",
            b"POST /pay HTTP/1.1\r\nHost: x\r\nX-Secret-Looking: abc\r\n folded-secret\r\n"
            b"Content-Length: 2\r\n\r\n{}",
        ),
    ],
)
async def test_request_smuggling_shapes_are_refused_and_never_echoed(
    enforcing: Proxy, upstream: Upstream, shape: str, request_bytes: bytes
) -> None:
    data = await raw(enforcing.port, request_bytes)
    status, body = status_and_json(data)
    assert status == 400, shape
    assert body["error"]["code"] == "HTTP_MALFORMED", shape
    head = data.partition(b"\r\n\r\n")[0].lower()
    assert b"server: agentsafe" in head, "the executor's listener answered, not aiohttp's"
    assert b"smuggled" not in data
    assert b"secret" not in data.lower()
    assert b"Transfer-Encoding: chunked" not in data
    assert upstream.received == [], "nothing of it reached the upstream"


async def test_a_slowloris_on_the_gateway_is_closed_at_the_header_deadline(
    tmp_path: Path, upstream: Upstream
) -> None:
    proxy = await start_proxy(
        tmp_path, upstream, "--enforce", settings={"EXECUTOR_HEADER_TIMEOUT_SECONDS": "1"}
    )
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"POST /pay HTTP/1.1\r\nHost: x\r\n")
        await writer.drain()
        closed = asyncio.get_running_loop().create_future()

        async def drip() -> None:
            # One header byte at a time, well inside any per-read timeout: the whole head must
            # still arrive within the deadline of the connection being accepted.
            for byte in b"X-Slow: " + b"a" * 200:
                if closed.done():
                    return
                try:
                    writer.write(bytes([byte]))
                    await writer.drain()
                except (ConnectionError, RuntimeError):
                    return
                await asyncio.sleep(0.1)

        dripping = asyncio.create_task(drip())
        data = await asyncio.wait_for(reader.read(), timeout=15)
        closed.set_result(True)
        dripping.cancel()
        writer.close()
        assert b"x-slow" not in data.lower(), "nothing of the request is echoed"
        assert upstream.received == [], "a head that never completed reached nothing"
        # The gateway still serves whole requests after it.
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{proxy.url}/pay", json={"amountMinor": 1}) as r,
        ):
            assert r.status == 201
    finally:
        proxy.stop()


async def test_one_connection_over_the_gateways_per_source_cap_is_refused(
    tmp_path: Path, upstream: Upstream
) -> None:
    proxy = await start_proxy(
        tmp_path,
        upstream,
        "--enforce",
        settings={
            "EXECUTOR_MAX_CONNECTIONS_PER_SOURCE": "2",
            "EXECUTOR_MAX_CONNECTIONS": "8",
            # Long enough that the held connections are not closed idle under any load.
            "EXECUTOR_HEADER_TIMEOUT_SECONDS": "120",
        },
    )
    request = b"POST /pay HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
    held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def hold_one() -> bool:
        # A connection is known to be admitted (and counted) only once it has been answered:
        # start_proxy's probe connection may still be counted by the gate for a moment after
        # the probe closed it, so a connection refused then is dropped and another is opened.
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(request)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=30)
        if head.split(b" ", 2)[1] != b"201":
            writer.close()
            return len(held) == 2
        length = re.search(rb"(?i)content-length: *(\d+)", head)
        await reader.readexactly(int(length.group(1)) if length else 0)
        held.append((reader, writer))  # kept alive: the gate counts it until it closes
        return len(held) == 2

    try:
        await wait_until(hold_one, timeout=60, what="two admitted connections")
        data = await raw(proxy.port, request)
        status, body = status_and_json(data)
        assert status == 503
        assert body["error"]["code"] == "CONNECTION_LIMIT_REACHED"
        assert len(upstream.received) == 2, "only the two admitted connections' requests"
    finally:
        for _, writer in held:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
        proxy.stop()


async def test_shadow_is_the_default_forwards_and_reports_on_stop(
    tmp_path: Path, upstream: Upstream
) -> None:
    proxy = await start_proxy(tmp_path, upstream)
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{proxy.url}/pay", json={"amountMinor": 900000}) as r:
            assert r.status == 201, "in shadow the request goes through as before"
            assert r.headers["x-agentsafe-shadow-verdict"] == "BLOCK"
        async with session.post(f"{proxy.url}/pay", json={"amountMinor": 10}) as r:
            assert r.headers["x-agentsafe-shadow-verdict"] == "ALLOW"
    assert len(upstream.received) == 2
    assert proxy.stop() == 0
    events = proxy.events()
    assert all(e["authority"] == "demo" for e in events)
    (shadow,) = [e for e in events if e["event"] == "SHADOW_REPORT"]
    assert shadow["total"] == 2
    report = shadow["message"]
    assert "Shadow report: 2 proposal(s) observed" in report
    row = next(line for line in report.splitlines() if line.startswith("http_request"))
    assert row.split()[1:3] == ["1", "1"]
    assert "restart with EXECUTOR_MODE=ENFORCEMENT" in report
    assert "--enforce" in report


class UnreachableAuthority:
    """A test double for an authority that cannot be reached: the built-in authority runs in
    this process and cannot be unreachable here, so its evaluate is replaced by a failure."""

    async def evaluate(self, *args: Any, **kwargs: Any) -> Any:
        from agentsafe.executor.codes import Code
        from agentsafe.executor.errors import AgentSafeError

        raise AgentSafeError("the authority did not answer", code=Code.AUTHORITY_UNAVAILABLE)


async def test_an_unreachable_authority_is_its_own_state_never_a_verdict(
    tmp_path: Path, upstream: Upstream
) -> None:
    from agentsafe.executor.assembly import assemble
    from agentsafe.executor.events import MemorySink, Streams
    from agentsafe.executor.gateway.demo import demo_environment
    from agentsafe.executor.gateway.forward import Exchanges
    from agentsafe.executor.gateway.listener import Gateway
    from agentsafe.executor.proxy import _principal, _register, listen

    env = demo_environment(upstream.url, tmp_path / "demo", enforce=True, base={})
    exchanges = Exchanges()
    executor = await assemble(
        env,
        streams=Streams(evidence=MemorySink(), security=MemorySink()),
        registrations=[("gateway", _register(exchanges, 5000))],
    )
    await executor.reconcile_at_start()  # as the proxy does before it listens
    executor.pipeline._authority = UnreachableAuthority()  # type: ignore[assignment]
    gateway = Gateway(
        pipeline=executor.pipeline,
        principal=_principal(executor, None),
        upstream=upstream.url,
        transport=executor.transport,
        exchanges=exchanges,
        read_action=False,
        authority="demo",
        timeout=5.0,
        log=lambda line: None,
        screen=lambda text: executor.redactor.redact(text, jws=False)[0],
        security=executor.streams.security,
    )
    runner, site = await listen(gateway, executor, "127.0.0.1", 0)
    port = site.port
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"http://127.0.0.1:{port}/pay", json={"amountMinor": 1}) as r,
        ):
            assert r.status == 503
            assert r.headers["Retry-After"]
            body = await r.json()
        assert body["error"]["code"] == "GATEWAY_AUTHORITY_UNAVAILABLE"
        assert body["state"] == "AUTHORITY_UNAVAILABLE"
        assert "verdict" not in body, "an unreachable authority is not a BLOCK"
        assert upstream.received == []
    finally:
        await runner.cleanup()
        await executor.close()


async def test_a_configured_gateway_answers_agentsafe_status_with_its_shadow_report(
    tmp_path: Path, upstream: Upstream
) -> None:
    import yaml

    from agentsafe.executor.gateway.demo import DEMO_POLICY
    from agentsafe.executor.tools.harness import Workspace
    from tests.integration.bearer_principals import OPERATOR_ID, BearerPrincipals, principals_env

    policy = tmp_path / "gateway-policy.yaml"
    policy.write_text(DEMO_POLICY)
    assert "http_request" in yaml.safe_load(DEMO_POLICY)["actions"][0]["name"]
    principals = BearerPrincipals()
    document = principals.document()
    document["principals"][0]["allowed_actions"] = ["http_request"]
    principals_file = tmp_path / "principals.json"
    principals_file.write_text(json.dumps(document))
    principals_file.chmod(0o600)
    control_port = free_port()
    env = principals_env(
        Workspace(tmp_path / "ws").environment(
            provider_url=upstream.url, port=control_port, mode="SHADOW", policy_file=policy
        ),
        principals_file,
    )
    env["DOWNSTREAM_URL"] = upstream.url
    env.pop("DOWNSTREAM_LOOKUP_URL")
    port = free_port()
    out = tmp_path / "gateway.out"
    with out.open("wb") as stdout, (tmp_path / "gateway.err").open("wb") as stderr:
        process = subprocess.Popen(
            [
                AGENTSAFE,
                "proxy",
                "--upstream",
                upstream.url,
                "--port",
                str(port),
                "--principal",
                "treasury-workflow",
                "--serve-routes",
            ],
            stdout=stdout,
            stderr=stderr,
            env=env,
            cwd=tmp_path,
        )
    try:

        async def ready() -> bool:
            if process.poll() is not None:
                raise RuntimeError((tmp_path / "gateway.err").read_text())
            try:
                async with (
                    aiohttp.ClientSession() as session,
                    session.get(f"http://127.0.0.1:{control_port}/ready") as r,
                ):
                    return r.status == 200
            except aiohttp.ClientError:
                return False

        await wait_until(ready, timeout=60, what="the configured gateway")
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"http://127.0.0.1:{port}/pay", json={"amountMinor": 900000}) as r,
        ):
            assert r.headers["x-agentsafe-shadow-verdict"] == "BLOCK"
            assert r.headers["x-agentsafe-authority"] == "local"
        token_file = tmp_path / "operator-token"
        token_file.write_text(principals.token(OPERATOR_ID))
        status = subprocess.run(
            [
                AGENTSAFE,
                "status",
                "--url",
                f"http://127.0.0.1:{control_port}",
                "--token-file",
                str(token_file),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
        assert status.returncode == 0, status.stderr
        assert "mode          SHADOW" in status.stdout
        row = next(line for line in status.stdout.splitlines() if line.startswith("http_request"))
        assert row.split()[1:3] == ["0", "1"]
        assert "EXECUTOR_MODE=ENFORCEMENT" in status.stdout
        events = [json.loads(line) for line in out.read_text().splitlines()]
        assert [e["event"] for e in events[:2]] == ["GATEWAY_ROUTES", "GATEWAY_LISTENING"]
        assert not any("authority" in e for e in events)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)


async def test_agentsafe_status_against_a_demo_gateway_says_what_to_do(
    tmp_path: Path, upstream: Upstream
) -> None:
    proxy = await start_proxy(tmp_path, upstream)
    try:
        env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
        env["AGENTSAFE_OPERATOR_TOKEN"] = "operator-secret-never-forwarded"
        for extra in ([], ["-o", "json"]):
            status = subprocess.run(
                [AGENTSAFE, "status", "--url", proxy.url, *extra],
                capture_output=True,
                text=True,
                timeout=60,
                cwd=tmp_path,
                env=env,
            )
            assert status.returncode == 2, status.stderr
            assert "Traceback" not in status.stderr
            assert "DEMO authority" in status.stderr
            assert "--serve-routes" in status.stderr
            assert status.stdout == ""
        sent = [headers.get("authorization", "") for _, _, _, headers in upstream.received]
        assert not any("operator-secret" in value for value in sent), "no credential forwarded"
        assert any("agentsafe status has no control routes" in line for line in proxy.lines())
    finally:
        proxy.stop()


async def start_configured_gateway(
    tmp_path: Path, upstream: Upstream, *, mode: str, policy_text: str, **extra_env: str
) -> tuple[subprocess.Popen[bytes], int, int, Any]:
    """``agentsafe proxy --serve-routes`` with a principals file: (process, gateway port,
    executor routes port, the bearer principals)."""
    from agentsafe.executor.tools.harness import Workspace
    from tests.integration.bearer_principals import BearerPrincipals, principals_env

    policy = tmp_path / "gateway-policy.yaml"
    policy.write_text(policy_text)
    principals = BearerPrincipals()
    document = principals.document()
    document["principals"][0]["allowed_actions"] = ["http_request"]
    principals_file = tmp_path / "principals.json"
    principals_file.write_text(json.dumps(document))
    principals_file.chmod(0o600)
    control_port = free_port()
    env = principals_env(
        Workspace(tmp_path / "ws").environment(
            provider_url=upstream.url, port=control_port, mode=mode, policy_file=policy
        ),
        principals_file,
    )
    env["DOWNSTREAM_URL"] = upstream.url
    env.pop("DOWNSTREAM_LOOKUP_URL")
    env.update(extra_env)
    port = free_port()
    with (tmp_path / "gateway.out").open("wb") as out, (tmp_path / "gateway.err").open("wb") as err:
        process = subprocess.Popen(
            [
                AGENTSAFE,
                "proxy",
                "--upstream",
                upstream.url,
                "--port",
                str(port),
                "--principal",
                "treasury-workflow",
                "--serve-routes",
            ],
            stdout=out,
            stderr=err,
            env=env,
            cwd=tmp_path,
        )

    async def ready() -> bool:
        if process.poll() is not None:
            raise RuntimeError((tmp_path / "gateway.err").read_text())
        try:
            async with (
                aiohttp.ClientSession() as session,
                session.get(f"http://127.0.0.1:{control_port}/ready") as r,
            ):
                return r.status == 200
        except aiohttp.ClientError:
            return False

    await wait_until(ready, timeout=60, what="the configured gateway")
    return process, port, control_port, principals


async def test_an_escalation_through_the_gateway_is_held_then_forwarded_once_on_approval(
    tmp_path: Path, upstream: Upstream
) -> None:
    from agentsafe.executor.gateway.demo import DEMO_POLICY

    policy = DEMO_POLICY.replace("approvers: [demo-approver]", "approvers: [treasury-lead]")
    process, port, control_port, principals = await start_configured_gateway(
        tmp_path, upstream, mode="ENFORCEMENT", policy_text=policy, EXECUTOR_ESCALATION="APPROVAL"
    )
    routes = f"http://127.0.0.1:{control_port}"

    def bearer(principal: str) -> dict[str, str]:
        return {"authorization": f"Bearer {principals.token(principal)}"}

    try:
        async with aiohttp.ClientSession() as session:
            async with session.delete(
                f"http://127.0.0.1:{port}/accounts/7",
                json={"why": "closing"},
                headers={"Idempotency-Key": "close-account-7"},
            ) as r:
                assert r.status == 202
                held = await r.json()
            assert held["state"] == "ESCALATE_PENDING"
            escalation = held["escalation"]
            assert escalation["mode"] == "APPROVAL"
            assert escalation["approval_url"].endswith(escalation["request_id"])
            assert "/v1/escalations" in held["resume"]
            assert upstream.received == [], "held: nothing forwarded before a person decides"

            # Pending: presenting it again holds, and still sends nothing.
            async with session.post(
                f"{routes}/v1/escalations",
                json={"escalation": escalation},
                headers=bearer("treasury-workflow"),
            ) as r:
                pending = await r.json()
            assert pending["outcome"] == "ESCALATE_PENDING", pending
            assert upstream.received == []

            async with session.post(
                f"{routes}/v1/approvals/{escalation['request_id']}",
                json={"decision": "APPROVE", "reason": "the account owner asked"},
                headers=bearer("treasury-lead"),
            ) as r:
                assert r.status == 200, await r.text()

            answers = []
            for _ in range(2):
                async with session.post(
                    f"{routes}/v1/escalations",
                    json={"escalation": escalation},
                    headers=bearer("treasury-workflow"),
                ) as r:
                    assert r.status == 200, await r.text()
                    answers.append(await r.json())
        first, second = answers
        assert first["verdict"] == "ALLOW"
        assert first["outcome"] == "COMPLETED", first
        assert first["result"]["status"] == 200
        assert second["outcome"] == "COMPLETED"
        assert second["result"] == first["result"], "the second resume replays the first"
        assert len(upstream.received) == 1, "forwarded once, never twice"
        method, path, body, headers = upstream.received[0]
        assert (method, path, body) == ("DELETE", "/accounts/7", b'{"why": "closing"}')
        assert headers["idempotency-key"] == "close-account-7"
        assert headers["x-agent-safe-intent-hash"] == held["intent_hash"]
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)


async def test_executor_workers_is_refused_by_a_configured_gateway_which_runs_one_process(
    tmp_path: Path, upstream: Upstream
) -> None:
    from agentsafe.executor.gateway.demo import DEMO_POLICY
    from agentsafe.executor.tools.harness import Workspace

    policy = tmp_path / "gateway-policy.yaml"
    policy.write_text(DEMO_POLICY)
    env = Workspace(tmp_path / "ws").environment(
        provider_url=upstream.url, port=free_port(), mode="SHADOW", policy_file=policy
    )
    env["DOWNSTREAM_URL"] = upstream.url
    env.pop("DOWNSTREAM_LOOKUP_URL")
    env["EXECUTOR_WORKERS"] = "2"
    env["EXECUTOR_JOURNAL_DIR"] = str(tmp_path / "ws" / "journal")  # shadow's Workspace drops it
    result = await asyncio.to_thread(
        subprocess.run,
        [AGENTSAFE, "proxy", "--upstream", upstream.url, "--port", str(free_port())],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 78, result.stderr
    assert b"EXECUTOR_WORKERS: is for agentsafe serve" in result.stderr
    (line,) = [json.loads(text) for text in result.stderr.decode().splitlines()]
    assert line["event"] == "REFUSED_TO_START"  # one JSON line, as serve's (issue 31, item 9)
    assert line["level"] == "ERROR"
    assert line["schema"] == "agent-safe.security/1"


async def test_agentsafe_proxy_flushes_its_queued_spans_when_it_stops(
    tmp_path: Path, upstream: Upstream
) -> None:
    """``agentsafe proxy`` calls ``telemetry.shutdown()`` at exit: with a schedule delay no test
    waits for, the spans of one forwarded request reach the collector only by that flush."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    exported: list[str] = []

    async def traces(request: web.Request) -> web.Response:
        # a stand-in OTLP/HTTP collector (the real one is Jaeger, tests/integration/)
        message = ExportTraceServiceRequest()
        message.ParseFromString(await request.read())
        for resource in message.resource_spans:
            for scope in resource.scope_spans:
                exported.extend(span.name for span in scope.spans)
        return web.Response(status=200, content_type="application/x-protobuf", body=b"")

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    collector = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        proxy = await start_proxy(
            tmp_path,
            upstream,
            "--enforce",
            settings={
                "OTEL_TRACES_EXPORTER": "otlp",
                "OTEL_EXPORTER_OTLP_ENDPOINT": collector,
                "OTEL_BSP_SCHEDULE_DELAY": "3600000",  # an hour: only the exit's flush exports
            },
        )
        try:
            async with (
                aiohttp.ClientSession() as session,
                session.post(f"{proxy.url}/pay", json={"amountMinor": 100}) as r,
            ):
                assert r.status == 201, await r.text()
            assert exported == []
        finally:  # in a thread: the stand-in collector answers on this event loop meanwhile
            assert await asyncio.to_thread(proxy.stop) == 0
    finally:
        await runner.cleanup()
    assert "agentsafe.dispatch" in exported
