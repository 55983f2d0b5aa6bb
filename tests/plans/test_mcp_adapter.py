"""The read-only MCP adapter against a real MCP server started over stdio."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from agentsafe.executor.canonical import sha256_digest
from agentsafe.executor.plans import (
    AgentExecutionError,
    AgentSafetyError,
    dry_run_agent_plan,
    issue_agent_approval,
    thaw,
    verify_agent_execution_receipt,
)
from agentsafe.executor.plans.mcp_adapter import create_read_only_mcp_executor

from . import support as s
from .conftest import World

SERVER = Path(__file__).parent / "mcp_incidents_server.py"


@contextlib.asynccontextmanager
async def mcp_session(tmp_path: Path) -> AsyncIterator[ClientSession]:
    """A real server subprocess over stdio (opened inside each test: anyio's task groups must
    be entered and left in one task, which a pytest fixture's teardown does not guarantee)."""
    params = StdioServerParameters(command=sys.executable, args=[str(SERVER)], cwd=str(tmp_path))
    with (tmp_path / "server.log").open("w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as client,
        ):
            await client.initialize()
            yield client


def _rows(result: Any) -> int:
    return len(result["rows"])


async def _mcp_world(world: World, tool: str, params: dict[str, Any]) -> World:
    world.policy = s.policy(allowedTools=[tool])
    step = s.step(tool=tool, parameters=params)
    world.plan = s.plan(step)
    world.dry_run = dry_run_agent_plan(world.plan, world.policy, now=s.NOW)
    world.approval = await issue_agent_approval(
        world.dry_run, world.policy, s.request(), world.approver, now=s.NOW, max_clock_skew_ms=0
    )
    return world


@pytest.mark.slow
async def test_bound_read_tool_executes_once_with_receipt(tmp_path: Path, world: World) -> None:
    async with mcp_session(tmp_path) as session:
        params = {"status": "open", "limit": 10}
        await _mcp_world(world, "list_incidents", params)
        executor = await create_read_only_mcp_executor(
            session, tool_name="list_incidents", count_rows=_rows
        )
        op = s.operation(tool="list_incidents", parameters=params)
        result = await world.execute(executor=executor, operation=op)
        assert thaw(result.value) == {
            "rows": [{"OBJECTID": 1, "status": "open"}, {"OBJECTID": 3, "status": "open"}]
        }
        assert result.rows == 2
        verified = await verify_agent_execution_receipt(result.receipt, **world.verify_kwargs())
        assert verified["resultDigest"] == sha256_digest(result.value)
        with pytest.raises(AgentSafetyError) as caught:
            await world.execute(executor=executor, operation=op)
        assert caught.value.code == "APPROVAL_ALREADY_USED"


@pytest.mark.slow
async def test_uncounted_result_is_never_a_zero_row_receipt(tmp_path: Path, world: World) -> None:
    async with mcp_session(tmp_path) as session:
        params = {"status": "open", "limit": 10}
        await _mcp_world(world, "list_incidents", params)
        executor = await create_read_only_mcp_executor(
            session, tool_name="list_incidents", count_rows=lambda result: None
        )
        with pytest.raises(AgentExecutionError) as caught:
            await world.execute(
                executor=executor, operation=s.operation(tool="list_incidents", parameters=params)
            )
        assert caught.value.code == "MCP_RESULT_UNCOUNTED"
        payload = caught.value.receipt["payload"]
        assert (payload["outcome"], payload["rows"]) == ("failed", None)


@pytest.mark.slow
async def test_tool_error_is_a_failed_step(tmp_path: Path, world: World) -> None:
    async with mcp_session(tmp_path) as session:
        params = {"status": "open"}
        await _mcp_world(world, "broken_read", params)
        executor = await create_read_only_mcp_executor(
            session, tool_name="broken_read", count_rows=_rows
        )
        with pytest.raises(AgentExecutionError) as caught:
            await world.execute(
                executor=executor, operation=s.operation(tool="broken_read", parameters=params)
            )
        assert caught.value.code == "MCP_TOOL_ERROR"
        assert "backend detail" not in str(caught.value)


@pytest.mark.slow
async def test_binding_refusals(tmp_path: Path) -> None:
    async with mcp_session(tmp_path) as session:
        for name in (
            "list_*",
            "list_incidents|delete_incident",
            ".*",
            "",
            "a" * 65,
            "list incidents",
        ):
            with pytest.raises(AgentSafetyError) as caught:
                await create_read_only_mcp_executor(session, tool_name=name, count_rows=_rows)
            assert caught.value.code == "MCP_TOOL_NAME_INVALID"
        for plan_tool in ("", "list incidents", "list_incidents\n", "a" * 129):
            with pytest.raises(AgentSafetyError) as caught:
                await create_read_only_mcp_executor(
                    session, tool_name="list_incidents", tool=plan_tool, count_rows=_rows
                )
            assert caught.value.code == "MCP_TOOL_NAME_INVALID"
        with pytest.raises(AgentSafetyError) as caught:
            await create_read_only_mcp_executor(
                session, tool_name="list_incident", count_rows=_rows
            )
        assert caught.value.code == "MCP_TOOL_UNKNOWN"
        with pytest.raises(AgentSafetyError) as caught:
            await create_read_only_mcp_executor(
                session, tool_name="delete_incident", count_rows=_rows
            )
        assert caught.value.code == "MCP_TOOL_NOT_READ_ONLY"
        with pytest.raises(AgentSafetyError) as caught:
            await create_read_only_mcp_executor(
                session, tool_name="list_incidents", count_rows=None
            )  # type: ignore[arg-type]
        assert caught.value.code == "MCP_COUNT_ROWS_REQUIRED"
        executor = await create_read_only_mcp_executor(
            session, tool_name="list_incidents", count_rows=_rows
        )
        assert (executor.tool, executor.effect) == ("list_incidents", "read")
