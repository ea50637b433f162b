"""Continuations: a run stopped on client tool calls goes on when the client sends their results, in
whichever API process gets them. Its transcript is kept, stored, under the run's id; the call ids the
client sees name that run."""

from __future__ import annotations

import time
from dataclasses import dataclass

from fastapi import Request

from ringlet._ids import at
from ringlet.loop.state import RunState
from ringlet.messages import Message
from ringlet.store.continuation_records import Continuations as Kept


@dataclass(eq=False)
class Continuations:
    """Transcripts of runs stopped on client tool calls, by run id, for `continuation_ttl_s`: stored
    (`Records.continuations`), so whichever API process gets the results continues the run, and only one.

    The call ids returned to the client are `<call id>.<run id>`: unique across runs (providers without
    call ids get `call_<n>` per run), and they name the run whose transcript continues."""

    kept: Kept
    ttl_s: float

    async def keep(self, key_id: str, agent: str, state: RunState) -> None:
        await self.kept.keep(state.run_id, key_id=key_id, agent=agent,
                                            messages=[m.model_dump(mode="json") for m in state.messages],
                                            expires_at=at(time.time() + self.ttl_s))

    async def take(self, key_id: str, agent: str, run_ids: set[str]) -> list[Message] | None:
        """The transcript of the one run the results answer, if it is kept for this key and agent."""
        if len(run_ids) != 1:
            return None
        kept = await self.kept.take(next(iter(run_ids)), key_id=key_id, agent=agent)
        return None if kept is None else [Message.validate(m) for m in kept]


def client_call_id(run_id: str, call_id: str) -> str:
    return f"{call_id}.{run_id}"


def split_call_id(client_id: str | None) -> tuple[str | None, str | None]:
    """(call id, run id) of an id from `client_call_id`; (the id, None) for any other id."""
    call_id, dot, run_id = (client_id or "").rpartition(".")
    return (call_id, run_id) if dot and run_id.startswith("r_") else (client_id, None)


def continuations(request: Request) -> Continuations:
    state = request.app.state.ringlet
    return Continuations(state.runs.records.continuations, state.settings.continuation_ttl_s)
