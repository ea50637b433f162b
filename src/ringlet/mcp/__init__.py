"""MCP: client toolsets for an agent's MCP servers (`client`), their settings (`config`: mcp.json), and
ringlet's own memory MCP server."""
