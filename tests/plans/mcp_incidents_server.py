"""A tiny MCP server over stdio for the adapter tests (mcp 2.x ``MCPServer``): a read-only
``list_incidents`` tool, an unannotated ``delete_incident`` tool and a failing read tool."""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

server = MCPServer("incidents")
READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False)
INCIDENTS = [
    {"OBJECTID": 1, "status": "open"},
    {"OBJECTID": 2, "status": "closed"},
    {"OBJECTID": 3, "status": "open"},
]


@server.tool(annotations=READ_ONLY, structured_output=True)
def list_incidents(status: str, limit: int = 50) -> dict[str, Any]:
    rows = [row for row in INCIDENTS if row["status"] == status][:limit]
    return {"rows": rows}


@server.tool()
def delete_incident(objectid: int) -> str:
    return "deleted"


@server.tool(annotations=READ_ONLY)
def broken_read(status: str) -> str:
    raise RuntimeError("backend detail that must not leak")


if __name__ == "__main__":
    server.run("stdio")
