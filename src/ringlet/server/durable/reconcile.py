"""What a run closed by recovery still lacks, so that its event log and its transcript agree.

A run whose process died left its log and its transcript at two points of the same history: the log
may hold a call's start or result the transcript never got (the process died before saving), and a
log written by an older ringlet (whose loop ran ahead of its log) may lack a call the transcript holds.
`reconciled()` returns what to add to each — the messages the transcript lacks and the events the log
lacks, in order — and the message id the run's `message_end` names; `Recovery._interrupted` stores both
with the run's closing events and its end record in one transaction.

    log has                       transcript has              added
    content_delta (unsaved msg)   —                           the text, as an assistant message (interrupted)
    retracted                     —                           nothing of the text and calls it withdrew
    tool_call_start/delta         —                           the call, on that message (or a new one)
    —                             an assistant tool call      tool_call_start and tool_call_delta
    tool_result                   —                           the tool message
    —                             the tool message            tool_result
    —                             —                           an `interrupted` result in both
    nothing (or message_start)                                message_start, status working
"""

from __future__ import annotations

import json
import logging
import os
import socket
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from ringlet._ids import new_id, now
from ringlet.events import (
    ErrorEvent,
    Event,
    MessageEndEvent,
    MessageStartEvent,
    StatusEvent,
    ToolCallDeltaEvent,
    ToolCallStartEvent,
    ToolResultEvent,
)
from ringlet.messages import Message, ToolCall
from ringlet.store import Store
from ringlet.store.records import RunRecord

__all__ = ["INTERRUPTED", "Closer", "Reconciled", "close_interrupted", "gone", "log_end", "reconciled"]

INTERRUPTED = {"code": "interrupted", "message": "the server stopped while this tool was running"}
Logged = list[tuple[int, str, dict[str, Any]]]


@dataclass
class Reconciled:
    message_id: str
    """The id the run's `message_end` names: its last unsaved message's, else its `message_start`'s."""
    events: list[Event] = field(default_factory=list[Event])
    messages: list[Message] = field(default_factory=list[Message])


def reconciled(row: RunRecord, logged: Logged, transcript: list[Message]) -> Reconciled:
    """What the log (`logged`: the run's own events, no sub-agent's) and the `transcript` (the conversation's
    latest messages) of the interrupted run `row` each lack."""
    run_id, cid = row.id, row.conversation_id
    out = Reconciled(next((p["message_id"] for _, kind, p in logged if kind == "message_start"), ""))
    if not out.message_id:  # it died before its first event was stored
        out.message_id = new_id("m")
        out.events.append(MessageStartEvent(run_id=run_id, ts=now(), message_id=out.message_id, conversation_id=cid,
                                            agent=row.agent))
    if [kind for _, kind, _ in logged] in ([], ["message_start"]):  # it died before its status was stored
        out.events.append(StatusEvent(run_id=run_id, ts=now(), state="working"))
    stored = {m.id for m in transcript}
    partial: dict[str, list[str]] = {}
    withdrawn = {c for _, kind, p in logged if kind == "retracted" for c in p.get("tool_call_ids", ())}
    for _, kind, p in logged:  # (a graph's llm nodes stream text of their own: it is not the answer)
        if kind == "content_delta" and p["message_id"] not in stored and "node_id" not in p:
            partial.setdefault(p["message_id"], []).append(p["delta"])
        elif kind == "retracted" and p.get("message_id"):  # an abandoned attempt's text (`attempts.py`)
            partial.pop(p["message_id"], None)
    logged = [e for e in logged if e[2].get("tool_call_id") not in withdrawn]  # and its calls, settled
    calls = _calls(row, logged, transcript, out) if row.kind == "loop" else []
    texts = [Message(id=message_id, role="assistant", content="".join(deltas), run_id=run_id, conversation_id=cid,
                     created_at=now(), metadata={"interrupted": True}) for message_id, deltas in partial.items()]
    if calls:  # the calls the model was making when the run stopped, on the message it was writing
        last = texts.pop() if texts else Message(id=new_id("m"), role="assistant", content="", run_id=run_id,
                                                 conversation_id=cid, created_at=now(),
                                                 metadata={"interrupted": True})
        texts.append(Message(id=last.id, role="assistant", content=last.text, tool_calls=tuple(calls),
                             run_id=run_id, conversation_id=cid, created_at=last.created_at,
                             metadata=dict(last.metadata)))
    out.messages[:0] = texts  # before the results of those calls
    out.message_id = next(reversed(partial), out.message_id)
    return out


