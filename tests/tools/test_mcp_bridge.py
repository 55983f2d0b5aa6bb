"""``agentsafe mcp`` as a real subprocess, driven by the ``mcp`` client over stdio and over
streamable HTTP, in front of a real executor and a real synthetic provider on loopback."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS

from agentsafe.executor.assembly import assemble
from agentsafe.executor.dispatch.registration import Seam
from agentsafe.executor.dispatch.seam import (
    Dispatch,
    ExecutionContext,
    ReconcileResult,
    ReconcileStatus,
)
from agentsafe.executor.events import MemorySink, Streams
from agentsafe.executor.plane import Executor
from agentsafe.executor.tools.harness import Workspace, free_port, wait_until
from agentsafe.executor.tools.mcp_bridge import RESUME_TOOL
from agentsafe.executor.tools.synthetic import SyntheticProvider
from tests.integration.bearer_principals import BearerPrincipals, principals_env

AGENTSAFE = str(Path(sys.executable).parent / "agentsafe")
POLICY = """
actions:
  - name: create_payout
    handler: forward_request
    parameters:
      type: object
      required: [amountMinor, currency]
      additionalProperties: false
      properties:
        amountMinor: {type: integer, minimum: 1}
        currency: {type: string, pattern: "^[A-Z]{3}$"}
    rules:
      - {name: small, when: "params.amountMinor <= 5000", verdict: ALLOW}
      - name: medium
        when: "params.amountMinor <= 50000"
        verdict: ESCALATE
        approvers: [treasury-lead]
      - {name: large, when: "true", verdict: BLOCK, reasonCode: AMOUNT_ABOVE_POLICY}
  - name: add_note
    handler: add_note
    parameters:
      type: object
      required: [note]
      additionalProperties: false
      properties:
        note: {type: string}
    rules:
      - {name: all, when: "true", verdict: ALLOW}
  - name: not_for_this_agent
    handler: add_note
    parameters:
      type: object
      required: [note]
      additionalProperties: false
      properties:
        note: {type: string}
    rules:
      - {name: all, when: "true", verdict: ALLOW}
