"""A run's events as task updates, until the run pauses for a human or ends. The run's own events are read
by the shared `RunReader` (`protocols/events.py`; a graph's nodes stream its answer too); this maps them:
every piece of answer text is appended to the one `answer` artifact (the first replaces it; text
retracted replaces it with the answer without that text), a pause (the
run's, or a sub-agent's: its requests are answered through this task) is `input-required` saying what is
asked, and the run's end is the final answer and the task's last state, read back from the stored run."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from a2a.helpers.proto_helpers import new_text_part
from a2a.server.events import EventQueue
from a2a.types.a2a_pb2 import (
    Artifact,
    Message,
    Role,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from a2a.utils.errors import InternalError

from ringlet._ids import new_id
from ringlet.server.protocols.a2a.asks import asking, pending_asks
from ringlet.server.protocols.a2a.tasks import ANSWER_ID, task_of
from ringlet.server.protocols.events import Retraction, RunReader, pauses
from ringlet.server.runs.service import Runs


@dataclass(eq=False)
class Follow:
    """One execute's view of the run it follows: what it has streamed and how the run goes."""

    queue: EventQueue
    run_id: str
    cid: str
    """The run's conversation."""
    context_id: str
    """The contextId its client knows that conversation by (`chat.named_conversation`)."""
    run: RunReader = field(default_factory=lambda: RunReader(nodes=True))
    """What the run's own events say: its text, its error, its end."""

    async def follow(self, runs: Runs, *, after: int) -> None:
        """Encode the run's events as task updates until it pauses for a human or ends."""
        await status(self.queue, self.run_id, self.context_id, TaskState.TASK_STATE_WORKING)
        with runs.subscribe(self.cid) as subscriber:
            async for item in runs.items(subscriber, self.cid, after=after, run_id=self.run_id):
                if item is None:
                    continue
                if await self._encode(runs, item.type, json.loads(item.data)):
                    return

    async def _encode(self, runs: Runs, kind: str, payload: dict[str, Any]) -> bool:
        """One ringlet event as task updates; True once the task is input-required or has ended."""
        run_id, cid = self.run_id, self.context_id
        delta = self.run.feed(kind, payload)
        if isinstance(delta, Retraction):  # an abandoned attempt's text: the answer so far replaces it
            if delta.text:
                await self.queue.enqueue_event(TaskArtifactUpdateEvent(
                    task_id=run_id, context_id=cid, append=False,
                    artifact=Artifact(artifact_id=ANSWER_ID, name="answer",
                                      parts=[new_text_part("".join(self.run.messages))])))
        elif delta is not None:
            await self.queue.enqueue_event(TaskArtifactUpdateEvent(
                task_id=run_id, context_id=cid, append=not delta.first,
                artifact=Artifact(artifact_id=ANSWER_ID, name="answer", parts=[new_text_part(delta.text)])))
        elif pauses(kind, payload):
            record = await runs.records.runs.get(run_id)
            asks = await pending_asks(runs, record) if record else []
            if asks:
                await status(self.queue, run_id, cid, TaskState.TASK_STATE_INPUT_REQUIRED, asking(asks, cid, run_id))
                return True
        elif kind == "message_end" and self.run.own(payload):
            await self._end(runs)
            return True
        return False

    async def _end(self, runs: Runs) -> None:
        """The final answer (replacing the streamed chunks) and the task's last state, as `task_of` reads them
        from the stored run."""
        record = await runs.records.runs.get(self.run_id)
        if record is None:
            raise InternalError(message=f"run {self.run_id} ended without a record")
        task = await task_of(runs, record)
        for artifact in task.artifacts:
            await self.queue.enqueue_event(TaskArtifactUpdateEvent(
                task_id=self.run_id, context_id=self.context_id, artifact=artifact, append=False,
                last_chunk=True))
        note = task.status.message if task.status.HasField("message") else None
        if note is None and task.status.state == TaskState.TASK_STATE_FAILED:
            why = self.run.error.message if self.run.error is not None else ""
            note = Message(message_id=new_id("m"), context_id=self.context_id, task_id=self.run_id,
                           role=Role.ROLE_AGENT, parts=[new_text_part(f"The run failed: {why or 'see the run'}")])
        await status(self.queue, self.run_id, self.context_id, task.status.state, note, metadata=task.metadata)


async def status(queue: EventQueue, run_id: str, cid: str, state: Any, message: Message | None = None, *,
                 metadata: Any = None) -> None:
    task_status = TaskStatus(state=state)
    if message is not None:
        task_status.message.CopyFrom(message)
    await queue.enqueue_event(TaskStatusUpdateEvent(task_id=run_id, context_id=cid, status=task_status,
                                                    metadata=metadata))
