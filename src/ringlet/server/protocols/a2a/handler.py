"""The SDK's request handler, but a task is cancelled the way the native API cancels its run: in whichever
process holds it, from any process, then read back from the store; and a stream opens with the task.

**A stream opens with the Task.** A2A 1.0: the first event of a `SendStreamingMessage` stream is the `Task`
(or a `Message`), then status and artifact updates. The executor's first update (the task's `working`
status, or `input-required` again when an answer was not taken) goes out as the task itself: read from
ringlet's records with that status, without the answer artifact, which the updates that follow stream.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator

from a2a.server.context import ServerCallContext
from a2a.server.events import Event
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    Message,
    SendMessageRequest,
    Task,
    TaskArtifactUpdateEvent,
    TaskStatusUpdateEvent,
)
from a2a.utils.errors import TaskNotCancelableError, TaskNotFoundError

from ringlet.server.protocols.a2a.caller import caller
from ringlet.server.protocols.a2a.errors import hidden
from ringlet.server.protocols.a2a.tasks import ENDED, task_of, visible_run
from ringlet.server.runs.service import Runs
from ringlet.store.records import RunRecord

log = logging.getLogger("ringlet.server")
CANCEL_WAIT_S = 30.0
"""How long `CancelTask` waits for the cancelled run to end before it answers with the task as it stands."""


class RunTaskHandler(DefaultRequestHandler):  # type: ignore[misc]
    """The SDK's handler, but a task is cancelled the way the native API cancels its run (in whichever
    process holds it, from any process), then read back from the store."""

    @hidden
    async def on_cancel_task(self, params: CancelTaskRequest, context: ServerCallContext) -> Task | None:
        found = caller(context)
        record = await visible_run(found, params.id)
        if record is None:
            raise TaskNotFoundError
        if record.status in ENDED:
            raise TaskNotCancelableError(message=f"task {params.id} has ended ({record.status})")
        await cancel_run(found.runs, record)
        ended = await found.runs.records.runs.get(params.id)
        assert ended is not None
        return await task_of(found.runs, ended)

    async def on_message_send_stream(self, params: SendMessageRequest,
                                     context: ServerCallContext) -> AsyncGenerator[Event, None]:
        """The SDK's stream, opening with the task (A2A 1.0's first-event rule)."""
        first = True
        async for event in super().on_message_send_stream(params, context):
            opens, first = first, False
            if opens and not isinstance(event, Task | Message):
                yield await _opening(context, event)
                if isinstance(event, TaskStatusUpdateEvent):
                    continue  # the task carries this status
            yield event


@hidden
async def _opening(context: ServerCallContext, event: TaskStatusUpdateEvent | TaskArtifactUpdateEvent) -> Task:
    """The task a stream opens with: as ringlet's records have it, with the status of the update it stands for
    (a status update's), and no artifacts yet (the updates after it stream the answer)."""
    found = caller(context)
    record = await visible_run(found, event.task_id)
    task = await task_of(found.runs, record) if record is not None else \
        Task(id=event.task_id, context_id=event.context_id)
    task.context_id = event.context_id or task.context_id
    del task.artifacts[:]
    if isinstance(event, TaskStatusUpdateEvent):
        task.status.CopyFrom(event.status)
    return task


async def cancel_run(runs: Runs, record: RunRecord) -> None:
    """`POST …/cancel` for the run's conversation, then wait for the run's end (its `message_end`), at most
    `CANCEL_WAIT_S`; the task is then read back as it stands."""
    cid, run_id = record.conversation_id or "", record.id  # a task's run has a conversation (`visible_run`)
    with runs.subscribe(cid) as subscriber:
        if (await runs.cancel(cid)) != run_id:
            raise TaskNotCancelableError(message=f"task {run_id} is not active in any process that can cancel it")
        try:  # bounded: a run that another process must end (or a closing server) never holds the request
            async with asyncio.timeout(CANCEL_WAIT_S):
                async for _ in runs.items(subscriber, cid, after=0, run_id=run_id):
                    pass
        except TimeoutError:
            log.warning("task %s: cancelled, but its run had not ended after %g s", run_id, CANCEL_WAIT_S)
