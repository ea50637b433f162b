"""A run's tape: everything nondeterministic it read, recorded as it ran and played back to replay it.

`Recorder` is a step executor (`ringlet.loop.StepExecutor`) around the run's own: each model request's
chunks (and a summary of the request, to notice a replay that asks something else), each tool call's value
with the events it emitted meanwhile (a sub-agent's) and the order the calls finished in, each recorded
step's value, the steers it took at each round boundary, and every clock reading and id the run took from
its seam. Readings taken inside a tool call
belong to that call (a sub-agent's ids): a replay does not run the call, so it does not take them.

`Player` is the step executor of a replay: it answers from a tape without calling the model or any tool,
hands back the recorded readings in order, gives the run its recorded steers at their boundaries
(`Player.inbox`), and notes the first place where the code asks for something the
tape does not hold (`Divergence`): another request, a call the run did not make, more clock readings.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ringlet import errors
from ringlet._ids import Seam, new_id
from ringlet.agent.subagents import spawns
from ringlet.context import RunContext
from ringlet.errors import ToolFailure
from ringlet.events import BaseEvent, event_adapter
from ringlet.loop.steering import Steer
from ringlet.loop.step_json import chunk_json, chunk_of, value_json, value_of
from ringlet.loop.steps import LANE
from ringlet.messages import dump_messages
from ringlet.models.base import Chunk, Model, ModelRequest
from ringlet.tools.base import Tool, Toolset
from ringlet.usage import Usage

__all__ = ["Divergence", "Player", "Recorder", "request_summary"]

ORDER_WAIT_S = 5.0
"""How long a replayed call waits for the calls that finished before it in the recording."""
_IN_CALL: contextvars.ContextVar[str | None] = contextvars.ContextVar("ringlet_replay_call", default=None)
"""The tool call whose backend is running in this task: its seam readings are its own, not the run's."""


@dataclass(frozen=True, slots=True)
class Divergence:
    """Where a replay first differed from its recording: `kind` is `request` (a model request differs),
    `tool_call` (a call the recording has no result for, or with other arguments), `seam` (more clock
    readings or ids than recorded), `pause` (the runs paused at different places), `event` (the events
    differ at `index`) or `length` (one has more events). `expected` is the recording's, `actual` the replay's."""

    kind: str
    message: str
    index: int | None = None
    expected: Any = None
    actual: Any = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _digest(value: Any) -> str:
    data = value if isinstance(value, bytes) else json.dumps(value, sort_keys=True, default=str).encode()
    return hashlib.blake2b(data, digest_size=8).hexdigest()


_TOOLS: dict[int, tuple[Sequence[Any], str]] = {}
"""Digests of the tool lists requests carried, by the list's identity (a run's requests share one): the
schemas are hashed once, not on every request."""


def _tools_digest(tools: Sequence[Any]) -> str:
    known = _TOOLS.get(id(tools))
    if known is not None and known[0] is tools:
        return known[1]
    digest = _digest([[t.name, t.description, t.parameters] for t in tools])
    if len(_TOOLS) > 256:
        _TOOLS.clear()
    _TOOLS[id(tools)] = (tools, digest)
    return digest


def request_summary(request: ModelRequest) -> dict[str, Any]:
    """What a tape keeps of a model request: enough to tell that a replay asks the same (its messages'
    count, the last message, the instructions, the tools, the settings), without the whole transcript."""
    settings = request.settings
    return {"messages": len(request.messages),
            "last": _digest(dump_messages(request.messages[-1:])) if request.messages else None,
            "instructions": _digest((request.instructions or "").encode()),
            "tools": [t.name for t in request.tools],
            "tool_schemas": _tools_digest(request.tools),
            "settings": [settings.temperature, settings.top_p, settings.max_tokens],
            "output": None if request.output is None else _digest(str(request.output))}


