"""Steering a working run: user messages queued into it while it works, taken at its next round boundary.

    stream = agent.stream("Summarise the logs")
    stream.steer("Only the errors, please")   # queued now (`steer_queued`)
    async for event in stream: ...            # taken before the next model request (`steer_taken`)

A run's `Inbox` holds what was sent to it. The loop asks it, before each model request, whether anything may
wait (`pending`: an attribute, so a run nobody steers pays nothing); when something does, it takes the steers
(`take`) and appends them to the transcript as user messages, after the round's tool results
(`lifecycle.take_steers`). What the run never took (it had no round left) is the caller's to start the next
run with (`AgentStream.steers_left`).

`MemoryInbox` is the in-process one; a durable run's inbox (`ringlet.server.durable.steers.DurableInbox`)
receives them as DBOS messages, whichever process sent them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ringlet.messages import Message

__all__ = ["Inbox", "MemoryInbox", "Steer"]


@dataclass(frozen=True, slots=True)
class Steer:
    """A user message sent to a working run (`steer_id`: its id in `steer_queued` and `steer_taken`)."""

    steer_id: str
    message: Message

    def to_json(self) -> dict[str, object]:
        return {"steer_id": self.steer_id, "message": self.message.model_dump(mode="json")}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Steer:
        return cls(str(data["steer_id"]), Message.validate(data["message"]))


class Inbox(Protocol):
    """Where a run's steers wait until it takes them."""

    @property
    def pending(self) -> bool:
        """Whether a steer may wait: the loop calls `take` at its next round boundary (read every round)."""
        ...

    async def take(self, requests: int) -> list[Steer]:
        """The steers waiting now, oldest first, taken (`requests`: the model requests the run made so far,
        which names the boundary for a durable inbox's replay)."""
        ...


class MemoryInbox:
    """Steers in memory, for a run driven in this process."""

    __slots__ = ("queue",)

    def __init__(self) -> None:
        self.queue: list[Steer] = []

    @property
    def pending(self) -> bool:
        return bool(self.queue)

    def put(self, steer: Steer) -> None:
        self.queue.append(steer)

    async def take(self, requests: int) -> list[Steer]:
        taken, self.queue = self.queue, []
        return taken
