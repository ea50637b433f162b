"""The SSE stream of an AG-UI run: RUN_STARTED, the run's events translated (from its log, then live, with
`: ping` comments while it is busy), then the thread's transcript and the run's end; the key is checked
again as on every native stream."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from ag_ui.core import (
    BaseEvent,
    MessagesSnapshotEvent,
    RunErrorEvent,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    RunStartedEvent,
)
from ag_ui.encoder import EventEncoder
from fastapi import Request

from ringlet.server.http import sse
from ringlet.server.http.auth import Principal
from ringlet.server.http.limits import Slot
from ringlet.server.protocols.agui.graph_state import GraphState
from ringlet.server.protocols.agui.interrupts import interrupt_of
from ringlet.server.protocols.agui.transcript import transcript
from ringlet.server.protocols.agui.translator import Translator, ringlet_run
from ringlet.server.protocols.events import ask_event, nested
from ringlet.server.runs.service import Runs, runs_of

PING = b": ping\n\n"
_ENCODER = EventEncoder()


def frame(event: BaseEvent) -> bytes:
    return _ENCODER.encode(event).encode()


def authorized(request: Request, principal: Principal, frames: AsyncIterator[bytes], slot: Slot | None) -> Any:
    """The SSE response, rechecking the key every `auth_recheck_s` like the native streams (chat.py); a
    revoked or expired key ends it with RUN_ERROR `unauthorized`."""
    gone = frame(RunErrorEvent(message="the API key of this stream was revoked or has expired", code="unauthorized"))
    runs = runs_of(request)
    return sse.response(frames, slot, **sse.keyed(runs.settings, runs.records.keys, principal.key_id, gone))


async def frames(runs: Runs, cid: str, thread_id: str, run_id: str, client_run: str, after: int, *,
                 graph: bool) -> AsyncIterator[bytes]:
    """RUN_STARTED, the run's events translated (from the log and live), then the transcript and the end."""
    encoder = Translator(thread_id=thread_id, run_id=run_id, client_run=client_run)
    state = GraphState(runs, run_id) if graph else None
    yield frame(RunStartedEvent(thread_id=thread_id, run_id=client_run, metadata=ringlet_run(run_id)))
    with runs.subscribe(cid) as subscriber:
        async for item in runs.items(subscriber, cid, after=after, run_id=run_id):
            if item is None:
                yield PING
                continue
            payload = json.loads(item.data)
            if state is not None and item.type == "node_start" and not nested(payload):
                for event in await state.sync():
                    yield frame(event)
            for event in encoder.feed(item.type, payload):
                yield frame(event)
            if encoder.resync:  # an abandoned attempt's text and calls are withdrawn: the stored transcript
                encoder.resync = False
                yield frame(MessagesSnapshotEvent(messages=transcript(
                    await runs.records.conversations.load_messages(cid))))
            if encoder.ending is not None:
                break
    for event in encoder.closing():  # nothing left open before the end, on every path
        yield frame(event)
    if state is not None:
        for event in await state.sync():
            yield frame(event)
    yield frame(MessagesSnapshotEvent(messages=transcript(await runs.records.conversations.load_messages(cid))))
    yield frame(await encoder.end(runs))


async def synced(runs: Runs, cid: str, thread_id: str, run_id: str) -> AsyncIterator[bytes]:
    """A run with nothing new to do: the thread's transcript, and its pending interrupts if it waits."""
    yield frame(RunStartedEvent(thread_id=thread_id, run_id=run_id))
    yield frame(MessagesSnapshotEvent(messages=transcript(await runs.records.conversations.load_messages(cid))))
    pending = await runs.records.approvals.list(conversation_id=cid, status="pending")
    interrupts = [interrupt_of(*ask_event(r)) for r in pending]
    outcome = RunFinishedInterruptOutcome(interrupts=interrupts) if interrupts else None
    yield frame(RunFinishedEvent(thread_id=thread_id, run_id=run_id, outcome=outcome))
