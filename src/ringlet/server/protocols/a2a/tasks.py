"""Tasks read from ringlet's records: a task IS a run (task id = run id, contextId = its conversation, by the
name its client gave it), so `RunTasks` reads every task from the run record, the transcript and the pending
approvals that every server process shares, and the SDK's in-memory copies are never the truth."""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from a2a.helpers.proto_helpers import new_text_part
from a2a.server.context import ServerCallContext
from a2a.server.id_generator import IDGenerator, IDGeneratorContext
from a2a.server.tasks import TaskStore
from a2a.types.a2a_pb2 import (
    Artifact,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    Role,
    Task,
    TaskState,
    TaskStatus,
)
from a2a.utils.errors import InvalidParamsError, UnsupportedOperationError

from ringlet._ids import new_id
from ringlet.messages import Message as RingletMessage
from ringlet.server.http.errors import ApiError
from ringlet.server.protocols.a2a.asks import asking, pending_asks
from ringlet.server.protocols.a2a.caller import Caller, caller
from ringlet.server.protocols.a2a.errors import a2a_error, hidden
from ringlet.server.protocols.access import client_id, named_conversation
from ringlet.server.protocols.agui.inputs import THREAD_ID
from ringlet.server.runs.service import Runs
from ringlet.store.records import Conversation, RunRecord

ANSWER_ID = "answer"
"""The artifact holding the run's answer: streamed as chunks, then replaced by the final text."""
STATES = {"working": TaskState.TASK_STATE_WORKING, "completed": TaskState.TASK_STATE_COMPLETED,
          "failed": TaskState.TASK_STATE_FAILED, "canceled": TaskState.TASK_STATE_CANCELED,
          "input_required": TaskState.TASK_STATE_INPUT_REQUIRED}
ENDED = ("completed", "failed", "canceled")
"""The run statuses of a task that has ended."""
A2A_ID = "a2a_message_id"
"""The metadata key under which a prompt keeps its A2A message id (the SDK dedupes history by it)."""


@dataclass(frozen=True)
class Ids(IDGenerator):
    """New task ids are run ids, new context ids conversation ids (kept in `ISSUED` until used: a context
    the server named is made under that very id)."""

    prefix: str

    def generate(self, context: IDGeneratorContext) -> str:
        made = new_id(self.prefix)
        if self.prefix == "c":
            ISSUED[made] = None
            while len(ISSUED) > ISSUED_MAX:
                ISSUED.popitem(last=False)
        return made


ISSUED: OrderedDict[str, None] = OrderedDict()
"""Context ids this process generated for messages that named none, not used yet."""
ISSUED_MAX = 10_000


