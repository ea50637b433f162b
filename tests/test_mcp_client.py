"""MCP servers as toolsets (issue #7): the reference `server-everything` (npm) over stdio, SSE and streamable
HTTP, and `mcp-server-time` (PyPI) in a real agent run; failures, timeouts, restarts, filters, shutdown."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from helpers import of_type
from ringlet import Agent
from ringlet.agent.config import build_agent, find
from ringlet.context import RunContext
from ringlet.errors import ConfigError, ToolFailure
from ringlet.mcp.client import MCPToolset
from ringlet.mcp.config import MCPServerConfig, load_servers
from ringlet.testing import ScriptedModel, call

ROOT = Path(__file__).parent.parent
EVERYTHING = ROOT / ".venv" / "node" / "node_modules" / ".bin" / "mcp-server-everything"
TIME_SERVER = Path(sys.executable).parent / "mcp-server-time"
CTX = RunContext(run_id="r_mcp", agent="a")


@pytest.fixture(scope="module", autouse=True)
def _servers_installed() -> None:
    assert EVERYTHING.exists(), f"{EVERYTHING} is missing: `make test` installs it (npm) before the tests run"
    assert TIME_SERVER.exists(), "mcp-server-time is missing: it is in the dev dependencies"


def children() -> set[int]:
    """Processes whose parent is this test process."""
    out = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == os.getpid():
                out.add(int(entry.name))
    return out


async def tools_of(toolset: MCPToolset) -> dict[str, object]:
    return {t.name: t for t in await toolset.list_tools(CTX)}


async def run_tool(toolset: MCPToolset, name: str, **args: object) -> object:
    tool = (await tools_of(toolset))[name]
    return await tool.run(tool.validate(dict(args)), CTX)  # type: ignore[attr-defined]


async def test_stdio_tools_calls_errors_and_clean_shutdown() -> None:
    before = children()
    everything = MCPToolset("everything", MCPServerConfig(command=str(EVERYTHING), args=["stdio"]))
    tools = await tools_of(everything)
    assert {"echo", "get-sum", "trigger-long-running-operation"} <= set(tools)
    assert tools["echo"].effect == "read"  # type: ignore[attr-defined]  # from readOnlyHint
    assert tools["gzip-file-as-resource"].effect == "write"  # type: ignore[attr-defined]
    assert await run_tool(everything, "echo", message="hello") == "Echo: hello"
    assert "5" in str(await run_tool(everything, "get-sum", a=2, b=3))
    with pytest.raises(Exception, match="b"):  # the tool's own JSON schema is checked before the server
        await run_tool(everything, "get-sum", a=2)
    spawned = children() - before
    assert spawned
    await everything.aclose()
    assert not (children() & spawned)  # no orphaned server process


async def test_a_killed_server_is_started_again_by_the_next_call() -> None:
    before = children()
    everything = MCPToolset("everything", MCPServerConfig(command=str(EVERYTHING), args=["stdio"]))
    assert await run_tool(everything, "echo", message="one") == "Echo: one"
    first = everything.session.task
    for pid in children() - before:
        os.kill(pid, signal.SIGKILL)
    assert await run_tool(everything, "echo", message="two") == "Echo: two"  # a new server answers
    assert everything.session.task is not first
    await everything.aclose()


async def test_a_server_gone_when_its_changed_tools_are_listed_is_started_again() -> None:
    before = children()
    everything = MCPToolset("everything", MCPServerConfig(command=str(EVERYTHING), args=["stdio"]))
    assert "echo" in await tools_of(everything)
    first = everything.session.task
    for pid in children() - before:
        os.kill(pid, signal.SIGKILL)
    everything.session.stale = True  # as after notifications/tools/list_changed: the next list asks the (dead) server
    assert "echo" in await tools_of(everything)  # not the internal disconnection signal: a new server lists
    assert everything.session.task is not first
    await everything.aclose()


async def test_a_long_call_times_out_in_an_agent_run_and_the_run_goes_on() -> None:
    slow = MCPToolset("slow", MCPServerConfig(command=str(EVERYTHING), args=["stdio"], timeout_s=1,
                                              tools=["trigger-long-running-operation"]))
    model = ScriptedModel([call("trigger-long-running-operation", duration=5, steps=5), "gave up"])
    async with Agent(model, tools=[slow]) as agent:
        stream = agent.stream("run it")
        events = [e async for e in stream]
    [result] = of_type(events, "tool_result")
    assert result.error["code"] == "tool_timeout"
    assert stream.result is not None
    assert stream.result.output == "gave up"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def http_everything(mode: str) -> AsyncIterator[int]:
    port = free_port()
    process = await asyncio.create_subprocess_exec(str(EVERYTHING), mode, env={**os.environ, "PORT": str(port)},
                                                   stderr=asyncio.subprocess.PIPE)
    assert process.stderr is not None
    async with asyncio.timeout(30):
        while str(port).encode() not in (line := await process.stderr.readline()):
            assert line, "server-everything exited before it listened"
    try:
        yield port
    finally:
        process.kill()
        await process.wait()


@pytest.mark.parametrize(("mode", "path", "transport"), [("streamableHttp", "/mcp", None), ("sse", "/sse", "sse")])
async def test_http_transports(mode: str, path: str, transport: str | None) -> None:
    async for port in http_everything(mode):
        remote = MCPToolset("remote", MCPServerConfig(url=f"http://127.0.0.1:{port}{path}", transport=transport,
                                                      prefix="ev_", exclude_tools=["get-env"]))
        tools = await tools_of(remote)
        assert "ev_echo" in tools
        assert "ev_get-env" not in tools
        assert await run_tool(remote, "ev_echo", message="over http") == "Echo: over http"
        await remote.aclose()


async def test_a_pypi_server_inside_an_agent_run(tmp_path: Path) -> None:
    agent_dir = tmp_path / "clock"
    agent_dir.mkdir()
    (agent_dir / "config.yaml").write_text(
        "mcp_servers:\n  mcpServers:\n    time:\n"
        f"      command: {TIME_SERVER}\n      prefix: time_\n      tools: [get_current_time]\n")
    model = ScriptedModel([call("time_get_current_time", timezone="Asia/Tokyo"), "It is evening in Tokyo."])
    agent = build_agent(find(str(agent_dir)), model=model)
    async with agent:
        stream = agent.stream("What time is it in Tokyo?")
        events = [e async for e in stream]
    [result] = of_type(events, "tool_result")
    assert result.is_error is False, result.error
    assert json.loads(result.result)["timezone"] == "Asia/Tokyo"
    assert stream.result is not None
    assert stream.result.output == "It is evening in Tokyo."


async def test_a_server_that_cannot_start_is_reported_once_or_fails_the_run_when_required() -> None:
    broken = MCPServerConfig(command=sys.executable, args=["-c", "import sys; print('no licence', file=sys.stderr);"
                                                                 " sys.exit(3)"])
    model = ScriptedModel(["fine without it", "again"])
    agent = Agent(model, tools=[MCPToolset("broken", broken)])
    first = [e async for e in agent.stream("hi")]
    second = [e async for e in agent.stream("hi")]
    [warning] = of_type(first, "notification")
    assert warning.title == "MCP server broken unavailable"
    assert "no licence" in warning.message  # the stderr tail
    assert of_type(second, "notification") == []  # reported once
    required = Agent(ScriptedModel([]), tools=[MCPToolset("broken", broken.model_copy(update={"required": True}))])
    result = await required.run("hi")
    assert result.error is not None
    assert result.error["code"] == "mcp_server_unavailable"


async def test_server_side_errors_come_back_as_error_results() -> None:
    clock = MCPToolset("time", MCPServerConfig(command=str(TIME_SERVER)))
    with pytest.raises(ToolFailure, match="Invalid timezone") as info:
        await run_tool(clock, "get_current_time", timezone="Mars/Olympus")
    assert info.value.code == "tool_error"
    await clock.aclose()


def test_mcp_servers_config_forms(tmp_path: Path) -> None:
    (tmp_path / "mcp.json").write_text(json.dumps({"mcpServers": {"a": {"command": "x", "args": ["y"]},
                                                                    "b": {"url": "http://127.0.0.1:1/mcp"}}}))
    servers = load_servers("mcp.json", base=tmp_path)
    assert (servers["a"].kind, servers["b"].kind) == ("stdio", "http")
    assert load_servers({"c": {"command": "z"}}, base=tmp_path)["c"].command == "z"
    described = MCPToolset("c", MCPServerConfig(command="z", description="The clock"))
    assert described.description == "The clock"  # list_connectors shows it
    with pytest.raises(ConfigError, match=r"mcpServers\.d: .*either `command`"):
        load_servers({"mcpServers": {"d": {"command": "x", "url": "http://h"}}}, base=tmp_path)
    with pytest.raises(ConfigError, match=r"mcp\.json"):
        load_servers("missing/mcp.json", base=tmp_path)


def test_mcp_list_shows_each_servers_status_and_tools(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from ringlet.cli import app

    agent_dir = tmp_path / "ops"
    agent_dir.mkdir()
    (agent_dir / "mcp.json").write_text(json.dumps({"mcpServers": {
        "time": {"command": str(TIME_SERVER)},
        "gone": {"command": sys.executable, "args": ["-c", "raise SystemExit(2)"]}}}))
    (agent_dir / "config.yaml").write_text("mcp_servers: mcp.json\n")
    result = CliRunner().invoke(app, ["mcp", "list", str(agent_dir)])
    assert result.exit_code == 0, result.output
    assert "get_current_time (read)" in result.stdout
    assert "unavailable" in result.stdout


def test_the_common_mcp_json_shapes_are_read_as_they_are(tmp_path: Path) -> None:
    """Loki's, Claude Code's and VS Code's entries carry `type`; Loki's env values may be booleans or numbers."""
    (tmp_path / "mcp.json").write_text(json.dumps({"mcpServers": {
        "github": {"type": "http", "url": "https://api.example/mcp", "headers": {"Authorization": "Bearer t"}},
        "ddg-search": {"type": "stdio", "command": "uvx", "args": ["duckduckgo-mcp-server"], "cwd": "/tmp",
                       "env": {"DEBUG": True, "PORT": 8080, "NAME": "x"}},
        "legacy": {"type": "sse", "url": "http://127.0.0.1:1/sse"},
        "login": {"type": "http", "url": "https://api.example/mcp", "oauth": {"clientId": "ringlet"}}}}))
    servers = load_servers("mcp.json", base=tmp_path)
    assert {n: s.kind for n, s in servers.items()} == {"github": "http", "ddg-search": "stdio", "legacy": "sse",
                                                        "login": "http"}
    assert servers["ddg-search"].env == {"DEBUG": "true", "PORT": "8080", "NAME": "x"}
    assert servers["github"].headers == {"Authorization": "Bearer t"}
    for entry, problem in [({"type": "stdio", "url": "http://h"}, r'type "stdio" needs a `command`'),
                           ({"type": "http", "command": "x"}, r'type "http" needs a `url`'),
                           ({"type": "sse", "url": "http://h", "transport": "http"}, "disagree")]:
        with pytest.raises(ConfigError, match=problem):
            load_servers({"mcpServers": {"x": entry}}, base=tmp_path)


def test_a_bad_mcp_json_says_what_is_wrong_and_where(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text('{\n  "mcpServers": {\n    "a": {"command": "x"},\n    "b": {\n      "url": "http://h",\n'
                    '      "header": {}\n    }\n  }\n}\n')
    with pytest.raises(ConfigError) as info:
        load_servers("mcp.json", base=tmp_path)
    assert str(info.value).startswith(f"{path}:6:7: mcpServers.b.header: unknown key; did you mean 'headers'?")
    path.write_text('{\n  "mcpServers": {\n    "a": {"command": "x" "args": []}\n  }\n}\n')
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}:3:26: not JSON: Expecting ',' delimiter$"):
        load_servers("mcp.json", base=tmp_path)
