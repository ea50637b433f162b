"""Where a completion's events come from (`Source`: (type, payload) pairs, and None for "ping now").

A request with `X-Ringlet-Conversation-Id` runs in that stored conversation; when the conversation's run
waits for a human, the request's message answers it instead and the request follows the run as it goes on
(`answering_run`, `asks.py`). One without runs with its transcript unstored: in this process when runs
execute in process (`_ephemeral_run`); on the engine (PostgreSQL), as a durable workflow any worker
executes, in a hidden conversation of its own that is removed once the run has ended (`_transient_run`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ringlet.agent import Agent
from ringlet.agent.settings import RunSettings, run_options
from ringlet.context import Caller
from ringlet.errors import ConfigError
from ringlet.gates.approval import Approver, AutoDeny
from ringlet.loop.state import RunState
from ringlet.messages import Message
from ringlet.server.catalog import Hosted
from ringlet.server.http.auth import Principal
from ringlet.server.http.errors import ApiError, request_id
from ringlet.server.protocols.events import Usage
from ringlet.server.protocols.openai.asks import answer, asks_of, stored
from ringlet.server.runs.service import Runs
from ringlet.store.records import Conversation


@dataclass(eq=False)
class Source:
    events: AsyncIterator[tuple[str, dict[str, Any]] | None]
    final_state: Any
    """Awaitable giving the run's RunState once the events are done."""
    cancel: Any
    """Stops the run: for runs without a conversation, when the client leaves."""
    run_id: str | None = None
    """The run's id (known once it has started)."""
    paused: Any = None
    """Awaited with the open requests when the response ends because the run waits for a human: lets the
    run wait for them (`detached`), or leaves it to be stopped when nothing can answer. None: nothing to do
    (a stored run waits durably)."""
    cid: str | None = None
    """The stored conversation the run belongs to (None: a run without one)."""
    asks: list[dict[str, Any]] | None = None
    """Open requests this response asks about again, having run nothing (a reply that did not fit them)."""
    problem: str | None = None
    """Why the reply was not taken (with `asks`)."""
    humans: bool = True
    """Whether the run asks humans (False: `v1_approver` denies at once, so a pause is no reason to end)."""
    detached: bool = False
    """The response ended while the run waits for a decision it can still get: leaving does not stop it."""
    spent: Callable[[], Awaitable[Usage]] | None = None
    """The run's usage so far: what an answer that ends while the run waits reports (no `message_end` has
    said it yet). None: nothing spent."""

    def leave(self) -> None:
        """The response is over: stop the run unless it was left to wait (`detached`)."""
        if not self.detached:
            self.cancel()


def recorded(runs: Runs, run_id: str) -> Callable[[], Awaitable[Usage]]:
    """A stored run's usage so far, as its record holds it (a pause stores it before it is announced)."""
    async def spent() -> Usage:
        record = await runs.records.runs.get(run_id)
        usage = record.usage if record is not None else None
        return Usage() if usage is None else Usage(usage.in_tokens, usage.out_tokens, usage.cost_usd)
    return spent


def v1_approver(runs: Runs, hosted: Hosted) -> AutoDeny | None:
    """Denies every request at once when the server (`approval_mode: deny`) or the agent
    (`v1_approvals: deny`) says `/v1` runs do not ask; None: they ask (`asks.py`)."""
    if runs.settings.approval_mode == "deny":
        return AutoDeny("system:approval_mode", "this server denies calls that need approval")
    if getattr(hosted.agent(), "v1_approvals", "ask") == "deny":
        return AutoDeny("system:v1_approvals", "this agent denies calls that need approval on /v1")
    return None


async def unstored_run(runs: Runs, agent: Agent, incoming: list[Message], history: list[Message],
                       hosted: Hosted, principal: Principal, overrides: dict[str, Any], realm: str) -> Source:
    """A run whose transcript is not kept (in `realm`): in this process when runs execute in process, else a
    durable workflow like every run on the engine."""
    if not runs.conversations_only:
        return await _ephemeral_run(runs, agent, incoming, history, hosted, principal, overrides, realm)
    return await _transient_run(runs, incoming, history, hosted, principal, overrides, realm)


