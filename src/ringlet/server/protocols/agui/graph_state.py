"""A graph run's state as AG-UI state events: STATE_SNAPSHOT first, then STATE_DELTA (JSON Patch) whenever
it changed (at each node_start and at the end)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ag_ui.core import BaseEvent, StateDeltaEvent, StateSnapshotEvent

from ringlet.server.runs.service import Runs


@dataclass(eq=False)
class GraphState:
    """A graph run's state as AG-UI state events. Graph state is not in the event stream: it is read from
    the run's checkpoint, which is saved after every super-step, so at a node_start it holds every step
    before it (and at the end, the last)."""

    runs: Runs
    run_id: str
    sent: Any = None
    started: bool = False

    async def sync(self) -> list[BaseEvent]:
        checkpoint = await self.runs.records.checkpoints.load(self.run_id)
        if checkpoint is None:
            return []
        state = checkpoint["state"]
        if not self.started:
            self.started, self.sent = True, state
            return [StateSnapshotEvent(snapshot=state)]
        patch = json_patch(self.sent, state)
        self.sent = state
        return [StateDeltaEvent.model_validate({"delta": patch})] if patch else []


def json_patch(old: Any, new: Any, path: str = "") -> list[dict[str, Any]]:
    """An RFC 6902 patch from `old` to `new`: objects key by key, anything else replaced whole."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return [] if old == new else [{"op": "replace", "path": path, "value": new}]
    ops: list[dict[str, Any]] = [{"op": "remove", "path": f"{path}/{_pointer(k)}"}
                                 for k in sorted(old.keys() - new.keys())]
    for key, value in new.items():
        where = f"{path}/{_pointer(key)}"
        ops += json_patch(old[key], value, where) if key in old else [{"op": "add", "path": where, "value": value}]
    return ops


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")