def _calls(row: RunRecord, logged: Logged, transcript: list[Message], out: Reconciled) -> list[ToolCall]:
    """Fill in the calls' starts and results (events into `out.events`, tool messages into `out.messages`);
    returns the calls the log started that the transcript lacks."""
    run_id, cid = row.id, row.conversation_id
    starts = {p["tool_call_id"]: p for _, kind, p in logged if kind == "tool_call_start"}
    raw: dict[str, str] = {}
    for _, kind, p in logged:
        if kind == "tool_call_delta":
            raw[p["tool_call_id"]] = raw.get(p["tool_call_id"], "") + p["args_delta"]
    results = {p["tool_call_id"]: p for _, kind, p in logged if kind == "tool_result"}
    kept = [(i, c) for m in transcript if m.run_id == run_id and m.role == "assistant"
            for i, c in enumerate(m.tool_calls)]
    answered = {m.tool_call_id: m for m in transcript if m.role == "tool"}
    known = {c.id for _, c in kept}
    unsaved = [ToolCall(id=call_id, name=p["name"], arguments=_arguments(raw.get(call_id, "")),
                        raw_arguments=raw.get(call_id) or "{}")
               for call_id, p in starts.items() if call_id not in known]
    for index, c in kept:
        if c.id not in starts and c.id not in results:  # kept, never logged: its start and arguments now
            out.events += [ToolCallStartEvent(run_id=run_id, ts=now(), tool_call_id=c.id, name=c.name,
                                              index=index),
                           ToolCallDeltaEvent(run_id=run_id, ts=now(), tool_call_id=c.id,
                                              args_delta=c.raw_arguments or json.dumps(c.arguments))]
    for c in [c for _, c in kept] + unsaved:
        logged_result, kept_result = results.get(c.id), answered.get(c.id)
        if logged_result is not None and kept_result is not None:
            continue
        if kept_result is not None:  # the transcript has it: so does the log now
            out.events.append(_result_event(run_id, c, kept_result))
            continue
        is_error = logged_result["is_error"] if logged_result is not None else True
        error = (logged_result or {}).get("error") or (INTERRUPTED if logged_result is None else None)
        result = (logged_result or {}).get("result")
        content = json.dumps({"error": error}, ensure_ascii=False) if is_error else \
            result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
        metadata: dict[str, Any] = {"is_tool_result": True, "is_error": is_error}
        if logged_result is None:  # neither has it: the call was cut off
            metadata["interrupted"] = True
            out.events.append(ToolResultEvent(run_id=run_id, ts=now(), tool_call_id=c.id, name=c.name, error=error,
                                              is_error=True, duration_ms=0.0, truncated=False))
        out.messages.append(Message(id=new_id("m"), role="tool", content=content, tool_call_id=c.id, name=c.name,
                                    run_id=run_id, conversation_id=cid, created_at=now(), metadata=metadata))
    return unsaved


def _result_event(run_id: str, call: ToolCall, message: Message) -> ToolResultEvent:
    is_error = bool(message.metadata.get("is_error"))
    error = None
    if is_error:
        try:
            error = json.loads(message.text)["error"]
        except (ValueError, TypeError, KeyError):
            error = {"code": "error", "message": message.text}
    return ToolResultEvent(run_id=run_id, ts=now(), tool_call_id=call.id, name=call.name,
                           result=None if is_error else message.text, error=error, is_error=is_error,
                           duration_ms=float(message.metadata.get("duration_ms") or 0.0), truncated=False)


