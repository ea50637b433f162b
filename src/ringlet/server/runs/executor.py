"""How runs execute: an `Executor` per way of running, chosen once when the app is wired (`app.py`).

    Starter ── prepare, start, cancel ─► Executor ─┬─ LocalExecutor  driven here (`RunDriver.launch`)
    Pauses  ── wake, decided ─────────►           └─ DbosExecutor   a DBOS workflow any worker executes
    Recovery ─ goes_on, adopt ────────►                             (`ringlet.server.durable.executor`)

The rest of the run machinery asks the executor what to do with a run, never which executor it has."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ringlet.context import Channel
from ringlet.errors import ConfigError
from ringlet.gates.approval import Approver
from ringlet.loop.steering import Steer
from ringlet.messages import Message
from ringlet.server.http.auth import Principal
from ringlet.server.runs.active import ActiveRun
from ringlet.server.runs.queues import QueueDepth, local_queue
from ringlet.server.runs.spec import spec_of
from ringlet.server.runs.tracks import Children
from ringlet.store import Store
from ringlet.store.records import Conversation, RunRecord


class StreamFor(Protocol):
    """`Starter.stream_for`: the stream of a new run of an agent."""

    def __call__(self, name: str, incoming: Sequence[Message], history: Sequence[Message], *, cid: str,
                 realm: str, principal: Principal, channel: Channel, run_id: str, request_id: str | None,
                 approver: Approver | None, overrides: dict[str, Any] | None, steps: Any = None,
                 lineage: Any = None) -> Any: ...


@dataclass(frozen=True)
class Order:
    """What a conversation's new run was started with (`Starter.start`)."""

    conversation: Conversation
    incoming: Sequence[Message]
    principal: Principal
    channel: Channel
    overrides: dict[str, Any] | None
    approver: Approver | None
    request_id: str | None
    kind: str
    deny: bool

    def stream(self, stream_for: StreamFor, run: ActiveRun, history: Sequence[Message]) -> Any:
        """The run's stream over `history`, built (its overrides checked) now; it starts when first iterated."""
        return stream_for(run.agent, self.incoming, history, cid=run.conversation_id or "",
                               realm=self.conversation.realm, principal=self.principal, channel=self.channel,
                               run_id=run.run_id, request_id=self.request_id, approver=self.approver,
                               overrides=self.overrides)

    def spec(self, run: ActiveRun) -> dict[str, Any]:
        """The run's input as JSON (`spec.spec_of`): what another process needs to start it."""
        return spec_of(run, self.conversation.realm, self.incoming, principal=self.principal, channel=self.channel,
                       overrides=self.overrides, request_id=self.request_id, deny=self.deny, kind=self.kind)


class Executor(Protocol):
    """Executes the runs this process starts or resumes."""

    @property
    def children(self) -> Children:
        """Where runs keep their sub-agents."""
        ...

    @property
    def conversations_only(self) -> bool:
        """Whether every run it executes needs a stored conversation (`/v1` without one keeps a transient one)."""
        ...

    async def prepare(self, run: ActiveRun, order: Order) -> dict[str, Any] | None:
        """Set `run.stream` (its overrides checked) before anything is stored; what the run's record keeps
        for this executor (None: nothing)."""
        ...

    async def start(self, run: ActiveRun, order: Order) -> None:
        """Execute a stored run (`prepare`d); raises when it cannot be handed over (the caller closes it)."""
        ...

    async def cancel(self, run_id: str) -> None:
        """Cancel a run this process follows that executes elsewhere."""
        ...

    async def steer(self, run: ActiveRun | None, run_id: str, steer: Steer) -> bool:
        """Send a working run (`run`: as this process holds it, if it does) a user message, taken at its next
        round boundary wherever it executes; False when it cannot take one (it is not running here)."""
        ...

    async def wake(self, run_id: str, *, follow: bool) -> bool:
        """Tell a paused, decided run it goes on, where it waits (`follow`: and follow it here while it runs);
        False when no execution of it waits: it is resumed in this process."""
        ...

    async def decided(self, approval_id: str) -> None:
        """A decision no run here waits for: a process waiting for it in memory (a sub-agent's) hears it."""
        ...

    async def queued(self, run_id: str) -> bool:
        """Whether the run waits for a slot, executing nowhere yet."""
        ...

    async def goes_on(self, run_id: str) -> bool:
        """Whether a run whose process died goes on by itself (recovery leaves it alone)."""
        ...

    async def adopt(self, row: RunRecord) -> bool:
        """Carry on a stored run whose process died before it executed (claimed by recovery); False: it is
        closed instead."""
        ...

    async def drain(self, within_s: float) -> None:
        """The process stops (SIGTERM): take no more runs, and let those executing here finish within
        `within_s` (what is left then is handed on, or, in process, cancelled by the runner)."""
        ...

    def key_freed(self, key: str) -> None:
        """A run of API key `key` ended or paused here: runs of that key waiting for a place among its working
        runs in other processes count again (`Starter._admitted`)."""
        ...

    async def queues(self) -> list[QueueDepth]:
        """The queues of runs waiting for a slot, as far as this process can see them (`/metrics`, status)."""
        ...

    async def close(self) -> None:
        """Stop executing (runs executing here are handed on or, in process, cancelled by the runner)."""
        ...


class LocalExecutor:
    """Runs driven in this process's event loop (SQLite, or `engine: local`): `launch` drives one in a task of
    its own (`RunDriver.launch`), where it waits for a slot (`queued`) under the concurrency limits."""

    conversations_only = False

    def __init__(self, store: Store, stream_for: StreamFor, launch: Callable[[ActiveRun], None],
                 queued: set[str]) -> None:
        self.store, self.stream_for, self.launch, self.waiting = store, stream_for, launch, queued
        self.children = Children(store)

    async def prepare(self, run: ActiveRun, order: Order) -> dict[str, Any] | None:
        history = await self.store.conversations.load_messages(run.conversation_id or "")
        run.stream = order.stream(self.stream_for, run, history)
        return None

    async def start(self, run: ActiveRun, order: Order) -> None:
        self.launch(run)

    async def cancel(self, run_id: str) -> None:
        return None

    async def steer(self, run: ActiveRun | None, run_id: str, steer: Steer) -> bool:
        stream = run.stream if run is not None else None
        if stream is None:
            return False
        try:
            stream.steer(steer.message, steer_id=steer.steer_id)  # its in-memory inbox
        except ConfigError:  # a graph run's
            return False
        return True

    async def wake(self, run_id: str, *, follow: bool) -> bool:
        return False

    async def decided(self, approval_id: str) -> None:
        return None

    async def queued(self, run_id: str) -> bool:
        return run_id in self.waiting

    async def goes_on(self, run_id: str) -> bool:
        return False

    async def adopt(self, row: RunRecord) -> bool:
        return False

    async def drain(self, within_s: float) -> None:
        return None  # in process: the runs left when the server stops are cancelled, and recovered on restart

    def key_freed(self, key: str) -> None:
        return None  # one process: its own count (`limits.Cap`) already woke whoever waits

    async def queues(self) -> list[QueueDepth]:
        return local_queue(len(self.waiting))

    async def close(self) -> None:
        return None
