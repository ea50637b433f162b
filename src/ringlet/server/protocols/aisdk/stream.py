"""The SSE response of a chat request: the UI message stream (`x-vercel-ai-ui-message-stream: v1`), one
`data:` line of JSON per chunk, `: ping` comments while the run is busy, and `data: [DONE]` at its end. The
key is checked again as on every native stream; a client that leaves (`stop()` aborts its fetch) cancels
the run."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request

from ringlet.server.http import sse
from ringlet.server.http.auth import Principal
from ringlet.server.http.limits import Slot
from ringlet.server.protocols.aisdk import runs
from ringlet.server.protocols.aisdk.chunks import Chunks, frame
from ringlet.server.runs.service import Runs, runs_of

PING = b": ping\n\n"
DONE = b"data: [DONE]\n\n"
HEADERS = {"x-vercel-ai-ui-message-stream": "v1", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class Followed:
    """The frames of one run, to its end or pause; `left()` cancels the run when the client went away
    before its end."""

    def __init__(self, service: Runs, cid: str, run_id: str, after: int) -> None:
        self.service, self.cid, self.run_id, self.after = service, cid, run_id, after
        self.done = False

    def left(self) -> None:
        if not self.done:
            runs.cancel(self.service, self.cid)

    async def frames(self) -> AsyncIterator[bytes]:
        chunks = Chunks(run_id=self.run_id, conversation_id=self.cid)
        for chunk in chunks.start():
            yield frame(chunk)
        async for item in runs.events(self.service, self.cid, self.run_id, self.after):
            if item is None:
                yield PING
                continue
            for chunk in chunks.feed(item.type, json.loads(item.data)):
                yield frame(chunk)
            if chunks.ending is not None:
                break
        self.done = True  # the run ended or paused: nothing left to cancel
        for chunk in [*chunks.closing(), *chunks.end(await runs.pending(self.service, self.cid))]:
            yield frame(chunk)
        yield DONE


async def idle(cid: str) -> AsyncIterator[bytes]:
    """A request with nothing new to run (a client reconnecting): an empty message."""
    yield frame({"type": "start", "messageMetadata": {"ringlet": {"conversation_id": cid}}})
    yield frame({"type": "finish", "finishReason": "other"})
    yield DONE


def response(request: Request, principal: Principal, frames: AsyncIterator[bytes], slot: Slot | None,
             followed: Followed | None = None) -> Any:
    """The stream response, rechecking the key every `auth_recheck_s`; a revoked or expired key ends it
    with an `error` chunk `unauthorized`."""
    gone = frame({"type": "error", "errorText": "unauthorized: the API key of this stream was revoked or has "
                                                "expired"}) + DONE
    service = runs_of(request)
    checks = sse.keyed(service.settings, service.records.keys, principal.key_id, gone)
    return sse.response(frames, slot, headers=HEADERS, on_left=followed.left if followed else None, **checks)
