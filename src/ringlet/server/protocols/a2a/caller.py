"""Who calls which agent: the route checks the key (`caller_of`) and puts a `Caller` into the SDK's call
context, where the executor and the task store read it (`caller`)."""

from __future__ import annotations

from dataclasses import dataclass

from a2a.server.context import ServerCallContext
from a2a.utils.errors import InvalidRequestError
from fastapi.security import HTTPAuthorizationCredentials
from fastapi.security.utils import get_authorization_scheme_param
from starlette.requests import Request

from ringlet.server.catalog import Hosted
from ringlet.server.http.auth import Principal, authenticate
from ringlet.server.http.errors import ApiError
from ringlet.server.runs.service import Runs


@dataclass(frozen=True)
class Caller:
    """Who calls which agent: put into the SDK's call context by the route, read by the executor and store."""

    runs: Runs
    principal: Principal
    hosted: Hosted


def caller(context: ServerCallContext) -> Caller:
    found = context.state.get("ringlet")
    if not isinstance(found, Caller):
        raise InvalidRequestError(message="no ringlet caller on this request")
    return found


async def caller_of(request: Request) -> Caller:
    """The request's caller: a valid key with the `chat` scope that may use the path's agent. An agent the
    key may not use is 404, the same as an unknown one, as for conversations (nothing leaks)."""
    runs: Runs = request.app.state.ringlet.runs
    principal = await authenticate(request, _bearer(request))
    principal.check_scope("chat")
    name = request.path_params["agent"]
    hosted = runs.catalog.hosted.get(name)
    if hosted is None or not hosted.runnable_by(principal):
        raise ApiError(404, "agent_not_found", f"no agent named {name!r}; GET /api/v1/agents lists them")
    return Caller(runs, principal, hosted)


def _bearer(request: Request) -> HTTPAuthorizationCredentials | None:
    scheme, token = get_authorization_scheme_param(request.headers.get("authorization"))
    return HTTPAuthorizationCredentials(scheme=scheme, credentials=token) if scheme.lower() == "bearer" and token \
        else None
