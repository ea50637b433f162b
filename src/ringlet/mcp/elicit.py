"""An MCP server's `elicitation/create` as a ringlet question, asked while the tool call stays open.

    question = question_for(params)                      # the requested schema as an ask_question-like question
    decision = await ask_in_call(ctx, question, tool=…)  # stored, announced, answered like ask_question
    return result_of(question, decision)                 # the ElicitResult the server waits for

`ask_question` parks its call durably (the run pauses and may resume in another process); an elicitation
cannot: the MCP server waits inside the open `tools/call`, so the question is answered while the call
runs. It goes through the run's approver for in-call waits (`RunContext.child_approver`, the one sub-agents
already wait on): in the server that is `tracks.InProcess`, which stores the same question record (so the
questions API, the web UI and the pending list find it) and waits on a future that `Runs.answer`
resolves, in this process or (on the engine) from another one through `ringlet_decided`; in the library
it is the run's approver (`ApprovalBroker`, the CLI's `TerminalApprover`). No approver, or no human
(`RunContext.humans` False, `AutoApprove`), declines.

`ctx` is the run of the call the elicitation concerns, as the protocol names it (`client._Wire.origin`: the
response stream it came on, a progress token, or on stdio and SSE the one request the server holds). An
elicitation that names no open call is declined before a question is made: it never reaches another run.

Mapping the requested schema (flat, primitive properties; MCP 2025-11-25):
- one boolean property → single-select Yes / No;
- one enum property (`enum`, `oneOf`/`anyOf` with `const`+`title`, legacy `enumNames`) → single-select of
  its titles; an array of enums → multi-select;
- one string, number or integer property → a written answer, checked against that property's schema;
- several properties → one written answer, a JSON object checked against the whole requested schema (one
  question, one record: a form of many fields as many questions would hold the call through each).
Every question has a `Decline` option (a button in the web UI); a URL-mode elicitation asks to open the
URL and answer Done or Decline. The answer is checked before it is accepted (`question.answer_schema`,
`ringlet.tools.builtin.question.check_answer`): a bad one gets 422 and the question stays pending.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from ringlet._ids import at, new_id
from ringlet.context import RunContext
from ringlet.events import QuestionEvent, QuestionOption, StatusEvent
from ringlet.tools.builtin.question import answer_value

log = logging.getLogger("ringlet.mcp")
DECLINE = "Decline"
NEVER = "9999-12-31T23:59:59.000Z"
"""`gates.approval.NEVER`: the question waits as long as the call does."""


@dataclass(slots=True)
class InCallRequest:
    """The question record an approver stores and waits on: the fields of `gates.approval.ApprovalRequest`
    (which this layer may not import; approvers read these fields, and the server's stores them all)."""

    approval_id: str
    run_id: str
    conversation_id: str | None
    tool_call_id: str
    tool: str
    connector: str | None
    args: dict[str, Any]
    effect: str
    reason: str
    requested_at: str
    expires_at: str
    timeout_s: float
    question: dict[str, Any]
    status: str = "pending"
    decided_by: str | None = None
    decided_at: str | None = None
    note: str | None = None

    def expired(self, now: float | None = None) -> bool:
        return False

    @property
    def kind(self) -> str:
        return "question"


def question_for(params: Any, *, server: str) -> dict[str, Any]:
    """The question an elicitation asks (the `question` of an ApprovalRequest), with what `result_of`
    needs to turn its answer back into content: `mcp` = {mode, field?, values?, decline}."""
    message = (getattr(params, "message", "") or "").strip() or f"MCP server {server} asks for input"
    if getattr(params, "mode", "form") == "url":
        text = f"{message}\n\nOpen {params.url} (MCP server {server}), then answer Done, or Decline."
        return {"question": text[:2000], "input_type": "single-select", "allow_freeform": False,
                "options": [{"label": "Done"}, {"label": DECLINE}], "mcp": {"mode": "url", "decline": DECLINE}}
    schema = dict(params.requested_schema or {})
    props: dict[str, Any] = dict(schema.get("properties") or {})
    if len(props) != 1:
        return _json_question(message, schema, props)
    name, prop = next(iter(props.items()))
    about = prop.get("description") or prop.get("title") or name
    head = f"{message}\n\n{about}" if about not in message else message
    choices = _choices(prop.get("items") or {}) if prop.get("type") == "array" else _choices(prop)
    if prop.get("type") == "boolean":
        choices = [("Yes", True), ("No", False)]
    if choices:
        labels = [label for label, _ in choices]
        decline = _decline_label(labels)
        kind = "multi-select" if prop.get("type") == "array" else "single-select"
        return {"question": head[:2000], "input_type": kind, "allow_freeform": False,
                "options": [{"label": label} for label in labels] + [{"label": decline}],
                "mcp": {"mode": "form", "field": name, "values": [v for _, v in choices], "decline": decline}}
    if "default" in prop:
        head += f"\n(default: {json.dumps(prop['default'], ensure_ascii=False)})"
    return _written(head, {k: v for k, v in prop.items() if k not in ("title", "description", "default")},
                    {"mode": "form", "field": name, "decline": DECLINE})


def _json_question(message: str, schema: dict[str, Any], props: dict[str, Any]) -> dict[str, Any]:
    required = set(schema.get("required") or ())
    lines = []
    for name, prop in props.items():
        kind = prop.get("type", "value")
        choices = [label for label, _ in _choices(prop.get("items") or {} if kind == "array" else prop)]
        values = [v for _, v in _choices(prop.get("items") or {} if kind == "array" else prop)]
        extra = f", one of {', '.join(json.dumps(v) for v in values)}" if choices else ""
        if prop.get("format"):
            extra += f", format {prop['format']}"
        if "default" in prop:
            extra += f", default {json.dumps(prop['default'], ensure_ascii=False)}"
        about = prop.get("description") or prop.get("title") or ""
        lines.append(f"- {name} ({kind}{', required' if name in required else ''}{extra}){': ' if about else ''}"
                     f"{about}")
    text = f"{message}\n\nAnswer with a JSON object with these fields:\n" + "\n".join(lines)
    shape = {"type": "object", "properties": props, "required": sorted(required)}
    return _written(text[:2000], shape, {"mode": "form", "decline": DECLINE})


def _written(text: str, schema: dict[str, Any], mcp: dict[str, Any]) -> dict[str, Any]:
    """A written answer (free text), with a Decline button: a single-select of one option that allows free
    text, which every surface (web UI, CLI, API) already renders."""
    return {"question": text[:2000], "input_type": "single-select", "allow_freeform": True,
            "options": [{"label": DECLINE, "description": "Do not give the server this information"}],
            "answer_schema": schema, "mcp": mcp}


def _choices(prop: dict[str, Any]) -> list[tuple[str, Any]]:
    """An enum's (label, value) pairs: titled `oneOf`/`anyOf` consts, legacy `enumNames`, or plain `enum`."""
    titled = prop.get("oneOf") or prop.get("anyOf")
    if titled and all(isinstance(o, dict) and "const" in o for o in titled):
        return _unique([(str(o.get("title") or o["const"]), o["const"]) for o in titled])
    values = prop.get("enum")
    if not values:
        return []
    names = prop.get("enumNames")
    labels = names if isinstance(names, list) and len(names) == len(values) else values
    return _unique([(str(label), value) for label, value in zip(labels, values, strict=True)])


def _unique(pairs: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    labels = [p[0] for p in pairs]
    return pairs if len(set(labels)) == len(labels) else [(json.dumps(v), v) for _, v in pairs]


def _decline_label(labels: list[str]) -> str:
    return DECLINE if DECLINE not in labels else "Decline (do not answer)"


def result_of(question: dict[str, Any], status: str, answer: Any = None) -> dict[str, Any]:
    """The ElicitResult (as a dict) for a decision on the question (its status, and for `answered` its
    `{answer, freeform}`): accept with content matching the requested schema, decline (the human chose
    Decline, or no one can answer), or cancel (the question was cancelled or expired)."""
    if status != "answered":
        return {"action": "decline" if status in ("no_human", "denied") else "cancel"}
    mcp, given = question["mcp"], (answer or {}).get("answer")
    if given == mcp["decline"] or given == [mcp["decline"]]:
        return {"action": "decline"}
    if mcp["mode"] == "url":
        return {"action": "accept"}
    field = mcp.get("field")
    if "values" in mcp:
        labels = [o["label"] for o in question["options"]]
        pick = {label: value for label, value in zip(labels, mcp["values"], strict=False)}
        if isinstance(given, list):
            return {"action": "accept", "content": {field: [pick[g] for g in given if g in pick]}}
        return {"action": "accept", "content": {field: pick[given]}}
    value = answer_value(question["answer_schema"], str(given))
    return {"action": "accept", "content": {field: value} if field is not None else value}


async def ask_in_call(ctx: RunContext, question: dict[str, Any], *, tool: str,
                      connector: str | None) -> tuple[str, Any]:
    """Ask a human `question` from inside a running tool call and wait for the answer (no durable pause:
    the call stays open). The question is stored by the run's approver (the server's stores the same record
    as `ask_question`'s), announced with a `question` event and `status: input_required`, and the run goes
    back to `working` once it is decided. Cancelling the call cancels the question. Returns the decision's
    status (`answered`, `no_human`, `cancelled`, …) and its answer (`{answer, freeform}`)."""
    approver = ctx.child_approver
    if not ctx.humans or approver is None:
        return "no_human", None
    stamp = time.time()
    question_id = new_id("q")  # a fresh id even on a durable replay: this runs inside the call's step
    request = InCallRequest(
        approval_id=question_id, run_id=ctx.run_id, conversation_id=ctx.conversation_id,
        tool_call_id=ctx.tool_call_id or question_id, tool=tool, connector=connector, args={}, effect="read",
        reason=question["question"], requested_at=at(stamp), expires_at=NEVER, timeout_s=0.0,
        question=question)

    def announce() -> None:
        if ctx.emit is None:
            return
        ctx.emit(QuestionEvent(run_id=ctx.run_id, ts=ctx.seam.stamp(), question_id=question_id,
                               tool_call_id=ctx.tool_call_id, question=question["question"],
                               input_type=question["input_type"], allow_freeform=question["allow_freeform"],
                               options=tuple(QuestionOption(o["label"], o.get("description"))
                                             for o in question["options"])))
        ctx.emit(StatusEvent(run_id=ctx.run_id, ts=ctx.seam.stamp(), state="input_required"))

    try:
        if getattr(approver, "announces", False):  # it stores the record first, then calls announce
            decisions = await approver.wait([request], announce=announce)
        else:
            announce()
            decisions = await approver.wait([request])
    finally:
        if ctx.emit is not None:
            ctx.emit(StatusEvent(run_id=ctx.run_id, ts=ctx.seam.stamp(), state="working"))
    decision = decisions.get(request.tool_call_id)
    if decision is None:  # the approver gave up on it
        return "expired", None
    return decision.status, decision.answer
