"""Rendering the event stream in a terminal: streamed text, a spinner per running batch, a usage line."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.status import Status
from rich.text import Text

from ringlet.events import (
    ApprovalRequiredEvent,
    BaseEvent,
    ContentDeltaEvent,
    ErrorEvent,
    Event,
    GuardrailEvent,
    MessageEndEvent,
    NodeEndEvent,
    NodeStartEvent,
    NotificationEvent,
    QuestionEvent,
    ToolCallDeltaEvent,
    ToolCallStartEvent,
    ToolResultEvent,
)
from ringlet.gates.approval import ApprovalDecision, ApprovalRequest, approve, deny
from ringlet.tools.builtin.question import check_answer

MAX_SUMMARY = 100


def _summary(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= MAX_SUMMARY else text[: MAX_SUMMARY - 1] + "…"


class Renderer:
    """Consumes events; prints to `out` (stdout) and diagnostics to `err` (stderr)."""

    def __init__(self, out: Console, err: Console) -> None:
        self.out, self.err = out, err
        self.calls: dict[str, list[str]] = {}  # call id -> [name, raw args]
        self.status: Status | None = None
        self.started = time.perf_counter()
        self.at_line_start = True

    def _stop_spinner(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None

    def _spin(self) -> None:
        names = ", ".join(name for name, _ in self.calls.values())
        label = f"running {names}…"
        if self.status is None:
            self.status = self.err.status(label, spinner="dots")
            self.status.start()
        else:
            self.status.update(label)

    def _newline(self) -> None:
        if not self.at_line_start:
            self.out.print()
            self.at_line_start = True

    def handle(self, event: Event) -> None:
        if isinstance(event, BaseEvent) and event.agent_path is not None:  # a sub-agent's, indented
            self._nested(event)
            return
        match event:
            case ContentDeltaEvent() if event.node_id is not None:
                pass  # a graph's llm node thinking aloud: only the End output goes to stdout
            case ContentDeltaEvent(delta=delta):
                self._stop_spinner()
                self.out.print(Text(delta), end="")
                self.at_line_start = delta.endswith("\n")
            case ToolCallStartEvent():
                self._newline()
                self.calls[event.tool_call_id] = [event.name, ""]
                self._spin()
            case ToolCallDeltaEvent() if event.tool_call_id in self.calls:
                self.calls[event.tool_call_id][1] += event.args_delta
            case ToolResultEvent():
                self._tool_result(event)
            case ApprovalRequiredEvent():
                self._stop_spinner()
                self._newline()
                self.err.print(Text.assemble(("⏸ ", "yellow"), (f"{event.tool}({_summary(event.args)}) ", "bold"),
                                             (f"needs approval: {event.reason}", "yellow")))
            case NodeStartEvent() | NodeEndEvent():
                self._stop_spinner()
                self._newline()
                self.err.print(self._progress(event))
            case NotificationEvent() | GuardrailEvent():
                self._notice(event)
            case ErrorEvent():
                self._stop_spinner()
                self._newline()
                self.err.print(Text(f"error {event.code}: {event.message}", style="bold red"))
            case MessageEndEvent():
                self._stop_spinner()
                self._newline()
                usage = event.usage
                cost = "cost n/a" if usage.get("cost_usd") is None else f"${usage['cost_usd']:.4f}"
                elapsed = time.perf_counter() - self.started
                cached = f" ({usage['cache_read_tokens']} cached)" if usage.get("cache_read_tokens") else ""
                self.err.print(Text(f"{event.finish_reason} · {usage['in_tokens']} in{cached} / {usage['out_tokens']} "
                                    f"out tokens · {cost} · {elapsed:.1f} s", style="dim"))
            case _:
                pass

    def _notice(self, event: NotificationEvent | GuardrailEvent) -> None:
        """A notification at its level; a guardrail's redaction or block (its allows are in the audit log)."""
        if isinstance(event, NotificationEvent):
            self._newline()
            style = {"error": "red", "warning": "yellow", "success": "green"}.get(event.level, "dim")
            self.err.print(Text(f"[{event.level}] {event.title}: {event.message}", style=style))
        elif event.decision != "allow":
            self._newline()
            found = ", ".join(event.kinds) or event.reason or ""
            self.err.print(Text(f"[guardrail] {event.guardrail} {event.decision} {event.stage}"
                                + (f" ({event.tool})" if event.tool else "") + (f": {found}" if found else ""),
                                style="red" if event.decision == "block" else "yellow"))

    @staticmethod
    def _progress(event: NodeStartEvent | NodeEndEvent) -> Text:
        """A graph node's `▸ HH:MM:SS id (type) start | done in 1.2s -> next | FAILED … -- error` line."""
        item = f"[{event.item_index}]" if event.item_index is not None else ""
        head = f"▸ {time.strftime('%H:%M:%S')} {event.node_id}{item} ({event.node_type})"
        if isinstance(event, NodeStartEvent):
            return Text(f"{head} start", style="dim")
        took = f"{event.duration_ms / 1000:.1f}s"
        if event.outcome == "failed":  # the whole error: a config error's cause (file:line) is on its next lines
            message = event.error if isinstance(event.error, str) else json.dumps(event.error, ensure_ascii=False)
            return Text(f"{head} FAILED after {took} -- {message}", style="red")
        after = f" -> {', '.join(event.next)}" if event.next else ""
        fell = " (fallback)" if event.outcome == "fallback" else ""
        return Text(f"{head} done in {took}{fell}{after}", style="dim")

    def _nested(self, event: BaseEvent) -> None:
        indent = "  " * (event.depth or 1)
        who = "/".join(event.agent_path or ())
        match event:
            case ToolResultEvent():
                outcome = (f"✗ {(event.error or {}).get('code')}" if event.is_error else
                           f"→ {_summary(event.result)}")
                self.err.print(Text(f"{indent}↳ {who} ⚙ {event.name} {outcome}", style="dim"))
            case ApprovalRequiredEvent() | QuestionEvent():
                self._stop_spinner()
                self.err.print(Text(f"{indent}↳ {who} asks", style="yellow"))
            case MessageEndEvent():
                self.err.print(Text(f"{indent}↳ {who} done ({event.finish_reason})", style="dim"))
            case _:
                pass

    def _tool_result(self, event: ToolResultEvent) -> None:
        name, args = self.calls.pop(event.tool_call_id, [event.name, ""])
        self._stop_spinner()
        if event.is_error:
            error = event.error or {}
            outcome = Text(f"✗ {error.get('code')}: {_summary(error.get('message', ''))}", style="red")
        else:
            outcome = Text(f"→ {_summary(event.result)}", style="green")
        self.err.print(Text.assemble(("⚙ ", "cyan"), (f"{name}({_summary(args)}) ", "bold"), outcome,
                                     (f"  {event.duration_ms:.0f} ms", "dim")))
        if self.calls:
            self._spin()

    def close(self) -> None:
        self._stop_spinner()


