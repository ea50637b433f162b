"""CPU per event stream of `ringlet serve`'s SSE response, in process: 2,000 streams of 22 frames each
through the response class against an ASGI `send` that yields, medians of 5.

    .venv/bin/python bench/sse_response.py src                 # this checkout
    git worktree add -f /tmp/base d1f7445 && .venv/bin/python bench/sse_response.py /tmp/base/src

Works with both the `sse_starlette` response (d1f7445 and before) and the lean `sse.Stream` after it.
"""

from __future__ import annotations

import asyncio
import importlib
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

N_FRAMES, N_STREAMS, RUNS = 22, 2000, 5
DATA = '{"delta":"x","run_id":"r"}'


async def one(sse: Any, make: Callable[[int], Any]) -> None:
    gone = asyncio.Event()

    async def receive() -> dict[str, str]:
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message.get("more_body"):
            await asyncio.sleep(0)

    async def frames() -> AsyncIterator[Any]:
        for i in range(N_FRAMES):
            await asyncio.sleep(0)
            yield make(i)

    lean = hasattr(sse, "Stream")
    response = sse.response(frames(), None) if lean else sse._Counted(frames(), ping=0, send_timeout=60)
    await response({"type": "http", "method": "GET"}, receive, send)


async def main(src: str) -> None:
    sys.path.insert(0, src)
    sse = importlib.import_module("ringlet.server.http.sse")
    sse.hold_stream = lambda: None  # no request context here: no per-key stream slots

    def make(i: int) -> Any:
        if hasattr(sse, "Stream"):
            return sse.encode("content_delta", DATA, str(i))
        return sse.ServerSentEvent(data=DATA, event="content_delta", id=str(i))

    out = []
    for _ in range(RUNS):
        started = time.process_time()
        await asyncio.gather(*(one(sse, make) for _ in range(N_STREAMS)))
        out.append((time.process_time() - started) / N_STREAMS * 1e6)
    print(f"{src}: {statistics.median(out):.0f} µs of CPU per stream of {N_FRAMES} frames (median of {RUNS})")


if __name__ == "__main__":
    import uvloop

    uvloop.run(main(sys.argv[1] if len(sys.argv) > 1 else "src"))
