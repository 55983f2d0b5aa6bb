"""Issue 16's attacks on the listener, reproduced against a real ``agentsafe serve`` process.

Each executor here is a subprocess (``agentsafe serve`` through the harness) with the audit hook,
the listener and the chained streams as production runs them, and every attack speaks raw bytes
over loopback sockets:

- item 7: slowloris on the request head (one byte at a time, and idle), on the TLS handshake, and
  an authenticated slow body are cut off by their deadlines; the total and per-source connection
  caps answer one more connection 503 in the refusal contract, and others are still served;
- item 8: a client CA removed from ``EXECUTOR_TLS_CLIENT_CA_FILE`` stops admitting its
  certificates after ``POST /v1/control/secrets/reload``;
- item 11: requests aiohttp cannot parse are answered in the refusal contract (JSON, the four
  security headers, a fixed message that echoes nothing), and every response says
  ``Server: agentsafe``;
- item 13: a 5000-digit integer and a lone surrogate are 400 REQUEST_INVALID on every route that
  reads a body, and change nothing;
- item 16: ``EXECUTOR_SECRETS_DIR=/`` refuses to start with ``SECRET_DIR_UNSAFE``.

Every wait polls with a deadline; every process is stopped in ``finally``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from agentsafe.executor.routes.app import core_routes
from agentsafe.executor.routes.approval_page import page_routes
from agentsafe.executor.routes.approvals import approval_routes
from agentsafe.executor.routes.control import control_routes
from agentsafe.executor.routes.plans import plan_routes
from agentsafe.executor.tools.harness import (
    ExecutorProcess,
    ProviderProcess,
    Workspace,
    free_port,
    wait_until,
)
from tests.plans import support as plans_support
from tests.support.pki import Issued, TestCA

from .bearer_principals import (
    APPROVERS_OPERATOR_ID,
    OPERATOR_ID,
    BearerPrincipals,
    principals_env,
)
from .estate import write_private

pytestmark = pytest.mark.slow

AGENTSAFE = str(Path(sys.executable).parent / "agentsafe")
EXAMPLE = Path(__file__).parents[2] / "examples" / "policy.yaml"
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'none'; frame-ancestors 'none'",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "cache-control": "no-store",
}
HEADER_TIMEOUT = 2  # seconds, EXECUTOR_HEADER_TIMEOUT_SECONDS of the deadline process
BODY_TIMEOUT = 2
SECRET_MARKER = "zq-secret-token-7f3a9c"  # what an echo would give back


# ----------------------------------------------------------------------------- raw HTTP


@dataclass(frozen=True)
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes
    raw: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


def parse_response(raw: bytes) -> RawResponse:
    if not raw:
        raise ConnectionResetError("the server closed the connection without an answer")
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return RawResponse(int(lines[0].split(" ")[1]), headers, body, raw)


async def read_all(reader: asyncio.StreamReader, timeout: float = 30.0) -> bytes:
    """Everything the server sends until it closes (the deadline fails the test)."""
    chunks: list[bytes] = []
    async with asyncio.timeout(timeout):
        while chunk := await reader.read(65536):
            chunks.append(chunk)
    return b"".join(chunks)


async def exchange(
    port: int, data: bytes, *, host: str = "127.0.0.1", local: str | None = None
) -> RawResponse:
    reader, writer = await asyncio.open_connection(
        host, port, local_addr=(local, 0) if local else None
    )
    try:
        writer.write(data)
        await writer.drain()
        return parse_response(await read_all(reader))
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def assert_contract(response: RawResponse) -> None:
    """The refusal contract: JSON error body, the four headers, no server version."""
    assert response.headers["content-type"].startswith("application/json"), response.raw
    for name, value in SECURITY_HEADERS.items():
        assert response.headers.get(name) == value, (name, response.raw)
    assert response.headers["server"] == "agentsafe", response.raw
    assert set(response.json) == {"error"}
    assert set(response.json["error"]) == {"code", "message"}


async def trickle_until_closed(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, trickle: bytes | None
) -> tuple[bytes, float]:
    """Send one byte of ``trickle`` every 0.25 s (or nothing) until the server closes the
    connection; what it answered and the seconds it took. Still open after 30 s fails the test."""
    started = time.monotonic()
    answered: list[bytes] = []
    position = 0
    async with asyncio.timeout(30):
        while True:
            if trickle is not None and position < len(trickle):
                with contextlib.suppress(ConnectionError):
                    writer.write(trickle[position : position + 1])
                    await writer.drain()
                position += 1
            try:
                data = await asyncio.wait_for(reader.read(65536), timeout=0.25)
            except TimeoutError:
                continue
            except ConnectionError:
                break
            if not data:
                break
            answered.append(data)
    return b"".join(answered), time.monotonic() - started


async def closed_by_server(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, trickle: bytes | None
) -> float:
    """The seconds until the server closed a connection trickling ``trickle``."""
    _, held = await trickle_until_closed(reader, writer, trickle)
    return held


# ----------------------------------------------------------------------------- processes


def _start(process: ExecutorProcess | ProviderProcess) -> None:
    asyncio.run(process.start())


@dataclass
class Served:
    executor: ExecutorProcess
    principals: BearerPrincipals

    @property
    def port(self) -> int:
        return self.executor.port

    def bearer(self, who: str) -> str:
        return self.principals.token(who)


def _policy_with_plans(directory: Path) -> Path:
    document = yaml.safe_load(EXAMPLE.read_text())
    document["plans"] = plans_support.policy()
    path = directory / "policy.json"
    path.write_text(json.dumps(document))
    return path


@contextlib.contextmanager
def served(root: Path, **settings: str) -> Iterator[Served]:
    """A plaintext ``agentsafe serve`` with principals, approvals and the plan routes on."""
    root.mkdir(parents=True, exist_ok=True)
    provider = ProviderProcess(root)
    _start(provider)
    principals = BearerPrincipals(approvers_operator=True)
    workspace = Workspace(root / "ws")
    env = principals_env(
        workspace.environment(
            provider_url=provider.url, port=free_port(), policy_file=_policy_with_plans(root)
        ),
        principals.write(root / "principals.json"),
        EXECUTOR_ESCALATION="APPROVAL",
        **settings,
    )
    executor = ExecutorProcess(env, root)
    try:
        _start(executor)
        yield Served(executor, principals)
    finally:
        executor.terminate()
        provider.terminate()


@pytest.fixture(scope="module")
def deadlines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """Short read deadlines, the default caps."""
    with served(
        tmp_path_factory.mktemp("deadlines"),
        EXECUTOR_HEADER_TIMEOUT_SECONDS=str(HEADER_TIMEOUT),
        EXECUTOR_BODY_TIMEOUT_SECONDS=str(BODY_TIMEOUT),
    ) as running:
        yield running


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """Small connection caps, deadlines long enough to hold connections open. The tests that are
    not about the deadlines run here too, so a loaded machine never cuts their requests off."""
    with served(
        tmp_path_factory.mktemp("capped"),
        EXECUTOR_HEADER_TIMEOUT_SECONDS="60",
        EXECUTOR_MAX_CONNECTIONS="12",
        EXECUTOR_MAX_CONNECTIONS_PER_SOURCE="8",
    ) as running:
        yield running


def security_events(served: Served, name: str) -> list[dict[str, Any]]:
    return [e for e in served.executor.stderr_events() if e.get("event") == name]


def assert_still_serving(served: Served) -> None:
    """The process runs, is ready and not halted (asked until a deadline: on a loaded machine a
    probe may itself meet the short head deadline)."""

    async def ready() -> bool:
        assert served.executor.running, served.executor.stderr_path.read_text()[-2000:]
        try:
            response = await exchange(
                served.port, b"GET /ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
        except OSError:
            return False
        assert response.status == 200, response.raw
        assert response.json == {"ready": True, "code": "READY"}
        return True

    asyncio.run(wait_until(ready, timeout=60, what="the executor to answer /ready"))


# ----------------------------------------------------------------------------- item 11


MALFORMED = [
    f"GE<T /{SECRET_MARKER} HTTP/1.1\r\nHost: x\r\n\r\n".encode(),  # a bad method token
    f"GET /x HTTP/1.1\r\nBad Header: {SECRET_MARKER}\r\n\r\n".encode(),  # a space in a name
    f"GET /{SECRET_MARKER}{'a' * 9000} HTTP/1.1\r\n\r\n".encode(),  # a request line too long
    f"GET /x HTTP/1.1\r\nX-Long: {SECRET_MARKER}{'b' * 9000}\r\n\r\n".encode(),  # a header too
    f"GET /x HTTP/9.{SECRET_MARKER}\r\n\r\n".encode(),  # not a version
    (  # two lengths
        "GET /x HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"
        + SECRET_MARKER
    ).encode(),
    (  # a chunk size that is not hexadecimal
        "POST /v1/actions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Transfer-Encoding: chunked\r\n\r\n{SECRET_MARKER}\r\nabc\r\n0\r\n\r\n"
    ).encode(),
    f"GET /x HTTP/1.1\r\nHost: x\r\nX-Nul: a\x00{SECRET_MARKER}\r\n\r\n".encode(),
    f"\x16\x03\x01\x02\x00\x01{SECRET_MARKER}\r\n\r\n".encode(),  # TLS spoken to plaintext
]


@pytest.mark.parametrize("request_bytes", MALFORMED, ids=range(len(MALFORMED)))
def test_what_aiohttp_cannot_parse_is_refused_in_the_contract(
    capped: Served, request_bytes: bytes
) -> None:
    response = asyncio.run(exchange(capped.port, request_bytes))
    assert response.status == 400, response.raw
    assert_contract(response)
    assert response.json["error"]["code"] in {"HTTP_MALFORMED", "REQUEST_MALFORMED"}
    assert SECRET_MARKER.encode() not in response.raw  # nothing of the request echoed
    assert b"aiohttp" not in response.raw
    assert b"Python" not in response.raw


def test_every_response_says_server_agentsafe_with_the_security_headers(
    capped: Served,
) -> None:
    requests = {
        b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n": 200,
        b"GET /nowhere HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n": 404,
        b"DELETE /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n": 405,
        b"GET /v1/control/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n": 401,
        b"POST /v1/actions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Authorization: Bearer " + capped.bearer("treasury-workflow").encode() + b"\r\n"
        b"Content-Type: text/plain\r\nContent-Length: 2\r\n\r\nhi": 415,
    }
    for request_bytes, status in requests.items():
        response = asyncio.run(exchange(capped.port, request_bytes))
        assert response.status == status, response.raw
        assert response.headers["server"] == "agentsafe"
        for name, value in SECURITY_HEADERS.items():
            assert response.headers.get(name) == value, (name, response.raw)
        if status != 200:
            assert_contract(response)


# ----------------------------------------------------------------------------- item 7


def test_slowloris_on_the_request_head_is_cut_off_at_the_header_deadline(
    deadlines: Served,
) -> None:
    """Sockets trickling one header byte at a time, and sockets that send nothing, are closed
    at EXECUTOR_HEADER_TIMEOUT_SECONDS; the executor keeps serving meanwhile."""
    head = b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 400

    async def attack() -> list[float]:
        connections = [
            await asyncio.open_connection("127.0.0.1", deadlines.port) for _ in range(40)
        ]
        try:
            waits = [
                closed_by_server(reader, writer, trickle=head if i % 2 == 0 else None)
                for i, (reader, writer) in enumerate(connections)
            ]
            return list(await asyncio.gather(*waits))
        finally:
            for _, writer in connections:
                writer.close()

    held = asyncio.run(attack())
    assert len(held) == 40
    # every one closed (closed_by_server fails after 30 s), and by the deadline, not before it;
    # the trickle alone would have taken more than 100 s
    assert min(held) >= HEADER_TIMEOUT - 0.5, held
    assert_still_serving(deadlines)


def test_the_reviews_600_slowloris_sockets_are_refused_or_cut_off_and_others_are_served(
    deadlines: Served,
) -> None:
    """The review held 600 sockets indefinitely. Now the per-source cap (128 by default)
    refuses the ones beyond it at once and the header deadline closes the rest. (That a caller
    from another address is served while one source is at its cap is the caps test's.)"""
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 400

    async def one() -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", deadlines.port)
        try:
            writer.write(head[:20])
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            return await read_all(reader, timeout=60)
        finally:
            writer.close()

    async def attack() -> list[bytes]:
        return list(await asyncio.gather(*(one() for _ in range(600))))

    answers = asyncio.run(attack())
    refused = [a for a in answers if a]
    cut_off = [a for a in answers if not a]
    # every one of them ended: refused at once, or closed at the head deadline (on a loaded
    # machine the 600 take longer than the deadline to open, so more than 128 get their turn)
    assert len(refused) + len(cut_off) == 600
    assert refused, "the per-source cap never engaged"
    # and never more open at once than the per-source cap (128)
    summaries = security_events(deadlines, "CONNECTIONS_REFUSED")
    assert summaries
    assert max(line["open"] for line in summaries) <= 128
    for answer in refused:
        assert answer.startswith(b"HTTP/1.1 503 "), answer[:300]
        response = parse_response(answer)
        assert response.status == 503
        assert response.json["error"]["code"] == "CONNECTION_LIMIT_REACHED"
    assert_still_serving(deadlines)


def test_a_kept_alive_connection_gets_the_head_deadline_again_after_each_response(
    deadlines: Served,
) -> None:
    async def attack() -> tuple[int, float]:
        reader, writer = await asyncio.open_connection("127.0.0.1", deadlines.port)
        try:
            writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            status_line = await asyncio.wait_for(reader.readline(), timeout=10)
            await asyncio.wait_for(reader.readuntil(b'"ok"}'), timeout=10)
            held = await closed_by_server(
                reader, writer, trickle=b"GET /health HTTP/1.1\r\nX: " + b"y" * 400
            )
            return int(status_line.split()[1]), held
        finally:
            writer.close()

    status, held = asyncio.run(attack())
    assert status == 200
    assert held >= HEADER_TIMEOUT - 0.5


def test_an_authenticated_slow_body_is_408_and_closed_at_the_body_deadline(
    deadlines: Served,
) -> None:
    body = json.dumps({"reason": "x" * 200}).encode()
    head = (
        b"POST /v1/control/halt HTTP/1.1\r\nHost: x\r\n"
        b"Authorization: Bearer " + deadlines.bearer(OPERATOR_ID).encode() + b"\r\n"
        b"Content-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
    )

    async def attack() -> tuple[RawResponse, float]:
        reader, writer = await asyncio.open_connection("127.0.0.1", deadlines.port)
        try:
            writer.write(head + body[:5])
            await writer.drain()
            answer, held = await trickle_until_closed(reader, writer, body[5:])
            return parse_response(answer), held
        finally:
            writer.close()

    response, held = asyncio.run(attack())
    assert response.status == 408, response.raw
    assert_contract(response)
    assert response.json["error"]["code"] == "REQUEST_TIMEOUT"
    assert held >= BODY_TIMEOUT - 0.5
    assert_still_serving(deadlines)  # the half-read halt changed nothing


def test_the_connection_caps_answer_503_in_the_contract_and_others_are_served(
    capped: Served,
) -> None:
    """8 connections from one source fill its cap; 4 from a second fill the total (12)."""

    async def attack() -> dict[str, Any]:
        held: list[asyncio.StreamWriter] = []

        async def hold(local: str) -> None:
            _, writer = await asyncio.open_connection(
                "127.0.0.1", capped.port, local_addr=(local, 0)
            )
            writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # a head left unfinished
            await writer.drain()
            held.append(writer)

        async def opened() -> bool:
            probe = await exchange(
                capped.port,
                b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                local="127.0.0.9",
            )
            return probe.status == 200

        try:
            for _ in range(8):
                await hold("127.0.0.1")
            per_source = await exchange(
                capped.port, b"GET /health HTTP/1.1\r\n\r\n", local="127.0.0.1"
            )
            # another source is still served while the first one is at its cap
            other_source = await exchange(
                capped.port,
                b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                local="127.0.0.2",
            )
            for _ in range(4):
                await hold("127.0.0.2")
            total = await exchange(capped.port, b"GET /health HTTP/1.1\r\n\r\n", local="127.0.0.3")
        finally:
            for writer in held:
                writer.close()
        # once they are gone, a connection is admitted again
        await wait_until(opened, timeout=30, what="a connection admitted after the flood")
        return {"per_source": per_source, "other_source": other_source, "total": total}

    found = asyncio.run(attack())
    for key in ("per_source", "total"):
        response = found[key]
        assert response.status == 503, (key, response.raw)
        assert_contract(response)
        assert response.json["error"]["code"] == "CONNECTION_LIMIT_REACHED"
        assert response.headers["retry-after"] == "1"
        assert response.headers["connection"] == "close"
    assert found["other_source"].status == 200
    assert_still_serving(capped)

    async def summarised() -> bool:
        return bool(security_events(capped, "CONNECTIONS_REFUSED"))

    asyncio.run(wait_until(summarised, timeout=30, what="CONNECTIONS_REFUSED on the stream"))
    [first, *_] = security_events(capped, "CONNECTIONS_REFUSED")
    assert first["refused"] >= 1
    assert 1 <= first["open"] <= 12


# ----------------------------------------------------------------------------- item 13


def _body_routes() -> set[tuple[str, str]]:
    """Every route that reads a body, from the route table itself (dummies: no handler runs)."""
    dummy = cast(Any, None)
    rows = [
        *core_routes(
            pipeline=dummy, reconciler=dummy, escalator=dummy, readiness=dummy, jwks=dummy
        ),
        *control_routes(dummy),
        *plan_routes(service=dummy, streams=dummy, work_refusal=dummy),
        *approval_routes(store=dummy, streams=dummy, clock=dummy),
        *page_routes(),
    ]
    return {(row.method, row.path) for row in rows if row.body is not None}


BODY_ROUTES = {
    ("POST", "/v1/actions"): "treasury-workflow",
    ("POST", "/v1/reconciliations"): "treasury-workflow",
    ("POST", "/v1/escalations"): "treasury-workflow",
    ("POST", "/v1/plans/dry-run"): "treasury-workflow",
    ("POST", "/v1/plans/steps"): "treasury-workflow",
    ("POST", "/v1/plans/approvals"): "treasury-lead",
    ("POST", "/v1/plans/receipts/verify"): OPERATOR_ID,
    ("POST", "/v1/approvals/{request_id}"): "treasury-lead",
    ("POST", "/v1/approvals/{request_id}/challenge"): "treasury-lead",
    ("POST", "/v1/approvers/enrolment/options"): "treasury-lead",
    ("POST", "/v1/approvers/enrolment"): "treasury-lead",
    ("POST", "/v1/control/approvers/{principal_id}/enrolment-tokens"): APPROVERS_OPERATOR_ID,
    ("POST", "/v1/control/approvals/{request_id}/cancel"): APPROVERS_OPERATOR_ID,
    ("POST", "/v1/escalations/cancel"): "treasury-workflow",
    ("POST", "/v1/control/halt"): OPERATOR_ID,
    ("POST", "/v1/control/resume"): OPERATOR_ID,
    ("POST", "/v1/control/evidence-export"): OPERATOR_ID,
    ("POST", "/v1/control/open-attempts/decision"): OPERATOR_ID,
}

HOSTILE_BODIES = {
    "5000-digit integer": b'{"reason": 1' + b"0" * 4999 + b', "proposal": {"n": 1}}',
    "lone surrogate": b'{"reason": "\\ud800", "proposal": {"x": "\\udfff"}}',
    "nested lone surrogate": b'{"plan": [{"a": ["ok", "\\udc00x"]}], "reason": "r"}',
}


def test_the_body_routes_listed_here_are_every_body_route() -> None:
    assert _body_routes() == set(BODY_ROUTES)


@pytest.mark.parametrize("kind", sorted(HOSTILE_BODIES))
def test_hostile_numbers_and_strings_are_400_on_every_body_route(capped: Served, kind: str) -> None:
    body = HOSTILE_BODIES[kind]
    for (method, path), who in BODY_ROUTES.items():
        target = path.replace("{request_id}", "00000000-0000-4000-8000-000000000001").replace(
            "{principal_id}", "treasury-lead"
        )
        request_bytes = (
            f"{method} {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            f"Authorization: Bearer {capped.bearer(who)}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        response = asyncio.run(exchange(capped.port, request_bytes))
        assert response.status == 400, (path, response.raw)
        assert_contract(response)
        assert response.json["error"]["code"] == "REQUEST_INVALID", (path, response.raw)
    # nothing changed: not halted, no 500 and no traceback on the process's streams
    assert_still_serving(capped)
    assert security_events(capped, "HALTED") == []
    stderr = capped.executor.stderr_path.read_text()
    assert "Traceback" not in stderr
    assert "unhandled error" not in stderr


# ----------------------------------------------------------------------------- item 16


def test_the_filesystem_root_as_the_secrets_dir_refuses_to_start(tmp_path: Path) -> None:
    env = Workspace(tmp_path / "ws").environment(provider_url="http://127.0.0.1:9", port=0)
    env["EXECUTOR_SECRETS_DIR"] = "/"
    result = subprocess.run(
        [AGENTSAFE, "serve"], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path
    )
    assert result.returncode == 78, result.stderr
    [line] = [line for line in result.stderr.splitlines() if "refused to start" in line]
    assert "SECRET_DIR_UNSAFE" in line
    assert "EXECUTOR_SECRETS_DIR" in line


# ----------------------------------------------------------------------------- TLS: items 7, 8


@dataclass
class TlsServed:
    executor: ExecutorProcess
    principals: BearerPrincipals
    ca: TestCA
    partner: TestCA
    client_ca_file: Path
    scratch: Path

    def context(self, client: Issued | None = None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cadata=self.ca.cert_pem.decode())
        if client is not None:
            cert, key = client.write(self.scratch, f"client-{client.sha256[:10]}")
            ctx.load_cert_chain(str(cert), str(key))
        return ctx


@pytest.fixture
def tls_served(tmp_path: Path) -> Iterator[TlsServed]:
    """A TLS serve whose client CA bundle holds our CA and a partner's; an MTLS operator."""
    ca, partner = TestCA("agentsafe hardening CA"), TestCA("partner CA")
    workspace = Workspace(tmp_path / "ws")
    server = ca.issue_server()
    cert_file = write_private(workspace.root / "listener.crt", server.cert_pem, mode=0o644)
    key_file = write_private(workspace.secrets_dir / "listener.key", server.key_pem)
    client_ca_file = write_private(
        workspace.root / "clients-ca.pem", ca.cert_pem + partner.cert_pem, mode=0o644
    )
    principals = BearerPrincipals()
    document = principals.document()
    document["principals"].append(
        {
            "id": "partner-oncall",
            "role": "OPERATOR",
            "actor": {"id": "erin@partner.example", "type": "HUMAN"},
            "scopes": ["status"],
            "credential": {"kind": "MTLS", "san_uri": "spiffe://partner.example/oncall"},
        }
    )
    principals_file = write_private(tmp_path / "principals.json", json.dumps(document).encode())
    env = principals_env(
        workspace.environment(provider_url="http://127.0.0.1:9", port=free_port()),
        principals_file,
        EXECUTOR_HEADER_TIMEOUT_SECONDS=str(HEADER_TIMEOUT),
    )
    env.pop("EXECUTOR_ALLOW_PLAINTEXT_LISTENER")
    env.update(
        {
            "EXECUTOR_TLS_CERT_FILE": str(cert_file),
            "EXECUTOR_TLS_KEY_FILE": str(key_file),
            "EXECUTOR_TLS_CLIENT_CA_FILE": str(client_ca_file),
        }
    )
    executor = ExecutorProcess(env, tmp_path)
    scratch = tmp_path / "clients"
    scratch.mkdir(mode=0o700)
    served_tls = TlsServed(executor, principals, ca, partner, client_ca_file, scratch)
    try:
        executor.spawn()

        async def healthy() -> bool:
            assert executor.running, executor.stderr_path.read_text()[-2000:]
            with contextlib.suppress(OSError, ssl.SSLError, ValueError):
                response = await tls_exchange(executor.port, served_tls.context(), "GET", "/health")
                return response.status == 200
            return False

        asyncio.run(wait_until(healthy, timeout=60, what="the TLS listener"))
        yield served_tls
    finally:
        executor.terminate()


async def tls_exchange(
    port: int,
    ctx: ssl.SSLContext,
    method: str,
    path: str,
    *,
    token: str | None = None,
    body: bytes | None = None,
) -> RawResponse:
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=ctx, server_hostname="localhost"
    )
    try:
        headers = f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
        if token is not None:
            headers += f"Authorization: Bearer {token}\r\n"
        if body is not None:
            headers += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        writer.write(headers.encode() + b"\r\n" + (body or b""))
        await writer.drain()
        # TLS 1.3: a refused client certificate ends the connection after Finished, unanswered
        return parse_response(await read_all(reader))
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await writer.wait_closed()


def test_a_removed_client_ca_stops_admitting_its_certificates_after_reload(
    tls_served: TlsServed,
) -> None:
    port = tls_served.executor.port
    partner_client = tls_served.partner.issue_client("spiffe://partner.example/oncall")

    async def scenario() -> tuple[RawResponse, RawResponse, RawResponse | BaseException]:
        before = await tls_exchange(
            port, tls_served.context(partner_client), "GET", "/v1/control/status"
        )
        # the partner CA is withdrawn from the bundle, then an operator reloads
        write_private(tls_served.client_ca_file, tls_served.ca.cert_pem, mode=0o644)
        reload = await tls_exchange(
            port,
            tls_served.context(),
            "POST",
            "/v1/control/secrets/reload",
            token=tls_served.principals.token(OPERATOR_ID),
        )
        try:
            after: RawResponse | BaseException = await tls_exchange(
                port, tls_served.context(partner_client), "GET", "/v1/control/status"
            )
        except (ssl.SSLError, ConnectionError, OSError) as exc:
            after = exc
        return before, reload, after

    before, reload, after = asyncio.run(scenario())
    assert before.status == 200, before.raw
    assert reload.status == 200, reload.raw
    assert reload.json["tls"]["rotated"] is True
    # the handshake refuses the certificate now (TLS 1.3 may report it on the first read)
    assert isinstance(after, BaseException) or after.status != 200, after


def test_a_stalled_tls_handshake_is_closed_at_the_header_deadline(
    tls_served: TlsServed,
) -> None:
    async def attack() -> list[float]:
        connections = [
            await asyncio.open_connection("127.0.0.1", tls_served.executor.port) for _ in range(10)
        ]
        try:
            partial_hello = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"
            return list(
                await asyncio.gather(
                    *(
                        closed_by_server(r, w, trickle=partial_hello if i % 2 else None)
                        for i, (r, w) in enumerate(connections)
                    )
                )
            )
        finally:
            for _, writer in connections:
                writer.close()

    held = asyncio.run(attack())
    assert min(held) >= HEADER_TIMEOUT - 0.5, held
    ok = asyncio.run(tls_exchange(tls_served.executor.port, tls_served.context(), "GET", "/health"))
    assert ok.status == 200
