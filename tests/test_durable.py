"""Durable runs on DBOS (issue 18): several real `ringlet` processes share one PostgreSQL database; the worker
executing a run is SIGKILLed at the worst moments, and the run completes on another worker with every side
effect done once (or `interrupted` per the at-most-once rule), its event log whole, its usage exact, and a
client streaming from a third process (`ringlet serve --no-worker`) sees every event once, in order."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from httpx_sse import aconnect_sse

from postgres import fresh_database
from processes import free_port, ringlet_process, start_all
from serving import serving

pytestmark = pytest.mark.slow

TOOLS_PY = '''
import os
import httpx
from ringlet import RunContext

def _note(what: str) -> None:
    with open(os.environ["EFFECTS"], "a") as f:
        f.write(what + "\\n")

async def fast(n: int) -> str:
    """Record a side effect at once."""
    _note(f"fast {n}")
    return f"fast {n} done"

async def slow(n: int) -> str:
    """Record a side effect, then wait for the test to let it finish."""
    _note(f"slow {n}")
    async with httpx.AsyncClient(timeout=60) as client:
        await client.get(os.environ["HOLD_URL"])
    return f"slow {n} done"

async def again(n: int) -> str:
    """An idempotent call that waits for the test too."""
    _note(f"again {n}")
    async with httpx.AsyncClient(timeout=60) as client:
        await client.get(os.environ["HOLD_URL"])
    return f"again {n} done"

async def danger(n: int) -> str:
    """A call a human must approve."""
    _note(f"danger {n}")
    return f"danger {n} done"
'''

CONFIG = """model: openai:m
model_options: {{base_url: '{url}/v1', api_key: x}}
instructions: Use the tools.
tools:
  fast: {{effect: read}}
  slow: {{effect: read}}
  again: {{effect: read, idempotent: true}}
  danger: {{effect: write, approval: {{mode: confirm}}}}
"""


class Upstream:
    """A scripted OpenAI-compatible model: `script(messages)` gives one answer's deltas; `gate` holds the stream
    after `hold_after` deltas of the first request (a request in flight when its worker dies), `holds` the
    tools' /hold requests. Every answer reports usage (3 in, 2 out)."""

    def __init__(self, script: Callable[[list[dict[str, Any]]], list[dict[str, Any]]], hold_after: int | None = None,
                 held: Callable[[list[dict[str, Any]]], bool] = lambda messages: True):
        self.script, self.hold_after, self.held = script, hold_after, held
        """`held`: which requests the gate may hold (the first of them is held)."""
        self.requests: list[list[dict[str, Any]]] = []
        self.streaming = asyncio.Event()
        """The first request has sent `hold_after` deltas and is held."""
        self.release = asyncio.Event()
        self.holds = asyncio.Condition()
        self.holding = 0
        """How many tools have waited on /hold."""

    def app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import PlainTextResponse, StreamingResponse
        from starlette.routing import Route

        async def completions(request: Request) -> StreamingResponse:
            messages = (await request.json())["messages"]
            self.requests.append(messages)
            first = self.held(messages) and sum(map(self.held, self.requests)) == 1
            deltas = self.script(messages)

            async def chunks() -> AsyncIterator[str]:
                for i, delta in enumerate(deltas):
                    if first and i == self.hold_after:
                        self.streaming.set()
                        await self.release.wait()
                    yield _chunk({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
                yield _chunk({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}})
                yield "data: [DONE]\n\n"

            return StreamingResponse(chunks(), media_type="text/event-stream")

        async def hold(request: Request) -> PlainTextResponse:
            async with self.holds:
                self.holding += 1
                self.holds.notify_all()
            await self.release.wait()
            return PlainTextResponse("ok")

        return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"]),
                                 Route("/hold", hold)])


def _chunk(body: dict[str, Any]) -> str:
    return f"data: {json.dumps({'id': 'x', 'object': 'chat.completion.chunk', 'created': 0, 'model': 'm', **body})}\n\n"


