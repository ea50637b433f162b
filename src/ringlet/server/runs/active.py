"""What the server's one run driver (`runs.Runner`) holds of a run while it runs, and how its events travel:
from the loop to the driver one at a time (`pump`, `Handoff`), and from the driver to the conversation's
streams (`Hub`, `Subscriber`). Shared with the graph side (`graph_runs`) and the SSE encoder without an
import circle."""

from __future__ import annotations

import asyncio
import json
from collections import Counter, defaultdict
from collections.abc import Callable, Generator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ringlet.events import Event

if TYPE_CHECKING:
    from ringlet.agent import AgentStream

__all__ = ["ActiveRun", "Handoff", "Hub", "Published", "Subscriber", "pump", "replay_key"]


@dataclass(slots=True, frozen=True)
class Published:
    """An event on its way to the streams; `data` is its JSON payload, serialised once. `id` is its id in
    the conversation's event log (0 for a run with no conversation, whose events are not logged)."""

    id: int
    type: str
    run_id: str | None
    data: str
    nested: bool = False
    """A sub-agent's event, forwarded into its parent's stream."""

    @classmethod
    def of(cls, event_id: int, kind: str, payload: dict[str, Any]) -> Published:
        """An event as published, from its log id, type and payload (the driver's, the store's, the feed's)."""
        return cls(event_id, kind, payload.get("run_id"), json.dumps(payload, ensure_ascii=False,
                                                                    separators=(",", ":")), "agent_path" in payload)


@dataclass(eq=False)
class ActiveRun:
    """A run this process drives. Every kind goes through the same driver: a conversation's message, a
    trigger's or schedule's fire, a resumed pause, a graph run, and a `/v1` request with or without a
    conversation; they differ only in the stream they are started with and whether they have a
    conversation."""

    run_id: str
    conversation_id: str | None
    """None for a run with no conversation (`/v1` without one): its record is stored, its transcript and
    events are not; its events go to `listener` only."""
    agent: str
    stream: Any = None
    """The run's AgentStream (a graph run's: its GraphStream)."""
    pump: asyncio.Task[None] | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    result: Any = None
    """The run's result once it has ended (a RunResult, or a graph run's GraphResult)."""
    published: list[Published] = field(default_factory=list[Published])
    """The run's events so far, as published: a stream joining the run reads its backlog from here."""
    listener: asyncio.Queue[Published | None] | None = None
    """A run with no conversation: its events, then None once it has ended."""
    cancel_requested: bool = False
    resumed: bool = False
    """Resumed after a pause: its earlier events are in the store, not in `published`."""
    applied: tuple[str, ...] = ()
    """Tool-call ids whose approvals this resumption applied."""
    replay: Counter[tuple[Any, ...]] = field(default_factory=Counter[tuple[Any, ...]])
    """A durable run executed again (`engine.py`): the events an execution that died logged already, as
    `replay_key`s counted; the replay yields them again (a parallel batch's results perhaps in another
    order), and they are neither stored nor sent."""
    driver: asyncio.Task[Any] | None = None
    """A durable run: the workflow task that drives it here (cancelled to hand the run on)."""
    handover: bool = False
    """A durable run this process stops executing (it shuts down): it is not ended, another worker goes on."""
    released: bool = False
    """It let go of its conversation and its key's place (`RunDriver.release`: at its end or its pause)."""
    watcher: asyncio.Task[None] | None = None
    """A durable run this process started, until this process executes it: follows the run's events (in
    whichever process it executes) and releases it here when it ends or pauses (`engine.Engine.dispatch`)."""
    base: int | None = None
    """The conversation's last event id when the run was stored (`Starter.start`; None: not known): its events
    come after it."""


def replay_key(kind: str, value: Callable[[str], Any]) -> tuple[Any, ...]:
    """How an event of a durable run executed again is matched with the one an execution that died logged
    (`ActiveRun.replay`): its type, the message or call it belongs to, a graph run's node visit, and the
    sub-agent call it was forwarded from (`value(name)`: the event's field of that name, or None)."""
    return (kind, value("message_id") or value("tool_call_id"), value("node_id"), value("step"), value("item_index"),
            value("parent_tool_call_id"))


