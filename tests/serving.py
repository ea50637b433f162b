"""Run a ringlet app on a real loopback socket inside the test's event loop.

The socket is bound and listening before the server starts, and `serving` yields once the app's startup
has completed (its lifespan says so; at most STARTUP_S): a client's first request is answered at once,
never left in the backlog to meet its own connect timeout on a busy machine. No polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import uvicorn

STARTUP_S = 60.0
"""How long an app may take to start (a busy machine's clean-clone run took more than httpx's 5 s)."""
CLIENT_TIMEOUT_S = 30.0
"""A generous per-request timeout for test clients of a served app (`httpx.AsyncClient(timeout=…)`)."""


def _started(app: Any, started: asyncio.Event) -> Any:
    """`app`, setting `started` when its lifespan startup has completed (or failed)."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            return await app(scope, receive, send)

        async def sending(message: Any) -> None:
            await send(message)
            if message["type"] in ("lifespan.startup.complete", "lifespan.startup.failed"):
                started.set()

        return await app(scope, receive, sending)

    return wrapped


@asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # TCP: asyncio sets TCP_NODELAY
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)
    started = asyncio.Event()
    server = uvicorn.Server(uvicorn.Config(_started(app, started), log_level="warning", lifespan="on",
                                          timeout_graceful_shutdown=5))
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]  # pytest keeps Ctrl-C
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        waiting = asyncio.create_task(started.wait())
        done, _ = await asyncio.wait({waiting, task}, timeout=STARTUP_S, return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        if not done:
            raise TimeoutError(f"the app did not start within {STARTUP_S:g} s")
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
        sock.close()


def openai_model(reply: Callable[[list[dict[str, Any]]], list[dict[str, Any]]], *,
                 hang: bool | Callable[[list[dict[str, Any]]], bool] = False) -> Any:
    """A streaming OpenAI-compatible `/v1/chat/completions` endpoint (a real HTTP server for subprocess
    tests): `reply(messages)` gives the deltas of one answer; with `hang` (or when `hang(messages)`), the
    stream then stalls instead of ending (a provider that stops mid-answer)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    async def completions(request: Request) -> StreamingResponse:
        messages = (await request.json())["messages"]
        deltas, stalls = reply(messages), hang(messages) if callable(hang) else hang

        async def chunks() -> AsyncIterator[str]:
            for delta in deltas:
                chunk = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m",
                         "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
                yield f"data: {json.dumps(chunk)}\n\n"
            if stalls:
                await asyncio.Event().wait()
            yield "data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])
