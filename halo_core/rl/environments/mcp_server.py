"""The ``mcp`` environment's bundled server: a tiny MCP server over stdio (the ``mcp`` SDK's ``MCPServer``, FastMCP's
name since SDK 2), the default when ``environment_kwargs`` names no ``server``.
``python -m halo_core.rl.environments.mcp_server``.

Two tools: ``add`` (the embedded arithmetic prompts' sums) and ``lookup`` (a fixed key-value table), enough to show
discovery, arguments of two types, a result and a tool error.
"""

from __future__ import annotations

from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

server = MCPServer("halo-tiny", log_level="WARNING")  # INFO logs a line on stderr per failed call

TABLE = {"capital of France": "Paris", "boiling point of water": "100 C", "answer": "42"}


@server.tool()
def add(a: Annotated[int, Field(description="The first number.")], b: Annotated[int, Field(description="The second number.")]) -> int:
    """Add two whole numbers."""
    return a + b


@server.tool()
def lookup(key: Annotated[str, Field(description="What to look up, e.g. 'capital of France'.")]) -> str:
    """Look a fact up in a small table."""
    if key not in TABLE:
        raise ToolError(f"no entry for {key!r}; keys: {sorted(TABLE)}")
    return TABLE[key]


if __name__ == "__main__":
    server.run("stdio")