"""


class AddNote:
    description = "Add a note."
    destructive = False
    parameters_schema: Mapping[str, Any] = {
        "type": "object",
        "required": ["note"],
        "additionalProperties": False,
        "properties": {"note": {"type": "string"}},
    }

    async def execute(self, ctx: ExecutionContext, dispatch: Dispatch) -> Mapping[str, Any]:
        async def effect(key: str) -> str:
            return key

        await dispatch.run(effect)
        return {"noted": True}

    async def reconcile(self, idempotency_key: str, *, intent_hash: str) -> ReconcileResult:
        return ReconcileResult(ReconcileStatus.UNKNOWN)


def register(seam: Seam) -> None:
    seam.registry.register("add_note", AddNote())


@dataclass
class Node:
    executor: Executor
    provider: SyntheticProvider
    url: str
    principals: BearerPrincipals


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    provider = SyntheticProvider()
    await provider.start()
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    principals = BearerPrincipals()
    document = principals.document()
    document["principals"][0]["allowed_actions"] = ["create_payout", "add_note"]
    principals_file = tmp_path / "principals.json"
    principals_file.write_text(json.dumps(document))
    principals_file.chmod(0o600)
    env = principals_env(
        Workspace(tmp_path / "ws").environment(
            provider_url=provider.base_url, port=free_port(), policy_file=policy
        ),
        principals_file,
        EXECUTOR_HANDLERS=f"{__name__}:register",
        EXECUTOR_ESCALATION="APPROVAL",
    )
    executor = await assemble(env, streams=Streams(evidence=MemorySink(), security=MemorySink()))
    await executor.reconcile_at_start()
    await executor.listen()
    yield Node(executor, provider, f"http://127.0.0.1:{executor.port}", principals)
    await executor.close()
    await provider.stop()


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
    env.update(extra)
    return env


@contextlib.asynccontextmanager
async def stdio_session(node: Node, tmp_path: Path, token: str) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=AGENTSAFE,
        args=["mcp", "--url", node.url],
        env=_clean_env(AGENTSAFE_AGENT_TOKEN=token),
        cwd=str(tmp_path),
    )
    with (tmp_path / "mcp.log").open("w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session


def _text(result: Any) -> str:
    return "".join(block.text for block in result.content if getattr(block, "text", None))


async def _exercise(session: ClientSession, node: Node) -> None:
    listed = await session.list_tools()
    tools = {tool.name: tool for tool in listed.tools}
    assert set(tools) == {"create_payout", "add_note", RESUME_TOOL}, (
        "only what this principal may propose, and the resume tool"
    )
    resume = tools[RESUME_TOOL]
    assert resume.annotations is not None
    assert resume.annotations.destructive_hint is True
    payout = tools["create_payout"]
    assert payout.annotations is not None
    assert payout.annotations.destructive_hint is True
    assert payout.annotations.read_only_hint is False
    note = tools["add_note"]
    assert note.annotations is not None
    assert note.annotations.destructive_hint is False
    schema = payout.input_schema
    assert schema["properties"]["parameters"]["additionalProperties"] is False
    before = len(node.provider.received)

    paid = await session.call_tool(
        "create_payout",
        {"target": "payout:b-1", "parameters": {"amountMinor": 1200, "currency": "USD"}},
    )
    assert paid.is_error is False
    assert _text(paid).startswith("ALLOW: executed once")
    assert paid.structured_content["outcome"] == "COMPLETED"
    assert len(node.provider.received) == before + 1

    blocked = await session.call_tool(
        "create_payout",
        {"target": "payout:b-1", "parameters": {"amountMinor": 900000, "currency": "USD"}},
    )
    assert blocked.is_error is False, "a BLOCK is a result the model reads"
    assert "BLOCK" in _text(blocked)
    assert "AMOUNT_ABOVE_POLICY" in _text(blocked)

    held = await session.call_tool(
        "create_payout",
        {"target": "payout:b-1", "parameters": {"amountMinor": 20000, "currency": "USD"}},
    )
    assert held.is_error is False
    assert _text(held).startswith("ESCALATE: held")
    assert held.structured_content["outcome"] == "ESCALATE_PENDING"
    assert len(node.provider.received) == before + 1

    invalid = await session.call_tool(
        "create_payout",
        {"target": "payout:b-1", "parameters": {"amountMinor": 1, "currency": "USD", "x": 1}},
    )
    assert "BLOCK" in _text(invalid) or invalid.is_error
    assert len(node.provider.received) == before + 1

    # An action this principal may not propose is not one of its tools: the bridge answers
    # JSON-RPC -32602 itself and proposes nothing (issue 30, item 15).
    with pytest.raises(MCPError) as forbidden:
        await session.call_tool("not_for_this_agent", {"target": "t", "parameters": {"note": "x"}})
    assert forbidden.value.code == INVALID_PARAMS


async def test_an_approved_escalation_is_resumed_once_with_the_resume_tool(
    node: Node, tmp_path: Path
) -> None:
    import aiohttp

    token = node.principals.token("treasury-workflow")
    async with stdio_session(node, tmp_path, token) as session:
        before = len(node.provider.received)
        held = await session.call_tool(
            "create_payout",
            {"target": "payout:b-9", "parameters": {"amountMinor": 20000, "currency": "USD"}},
        )
        escalation = held.structured_content["escalation"]
        assert escalation["mode"] == "APPROVAL"
        assert escalation["approval_url"] in _text(held)
        assert RESUME_TOOL in _text(held), "the model is told how to resume"

        pending = await session.call_tool(RESUME_TOOL, {"escalation": escalation})
        assert pending.is_error is False
        assert _text(pending).startswith("ESCALATE: held")
        assert "APPROVAL_PENDING" in pending.structured_content["reason_codes"]
        assert len(node.provider.received) == before

        async with (
            aiohttp.ClientSession() as client,
            client.post(
                f"{node.url}/v1/approvals/{escalation['request_id']}",
                json={"decision": "APPROVE", "reason": "within the quarter's budget"},
                headers={"authorization": f"Bearer {node.principals.token('treasury-lead')}"},
            ) as r,
        ):
            assert r.status == 200, await r.text()

        done = await session.call_tool(RESUME_TOOL, {"escalation": escalation})
        assert done.is_error is False
        assert _text(done).startswith("ALLOW: executed once"), _text(done)
        again = await session.call_tool(RESUME_TOOL, {"escalation": escalation})
        assert again.structured_content["result"] == done.structured_content["result"]
        assert len(node.provider.received) == before + 1, "executed once, never twice"

        broken = await session.call_tool(RESUME_TOOL, {"escalation": "not an object"})
        assert broken.is_error is True
        assert "REQUEST_INVALID" in _text(broken)


async def test_stdio_tools_are_proposals_through_the_lifecycle(node: Node, tmp_path: Path) -> None:
    token = node.principals.token("treasury-workflow")
    async with stdio_session(node, tmp_path, token) as session:
        await _exercise(session, node)


async def test_unknown_tools_are_answered_by_the_bridge_and_never_lock_the_principal(
    node: Node, tmp_path: Path
) -> None:
    """Issue 30, item 15: before, each call of a tool outside the catalog was a proposal the
    door refused and counted, and about ten of them locked the principal (the next valid call
    got 423 PRINCIPAL_LOCKED). Now the bridge answers -32602 (the MCP specification's error
    for an unknown tool), without the name, and the executor never sees the call."""
    token = node.principals.token("treasury-workflow")
    async with stdio_session(node, tmp_path, token) as session:
        for n in range(15):
            name = ("not_for_this_agent", "delete_everything", f"guess_{n}")[n % 3]
            with pytest.raises(MCPError) as unknown:
                await session.call_tool(name, {"target": "t", "parameters": {"note": "x"}})
            assert unknown.value.code == INVALID_PARAMS == -32602
            assert name not in unknown.value.message
        paid = await session.call_tool(
            "create_payout",
            {"target": "payout:b-1", "parameters": {"amountMinor": 1200, "currency": "USD"}},
        )
        assert paid.is_error is False, _text(paid)
        assert _text(paid).startswith("ALLOW: executed once")
    assert len(node.provider.received) == 1
    security = node.executor.streams.security
    assert isinstance(security, MemorySink)
    assert security.named("AUTH_FAILED") == [], "no refusal was spent at the door"
    assert security.named("PRINCIPAL_LOCKED") == []


async def test_stdio_with_a_stolen_looking_token_is_refused_by_the_door(
    node: Node, tmp_path: Path
) -> None:
    async with stdio_session(node, tmp_path, "not-a-principal") as session:
        called = await session.call_tool(
            "create_payout",
            {"target": "payout:b-1", "parameters": {"amountMinor": 1200, "currency": "USD"}},
        )
        assert called.is_error is True
        assert "AUTH_FAILED" in _text(called)
    assert len(node.provider.received) == 0


class _PortTaken(Exception):
    """The port ``free_port`` chose was taken by another process before the bridge bound it."""


async def _start_http_bridge(node: Node, tmp_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``agentsafe mcp --transport http`` in front of ``node``, once it answers an anonymous
    POST with 401; its output goes to ``tmp_path / "mcp-http.log"``."""
    port = free_port()
    with (tmp_path / "mcp-http.log").open("w") as log:
        process = subprocess.Popen(
            [AGENTSAFE, "mcp", "--transport", "http", "--port", str(port), "--url", node.url],
            env=_clean_env(),
            cwd=tmp_path,
            stdout=log,
            stderr=log,
        )
    url = f"http://127.0.0.1:{port}/mcp"

    async def up() -> bool:
        if process.poll() is not None:
            printed = (tmp_path / "mcp-http.log").read_text()
            if "address already in use" in printed:
                raise _PortTaken
            raise RuntimeError(printed)
        try:
            async with httpx2.AsyncClient() as anonymous:
                response = await anonymous.post(url, json={})
        except httpx2.TransportError:
            return False
        return response.status_code == 401

    try:
        await wait_until(up, timeout=60, what="agentsafe mcp over HTTP")
    except BaseException:
        if process.poll() is None:
            process.terminate()
            process.wait(timeout=30)
        raise
    return process, url


