"""The runs service (`server/runs/service.py`) used without HTTP: what every protocol and firing call to
start, follow, read the outcome of, cancel and fork runs."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ringlet import Agent, Message, tool
from ringlet.errors import ConfigError
from ringlet.server import ServerSettings
from ringlet.server.catalog import Catalog
from ringlet.server.http.auth import LOCAL
from ringlet.server.http.errors import ApiError
from ringlet.server.runs.runner import Runner
from ringlet.store import Store
from ringlet.testing import FunctionModel, call


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def _adder(store: Store) -> Runner:
    async def answer(request: Any) -> Any:
        return "The sum is 5." if request.messages[-1].role == "tool" else call("add", a=2, b=3)

    return Runner(store, Catalog.of([Agent(FunctionModel(answer), name="adder", tools=[add])]), ServerSettings())


async def test_a_run_is_started_followed_and_read_back_through_the_service(store: Store) -> None:
    runner = _adder(store)
    runs = runner.runs
    conversation = await store.conversations.create(agent="adder")
    with runs.subscribe(conversation.id) as subscriber:  # before the start: no event is missed
        run = await runs.start(conversation, Message.user("2+3?"), principal=LOCAL)
        async with asyncio.timeout(20):
            frames = [frame async for frame in runs.follow(subscriber, conversation.id, after=0, run_id=run.run_id)]
    kinds = [line.split(b": ", 1)[1] for frame in frames for line in frame.split(b"\n")
             if line.startswith(b"event: ")]
    assert kinds[0] == b"message_start"
    assert kinds[-1] == b"message_end"
    assert b"tool_call_start" in kinds
    stored = await runs.records.events.after(conversation.id, 0, limit=100, run_id=run.run_id)
    assert len(stored) == len(kinds)  # every event followed is the stored one, once
    outcome = await runs.outcome(conversation.id, run.run_id)
    assert (outcome.record.status, outcome.record.finish_reason) == ("completed", "end_turn")
    assert outcome.answer is not None
    assert outcome.answer.text == "The sum is 5."
    with pytest.raises(ApiError) as unknown:
        await runs.outcome(conversation.id, "r_nosuchrun")
    assert (unknown.value.status, unknown.value.code) == (404, "run_not_found")
    await runner.close()


async def test_cancel_through_the_service_ends_the_active_run_cancelled(store: Store) -> None:
    asked = asyncio.Event()

    async def stuck(request: Any) -> Any:
        asked.set()
        await asyncio.Event().wait()  # never answers: only a cancel ends it

    runner = Runner(store, Catalog.of([Agent(FunctionModel(stuck), name="stuck")]), ServerSettings())
    runs = runner.runs
    conversation = await store.conversations.create(agent="stuck")
    run = await runs.start(conversation, Message.user("hi"), principal=LOCAL)
    assert runs.active[conversation.id] is run
    async with asyncio.timeout(20):
        await asked.wait()
        assert await runs.cancel(conversation.id) == run.run_id
        await run.done.wait()
    assert conversation.id not in runs.active
    assert await runs.cancel(conversation.id) is None  # nothing left to cancel
    outcome = await runs.outcome(conversation.id, run.run_id)
    assert outcome.record.finish_reason == "cancelled"
    await runner.close()


async def test_a_fork_whose_run_cannot_start_leaves_no_fork_behind(store: Store) -> None:
    runner = _adder(store)
    forked = await store.conversations.create(agent="adder")
    with pytest.raises((ConfigError, ApiError)):  # a model no provider serves: refused before anything runs
        await runner.runs.fork(forked, Message.user("2+3?"), principal=LOCAL,
                               overrides={"model": "nosuchprovider:x"})
    assert await store.conversations.get(forked.id) is None
    started = await store.conversations.create(agent="adder")
    run = await runner.runs.fork(started, Message.user("2+3?"), principal=LOCAL)
    async with asyncio.timeout(20):
        await run.done.wait()
    assert (await runner.runs.outcome(started.id, run.run_id)).record.status == "completed"
    await runner.close()
