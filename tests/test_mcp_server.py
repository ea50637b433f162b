"""`ringlet mcp serve` (memory-and-context.md §3, "MCP"): the official MCP client against the server run as a
subprocess, over stdio and streamable HTTP, on a SQLite file shared with ringlet's own Python API."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NoReturn

import httpx
import pytest
from mcp import ClientSession, MCPError, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_types import CallToolResult, TextContent

from ringlet.context import Caller as RunCaller
from ringlet.context import RunContext
from ringlet.errors import ConfigError, ToolFailure
from ringlet.mcp.server import MEMORY_TOOLS, AgentEntry, Caller, ToolServer, key_realm
from ringlet.memory import Memory, memory_toolset
from ringlet.store import Store
from serving import openai_model, serving

# Until `ringlet mcp serve` is registered, the subprocess mounts the command on a Typer app of its own.
SERVE = ("import sys, typer; from ringlet.cli.mcp_serve import serve; app = typer.Typer(); "
         "app.command()(serve); app(sys.argv[1:])")
READY = "ringlet memory MCP server at "


def db_url(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path / 'ringlet.db'}"


@asynccontextmanager
async def over_stdio(tmp_path: Path, *args: str) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(command=sys.executable, args=["-c", SERVE, "--db", db_url(tmp_path), *args])
    with (tmp_path / "stdio-server.log").open("a") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            yield session


@asynccontextmanager
async def http_server(tmp_path: Path, *args: str) -> AsyncIterator[str]:
    """`--transport http` on a free port; yields the endpoint once the server says it listens."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SERVE, "--transport", "http", "--port", "0", "--db", db_url(tmp_path), *args,
        stderr=asyncio.subprocess.PIPE)
    assert process.stderr is not None
    try:
        async with asyncio.timeout(60):
            while READY not in (line := (await process.stderr.readline()).decode()):
                assert line, "the server exited before it listened"
        yield line.split(READY)[1].split()[0]
    finally:
        if process.returncode is None:
            process.terminate()
        rest = (await process.stderr.read()).decode()
        assert await process.wait() in (0, -signal.SIGTERM)
        assert "Traceback" not in rest, rest


@asynccontextmanager
async def over_http(url: str, key: str) -> AsyncIterator[ClientSession]:
    async with (create_mcp_http_client(headers={"Authorization": f"Bearer {key}"}) as client,
                streamable_http_client(url, http_client=client) as (read, write),
                ClientSession(read, write) as session):
        await session.initialize()
        yield session


def payload(result: CallToolResult) -> Any:
    """The one text item of a result, parsed."""
    assert len(result.content) == 1
    item = result.content[0]
    assert isinstance(item, TextContent)
    return json.loads(item.text)


async def ok(session: ClientSession, tool: str, arguments: dict[str, Any]) -> Any:
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, result
    return payload(result)


