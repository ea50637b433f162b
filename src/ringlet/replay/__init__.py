"""Replay a finished run exactly, without calling the model or any tool, and see where today's code differs.

A run is recorded on a tape (`ringlet.replay.tape`): the model's responses, the tools' results, the humans'
decisions, and every clock reading and id it took. `replay()` runs the same agent again on the tape: the
loop computes its events anew from the recorded answers, and the report says whether they are the
recorded events byte for byte, or where the first difference is (another model request, a call the run did
not make, a different event). It is the debugging tool for "why did the agent do that", and a regression
check when the loop changes.

    recording = Recording()
    result = await recording.run(agent, "What is 2 + 2?")          # Agent.run's options (caller, settings…)
    recording.save("run.json")
    ...
    report = await replay(agent, Recording.load("run.json"))
    print(report.same, report.divergence)

The server records every loop run of a conversation (`run_tapes`; a `/v1` run without one stores no transcript):
`ringlet runs` lists them, `ringlet replay RUN_ID` and `POST /api/v1/runs/{id}/replay` replay one.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ringlet.agent import Agent, AgentStream, RunResult
from ringlet.agent.settings import RunHost, RunSettings
from ringlet.context import ANYONE, Caller
from ringlet.errors import ConfigError
from ringlet.events import Event
from ringlet.gates.approval import ApprovalDecision, ApprovalRequest, Approver
from ringlet.loop import RunState
from ringlet.messages import Message, dump_messages, load_messages
from ringlet.replay.tape import Divergence, Player, Recorder

__all__ = ["Divergence", "RecordedStream", "Recording", "ReplayReport", "detached", "replay"]

def start_segment(prompt: Any, history: Sequence[Message], caller: Caller | None,
                  plugin_data: dict[str, Any] | None = None) -> dict[str, Any]:
    """The head of a run's first tape: its prompt, history, its caller and the plugin data it started with
    (`options`: the plain values a recording keeps; the rest, such as deps, tools or a model, the replay is
    given). A prompt of messages is kept as the run saw them (`Recorder.segment()` writes them down: a host
    may mark them stored meanwhile)."""
    given: Any = {"text": prompt} if isinstance(prompt, str) else \
        (lambda: {"messages": json.loads(dump_messages([prompt] if isinstance(prompt, Message) else list(prompt)))})
    options = {k: v for k, v in asdict(caller or ANYONE).items() if v is not None}
    options["roles"] = list(options["roles"])
    if plugin_data is not None:
        options["plugin_data"] = plugin_data
    return {"kind": "start", "prompt": given, "history": json.loads(dump_messages(history)), "options": options}


def _started(options: Mapping[str, Any]) -> tuple[Caller, dict[str, Any] | None]:
    """The caller and plugin data a tape's head kept (`start_segment`)."""
    kept = dict(options)
    plugin_data = kept.pop("plugin_data", None)
    return Caller(**kept), plugin_data


def resume_segment(decisions: Mapping[str, ApprovalDecision | bool] | None, decided_by: str = "user") -> dict[str, Any]:
    """The head of a resumed run's tape: the decisions it was resumed with."""
    return {"kind": "resume", "decided_by": decided_by,
            "resume": {k: asdict(ApprovalDecision.of(v, decided_by)) for k, v in (decisions or {}).items()}}


def recorder(agent: Agent[Any, Any], head: dict[str, Any], steps: Any = None) -> Recorder:
    """A step executor recording a run of `agent` (on `steps`, by default the agent's own)."""
    return Recorder(steps or agent.loop_config.steps, head)


class _RecordingApprover:
    """The run's approver, its decisions kept on the tape."""

    def __init__(self, inner: Approver, tape: Recorder) -> None:
        self.inner, self.tape = inner, tape

    async def wait(self, requests: Sequence[ApprovalRequest]) -> Mapping[str, ApprovalDecision]:
        decided = await self.inner.wait(requests)
        self.tape.decisions.append({k: asdict(d) for k, d in decided.items()})
        return decided


class _ReplayingApprover:
    """Gives back the recorded decisions, in order."""

    def __init__(self, decisions: Sequence[Mapping[str, Any]]) -> None:
        self.decisions = iter(decisions)

    async def wait(self, requests: Sequence[ApprovalRequest]) -> Mapping[str, ApprovalDecision]:
        decided = next(self.decisions, None)
        if decided is None:
            return {r.tool_call_id: ApprovalDecision("denied", "replay", "not in the recording") for r in requests}
        return {k: ApprovalDecision(**d) for k, d in decided.items()}