async def _ephemeral_run(runs: Runs, agent: Agent, incoming: list[Message], history: list[Message],
                         hosted: Hosted, principal: Principal, overrides: dict[str, Any], realm: str) -> Source:
    """A run whose transcript is not stored (its run record, status, usage and cost are), driven by the
    server's one driver like any other; it ends when its client leaves."""
    deny = v1_approver(runs, hosted)
    try:
        caller = Caller(realm=realm, user_id=principal.user_id, org_id=principal.org_id, roles=principal.roles,
                        channel="api", request_id=request_id.get() or None)
        stream = agent.stream(incoming, history=history, caller=caller, **run_options(
            agent, overrides, RunSettings(approver=deny or runs.approver(hosted.name, realm))))
    except ConfigError as exc:
        raise ApiError(400, "invalid_request", str(exc), param="tools") from None
    run = await runs.start_unstored(hosted.name, stream, principal=principal, realm=realm)
    listener, ping_s = run.listener, runs.settings.ping_interval_s
    assert listener is not None

    async def events() -> AsyncIterator[tuple[str, dict[str, Any]] | None]:
        while True:
            try:
                async with asyncio.timeout(ping_s):
                    item = await listener.get()
            except TimeoutError:
                yield None
                continue
            if item is None:
                return
            yield item.type, json.loads(item.data)

    async def final_state() -> RunState:
        await run.done.wait()
        return stream.state

    async def spent() -> Usage:  # in this process only: its pause is not stored
        usage = stream.state.usage
        return Usage(usage.in_tokens, usage.out_tokens, usage.cost_usd)

    source = Source(events(), final_state, lambda: runs.stop(run), run.run_id, humans=deny is None, spent=spent)

    async def paused(asks: list[dict[str, Any]]) -> None:  # approvals wait here; a question has no one to answer
        await stored(runs, asks)
        source.detached = all(a["kind"] == "approval" for a in asks)

    source.paused = paused
    return source


async def stored_run(runs: Runs, principal: Principal, cid: str, hosted: Hosted, incoming: list[Message],
                     overrides: dict[str, Any]) -> Source:
    conversation = await runs.records.conversations.get(cid)
    if conversation is None or not principal.sees(conversation.realm) or \
            not principal.may_use(conversation.agent):  # the same 404 as an unknown id: no existence oracle
        raise ApiError(404, "conversation_not_found", f"no conversation {cid!r}", param="X-Ringlet-Conversation-Id")
    if conversation.agent != hosted.name:
        raise ApiError(400, "invalid_request", f"conversation {cid} belongs to agent {conversation.agent!r}, "
                       f"not {hosted.name!r}", param="model")
    return await answering_run(runs, principal, conversation, incoming) or \
        await _followed(runs, principal, conversation, hosted, incoming, overrides)


async def answering_run(runs: Runs, principal: Principal, conversation: Conversation,
                        incoming: list[Message]) -> Source | None:
    """When the conversation's run waits for a human, the request's last user message answers it (`asks.py`)
    and the request follows the run as it goes on; a reply that does not fit asks again, saying why. None
    when nothing waits for an answer."""
    cid = conversation.id
    rows = await runs.records.approvals.list(conversation_id=cid, status="pending")
    text = next((m.text for m in reversed(incoming) if m.role == "user"), None)
    if not rows or text is None:
        return None
    run_id = await runs.records.runs.paused_of(cid) or rows[0].run_id
    mark, _ = await runs.records.events.marks(cid)
    try:
        await answer(runs, principal, rows, text)
    except (ApiError, ValueError) as exc:
        why = exc.message if isinstance(exc, ApiError) else str(exc)
        left = await runs.records.approvals.list(conversation_id=cid, status="pending")

        async def unchanged() -> RunState:
            return RunState.from_json(json.dumps(await runs.records.runs.state(run_id) or {}))

        return Source(_nothing(), unchanged, lambda: None, run_id, cid=cid, asks=asks_of(left or rows),
                      problem=f"The answer was not taken: {why}.", spent=recorded(runs, run_id))

    async def events() -> AsyncIterator[tuple[str, dict[str, Any]] | None]:
        with runs.subscribe(cid) as subscriber:
            async for item in runs.items(subscriber, cid, after=mark, run_id=run_id):
                yield None if item is None else (item.type, json.loads(item.data))

    async def final_state() -> RunState:  # once it has ended (or paused again): as stored
        active = runs.active.get(cid)
        if active is not None and active.run_id == run_id:
            await active.done.wait()
        state = await runs.records.runs.state(run_id)
        assert state is not None, "a run that went on has its state stored"
        return RunState.from_json(json.dumps(state))

    return Source(events(), final_state, lambda: None, run_id, cid=cid, spent=recorded(runs, run_id))


async def _nothing() -> AsyncIterator[tuple[str, dict[str, Any]] | None]:
    return
    yield


