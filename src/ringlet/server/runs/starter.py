"""Starting and stopping runs: a message stored with its run (one active run per conversation: 409, or a
message the server posts itself waits its turn; one place among its key's active runs, counted here and, on
PostgreSQL, in the database across every process (`_admitted`): 429, or it waits), the stream of a new run,
a run with no conversation (`/v1` without one), and cancelling. A started run is handed to the executor
(`executor.py`): driven here, or enqueued as a DBOS workflow."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from ringlet._ids import new_id
from ringlet.agent import AgentStream
from ringlet.context import Channel
from ringlet.errors import ConversationBusy, KeyBusy
from ringlet.gates.approval import Approver, AutoDeny
from ringlet.messages import Message
from ringlet.server.http.auth import Principal
from ringlet.server.http.errors import ApiError, request_id
from ringlet.server.runs.active import ActiveRun
from ringlet.server.runs.driver import RunDriver
from ringlet.server.runs.executor import Order
from ringlet.server.runs.here import Here
from ringlet.store import Store
from ringlet.store.engine import storage_error
from ringlet.store.records import Claim, Conversation

if TYPE_CHECKING:
    from ringlet.server.catalog import Catalog
    from ringlet.server.http.settings import ServerSettings

log = logging.getLogger("ringlet.server")


class Starter:
    """Starts and cancels runs."""

    def __init__(self, store: Store, catalog: Catalog, settings: ServerSettings, here: Here,
                 driver: RunDriver) -> None:
        self.store, self.catalog, self.settings, self.here, self.driver = store, catalog, settings, here, driver

    async def start(self, conversation: Conversation, prompt: Message | Sequence[Message], *, principal: Principal,
                    channel: Channel = "chat", overrides: dict[str, Any] | None = None,
                    wait_turn: bool = False, run_id: str | None = None, approver: Approver | None = None,
                    claim: Claim | None = None) -> ActiveRun:
        """Store the message(s) and start a run on them. A conversation has one active run at a time: 409
        `run_in_progress`, or with `wait_turn` the message waits behind the active run. `claim`: the request's
        `Idempotency-Key`, stored with the run (`KeyTaken` when it was stored already)."""
        cid = conversation.id
        principal.check_agent(conversation.agent)  # every route checked these; a run never starts without
        principal.check_realm(conversation.realm)
        self.catalog.get(conversation.agent).check_home(conversation.realm)
        if overrides and overrides.get("model") is not None:
            hosted = self.catalog.get(conversation.agent)
            hosted.check_model(overrides["model"], self.settings.model_dirs)
        if self.here.closing:
            raise ApiError(503, "unavailable", "the server is shutting down; send the message again shortly",
                           headers={"Retry-After": "5"})
        run_id = run_id or new_id("r")
        await self._take_turn(cid, principal.key_id, run_id, wait=wait_turn)
        run = self.here.active[cid] = ActiveRun(run_id, cid, conversation.agent)
        executor = self.here.executor
        try:
            agent = self.catalog.get(conversation.agent).agent()
            incoming = [prompt] if isinstance(prompt, Message) else list(prompt)
            kind = agent.kind
            order = Order(conversation, incoming, principal, channel, overrides, approver,
                          request_id.get() or None, kind, deny=isinstance(approver, AutoDeny))
            kept = await executor.prepare(run, order)  # its stream built (overrides checked) before anything is stored
            try:
                run.base = await self._admitted(lambda limit: self.store.runs.create(
                    run.run_id, agent=run.agent, conversation_id=cid, lease_owner=self.here.owner,
                    lease_expires_at=self.here.lease_until(), incoming=incoming, realm=conversation.realm,
                    key_id=principal.key_id, kind=kind, claim=claim, state=kept,
                    key_limit=limit), principal.key_id, wait=wait_turn)
            except ConversationBusy:  # a run of another process (or one that died and is not closed yet)
                raise ApiError(409, "run_in_progress", f"conversation {cid} already has an active run; wait "
                               "for it or POST …/cancel") from None
            except Exception as exc:
                if (reason := storage_error(exc)) is None:
                    raise
                raise ApiError(503, "unavailable", f"the server cannot store messages now ({reason}); send the "
                               "message again shortly", details={"reason": "storage_unavailable"},
                               headers={"Retry-After": "5"}) from None
            await self._hand_over(run, order)
        except BaseException:
            self.driver.release(run)
            raise
        return run

    async def _take_turn(self, cid: str, key: str, run_id: str, *, wait: bool) -> None:
        """Take the conversation's turn (409 `run_in_progress` while it has an active run) and a place among
        the key's active runs (429 past `max_runs_per_key`; `RunDriver.release` frees it). The runs the server starts
        itself (`wait`: fires, schedules) wait for both instead."""
        if wait:
            await self.here.limits.runs.acquire(key, run_id)
        try:
            await self._turn(cid, wait=wait)
            self.here.limits.runs.hold(key, run_id)
        except BaseException:
            self.here.limits.runs.release(run_id)
            raise

    async def _admitted(self, store: Callable[[int], Awaitable[int]], key: str | None, *, wait: bool) -> int:
        """Store a new run (`store(limit)`; what it returns) counted among its key's working runs in every
        process sharing the database (`run_records.admit`, PostgreSQL): past `max_runs_per_key` a run asked for
        is refused with the 429 of this process's own count; one the server starts (`wait`) waits until a run of
        the key ends or pauses anywhere (`Cap.freed`; `worker_timeout_s` bounds a wait whose notice was lost),
        then counts again."""
        cap = self.here.limits.runs
        while True:
            try:
                return await store(cap.limit if key else 0)
            except KeyBusy as busy:
                if not wait:
                    raise cap.refusal(busy.key, busy.working) from None
                await cap.freed(busy.key, self.settings.worker_timeout_s)

    async def _turn(self, cid: str, *, wait: bool) -> None:
        while (current := self.here.active.get(cid)) is not None:
            if not wait:
                raise ApiError(409, "run_in_progress", f"conversation {cid} already has an active run "
                               f"({current.run_id}); wait for it or POST …/cancel", details={"run_id": current.run_id})
            await current.done.wait()

    async def _hand_over(self, run: ActiveRun, order: Order) -> None:
        """Hand a stored run to its executor; one that cannot be handed over ends here, as failed."""
        try:
            await self.here.executor.start(run, order)
        except Exception:
            log.exception("could not start run %s", run.run_id)
            for event in await self.driver.track(run, run.stream).abandoned(0):  # a graph run's closing events
                await self.driver.emit(run.conversation_id, event, run)  # are sent by the caller
            raise ApiError(503, "unavailable", "the server could not queue this run; send the message again "
                           "shortly", headers={"Retry-After": "5"}) from None

    def adopt(self, run_id: str, cid: str, agent: str, stream: Any, *, resumed: bool,
              applied: tuple[str, ...] = ()) -> ActiveRun:
        """The run a durable workflow drives here (`durable/engine.py`): the one this process started, or a new one."""
        run = self.here.active.get(cid)
        if run is None or run.run_id != run_id or run.stream is None or resumed:
            run = self.here.active[cid] = ActiveRun(run_id, cid, agent, resumed=resumed, applied=applied)
        run.stream = stream
        if run.watcher is not None:  # it executes here: the driver releases it
            watcher, run.watcher = run.watcher, None
            watcher.cancel()
        return run

    async def start_unstored(self, agent: str, stream: AgentStream, *, principal: Principal, realm: str) -> ActiveRun:
        """Drive a run that has no conversation (`/v1` without one): its record (status, usage, cost) is
        stored, its transcript is not, and its events go only to `run.listener` (then None)."""
        if self.here.closing:
            raise ApiError(503, "unavailable", "the server is shutting down; send the request again shortly",
                           headers={"Retry-After": "5"})
        run = ActiveRun(stream.run_id, None, agent, stream=stream, listener=asyncio.Queue())
        self.here.limits.runs.hold(principal.key_id, run.run_id)  # 429 past the key's active runs
        self.here.unstored[run.run_id] = run
        try:
            await self._admitted(lambda limit: self.store.runs.create(
                run.run_id, agent=agent, lease_owner=self.here.owner, lease_expires_at=self.here.lease_until(),
                realm=realm, key_id=principal.key_id, key_limit=limit), principal.key_id, wait=False)
        except BaseException:
            self.driver.release(run)
            raise
        self.driver.launch(run)
        return run

    def cancel(self, conversation_id: str) -> str | None:
        """Cancel the conversation's active run; its run id, or None when it has none."""
        run = self.here.active.get(conversation_id)
        if run is None:
            return None
        self.stop(run)
        return run.run_id

    def stop(self, run: ActiveRun) -> None:
        """Cancel `run`: it still ends with `message_end` (finish_reason `cancelled`)."""
        run.cancel_requested = True  # seen by _drive if the pump does not exist yet
        if run.pump is not None:
            run.pump.cancel()
        elif run.watcher is not None:  # it executes in another process
            self.here.spawn(self.here.executor.cancel(run.run_id))

