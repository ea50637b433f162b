"""`RingletExecutor`: runs a task as a ringlet run. A new task starts one through the one driver
(`Runs.start`, as a chat message does); a message to a task waiting for input answers what it asks; either
way the run's events are then followed as task updates (`follow.py`)."""

from __future__ import annotations

import json
from dataclasses import replace

from a2a.helpers.proto_helpers import get_data_parts, get_message_text
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.types.a2a_pb2 import Message, TaskState
from a2a.utils.errors import InvalidParamsError, TaskNotFoundError, UnsupportedOperationError

from ringlet.errors import ConfigError
from ringlet.messages import Message as RingletMessage
from ringlet.server.http.errors import ApiError
from ringlet.server.protocols.a2a.answers import answer
from ringlet.server.protocols.a2a.asks import asking, pending_asks
from ringlet.server.protocols.a2a.caller import Caller, caller
from ringlet.server.protocols.a2a.errors import a2a_error, hidden
from ringlet.server.protocols.a2a.follow import Follow, status
from ringlet.server.protocols.a2a.handler import cancel_run
from ringlet.server.protocols.a2a.tasks import A2A_ID, ENDED, conversation_of, visible_run


class RingletExecutor(AgentExecutor):
    """Runs a task as a ringlet run: a new task starts one; a message to a task waiting for input answers it."""

    @hidden
    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        found = caller(context.call_context)
        assert context.task_id is not None
        assert context.context_id is not None
        assert context.message is not None
        if context.current_task is not None:
            await self._answer(found, context, event_queue)
            return
        conversation = await conversation_of(found, context.context_id)
        prompt = RingletMessage.user(_prompt_text(context.message), source="a2a")
        prompt = replace(prompt, metadata={**prompt.metadata, A2A_ID: context.message.message_id},
                         run_id=context.task_id, conversation_id=conversation.id)  # in the task's history
        try:  # the run is the task: once it is stored, the task is there (`RunTasks.get`) for every process
            run = await found.runs.start(conversation, prompt, principal=found.principal, run_id=context.task_id)
        except (ApiError, ConfigError) as exc:
            raise a2a_error(exc) from None
        await Follow(event_queue, run.run_id, conversation.id, context.context_id).follow(found.runs, after=0)

    @hidden
    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        found = caller(context.call_context)
        record = await visible_run(found, context.task_id or "")
        if record is not None and record.status not in ENDED:
            await cancel_run(found.runs, record)

    async def _answer(self, found: Caller, context: RequestContext, queue: EventQueue) -> None:
        """A message to an existing task answers what its run asks; a bad answer asks again, saying why."""
        runs, run_id = found.runs, context.task_id or ""
        record = await visible_run(found, run_id)
        if record is None:
            raise TaskNotFoundError
        cid = record.conversation_id or ""  # a task's run has a conversation (`visible_run`)
        context_id = context.context_id or cid
        asks = await pending_asks(runs, record)
        if not asks:
            raise UnsupportedOperationError(message=f"task {run_id} is not waiting for input ({record.status})")
        mark, _ = await runs.records.events.marks(cid)
        try:
            await answer(runs, found.principal, asks, context.message or Message())
        except (ApiError, ValueError) as exc:
            why = exc.message if isinstance(exc, ApiError) else str(exc)
            await status(queue, run_id, context_id, TaskState.TASK_STATE_INPUT_REQUIRED,
                         asking(await pending_asks(runs, record) or asks, context_id, run_id,
                                problem=f"The answer was not taken: {why}"))
            return
        await Follow(queue, run_id, cid, context_id).follow(runs, after=mark)


def _prompt_text(message: Message) -> str:
    """The user message's text; data parts follow as JSON (ringlet prompts are text here)."""
    text = get_message_text(message)
    data = get_data_parts(list(message.parts))
    if data:
        text += "".join(f"\n\n```json\n{json.dumps(d, ensure_ascii=False, indent=2)}\n```" for d in data)
    if not text.strip():
        raise InvalidParamsError(message="the message has no text or data part")
    return text
