"""MCP OAuth tokens on a server with several replicas: kept in the store (the `mcp_tokens` table, sealed),
so a user who connected through one server uses the connection through another on the same PostgreSQL
database without being asked again; the row is ciphertext named by a hash; another user is still asked."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpx
import pytest
from sqlalchemy import select

from postgres import fresh_database
from ringlet import Agent
from ringlet.mcp.oauth import LoopbackAuthorizer, OAuthConnector
from ringlet.mcp.tokens import MemoryVault, Sealer, new_key
from ringlet.server import ServerSettings, create_app
from ringlet.store import Store
from ringlet.store.schema import mcp_connections, mcp_tokens
from ringlet.testing import ScriptedModel, call
from serving import serving
from test_mcp_oauth import Browser, files, issued, oauth_server
from test_server import new_conversation
from test_server_approvals import client_for, until_paused


@contextlib.asynccontextmanager
async def replica(db_url: str, base: str, key: str, runs: int) -> AsyncIterator[tuple[str, Any, Store]]:
    """One server on the database: its own store (connections), agent, toolset and connector (an in-memory
    vault the server replaces with its store's); its URL, its connections authorizer and its store."""
    store = await Store.open(db_url)
    toolset = files(base, OAuthConnector(MemoryVault(), Sealer(key), LoopbackAuthorizer()))
    script: list[Any] = [item for n in range(runs) for item in (call("whoami", {}, id=f"w{n}"), "done")]
    agent = Agent(ScriptedModel(script), name="files", tools=[toolset])
    app = create_app(ServerSettings(ping_interval_s=0.2, engine="local"), store=store, agents=[agent])
    try:
        async with serving(app) as url:
            app.state.connections.base = url  # its callback route (`public_url` in production)
            yield url, app.state.connections, store
    finally:
        await toolset.aclose()
        await store.close()


async def whoami_run(client: httpx.AsyncClient, connections: Any) -> tuple[str | None, list[Any]]:
    """A run of the client's user calling `whoami`: what the tool said, or None when the run asked its user to
    connect first (then the waiting connection, the run's stream and what it streamed so far are second)."""
    cid = (await new_conversation(client, "files"))["id"]
    seen: list[Any] = []
    stream = asyncio.create_task(until_paused(client, cid, "who am I?", seen, asyncio.Event()))
    asked = asyncio.create_task(connections.wait_for_waiting())
    done, _ = await asyncio.wait({stream, asked}, return_when=asyncio.FIRST_COMPLETED)
    if asked in done:
        return None, [asked.result()[0], stream, seen]
    asked.cancel()
    [result] = [json.loads(e.data) for e in seen if e.event == "tool_result"]
    return result["result"], seen


@pytest.mark.slow
async def test_a_user_connected_through_one_server_is_connected_through_another(
        postgres_url: str) -> None:
    key, browser = new_key(), Browser()
    async with contextlib.AsyncExitStack() as stack:
        base = await stack.enter_async_context(oauth_server())
        db_url = await stack.enter_async_context(fresh_database(postgres_url))
        one, one_connections, one_store = await stack.enter_async_context(replica(db_url, base, key, runs=1))
        two, two_connections, _ = await stack.enter_async_context(replica(db_url, base, key, runs=2))
        ana_one, ana_two, bo_two = [await stack.enter_async_context(await client_for(url, one_store, user, ["chat"]))
                                    for url, user in ((one, "ana"), (two, "ana"), (two, "bo"))]
        # ana connects through the first server
        said, (waiting, stream, _) = await whoami_run(ana_one, one_connections)
        assert said is None
        assert (waiting.user, waiting.server) == ("ana", "files")
        await browser(waiting.url, "files")
        await stream
        # a run of hers on the second server uses the token: nobody asks her again
        said, seen = await whoami_run(ana_two, two_connections)
        assert said == "signed in as ana"
        assert "input_required" not in [json.loads(e.data)["state"] for e in seen if e.event == "status"]
        assert len(browser.shown) == 1
        # at rest: one row, named by a hash of its owner, ciphertext only this key opens
        async with one_store.db.connect() as conn:
            rows = (await conn.execute(select(mcp_tokens))).mappings().all()
        owner = json.dumps(["default", "ana", "files"])
        [row] = rows
        assert row["name"] == hashlib.sha256(owner.encode()).hexdigest()
        tokens = await issued(base)
        assert tokens
        assert not [t for t in tokens if t.encode() in bytes(row["sealed"])]
        opened = Sealer(key).open(bytes(row["sealed"]), owner)
        assert opened is not None
        assert opened["tokens"]["access_token"] in tokens
        assert Sealer(new_key()).open(bytes(row["sealed"]), owner) is None
        # bo, on the second server, is asked to connect: ana's token is not his
        said, (waiting, stream, _) = await whoami_run(bo_two, two_connections)
        assert said is None
        assert (waiting.user, waiting.realm) == ("bo", "default")
        browser.user = "bo"
        await browser(waiting.url, "files")
        await stream
        async with one_store.db.connect() as conn:
            assert len((await conn.execute(select(mcp_tokens.c.name))).all()) == 2


async def test_the_stores_vault_keeps_replaces_and_forgets_a_sealed_record(store: Store) -> None:
    from mcp.shared.auth import OAuthToken

    from ringlet.mcp.tokens import UserTokens

    sealer = Sealer(new_key())
    ana = UserTokens(store.mcp_tokens, sealer, realm="default", user="ana", server="files")
    assert await ana.get_tokens() is None
    await ana.set_tokens(OAuthToken(access_token="first-secret", token_type="Bearer"))
    await ana.set_tokens(OAuthToken(access_token="second-secret", token_type="Bearer"))  # replaces it
    got = await UserTokens(store.mcp_tokens, sealer, realm="default", user="ana", server="files").get_tokens()
    assert got is not None
    assert got.access_token == "second-secret"
    assert await UserTokens(store.mcp_tokens, sealer, realm="other", user="ana", server="files").get_tokens() is None
    blob = await store.mcp_tokens.read(ana.name)
    assert blob is not None
    assert b"secret" not in blob
    await ana.forget()
    assert await store.mcp_tokens.read(ana.name) is None
    assert await ana.get_tokens() is None


async def test_the_callback_reaching_another_server_finishes_the_connection(
        postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    key = new_key()
    monkeypatch.setenv("RINGLET_MCP_TOKEN_KEY", key)  # the second server seals the answer: its agent never ran
    async with contextlib.AsyncExitStack() as stack:
        base = await stack.enter_async_context(oauth_server())
        db_url = await stack.enter_async_context(fresh_database(postgres_url))
        one, one_connections, one_store = await stack.enter_async_context(replica(db_url, base, key, runs=1))
        two, _, _ = await stack.enter_async_context(replica(db_url, base, key, runs=0))
        ana_one, ana_two, bo_two = [await stack.enter_async_context(await client_for(url, one_store, user, ["chat"]))
                                    for url, user in ((one, "ana"), (two, "ana"), (two, "bo"))]
        web = await stack.enter_async_context(httpx.AsyncClient())
        said, (waiting, stream, seen) = await whoami_run(ana_one, one_connections)
        assert said is None
        # recorded for every server: listed by the other one, to ana only; the state is not stored
        listed = (await ana_two.get("/api/v1/mcp/connections")).json()["data"]
        assert listed == [{"server": "files", "realm": "default", "url": waiting.url}]
        assert (await bo_two.get("/api/v1/mcp/connections")).json()["data"] == []
        state = parse_qs(urlparse(waiting.url).query)["state"][0]
        async with one_store.db.connect() as conn:
            [row] = (await conn.execute(select(mcp_connections))).mappings().all()
        assert row["name"] == hashlib.sha256(state.encode()).hexdigest()
        assert state.encode() not in bytes(row["sealed"])
        # the authorization server sends ana back; the load balancer takes her to the other server
        login = (await web.get(waiting.url)).headers["location"]
        back = (await web.get(f"{login}&user=ana")).headers["location"]
        assert back.startswith(f"{one}/mcp/oauth/callback?")
        elsewhere = back.replace(one, two, 1)
        assert (await web.get(elsewhere.replace("state=", "state=x"))).status_code == 404  # forged
        assert (await web.get(elsewhere)).text.startswith("Connected.")
        assert (await web.get(elsewhere)).status_code == 404  # used: on this server
        assert (await web.get(back)).status_code == 404  # and on the one that waited
        async with asyncio.timeout(60):  # told through PostgreSQL; else it would wait its 10 minutes
            await stream
        [result] = [json.loads(e.data) for e in seen if e.event == "tool_result"]
        assert result["result"] == "signed in as ana"
        async with one_store.db.connect() as conn:
            assert (await conn.execute(select(mcp_connections))).all() == []  # the finished wait is removed


async def test_without_a_store_only_this_processs_waiting_connections_are_settled() -> None:
    from ringlet.server.protocols.connections import ServerAuthorizer

    authorizer = ServerAuthorizer("http://127.0.0.1:1")
    assert not await authorizer.settle("never-asked", "code", None)
    assert await authorizer.waiting_for("ana") == []
