"""MCP servers behind OAuth 2.1: the MCP specification's authorization flow, through the official SDK's client
(`mcp.client.auth.OAuthClientProvider`), with each user's tokens kept apart (`tokens.py`).

    connector = OAuthConnector(FileVault(folder), Sealer(key), LoopbackAuthorizer(show=print))
    toolset = OAuthToolset("files", config, connector)     # config.oauth is set: `"oauth": {}` in mcp.json
    agent = Agent(model, tools=[toolset])

The flow, on the first request a user's session makes without a valid token (the server answers 401):
protected-resource metadata (RFC 9728, from the `WWW-Authenticate` header or the well-known URL), then the
authorization server's metadata (RFC 8414), dynamic client registration (RFC 7591) unless `oauth.clientId`
names a client registered beforehand, then the authorization code grant with PKCE (S256) and the `resource`
indicator: the user is shown the authorization server's page (`Authorizer`), consents, and comes back to the
redirect URI with the code and the state, which the SDK checks before it trades the code for tokens. An
access token past its lifetime is refreshed with the refresh token; a refresh the server refuses, or a token
it no longer accepts (revoked), sends the user through the flow again: the call waits, the run does not fail.

Whose tokens: a session per (realm, user) of the runs that use the server (`OAuthToolset`), each with its own
`UserTokens`; one user's token never serves another's call. Tokens travel only in the `Authorization`
header of that session's HTTP requests: they are not in any event, log line, audit record or tool result,
and the model never sees them.

`LoopbackAuthorizer` is the library's and the CLI's: it prints the URL (or hands it to `show`) and listens
on a loopback port for the redirect (a callback whose `state` is not the one it waits for is refused, and the
listener closes after the one it waits for, so a code cannot come back twice).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs, urlparse

from ringlet.context import RunContext
from ringlet.errors import ConfigError
from ringlet.mcp.client import MCPToolset
from ringlet.mcp.config import MCPServerConfig
from ringlet.mcp.tokens import FileVault, Sealer, TokenVault, UserTokens
from ringlet.tools.base import Tool, Toolset

__all__ = ["Authorizer", "LoopbackAuthorizer", "OAuthConnector", "OAuthToolset", "toolset_for"]

log = logging.getLogger("ringlet.mcp")
CONNECT_TIMEOUT_S = 600.0
"""How long a user has to connect before the call that needed it fails."""


class Authorizer(Protocol):
    """Has the user approve a connection: shows them the authorization server's page (`url`) and returns the
    code and state the authorization server sent to `redirect_uri`. `realm` and `user` say whose connection
    it is; `ctx` is the run that waits for it (the user's latest run using the server), when there is one."""

    @property
    def redirect_uri(self) -> str: ...

    async def authorize(self, url: str, *, server: str, realm: str, user: str | None,
                        ctx: RunContext | None) -> tuple[str, str | None]: ...


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _say(url: str, server: str) -> None:
    print(f"Connect MCP server {server}: open {url}\n(waiting for the authorization server to send you back)",
          file=sys.stderr, flush=True)


class LoopbackAuthorizer:
    """Shows the URL (`show(url, server)`; printed by default) and waits for the redirect to
    `http://127.0.0.1:<port>/callback` (RFC 8252's loopback redirect)."""

    def __init__(self, port: int | None = None, *, show: Callable[[str, str], Any] = _say,
                 timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        self.port = port or _free_port()
        self.redirect_uri = f"http://127.0.0.1:{self.port}/callback"
        self.show, self.timeout_s = show, timeout_s
        self._lock = asyncio.Lock()

    async def authorize(self, url: str, *, server: str, realm: str = "default", user: str | None = None,
                        ctx: RunContext | None = None) -> tuple[str, str | None]:
        expected = parse_qs(urlparse(url).query).get("state", [None])[0]
        async with self._lock:  # one listener on the port at a time
            loop = asyncio.get_running_loop()
            came: asyncio.Future[tuple[str, str | None]] = loop.create_future()

            async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                try:
                    status, body = _callback((await reader.readline()).decode("latin-1"), expected, came)
                    writer.write(f"HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\n"
                                 f"Content-Length: {len(body.encode())}\r\nConnection: close\r\n\r\n{body}".encode())
                    await writer.drain()
                finally:
                    writer.close()

            listener = await asyncio.start_server(handle, "127.0.0.1", self.port)
            try:
                shown = self.show(url, server)
                if asyncio.iscoroutine(shown):
                    await shown
                async with asyncio.timeout(self.timeout_s):
                    return await came
            finally:
                listener.close()


def _callback(line: str, expected: str | None, came: asyncio.Future[tuple[str, str | None]]) -> tuple[str, str]:
    """The response to one request to the loopback listener; the awaited redirect settles `came`."""
    parts = line.split()
    target = urlparse(parts[1]) if len(parts) >= 2 and parts[0] == "GET" else None
    if target is None or target.path != "/callback":
        return "404 Not Found", "not the callback"
    query = {k: v[0] for k, v in parse_qs(target.query).items()}
    if came.done() or query.get("state") != expected:
        return "400 Bad Request", "no connection is waiting for this state (it was used, or never asked for)"
    if "error" in query:
        came.set_exception(PermissionError(f"the authorization server refused: {query['error']} "
                                           f"{query.get('error_description', '')}".strip()))
        return "200 OK", "Not connected: the authorization server refused. You can close this tab."
    if not query.get("code"):
        return "400 Bad Request", "the callback carries no code"
    came.set_result((query["code"], query.get("state")))
    return "200 OK", "Connected. You can close this tab and go back to ringlet."


@dataclass
class OAuthConnector:
    """Where tokens are kept (`vault`, sealed with `sealer`) and how users connect (`authorizer`)."""

    vault: TokenVault
    sealer: Sealer
    authorizer: Authorizer

    def auth(self, name: str, config: MCPServerConfig, *, realm: str, user: str | None,
             waiting: Callable[[], RunContext | None] = lambda: None) -> Any:
        """The SDK's OAuth client for one user's connection to server `name` (an httpx Auth); `waiting` gives
        the run that waits for the connection when the user is asked."""
        from mcp.client.auth import OAuthClientProvider
        from mcp.shared.auth import AuthorizationCodeResult, OAuthClientMetadata

        oauth = config.oauth
        assert oauth is not None
        assert config.url is not None
        storage: Any = UserTokens(self.vault, self.sealer, realm=realm, user=user, server=name)
        if oauth.client_id is not None:
            storage = _Registered(storage, oauth.client_id, oauth.client_secret, self.authorizer.redirect_uri)
        metadata = OAuthClientMetadata.model_validate({
            "client_name": oauth.client_name, "redirect_uris": [self.authorizer.redirect_uri],
            "grant_types": ["authorization_code", "refresh_token"], "response_types": ["code"],
            "scope": " ".join(oauth.scopes) if oauth.scopes else None,
            "token_endpoint_auth_method": "client_secret_post" if oauth.client_secret else "none"})
        asked: list[str] = []

        async def redirect(url: str) -> None:
            asked.append(url)

        async def callback() -> AuthorizationCodeResult:
            code, state = await self.authorizer.authorize(asked.pop(), server=name, realm=realm, user=user,
                                                             ctx=waiting())
            return AuthorizationCodeResult(code=code, state=state)

        return OAuthClientProvider(config.url, metadata, storage, redirect, callback)


class _Registered:
    """A client registered beforehand (`oauth.clientId`): its registration, never a dynamic one."""

    def __init__(self, inner: UserTokens, client_id: str, secret: str | None, redirect_uri: str) -> None:
        self.inner, self.client = inner, {"client_id": client_id, "client_secret": secret,
                                          "redirect_uris": [redirect_uri],
                                          "token_endpoint_auth_method": "client_secret_post" if secret else "none"}

    async def get_tokens(self) -> Any:
        return await self.inner.get_tokens()

    async def set_tokens(self, tokens: Any) -> None:
        await self.inner.set_tokens(tokens)

    async def get_client_info(self) -> Any:
        from mcp.shared.auth import OAuthClientInformationFull

        return await self.inner.get_client_info() or OAuthClientInformationFull.model_validate(self.client)

    async def set_client_info(self, client_info: Any) -> None:
        await self.inner.set_client_info(client_info)


class OAuthToolset(Toolset):
    """The tools of an MCP server behind OAuth: a session per (realm, user) of the runs that use it, each
    connected with that user's own tokens."""

    asks_while_listing = True
    """Listing its tools may ask the user to connect first: the run hands on that question at once."""

    def __init__(self, name: str, config: MCPServerConfig, connector: OAuthConnector) -> None:
        if config.oauth is None or config.url is None:
            raise ValueError(f"MCP server {name!r}: OAuthToolset is for an HTTP server with `oauth` settings")
        self.name, self.config, self.connector = name, config, connector
        self.label = f"MCP server {name!r}"
        self.description = config.description
        self.users: dict[tuple[str, str | None], MCPToolset] = {}
        self.latest: dict[tuple[str, str | None], RunContext] = {}
        """Each user's latest run using the server: the one a connection request is shown to."""

    def for_user(self, realm: str, user: str | None) -> MCPToolset:
        """The session (as a toolset) of one user of one realm, made on first use."""
        key = (realm, user)
        if key not in self.users:
            auth = self.connector.auth(self.name, self.config, realm=realm, user=user,
                                       waiting=lambda: self.latest.get(key))
            self.users[key] = MCPToolset(self.name, self.config, auth=auth, start_timeout_s=CONNECT_TIMEOUT_S)
        return self.users[key]

    async def list_tools(self, ctx: RunContext) -> Sequence[Tool]:
        self.latest[(ctx.realm, ctx.user_id)] = ctx
        return await self.for_user(ctx.realm, ctx.user_id).list_tools(ctx)

    def call_tool(self, tool: Tool, args: dict[str, Any], ctx: RunContext) -> Any:
        self.latest[(ctx.realm, ctx.user_id)] = ctx  # the call's context: it can show a question live
        return tool.run(args, ctx)

    async def aclose(self) -> None:
        for toolset in self.users.values():
            await toolset.aclose()


def toolset_for(name: str, config: MCPServerConfig) -> Toolset:
    """The toolset of a server from mcp.json: an `OAuthToolset` when it has `oauth` settings (tokens sealed in
    `$RINGLET_DATA_DIR/mcp-tokens` with `RINGLET_MCP_TOKEN_KEY`; users connect through the loopback
    redirect, the URL printed), else an `MCPToolset`."""
    if config.oauth is None:
        return MCPToolset(name, config)
    key = os.environ.get("RINGLET_MCP_TOKEN_KEY", "")
    if not key:
        raise ConfigError(f"MCP server {name!r} is behind OAuth: set RINGLET_MCP_TOKEN_KEY to the key its tokens "
                          "are encrypted with (make one: python -c \"from ringlet.mcp.tokens import new_key; "
                          "print(new_key())\")")
    folder = Path(os.environ.get("RINGLET_DATA_DIR", "~/.local/share/ringlet")).expanduser() / "mcp-tokens"
    connector = OAuthConnector(FileVault(folder), Sealer(key), LoopbackAuthorizer(config.oauth.callback_port))
    return OAuthToolset(name, config, connector)