def _arguments(raw: str) -> dict[str, Any]:
    try:
        parsed: Any = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return cast(dict[str, Any], parsed) if isinstance(parsed, dict) else {}


# -- closing what a dead process left --------------------------------------------------------------------------

HOST = socket.gethostname()[:40]
"""This machine, as lease owner ids name it (`runs.here.Here.owner`)."""
FINAL = ("completed", "failed", "canceled")
log = logging.getLogger("ringlet.server")


class Closer(Protocol):
    """What closing a dead process's runs needs of the server's run driver (`runs.driver.RunDriver`)."""

    store: Store
    dropped: set[str]
    """Runs this process ended without storing their end (storage failed)."""

    async def emit(self, conversation_id: str | None, event: Event, run: Any = None) -> int: ...

    def publish(self, conversation_id: str | None, event: Event, event_id: int, run: Any = None,
                payload: dict[str, Any] | None = None) -> None: ...


def gone(owner: str | None) -> bool:
    """Whether the process behind a lease owner id (`Here.owner`) ran on this machine and has exited.
    False when that cannot be known (another machine, an id of another form): its lease decides then."""
    _, at, place = (owner or "").rpartition("@")
    host, _, pid = place.rpartition(":")
    if not at or host != HOST or not pid.isdigit():
        return False
    if int(pid) == os.getpid():
        return True  # a process with our pid but another owner id: our predecessor (a restarted container)
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, as another user
    return False


async def close_interrupted(runner: Closer, row: RunRecord) -> None:
    """Close a run whose process died (or whose storage failed: `dropped`): its log and transcript are
    made to agree (`reconciled`), then `error` and `message_end` are stored with its end record, in one
    transaction, and sent."""
    if row.kind == "direct":
        await _close_call(runner, row)
        return
    run_id, cid = row.id, row.conversation_id
    finish_reason, closing, new = "error", [], []
    if cid is not None:
        logged = [e for e in await runner.store.events.after(cid, 0, limit=100_000, run_id=run_id)
                  if "agent_path" not in e[2]]
        end = next((p for _, kind, p in logged if kind == "message_end"), None)
        if end is not None:  # the run ended; only its bookkeeping was lost
            finish_reason = end["finish_reason"]
        else:
            plan = reconciled(row, logged, await runner.store.conversations.load_messages(cid, limit=500))
            code, message, retryable = ("storage_unavailable", "the server could not store this run", True) \
                if run_id in runner.dropped else \
                ("interrupted", "the server stopped while this run was working", False)
            new = plan.messages
            closing = [*plan.events,
                       ErrorEvent(run_id=run_id, ts=now(), code=code, retryable=retryable, message=message),
                       MessageEndEvent(run_id=run_id, ts=now(), message_id=plan.message_id, finish_reason="error",
                                       usage={"in_tokens": row.usage.in_tokens, "out_tokens": row.usage.out_tokens,
                                              "cost_usd": row.usage.cost_usd})]
    await cancel_in_call(runner.store, run_id)
    status = {"error": "failed", "cancelled": "canceled"}.get(finish_reason, "completed")
    ids = await runner.store.runs.finish(
        run_id, status=status, finish_reason=finish_reason, in_tokens=row.usage.in_tokens,
        out_tokens=row.usage.out_tokens, cost_usd=row.usage.cost_usd, conversation_id=cid, new=new,
        conversation_status="idle", add_usage=False,
        events=[(cid, e.type, e.model_dump()) for e in closing] if cid else [])
    for event, event_id in zip(closing, ids, strict=True):  # the record is final before the end is sent
        runner.publish(cid, event, event_id)
    runner.dropped.discard(run_id)
    log.warning("run %s was interrupted (its process stopped); closed it", run_id)

async def cancel_in_call(store: Store, run_id: str) -> int:
    """Cancel the run's pending questions that were asked inside a tool call (MCP elicitations,
    `ringlet.mcp.elicit`) by a process that is gone: nobody waits for their answers any more, so they must
    not stay pending (an answer then gets 409). How many were cancelled."""
    cancelled = 0
    for r in await store.approvals.list(run_id=run_id, status="pending", kind="question"):
        if "mcp" in (r.question or {}):
            cancelled += await store.approvals.decide(r.approval_id, status="cancelled",
                                                     decided_by="system:interrupted", note=None, when=now())
    return cancelled