async def failed(session: ClientSession, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    assert result.is_error, result
    return payload(result)["error"]


async def in_process(tmp_path: Path, tool: str, arguments: dict[str, Any], realm: str) -> Any:
    """The same tool through ringlet's Python API, on the same database."""
    store = await Store.open(db_url(tmp_path))
    try:
        tools = {t.name: t for t in memory_toolset(Memory(store)).static_tools or ()}
        ctx = RunContext(run_id="r_test", agent="test", realm=realm, org_id="default")
        return await tools[tool].run(tools[tool].validate(arguments), ctx)
    finally:
        await store.close()


# -- stdio ---------------------------------------------------------------------------------------------------


async def test_the_six_memory_tools_are_listed_with_their_schemas(tmp_path: Path) -> None:
    expected = {t.name: t for t in memory_toolset(Memory(db_url(tmp_path))).static_tools or ()}
    async with over_stdio(tmp_path) as session:
        listed = (await session.list_tools()).tools
    assert [t.name for t in listed] == list(MEMORY_TOOLS)  # no `remember`
    for tool in listed:
        assert tool.input_schema == expected[tool.name].parameters
        assert tool.description == expected[tool.name].description
    assert listed[0].input_schema["required"] == ["content"]


async def test_every_memory_tool_over_stdio(tmp_path: Path) -> None:
    async with over_stdio(tmp_path, "--realm", "ops") as session:
        made = await ok(session, "store", {"content": "The billing service runs on host db-7.", "type": "Fact",
                                           "tags": ["infra"], "metadata": {"owner": "ana"}})
        assert made["embedded"] is False
        host = await ok(session, "store", {"content": "db-7", "labels": ["Host"], "metadata": {"name": "db-7"}})
        recalled = await ok(session, "recall", {"id": made["id"]})
        assert recalled["count"] == 1
        node = recalled["nodes"][0]
        assert (node["type"], node["tags"], node["properties"]) == ("Fact", ["infra"], {"owner": "ana"})
        assert (await ok(session, "recall", {"tags": ["infra"]}))["nodes"][0]["id"] == made["id"]
        link = await ok(session, "link", {"from": made["id"], "to": host["id"], "relation": "runs_on"})
        assert link == {"edge_id": link["edge_id"], "from": made["id"], "to": host["id"], "relation": "RUNS_ON"}
        found = await ok(session, "discover", {"query": "billing service"})
        assert found["method"] == "keyword"
        assert found["results"][0]["id"] == made["id"]
        assert found["results"][0]["related"] == [{"id": host["id"], "type": "Host", "title": "db-7",
                                                   "relation": "RUNS_ON", "direction": "out"}]
        first = await ok(session, "task", {"title": "Migrate db-7", "priority": "high"})
        second = await ok(session, "task", {"title": "Retire db-7", "depends_on": [first["task"]["id"]]})
        assert second["next_action"] == "1 dependency still open"
        advanced = await ok(session, "task", {"id": first["task"]["id"]})
        assert advanced["task"]["status"] == "active"
        listed = await ok(session, "tasks", {"unblocked_only": True})
        assert [t["id"] for t in listed["tasks"]] == [first["task"]["id"]]
        assert listed["stats"] == {"total": 2, "by_status": {"active": 1, "pending": 1},
                                   "by_priority": {"high": 1, "medium": 1}}
    # the same store: ringlet's Python API sees it in the same realm, and only there
    seen = await in_process(tmp_path, "recall", {"id": made["id"]}, realm="ops")
    assert seen["nodes"][0]["content"] == "The billing service runs on host db-7."
    with pytest.raises(ToolFailure) as missing:
        await in_process(tmp_path, "recall", {"id": made["id"]}, realm="default")
    assert missing.value.code == "not_found"


async def test_errors_are_error_results(tmp_path: Path) -> None:
    async with over_stdio(tmp_path) as session:
        assert (await failed(session, "recall", {"id": "n_missing"})) == {"code": "not_found",
                                                                         "message": "no node 'n_missing'"}
        bad = await failed(session, "recall", {"limit": 1000})
        assert bad["code"] == "invalid_arguments"
        assert bad["errors"] == ["limit: Input should be less than or equal to 100"]
        assert (await failed(session, "store", {"content": "x", "realm": "other"}))["code"] == "invalid_arguments"
        assert (await failed(session, "link", {"from": "n_a", "to": "n_b", "relation": "x"}))["code"] == "not_found"
        assert (await failed(session, "remember", {"kind": "fact", "text": "x"}))["code"] == "unknown_tool"


@pytest.mark.slow
async def test_realms_are_isolated(tmp_path: Path) -> None:
    async with over_stdio(tmp_path, "--realm", "a") as session:
        node = await ok(session, "store", {"content": "A secret plan about falcons", "tags": ["plan"]})
        task = await ok(session, "task", {"title": "Feed the falcons"})
    async with over_stdio(tmp_path, "--realm", "b") as session:
        assert (await failed(session, "recall", {"id": node["id"]}))["code"] == "not_found"
        assert (await ok(session, "recall", {"tags": ["plan"]}))["count"] == 0
        assert (await ok(session, "discover", {"query": "falcons"}))["total"] == 0
        assert (await ok(session, "tasks", {}))["stats"]["total"] == 0
        assert (await failed(session, "task", {"id": task["task"]["id"]}))["code"] == "not_found"
        mine = await ok(session, "store", {"content": "b's own note"})
        assert (await failed(session, "link", {"from": mine["id"], "to": node["id"], "relation": "x"}))["code"] \
            == "not_found"
    assert (await in_process(tmp_path, "recall", {"id": node["id"]}, realm="a"))["nodes"][0]["tags"] == ["plan"]


# -- streamable HTTP -----------------------------------------------------------------------------------------


def test_key_realm() -> None:
    assert key_realm(["a"], None) == "a"
    assert key_realm(["a"], "a") == "a"
    assert key_realm(["a"], "b") is None
    assert key_realm(["a", "b"], None) is None  # several realms: --realm must name one
    assert key_realm(["a", "b"], "b") == "b"
    assert key_realm(["a", "default"], None) == "default"  # unless one is the default realm
    assert key_realm("*", None) == "default"  # every realm: the default one
    assert key_realm("*", "z") == "z"
    assert key_realm([], None) is None


async def post(url: str, key: str | None) -> httpx.Response:
    headers = {"Accept": "application/json, text/event-stream"} | ({"Authorization": f"Bearer {key}"} if key else {})
    async with httpx.AsyncClient() as client:
        return await client.post(url, headers=headers, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})