class RecordedStream:
    """An `AgentStream` whose events are kept on its `Recording` as they pass (`.result`, `.state` as usual)."""

    def __init__(self, stream: AgentStream[Any], events: list[dict[str, Any]]) -> None:
        self.stream, self._events = stream, events

    def __aiter__(self) -> Any:
        return self._pass()

    async def _pass(self) -> Any:
        async for event in self.stream:
            self._events.append(event.model_dump())
            yield event

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


@dataclass
class Recording:
    """One run's tapes (its start, then one per resume) and its events, as JSON (`to_json`, `save`)."""

    segments: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    _live: Recorder | None = field(default=None, repr=False)

    def stream(self, agent: Agent[Any, Any], prompt: Any, *, history: Sequence[Message] = (),
               caller: Caller | None = None, settings: RunSettings | None = None, deps: Any = None) -> RecordedStream:
        """`agent.stream(prompt, history=…, caller=…, settings=…, deps=…)`, recorded."""
        settings = settings or RunSettings()
        tape = recorder(agent, start_segment(prompt, history, caller, settings.plugin_data))
        host, approver = self._host(agent, tape, settings.host, settings.approver)
        return self._recorded(agent.stream(prompt, history=history, caller=caller, deps=deps,
                                           settings=replace(settings, host=host, approver=approver)), tape)

    async def run(self, agent: Agent[Any, Any], prompt: Any, **options: Any) -> RunResult[Any]:
        """`agent.run(prompt, **options)`, recorded."""
        return await self._drain(self.stream(agent, prompt, **options))

    def resume_stream(self, agent: Agent[Any, Any], state: RunState | str | bytes,
                      decisions: Mapping[str, ApprovalDecision | bool] | None = None, **options: Any) -> RecordedStream:
        """`agent.resume_stream(state, decisions, **options)`, recorded."""
        tape = recorder(agent, resume_segment(decisions, options.get("decided_by", "user")))
        host, approver = self._host(agent, tape, options.get("host"), options.get("approver"))
        options |= {"host": host, **({"approver": approver} if approver is not None else {})}
        return self._recorded(agent.resume_stream(state, decisions, **options), tape)

    async def resume(self, agent: Agent[Any, Any], state: RunState | str | bytes,
                     decisions: Mapping[str, ApprovalDecision | bool] | None = None, **options: Any) -> RunResult[Any]:
        return await self._drain(self.resume_stream(agent, state, decisions, **options))

    def _host(self, agent: Agent[Any, Any], tape: Recorder, host: RunHost | None,
              approver: Approver | None) -> tuple[RunHost, Approver | None]:
        """The run's host, its steps on `tape`, and its approver (or the agent's), its decisions kept there."""
        if self._live is not None:
            self.segments.append(self._live.segment())
        self._live = tape
        approver = approver or agent.approver
        return replace(host or RunHost(), steps=tape), _RecordingApprover(approver, tape) if approver else None

    def _recorded(self, stream: AgentStream[Any], tape: Recorder) -> RecordedStream:
        if stream.run.config.steps is not tape:
            raise ConfigError("this agent cannot be recorded: its runs do not take their steps from the host")
        return RecordedStream(stream, self.events)

    async def _drain(self, stream: RecordedStream) -> RunResult[Any]:
        async for _ in stream:
            pass
        result = stream.result
        assert result is not None, "a run ends with message_end or pauses"
        return result

    def tapes(self) -> list[dict[str, Any]]:
        """Every segment's tape, the one being recorded included."""
        return [*self.segments, *([self._live.segment()] if self._live is not None else [])]

    def to_json(self) -> str:
        return json.dumps({"version": 1, "segments": self.tapes(), "events": self.events}, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str | bytes) -> Recording:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("version") != 1 or not isinstance(data.get("segments"), list):
            raise ConfigError("not a ringlet recording (expected {\"version\": 1, \"segments\": [...], ...})")
        return cls(segments=data["segments"], events=data.get("events", []))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json(), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> Recording:
        return cls.from_json(Path(path).read_bytes())


@dataclass(frozen=True)
class ReplayReport:
    """What a replay found: the events it produced, how many were recorded, and every divergence it noted
    in order (`divergence`: the first; None when the replay is the recording byte for byte)."""

    events: list[dict[str, Any]]
    recorded: int
    divergences: list[Divergence]

    @property
    def divergence(self) -> Divergence | None:
        return self.divergences[0] if self.divergences else None

    @property
    def same(self) -> bool:
        return not self.divergences

    def as_dict(self) -> dict[str, Any]:
        return {"same": self.same, "events": len(self.events), "recorded_events": self.recorded,
                "divergence": None if self.divergence is None else self.divergence.as_dict(),
                "divergences": [d.as_dict() for d in self.divergences]}


