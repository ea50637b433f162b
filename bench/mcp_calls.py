"""The cost of an MCP tool call over stdio (issue #7): median time of `echo` on the reference
`server-everything`, through ringlet's `MCPToolset` (the session task, the SDK, the pipe and the server),
beside the SDK's own `ClientSession.call_tool` on the same server, measured in the same run.

Run: `.venv/bin/python bench/mcp_calls.py [--calls 300]` (after `make test` has installed the server).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

from ringlet.context import RunContext
from ringlet.mcp.client import MCPServerConfig, MCPToolset

SERVER = Path(__file__).parent.parent / ".venv" / "node" / "node_modules" / ".bin" / "mcp-server-everything"


async def through_ringlet(calls: int) -> list[float]:
    toolset = MCPToolset("everything", MCPServerConfig(command=str(SERVER), args=["stdio"]))
    ctx = RunContext(run_id="r_bench", agent="bench")
    echo = next(t for t in await toolset.list_tools(ctx) if t.name == "echo")
    times = []
    for i in range(calls):
        started = time.perf_counter()
        await echo.run(echo.validate({"message": f"m{i}"}), ctx)
        times.append(time.perf_counter() - started)
    await toolset.aclose()
    return times


async def through_the_sdk(calls: int) -> list[float]:
    from mcp import ClientSession, StdioServerParameters, stdio_client

    times = []
    async with stdio_client(StdioServerParameters(command=str(SERVER), args=["stdio"])) as (read, write), \
            ClientSession(read, write) as session:
        await session.initialize()
        for i in range(calls):
            started = time.perf_counter()
            await session.call_tool("echo", {"message": f"m{i}"})
            times.append(time.perf_counter() - started)
    return times


async def main(calls: int) -> None:
    ours, sdk = await through_ringlet(calls), await through_the_sdk(calls)
    print(f"MCP `echo` over stdio on server-everything; median of {calls} calls")
    print(f"  through ringlet's MCPToolset   {statistics.median(ours) * 1000:7.3f} ms")
    print(f"  the SDK's ClientSession alone  {statistics.median(sdk) * 1000:7.3f} ms")
    print(f"  ringlet's overhead             {(statistics.median(ours) - statistics.median(sdk)) * 1000:7.3f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    asyncio.run(main(parser.parse_args().calls))