class Recorder:
    """A step executor that runs `inner` and records what each step gave (`segment()`: the tape, JSON)."""

    def __init__(self, inner: Any, start: dict[str, Any]) -> None:
        self.inner, self.start = inner, start
        self.number = 0 if start.get("kind") == "start" else time.time_ns() // 1_000_000
        """Its segment: 0 for a run's start, a resume's by when it began (after its pause was stored)."""
        source = inner.seam
        self.lanes: dict[str, dict[str, list[Any]]] = {}
        self.models: list[dict[str, Any]] = []
        self.tools: dict[str, dict[str, Any]] = {}
        self.records: list[Any] = []
        self.decisions: list[dict[str, Any]] = []
        self.steers: list[tuple[int, Sequence[Steer]]] = []
        self._finished = 0

        lanes = self.lanes

        def kept(kind: str, value: Any) -> Any:
            if _IN_CALL.get() is None:  # a tool's own readings are not the run's: a replay does not run it
                lane = LANE.get()
                readings = lanes.get(lane)
                if readings is None:
                    readings = lanes[lane] = {"now": [], "monotonic": [], "ids": []}
                readings[kind].append(value)
            return value

        def read_now() -> float:
            return kept("now", source.now())

        def read_mono() -> float:
            return kept("monotonic", source.monotonic())

        def make_id(prefix: str) -> str:
            return kept("ids", source.new_id(prefix))

        self.seam = Seam(now=read_now, monotonic=read_mono, new_id=make_id)

    def segment(self) -> dict[str, Any]:
        """This run's (or resumed run's) tape, as JSON."""
        head = {k: v() if callable(v) else v for k, v in self.start.items()}
        return {**head, "segment": self.number, "seam": self.lanes,
                "models": self.models, "tools": self.tools, "records": self.records, "decisions": self.decisions,
                **({"steers": self._steers()} if self.steers else {})}

    def _steers(self) -> list[dict[str, Any]]:
        """The steers taken, written down as the run has them now (a host may have marked them stored)."""
        return [{"at": at, "steers": [s.to_json() for s in steers]} for at, steers in self.steers]

    def stream_model(self, model: Model, request: ModelRequest) -> AsyncIterator[Chunk]:
        return self._model(model, request)

    async def _model(self, model: Model, request: ModelRequest) -> AsyncIterator[Chunk]:
        entry: dict[str, Any] = {"model": model.name, "request": request_summary(request), "chunks": []}
        self.models.append(entry)
        try:
            async for chunk in self.inner.stream_model(model, request):
                entry["chunks"].append(chunk_json(chunk))
                yield chunk
        except errors.ProviderError as exc:
            entry["error"] = {"class": type(exc).__name__, "message": exc.message, "status": exc.status,
                              "retry_after_s": exc.retry_after_s, "provider": exc.provider}
            raise

    def batch(self, calls: Sequence[tuple[str, Tool]]) -> None:
        self.inner.batch(calls)

    def order(self, keys: Sequence[str]) -> None:
        self.inner.order(keys)

    def call_tool(self, toolset: Toolset, tool: Tool, args: dict[str, Any], ctx: RunContext,
                  call_id: str) -> Awaitable[Any]:
        return self._call(toolset, tool, args, ctx, call_id)

    async def _call(self, toolset: Toolset, tool: Tool, args: dict[str, Any], ctx: RunContext, call_id: str) -> Any:
        entry: dict[str, Any] = {"name": tool.name, "args": _digest(args), "events": []}
        self.tools[call_id] = entry
        if ctx.tool_call_id == call_id and ctx.emit is not None:  # its own context: keep what it emits
            outer = ctx.emit

            def emit(event: BaseEvent) -> None:
                entry["events"].append(event.model_dump())
                outer(event)

            ctx.emit = emit
        token = _IN_CALL.set(call_id)
        try:
            value = await self.inner.call_tool(toolset, tool, args, ctx, call_id)
        except ToolFailure as exc:
            usage = getattr(exc, "usage", None)  # a failed sub-agent's (`subagents.ChildFailure`)
            entry["value"] = {"failure": [exc.code, exc.message, exc.extra], **({"usage": usage} if usage else {})}
            raise
        except Exception as exc:
            entry["value"] = {"raised": [type(exc).__name__, str(exc)]}
            raise
        else:
            entry["value"] = value_json(value)
            return value
        finally:
            _IN_CALL.reset(token)
            entry["finished"], self._finished = self._finished, self._finished + 1

    def record(self, name: str, work: Callable[[], Awaitable[Any]], key: str | None = None) -> Awaitable[Any]:
        return self._record(name, work, key)

    async def _record(self, name: str, work: Callable[[], Awaitable[Any]], key: str | None) -> Any:
        value = await self.inner.record(name, work, key)
        self.records.append(json.loads(json.dumps(value, default=str)))
        return value

    def took(self, requests: int, steers: Sequence[Steer]) -> None:
        self.steers.append((requests, steers))
        self.inner.took(requests, steers)