class Subscriber:
    """One stream's view of a conversation. When it falls `maxsize` events behind, `lagging` is set and
    it must catch up from the store; the publisher never waits for a slow client."""

    def __init__(self, maxsize: int) -> None:
        self.queue: asyncio.Queue[Published] = asyncio.Queue(maxsize)
        self.lagging = False


class Hub:
    def __init__(self, maxsize: int = 1024) -> None:
        self.maxsize = maxsize
        self._subscribers: defaultdict[str, set[Subscriber]] = defaultdict(set)
        self.watcher: Callable[[str, bool, int | None], None] | None = None
        """Told when a conversation gets its first stream (True, with the `base` that stream's `subscribe` was
        given) and loses its last (False): the live feed of other processes' events (`feed.Feed`) follows the
        conversations watched here."""

    def watched(self, conversation_id: str) -> bool:
        """Whether a stream of this process follows the conversation."""
        return conversation_id in self._subscribers

    @contextmanager
    def subscribe(self, conversation_id: str, *, base: int | None = None) -> Generator[Subscriber, None, None]:
        """Subscribe to the conversation's events published from now on. `base`: a last event id of the
        conversation committed before now, when the caller knows one (a run's `ActiveRun.base`), so that the
        live feed need not read it."""
        subscriber = Subscriber(self.maxsize)
        subscribers = self._subscribers[conversation_id]
        if not subscribers and self.watcher is not None:
            self.watcher(conversation_id, True, base)
        subscribers.add(subscriber)
        try:
            yield subscriber
        finally:
            subscribers.discard(subscriber)
            if not subscribers and self._subscribers.pop(conversation_id, None) is not None \
                    and self.watcher is not None:
                self.watcher(conversation_id, False, None)

    def publish(self, conversation_id: str, item: Published) -> None:
        for subscriber in self._subscribers.get(conversation_id, ()):
            if subscriber.lagging:
                continue
            try:
                subscriber.queue.put_nowait(item)
            except asyncio.QueueFull:
                subscriber.lagging = True


class Handoff:
    """Between a run's pump and its driver, one event at a time: the pump hands an event over and waits
    until the driver has stored it (and the transcript up to it), so the loop never gets ahead of the log."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[Event | BaseException | None] = asyncio.Queue()
        self._waiting: asyncio.Future[bool] | None = None
        self.closed = False

    async def give(self, event: Event) -> bool:
        """Hand `event` over; whether the driver stored it (False: the driver stopped, so must the run). A
        cancel that lands here still waits for the store, then goes to the loop (`pump`)."""
        if self.closed:
            return False
        self._waiting = waiting = asyncio.get_running_loop().create_future()
        self.inbox.put_nowait(event)
        try:
            return await asyncio.shield(waiting)
        except asyncio.CancelledError:
            stored = await waiting
            task = asyncio.current_task()
            assert task is not None
            task.uncancel()
            task.cancel()  # lands at the loop's next await: the loop closes the run as cancelled
            return stored

    def stored(self) -> None:
        if self._waiting is not None and not self._waiting.done():
            self._waiting.set_result(True)

    def close(self) -> None:
        self.closed = True
        if self._waiting is not None and not self._waiting.done():
            self._waiting.set_result(False)


async def pump(stream: AgentStream, handoff: Handoff) -> None:
    """Move the run's events to the driver, each once it is stored; a cancel lands inside the loop, which
    closes the run. When the driver stops (its storage failed), the loop is closed where it stands."""
    try:
        async for event in stream:
            if not await handoff.give(event):
                break
        else:
            return
        with suppress(Exception):
            await stream.aclose()
    except asyncio.CancelledError:
        pass  # a cancelled run has already yielded its message_end
    except Exception as exc:
        handoff.inbox.put_nowait(exc)