def calls(*names: str) -> list[dict[str, Any]]:
    return [{"role": "assistant", "content": None},
            *[{"tool_calls": [{"index": i, "id": f"call_{name}", "type": "function",
                               "function": {"name": name, "arguments": json.dumps({"n": i})}}]}
              for i, name in enumerate(names)]]


def text(*parts: str) -> list[dict[str, Any]]:
    return [{"role": "assistant", "content": ""}, *[{"content": p} for p in parts]]


def alarming(after_s: float) -> Callable[[list[dict[str, Any]]], list[dict[str, Any]]]:
    """A model script: asked for an alarm, it sets one `after_s` seconds ahead with `alarm_clock` (then says
    so); else it answers `done`."""

    def script(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        last = messages[-1]
        if last["role"] == "user" and "alarm" in str(last["content"]):
            wake = (datetime.now(UTC) + timedelta(seconds=after_s)).isoformat().replace("+00:00", "Z")
            return [{"role": "assistant", "content": None},
                    {"tool_calls": [{"index": 0, "id": "call_alarm", "type": "function", "function": {
                        "name": "alarm_clock", "arguments": json.dumps({"wake_at": wake, "message": "wake up"})}}]}]
        return text("set" if last["role"] == "tool" else "done")

    return script


database = fresh_database
"""A fresh database on the session's PostgreSQL server (migrated: a copy of postgres.py's template)."""


def ringlet(command: list[str], db: str, agents: Path, ready: bytes, **env: str) -> Any:
    """A `ringlet` subprocess on `db` serving `agents`, its log kept beside them (`processes.ringlet_process`)."""
    env = {"RINGLET_AUTH_MODE": "none", "RINGLET_HEARTBEAT_S": "0.2", "RINGLET_WORKER_TIMEOUT_S": "3", **env}
    log = agents.parent / f"{command[0]}-{len(list(agents.parent.glob(command[0] + '-*.log')))}.log"
    log.touch()  # its name taken now: processes started together get one each
    return ringlet_process([*command, "--db", db, "--agents", str(agents)], ready, env, log)


@asynccontextmanager
async def cluster(tmp_path: Path, postgres_url: str, upstream: Upstream, workers: int = 2,
                  configs: dict[str, str] | None = None, **settings: str) -> AsyncIterator[Any]:
    """An API-only `ringlet serve --no-worker` and `workers` `ringlet worker`s on a fresh database; the
    agents: `worker` (CONFIG), and `configs` (name → config.yaml, `{url}`: the model's), all with TOOLS_PY;
    `settings`: more environment (`RINGLET_…`; `{url}`: the model's) for every process."""
    async with AsyncExitStack() as stack:
        model_url = await stack.enter_async_context(serving(upstream.app()))
        db = await stack.enter_async_context(database(postgres_url))
        for name, config in {"worker": CONFIG, **(configs or {})}.items():
            agent = tmp_path / "agents" / name
            agent.mkdir(parents=True)
            (agent / "config.yaml").write_text(config.format(url=model_url))
            (agent / "tools.py").write_text(TOOLS_PY)
        effects = tmp_path / "effects.txt"
        effects.touch()
        env = {"EFFECTS": str(effects), "HOLD_URL": f"{model_url}/hold",
               **{name: value.format(url=model_url) for name, value in settings.items()}}
        port = free_port()
        api, *pool = await start_all(stack, [
            ringlet(["serve", "--no-worker", "--port", str(port)], db, tmp_path / "agents", b"Uvicorn running on",
                    **env),
            *[ringlet(["worker"], db, tmp_path / "agents", b"ready", **env) for _ in range(workers)]])
        client = await stack.enter_async_context(httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60))
        yield Cluster(api, pool, client, db, effects)


