"""Bearer API keys with scopes, realms and agents (`server-contract.md` §1).

`Principal` is who a request runs as. Routes declare the scope they need with `Depends(need("chat"))`;
realm and agent checks happen where the realm or agent is known (`principal.check_realm(...)`).
Every authenticated request is charged to its key's request rate (`limits.py`): 429 past it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ringlet.server.http.errors import ApiError
from ringlet.store.records import ApiKey

_bearer = HTTPBearer(auto_error=False, description="An API key from `ringlet keys create`.")
_CHALLENGE = {"WWW-Authenticate": "Bearer"}
Bearer = Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)]


@dataclass(frozen=True, slots=True)
class Principal:
    key_id: str
    user_id: str
    org_id: str
    roles: tuple[str, ...]
    scopes: frozenset[str]
    realms: frozenset[str] | None
    """None: every realm."""
    agents: frozenset[str] | None
    """None: every agent."""

    @classmethod
    def of(cls, key: ApiKey) -> Principal:
        return cls(key_id=key.id, user_id=key.user_id, org_id=key.org_id, roles=tuple(key.roles),
                   scopes=frozenset(key.scopes), realms=None if key.realms == "*" else frozenset(key.realms),
                   agents=None if key.agents == "*" else frozenset(key.agents))

    def may_use(self, agent: str) -> bool:
        return self.agents is None or agent in self.agents

    def sees(self, realm: str) -> bool:
        return self.realms is None or realm in self.realms

    def check_realm(self, realm: str) -> None:
        if not self.sees(realm):
            raise ApiError(403, "realm_forbidden", f"this API key has no access to realm {realm!r}")

    @property
    def only_realm(self) -> str | None:
        """The key's realm when it has exactly one (where its new conversations go by default)."""
        return next(iter(self.realms)) if self.realms is not None and len(self.realms) == 1 else None

    def check_agent(self, agent: str) -> None:
        if not self.may_use(agent):
            raise ApiError(403, "forbidden", f"this API key may not use agent {agent!r}")

    def check_scope(self, scope: str) -> None:
        if scope not in self.scopes:
            raise ApiError(403, "forbidden", f"this API key lacks the {scope!r} scope")


LOCAL = Principal(key_id="local", user_id="local", org_id="local", roles=("admin",),
                  scopes=frozenset({"chat", "approve", "trigger", "admin", "metrics"}), realms=None, agents=None)


async def authenticate(request: Request, credentials: HTTPAuthorizationCredentials | None, *,
                       stream_token: str | None = None) -> Principal:
    """The request's principal: from its bearer key (or a one-use stream token); 401 otherwise. The
    request counts against the key's request rate (429 `rate_limited` past it)."""
    app = request.app.state.ringlet
    if app.settings.auth_mode == "none":
        return _admitted(request, LOCAL)
    keys = app.store.keys
    if stream_token:
        key_id = await keys.redeem_stream_token(stream_token)
        record = await keys.get(key_id) if key_id else None
        if record is None:
            raise ApiError(401, "unauthorized", "the stream token is unknown, used or expired; get a new one from "
                           "POST /api/v1/stream-tokens", headers=_CHALLENGE)
        return _admitted(request, Principal.of(record))
    if credentials is None:
        raise ApiError(401, "unauthorized", "missing API key: send `Authorization: Bearer rk_…` "
                       "(create one with `ringlet keys create`)", headers=_CHALLENGE)
    record = await keys.verify(credentials.credentials)
    if record is None:
        raise ApiError(401, "unauthorized", "the API key is unknown, revoked or expired", headers=_CHALLENGE)
    return _admitted(request, Principal.of(record))


def _admitted(request: Request, principal: Principal) -> Principal:
    """Charge the request to its key's rate, once however often it is authenticated; 429 past the rate."""
    if getattr(request.state, "ringlet_admitted", None) != principal.key_id:
        request.app.state.ringlet.runs.limits.admit(principal.key_id)
        request.state.ringlet_admitted = principal.key_id
    return principal


def need(scope: str) -> Callable[..., Awaitable[Principal]]:
    """A dependency: the authenticated principal, which must hold `scope`."""

    async def dependency(request: Request, credentials: Bearer) -> Principal:
        principal = await authenticate(request, credentials)
        principal.check_scope(scope)
        return principal

    dependency.__name__ = f"need_{scope}"
    return dependency
