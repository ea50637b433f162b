"""Sub-agents as durable runs of their own (issue 18, `builtin-tools-and-subagents.md` §6): on the engine a
spawn call starts its child as a workflow any worker executes. Real `ringlet` processes share one
PostgreSQL; the worker executing the child, or the one executing its parent, is SIGKILLed mid-child; the
child completes once, the parent completes with the child's answer, usage is exact, and a client on the API
process sees every event of both once. Any worker may take a sub-agent's run, its parent's own too, so the
crash tests set the scene until parent and child run on different workers (`apart`), and a third takes over
the killed one's. In one process on the engine: a
durable child's time limit, and its place among its parent's kept across its pause."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import asyncpg
import pytest

from test_durable import Upstream, Watch, calls, cluster, kill, start, text, whole

pytestmark = pytest.mark.slow

LEAD = """model: openai:m
model_options: {{base_url: '{url}/v1', api_key: x}}
instructions: Lead.
can_spawn_agents: true
sub_agents: {{allowed: [helper]}}
"""
HELPER = """model: openai:m
model_options: {{base_url: '{url}/v1', api_key: x}}
instructions: Help.
tools:
  fast: {{effect: read}}
  slow: {{effect: read}}
"""
SPAWN = [{"role": "assistant", "content": None},
         {"tool_calls": [{"index": 0, "id": "call_spawn", "type": "function", "function": {
             "name": "spawn_agent", "arguments": json.dumps({"task": "do it", "agent": "helper"})}}]}]


def child_upstream(script: Callable[[list[dict[str, Any]]], list[dict[str, Any]]], hold_after: int | None = None,
                  held: Callable[[list[dict[str, Any]]], bool] | None = None) -> Upstream:
    """`Upstream` whose gate holds the first request `held` picks (by default the helper's first)."""
    return Upstream(script, hold_after, held or is_helper)


def is_helper(messages: list[dict[str, Any]]) -> bool:
    return "Help." in str(messages[0].get("content"))


def scripted(first: list[dict[str, Any]]) -> Callable[[list[dict[str, Any]]], list[dict[str, Any]]]:
    """The lead spawns the helper, then says "led"; the helper answers `first`, then "helped"."""

    def script(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if messages[-1]["role"] == "tool":
            return text("hel", "ped") if is_helper(messages) else text("led")
        return first if is_helper(messages) else SPAWN

    return script


@pytest.fixture
def one_run_per_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cluster's workers (subprocesses) each execute one run at a time."""
    monkeypatch.setenv("RINGLET_WORKER_CONCURRENCY", "1")


@asynccontextmanager
async def apart(tmp_path: Path, postgres_url: str, upstream_of: Callable[[], Upstream],
                reached: Callable[[Watch, Upstream], Awaitable[Any]]) -> AsyncIterator[SimpleNamespace]:
    """A three-worker cluster where the lead's run and its helper's run to the point `reached` on two
    different workers: `c`, `upstream`, `cid`, `watch`, `parent`, `child` (the run ids), `executors`
    (theirs). DBOS lets any worker take a sub-agent's run, its parent's worker too, so when both fell on one
    worker the scene is set again on a fresh cluster (each try has one chance in three of that)."""
    for attempt in range(10):
        upstream = upstream_of()
        async with cluster(tmp_path / f"try{attempt}", postgres_url, upstream, workers=3,
                           configs={"lead": LEAD, "helper": HELPER}) as c:
            cid, watch = await start(c, "Get it done", agent="lead")
            async with asyncio.timeout(60):
                await reached(watch, upstream)
            parent = watch.run_id
            (child,), _ = await children_of(c.db, parent)
            executors = (await c.executor(parent), await c.executor(child))
            if executors[0] is not executors[1]:
                yield SimpleNamespace(c=c, upstream=upstream, cid=cid, watch=watch, parent=parent, child=child,
                                      executors=executors)
                return
            for task in (watch.task, watch.sending):
                if task is not None:
                    task.cancel()
    pytest.fail("the lead's run and its helper's always fell on one worker")


async def children_of(db: str, run_id: str) -> tuple[list[str], list[str]]:
    """The runs and the conversations the run's sub-agents were given."""
    conn = await asyncpg.connect(db.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        runs = await conn.fetch("SELECT id FROM runs WHERE parent_run_id = $1", run_id)
        conversations = await conn.fetch("SELECT id FROM conversations WHERE parent_run_id = $1", run_id)
    finally:
        await conn.close()
    return [r["id"] for r in runs], [r["id"] for r in conversations]


def nested(seen: list[Any]) -> list[tuple[str, dict[str, Any]]]:
    """The child's events, as forwarded into the parent's stream."""
    events = [(e.event, json.loads(e.data)) for e in seen]
    return [(kind, data) for kind, data in events if data.get("agent_path") == ["lead", "helper"]]


def check_parent(seen: list[Any], effects: list[str], effect: str) -> None:
    """The parent's stream is whole, every event of the child in it once, the call's result the child's
    answer, and the child's side effect done once."""
    whole(seen)
    assert effects == [effect]
    child = nested(seen)
    kinds = [kind for kind, _ in child]
    assert (kinds.count("message_start"), kinds.count("message_end")) == (1, 1)
    assert kinds[0] == "message_start"
    assert kinds[-1] == "message_end"
    assert [d["tool_call_id"] for kind, d in child if kind == "tool_call_start"] == [f"call_{effect}"]
    assert [d["tool_call_id"] for kind, d in child if kind == "tool_result"] == [f"call_{effect}"]
    assert all(d["depth"] == 1 and d["parent_tool_call_id"] == "call_spawn" for _, d in child)
    own = [(e.event, json.loads(e.data)) for e in seen if "agent_path" not in json.loads(e.data)]
    spawned = [d for kind, d in own if kind == "tool_result" and d["tool_call_id"] == "call_spawn"]
    assert len(spawned) == 1
    assert spawned[0]["is_error"] is False, spawned[0]
    assert spawned[0]["result"] == "helped"
    assert [kind for kind, _ in own].count("tool_call_start") == 1
    assert "".join(d["delta"] for kind, d in own if kind == "content_delta") == "led"
    end = own[-1][1]
    assert (own[-1][0], end["finish_reason"]) == ("message_end", "end_turn")
    assert (end["usage"]["in_tokens"], end["usage"]["out_tokens"]) == (12, 8)  # two requests of each


@pytest.mark.usefixtures("one_run_per_worker")
async def test_the_worker_executing_a_child_is_killed_mid_model_stream(tmp_path: Path, postgres_url: str) -> None:
    """The child's model request is in flight when its worker dies: another worker executes the child
    again (the request is sent again; what the child had streamed is not streamed twice), while its
    parent, on a third worker, goes on following it."""
    first = [{"role": "assistant", "content": ""}, {"content": "Let"}, {"content": " me"},
             {"tool_calls": [{"index": 0, "id": "call_fast", "type": "function",
                              "function": {"name": "fast", "arguments": json.dumps({"n": 0})}}]}]

    async def reached(watch: Watch, upstream: Upstream) -> None:  # " me" seen through the parent; the call held
        await watch.until("content_delta", lambda d: d["delta"] == " me" and "agent_path" in d)
        await upstream.streaming.wait()

    async with apart(tmp_path, postgres_url, lambda: child_upstream(scripted(first), hold_after=3), reached) as a:
        c, upstream, watch, cid, parent, child = a.c, a.upstream, a.watch, a.cid, a.parent, a.child
        await kill(a.executors[1])  # the child's worker
        upstream.release.set()
        async with asyncio.timeout(60):
            await watch.task
        seen = watch.seen
        check_parent(seen, c.effects_seen(), "fast")
        forwarded = nested(seen)
        cut = [kind for kind, _ in forwarded].index("retracted")  # the lost attempt's text, withdrawn
        before, after = ("".join(d["delta"] for kind, d in part if kind == "content_delta")
                         for part in (forwarded[:cut], forwarded[cut:]))
        assert (before, after) == ("Let me", "Let mehelped")  # the request sent again: its text, not spliced
        assert sum(map(is_helper, upstream.requests)) == 3  # the lost one, again, and after the tool
        assert len(upstream.requests) == 5
        runs, conversations = await children_of(c.db, parent)
        assert (runs, len(conversations)) == ([child], 1)
        record = await c.run_record(child)
        assert record["status"] == "completed"
        assert (record["usage"]["in_tokens"], record["usage"]["out_tokens"]) == (6, 4)  # the lost one not counted
        record = await c.run_record(parent)
        assert record["status"] == "completed"
        assert (record["usage"]["in_tokens"], record["usage"]["out_tokens"]) == (12, 8)
        messages = (await c.client.get(f"/api/v1/chat/conversations/{conversations[0]}")).json()["messages"]
        assert [(m["role"], m["content"]) for m in messages] == [
            ("user", "do it"), ("assistant", "Let me"), ("tool", "fast 0 done"), ("assistant", "helped")]
        got = (await c.client.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"]
        assert [m["role"] for m in got] == ["user", "assistant", "tool", "assistant"]


@pytest.mark.usefixtures("one_run_per_worker")
async def test_the_worker_executing_a_parent_is_killed_while_its_child_runs(tmp_path: Path,
                                                                            postgres_url: str) -> None:
    """The parent's worker dies while its child's tool runs on another worker: the child goes on and
    completes; the parent, executed again on a third worker, re-attaches to the same child (its spawn call
    runs again and starts nothing) and ends with the child's answer."""
    async def reached(watch: Watch, upstream: Upstream) -> None:  # the child's `slow` is running
        await watch.until("tool_call_start", lambda d: d["tool_call_id"] == "call_slow")
        async with upstream.holds:
            await upstream.holds.wait_for(lambda: upstream.holding == 1)

    async with apart(tmp_path, postgres_url, lambda: child_upstream(scripted(calls("slow"))), reached) as a:
        c, upstream, watch, cid, parent, child = a.c, a.upstream, a.watch, a.cid, a.parent, a.child
        await kill(a.executors[0])  # the parent's worker
        upstream.release.set()
        async with asyncio.timeout(60):
            await watch.task
        seen = watch.seen
        check_parent(seen, c.effects_seen(), "slow")
        deltas = "".join(d["delta"] for kind, d in nested(seen) if kind == "content_delta")
        assert deltas == "helped"
        assert sum(map(is_helper, upstream.requests)) == 2
        assert len(upstream.requests) == 4  # the parent's first response was recorded: not requested again
        runs, conversations = await children_of(c.db, parent)
        assert (runs, len(conversations)) == ([child], 1)  # re-attached: no second child
        record = await c.run_record(child)
        assert record["status"] == "completed"
        assert (record["usage"]["in_tokens"], record["usage"]["out_tokens"]) == (6, 4)
        record = await c.run_record(parent)
        assert record["status"] == "completed"
        assert (record["usage"]["in_tokens"], record["usage"]["out_tokens"]) == (12, 8)
        got = (await c.client.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"]
        assert [m["role"] for m in got] == ["user", "assistant", "tool", "assistant"]
        assert got[2]["content"] == "helped"


@pytest.mark.usefixtures("one_run_per_worker")
async def test_a_parent_killed_after_its_child_returned_counts_the_childs_usage_once(tmp_path: Path,
                                                                                    postgres_url: str) -> None:
    """The parent's worker dies during its last model request, after the spawn call returned: executed again,
    the parent replays the call's recorded result (no child runs again, no child event is sent again) and
    its usage still holds the child's, once."""

    def last(messages: list[dict[str, Any]]) -> bool:
        return not is_helper(messages) and messages[-1]["role"] == "tool"

    upstream = child_upstream(scripted(calls("fast")), hold_after=1, held=last)
    async with cluster(tmp_path, postgres_url, upstream, workers=3,
                       configs={"lead": LEAD, "helper": HELPER}) as c:
        _, watch = await start(c, "Get it done", agent="lead")
        async with asyncio.timeout(60):  # the spawn call returned; the parent's last request is in flight
            await watch.until("tool_result", lambda d: d["tool_call_id"] == "call_spawn")
            await upstream.streaming.wait()
        parent = watch.run_id
        await kill(await c.executor(parent))
        upstream.release.set()
        async with asyncio.timeout(60):
            await watch.task
        seen = watch.seen
        check_parent(seen, c.effects_seen(), "fast")
        assert sum(map(is_helper, upstream.requests)) == 2  # the child did not run again
        assert len(upstream.requests) == 5  # the parent's last request was sent again
        runs, conversations = await children_of(c.db, parent)
        assert (len(runs), len(conversations)) == (1, 1)
        statuses = [json.loads(e.data)["state"] for e in seen if e.event == "status" and
                    "agent_path" not in json.loads(e.data)]
        assert statuses == ["working", "completed"]
        record = await c.run_record(parent)
        assert record["status"] == "completed"
        assert (record["usage"]["in_tokens"], record["usage"]["out_tokens"]) == (12, 8)  # the child's counted once


@asynccontextmanager
async def one_process(postgres_url: str, agents: list[Any]) -> AsyncIterator[tuple[Any, Any]]:
    """A server on the engine in this process (a fresh PostgreSQL database), and a cluster-like view of it
    (`client`, `db`)."""
    import httpx

    from ringlet.server import ServerSettings, create_app
    from ringlet.store import Store
    from serving import serving
    from test_durable import database

    async with database(postgres_url) as db:
        store = await Store.open(db)
        app = create_app(ServerSettings(auth_mode="none", ping_interval_s=0.2), store=store, agents=agents)
        try:
            async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=60) as client:
                yield app, SimpleNamespace(client=client, db=db)
        finally:
            await store.close()


async def test_a_durable_child_past_its_time_is_cancelled(postgres_url: str) -> None:
    """On the engine the child's time limit holds too: past it the child's run is cancelled (in whichever
    process executes it), its end is forwarded, and the call fails with `sub_agent_timeout`."""
    from ringlet import Agent, SubAgents
    from ringlet.models.base import ModelRequest
    from ringlet.testing import FunctionModel, call

    never = asyncio.Event()

    async def stuck(request: ModelRequest) -> str:
        await never.wait()
        return "never"

    def boss_model(request: ModelRequest) -> Any:
        done = [m for m in request.messages if m.role == "tool"]
        return "gave up" if done else call("spawn_agent", {"task": "sleep", "agent": "sleeper"}, id="s1")

    sleeper = Agent(FunctionModel(stuck), name="sleeper")
    boss = Agent(FunctionModel(boss_model), name="boss", tools=[SubAgents([sleeper], timeout_s=0.5)])
    async with one_process(postgres_url, [boss, sleeper]) as (_, c):
        _, watch = await start(c, "go", agent="boss")
        async with asyncio.timeout(60):
            await watch.task
        runs, _ = await children_of(c.db, watch.run_id)
        record = (await c.client.get(f"/api/v1/runs/{runs[0]}")).json()
    whole(watch.seen)
    events = [(e.event, json.loads(e.data)) for e in watch.seen]
    result = next(d for kind, d in events if kind == "tool_result" and d["tool_call_id"] == "s1")
    assert result["error"]["code"] == "sub_agent_timeout"
    assert result["error"]["child_run_id"] == runs[0]
    ends = [(d.get("agent_path"), d["finish_reason"]) for kind, d in events if kind == "message_end"]
    assert ends == [(["boss", "sleeper"], "cancelled"), (None, "end_turn")]
    assert record["status"] == "canceled"


async def test_a_durable_child_resumed_after_its_approval_spawns_at_its_place(postgres_url: str) -> None:
    """In one process on the engine: the child pauses for its human (decided through the parent's
    conversation), its workflow resumes it, and a grandchild it then spawns is still at depth 2 under
    the root's path (the child's lineage is part of its workflow's input, kept across its pause)."""
    from ringlet import Agent, Gates, SubAgents
    from ringlet.gates import ApprovalRules
    from ringlet.models.base import ModelRequest
    from ringlet.testing import FunctionModel, call
    from test_server_subagents import ship

    def helper_model(request: ModelRequest) -> Any:
        done = [m for m in request.messages if m.role == "tool"]
        if not done:
            return call("ship", {"parcel": "books"}, id="h1")
        return call("spawn_agent", {"task": "finish", "agent": "leaf"}, id="h2") if len(done) == 1 else "helped"

    def lead_model(request: ModelRequest) -> Any:
        done = [m for m in request.messages if m.role == "tool"]
        return f"child said: {done[-1].content}" if done else call("spawn_agent", {"task": "ship", "agent": "helper"},
                                                                      id="s1")

    leaf = Agent(FunctionModel(lambda request: "leaf done"), name="leaf")
    helper = Agent(FunctionModel(helper_model), name="helper", tools=[ship, SubAgents([leaf])],
                   gates=Gates(approvals=ApprovalRules({"ship": {"mode": "confirm"}})))
    lead = Agent(FunctionModel(lead_model), name="lead", tools=[SubAgents([helper])])
    async with one_process(postgres_url, [lead, helper, leaf]) as (app, c):
        cid, watch = await start(c, "go", agent="lead")
        async with asyncio.timeout(60):
            asked = await watch.until("approval_required")
        assert app.state.ringlet.durable  # runs are workflows
        decided = await c.client.post(f"/api/v1/chat/conversations/{cid}/approvals/{asked['approval_id']}",
                                      json={"approved": True})
        assert decided.status_code == 200, decided.text
        async with asyncio.timeout(60):
            await watch.task
    whole(watch.seen)
    events = [(e.event, json.loads(e.data)) for e in watch.seen]
    deepest = {(tuple(d["agent_path"]), d["depth"]) for _, d in events if len(d.get("agent_path") or ()) > 2}
    assert deepest == {(("lead", "helper", "leaf"), 2)}
    answer = "".join(d["delta"] for kind, d in events if kind == "content_delta" and "agent_path" not in d)
    assert answer == "child said: helped"
    assert events[-1][0] == "message_end"


@pytest.mark.usefixtures("one_run_per_worker")
async def test_a_parent_and_its_child_killed_together_forward_every_child_event(tmp_path: Path,
                                                                               postgres_url: str) -> None:
    """Both workers die; the third executes parent and child again, side by side: the parent forwards the
    child's events from the child's log (not from what the child's new execution published, which lacks
    what the dead one had logged), so its stream has every child event once, in the child's order."""
    first = [{"role": "assistant", "content": ""}, {"content": "Let"}, {"content": " me"},
             {"tool_calls": [{"index": 0, "id": "call_fast", "type": "function",
                              "function": {"name": "fast", "arguments": json.dumps({"n": 0})}}]}]

    async def reached(watch: Watch, upstream: Upstream) -> None:
        await watch.until("content_delta", lambda d: d["delta"] == " me" and "agent_path" in d)
        await upstream.streaming.wait()

    async with apart(tmp_path, postgres_url, lambda: child_upstream(scripted(first), hold_after=3), reached) as a:
        c, upstream, watch, child = a.c, a.upstream, a.watch, a.child
        for executor in a.executors:
            await kill(executor)
        upstream.release.set()
        async with asyncio.timeout(90):
            await watch.task
        whole(watch.seen)
        conn = await asyncpg.connect(c.db.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            rows = await conn.fetch("SELECT type, payload FROM events WHERE run_id = $1 ORDER BY id", child)
            logged = [(r["type"], json.loads(r["payload"]) if isinstance(r["payload"], str) else r["payload"])
                      for r in rows]
        finally:
            await conn.close()

        def shape(events: list[tuple[str, dict[str, Any]]]) -> list[tuple[Any, ...]]:
            return [(kind, d.get("message_id") or d.get("tool_call_id"), d.get("delta")) for kind, d in events
                    if "agent_path" not in d or d["agent_path"] == ["lead", "helper"]]

        assert shape(nested(watch.seen)) == shape([(k, d) for k, d in logged if "agent_path" not in d])
        assert (await c.run_record(child))["status"] == "completed"