class RunTasks(TaskStore):
    """Tasks as ringlet stores them: a task is its run (record, transcript, pending requests). Saving is a
    no-op: the runs already stored everything a task says, in the store every process shares."""

    async def save(self, task: Task, context: ServerCallContext) -> None:
        return None

    @hidden
    async def get(self, task_id: str, context: ServerCallContext) -> Task | None:
        found = caller(context)
        record = await visible_run(found, task_id)
        return None if record is None else await task_of(found.runs, record)

    @hidden
    async def list(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        """Only the tasks of one context (its conversation's runs) are listed: a store-wide list is not kept."""
        if not params.context_id:
            raise UnsupportedOperationError(message="ListTasks needs a contextId (a conversation id)")
        found = caller(context)
        try:
            conversation = await named_conversation(found.runs, found.principal, found.hosted, params.context_id,
                                                    create=False)
        except ApiError:  # another agent's conversation
            conversation = None
        if conversation is None:
            return ListTasksResponse()
        messages = await found.runs.records.conversations.load_messages(conversation.id)
        run_ids = list(dict.fromkeys(m.run_id for m in messages if m.run_id))
        tasks = [await task_of(found.runs, r) for rid in run_ids if (r := await found.runs.records.runs.get(rid))]
        return ListTasksResponse(tasks=tasks, total_size=len(tasks), page_size=len(tasks))

    async def delete(self, task_id: str, context: ServerCallContext) -> None:
        raise UnsupportedOperationError(message="a ringlet run is never deleted through A2A")


async def conversation_of(found: Caller, context_id: str) -> Conversation:
    """The task's conversation: the one its contextId names for this key (`chat.named_conversation`: a
    contextId of another realm names another conversation, so it neither leaks nor blocks), made on first use."""
    if not THREAD_ID.fullmatch(context_id):
        raise InvalidParamsError(message="contextId: 1-40 characters of letters, digits and _.:-")
    if ISSUED.pop(context_id, False) is None:  # a context the server named just now: the conversation's own id
        try:
            return await found.runs.records.conversations.create(
                agent=found.hosted.name, realm=found.hosted.realm_for(found.principal),
                org_id=found.principal.org_id, user_id=found.principal.user_id, conversation_id=context_id)
        except ApiError as exc:
            raise a2a_error(exc) from None
    try:
        conversation = await named_conversation(found.runs, found.principal, found.hosted, context_id)
    except ApiError as exc:
        raise a2a_error(exc) from None
    assert conversation is not None
    return conversation


async def _visible_conversation(found: Caller, cid: str) -> Conversation | None:
    conversation = await found.runs.records.conversations.get(cid)
    if conversation is None or conversation.agent != found.hosted.name or \
            not found.principal.sees(conversation.realm):
        return None
    return conversation


async def visible_run(found: Caller, run_id: str) -> RunRecord | None:
    """The run of this agent, in a conversation the key sees; None for anything else (not found)."""
    record = await found.runs.records.runs.get(run_id)
    if record is None or record.conversation_id is None or record.agent != found.hosted.name:
        return None
    return record if await _visible_conversation(found, record.conversation_id) is not None else None


async def task_of(runs: Runs, record: RunRecord) -> Task:
    """The A2A task of a run: its state and `ringlet` metadata (run, finish reason, usage); once it has ended,
    its answer as the final status message and as the `answer` artifact; its other user and assistant
    messages as history; while it waits, what it asks as the status message."""
    cid, run_id = record.conversation_id or "", record.id  # a task's run has a conversation (`visible_run`)
    conversation = await runs.records.conversations.get(cid)
    context = client_id(conversation) if conversation is not None else cid  # the contextId its client named
    record, mine = await _as_of_one_moment(runs, record)
    ended = record.status in ENDED
    final = mine[-1] if ended and mine and mine[-1].role == "assistant" else None
    task = Task(id=run_id, context_id=context, history=[_message(m, context, run_id) for m in mine if m is not final],
                status=TaskStatus(state=STATES.get(record.status, TaskState.TASK_STATE_WORKING)),
                metadata=run_metadata(record))
    if record.status == "input_required":
        task.status.message.CopyFrom(asking(await pending_asks(runs, record), context, run_id))
    if final is not None:
        task.status.message.CopyFrom(_message(final, context, run_id))
        task.artifacts.append(Artifact(artifact_id=ANSWER_ID, name="answer", parts=[new_text_part(final.text)]))
    return task


async def _as_of_one_moment(runs: Runs, record: RunRecord) -> tuple[RunRecord, list[RingletMessage]]:
    """The run's record and its prompt and answers, consistent with each other: a run's end writes its record
    and its transcript in one commit, so messages read between two reads of the same status belong to that
    status. A run that moved on meanwhile (ended, mostly) is read again as it now is; an ended one cannot."""
    cid = record.conversation_id or ""
    while True:
        mine = [m for m in await runs.records.conversations.load_messages(cid)
                if m.run_id == record.id and m.role in ("user", "assistant") and m.text.strip()]
        if record.status in ENDED:  # its transcript is whole: a listing of ended tasks reads each run once
            return record, mine
        again = await runs.records.runs.get(record.id)
        if again is None or again.status == record.status:
            return again or record, mine
        record = again


def run_metadata(record: RunRecord) -> Any:
    """`metadata.ringlet` of a task: the run's id, conversation, finish reason and usage."""
    return _struct({"ringlet": {"run_id": record.id, "conversation_id": record.conversation_id,
                                "finish_reason": record.finish_reason, "usage": record.usage.summary()}})


def _message(m: RingletMessage, cid: str, run_id: str) -> Message:
    """A transcript message in a task's history; a prompt keeps the id its A2A message had."""
    return Message(message_id=m.metadata.get(A2A_ID) or m.id, context_id=cid, task_id=run_id,
                   parts=[new_text_part(m.text)], role=Role.ROLE_USER if m.role == "user" else Role.ROLE_AGENT)


def _struct(data: dict[str, Any]) -> Any:
    from google.protobuf import json_format, struct_pb2

    return json_format.ParseDict(json.loads(json.dumps(data)), struct_pb2.Struct())  # JSON or a loud failure