async def log_end(runner: Closer, row: RunRecord) -> None:
    """An ended run whose process died before its last events were stored (a graph run records its end
    first): write what its log lacks — `message_start`, its final `status`, `message_end`."""
    run_id, cid, owner = row.id, row.conversation_id or "", row.lease_owner or ""  # `unlogged_ends`: both set
    logged = [(kind, p) for _, kind, p in await runner.store.events.after(cid, 0, limit=100_000, run_id=run_id)
              if "agent_path" not in p]
    closing: list[Event] = []
    if not any(kind == "message_end" for kind, _ in logged):
        message_id = next((p["message_id"] for kind, p in logged if kind == "message_start"), None)
        if message_id is None:
            message_id = new_id("m")
            closing.append(MessageStartEvent(run_id=run_id, ts=now(), message_id=message_id,
                                             conversation_id=cid, agent=row.agent))
        if row.finish_reason == "error" and not any(kind == "error" for kind, _ in logged):
            closing.append(ErrorEvent(run_id=run_id, ts=now(), code="internal_error", retryable=False,
                                      message="the run failed; its process stopped before its error was logged"))
        statuses = [p["state"] for kind, p in logged if kind == "status"]
        if row.status in FINAL and statuses[-1:] != [row.status]:
            closing.append(StatusEvent(run_id=run_id, ts=now(), state=row.status))
        closing.append(MessageEndEvent(run_id=run_id, ts=now(), message_id=message_id,
                                       finish_reason=cast(Any, row.finish_reason or "error"),
                                       usage={"in_tokens": row.usage.in_tokens, "out_tokens": row.usage.out_tokens,
                                              "cost_usd": row.usage.cost_usd}))
    ids = await runner.store.runs.log_end(run_id, owner, [(cid, e.type, e.model_dump()) for e in closing])
    for event, event_id in zip(closing, ids or [], strict=False):
        runner.publish(cid, event, event_id)
    if closing and ids is not None:
        log.warning("run %s had ended without its last events in the log; wrote them", run_id)

async def _close_call(runner: Closer, row: RunRecord) -> None:
    """A direct tool call (`tool_calls.py`) whose process died while it waited for a human or ran:
    its approval is cancelled, and the conversation gets its `interrupted` result (stored and sent)."""
    run_id, cid = row.id, row.conversation_id or ""  # a direct call's run is in its conversation
    records = await runner.store.approvals.list(run_id=run_id)
    await runner.store.approvals.cancel(run_id)
    error = {"code": "interrupted", "message": "the server stopped before this call was decided or finished; "
                                               "call the tool again"}
    stamp = now()
    for r in records:
        if r.status in ("pending", "approved", "executing"):
            call = ToolCall(id=r.tool_call_id, name=r.tool, arguments=r.args or {},
                            raw_arguments=json.dumps(r.args or {}))
            meta = {"source": "direct", "duration": 0}
            await runner.emit(cid, ToolResultEvent(run_id=run_id, ts=stamp, tool_call_id=call.id, name=call.name,
                                                 error=error, is_error=True, duration_ms=0.0, truncated=False))
            await runner.store.conversations.append_messages(cid, [
                Message(id=new_id("m"), role="assistant", tool_calls=(call,), run_id=run_id, conversation_id=cid,
                        created_at=stamp, metadata=meta),
                Message(id=new_id("m"), role="tool", content=json.dumps({"error": error}), tool_call_id=call.id,
                        name=call.name, run_id=run_id, conversation_id=cid, created_at=stamp,
                        metadata={**meta, "is_tool_result": True, "is_error": True, "interrupted": True})])
    await runner.store.runs.finish(run_id, status="failed", finish_reason="error", in_tokens=0, out_tokens=0,
                                cost_usd=None)
    log.warning("direct tool call run %s was interrupted (its process stopped); closed it", run_id)
