"""A durable run executed again after its worker died: what the dead execution logged, and how the model
attempt it left in flight is closed before the next one streams.

The execution that died logged events (`Logged`); the new one replays the same steps and yields them again,
and the driver neither stores nor sends those twice (`ActiveRun.replay`). A model request whose step never
finished is sent again, and the model answers anew: other tool-call ids (hosted models draw them at
random), other text. Before that request goes out (`DurableSteps.sending`), whatever the dead attempt
streamed and the replay has not matched is closed, stored and sent:

    each of its tool calls without a result      tool_result {is_error, error.code: "superseded"} (none ran:
                                                  tools run once the model's answer is whole)
    its text and those calls                      retracted {message_id, tool_call_ids, reason: "resent"}

A client drops the retracted text and calls; what follows is the new attempt, which may stream the same
message id again from its start. The transcript never held the dead attempt (it is saved once the
request has finished), so what a client assembles equals it, live or replayed from the log.

A graph's llm node alone in its super-step runs its requests and calls as steps the same way; a node that
is one step (beside others in a super-step) runs again whole, and what it streamed the first time (text,
calls) is retracted as it starts again."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ringlet._ids import now
from ringlet.events import Event, RetractedEvent, ToolResultEvent
from ringlet.server.runs.active import ActiveRun, replay_key

__all__ = ["SUPERSEDED", "Logged", "retraction"]

SUPERSEDED = {"code": "superseded", "message": "the worker executing this run stopped before this call had a "
                                               "result; the work that made the call was done again, and what "
                                               "it made replaces this call"}


@dataclass
class Logged:
    """What an execution that died logged of a run (its events after the run's first, in order)."""

    replay: Counter[tuple[Any, ...]] = field(default_factory=Counter[tuple[Any, ...]])
    """Each event's `replay_key`, counted (`ActiveRun.replay`)."""
    open_calls: dict[str, str] = field(default_factory=dict[str, str])
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


_STREAMED = frozenset({"content_delta", "tool_call_start", "tool_call_delta", "tool_result"})
"""What a graph node's work streams (its text and calls), as against its framing."""


def retraction(run: ActiveRun, open_calls: dict[str, str], node_id: str | None = None) -> list[Event]:
    """The events that close what a dead execution left in flight, from what of its log the replay has not
    matched (`run.replay`): a model attempt (`node_id` None: then the whole rest of the log is the dead
    attempt's and is forgotten, what follows is new), or a graph node that is one step and runs again
    (only that node's part). None when nothing is left."""
    left = [key for key in run.replay if key[5] is None and (node_id is None or key[2] == node_id)]
    if node_id is None:
        run.replay.clear()  # (the same counter goes on to the run's next stream after a pause: `engine._execute`)
    else:  # the node's framing (node_start, …) comes again and is matched; what it streamed does not
        left = [key for key in left if key[0] in _STREAMED]
        for key in left:
            del run.replay[key]
    closing: list[Event] = []
    stamp = now()
    for node in dict.fromkeys(key[2] for key in left):  # the run's own attempt, or each graph node's
        mine = [key for key in left if key[2] == node]
        messages = list(dict.fromkeys(key[1] for key in mine if key[0] == "content_delta" and key[1]))
        calls = list(dict.fromkeys(key[1] for key in mine if key[0] == "tool_call_start"))
        if node_id is None:  # a model attempt: the calls it streamed (a node run again: all it made)
            calls = [c for c in calls if c in open_calls]
        closing += [ToolResultEvent(run_id=run.run_id, ts=stamp, node_id=node, tool_call_id=call_id,
                                    name=open_calls.pop(call_id), error=SUPERSEDED, is_error=True)
                    for call_id in calls if call_id in open_calls]
        if messages or calls:
            closing += [RetractedEvent(run_id=run.run_id, ts=stamp, node_id=node, message_id=message_id,
                                       tool_call_ids=tuple(calls) if i == max(len(messages), 1) - 1 else ())
                        for i, message_id in enumerate(messages or [None])]
    return closing
