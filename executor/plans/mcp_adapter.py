"""Read-only MCP tool adapter: one named tool of an MCP server as a ``read`` step executor.

:func:`create_read_only_mcp_executor` binds exactly one tool, by exact name (patterns and
wildcards refused), of an MCP server reached through an initialised ``mcp`` SDK
``ClientSession``. It adds no approval model of its own: the returned executor plugs into
:func:`~agentsafe.executor.plans.execute_agent_plan_step`, which authorizes, consumes and audits.
The tool must exist and be annotated ``readOnlyHint: true`` and not destructive (a server hint,
checked so a mutating tool is not bound by mistake). The step's frozen parameters are the tool's
arguments (a JSON object). The host's ``count_rows(result)`` is required; a result it cannot
count (``None``, a bool, a negative or non-int) is refused (``MCP_RESULT_UNCOUNTED``), never
turned into a zero-row receipt. A tool error is ``MCP_TOOL_ERROR`` (no server text is kept).

The value handed back is the tool's ``structuredContent`` when present, else the list of its
text blocks.

Callers: hosts binding MCP read tools, through the package's public API.
Also imported by ``dispatch/registration.py``, ``__init__.py``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Protocol

from ..codes import Code
from .errors import AgentSafetyError
from .execute import StepRequest, StepResult
from .policy import IDENTIFIER_PATTERN
from .snapshot import thaw

__all__ = ["McpReadExecutor", "McpSession", "create_read_only_mcp_executor"]

_TOOL_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")


class McpSession(Protocol):
    """The part of ``mcp.ClientSession`` the adapter uses."""

    async def list_tools(self) -> Any: ...

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        read_timeout_seconds: float | None = None,
    ) -> Any: ...


class McpReadExecutor:
    """A :class:`~agentsafe.executor.plans.StepExecutor` for one MCP read tool."""

    effect = "read"

    def __init__(
        self,
        session: McpSession,
        *,
        tool_name: str,
        tool: str,
        count_rows: Callable[[Any], object],
        timeout_s: float,
    ) -> None:
        self._session = session
        self._tool_name = tool_name
        self.tool = tool
        self._count_rows = count_rows
        self._timeout_s = timeout_s

    async def execute(self, request: StepRequest) -> StepResult:
        arguments = thaw(request.parameters)
        if type(arguments) is not dict:
            raise AgentSafetyError(
                "MCP tool arguments must be an object", code=Code.MCP_ARGUMENTS_INVALID
            )
        result = await self._session.call_tool(
            self._tool_name, arguments, read_timeout_seconds=self._timeout_s
        )
        if getattr(result, "is_error", True) is not False:
            raise AgentSafetyError("the MCP tool reported an error", code=Code.MCP_TOOL_ERROR)
        structured = getattr(result, "structured_content", None)
        if structured is not None:
            value = structured
        else:
            value = [
                block.text
                for block in getattr(result, "content", [])
                if getattr(block, "type", None) == "text"
            ]
        try:
            rows = self._count_rows(value)
        except Exception:
            raise AgentSafetyError("count_rows failed", code=Code.MCP_RESULT_UNCOUNTED) from None
        if type(rows) is not int or rows < 0:
            raise AgentSafetyError("the result was not counted", code=Code.MCP_RESULT_UNCOUNTED)
        return StepResult(value=value, rows=rows)


async def create_read_only_mcp_executor(
    session: McpSession,
    *,
    tool_name: str,
    count_rows: Callable[[Any], object],
    tool: str | None = None,
    timeout_s: float = 30.0,
) -> McpReadExecutor:
    """Bind ``tool_name`` of the session's server as a ``read`` executor for plan tool ``tool``
    (default: the same name). Raises ``MCP_TOOL_NAME_INVALID``, ``MCP_COUNT_ROWS_REQUIRED``,
    ``MCP_TOOL_UNKNOWN`` or ``MCP_TOOL_NOT_READ_ONLY``."""
    if type(tool_name) is not str or not _TOOL_NAME.match(tool_name):
        raise AgentSafetyError(
            "the MCP tool name must be an exact identifier", code=Code.MCP_TOOL_NAME_INVALID
        )
    step_tool = tool_name if tool is None else tool
    if type(step_tool) is not str or not re.fullmatch(IDENTIFIER_PATTERN, step_tool):
        raise AgentSafetyError(
            "the plan tool name must be an identifier", code=Code.MCP_TOOL_NAME_INVALID
        )
    if not callable(count_rows):
        raise AgentSafetyError("count_rows is required", code=Code.MCP_COUNT_ROWS_REQUIRED)
    if type(timeout_s) not in (int, float) or not 0 < timeout_s <= 600:
        raise AgentSafetyError("timeout_s must be in (0, 600]", code=Code.MCP_TIMEOUT_INVALID)
    listed = await session.list_tools()
    matches = [t for t in getattr(listed, "tools", []) if getattr(t, "name", None) == tool_name]
    if len(matches) != 1:
        raise AgentSafetyError("the MCP server has no such tool", code=Code.MCP_TOOL_UNKNOWN)
    annotations = getattr(matches[0], "annotations", None)
    if (
        annotations is None
        or getattr(annotations, "read_only_hint", None) is not True
        or getattr(annotations, "destructive_hint", None) is True
    ):
        raise AgentSafetyError(
            "the MCP tool is not declared read-only", code=Code.MCP_TOOL_NOT_READ_ONLY
        )
    return McpReadExecutor(
        session,
        tool_name=tool_name,
        tool=step_tool,
        count_rows=count_rows,
        timeout_s=float(timeout_s),
    )
