"""Running an agent's guardrails in a run: `Guardrails` (what an agent brings) and `GuardRun` (one run's
checks: decisions as `guardrail` events and audit records, redactions applied, a block raised as the
error `guardrail_blocked`), and `OutputGate`, which checks a streamed answer before it is sent."""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from ringlet.errors import RunError
from ringlet.events import GuardrailEvent
from ringlet.guardrails.base import ALLOW, Block, Checked, Guardrail, Redact, Stage, Verdict, redacted
from ringlet.messages import Message, Part, TextPart
from ringlet.models.base import Finish, TextDelta

if TYPE_CHECKING:
    from ringlet._ids import Seam
    from ringlet.context import RunContext
    from ringlet.usage import RequestUsage, Usage

StreamMode = Literal["sentence", "hold"]
SENTENCE_END = re.compile(r"[.!?…](?=\s)|\n")


@dataclass(frozen=True, slots=True)
class Guardrails:
    """An agent's guardrails, in the order they check; `stream`: how an answer is sent while output
    guardrails check it, a sentence at a time once each is checked (`sentence`) or whole once checked
    (`hold`)."""

    rails: tuple[Guardrail, ...]
    stream: StreamMode = "sentence"

    def at(self, stage: Stage) -> tuple[Guardrail, ...]:
        return tuple(r for r in self.rails if stage in r.stages)


class GuardrailBlocked(RunError):
    """A guardrail blocked a text: the run ends with the error `guardrail_blocked`."""

    def __init__(self, guardrail: str, stage: Stage, reason: str) -> None:
        super().__init__("guardrail_blocked", f"guardrail {guardrail!r} blocked the {_WHAT[stage]}: {reason}",
                         details={"guardrail": guardrail, "stage": stage, "reason": reason})


_WHAT = {"input": "message", "output": "answer", "tool_args": "tool call", "tool_result": "tool result"}


class GuardRun:
    """One run's guardrail checks. Decisions wait in `pending` until the loop sends them (`take`)."""

    def __init__(self, guards: Guardrails, ctx: RunContext, seam: Seam, *,
                 audit: Callable[[dict[str, Any]], Any] | None,
                 stream_model: Callable[[Any, Any], AsyncIterator[Any]] | None,
                 cost: Callable[[RequestUsage], float | None], usage: Usage) -> None:
        self.guards, self.ctx, self.seam, self.audit = guards, ctx, seam, audit
        self.stream_model, self.cost, self.usage = stream_model, cost, usage
        self.pending: list[GuardrailEvent] = []

    def has(self, stage: Stage) -> bool:
        return bool(self.guards.at(stage))

    @property
    def has_tools(self) -> bool:
        return self.has("tool_args") or self.has("tool_result")

    def take(self) -> list[GuardrailEvent]:
        out, self.pending = self.pending, []
        return out

    async def check(self, stage: Stage, text: str, *, tool: str | None = None, tool_call_id: str | None = None,
                    message_id: str | None = None, allowed: dict[str, bool] | None = None) -> str:
        """`text` through each guardrail of `stage`, redacted as they say; a block raises
        `GuardrailBlocked`. `allowed`: instead of recording each allow, note which guardrails only allowed
        (a streamed answer records one allow per such guardrail at its end)."""
        at = Checked(stage, tool, self.stream_model, self.cost, self.seam.monotonic)
        for rail in self.guards.at(stage):
            verdict = await rail.check(text, at)
            if verdict.usage is not None:
                self.usage.add(verdict.usage)
            if allowed is not None:
                if verdict.decision == "allow" and verdict.usage is None:
                    allowed.setdefault(rail.name, True)
                    continue
                allowed[rail.name] = False
            await self.record(rail.name, stage, verdict, tool=tool, tool_call_id=tool_call_id, message_id=message_id)
            if isinstance(verdict, Redact):
                text = redacted(text, verdict.spans)
            elif isinstance(verdict, Block):
                raise GuardrailBlocked(rail.name, stage, verdict.reason)
        return text

    async def record(self, name: str, stage: Stage, verdict: Verdict, *, tool: str | None = None,
                     tool_call_id: str | None = None, message_id: str | None = None) -> None:
        """One decision: an audit record (beside the policy's) and a `guardrail` event."""
        kinds = verdict.kinds if isinstance(verdict, Block) else tuple(dict.fromkeys(
            s.kind for s in verdict.spans)) if isinstance(verdict, Redact) else ()
        reason = verdict.reason if isinstance(verdict, Block) else None
        usage = verdict.usage.as_dict() if verdict.usage is not None else None
        ctx, at, audit_id = self.ctx, self.seam.stamp(), self.seam.new_id("au")  # drawn alike with or without a sink
        if self.audit is not None:
            written = self.audit({
                "audit_id": audit_id, "at": at, "action": "guardrail.check", "guardrail": name,
                "stage": stage, "tool": tool, "tool_call_id": tool_call_id, "message_id": message_id,
                "decision": verdict.decision, "kinds": list(kinds), "reason": reason, "usage": usage,
                "run_id": ctx.run_id, "conversation_id": ctx.conversation_id, "agent": ctx.agent,
                "org_id": ctx.org_id, "realm": ctx.realm, "request_id": ctx.request_id,
                "subject": {"user_id": ctx.user_id, "org_id": ctx.org_id, "roles": list(ctx.roles),
                            "channel": ctx.channel}})
            if inspect.isawaitable(written):
                await written
        self.pending.append(GuardrailEvent(
            run_id=ctx.run_id, ts=at, guardrail=name, stage=stage, decision=verdict.decision, kinds=kinds,
            reason=reason, tool=tool, tool_call_id=tool_call_id, message_id=message_id, usage=usage,
            audit_id=audit_id if self.audit is not None else None))

    async def message(self, message: Message) -> Message:
        """A user's message through the input guardrails: the same message, or a copy with its text
        redacted (`metadata.redacted`)."""
        if isinstance(message.content, str):
            content: str | tuple[Part, ...] = await self.check("input", message.content, message_id=message.id)
        else:
            content = tuple([replace(p, text=await self.check("input", p.text, message_id=message.id))
                             if isinstance(p, TextPart) else p for p in message.content])
        if content == message.content:
            return message
        return replace(message, content=content, metadata={**message.metadata, "redacted": True})

    async def arguments(self, args: dict[str, Any], tool: str, tool_call_id: str) -> dict[str, Any]:
        """A call's arguments through the tool_args guardrails (as their JSON text)."""
        text = json.dumps(args, ensure_ascii=False, default=str)
        checked = await self.check("tool_args", text, tool=tool, tool_call_id=tool_call_id)
        if checked == text:
            return args
        try:
            return json.loads(checked)
        except ValueError:
            raise GuardrailBlocked("tool_args", "tool_args", "the redacted arguments are no longer valid JSON") \
                from None

    def output(self, message_id: str) -> OutputGate | None:
        return OutputGate(self, message_id) if self.has("output") else None


