"""The DBOS executor (`runs.executor.Executor`): every run a conversation starts is a workflow any worker
executes (`engine.py`), each sub-agent a durable run of its own (`children.py`). A run started here is built
here only to check its overrides (a worker builds it from its input, the spec stored with its record), then
enqueued, and followed here wherever it executes (`Engine.dispatch`); a worker drives it with the server's
one driver (`workflow.run_workflow` → `Starter.adopt` → `RunDriver.drive`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ringlet.loop.steering import Steer
from ringlet.messages import Message
from ringlet.server.durable.children import DurableChildren
from ringlet.server.durable.engine import Engine
from ringlet.server.durable.pulse import engine_url
from ringlet.server.durable.steers import send
from ringlet.server.runs.active import ActiveRun
from ringlet.server.runs.crash import crash_point
from ringlet.server.runs.executor import Order
from ringlet.server.runs.queues import QueueDepth, queue_depths
from ringlet.store.records import RunRecord

if TYPE_CHECKING:
    from ringlet.server.durable.feed import Feed
    from ringlet.server.runs.runner import Runner


class DbosExecutor:
    """Runs as DBOS workflows on PostgreSQL (`engine: dbos`, the default there)."""

    conversations_only = True

    def __init__(self, runner: Runner, *, url: str | None, feed: Feed, role: str) -> None:
        self.runner = runner
        self.engine = Engine(runner, url or engine_url(runner.store), feed=feed, role=role)
        self.children = DurableChildren(runner, self.engine)

    async def open(self) -> None:
        await self.engine.open()

    async def prepare(self, run: ActiveRun, order: Order) -> dict[str, Any] | None:
        """Its stream, over no history (only its overrides are checked here), and its workflow's input, kept
        with its record so that recovery enqueues it when this process dies before it does (`adopt`): the
        input, its messages by id (they are stored with the run)."""
        run.stream = order.stream(self.runner.streams.new, run, ())
        return kept(order.spec(run), order.incoming)

    async def start(self, run: ActiveRun, order: Order) -> None:
        crash_point("after_record")  # (a test hook: `crash.py`)
        await self.engine.dispatch(run, order.spec(run))

    async def cancel(self, run_id: str) -> None:
        await self.engine.cancel(run_id)

    async def steer(self, run: ActiveRun | None, run_id: str, steer: Steer) -> bool:
        await send(self.runner.store.db, run_id, steer)  # to its workflow, wherever it executes
        return True

    async def wake(self, run_id: str, *, follow: bool) -> bool:
        if not await self.engine.durable(run_id):
            return False  # no workflow waits for it (a run stored otherwise): resumed in process
        if not follow:
            await self.engine.wake(run_id)
            return True
        runner = self.runner
        record = await runner.store.runs.get(run_id)
        mark, _ = await runner.store.events.marks(record.conversation_id or "") if record else (0, 0)
        await self.engine.wake(run_id)
        if record is not None and record.conversation_id is not None:
            self.engine.watch(ActiveRun(run_id, record.conversation_id, record.agent, resumed=True), mark)
        else:
            runner.here.limits.runs.release(run_id)
        return True

    async def decided(self, approval_id: str) -> None:
        await self.engine.decided(approval_id)

    async def queued(self, run_id: str) -> bool:
        return await self.engine.queued(run_id)

    async def goes_on(self, run_id: str) -> bool:
        return await self.engine.durable(run_id)

    async def adopt(self, row: RunRecord) -> bool:
        return await self.engine.requeue(row)

    async def drain(self, within_s: float) -> None:
        await self.engine.drain(within_s)

    def key_freed(self, key: str) -> None:
        self.engine.key_freed(key)

    async def queues(self) -> list[QueueDepth]:
        return await queue_depths()

    async def close(self) -> None:
        await self.engine.close()


def kept(spec: dict[str, Any], incoming: Sequence[Message]) -> dict[str, Any]:
    """What a durable run's record keeps of its workflow's input (`spec`), so that a run whose process died
    before it enqueued its workflow is enqueued by recovery (`Engine.requeue`): the input, its messages by
    id (they are stored with the run)."""
    return {"spec": {**spec, "incoming": [m.id for m in incoming]}}
