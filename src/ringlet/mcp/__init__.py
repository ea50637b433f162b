"""MCP: client toolsets for an agent's MCP servers, and ringlet's own memory MCP server."""