@pytest.mark.slow
async def test_http_needs_a_valid_key_and_runs_in_its_realm(tmp_path: Path) -> None:
    store = await Store.open(db_url(tmp_path))
    try:
        key_a, _ = await store.keys.create("a", realms=["a"])
        several, _ = await store.keys.create("ab", realms=["a", "b"])
        every, _ = await store.keys.create("all")
        revoked, record = await store.keys.create("revoked", realms=["a"])
        await store.keys.revoke(record.id)
        expired, _ = await store.keys.create("expired", realms=["a"], expires_in_days=-1)
    finally:
        await store.close()
    async with http_server(tmp_path) as url:
        for key in (None, "rk_unknown", revoked, expired):
            response = await post(url, key)
            assert response.status_code == 401, key
            assert response.headers["www-authenticate"] == "Bearer"
            assert response.json()["error"]["data"]["code"] == "unauthorized"
        response = await post(url, several)  # several realms and no --realm: the server cannot choose
        assert (response.status_code, response.json()["error"]["data"]["code"]) == (403, "realm_forbidden")
        assert "--realm" in response.json()["error"]["message"]
        async with over_http(url, key_a) as session:
            assert [t.name for t in (await session.list_tools()).tools] == list(MEMORY_TOOLS)
            node = await ok(session, "store", {"content": "Stored over HTTP"})
            assert (await ok(session, "recall", {"id": node["id"]}))["count"] == 1
            assert (await failed(session, "recall", {"id": "n_missing"}))["code"] == "not_found"
        async with over_http(url, every) as session:  # a key of every realm, no --realm: the default realm
            await ok(session, "store", {"content": "A default-realm note", "tags": ["everyone"]})
        with pytest.RaisesGroup(pytest.RaisesExc(MCPError, match=r"realm_forbidden: .*--realm"),  # the official
                                flatten_subgroups=True):  # client shows its user why
            async with over_http(url, several):
                pass
    assert (await in_process(tmp_path, "recall", {"tags": ["everyone"]}, realm="default"))["count"] == 1
    # the key's realm, in the same store
    assert (await in_process(tmp_path, "recall", {"id": node["id"]}, realm="a"))["count"] == 1
    with pytest.raises(ToolFailure):
        await in_process(tmp_path, "recall", {"id": node["id"]}, realm="default")

    async with http_server(tmp_path, "--realm", "b") as url:
        response = await post(url, key_a)  # --realm b is not one of this key's realms
        assert (response.status_code, response.json()["error"]["data"]["code"]) == (403, "realm_forbidden")
        for key in (several, every):
            async with over_http(url, key) as session:
                assert (await failed(session, "recall", {"id": node["id"]}))["code"] == "not_found"
                await ok(session, "store", {"content": f"b note {key[:8]}", "tags": ["b"]})
    assert (await in_process(tmp_path, "recall", {"tags": ["b"]}, realm="b"))["count"] == 2
    assert (await in_process(tmp_path, "recall", {"tags": ["b"]}, realm="a"))["count"] == 0


