"""The agent's card (`GET /a2a/{agent}/.well-known/agent-card.json`): where its JSON-RPC endpoint is, one
skill, streaming, and ringlet API keys as bearer tokens."""

from __future__ import annotations

from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    HTTPAuthSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    StringList,
)
from a2a.utils.constants import PROTOCOL_VERSION_1_0, TransportProtocol
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ringlet.server.catalog import Hosted
from ringlet.server.protocols.a2a.caller import caller_of


async def card_route(request: Request) -> Response:
    found = await caller_of(request)
    rpc = f"{public_base(request)}/a2a/{found.hosted.name}"
    return JSONResponse(agent_card_to_dict(agent_card(found.hosted, rpc)))


def public_base(request: Request) -> str:
    """Where clients reach this server: the `public_url` setting, else the local address the request arrived
    on (the socket's, which a client cannot forge, unlike the `Host` header)."""
    configured = request.app.state.ringlet.settings.public_url
    if configured:
        return configured.rstrip("/")
    host, port = request.scope.get("server") or ("127.0.0.1", 80)
    host = f"[{host}]" if ":" in host else host
    scheme = request.scope.get("scheme", "http")
    default = (scheme, port) in (("http", 80), ("https", 443))
    return f"{scheme}://{host}" + ("" if default else f":{port}")


def agent_card(hosted: Hosted, rpc_url: str) -> AgentCard:
    """The agent's card: its JSON-RPC endpoint, one skill from its description and starters, streaming,
    and ringlet API keys as bearer tokens."""
    about = hosted.description or f"the ringlet agent {hosted.name}"
    return AgentCard(
        name=hosted.name, description=about, version=_version(),
        supported_interfaces=[AgentInterface(url=rpc_url, protocol_binding=TransportProtocol.JSONRPC.value,
                                             protocol_version=PROTOCOL_VERSION_1_0)],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        security_schemes={"bearer": SecurityScheme(http_auth_security_scheme=HTTPAuthSecurityScheme(
            scheme="bearer", bearer_format="ringlet API key (rk_…)",
            description="An API key from `ringlet keys create`, with the chat scope (approve to decide approvals)"))},
        security_requirements=[SecurityRequirement(schemes={"bearer": StringList(list=[])})],
        default_input_modes=["text/plain", "application/json"], default_output_modes=["text/plain"],
        skills=[AgentSkill(id=hosted.name, name=hosted.name, description=about, tags=["ringlet", hosted.kind],
                           examples=list(hosted.conversation_starters))])


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ringlet")
    except PackageNotFoundError:
        return "0"