async def _followed(runs: Runs, principal: Principal, conversation: Conversation, hosted: Hosted,
                    incoming: list[Message], overrides: dict[str, Any]) -> Source:
    """Start a run in a stored conversation and follow its events (from its log and live, wherever it
    executes); leaving does not touch it."""
    cid = conversation.id
    try:
        deny: Approver | None = v1_approver(runs, hosted)
        run = await runs.start(conversation, incoming, principal=principal, channel="api", overrides=overrides,
                                 approver=deny)  # `ask`: the stored run pauses durably, this request ends
    except ConfigError as exc:
        raise ApiError(400, "invalid_request", str(exc), param="tools") from None

    async def events() -> AsyncIterator[tuple[str, dict[str, Any]] | None]:
        with runs.subscribe(cid) as subscriber:
            async for item in runs.items(subscriber, cid, after=0, run_id=run.run_id):
                yield None if item is None else (item.type, json.loads(item.data))

    async def final_state() -> RunState:  # after message_end: the run may have paused and resumed meanwhile
        await run.done.wait()
        if run.result is not None:
            return run.result.state
        state = await runs.records.runs.state(run.run_id)
        assert state is not None, "a run that ended has its state stored"
        return RunState.from_json(json.dumps(state))

    return Source(events(), final_state, lambda: None, run.run_id, cid=cid, humans=deny is None,
                  spent=recorded(runs, run.run_id))


async def _transient_run(runs: Runs, incoming: list[Message], history: list[Message], hosted: Hosted,
                         principal: Principal, overrides: dict[str, Any], realm: str) -> Source:
    """A run without a conversation on the engine (PostgreSQL): a durable workflow like every other run,
    executed by whichever worker takes it from the queue while this process streams its events. It runs in
    a conversation of its own that no route lists or shows (`Conversations.create(transient=True)`),
    holding the request's history; once the run has ended that conversation goes, with its transcript and
    events (`Store.purge_conversation`), before the answer is sent, and the run's record (status, usage,
    cost) stays. It ends when its client leaves, wherever it executes (`_Transient.cancel`)."""
    store = runs.records
    conversation = await store.conversations.create(agent=hosted.name, realm=realm, org_id=principal.org_id,
                                                   user_id=principal.user_id, transient=True)
    try:
        await store.conversations.append_messages(conversation.id, history)
        followed = await _followed(runs, principal, conversation, hosted, incoming, overrides)
    except BaseException:
        await asyncio.shield(store.conversations.purge(conversation.id))  # no run started in it
        raise
    assert followed.run_id is not None
    transient = _Transient(runs, conversation.id, followed.run_id)

    async def final_state() -> RunState:
        state = await followed.final_state()
        await asyncio.shield(transient.purge(ended=True))  # the transcript goes before the answer is sent
        return state

    source = Source(followed.events, final_state, transient.cancel, followed.run_id, humans=followed.humans,
                    spent=followed.spent)

    async def paused(asks: list[dict[str, Any]]) -> None:  # approvals wait; its conversation goes once it ends
        if all(a["kind"] == "approval" for a in asks):
            source.detached = True
            transient.purge(ended=False)

    source.paused = paused
    return source


@dataclass(eq=False)
class _Transient:
    """The conversation of a run without one on the engine (`_transient_run`), removed once the run ended."""

    runs: Runs
    cid: str
    run_id: str
    purging: asyncio.Task[None] | None = None

    def purge(self, *, ended: bool) -> asyncio.Task[None]:
        """Remove the conversation once the run has ended (`ended`: it has), once."""
        if self.purging is None:
            self.purging = self.runs.spawn(self._purge(ended))
        return self.purging

    async def _purge(self, ended: bool) -> None:
        runs = self.runs
        if not ended:  # follow the run to its end (its message_end is in the log by then)
            with runs.subscribe(self.cid) as subscriber:
                async for _ in runs.items(subscriber, self.cid, after=0, run_id=self.run_id):
                    pass
        await runs.records.conversations.purge(self.cid)

    def cancel(self) -> None:
        """The client left before the run ended: stop it wherever it executes, and remove its conversation
        once it has ended (cancelled)."""
        if self.purging is not None:  # it has ended, or is stopping already
            return
        self.runs.spawn(self._stop())
        self.purge(ended=False)

    async def _stop(self) -> None:
        runs = self.runs
        run = runs.active.get(self.cid)
        if run is not None and run.run_id == self.run_id:  # executing here, or followed here (executing elsewhere:
            runs.stop(run)  # the engine's cancel reaches its worker)
            await run.done.wait()  # it ended, or paused before the cancel reached it
        else:  # it went on elsewhere after a pause (executing in another process)
            await runs.cancel_elsewhere(self.run_id)
        await runs.cancel_paused(self.cid)  # a paused run: its approvals are cancelled and it ends
