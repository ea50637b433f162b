"""A message to a task waiting for input, applied to what it asks (`asks.ANSWERS`): approvals decided, a
question answered, as the native routes would, and the run resumed."""

from __future__ import annotations

from typing import Any

from a2a.helpers.proto_helpers import get_data_parts, get_message_text
from a2a.types.a2a_pb2 import Message

from ringlet.server.http.auth import Principal
from ringlet.server.runs.service import Runs
from ringlet.store.records import Approval

YES, NO = frozenset({"yes", "approve", "approved"}), frozenset({"no", "deny", "denied"})


async def answer(runs: Runs, principal: Principal, asks: list[dict[str, Any]], message: Message) -> None:
    """Apply the message to the open requests (`ANSWERS`), as the native routes would: approvals are all
    decided first and their run resumed once (as a batch decision); an answer resumes it itself. ApiError
    (403 without `approve`, 409, 422) or ValueError when the message does not fit."""
    data = [d for d in get_data_parts(list(message.parts)) if isinstance(d, dict)]
    text = get_message_text(message).strip()
    questions = [a for a in asks if a["kind"] == "question"]
    approvals = [a for a in asks if a["kind"] == "approval"]
    decided: set[str] = set()
    try:
        for item in data or [{}]:
            if "approved" in item or (not questions and not item and text):
                decided |= await _decide(runs, principal, approvals, item, text)
            else:
                decided |= await _reply(runs, principal, questions, item, text)
    finally:  # what was decided goes on even when a later part is refused: it never waits for a decision made
        for run_id in {a.run_id for a in await _records(runs, decided)}:
            await runs.resume(run_id)


async def _decide(runs: Runs, principal: Principal, approvals: list[dict[str, Any]], item: dict[str, Any],
                  text: str) -> set[str]:
    principal.check_scope("approve")
    approved = item.get("approved")
    if approved is None:
        word = text.lower()
        if word not in YES | NO:
            raise ValueError(f"an approval takes a data part {{\"approved\": true|false}} or the text yes / no, "
                             f"not {text!r}")
        approved = word in YES
    if not isinstance(approved, bool):
        raise ValueError("`approved` must be true or false")
    chosen = [a for a in approvals if item.get("approval_id") in (None, a["approval_id"])]
    if not chosen:
        raise ValueError(f"no open approval {item.get('approval_id')!r} in this task")
    note = item.get("note") if isinstance(item.get("note"), str) else None
    for ask in chosen:
        record = await runs.records.approvals.get(ask["approval_id"])
        assert record is not None
        await runs.decide(record, approved=approved, note=note, decided_by=principal.user_id, resume=False)
    return {a["approval_id"] for a in chosen}


async def _reply(runs: Runs, principal: Principal, questions: list[dict[str, Any]], item: dict[str, Any],
                 text: str) -> set[str]:
    wanted = item.get("question_id")
    chosen = [q for q in questions if wanted in (None, q["question_id"])]
    if len(chosen) != 1:
        raise ValueError("name the question (`question_id`): several are open" if chosen else
                         f"no open question {wanted!r} in this task" if wanted else "this task asks no question")
    given = item.get("answer", text)
    if given in ("", None):
        raise ValueError("the answer is empty")
    record = await runs.records.approvals.get(chosen[0]["question_id"])
    assert record is not None
    await runs.answer(record, given, answered_by=principal.user_id)  # checked (422), and the run resumes
    return set()


async def _records(runs: Runs, ids: set[str]) -> list[Approval]:
    found = [await runs.records.approvals.get(i) for i in sorted(ids)]
    return [r for r in found if r is not None]
