"""MCP: client toolsets for an agent's MCP servers (`client`; each server's session in `session`, its traffic
in `wire`), their settings (`config`: mcp.json), and ringlet's own memory MCP server."""