class OutputGate:
    """A streamed answer through the output guardrails: each piece is held until it is checked, a
    sentence at a time (`sentence`) or the whole answer (`hold`); what is sent is what passed (redacted
    as decided). A block after some sentences were sent says so in its error."""

    def __init__(self, guard: GuardRun, message_id: str) -> None:
        self.guard, self.message_id = guard, message_id
        self.hold = guard.guards.stream == "hold"
        self.buffer = ""
        self.sent: list[str] = []
        self.allowed: dict[str, bool] = {}

    async def feed(self, delta: str) -> str:
        """The text to send now for `delta` (maybe none)."""
        self.buffer += delta
        if self.hold:
            return ""
        ends = [m.end() for m in SENTENCE_END.finditer(self.buffer)]
        if not ends:
            return ""
        ready, self.buffer = self.buffer[:ends[-1]], self.buffer[ends[-1]:]
        return await self._pass(ready)

    async def finish(self) -> str:
        """The rest of the answer, checked; then one `allow` per guardrail that allowed every piece."""
        rest, self.buffer = self.buffer, ""
        out = await self._pass(rest) if rest else ""
        for rail in self.guard.guards.at("output"):
            if self.allowed.get(rail.name):
                await self.guard.record(rail.name, "output", ALLOW, message_id=self.message_id)
        return out

    @property
    def text(self) -> str:
        """What was sent: the answer as it is stored."""
        return "".join(self.sent)

    async def checked(self, chunks: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """A model's stream with its text held until checked: text deltas as they pass, the rest before
        the stream's `Finish`; other chunks (tool calls, notices) as they come."""
        try:
            async for chunk in chunks:
                if isinstance(chunk, TextDelta):
                    if out := await self.feed(chunk.text):
                        yield TextDelta(out)
                    continue
                if isinstance(chunk, Finish) and (out := await self.finish()):
                    yield TextDelta(out)
                yield chunk
            if self.buffer and (out := await self.finish()):  # a stream that ended without its Finish
                yield TextDelta(out)
        finally:
            if (close := getattr(chunks, "aclose", None)) is not None:
                await close()

    async def _pass(self, piece: str) -> str:
        try:
            out = await self.guard.check("output", piece, message_id=self.message_id, allowed=self.allowed)
        except GuardrailBlocked as exc:
            if self.sent:
                exc.message += f" (the {len(self.text)} characters sent before it stand; the rest is withheld)"
                exc.args = (exc.message,)
            raise
        self.sent.append(out)
        return out