@contextlib.asynccontextmanager
async def http_bridge(node: Node, tmp_path: Path) -> AsyncIterator[str]:
    """The MCP URL of a running HTTP bridge (:func:`_start_http_bridge`), stopped on exit.

    Another process may take the chosen port between ``free_port`` and the bridge's bind (seen
    under a full CI run): the port is chosen again, a bounded number of times."""
    for _ in range(5):
        try:
            process, url = await _start_http_bridge(node, tmp_path)
            break
        except _PortTaken:
            continue
    else:
        raise AssertionError("no free port held long enough for the bridge to bind it")
    try:
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


async def test_streamable_http_passes_each_callers_bearer_to_the_door(
    node: Node, tmp_path: Path
) -> None:
    async with http_bridge(node, tmp_path) as url:
        async with httpx2.AsyncClient() as anonymous:
            refused = await anonymous.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "x"})
            assert refused.status_code == 401
            assert refused.json()["error"]["code"] == "AUTH_FAILED"
            assert refused.headers["www-authenticate"] == 'Bearer realm="agentsafe"'

        token = node.principals.token("treasury-workflow")
        async with (
            httpx2.AsyncClient(headers={"authorization": f"Bearer {token}"}) as http,
            streamable_http_client(url, http_client=http) as streams,
            ClientSession(streams[0], streams[1]) as session,
        ):
            await session.initialize()
            await _exercise(session, node)
        # A wrong bearer: tests/tools/test_mcp_conventions.py (401 before initialize).
    # What it printed is JSON lines, as every agentsafe process writes (issue 31, item 9).
    lines = [json.loads(line) for line in (tmp_path / "mcp-http.log").read_text().splitlines()]
    listening = [line for line in lines if line["event"] == "MCP_LISTENING"]
    assert len(listening) == 1
    assert listening[0]["url"] == url
    assert listening[0]["executor"] == node.url
    assert listening[0]["schema"] == "agent-safe.log/1"


def test_a_refusal_to_start_is_one_json_line_on_stderr(tmp_path: Path) -> None:
    env = {k: v for k, v in _clean_env().items() if k != "AGENTSAFE_EXECUTOR_URL"}
    done = subprocess.run(
        [AGENTSAFE, "mcp", "--transport", "http", "--port", str(free_port())],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    [line] = [json.loads(text) for text in done.stderr.splitlines()]
    assert line["event"] == "REFUSED_TO_START"
    assert line["level"] == "ERROR"
    assert "--url" in line["message"]