class Player:
    """A step executor that answers from a tape (`Recorder.segment()`): no model and no tool runs. The first
    difference from the recording is kept in `divergence` (shared by a replay's segments)."""

    def __init__(self, tape: dict[str, Any], noted: list[Divergence]) -> None:
        self.tape, self.noted = tape, noted
        self._lanes = {lane: {kind: iter(values) for kind, values in kinds.items()}
                       for lane, kinds in tape.get("seam", {}).items()}
        self._models = iter(enumerate(tape.get("models", [])))
        self._records = iter(tape.get("records", []))
        self._turn, self._turned = 0, asyncio.Condition()

        def read_now() -> float:
            return self._next("now", "clock reading", time.time)

        def read_mono() -> float:
            return self._next("monotonic", "monotonic clock reading", time.perf_counter)

        def make_id(prefix: str) -> str:
            made = self._next("ids", f"{prefix!r} id", lambda: new_id(prefix))
            if not made.startswith(f"{prefix}_"):
                self.diverge("seam", f"the replay asked for a {prefix!r} id where the recording made {made!r}",
                             expected=made, actual=prefix)
            return made

        self.seam = Seam(now=read_now, monotonic=read_mono, new_id=make_id)

    def diverge(self, kind: str, message: str, **fields: Any) -> None:
        self.noted.append(Divergence(kind, message, **fields))

    def _next(self, kind: str, what: str, fresh: Callable[[], Any]) -> Any:
        lane = LANE.get()
        try:
            return next(self._lanes[lane][kind])
        except (KeyError, StopIteration):
            where = f" in {lane}" if lane else ""
            self.diverge("seam", f"the replay took one {what}{where} more than the recorded run")
            return fresh()

    def stream_model(self, model: Model, request: ModelRequest) -> AsyncIterator[Chunk]:
        return self._model(model, request)

    async def _model(self, model: Model, request: ModelRequest) -> AsyncIterator[Chunk]:
        found = next(self._models, None)
        if found is None:
            self.diverge("request", "the replay made a model request the recorded run did not make",
                         actual=request_summary(request))
            raise errors.ProviderError("replay: the recording holds no response for this request", provider="replay")
        index, entry = found
        summary = request_summary(request)
        if summary != entry["request"]:
            differs = [k for k in summary if summary[k] != entry["request"].get(k)]
            self.diverge("request", f"model request {index + 1} differs from the recording in: {', '.join(differs)}",
                         index=index, expected=entry["request"], actual=summary)
        for data in entry["chunks"]:
            yield chunk_of(data)
        if (error := entry.get("error")) is not None:
            error = dict(error)
            cls = getattr(errors, error.pop("class"), errors.ProviderError)
            raise cls(error.pop("message"), **error)

    def batch(self, calls: Sequence[tuple[str, Tool]]) -> None:
        pass

    def order(self, keys: Sequence[str]) -> None:
        pass

    def call_tool(self, toolset: Toolset, tool: Tool, args: dict[str, Any], ctx: RunContext,
                  call_id: str) -> Awaitable[Any]:
        return self._call(tool, args, ctx, call_id)

    async def _call(self, tool: Tool, args: dict[str, Any], ctx: RunContext, call_id: str) -> Any:
        entry = self.tape.get("tools", {}).get(call_id)
        if entry is None or entry["name"] != tool.name:
            self.diverge("tool_call", f"the replay calls {tool.name!r} as {call_id}, which the recorded run did "
                         "not call", expected=None if entry is None else entry["name"], actual=tool.name)
            raise ToolFailure("not_recorded", f"replay: the recording has no result for {tool.name!r} ({call_id})")
        if entry["args"] != _digest(args):
            self.diverge("tool_call", f"the replay calls {tool.name!r} ({call_id}) with other arguments than the "
                         "recorded run", actual=args)
        turn = entry.get("finished", 0)
        async with self._turned:  # calls finish in the recorded order, so their results arrive in it
            try:
                await asyncio.wait_for(self._turned.wait_for(lambda: self._turn >= turn), ORDER_WAIT_S)
            except TimeoutError:
                self.diverge("tool_call", f"{tool.name!r} ({call_id}) finished after a call the replay did not make")
        try:
            if ctx.emit is not None:
                for data in entry["events"]:
                    ctx.emit(event_adapter.validate_python(data))
            value = entry.get("value")
            if value is not None and spawns(tool):  # the child's usage is its parent's, as when it ran
                usage = value.get("usage") or value.get("metadata", {}).get("usage")
                if usage:
                    ctx.usage.add(Usage(**usage))
            if value is None:
                raise asyncio.CancelledError  # it was cut off (a timeout, a cancel) before it gave a value
            if "raised" in value:
                name, message = value["raised"]
                raise type(name, (Exception,), {})(message)
            return value_of(value)
        finally:
            async with self._turned:
                self._turn += 1
                self._turned.notify_all()

    def record(self, name: str, work: Callable[[], Awaitable[Any]], key: str | None = None) -> Awaitable[Any]:
        return self._record(name)

    async def _record(self, name: str) -> Any:
        try:
            return next(self._records)
        except StopIteration:
            self.diverge("request", f"the replay recorded a step ({name}) the recorded run did not")
            raise ToolFailure("not_recorded", f"replay: the recording has no value for step {name!r}") from None

    def took(self, requests: int, steers: Sequence[Steer]) -> None:
        pass

    def inbox(self) -> TapeInbox:
        """The replayed run's inbox: the steers the recorded run took, each at its boundary."""
        return TapeInbox(self.tape.get("steers", []), self)


class TapeInbox:
    """A replay's inbox (`ringlet.loop.steering.Inbox`): at each boundary the steers the recorded run took
    there; a boundary the recorded run took steers at and the replay does not reach is a divergence."""

    __slots__ = ("left", "player")

    def __init__(self, taken: Sequence[dict[str, Any]], player: Player) -> None:
        self.left = {int(t["at"]): [Steer.from_json(s) for s in t["steers"]] for t in taken}
        self.player = player

    @property
    def pending(self) -> bool:
        return bool(self.left)

    async def take(self, requests: int) -> list[Steer]:
        for at in [at for at in self.left if at < requests]:  # passed without taking them
            self.player.diverge("request", f"the recorded run took {len(self.left.pop(at))} steer(s) after model "
                                f"request {at}, where the replay took none")
        return self.left.pop(requests, [])
