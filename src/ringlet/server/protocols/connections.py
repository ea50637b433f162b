"""Users connecting MCP servers behind OAuth through the server (`ringlet.mcp.oauth`).

When a user's session with such a server needs their consent (no token yet, a refresh refused, a token
revoked), the run that waits for it asks them: a question in its conversation ("Connect: open <URL>", with
Done and Decline; the web UI shows it with the link, the questions API answers it) and status
`input_required`. The user opens the authorization server's page and is sent back to
`GET /mcp/oauth/callback`, which hands the code to the waiting flow: the question is closed, the run goes on.

- `GET /mcp/oauth/callback?code&state`: the redirect target. It takes no API key (the browser comes from the
  authorization server); the `state` is what it checks: unguessable, bound to one waiting connection of one
  user, good once. An unknown or used state is 404 and changes nothing.
- `GET /api/v1/mcp/connections` (scope `chat`): the caller's own connections waiting for them (server, URL),
  in the realms of their key; never another user's.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import parse_qs, urlparse

from fastapi import APIRouter, Depends, Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel

from ringlet._ids import at
from ringlet.context import RunContext
from ringlet.mcp.elicit import ask_in_call, question_for
from ringlet.mcp.oauth import CONNECT_TIMEOUT_S, OAuthConnector
from ringlet.mcp.tokens import Sealer, TokenVault
from ringlet.server.http.auth import Principal, need
from ringlet.server.http.schemas import ERRORS
from ringlet.store.connection_records import CHANNEL, PendingConnections, StoredConnection

router = APIRouter()
Chat = Annotated[Principal, Depends(need("chat"))]
log = logging.getLogger("ringlet.server")
CALLBACK = "/mcp/oauth/callback"


@dataclass(eq=False)
class Waiting:
    """A connection waiting for its user: whose, to which server, the page to open, and the redirect's
    code and state once it comes."""

    server: str
    realm: str
    user: str | None
    url: str
    came: asyncio.Future[tuple[str, str | None]]


class ServerAuthorizer:
    """The server's `Authorizer`: the redirect comes to its callback route (`base` + `/mcp/oauth/callback`).
    With a `vault` (the store's `mcp_tokens`), the connectors it serves keep their tokens there, shared by
    every process on the database. With `pending` (the store's `mcp_connections`) and a `sealer` (the token
    key's; else the first connector's), the connections waiting are recorded there too, sealed, so the
    redirect may come back to any process: the one it reaches records the answer and tells the waiting one
    (`NOTIFY`, heard on the live feed: `listen`)."""

    def __init__(self, base: str, vault: TokenVault | None = None, *, pending: PendingConnections | None = None,
                 sealer: Sealer | None = None) -> None:
        self.base = base.rstrip("/")
        self.vault, self.pending, self.sealer = vault, pending, sealer
        self.waiting: dict[str, Waiting] = {}
        """By state."""
        self._named: dict[str, str] = {}
        """The states of this process's connections recorded in `pending`, by row name."""
        self._fetching: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()

    async def wait_for_waiting(self, count: int = 1) -> list[Waiting]:
        """The connections waiting for their users, once there are at least `count` (a test's hook, and an
        embedding application's)."""
        while len(self.waiting) < count:
            self._changed.clear()
            await self._changed.wait()
        return list(self.waiting.values())

    def serve(self, connector: OAuthConnector) -> None:
        """Users of `connector` connect through this server, and their tokens are kept in its vault."""
        connector.authorizer = self
        if self.vault is not None:
            connector.vault = self.vault
        if self.sealer is None:
            self.sealer = connector.sealer

    def listen(self, feed: Any) -> None:
        """Hear the answers other processes record for this one's connections (on the live feed's
        connection, `server/durable/feed.py`; before it starts)."""
        feed.on(CHANNEL, self._heard)

    def _heard(self, name: str) -> None:
        state = self._named.get(name)
        if state is not None and self.pending is not None:
            task = asyncio.create_task(self._fetch(self.pending, name, state))
            self._fetching.add(task)
            task.add_done_callback(self._fetching.discard)

    async def _fetch(self, pending: PendingConnections, name: str, state: str) -> None:
        sealed = await pending.answered(name)
        answer = self.sealer.open(sealed, name) if sealed is not None and self.sealer is not None else None
        if answer is not None:
            self._settle_here(state, answer.get("code"), answer.get("error"))

    async def waiting_for(self, user: str | None) -> list[Waiting]:
        """The user's connections waiting for them: in every process when they are recorded, else in this
        one."""
        if self.pending is None or self.sealer is None:
            return [w for w in self.waiting.values() if w.user == user]
        found = []
        for row in await self.pending.waiting_for(user):
            opened = self.sealer.open(row.sealed, row.name)
            if opened is not None:
                found.append(Waiting(row.server, row.realm, row.user, opened["url"], asyncio.Future()))
        return found

    @property
    def redirect_uri(self) -> str:
        return f"{self.base}{CALLBACK}"

    async def authorize(self, url: str, *, server: str, realm: str, user: str | None,
                        ctx: RunContext | None) -> tuple[str, str | None]:
        state = parse_qs(urlparse(url).query).get("state", [""])[0]
        came: asyncio.Future[tuple[str, str | None]] = asyncio.get_running_loop().create_future()
        self.waiting[state] = Waiting(server, realm, user, url, came)
        name, asking = _name(state), None
        try:
            if self.pending is not None and self.sealer is not None:  # any process may take the callback
                self._named[name] = state
                await self.pending.add(StoredConnection(name, realm, user, server,
                                                        self.sealer.seal({"url": url}, name)),
                                       at(time.time() + CONNECT_TIMEOUT_S))
            self._changed.set()
            log.info("MCP server %r: waiting for user %r of realm %r to connect", server, user, realm)
            question = question_for(_Connect(url, server), server=server)
            if ctx is not None:  # the run that waits asks its user (a question with the link)
                asking = asyncio.create_task(ask_in_call(ctx, question, tool=ctx.tool_name or server,
                                                         connector=server))
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                return await _connected(came, asking, question["mcp"]["decline"])
        finally:
            self.waiting.pop(state, None)
            if asking is not None and not asking.done():
                asking.cancel()  # connected: the question is closed
                await asyncio.gather(asking, return_exceptions=True)
            if self._named.pop(name, None) is not None and self.pending is not None:
                try:
                    await self.pending.remove(name)
                except Exception as exc:  # it expires anyway; the connection's outcome stands
                    log.warning("MCP server %r: could not remove a finished connection's record: %s", server, exc)

    async def settle(self, state: str, code: str | None, error: str | None) -> bool:
        """The redirect came back: hand its code (or the error) to the connection waiting on `state`, in this
        process or (recorded, once, in `pending`) in the one that waits. False when none waits on it."""
        if self.pending is None or self.sealer is None:
            return self._settle_here(state, code, error)
        name = _name(state)
        if not await self.pending.answer(name, self.sealer.seal({"code": code, "error": error}, name)):
            return False
        self._settle_here(state, code, error)  # here, or in the process that hears the NOTIFY
        return True

    def _settle_here(self, state: str, code: str | None, error: str | None) -> bool:
        waiting = self.waiting.pop(state, None)
        if waiting is None or waiting.came.done():
            return False
        if error is not None or not code:
            waiting.came.set_exception(PermissionError(f"the authorization server refused: {error or 'no code'}"))
        else:
            waiting.came.set_result((code, state))
        return True


def _name(state: str) -> str:
    """A connection's row name: the state's hash (the state itself, which the callback must show, is not
    stored)."""
    return hashlib.sha256(state.encode()).hexdigest()


@dataclass
class _Connect:
    """A URL-mode elicitation's fields, for the question that asks the user to connect."""

    url: str
    server: str
    mode: str = "url"

    @property
    def message(self) -> str:
        return f"MCP server {self.server} needs you to connect your account: sign in, and this run goes on."


async def _connected(came: asyncio.Future[tuple[str, str | None]], asking: asyncio.Task[Any] | None,
                     decline: str) -> tuple[str, str | None]:
    """The redirect's code and state; PermissionError when the user declines. `Done` before the redirect
    came changes nothing: the connection is made by the redirect."""
    waits: set[asyncio.Future[Any]] = {came, asking} if asking is not None else {came}
    while True:
        done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        if came in done:
            return came.result()
        assert asking is not None
        waits = {came}
        if asking.cancelled() or asking.exception() is not None:
            continue
        status, answer = asking.result()
        if status != "answered" or (answer or {}).get("answer") == decline:
            raise PermissionError("the user did not connect")


def install(app: Any, catalog: Any, settings: Any, store: Any = None) -> ServerAuthorizer:
    """The app's authorizer (its callback at `settings.public_url`, else the address it listens on), given to
    the hosted agents' servers behind OAuth as they are built; their tokens kept in `store`."""
    base = settings.public_url or f"http://{settings.host}:{settings.port}"
    key = os.environ.get("RINGLET_MCP_TOKEN_KEY", "")
    authorizer = app.state.connections = ServerAuthorizer(
        base, store.mcp_tokens if store is not None else None,
        pending=store.mcp_connections if store is not None else None, sealer=Sealer(key) if key else None)
    catalog.connect_with(authorizer)
    return authorizer


@router.get(CALLBACK, response_class=PlainTextResponse, responses={
    200: {"description": "Connected (or the authorization server's refusal handed on)"},
    404: {"description": "No connection is waiting for this state", "content": {"text/plain": {}}}})
async def callback(request: Request, state: str = "", code: str | None = None,
                   error: str | None = None) -> PlainTextResponse:
    """Where the authorization server sends the user back (no API key: the `state` is checked)."""
    authorizer: ServerAuthorizer | None = getattr(request.app.state, "connections", None)
    if authorizer is None or not state or not await authorizer.settle(state, code, error):
        return PlainTextResponse("No connection is waiting for this state: it was used, or never asked for.",
                                 status_code=404)
    if error is not None:
        return PlainTextResponse("Not connected: the authorization server refused. You can close this tab.")
    return PlainTextResponse("Connected. You can close this tab and go back to ringlet.")


class Connection(BaseModel):
    server: str
    realm: str
    url: str


class ConnectionList(BaseModel):
    data: list[Connection]


@router.get("/api/v1/mcp/connections", response_model=ConnectionList, responses=ERRORS)
async def waiting_connections(request: Request, principal: Chat) -> dict[str, Any]:
    """The caller's connections to MCP servers that wait for them to sign in (open `url`)."""
    authorizer: ServerAuthorizer | None = getattr(request.app.state, "connections", None)
    found = [] if authorizer is None else await authorizer.waiting_for(principal.user_id)
    return {"data": [{"server": w.server, "realm": w.realm, "url": w.url} for w in found if principal.sees(w.realm)]}
