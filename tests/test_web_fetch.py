"""`web_fetch` (issue #8, builtin-tools-and-subagents.md §5) against a local HTTP server, and the address
checks that keep it away from loopback, private, link-local and metadata addresses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from ringlet.errors import ToolFailure
from ringlet.store import Store
from ringlet.tools.base import ArgumentsInvalid
from ringlet.tools.builtin.selection import BUILTIN_TOOLS
from ringlet.tools.builtin.web import WebFetchSettings, blocked, fetch, readable
from serving import serving

PAGE = """<html><head><title>Release notes</title><style>p {color: red}</style>
<script>alert("x")</script></head><body><nav><a href="/">Home</a> | <a href="/docs">Docs</a></nav>
<h1>Version   2.0</h1><ul><li>Faster search</li><li>New <a href="/api">API</a></li></ul>
<p>Thanks to   everyone.</p></body></html>"""
seen_hosts: list[str] = []


def site(port_of: list[int]) -> Starlette:
    async def page(request: Request) -> Response:
        seen_hosts.append(request.headers["host"])
        return Response(PAGE, media_type="text/html")

    async def data(request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def binary(request: Request) -> Response:
        return Response(b"\x00\x01", media_type="application/octet-stream")

    async def hop(request: Request) -> Response:
        return RedirectResponse("/page")

    async def to_localhost(request: Request) -> Response:
        return RedirectResponse(f"http://localhost:{port_of[0]}/page")

    async def loop(request: Request) -> Response:
        return RedirectResponse("/loop")

    return Starlette(routes=[Route("/page", page), Route("/data", data), Route("/binary", binary),
                             Route("/hop", hop), Route("/to-localhost", to_localhost), Route("/loop", loop)])


LOCAL = WebFetchSettings(allow_hosts=frozenset({"127.0.0.1"}))


async def test_fetches_and_extracts_readable_text() -> None:
    port: list[int] = []
    async with serving(site(port)) as url:
        port.append(int(url.rsplit(":", 1)[1]))
        got = await fetch(f"{url}/hop", settings=LOCAL)
        assert got["final_url"] == f"{url}/page"
        assert got["status"] == 200
        assert got["title"] == "Release notes"
        assert got["content"] == "Version 2.0\nFaster search\nNew\nAPI\nThanks to everyone."
        assert "alert" not in got["content"]
        assert "Home" not in got["content"]  # navigation dropped
        assert seen_hosts[-1] == f"127.0.0.1:{port[0]}"
        raw = await fetch(f"{url}/page", extract_text=False, max_chars=20, settings=LOCAL)
        assert (raw["content"], raw["truncated"], raw["length"]) == (PAGE[:20], True, len(PAGE))
        assert json.loads((await fetch(f"{url}/data", settings=LOCAL))["content"]) == {"ok": True}
        with pytest.raises(ToolFailure) as binary:
            await fetch(f"{url}/binary", settings=LOCAL)
        assert binary.value.code == "unsupported_content_type"
        with pytest.raises(ToolFailure) as redirected:  # a redirect to a name that resolves to loopback
            await fetch(f"{url}/to-localhost", settings=LOCAL)
        assert redirected.value.code == "blocked_address"
        with pytest.raises(ToolFailure, match="more than 5 redirects"):
            await fetch(f"{url}/loop", settings=LOCAL)


@pytest.mark.parametrize("target", ["http://127.0.0.1/", "http://169.254.169.254/latest/meta-data/",
                                    "http://[::1]/", "http://localhost:9/", "http://10.1.2.3/",
                                    "http://100.64.0.1/", "http://0.0.0.0/", "http://[::ffff:127.0.0.1]/"])
async def test_internal_addresses_are_refused(target: str) -> None:
    with pytest.raises(ToolFailure) as info:
        await fetch(target)
    assert info.value.code == "blocked_address"
    assert "private address" in info.value.message


def test_address_classes_and_argument_checks() -> None:
    assert not blocked("93.184.216.34")
    assert not blocked("2606:2800:220:1:248:1893:25c8:1946")
    assert all(blocked(a) for a in ("192.168.1.1", "172.16.0.1", "fd00::1", "fe80::1", "224.0.0.1"))
    tool = BUILTIN_TOOLS["web_fetch"]
    assert (tool.effect, tool.approval, tool.timeout_s) == ("read", "auto", 20.0)
    with pytest.raises(ArgumentsInvalid, match="unsupported scheme 'file'"):
        tool.validate({"url": "file:///etc/passwd"})
    with pytest.raises(ArgumentsInvalid, match="max_chars"):
        tool.validate({"url": "https://example.com", "max_chars": 60_000})
    assert tool.validate({"url": " https://example.com "})["url"] == "https://example.com"
    assert readable("<p>a&nbsp;b</p>")[1] == "a b"


async def test_config_settings_reach_the_tool(tmp_path: Path) -> None:
    """`web_fetch: {allow_private, allow_hosts}` in config.yaml: the agent's tool reaches a loopback site only
    when allowed."""
    from ringlet.agent.config import build_agent, find
    from ringlet.testing import ScriptedModel, call

    port: list[int] = []
    async with serving(site(port)) as url:
        port.append(int(url.rsplit(":", 1)[1]))
        outcomes = {}
        for name, settings in (("closed", ""), ("open", "web_fetch: {allow_private: true}\n")):
            (tmp_path / name).mkdir()
            (tmp_path / name / "config.yaml").write_text(f"builtin_tools: [web_fetch]\n{settings}")
            agent = build_agent(find(str(tmp_path / name)),
                                model=ScriptedModel([call("web_fetch", {"url": f"{url}/data"}), "ok"]))
            result = await agent.run("fetch")
            outcomes[name] = json.loads(next(m.content for m in result.messages if m.role == "tool"))
    assert outcomes["closed"]["error"]["code"] == "blocked_address"
    assert json.loads(outcomes["open"]["content"]) == {"ok": True}


async def test_an_internal_address_is_refused_before_anyone_is_asked(store: Store) -> None:
    """With web_fetch needing approval, a call to 127.0.0.1 is refused at once (`blocked_address`), over the
    server, with no approval asked; one the settings let through (`allow_hosts`) is asked as before."""
    from ringlet import Agent, Gates
    from ringlet.gates import ApprovalRules
    from ringlet.server import ServerSettings, create_app
    from ringlet.testing import FunctionModel, call
    from ringlet.tools.builtin.web import web_fetch_tool

    def fetching(request: Any) -> Any:
        results = [m for m in request.messages if m.role == "tool"]
        return f"tool said: {results[-1].text}" if results else call("web_fetch", url="http://127.0.0.1:9/x")

    confirm = Gates(approvals=ApprovalRules({"web_fetch": {"mode": "confirm"}}))
    agents = [Agent(FunctionModel(fetching), name="strict", tools=[web_fetch_tool()], gates=confirm),
              Agent(FunctionModel(fetching), name="lenient", tools=[web_fetch_tool(LOCAL)], gates=confirm)]
    async with serving(create_app(ServerSettings(), store=store, agents=agents)) as url:
        key, _ = await store.keys.create("k", scopes=["chat", "approve"])
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as c:
            answers = {}
            for agent in ("strict", "lenient"):
                cid = (await c.post("/api/v1/chat/conversations", json={"agent": agent})).json()["id"]
                answers[agent] = (await c.post(f"/api/v1/chat/conversations/{cid}/messages",
                                               json={"content": "fetch it"},
                                               headers={"Accept": "application/json"})).json()
                answers[agent]["asked"] = (await c.get(f"/api/v1/chat/conversations/{cid}/approvals")).json()["data"]
                answers[agent]["messages"] = (await c.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"]
    strict, lenient = answers["strict"], answers["lenient"]
    assert strict["asked"] == []  # nobody was asked to approve a call that could never run
    result = json.loads(next(m["content"] for m in strict["messages"] if m["role"] == "tool"))
    assert result["error"]["code"] == "blocked_address"
    assert "127.0.0.1" in result["error"]["message"]
    assert [a["tool"] for a in lenient["asked"]] == ["web_fetch"]  # allowed there: a human is asked
    assert [a["status"] for a in lenient["asked"]] == ["pending"]
