"""A small MCP server for the tests (run as a process: python -m tests.mgrpo.mcp_server PORT):
`shout` upper-cases its text, `fail` always reports a tool error."""

from __future__ import annotations

import sys

from mcp.server.mcpserver import MCPServer

app = MCPServer("mgrpo-test-tools")


@app.tool()
def shout(text: str) -> str:
    """Upper-case the text."""
    return text.upper()


@app.tool()
def fail(text: str) -> str:
    """Always fails."""
    raise ValueError(f"cannot handle {text!r}")


if __name__ == "__main__":
    app.run(transport="streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