class TerminalApprover:
    """Asks on the terminal for each request: `y` approves, `n` denies, any other text denies with that
    text as the note the model reads (`approve_all`: approves without asking). Questions are always asked:
    options by number or label, checked until the answer fits."""

    def __init__(self, err: Console, *, approve_all: bool = False) -> None:
        self.err, self.approve_all = err, approve_all

    async def wait(self, requests: Sequence[ApprovalRequest]) -> Mapping[str, ApprovalDecision]:
        decisions = {}
        for r in requests:
            if r.question is not None:
                decisions[r.tool_call_id] = await self._ask(r.question)
                continue
            if self.approve_all:
                decisions[r.tool_call_id] = approve(decided_by="cli:--yes")
                continue
            args = json.dumps(r.args, ensure_ascii=False)
            self.err.print(Text.assemble(("? ", "yellow"), (r.tool, "bold"), f" {args}",
                                         (f"  ({r.reason}; expires {r.expires_at})", "dim")))
            answer = (await asyncio.to_thread(input, "  approve? [y/n/note] ")).strip()
            if answer.lower() in ("y", "yes"):
                decisions[r.tool_call_id] = approve(decided_by="cli:user")
            else:
                decisions[r.tool_call_id] = deny(None if answer.lower() in ("n", "no", "") else answer,
                                                 decided_by="cli:user")
        return decisions

    async def answer(self, question: Any) -> str:
        """A graph's approval or input node asks (`ringlet.graph.human.Question`): options by number or
        label, free text where allowed, the node's default for an empty input."""
        self.err.print(Text.assemble(("? ", "yellow"), (question.question, "bold")))
        for i, label in enumerate(question.options, 1):
            self.err.print(Text(f"  {i}. {label}"))
        other = len(question.options) + 1 if question.options and question.allow_freeform else None
        if other is not None:
            self.err.print(Text(f"  {other}. Other (type your own answer)"))
        while True:
            raw = (await asyncio.to_thread(input, "  answer: ")).strip()
            if other is not None and raw == str(other):
                raw = (await asyncio.to_thread(input, "  your answer: ")).strip()
                if raw:
                    return raw
                continue
            if raw.isdigit() and 1 <= int(raw) <= len(question.options):
                return question.options[int(raw) - 1]
            if not raw and question.default is not None:
                return question.default
            if raw and (not question.options or raw in question.options or question.allow_freeform):
                return raw
            self.err.print(Text(f"answer with one of: {', '.join(question.options)}", style="red"))

    async def _ask(self, question: dict[str, Any]) -> ApprovalDecision:
        labels = [o["label"] for o in question.get("options") or ()]
        self.err.print(Text.assemble(("? ", "yellow"), (question["question"], "bold")))
        for i, o in enumerate(question.get("options") or (), 1):
            self.err.print(Text(f"  {i}. {o['label']}" + (f" — {o['description']}" if o.get("description") else "")))
        hint = {"single-select": "a number", "multi-select": "numbers, comma-separated", "text": "text"}
        while True:
            raw = (await asyncio.to_thread(input, f"  answer ({hint[question['input_type']]}): ")).strip()
            picked = [p.strip() for p in raw.split(",")] if question["input_type"] == "multi-select" else [raw]
            if all(p.isdigit() and 1 <= int(p) <= len(labels) for p in picked) and labels:
                chosen: Any = [labels[int(p) - 1] for p in picked]
                value = chosen if question["input_type"] == "multi-select" else chosen[0]
            else:
                value = raw
            try:
                answer, freeform = check_answer(question, value)
            except ValueError as exc:
                self.err.print(Text(str(exc), style="red"))
                continue
            return ApprovalDecision("answered", "cli:user", answer={"answer": answer, "freeform": freeform})