# -- run_<agent> ---------------------------------------------------------------------------------------------


def recalling_model() -> Any:
    """An OpenAI-compatible endpoint: first it calls `recall` for the `fact` tag, then it answers with what
    the tool returned."""

    def reply(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        tool = next((m for m in reversed(messages) if m["role"] == "tool"), None)
        if tool is None:
            return [{"role": "assistant", "tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                                          "function": {"name": "recall",
                                                                       "arguments": json.dumps({"tags": ["fact"]})}}]}]
        nodes = json.loads(tool["content"])["nodes"]
        return [{"role": "assistant", "content": "I know: " + ("; ".join(n["content"] for n in nodes) or "nothing")}]

    return openai_model(reply)


@pytest.mark.slow
async def test_agents_are_served_as_run_tools(tmp_path: Path) -> None:
    async with serving(recalling_model()) as model_url:
        agent = tmp_path / "agents" / "helper"
        agent.mkdir(parents=True)
        (agent / "config.yaml").write_text(
            "description: Answers from memory.\nmodel: openai:m\n"
            f"model_options: {{base_url: '{model_url}/v1', api_key: x}}\nmemory: true\n")
        agents = str(tmp_path / "agents")
        async with over_stdio(tmp_path, "--realm", "a", "--agents", agents) as session:
            listed = {t.name: t for t in (await session.list_tools()).tools}
            assert list(listed) == [*MEMORY_TOOLS, "run_helper"]  # the built-in agents are not served
            assert listed["run_helper"].description == "Answers from memory."
            assert listed["run_helper"].input_schema["required"] == ["prompt"]
            await ok(session, "store", {"content": "The sky is green here.", "tags": ["fact"]})
            result = await session.call_tool("run_helper", {"prompt": "What do you know?"})
            assert not result.is_error, result
            assert isinstance(item := result.content[0], TextContent)
            assert item.text == "I know: The sky is green here."  # the agent ran in realm a, on this store
            assert (await failed(session, "run_helper", {}))["code"] == "invalid_arguments"
            assert (await failed(session, "run_helper", {"prompt": "x", "realm": "b"}))["errors"] == \
                ["realm: unexpected argument"]
        async with over_stdio(tmp_path, "--realm", "b", "--agents", agents) as session:
            result = await session.call_tool("run_helper", {"prompt": "What do you know?"})
            assert isinstance(item := result.content[0], TextContent)
            assert item.text == "I know: nothing"


class Echo:
    async def run(self, prompt: str, *, caller: RunCaller) -> Any:
        return SimpleNamespace(status="completed", error=None, run_id="r_1",
                               output=f"{prompt} (realm {caller.realm}, org {caller.org_id})")

    async def wait_background(self, timeout_s: float = 30.0) -> None:
        pass


def broken() -> NoReturn:
    raise ConfigError("config.yaml: no model")


async def test_run_tools_follow_the_keys_agents(tmp_path: Path) -> None:
    store = await Store.open(db_url(tmp_path))
    try:
        server = ToolServer([], store.keys, agents={"echo": AgentEntry("", Echo), "broken": AgentEntry("", broken),
                                                    "bad name!": AgentEntry("", Echo)})
        anyone, only_other = Caller("acme", "a"), Caller("acme", "a", agents=frozenset({"other"}))
        assert [t.name for t in server.listing(anyone)] == ["run_echo", "run_broken"]
        assert server.listing(only_other) == []
        assert payload(await server.call("run_echo", {"prompt": "hi"}, only_other))["error"]["code"] == "forbidden"
        answer = (await server.call("run_echo", {"prompt": "hi"}, anyone)).content[0]
        assert isinstance(answer, TextContent)
        assert answer.text == "hi (realm a, org acme)"
        error = payload(await server.call("run_broken", {"prompt": "hi"}, anyone))["error"]
        assert error == {"code": "unavailable", "message": "agent 'broken' cannot start: config.yaml: no model"}
    finally:
        await store.close()
