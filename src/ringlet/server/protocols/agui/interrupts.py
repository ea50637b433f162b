"""A paused run's interrupts, and `resume` deciding or answering them.

**Interrupts.** A run that waits for approvals or answers ends its AG-UI run with `RUN_FINISHED` whose
outcome is `{"type": "interrupt", "interrupts": [Interrupt]}`: one per pending approval or question of the
run, `id` the `approval_id` / `question_id`, `reason` `"approval_required"` or `"question"`, `toolCallId`,
`expiresAt`, a `responseSchema` of the answer, and `metadata.ringlet` the ringlet payload. The client
continues with the next `RunAgentInput` on the same thread carrying `resume`:

    {"interruptId": "ap_…", "status": "resolved", "payload": {"approved": true, "note": "ok"}}
    {"interruptId": "ap_…", "status": "cancelled"}                       (the call is denied)
    {"interruptId": "q_…",  "status": "resolved", "payload": {"answer": "red"}}   (or a list of labels)
    {"interruptId": "q_…",  "status": "cancelled"}                       (the paused run is cancelled)

Deciding approvals needs the `approve` scope (403 otherwise), as in the native API; an answer is checked
against its question (422); an id not in the thread is 404 `interrupt_not_found`, one decided already 409. With
`resume`, `messages` are history only. The stream then follows the same ringlet run from where it paused, to
its end or its next interrupt. A new message to a thread that waits on interrupts is 409 `input_required`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ag_ui.core import Interrupt, ResumeEntry

from ringlet.server.http.auth import Principal
from ringlet.server.http.errors import ApiError
from ringlet.server.runs.service import Runs
from ringlet.store.records import Approval, Conversation

_APPROVAL_SCHEMA = {"type": "object", "required": ["approved"],
                    "properties": {"approved": {"type": "boolean"}, "note": {"type": "string"}}}


def interrupt_of(kind: str, payload: dict[str, Any]) -> Interrupt:
    """The AG-UI interrupt of a ringlet `approval_required` or `question` payload."""
    if kind == "approval_required":
        return Interrupt(id=payload["approval_id"], reason="approval_required", tool_call_id=payload["tool_call_id"],
                         message=f"Approve {payload['tool']}? {payload['reason']}".strip(),
                         response_schema=_APPROVAL_SCHEMA, expires_at=payload.get("expires_at"),
                         metadata={"ringlet": payload})
    return Interrupt(id=payload["question_id"], reason="question", tool_call_id=payload.get("tool_call_id"),
                     message=payload["question"], response_schema=_answer_schema(payload),
                     metadata={"ringlet": payload})


def _answer_schema(question: dict[str, Any]) -> dict[str, Any]:
    labels = [o["label"] for o in question.get("options") or []]
    one: dict[str, Any] = {"type": "string"}
    if labels and not question.get("allow_freeform"):
        one["enum"] = labels
    answer = {"type": "array", "items": one} if question.get("input_type") == "multi-select" else one
    return {"type": "object", "required": ["answer"], "properties": {"answer": answer}}


# -- resuming interrupts ------------------------------------------------------------------------------------------


async def resume(runs: Runs, principal: Principal, conversation: Conversation,
                 entries: Sequence[ResumeEntry]) -> tuple[str, int]:
    """Decide or answer each interrupt, then resume the run once; (its run id, the event id it resumes
    after)."""
    cid = conversation.id
    records = [await _interrupt(runs, cid, entry) for entry in entries]
    if any(r.kind == "approval" for r in records):
        principal.check_scope("approve")
    run_ids = {r.run_id for r in records}
    if len(run_ids) != 1:
        raise ApiError(422, "validation_error", "body.resume: interrupts of one run only")
    run_id = run_ids.pop()
    mark, _ = await runs.records.events.marks(cid)
    decisions = [(r, _decision(i, e)) for i, (e, r) in enumerate(zip(entries, records, strict=True))
                 if r.kind == "approval"]  # every payload checked before anything is decided
    answers = [(r, _CANCEL if e.status == "cancelled" else _answer(i, e))
               for i, (e, r) in enumerate(zip(entries, records, strict=True)) if r.kind != "approval"]
    try:
        for record, (approved, note) in decisions:
            await runs.decide(record, approved=approved, note=note, decided_by=principal.user_id, resume=False)
        for record, answer in answers:
            if answer is _CANCEL:
                await runs.cancel_paused(cid)
            else:
                await runs.answer(record, answer, answered_by=principal.user_id)
    finally:
        if decisions:  # every decision first, so the run resumes once with all of them (also when a later
            await runs.resume(run_id)  # answer is refused: what was decided is not left waiting)
    return await _followed_run(runs, cid, run_id), mark


async def _followed_run(runs: Runs, cid: str, run_id: str) -> str:
    """The thread's run whose events tell how `run_id` goes on: itself, or for a sub-agent's request (stored
    under the root conversation, its run a child's) the root run it works inside."""
    run = await runs.records.runs.get(run_id)
    if run is not None and run.conversation_id == cid:
        return run_id
    active = runs.active.get(cid)
    if active is not None:
        return active.run_id
    working = [r.id for r in await runs.records.runs.working() if r.conversation_id == cid]  # elsewhere
    return working[0] if working else await runs.records.runs.paused_of(cid) or run_id


_CANCEL = object()
"""A question's `cancelled` resume entry: the paused run is cancelled."""


async def _interrupt(runs: Runs, cid: str, entry: ResumeEntry) -> Approval:
    record = await runs.records.approvals.get(entry.interrupt_id)
    if record is None or record.conversation_id != cid:
        raise ApiError(404, "interrupt_not_found", f"no interrupt {entry.interrupt_id!r} in thread {cid}")
    if record.status != "pending":
        raise ApiError(409, "interrupt_not_pending", f"interrupt {entry.interrupt_id!r} is {record.status} "
                       "already; send the thread's next message instead")
    return record


def _decision(index: int, entry: ResumeEntry) -> tuple[bool, str | None]:
    payload = entry.payload if isinstance(entry.payload, dict) else {}
    note = payload.get("note") if isinstance(payload.get("note"), str) else None
    if entry.status == "cancelled":
        return False, note or "cancelled by the client"
    if not isinstance(payload.get("approved"), bool):
        loc = f"body.resume.{index}.payload.approved"
        raise ApiError(422, "validation_error", f"{loc}: an approval is resolved with {{\"approved\": bool}}",
                       details={"errors": [{"loc": loc, "msg": "a boolean is required"}]})
    return payload["approved"], note


def _answer(index: int, entry: ResumeEntry) -> Any:
    payload = entry.payload
    if not isinstance(payload, dict) or "answer" not in payload:
        loc = f"body.resume.{index}.payload.answer"
        raise ApiError(422, "validation_error", f"{loc}: a question is resolved with {{\"answer\": …}}",
                       details={"errors": [{"loc": loc, "msg": "field required"}]})
    return payload["answer"]
