"""MCP semantics of ``agentsafe mcp`` (issue 31, item 14), with the official MCP SDK client.

A real ``agentsafe mcp`` process (stdio, and streamable HTTP) in front of a real executor (the
``node`` fixture of ``test_mcp_bridge.py``: assembled in process, listening on loopback):

* over HTTP, a bearer the executor's door refuses is refused as the MCP HTTP transport's
  authorization says, 401 with ``WWW-Authenticate: Bearer ... error="invalid_token"``, before
  ``initialize`` can succeed (it was 200, then a JSON-RPC error with ``"code": 0``);
* parameters outside a tool's input schema are a tool execution error (``isError: true``) that
  names each failing field by JSON pointer and keyword, never its value, so a model can correct
  its own call (it was ``isError: false``, "BLOCK ... PARAMETERS_INVALID", no field named).
"""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.tools.test_mcp_bridge import (  # noqa: F401 - node is a fixture
    AGENTSAFE,
    Node,
    _clean_env,
    _text,
    http_bridge,
    node,
    stdio_session,
)

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "conventions-test", "version": "1"},
    },
}
MCP_HEADERS = {"accept": "application/json, text/event-stream"}


async def test_a_wrong_bearer_over_http_is_401_before_initialize_succeeds(
    node: Node,  # noqa: F811
    tmp_path: Path,
) -> None:
    async with http_bridge(node, tmp_path) as url:
        async with httpx2.AsyncClient(headers=MCP_HEADERS) as raw:
            refused = await raw.post(
                url, json=INITIALIZE, headers={"authorization": "Bearer not-a-principal"}
            )
            assert refused.status_code == 401
            assert refused.headers["www-authenticate"] == (
                'Bearer realm="agentsafe", error="invalid_token"'
            )
            assert refused.json()["error"]["code"] == "AUTH_FAILED"
            assert "not-a-principal" not in refused.text
            missing = await raw.post(url, json=INITIALIZE)
            assert missing.headers["www-authenticate"] == 'Bearer realm="agentsafe"'

        # The SDK client cannot initialize with it either (it reports the 401 as an MCPError).
        with pytest.raises(BaseExceptionGroup) as caught:
            async with (
                httpx2.AsyncClient(headers={"authorization": "Bearer not-a-principal"}) as http,
                streamable_http_client(url, http_client=http) as streams,
                ClientSession(streams[0], streams[1]) as session,
            ):
                await session.initialize()
        assert caught.group_contains(MCPError, depth=None) or caught.group_contains(
            httpx2.HTTPStatusError, depth=None
        ), caught.value

        token = node.principals.token("treasury-workflow")
        async with (
            httpx2.AsyncClient(headers={"authorization": f"Bearer {token}"}) as http,
            streamable_http_client(url, http_client=http) as streams,
            ClientSession(streams[0], streams[1]) as session,
        ):
            await session.initialize()
            listed = await session.list_tools()
            assert "add_note" in {tool.name for tool in listed.tools}
    assert node.provider.received == []


async def test_parameters_outside_the_schema_are_an_error_naming_each_field_never_its_value(
    node: Node,  # noqa: F811
    tmp_path: Path,
) -> None:
    token = node.principals.token("treasury-workflow")
    async with stdio_session(node, tmp_path, token) as session:
        called = await session.call_tool(
            "create_payout",
            {
                "target": "payout:b-1",
                "parameters": {"amountMinor": "sekrit-amount", "memo": "sekrit-extra"},
            },
        )
        assert called.is_error is True, "the model's own mistake, which it can correct"
        text = _text(called)
        assert text.startswith("PARAMETERS_INVALID")
        for named in ("/parameters/amountMinor", "/parameters/currency", "/parameters/memo"):
            assert named in text, text
        assert "sekrit" not in text
        structured = called.structured_content
        assert structured is not None
        assert structured["invalid_parameters"] == [
            {"pointer": "/parameters/amountMinor", "keyword": "type"},
            {"pointer": "/parameters/currency", "keyword": "required"},
            {"pointer": "/parameters/memo", "keyword": "additionalProperties"},
        ]
        assert structured["verdict"] == "BLOCK"
        assert "PARAMETERS_INVALID" in structured["reason_codes"]
        assert "sekrit" not in repr(structured["invalid_parameters"])
        # A correct call afterwards runs once.
        fixed = await session.call_tool(
            "create_payout",
            {"target": "payout:b-1", "parameters": {"amountMinor": 1200, "currency": "USD"}},
        )
        assert fixed.is_error is False
        assert _text(fixed).startswith("ALLOW: executed once")
    assert len(node.provider.received) == 1
