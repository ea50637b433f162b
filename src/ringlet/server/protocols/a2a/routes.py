"""The A2A routes: each agent's card, and its JSON-RPC endpoint (the SDK's) behind ringlet's auth. A call
answered with an SSE stream holds a place among its key's open streams, and ends once its key is revoked
or expires, as every other stream does."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from a2a.server.agent_execution import SimpleRequestContextBuilder
from a2a.server.context import ServerCallContext
from a2a.server.routes import DefaultServerCallContextBuilder, create_jsonrpc_routes
from a2a.types.a2a_pb2 import AgentCard
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ringlet.server.catalog import Hosted
from ringlet.server.http import sse
from ringlet.server.http.limits import Slot, hold_stream
from ringlet.server.protocols.a2a.caller import Caller, caller_of
from ringlet.server.protocols.a2a.card import agent_card, card_route
from ringlet.server.protocols.a2a.executor import RingletExecutor
from ringlet.server.protocols.a2a.handler import RunTaskHandler
from ringlet.server.protocols.a2a.tasks import Ids, RunTasks

PREFIX = "/a2a/{agent}"
CARD_PATH = PREFIX + AGENT_CARD_WELL_KNOWN_PATH
IDLE_RELEASE_S = 300.0
"""A task parked in input-required keeps its SDK state in memory this long; a later answer rebuilds it."""
STREAMING = frozenset({"SendStreamingMessage", "SubscribeToTask", "message/stream", "tasks/resubscribe"})
"""The JSON-RPC methods answered with an SSE stream (held among the key's open streams, as the native ones)."""


def install(app: FastAPI) -> None:
    """Add the card and JSON-RPC routes. They are plain Starlette routes: A2A documents itself by its
    cards, and a JSON-RPC envelope in the OpenAPI document would only give schemathesis an RPC to fuzz."""
    handler = RunTaskHandler(agent_executor=RingletExecutor(), task_store=RunTasks(), agent_card=_card_template(),
                             request_context_builder=SimpleRequestContextBuilder(
                                 task_id_generator=Ids("r"), context_id_generator=Ids("c")),
                             interrupted_task_timeout=IDLE_RELEASE_S)
    for route in create_jsonrpc_routes(handler, PREFIX, context_builder=_Contexts(), enable_v0_3_compat=True):
        assert isinstance(route, Route)
        endpoint = _guarded(route.endpoint)
        for path in (route.path, route.path.rstrip("/") + "/"):  # with a trailing slash too: answered, not
            app.router.routes.append(Route(path, endpoint, methods=["POST"]))  # 307 (not followed on POST)
    app.router.routes.append(Route(CARD_PATH, card_route, methods=["GET"]))


def _card_template() -> AgentCard:
    """What the SDK's handler checks of a card (streaming on, push notifications off)."""
    return agent_card(Hosted("ringlet", "loop", "ringlet agents"), PREFIX)


def _guarded(endpoint: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """The SDK's JSON-RPC endpoint behind ringlet's auth: 401/403/404 come as the native API's errors."""

    async def guarded(request: Request) -> Any:
        request.state.ringlet_a2a = await caller_of(request)
        try:
            call = json.loads(await request.body())
        except RecursionError:  # the SDK would answer 500: it is bad input, said as JSON-RPC says it
            return JSONResponse({"jsonrpc": "2.0", "id": None, "error": {
                "code": -32700, "message": "Parse error: the request is nested too deeply"}}, status_code=400)
        except ValueError:
            call = None  # not JSON: the SDK answers with its parse error
        streams = isinstance(call, dict) and call.get("method") in STREAMING
        slot = hold_stream() if streams else None  # 429 before any run starts
        try:
            response = await endpoint(request)
        except BaseException:
            if slot is not None:
                slot.release()
            raise
        if slot is None:
            return response
        gone = {"jsonrpc": "2.0", "id": call.get("id") if isinstance(call, dict) else None, "error": {
            "code": -32600, "message": "unauthorized: the API key of this stream was revoked or has expired"}}
        found: Caller = request.state.ringlet_a2a
        return _Held(response, slot, **sse.keyed(found.runs.settings, found.runs.records.keys, found.principal.key_id,
                                                 sse.encode("message", json.dumps(gone))))

    return guarded


@dataclass(eq=False)
class _Held:
    """A streamed response that holds a place among its key's open streams until it has been sent, however it
    ends; with `still_valid` it ends with that frame once its key is revoked or expires (`sse.keyed`), as
    every other stream does."""

    response: Response
    slot: Slot
    still_valid: Callable[[], Awaitable[bytes | None]] | None = None
    every: float = 0.0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            if self.still_valid is None:
                await self.response(scope, receive, send)
                return
            await self._checked(scope, receive, send, self.still_valid)
        finally:
            self.slot.release()

    async def _checked(self, scope: Scope, receive: Receive, send: Send,
                       still_valid: Callable[[], Awaitable[bytes | None]]) -> None:
        started = False

        async def sending(message: Any) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        sent = asyncio.ensure_future(self.response(scope, receive, sending))
        try:
            while not (await asyncio.wait({sent}, timeout=self.every))[0]:
                last = await still_valid()
                if last is not None and started:
                    sent.cancel()
                    await asyncio.gather(sent, return_exceptions=True)
                    await send({"type": "http.response.body", "body": last, "more_body": False})
                    return
            sent.result()
        finally:
            sent.cancel()


class _Contexts(DefaultServerCallContextBuilder):
    """The SDK's call context, carrying the route's `Caller`."""

    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        context.state["ringlet"] = request.state.ringlet_a2a
        return context
