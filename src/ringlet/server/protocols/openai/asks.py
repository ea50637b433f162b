"""A `/v1` run that waits for a human (`server-contract.md` §7, Approvals). An OpenAI client can neither see
an approval nor answer one, so the response does not wait: it ends at once with an assistant message that
says what is asked and where to decide it (`say`). In a stored conversation (`X-Ringlet-Conversation-Id`)
the next user message answers (`answer`), as A2A's input-required does: `yes` / `no` (also `approve` /
`deny`, any case) decides the open approvals, a question takes the message as its answer; anything else is
not taken, and the reply asks again, saying why. A run without a conversation cannot be answered by a
reply: its message says where to decide instead."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from ringlet.server.http.auth import Principal
from ringlet.server.runs.service import Runs
from ringlet.store.records import Approval

YES = frozenset({"yes", "y", "approve", "approved"})
NO = frozenset({"no", "n", "deny", "denied"})


def ask_of(kind: str, payload: dict[str, Any]) -> dict[str, Any]:
    """An `approval_required` or `question` event's payload as the response's `ringlet.pending` lists it."""
    if kind == "question":
        return {"kind": "question", "question_id": payload["question_id"], "tool_call_id": payload["tool_call_id"],
                "question": payload.get("question"), "options": payload.get("options") or [],
                "allow_freeform": payload.get("allow_freeform", False), "expires_at": payload.get("expires_at")}
    return {"kind": "approval", "approval_id": payload["approval_id"], "tool_call_id": payload["tool_call_id"],
            "tool": payload.get("tool"), "args": payload.get("args"), "reason": payload.get("reason"),
            "expires_at": payload.get("expires_at")}


def asks_of(rows: list[Approval]) -> list[dict[str, Any]]:
    """Stored open requests as `ask_of` describes them."""
    out = []
    for r in rows:
        if r.kind == "question":
            out.append(ask_of("question", {**(r.question or {}), "question_id": r.approval_id,
                                           "tool_call_id": r.tool_call_id, "expires_at": r.expires_at}))
        else:
            out.append(ask_of("approval_required", {"approval_id": r.approval_id, "tool_call_id": r.tool_call_id,
                                                    "tool": r.tool, "args": r.args, "reason": r.reason,
                                                    "expires_at": r.expires_at}))
    return out


def say(asks: list[dict[str, Any]], base_url: str, cid: str | None, *, problem: str | None = None) -> str:
    """The assistant message that ends a response whose run waits for a human: what is asked, and how to
    answer (a reply in the conversation, or the approvals API)."""
    base = base_url.rstrip("/")
    lines = [problem] if problem else []
    for ask in asks:
        if ask["kind"] == "question":
            options = ", ".join(str(o.get("label", o)) if isinstance(o, dict) else str(o) for o in ask["options"])
            lines.append(f"Question: {ask['question']}" + (f" (options: {options})" if options else ""))
        else:
            lines.append(f"Approval needed: {ask['tool']}({json.dumps(ask['args'], ensure_ascii=False)})"
                         + (f" — {ask['reason']}" if ask.get("reason") else "")
                         + f" (approval {ask['approval_id']}, expires {ask.get('expires_at') or 'never'}).")
    approvals = [a for a in asks if a["kind"] == "approval"]
    questions = [a for a in asks if a["kind"] == "question"]
    if cid is not None:
        how = ("Reply with your answer to the question in this conversation" if questions else
               "Reply yes or no in this conversation to approve or deny " + ("it" if len(approvals) == 1 else "them"))
        lines.append(f"{how} (the same X-Ringlet-Conversation-Id: {cid}), or decide at "
                     f"{base}/api/v1/chat/conversations/{cid}/approvals.")
    elif questions:
        lines.append("This request has no conversation (X-Ringlet-Conversation-Id), so nothing can answer the "
                     "question: the run was stopped. Send the request in a conversation to answer it by reply.")
    else:
        where = ", ".join(f"{base}/api/v1/approvals/{a['approval_id']}" for a in approvals)
        lines.append("This request has no conversation (X-Ringlet-Conversation-Id), so a reply cannot answer: "
                     f"decide at POST {where} with {{\"approved\": true|false}}; the run waits there, and its "
                     "outcome is not sent to this client. Send the request in a conversation to answer by reply.")
    return "\n".join(lines)


async def stored(runs: Runs, asks: list[dict[str, Any]]) -> None:
    """Wait (up to 2 s) until the requests of a run without a conversation are stored: its approver stores
    them just after the run says it waits, and the message that ends the response names their URLs."""
    for ask in asks:
        for _ in range(100):
            if await runs.records.approvals.get(ask.get("approval_id") or ask.get("question_id") or "") is not None:
                break
            await asyncio.sleep(0.02)


async def answer(runs: Runs, principal: Principal, rows: list[Approval], text: str) -> None:
    """Apply a user message to the conversation's open requests (`rows`), as the native routes would: a
    question takes it as its answer (the first open one, when several are); otherwise `yes` / `no` decides
    every open approval, and their runs resume once. ApiError (403 without the `approve` scope, 409, 422) or
    ValueError when the message does not fit."""
    questions = [r for r in rows if r.kind == "question"]
    if questions:
        await runs.answer(questions[0], text, answered_by=principal.user_id)  # checked (422); it resumes
        return
    word = text.strip().strip(".!").strip().lower()
    if word not in YES | NO:
        raise ValueError(f"reply yes or no (or approve / deny), not {text.strip()[:80]!r}")
    principal.check_scope("approve")
    for record in rows:
        await runs.decide(record, approved=word in YES, note=None, decided_by=principal.user_id, resume=False)
    for run_id in dict.fromkeys(r.run_id for r in rows):
        await runs.resume(run_id)
