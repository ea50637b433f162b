"""A durable run executed again after its worker died: what the dead execution logged, and how the model
attempt it left in flight is closed before the next one streams.

The execution that died logged events (`Logged`); the new one replays the same steps and yields them again,
and the driver neither stores nor sends those twice (`ActiveRun.replay`). A model request whose step never
finished is sent again, and the model answers anew: other tool-call ids (hosted models draw them at
random), other text. Before that request goes out (`DurableSteps.sending`), whatever the dead attempt
streamed and the replay has not matched is closed, stored and sent:

    each of its tool calls without a result      tool_result {is_error, error.code: "superseded"} (none ran)
    its text and those calls                      retracted {message_id, tool_call_ids, reason: "resent"}

A client drops the retracted text and calls; what follows is the new attempt, which may stream the same
message id again from its start. The transcript never held the dead attempt (it is saved once the
request has finished), so what a client assembles equals it, live or replayed from the log."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ringlet._ids import now
from ringlet.events import Event, RetractedEvent, ToolResultEvent
from ringlet.server.runs.active import ActiveRun, replay_key

__all__ = ["SUPERSEDED", "Logged", "retraction"]

SUPERSEDED = {"code": "superseded", "message": "the model request that made this call was sent again after the "
                                               "worker executing the run stopped; the call never ran"}


@dataclass
class Logged:
    """What an execution that died logged of a run (its events after the run's first, in order)."""

    replay: Counter[tuple[Any, ...]] = field(default_factory=Counter)
    """Each event's `replay_key`, counted (`ActiveRun.replay`)."""
    open_calls: dict[str, str] = field(default_factory=dict)
    """The run's own tool calls started without a result: call id → tool name."""

    @classmethod
    def of(cls, rows: list[tuple[str, dict[str, Any]]]) -> Logged:
        out = cls(Counter(replay_key(kind, p.get) for kind, p in rows))
        for kind, p in rows:
            if "agent_path" in p:
                continue  # a sub-agent's: its own run closes its calls
            if kind == "tool_call_start":
                out.open_calls[p["tool_call_id"]] = p["name"]
            elif kind == "tool_result":
                out.open_calls.pop(p["tool_call_id"], None)
        return out


def retraction(run: ActiveRun, open_calls: dict[str, str]) -> list[Event]:
    """The events that close the model attempt a dead execution left in flight, from what of its log the
    replay has not matched (`run.replay`, then emptied: what follows is new); none when nothing is left."""
    left = Counter(run.replay)
    run.replay.clear()  # (the same counter goes on to the run's next stream after a pause: `engine._execute`)
    messages = list(dict.fromkeys(key[1] for key in left if key[0] == "content_delta" and key[1] and
                                  _own(key)))
    calls = [call_id for call_id in dict.fromkeys(key[1] for key in left if key[0] == "tool_call_start"
                                                  and _own(key)) if call_id in open_calls]
    if not messages and not calls:
        return []
    stamp = now()
    closing: list[Event] = [ToolResultEvent(run_id=run.run_id, ts=stamp, tool_call_id=call_id,
                                            name=open_calls.pop(call_id), error=SUPERSEDED, is_error=True)
                            for call_id in calls]
    for i, message_id in enumerate(messages or [None]):
        last = i == max(len(messages), 1) - 1
        closing.append(RetractedEvent(run_id=run.run_id, ts=stamp, message_id=message_id,
                                      tool_call_ids=tuple(calls) if last else ()))
    return closing


def _own(key: tuple[Any, ...]) -> bool:
    """A key of the run's own loop events: neither inside a graph node nor forwarded from a sub-agent."""
    return key[2] is None and key[5] is None
