"""An MCP server behind OAuth 2.1, to try the flow (and for the tests): the official SDK's `MCPServer` with
its server-side auth (the authorization server's routes: metadata, dynamic client registration, authorize,
token with PKCE, refresh, revoke; protected-resource metadata and bearer checks on /mcp), over an in-memory
provider written here.

    python examples/mcp_oauth_server.py PORT [TTL]     # TTL: access tokens' lifetime in seconds (default 3600)

The provider's `authorize` sends the browser to `/login?pending=…`, the resource owner's sign-in and consent
page (a form asking for a user name): a GET with `&user=NAME` signs NAME in and redirects to the client's
redirect URI with the code and state. Tool `whoami` says whose token the call carries. Test controls (no
auth): `POST /admin/fail-refresh` (every refresh is refused from then on), `POST /admin/revoke?user=NAME`
(NAME's access tokens stop working).
"""

from __future__ import annotations

import html
import secrets
import sys
import time

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    RefreshToken,
    construct_redirect_uri,
)
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions, RevocationOptions
from mcp.server.mcpserver import MCPServer
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

PORT = int(sys.argv[1])
TTL = int(sys.argv[2]) if len(sys.argv) > 2 else 3600
BASE = f"http://127.0.0.1:{PORT}"


class Provider:
    """Clients, codes and tokens in memory; a code is good once, a refresh token rotates."""

    def __init__(self) -> None:
        self.clients: dict[str, OAuthClientInformationFull] = {}
        self.pending: dict[str, tuple[str, AuthorizationParams]] = {}
        self.codes: dict[str, AuthorizationCode] = {}
        self.access: dict[str, AccessToken] = {}
        self.refresh: dict[str, RefreshToken] = {}
        self.refuse_refresh = False

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        return self.clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        assert client_info.client_id is not None
        self.clients[client_info.client_id] = client_info

    async def authorize(self, client: OAuthClientInformationFull, params: AuthorizationParams) -> str:
        pending = secrets.token_urlsafe(16)
        assert client.client_id is not None
        self.pending[pending] = (client.client_id, params)
        return f"{BASE}/login?pending={pending}"

    def sign_in(self, pending: str, user: str) -> str:
        client_id, params = self.pending.pop(pending)
        code = secrets.token_urlsafe(24)
        self.codes[code] = AuthorizationCode(
            code=code, scopes=params.scopes or ["files"], expires_at=time.time() + 300, client_id=client_id,
            code_challenge=params.code_challenge, redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly, resource=params.resource,
            subject=user)
        return construct_redirect_uri(str(params.redirect_uri), code=code, state=params.state)

    async def load_authorization_code(self, client: OAuthClientInformationFull, code: str) -> AuthorizationCode | None:
        return self.codes.get(code)

    async def exchange_authorization_code(self, client: OAuthClientInformationFull,
                                          code: AuthorizationCode) -> OAuthToken:
        del self.codes[code.code]  # good once
        return self._issue(client.client_id or "", code.scopes, code.resource, code.subject)

    async def load_refresh_token(self, client: OAuthClientInformationFull, refresh_token: str) -> RefreshToken | None:
        return None if self.refuse_refresh else self.refresh.get(refresh_token)

    async def exchange_refresh_token(self, client: OAuthClientInformationFull, refresh_token: RefreshToken,
                                     scopes: list[str]) -> OAuthToken:
        del self.refresh[refresh_token.token]  # rotated
        return self._issue(client.client_id or "", scopes or refresh_token.scopes, refresh_token.resource,
                           refresh_token.subject)

    async def load_access_token(self, token: str) -> AccessToken | None:
        found = self.access.get(token)
        if found is None or (found.expires_at is not None and found.expires_at < time.time()):
            return None
        return found

    async def revoke_token(self, token: AccessToken | RefreshToken) -> None:
        self.access.pop(token.token, None)
        self.refresh.pop(token.token, None)

    def _issue(self, client_id: str, scopes: list[str], resource: str | None, subject: str | None) -> OAuthToken:
        access, refresh = f"at_{secrets.token_urlsafe(24)}", f"rt_{secrets.token_urlsafe(24)}"
        self.access[access] = AccessToken(token=access, client_id=client_id, scopes=scopes,
                                          expires_at=int(time.time()) + max(TTL, 60), resource=resource,
                                          subject=subject)
        self.refresh[refresh] = RefreshToken(token=refresh, client_id=client_id, scopes=scopes, resource=resource,
                                             subject=subject)
        return OAuthToken(access_token=access, token_type="Bearer", expires_in=TTL, refresh_token=refresh,
                          scope=" ".join(scopes))


provider = Provider()
server = MCPServer(
    "files", auth_server_provider=provider,
    auth=AuthSettings(issuer_url=BASE, resource_server_url=f"{BASE}/mcp", required_scopes=["files"],
                      client_registration_options=ClientRegistrationOptions(enabled=True, valid_scopes=["files"],
                                                                            default_scopes=["files"]),
                      revocation_options=RevocationOptions(enabled=True)))


@server.tool()
async def whoami() -> str:
    """Whose token this call carries."""
    token = get_access_token()
    return f"signed in as {token.subject if token else 'nobody'}"


@server.custom_route("/login", methods=["GET"])
async def login(request: Request) -> Response:
    pending, user = request.query_params.get("pending", ""), request.query_params.get("user", "")
    if pending not in provider.pending:
        return JSONResponse({"error": "unknown sign-in"}, status_code=400)
    if not user:  # the sign-in page a browser shows
        return HTMLResponse(f"""<!doctype html><title>Sign in to files</title><form action="/login">
<input type="hidden" name="pending" value="{html.escape(pending)}"><label>User <input name="user"></label>
<button>Sign in and allow ringlet</button></form>""")
    return RedirectResponse(provider.sign_in(pending, user), status_code=302)


@server.custom_route("/admin/fail-refresh", methods=["POST"])
async def fail_refresh(request: Request) -> Response:
    provider.refuse_refresh = True
    return JSONResponse({"ok": True})


@server.custom_route("/admin/revoke", methods=["POST"])
async def revoke(request: Request) -> Response:
    user = request.query_params.get("user")
    for token in [t for t in provider.access.values() if t.subject == user]:
        del provider.access[token.token]
    return JSONResponse({"ok": True})


@server.custom_route("/admin/tokens", methods=["GET"])
async def tokens(request: Request) -> Response:
    """The access and refresh tokens issued and still valid, with their users (for the test that looks for
    them elsewhere)."""
    return JSONResponse({t.token: t.subject for t in [*provider.access.values(), *provider.refresh.values()]})


server.run("streamable-http", host="127.0.0.1", port=PORT)
