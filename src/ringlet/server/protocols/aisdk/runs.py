"""The run calls of the AI SDK route, in one place (the same ones AG-UI makes): start a run on new user
messages, decide or answer a paused run's approvals and questions and resume it, follow a run's events, and
cancel the conversation's active run when its client aborts."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from ringlet._ids import new_id
from ringlet.errors import ConfigError
from ringlet.messages import Message
from ringlet.server.http.auth import Principal
from ringlet.server.http.errors import ApiError
from ringlet.server.runs.active import Published
from ringlet.server.runs.service import Runs
from ringlet.store.records import Approval, Conversation


async def start(runs: Runs, principal: Principal, conversation: Conversation, incoming: Sequence[Message]) -> str:
    """Start a run on the new user messages (stored by the run, as `POST …/messages` does); its run id. 409
    `input_required` while the conversation waits on approvals or questions."""
    cid = conversation.id
    if conversation.status == "input_required":
        waiting = [r.approval_id for r in await pending(runs, cid)]
        raise ApiError(409, "input_required", f"conversation {cid} waits on approvals {', '.join(waiting)}; answer "
                       "them with addToolApprovalResponse", details={"approvals": waiting})
    run_id = new_id("r")
    try:
        await runs.start(conversation, list(incoming), principal=principal, run_id=run_id)
    except ConfigError as exc:
        raise ApiError(422, "validation_error", str(exc)) from None
    return run_id


async def pending(runs: Runs, cid: str) -> list[Approval]:
    """The conversation's pending approvals and questions."""
    return await runs.records.approvals.list(conversation_id=cid, status="pending")


async def decide(runs: Runs, principal: Principal, conversation: Conversation,
                 responses: Sequence[tuple[Approval, bool, str | None]]) -> tuple[str, int]:
    """Decide each approval (`approve` scope) or answer each question, then resume the run once, exactly as
    AG-UI's `resume` does; (the run to follow, the event id it goes on after)."""
    from ag_ui.core import ResumeEntry  # imported by the first decision, not at a process's start

    from ringlet.server.protocols.agui.interrupts import resume

    entries = []
    for record, approved, reason in responses:
        if record.kind == "approval":
            payload: Any = {"approved": approved, **({"note": reason} if reason else {})}
            entries.append(ResumeEntry(interrupt_id=record.approval_id, status="resolved", payload=payload))
        elif approved:
            entries.append(ResumeEntry(interrupt_id=record.approval_id, status="resolved",
                                       payload={"answer": answer_of(record, reason)}))
        else:  # a question declined: the paused run is cancelled
            entries.append(ResumeEntry(interrupt_id=record.approval_id, status="cancelled"))
    return await resume(runs, principal, conversation, entries)


def answer_of(record: Approval, reason: str | None) -> Any:
    """A question's answer from the approval response's `reason`: its text, or for a multi-select question
    the labels, one per line."""
    text = reason or ""
    if (record.question or {}).get("input_type") == "multi-select":
        return [line.strip() for line in text.splitlines() if line.strip()]
    return text


async def events(runs: Runs, cid: str, run_id: str, after: int) -> AsyncIterator[Published | None]:
    """The run's events, stored then live (None when idle for the ping interval), to its end; the caller
    stops at a pause."""
    with runs.subscribe(cid) as subscriber:
        async for item in runs.items(subscriber, cid, after=after, run_id=run_id):
            yield item


def cancel(runs: Runs, cid: str) -> None:
    """The client aborted its stream (`stop()`): the conversation's active run is cancelled."""
    runs.spawn(runs.cancel(cid))