class Cluster:
    def __init__(self, api: Any, workers: list[Any], client: httpx.AsyncClient, db: str, effects: Path) -> None:
        self.api, self.workers, self.client, self.db, self.effects = api, workers, client, db, effects

    async def executor(self, run_id: str) -> Any:
        """The worker process that holds the run's lease (it executes the run)."""
        conn = await asyncpg.connect(self.db.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            owner = await conn.fetchval("SELECT lease_owner FROM runs WHERE id = $1", run_id)
        finally:
            await conn.close()
        pid = int(owner.rsplit(":", 1)[1])
        return next(w for w in self.workers if w.pid == pid)

    async def step_recorded(self, run_id: str, name: str) -> bool:
        """Whether DBOS has recorded the step `name` of the run's workflow (a step's events are sent before
        its record is written)."""
        conn = await asyncpg.connect(self.db.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            return bool(await conn.fetchval("SELECT count(*) FROM dbos.operation_outputs WHERE workflow_uuid = $1 "
                                            "AND function_name = $2", run_id, name))
        finally:
            await conn.close()

    async def run_record(self, run_id: str) -> dict[str, Any]:
        return (await self.client.get(f"/api/v1/runs/{run_id}")).json()

    def effects_seen(self) -> list[str]:
        """The tools that ran, once per run (each line also names the worker's pid)."""
        return [line.split()[0] for line in self.effects.read_text().splitlines()]


class Watch:
    """A client following a conversation from its start (through the API process) until its run's
    message_end; `until()` waits for an event it has seen."""

    def __init__(self, client: httpx.AsyncClient, cid: str) -> None:
        self.seen: list[Any] = []
        self.sending: asyncio.Task[Any] | None = None
        """The message's request (answered once the run ends, wherever it executed)."""
        self.changed = asyncio.Condition()
        self.task = asyncio.create_task(self._follow(client, cid))

    async def _follow(self, client: httpx.AsyncClient, cid: str) -> None:
        async with aconnect_sse(client, "GET", f"/api/v1/chat/conversations/{cid}/events",
                                headers={"Last-Event-ID": "0"}) as source:
            async for event in source.aiter_sse():
                if event.event == "ping":
                    continue
                async with self.changed:
                    self.seen.append(event)
                    self.changed.notify_all()
                if event.event == "message_end" and "agent_path" not in json.loads(event.data):
                    return  # the run's own end (a sub-agent's is forwarded into its stream)

    async def until(self, kind: str, check: Callable[[dict[str, Any]], bool] = lambda data: True) -> dict[str, Any]:
        async with self.changed:
            while True:
                found = next((json.loads(e.data) for e in self.seen
                              if e.event == kind and check(json.loads(e.data))), None)
                if found is not None:
                    return found
                await self.changed.wait()

    @property
    def run_id(self) -> str:
        return json.loads(self.seen[0].data)["run_id"]


def whole(events: list[Any]) -> None:
    """Every id once, in order, with no gap."""
    ids = [int(e.id) for e in events]
    assert ids == list(range(1, len(ids) + 1)), ids


async def start(c: Cluster, content: str, agent: str = "worker") -> tuple[str, Watch]:
    """A new conversation, followed from the start, and a message sent to it (its answer is not awaited)."""
    cid = (await c.client.post("/api/v1/chat/conversations", json={"agent": agent})).json()["id"]
    watch = Watch(c.client, cid)
    send = c.client.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": content},
                         headers={"Accept": "application/json"})
    watch.sending = asyncio.create_task(send)
    return cid, watch


async def kill(process: Any) -> None:
    process.send_signal(signal.SIGKILL)
    await process.wait()


@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP", "SIGTERM"])
async def test_a_worker_lost_mid_model_stream(tmp_path: Path, postgres_url: str, how: str) -> None:
    """SIGKILL: the worker exited (its machine sees it at once); SIGSTOP: it stops answering but lives (a
    machine gone from the network): it is dead once silent for `worker_timeout_s`; SIGTERM with no time to
    drain (`RINGLET_DRAIN_S=0`; tests/test_drain.py drains): it stops cleanly and hands the run on, not
    ending it."""
    upstream = Upstream(lambda messages: text("Par", "tial", " answer"), hold_after=3)
    async with cluster(tmp_path, postgres_url, upstream, RINGLET_DRAIN_S="0") as c:
        cid, watch = await start(c, "Say something")
        async with asyncio.timeout(60):  # two deltas sent (and seen), the third held: the request is in flight
            await watch.until("content_delta", lambda d: d["delta"] == "tial")
        run_id = watch.run_id
        victim = await c.executor(run_id)
        if how == "SIGKILL":
            await kill(victim)
        else:
            victim.send_signal(getattr(signal, how))
        if how == "SIGTERM":  # it hands its run on (the request in flight is dropped) and exits
            async with asyncio.timeout(30):
                assert await victim.wait() == 0
        upstream.release.set()
        async with asyncio.timeout(30):  # another worker takes the run over and ends it
            await watch.task
        if how == "SIGSTOP":
            await kill(victim)  # before it wakes up: it would go on with a step it had started
        seen = watch.seen
        whole(seen)
        kinds = [e.event for e in seen]
        retracted = kinds.index("retracted")  # the abandoned attempt's text is withdrawn before the new one
        again = "".join(json.loads(e.data)["delta"] for e in seen[retracted:] if e.event == "content_delta")
        assert (kinds[:retracted].count("content_delta"), again) == (2, "Partial answer")  # no text spliced
        assert len(upstream.requests) == 2
        end = json.loads(seen[-1].data)
        assert end["finish_reason"] == "end_turn"
        assert (end["usage"]["in_tokens"], end["usage"]["out_tokens"]) == (3, 2)  # the lost request not counted
        record = await c.run_record(run_id)
        assert record["status"] == "completed"
        assert (record["usage"]["in_tokens"], record["usage"]["out_tokens"]) == (3, 2)
        messages = (await c.client.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"]
        assert [(m["role"], m["content"]) for m in messages] == [("user", "Say something"),
                                                                   ("assistant", "Partial answer")]


async def test_a_run_executing_on_a_worker_is_cancelled_through_the_api_process(tmp_path: Path,
                                                                              postgres_url: str) -> None:
    upstream = Upstream(lambda messages: text("Par", "tial", " answer"), hold_after=3)
    async with cluster(tmp_path, postgres_url, upstream) as c:
        cid, watch = await start(c, "Say something")
        async with asyncio.timeout(60):
            await watch.until("content_delta", lambda d: d["delta"] == "tial")
        cancelled = await c.client.post(f"/api/v1/chat/conversations/{cid}/cancel")
        assert cancelled.status_code == 202, cancelled.text
        async with asyncio.timeout(30):
            await watch.task
        upstream.release.set()
        whole(watch.seen)
        assert json.loads(watch.seen[-1].data)["finish_reason"] == "cancelled"
        assert (await c.run_record(watch.run_id))["status"] == "canceled"


async def test_a_worker_killed_mid_tool_batch(tmp_path: Path, postgres_url: str) -> None:
    def script(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return text("All", " done") if messages[-1]["role"] == "tool" else calls("fast", "slow", "again")

    upstream = Upstream(script)
    async with cluster(tmp_path, postgres_url, upstream) as c:
        cid, watch = await start(c, "Do the three things")
        async with asyncio.timeout(60):  # fast has finished; slow and again are both running
            await watch.until("tool_result", lambda d: d["tool_call_id"] == "call_fast")
            async with upstream.holds:
                await upstream.holds.wait_for(lambda: upstream.holding == 2)
        run_id = watch.run_id
        await kill(await c.executor(run_id))
        upstream.release.set()
        async with asyncio.timeout(30):
            await watch.task
        seen = watch.seen
        whole(seen)
        effects = c.effects_seen()
        assert effects.count("fast") == 1  # finished before the crash: not run again
        assert effects.count("slow") == 1  # in flight and not idempotent: interrupted, not run again
        assert effects.count("again") == 2  # in flight and idempotent: run again
        results = {json.loads(e.data)["tool_call_id"]: json.loads(e.data) for e in seen if e.event == "tool_result"}
        assert results["call_fast"]["is_error"] is False
        assert results["call_slow"]["error"]["code"] == "interrupted"
        assert results["call_again"]["is_error"] is False
        assert [e.event for e in seen].count("tool_result") == 3
        assert len(upstream.requests) == 2  # the first response was fully received: not requested again
        record = await c.run_record(run_id)
        assert record["status"] == "completed"
        assert (record["usage"]["in_tokens"], record["usage"]["out_tokens"]) == (6, 4)
        messages = (await c.client.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"]
        assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "tool", "assistant"]


async def test_a_worker_killed_while_its_run_waits_for_approval(tmp_path: Path, postgres_url: str) -> None:
    def script(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return text("Approved", " and done") if messages[-1]["role"] == "tool" else calls("danger")

    upstream = Upstream(script)
    async with cluster(tmp_path, postgres_url, upstream) as c:
        _, watch = await start(c, "Do the dangerous thing")
        async with asyncio.timeout(60):
            approval = await watch.until("approval_required")
            await watch.until("status", lambda d: d["state"] == "input_required")
        run_id = watch.run_id
        conn = await asyncpg.connect(c.db.replace("postgresql+asyncpg://", "postgresql://"))
        try:  # the paused run holds no lease: its workflow waits in the worker that ran it
            executor = await conn.fetchval("SELECT executor_id FROM dbos.workflow_status WHERE workflow_uuid = $1",
                                           run_id)
        finally:
            await conn.close()
        await kill(next(w for w in c.workers if w.pid == int(executor.rsplit(":", 1)[1])))
        decided = await c.client.post(f"/api/v1/approvals/{approval['approval_id']}", json={"approved": True})
        assert decided.status_code == 200, decided.text  # decided through the API process
        async with asyncio.timeout(30):
            await watch.task
        seen = watch.seen
        whole(seen)
        assert c.effects_seen().count("danger") == 1
        result = next(json.loads(e.data) for e in seen if e.event == "tool_result")
        assert result["is_error"] is False
        assert json.loads(seen[-1].data)["finish_reason"] == "end_turn"
        assert (await c.run_record(run_id))["status"] == "completed"


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
  danger: {{effect: write, approval: {{mode: confirm}}}}
"""


async def test_a_sub_agents_approval_is_decided_through_the_api_process(tmp_path: Path, postgres_url: str) -> None:
    """The sub-agent is a durable run of its own (a workflow any worker executes) that pauses for its human
    like any run; its approval reaches the parent's stream, is listed under the parent conversation and
    decided there through the API process, which wakes the child's workflow wherever it waits."""

    def script(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        helper = "Help." in str(messages[0].get("content"))
        if messages[-1]["role"] == "tool":
            return text("helped" if helper else "led")
        if helper:
            return calls("danger")
        return [{"role": "assistant", "content": None},
                {"tool_calls": [{"index": 0, "id": "call_spawn", "type": "function", "function": {
                    "name": "spawn_agent", "arguments": json.dumps({"task": "do it", "agent": "helper"})}}]}]

    upstream = Upstream(script)
    async with cluster(tmp_path, postgres_url, upstream, configs={"lead": LEAD, "helper": HELPER}) as c:
        cid, watch = await start(c, "Get it done", agent="lead")
        async with asyncio.timeout(60):
            approval = await watch.until("approval_required")  # the sub-agent's, forwarded
            await watch.until("status", lambda d: d.get("agent_path") == ["lead", "helper"]
                              and d["state"] == "input_required")
        assert (approval["agent_path"], approval["parent_tool_call_id"]) == (["lead", "helper"], "call_spawn")
        listed = (await c.client.get(f"/api/v1/chat/conversations/{cid}/approvals")).json()["data"]
        assert [a["approval_id"] for a in listed] == [approval["approval_id"]]  # under the parent conversation
        decided = await c.client.post(f"/api/v1/chat/conversations/{cid}/approvals/{approval['approval_id']}",
                                      json={"approved": True})
        assert decided.status_code == 200, decided.text
        async with asyncio.timeout(30):
            await watch.task
        whole(watch.seen)
        assert c.effects_seen() == ["danger"]
        spawned = next(json.loads(e.data) for e in watch.seen
                       if e.event == "tool_result" and json.loads(e.data)["tool_call_id"] == "call_spawn")
        assert spawned["is_error"] is False
        assert spawned["result"] == "helped"
        assert json.loads(watch.seen[-1].data)["finish_reason"] == "end_turn"
        conn = await asyncpg.connect(c.db.replace("postgresql+asyncpg://", "postgresql://"))
        try:  # the child ran as a workflow of its own, and paused (no lease) while it waited
            children = await conn.fetch("SELECT r.id, r.status, w.name, w.status AS workflow FROM runs r JOIN "
                                        "dbos.workflow_status w ON w.workflow_uuid = r.id WHERE r.parent_run_id = $1",
                                        watch.run_id)
        finally:
            await conn.close()
        assert [(r["status"], r["name"], r["workflow"]) for r in children] == [("completed", "ringlet.run", "SUCCESS")]
        assert (await c.run_record(children[0]["id"]))["usage"]["in_tokens"] == 6
        assert (await c.run_record(watch.run_id))["usage"]["in_tokens"] == 12  # its own two requests and its child's


async def test_a_worker_killed_during_a_graph_super_step(tmp_path: Path, postgres_url: str) -> None:
    """A graph run executes on a worker like any run; its worker killed mid-step, another goes on from its
    recorded steps: the finished nodes are not run again, the interrupted one is (each event sent once)."""
    from test_graph_server import crashy, pid_reports

    async with pid_reports() as (port, pids):
        crashy(tmp_path / "agents", "crashy", port)
        async with cluster(tmp_path, postgres_url, Upstream(lambda messages: text("unused"))) as c:
            _, watch = await start(c, "go", agent="crashy")
            async with asyncio.timeout(60):
                await pids.get()  # `slow` (the second super-step) is running on a worker
            await kill(await c.executor(watch.run_id))
            async with asyncio.timeout(30):
                await watch.task
            whole(watch.seen)
            end = json.loads(watch.seen[-1].data)
            assert end["finish_reason"] == "end_turn"
            started = [json.loads(e.data)["node_id"] for e in watch.seen if e.event == "node_start"]
            assert started == ["first", "slow", "last", "z"]  # each once: slow ran again, its start was logged
            assert (tmp_path / "agents" / "crashy.marker").exists()  # slow's first attempt hung, and was killed
            record = await c.run_record(watch.run_id)
            assert record["status"] == "completed"
            messages = (await c.client.get(f"/api/v1/chat/conversations/{watch_cid(watch)}")).json()["messages"]
            assert messages[-1]["content"] == '11 ["first","slow","last"] crashy'  # as if never interrupted


def watch_cid(watch: Watch) -> str:
    return json.loads(watch.seen[0].data)["conversation_id"]


async def test_a_run_that_cannot_be_queued_ends_as_failed_and_frees_its_conversation(postgres_url: str) -> None:
    from sqlalchemy import select

    from ringlet import Agent
    from ringlet.server import ServerSettings, create_app
    from ringlet.store import Store
    from ringlet.store.schema import runs
    from ringlet.testing import FunctionModel

    async with database(postgres_url) as db:
        store = await Store.open(db)
        app = create_app(ServerSettings(auth_mode="none"), store=store,
                         agents=[Agent(FunctionModel(lambda request: "hi"), name="plain")])
        try:
            async with serving(app) as url, httpx.AsyncClient(base_url=url) as client:
                cid = (await client.post("/api/v1/chat/conversations", json={"agent": "plain"})).json()["id"]
                runner = app.state.ringlet.runner  # started: the first request waited for it
                assert app.state.ringlet.durable  # PostgreSQL: runs are workflows

                async def refused(*args: Any, **kwargs: Any) -> None:
                    raise RuntimeError("the queue is unreachable")

                runner.here.executor.engine.dispatch = refused
                sent = await client.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": "hello"},
                                         headers={"Accept": "application/json"})
                assert sent.status_code == 503, sent.text
                assert sent.headers["retry-after"] == "5"
                got = (await client.get(f"/api/v1/chat/conversations/{cid}")).json()
                assert got["conversation"]["status"] == "idle"  # not left running
                async with store.db.connect() as conn:
                    statuses = (await conn.execute(select(runs.c.status).where(runs.c.conversation_id == cid))).all()
                assert [s for s, in statuses] == ["failed"]
        finally:
            await store.close()
