"""What the parts of the run machinery (`Starter`, `RunDriver`, `Pauses`, `Recovery`) use of this process's
runs and of one another: the `Runner` facade is one. (A protocol, so that the parts need not import the
facade that holds them.)"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Protocol

from ringlet.events import Event
from ringlet.gates.approval import ApprovalDecision
from ringlet.server.catalog import Catalog
from ringlet.server.http.limits import Limits
from ringlet.server.http.settings import ServerSettings
from ringlet.server.runs.active import ActiveRun, Hub
from ringlet.server.runs.executor import Executor
from ringlet.server.runs.graphs import GraphRuns
from ringlet.store import Store
from ringlet.store.schedule_records import ConversationSchedules
from ringlet.store.writer import EventWriter


class Host(Protocol):
    store: Store
    catalog: Catalog
    settings: ServerSettings
    writer: EventWriter
    hub: Hub
    owner: str
    active: dict[str, ActiveRun]
    unstored: dict[str, ActiveRun]
    held: set[str]
    dropped: set[str]
    tasks: set[asyncio.Task[None]]
    queued: set[str]
    resuming: set[str]
    waiters: dict[str, asyncio.Future[ApprovalDecision]]
    closing: bool
    limits: Limits
    executor: Executor
    graphs: GraphRuns

    def lease_until(self) -> str: ...

    def spawn(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[None]: ...

    def launch(self, run: ActiveRun) -> None: ...

    def release(self, run: ActiveRun) -> None: ...

    def relaunch(self, run_id: str, cid: str, agent: str, stream: Any, *, applied: tuple[str, ...] = ()) -> None: ...

    async def emit(self, conversation_id: str | None, event: Event, run: ActiveRun | None = None) -> int: ...

    def publish(self, conversation_id: str | None, event: Event, event_id: int, run: ActiveRun | None = None,
                payload: dict[str, Any] | None = None) -> None: ...

    async def resume(self, run_id: str) -> bool: ...

    async def expire_due(self) -> int: ...

    async def wake_decided(self, before: str) -> int: ...

    def expire_at(self, deadline: float) -> None: ...

    def schedule_book(self, cid: str, agent: str, realm: str, org_id: str | None, user_id: str | None,
                      key_id: str | None) -> ConversationSchedules: ...