def detached(agent: Agent[Any, Any]) -> Agent[Any, Any]:
    """A copy of `agent` whose decisions are audited nowhere lasting: a replay must not add to an audit log
    (its approvals' decisions, its policy gates' records go to in-memory logs of their own)."""
    from ringlet.gates import AuditLog

    config = agent.loop_config
    gates: list[Any] = []
    for gate in config.gates:
        quiet: Any = copy.copy(gate) if hasattr(gate, "audit") else gate
        if quiet is not gate:
            quiet.audit = AuditLog()
        gates.append(quiet)
    # the audit sink is still called: the record takes its id and time from the seam, as it did
    return agent.with_config(gates=tuple(gates), audit=AuditLog() if config.audit is not None else None)


def canonical(event: Mapping[str, Any]) -> str:
    """An event's JSON as compared: the bytes a client would get."""
    return json.dumps(event, ensure_ascii=False, separators=(",", ":"), default=str)


async def replay(agent: Agent[Any, Any], recording: Recording, *, events: Sequence[Mapping[str, Any]] | None = None,
                 settings: RunSettings | None = None, deps: Any = None) -> ReplayReport:
    """Run `agent` again on `recording`'s tapes, without calling its model or any tool, and compare the events
    with `events` (default: the recording's own). `settings` and `deps`: what the recording cannot keep (an
    output type, a model, tools…, deps), as the run was given them."""
    noted: list[Divergence] = []
    produced: list[dict[str, Any]] = []
    expected = list(recording.events if events is None else events)
    paused: RunState | None = None
    for tape in recording.tapes():
        player = Player(tape, noted)
        run = settings or RunSettings()
        host = replace(run.host or RunHost(), steps=player)
        approver = _ReplayingApprover(tape["decisions"]) if tape.get("decisions") else run.approver
        stream: AgentStream[Any]
        if tape["kind"] == "start":
            caller, plugin_data = _started(tape["options"])
            stream = agent.stream(_prompt(tape["prompt"]), history=load_messages(tape["history"]), caller=caller,
                                  deps=deps, settings=replace(run, host=host, approver=approver,
                                                              plugin_data=plugin_data or run.plugin_data))
        elif paused is None:
            noted.append(Divergence("pause", "the recorded run paused for people and was resumed; the replay "
                                    "did not pause"))
            break
        else:
            decided = {k: ApprovalDecision(**d) for k, d in tape["resume"].items()}
            stream = agent.resume_stream(paused, decided, decided_by=tape.get("decided_by", "user"), host=host,
                                         approver=approver, deps=deps)
        if tape.get("steers"):  # the steers the recorded run took, at the same boundaries
            stream.run.inbox = player.inbox()
        event: Event
        async for event in stream:  # compared as they come: the divergences stay in the order they happened
            produced.append(got := event.model_dump())
            i = len(produced) - 1
            if i < len(expected) and not any(d.kind == "event" for d in noted) and \
                    (differs := _difference(i, expected[i], got)) is not None:
                noted.append(differs)
        result = stream.result
        paused = result.state if result is not None and result.status == "input_required" else None
    if len(expected) != len(produced):
        n = min(len(expected), len(produced))
        noted.append(Divergence("length", f"the recording has {len(expected)} events, the replay {len(produced)}",
                                index=n, expected=dict(expected[n]) if n < len(expected) else None,
                                actual=produced[n] if n < len(produced) else None))
    return ReplayReport(produced, len(expected), noted)


def _prompt(given: Mapping[str, Any]) -> Any:
    return given["text"] if "text" in given else load_messages(given["messages"])


def _difference(i: int, want: Mapping[str, Any], got: Mapping[str, Any]) -> Divergence | None:
    if canonical(want) == canonical(got):
        return None
    if want.get("type") != got.get("type"):
        message = f"event {i + 1} differs: the recording has {want.get('type')}, the replay {got.get('type')}"
    else:
        fields = ", ".join(k for k in {**want, **got} if want.get(k) != got.get(k)) or "key order"
        message = f"event {i + 1} ({want.get('type')}) differs in: {fields}"
    return Divergence("event", message, index=i, expected=dict(want), actual=dict(got))
