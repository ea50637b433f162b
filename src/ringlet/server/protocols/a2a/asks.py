"""What a task waiting for input asks: the run's open approvals and questions, described as the
`approval_required` / `question` events describe them (`events.ask_event`), and the input-required status
message that says them in text, with one DataPart per open request, and how to answer (`ANSWERS`)."""

from __future__ import annotations

import json
from typing import Any

from a2a.helpers.proto_helpers import new_data_part, new_text_part
from a2a.types.a2a_pb2 import Message, Role

from ringlet._ids import new_id
from ringlet.server.protocols.events import ask_event
from ringlet.server.runs.service import Runs
from ringlet.store.records import RunRecord

ANSWERS = ("Answer in the next message of this task. A question: its text, or a data part {\"answer\": …}. "
           "An approval: a data part {\"approved\": true|false, \"note\"?: …} (with \"approval_id\" when several "
           "are open; without, it decides them all), or the text yes / no.")


async def pending_asks(runs: Runs, record: RunRecord) -> list[dict[str, Any]]:
    """The run's open approvals and questions, as the `approval_required` / `question` events describe them."""
    rows = await runs.records.approvals.list(run_id=record.id, status="pending")
    if not rows and record.conversation_id:  # a sub-agent's, answered through this conversation
        rows = await runs.records.approvals.list(conversation_id=record.conversation_id, status="pending")
    return [_ask(*ask_event(r)) for r in rows]


def _ask(kind: str, payload: dict[str, Any]) -> dict[str, Any]:
    """An open request as its DataPart says it: the event's fields under `kind` `question` or `approval`."""
    if kind == "question":
        return {"kind": "question", "question_id": payload["question_id"], "tool_call_id": payload["tool_call_id"],
                "question": payload.get("question"), "input_type": payload.get("input_type"),
                "options": payload.get("options") or [], "allow_freeform": payload.get("allow_freeform", False)}
    return {"kind": "approval", **payload}


def asking(asks: list[dict[str, Any]], cid: str, run_id: str, *, problem: str | None = None) -> Message:
    """The input-required status message: what is asked, in text, then one DataPart per open request."""
    lines = [problem] if problem else []
    for ask in asks:
        if ask["kind"] == "question":
            options = ", ".join(o["label"] for o in ask["options"])
            lines.append(f"Question: {ask['question']}" + (f" (options: {options})" if options else ""))
        else:
            lines.append(f"Approval needed: {ask['tool']}({json.dumps(ask['args'], ensure_ascii=False)})"
                         + (f" — {ask['reason']}" if ask.get("reason") else ""))
    lines.append(ANSWERS)
    return Message(message_id=new_id("m"), context_id=cid, task_id=run_id, role=Role.ROLE_AGENT,
                   parts=[new_text_part("\n".join(lines)),
                          *(new_data_part(json.loads(json.dumps(a, default=str))) for a in asks)])
