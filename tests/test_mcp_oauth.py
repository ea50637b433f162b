"""MCP servers behind OAuth 2.1, over loopback against a real authorization server: the official SDK's
server-side auth (`examples/mcp_oauth_server.py`: discovery metadata, dynamic client registration, authorization
code with PKCE, refresh, revocation) in front of an SDK `MCPServer`. A user connects through the SDK's client
flow; the tokens are that user's, sealed at rest; a wrong state and a code delivered twice are refused;
expired tokens are refreshed, and a refused refresh or a revoked token asks the user again without failing
the run; the tokens are found in no event, log line, audit record or model request."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from ringlet import Agent, Caller
from ringlet.agent.settings import Gates
from ringlet.events import ToolResultEvent
from ringlet.gates import AuditLog, PolicyGate, PolicySet
from ringlet.mcp.config import MCPServerConfig, OAuthConfig
from ringlet.mcp.oauth import LoopbackAuthorizer, OAuthConnector, OAuthToolset
from ringlet.mcp.tokens import FileVault, MemoryVault, Sealer, UserTokens, new_key
from ringlet.testing import ScriptedModel, call
from test_mcp_client import free_port

SERVER = Path(__file__).parent.parent / "examples" / "mcp_oauth_server.py"
ALLOW_ALL = "package ringlet.all\n\ndeny contains msg if {\n    false\n    msg := \"never\"\n}\n"


@contextlib.asynccontextmanager
async def oauth_server(ttl: int = 3600) -> AsyncIterator[str]:
    """The authorization server and MCP server (one SDK process on a loopback port); its base URL."""
    port = free_port()
    process = await asyncio.create_subprocess_exec(sys.executable, str(SERVER), str(port), str(ttl),
                                                   stderr=asyncio.subprocess.PIPE)
    assert process.stderr is not None
    try:
        async with asyncio.timeout(30):
            while f"127.0.0.1:{port}".encode() not in (line := await process.stderr.readline()):
                assert line, "the server exited before it listened"
        yield f"http://127.0.0.1:{port}"
    finally:
        process.kill()
        await process.wait()


class Browser:
    """The user at the authorization server's page: signs in as `user` and is sent back to ringlet. Records
    each page it was shown; `before` may visit the callback itself first (an attacker's forged one)."""

    def __init__(self) -> None:
        self.user = "ana"
        self.shown: list[str] = []
        self.before: Callable[[httpx.AsyncClient, str], Any] | None = None
        self.after: Callable[[httpx.AsyncClient, str], Any] | None = None

    async def __call__(self, url: str, server: str) -> None:
        self.shown.append(url)
        async with httpx.AsyncClient() as web:
            login = (await web.get(url)).headers["location"]
            back = (await web.get(f"{login}&user={self.user}")).headers["location"]
            if self.before is not None:
                await self.before(web, back)
            response = await web.get(back)
            assert response.status_code == 200, response.text
            if self.after is not None:
                await self.after(web, back)


@pytest.fixture
def browser() -> Browser:
    return Browser()


def files(base: str, connector: OAuthConnector) -> OAuthToolset:
    return OAuthToolset("files", MCPServerConfig(url=f"{base}/mcp", oauth=OAuthConfig()), connector)


async def whoami(toolset: OAuthToolset, user: str, realm: str = "default", **options: Any) -> tuple[str, list[Any]]:
    """One run of `user` that calls `whoami`: what the tool said, and the run's events."""
    model = ScriptedModel([call("whoami", {}, id="w1"), "done"])
    agent = Agent(model, name="files", tools=[toolset], **options)
    events = [e async for e in agent.stream("who am I?", caller=Caller(realm=realm, user_id=user))]
    [result] = [e for e in events if isinstance(e, ToolResultEvent)]
    assert not result.is_error, result.error
    return result.result, events + [r for r in model.requests]


async def issued(base: str) -> dict[str, str]:
    async with httpx.AsyncClient() as web:
        return (await web.get(f"{base}/admin/tokens")).json()


async def test_a_user_connects_once_and_the_tokens_are_theirs(browser: Browser, tmp_path: Path) -> None:
    vault, key = FileVault(tmp_path / "tokens"), new_key()
    async with oauth_server() as base:
        toolset = files(base, OAuthConnector(vault, Sealer(key), LoopbackAuthorizer(show=browser)))
        try:
            said, _ = await whoami(toolset, "ana")
            assert said == "signed in as ana"
            [page] = browser.shown  # discovery, registration, then the authorization page, with PKCE
            assert f"{base}/authorize?" in page
            assert "code_challenge_method=S256" in page
            assert "resource=" in page
            said, _ = await whoami(toolset, "ana")  # the same session: not asked again
            assert len(browser.shown) == 1
            browser.user = "bo"  # another user of the realm connects on their own, with their own token
            said, _ = await whoami(toolset, "bo")
            assert said == "signed in as bo"
            assert len(browser.shown) == 2
        finally:
            await toolset.aclose()
        # a new process (a new toolset) with the same vault and key: ana's tokens are still hers
        again = files(base, OAuthConnector(vault, Sealer(key), LoopbackAuthorizer(show=browser)))
        try:
            said, _ = await whoami(again, "ana")
            assert said == "signed in as ana"
            assert len(browser.shown) == 2
        finally:
            await again.aclose()
        tokens = await issued(base)
    sealed = [p.read_bytes() for p in (tmp_path / "tokens").iterdir()]
    assert len(sealed) == 2  # ana's and bo's
    assert all(token.encode() not in blob for token in tokens for blob in sealed)  # encrypted at rest
    assert all(b"ana" not in p.name.encode() for p in (tmp_path / "tokens").iterdir())
    assert oct((tmp_path / "tokens").stat().st_mode & 0o777) == "0o700"


async def test_a_record_is_its_owners_only_and_needs_the_key() -> None:
    from mcp.shared.auth import OAuthToken

    vault, key = MemoryVault(), new_key()
    ana = UserTokens(vault, Sealer(key), realm="default", user="ana", server="files")
    await ana.set_tokens(OAuthToken(access_token="at_secret", token_type="Bearer"))
    assert (await ana.get_tokens()).access_token == "at_secret"
    bo = UserTokens(vault, Sealer(key), realm="default", user="bo", server="files")
    vault.records[bo.name] = vault.records[ana.name]  # ana's record filed under bo's name
    assert await bo.get_tokens() is None
    other_realm = UserTokens(vault, Sealer(key), realm="acme", user="ana", server="files")
    vault.records[other_realm.name] = vault.records[ana.name]
    assert await other_realm.get_tokens() is None
    wrong_key = UserTokens(vault, Sealer(new_key()), realm="default", user="ana", server="files")
    assert await wrong_key.get_tokens() is None
    rotated = UserTokens(vault, Sealer(f"{new_key()},{key}"), realm="default", user="ana", server="files")
    assert (await rotated.get_tokens()).access_token == "at_secret"  # an old key still opens
    from ringlet.errors import ConfigError

    with pytest.raises(ConfigError, match="RINGLET_MCP_TOKEN_KEY"):
        Sealer("not a key")


async def test_a_callback_with_a_wrong_state_or_a_code_delivered_twice_is_refused(browser: Browser) -> None:
    refused: list[Any] = []

    async def forged(web: httpx.AsyncClient, back: str) -> None:
        wrong = back.replace("state=", "state=forged")
        refused.append((await web.get(wrong)).status_code)

    async def twice(web: httpx.AsyncClient, back: str) -> None:
        try:
            refused.append((await web.get(back)).status_code)
        except httpx.ConnectError:  # the listener already closed: refused too
            refused.append("closed")

    browser.before, browser.after = forged, twice
    async with oauth_server() as base:
        toolset = files(base, OAuthConnector(MemoryVault(), Sealer(new_key()), LoopbackAuthorizer(show=browser)))
        try:
            said, _ = await whoami(toolset, "ana")
        finally:
            await toolset.aclose()
    assert said == "signed in as ana"  # the forged callback did not end the wait
    assert refused[0] == 400
    assert refused[1] in (400, "closed")


class LaterOnce:
    """The SDK client's clock (`mcp.client.auth.oauth2.time`, mcp 2.3.0), read once `ahead_s` later: the
    access token it holds looks past its lifetime at its next check, then the clock is true again."""

    def __init__(self) -> None:
        import time

        self.real, self.ahead_s = time, 0.0

    def time(self) -> float:
        ahead, self.ahead_s = self.ahead_s, 0.0
        return self.real.time() + ahead


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> LaterOnce:
    from mcp.client.auth import oauth2

    later = LaterOnce()
    monkeypatch.setattr(oauth2, "time", later)
    return later


async def test_expired_tokens_are_refreshed_and_a_refused_refresh_asks_again(browser: Browser,
                                                                             clock: LaterOnce) -> None:
    async with oauth_server(ttl=60) as base:
        vault = MemoryVault()
        toolset = files(base, OAuthConnector(vault, Sealer(new_key()), LoopbackAuthorizer(show=browser)))
        try:
            await whoami(toolset, "ana")
            first, before = dict(vault.records), await issued(base)
            clock.ahead_s = 120  # the access token is past its lifetime: refreshed
            said, _ = await whoami(toolset, "ana")
            assert said == "signed in as ana"
            assert len(browser.shown) == 1  # refreshed, not asked again
            assert vault.records != first  # the rotated tokens were stored
            assert set(await issued(base)) - set(before)  # a new access token was issued
            async with httpx.AsyncClient() as web:
                await web.post(f"{base}/admin/fail-refresh")
            clock.ahead_s = 120
            said, _ = await whoami(toolset, "ana")  # the refresh is refused: the user connects again
            assert said == "signed in as ana"
            assert len(browser.shown) == 2
        finally:
            await toolset.aclose()


async def test_a_revoked_token_asks_again_without_failing_the_run(browser: Browser) -> None:
    async with oauth_server() as base:
        toolset = files(base, OAuthConnector(MemoryVault(), Sealer(new_key()), LoopbackAuthorizer(show=browser)))
        try:
            await whoami(toolset, "ana")
            async with httpx.AsyncClient() as web:
                await web.post(f"{base}/admin/revoke", params={"user": "ana"})
            said, _ = await whoami(toolset, "ana")
            assert said == "signed in as ana"
            assert len(browser.shown) == 2
        finally:
            await toolset.aclose()


async def test_the_tokens_are_in_no_event_log_audit_record_or_model_request(
        browser: Browser, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    audit = AuditLog()
    gate = PolicyGate(PolicySet.compile({"all.rego": ALLOW_ALL}), audit=audit)
    async with oauth_server() as base:
        toolset = files(base, OAuthConnector(MemoryVault(), Sealer(new_key()), LoopbackAuthorizer(show=browser)))
        try:
            _, seen = await whoami(toolset, "ana", gates=Gates(policies=[gate]))
            _, again = await whoami(toolset, "ana", gates=Gates(policies=[gate]))
        finally:
            await toolset.aclose()
        tokens = await issued(base)
    assert tokens
    everything = repr(seen + again) + repr(audit.records) + caplog.text
    assert audit.records
    assert not [t for t in tokens if t in everything]
    assert not [t for t in tokens if t[3:15] in everything]  # not even in part
    assert {t[:3] for t in tokens} == {"at_", "rt_"}


@pytest.mark.slow
async def test_the_cli_prints_the_url_and_waits(browser: Browser, tmp_path: Path) -> None:
    """`ringlet run` on an agent whose mcp.json has a server behind OAuth: the URL on stderr, the run waits
    for the user to connect, goes on, and the next run finds the sealed tokens."""
    import os

    agent, port = tmp_path / "agent", free_port()
    agent.mkdir()
    (agent / "config.yaml").write_text("instructions: Answer in one short sentence.\nmcp_servers: mcp.json\n")
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")} | {
        "RINGLET_DATA_DIR": str(tmp_path / "data"), "RINGLET_MCP_TOKEN_KEY": new_key()}
    command = [sys.executable, "-m", "ringlet", "run", str(agent), "Say hi.", "--model", "local:smollm2", "--yes"]
    async with oauth_server() as base:
        (agent / "mcp.json").write_text(json.dumps({"mcpServers": {"files": {
            "url": f"{base}/mcp", "oauth": {"callbackPort": port}}}}))
        for attempt in (1, 2):
            process = await asyncio.create_subprocess_exec(*command, env=env, stdout=asyncio.subprocess.PIPE,
                                                           stderr=asyncio.subprocess.PIPE)
            assert process.stderr is not None
            said = []
            async with asyncio.timeout(240):
                while line := (await process.stderr.readline()).decode():
                    said.append(line)
                    if line.startswith("Connect MCP server files: open "):
                        await browser(line.split(" open ", 1)[1].strip(), "files")
                await process.wait()
            assert process.returncode == 0, "".join(said)
            assert len(browser.shown) == 1, f"run {attempt}"  # connected once; the second run is not asked
            assert f"redirect_uri=http%3A%2F%2F127.0.0.1%3A{port}%2Fcallback" in browser.shown[0]
    assert len(list((tmp_path / "data" / "mcp-tokens").iterdir())) == 1


def test_a_server_behind_oauth_needs_the_token_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ringlet.errors import ConfigError
    from ringlet.mcp.oauth import toolset_for

    monkeypatch.delenv("RINGLET_MCP_TOKEN_KEY", raising=False)
    config = MCPServerConfig(url="http://127.0.0.1:1/mcp", oauth=OAuthConfig(clientId="ringlet", scopes="a b"))
    assert config.oauth is not None
    assert config.oauth.scopes == ["a", "b"]
    with pytest.raises(ConfigError, match="'files' is behind OAuth: set RINGLET_MCP_TOKEN_KEY"):
        toolset_for("files", config)
    monkeypatch.setenv("RINGLET_MCP_TOKEN_KEY", new_key())
    monkeypatch.setenv("RINGLET_DATA_DIR", str(tmp_path))
    assert isinstance(toolset_for("files", config), OAuthToolset)
    with pytest.raises(ValueError, match="`oauth` is for an HTTP server"):
        MCPServerConfig(command="x", oauth=OAuthConfig())


# -- through the server: the run asks its user to connect, the callback route hands the code back -----------


async def test_through_the_server_the_run_asks_its_user_and_goes_on_once_connected(
        store: Any, browser: Browser, caplog: pytest.LogCaptureFixture) -> None:
    from ringlet.server import ServerSettings, create_app
    from serving import serving
    from test_server import new_conversation
    from test_server_approvals import client_for, until_paused

    caplog.set_level(logging.DEBUG)
    async with oauth_server() as base:
        toolset = files(base, OAuthConnector(MemoryVault(), Sealer(new_key()), LoopbackAuthorizer()))
        agent = Agent(ScriptedModel([call("whoami", {}, id="w1"), "done"]), name="files", tools=[toolset])
        app = create_app(ServerSettings(ping_interval_s=0.2), store=store, agents=[agent])
        try:
            async with serving(app) as url:
                connections = app.state.connections
                connections.base = url  # the callback route's address (`public_url` in production)
                async with await client_for(url, store, "ana", ["chat"]) as ana, \
                        await client_for(url, store, "bo", ["chat"]) as bo, \
                        await client_for(url, store, "ana-approver", ["approve"]) as no_chat, \
                        httpx.AsyncClient(base_url=url) as web:
                    cid = (await new_conversation(ana, "files"))["id"]
                    seen: list[Any] = []
                    stream = asyncio.create_task(until_paused(ana, cid, "who am I?", seen, asyncio.Event()))
                    [waiting] = await connections.wait_for_waiting()
                    assert (waiting.server, waiting.realm, waiting.user) == ("files", "default", "ana")
                    # the user sees it: in the connections list and as a question of the conversation
                    listed = (await ana.get("/api/v1/mcp/connections")).json()["data"]
                    assert listed == [{"server": "files", "realm": "default", "url": waiting.url}]
                    assert (await bo.get("/api/v1/mcp/connections")).json()["data"] == []  # not another user's
                    assert (await no_chat.get("/api/v1/mcp/connections")).status_code == 403  # needs `chat`
                    assert (await web.get("/api/v1/mcp/connections")).status_code == 401  # needs a key
                    [question] = (await ana.get(f"/api/v1/chat/conversations/{cid}")).json()["pending"]["questions"]
                    assert waiting.url in question["question"]
                    assert [o["label"] for o in question["options"]] == ["Done", "Decline"]
                    # a forged callback (wrong state) and a code delivered twice change nothing
                    login = (await web.get(waiting.url)).headers["location"]
                    back = (await web.get(f"{login}&user=ana")).headers["location"]
                    assert back.startswith(f"{url}/mcp/oauth/callback?")
                    forged = await web.get(back.replace("state=", "state=x"))
                    assert forged.status_code == 404
                    assert (await web.get(back)).text.startswith("Connected.")
                    assert (await web.get(back)).status_code == 404  # used
                    await stream
                    tokens = await issued(base)
                    stored = repr(await store.events.after(cid))
                audit = [e.record for e in await store.audit.list(limit=500)]
        finally:
            await toolset.aclose()
    [result] = [json.loads(e.data) for e in seen if e.event == "tool_result"]
    assert result["result"] == "signed in as ana"
    states = [json.loads(e.data)["state"] for e in seen if e.event == "status"]
    assert states[:3] == ["working", "input_required", "working"]  # paused while its user connected
    assert states[-1] == "completed"
    [asked] = [json.loads(e.data) for e in seen if e.event == "question"]  # live, as the run waited
    assert asked["question"].startswith("MCP server files needs you to connect your account")
    everything = repr(seen) + stored + repr(audit) + caplog.text
    assert tokens
    assert not [t for t in tokens if t in everything]  # in no event, stored event, audit record or log line
