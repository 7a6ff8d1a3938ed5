"""mailroom's own MCP server."""
