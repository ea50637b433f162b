"""The OpenAI-compatible endpoint without a conversation on the engine (server-contract.md §7): a stateless
`/v1/chat/completions` request sent to an API-only process (`ringlet serve --no-worker`) runs as a durable
workflow that a `ringlet worker` executes, in a hidden conversation of its own that is gone once the answer is
sent; the client gets the answer once even when its worker is SIGKILLed mid-stream, client tool calls and
their continuations work, and a client that leaves stops the run wherever it executes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from test_durable import Cluster, Upstream, calls, cluster, kill, text

pytestmark = pytest.mark.slow

LOOKUP = {"type": "function", "function": {"name": "lookup", "description": "Look a city up.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}


class Completion:
    """A streamed `/v1/chat/completions` request, read as it arrives: its chunks, until `[DONE]`."""

    def __init__(self, client: httpx.AsyncClient, body: dict[str, Any]) -> None:
        self.chunks: list[dict[str, Any]] = []
        self.done = False
        self.changed = asyncio.Condition()
        self.task = asyncio.create_task(self._read(client, {**body, "stream": True}))

    async def _read(self, client: httpx.AsyncClient, body: dict[str, Any]) -> None:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200, await response.aread()
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue  # the blank line after each chunk, `: ping` comments
                if line == "data: [DONE]":
                    self.done = True
                    return
                async with self.changed:
                    self.chunks.append(json.loads(line.removeprefix("data: ")))
                    self.changed.notify_all()

    async def until_text(self, wanted: str) -> None:
        async with self.changed:
            await self.changed.wait_for(lambda: self.text == wanted)

    @property
    def text(self) -> str:
        return "".join(c["choices"][0]["delta"].get("content") or "" for c in self.chunks if c.get("choices"))

    @property
    def run_id(self) -> str:
        return self.chunks[0]["id"].removeprefix("chatcmpl-")

    @property
    def finish_reasons(self) -> list[str]:
        return [c["choices"][0]["finish_reason"] for c in self.chunks
                if c.get("choices") and c["choices"][0]["finish_reason"]]


@asynccontextmanager
async def connected(c: Cluster) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(c.db.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        yield conn
    finally:
        await conn.close()


@asynccontextmanager
async def notices(c: Cluster, name: str, on: str, value: str) -> AsyncIterator[asyncio.Queue[str]]:
    """`value` (SQL over the row's OLD or NEW) for each change of a row that `on` names (`DELETE ON t FOR EACH
    ROW …`), from now on: a trigger notifies each at commit."""
    async with connected(c) as conn:
        await conn.execute(f"""
            CREATE FUNCTION {name}() RETURNS trigger AS $$
            BEGIN PERFORM pg_notify('{name}', {value}); RETURN NULL; END $$ LANGUAGE plpgsql;
            CREATE TRIGGER {name} AFTER {on} EXECUTE FUNCTION {name}();
        """)
        noticed: asyncio.Queue[str] = asyncio.Queue()
        await conn.add_listener(name, lambda *args: noticed.put_nowait(args[3]))
        yield noticed


def deletions(c: Cluster) -> Any:
    """The ids of the conversations deleted from now on."""
    return notices(c, "test_deleted", "DELETE ON conversations FOR EACH ROW", "OLD.id")


def approvals_asked(c: Cluster) -> Any:
    """The ids of the approvals requested from now on."""
    return notices(c, "test_asked", "INSERT ON approvals FOR EACH ROW", "NEW.approval_id")


def pauses(c: Cluster) -> Any:
    """The ids of the runs that pause from now on (their continuation stored, waiting for a human)."""
    return notices(c, "test_paused", "UPDATE ON runs FOR EACH ROW WHEN (NEW.status = 'input_required' AND "
                   "NEW.ended_at IS NULL)", "NEW.id")


async def executed_by(c: Cluster, run_id: str) -> Any:
    """The process whose DBOS executor ran the run's workflow (a worker, or the API process)."""
    async with connected(c) as conn:
        executor = await conn.fetchval("SELECT executor_id FROM dbos.workflow_status WHERE workflow_uuid = $1",
                                       run_id)
    assert executor is not None, f"no workflow ran {run_id}"
    pid = int(executor.rsplit(":", 1)[1])
    return next(p for p in [c.api, *c.workers] if p.pid == pid)


async def holder(c: Cluster, run_id: str) -> Any:
    """The process that holds the running run's lease (it executes it now)."""
    async with connected(c) as conn:
        owner = await conn.fetchval("SELECT lease_owner FROM runs WHERE id = $1", run_id)
    assert owner is not None, f"run {run_id} is not running"
    pid = int(owner.rsplit(":", 1)[1])
    return next(p for p in [c.api, *c.workers] if p.pid == pid)


async def nothing_left(c: Cluster, run_id: str) -> None:
    """No conversation is listed or stored, nor any transcript or event; the run's record stays, whole."""
    listed = await c.client.get("/api/v1/chat/conversations", params={"include_sub_agents": "true"})
    assert listed.json()["data"] == []
    async with connected(c) as conn:
        for table in ("conversations", "messages", "events"):
            assert await conn.fetchval(f"SELECT count(*) FROM {table}") == 0, table
        row = await conn.fetchrow("SELECT conversation_id, state FROM runs WHERE id = $1", run_id)
    assert row["conversation_id"] is None
    assert row["state"] in (None, "null")  # JSON null, as a run without a conversation has always had


async def test_a_stateless_stream_is_executed_by_a_worker_and_leaves_no_conversation(tmp_path: Path,
                                                                                    postgres_url: str) -> None:
    upstream = Upstream(lambda messages: text("Hel", "lo", " there"), hold_after=3)
    async with cluster(tmp_path, postgres_url, upstream) as c:
        completion = Completion(c.client, {"model": "worker", "stream_options": {"include_usage": True}, "messages": [
            {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Earlier"},
            {"role": "assistant", "content": "Noted"}, {"role": "user", "content": "Say hello"}]})
        async with asyncio.timeout(60):  # two deltas sent, the third held: the model request is in flight
            await completion.until_text("Hello")
        run_id = completion.run_id
        assert await holder(c, run_id) in c.workers  # a worker executes it, not the API process
        listed = await c.client.get("/api/v1/chat/conversations", params={"include_sub_agents": "true"})
        assert listed.json()["data"] == []  # its conversation is nobody's to see
        async with connected(c) as conn:
            cid = await conn.fetchval("SELECT conversation_id FROM runs WHERE id = $1", run_id)
        assert (await c.client.get(f"/api/v1/chat/conversations/{cid}")).status_code == 404
        upstream.release.set()
        async with asyncio.timeout(30):
            await completion.task
        assert completion.done
        assert completion.text == "Hello there"
        assert completion.finish_reasons == ["stop"]
        usage = completion.chunks[-1]
        assert (usage["choices"], usage["usage"]["prompt_tokens"], usage["usage"]["completion_tokens"]) == ([], 3, 2)
        assert usage["ringlet"]["run_id"] == run_id
        sent = upstream.requests[0]  # the worker had the request's whole history
        assert [(m["role"], m["content"]) for m in sent[1:]] == [("user", "Earlier"), ("assistant", "Noted"),
                                                                 ("user", "Say hello")]
        assert "Be brief." in sent[0]["content"]
        assert await executed_by(c, run_id) in c.workers
        record = await c.run_record(run_id)  # the run's record stays, with its usage
        assert (record["status"], record["conversation_id"]) == ("completed", None)
        assert (record["usage"]["in_tokens"], record["usage"]["out_tokens"]) == (3, 2)
        await nothing_left(c, run_id)


async def test_a_stateless_stream_whose_worker_is_killed_completes_on_another(tmp_path: Path,
                                                                             postgres_url: str) -> None:
    upstream = Upstream(lambda messages: text("Par", "tial", " answer"), hold_after=3)
    async with cluster(tmp_path, postgres_url, upstream) as c:
        completion = Completion(c.client, {"model": "worker", "messages": [{"role": "user", "content": "Say it"}]})
        async with asyncio.timeout(60):
            await completion.until_text("Partial")
        run_id = completion.run_id
        victim = await holder(c, run_id)
        assert victim in c.workers
        await kill(victim)
        upstream.release.set()
        async with asyncio.timeout(30):  # another worker takes the run over and ends it
            await completion.task
        assert completion.done
        assert completion.text == "Partial answer"  # the request was sent again; no text twice
        assert completion.finish_reasons == ["stop"]
        assert len(upstream.requests) == 2
        survivor = await executed_by(c, run_id)
        assert survivor in c.workers
        assert survivor is not victim
        record = await c.run_record(run_id)
        assert record["status"] == "completed"
        assert (record["usage"]["in_tokens"], record["usage"]["out_tokens"]) == (3, 2)  # the lost request not counted
        await nothing_left(c, run_id)


async def test_a_stateless_completion_runs_on_a_worker(tmp_path: Path, postgres_url: str) -> None:
    upstream = Upstream(lambda messages: text("Hi", " there"))
    async with cluster(tmp_path, postgres_url, upstream) as c:
        answered = await c.client.post("/v1/chat/completions", json={
            "model": "worker", "messages": [{"role": "user", "content": "Hello"}]})
        assert answered.status_code == 200, answered.text
        body = answered.json()
        assert body["choices"][0]["message"]["content"] == "Hi there"
        assert body["choices"][0]["finish_reason"] == "stop"
        assert (body["usage"]["prompt_tokens"], body["usage"]["completion_tokens"]) == (3, 2)
        run_id = body["ringlet"]["run_id"]
        assert body["ringlet"]["finish_reason"] == "end_turn"
        assert await executed_by(c, run_id) in c.workers
        assert (await c.run_record(run_id))["status"] == "completed"
        await nothing_left(c, run_id)


async def test_client_tool_calls_come_back_and_the_continuation_runs_on_a_worker(tmp_path: Path,
                                                                                postgres_url: str) -> None:
    """A server tool and a client tool in one batch: the server's runs (once), the client's comes back; the
    follow-up with its result continues the kept transcript, server-side result included."""

    def script(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if messages[-1]["role"] == "tool":
            return text("It is ", "sunny")
        first, lookup = calls("fast"), {"index": 1, "id": "call_lookup", "type": "function",
                                        "function": {"name": "lookup", "arguments": '{"city": "Paris"}'}}
        return [*first, {"tool_calls": [lookup]}]

    upstream = Upstream(script)
    async with cluster(tmp_path, postgres_url, upstream) as c:
        asked = [{"role": "user", "content": "Weather in Paris?"}]
        first = await c.client.post("/v1/chat/completions", json={"model": "worker", "messages": asked,
                                                                 "tools": [LOOKUP]})
        assert first.status_code == 200, first.text
        body = first.json()
        run_id = body["ringlet"]["run_id"]
        assert body["choices"][0]["finish_reason"] == "tool_calls"
        message = body["choices"][0]["message"]
        assert [(t["id"], t["function"]["name"], json.loads(t["function"]["arguments"]))
                for t in message["tool_calls"]] == [(f"call_lookup.{run_id}", "lookup", {"city": "Paris"})]
        assert await executed_by(c, run_id) in c.workers
        await nothing_left(c, run_id)
        follow = Completion(c.client, {"model": "worker", "tools": [LOOKUP], "messages": [
            *asked, message, {"role": "tool", "tool_call_id": f"call_lookup.{run_id}", "content": "sunny, 25 C"}]})
        async with asyncio.timeout(30):
            await follow.task
        assert follow.text == "It is sunny"
        assert follow.finish_reasons == ["stop"]
        sent = upstream.requests[-1]  # the kept transcript: the server-side call and its result included
        assert [m["role"] for m in sent[1:]] == ["user", "assistant", "tool", "tool"]
        results = {m["tool_call_id"]: m["content"] for m in sent if m["role"] == "tool"}
        assert results == {"call_fast": "fast 0 done", "call_lookup": "sunny, 25 C"}
        assert c.effects_seen() == ["fast"]  # the server tool ran once, not again in the continuation
        assert await executed_by(c, follow.run_id) in c.workers
        await nothing_left(c, follow.run_id)


async def test_a_stateless_run_paused_for_approval_keeps_its_conversation_until_it_ends(tmp_path: Path,
                                                                                       postgres_url: str) -> None:
    """The response ends at once, saying where to decide (issue 42: `/v1` never waits in silence); the run
    waits there, keeps its conversation while it waits, and goes on once approved, leaving nothing."""
    def script(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return text("Approved", " and done") if messages[-1]["role"] == "tool" else calls("danger")

    upstream = Upstream(script)
    async with cluster(tmp_path, postgres_url, upstream) as c, connected(c) as conn, approvals_asked(c) as asked, \
            deletions(c) as deleted:
        completion = Completion(c.client, {"model": "worker", "messages": [{"role": "user", "content": "Do it"}]})
        async with asyncio.timeout(60):
            approval_id = await asked.get()
            await completion.task
        assert f"/api/v1/approvals/{approval_id}" in completion.text
        paused = await conn.fetchrow("SELECT conversation_id, status FROM runs WHERE id = "
                                     "(SELECT run_id FROM approvals WHERE approval_id = $1)", approval_id)
        assert paused["conversation_id"] is not None  # kept while the run waits for a human
        decided = await c.client.post(f"/api/v1/approvals/{approval_id}", json={"approved": True})
        assert decided.status_code == 200, decided.text
        async with asyncio.timeout(30):  # it ended: its conversation goes
            assert await deleted.get() == paused["conversation_id"]
        assert c.effects_seen() == ["danger"]
        approval = await conn.fetchrow("SELECT status, conversation_id FROM approvals WHERE approval_id = $1",
                                       approval_id)
        assert (approval["status"], approval["conversation_id"]) == ("approved", None)  # the record stays
        await nothing_left(c, completion.run_id)


async def test_a_client_leaving_stops_its_stateless_run_on_the_worker(tmp_path: Path, postgres_url: str) -> None:
    upstream = Upstream(lambda messages: text("Par", "tial", " answer"), hold_after=3)
    async with cluster(tmp_path, postgres_url, upstream) as c, deletions(c) as deleted:
        completion = Completion(c.client, {"model": "worker", "messages": [{"role": "user", "content": "Say it"}]})
        async with asyncio.timeout(60):
            await completion.until_text("Partial")
        run_id = completion.run_id
        assert await holder(c, run_id) in c.workers
        async with connected(c) as conn:
            cid = await conn.fetchval("SELECT conversation_id FROM runs WHERE id = $1", run_id)
        completion.task.cancel()  # the client leaves mid-answer; the model's stream is still held
        async with asyncio.timeout(30):  # the run stops on its worker; once it has ended, its conversation goes
            assert await deleted.get() == cid
        record = await c.run_record(run_id)
        assert (record["status"], record["finish_reason"]) == ("canceled", "cancelled")
        upstream.release.set()
        assert len(upstream.requests) == 1
        await nothing_left(c, run_id)


async def test_a_paused_stateless_run_denied_at_its_url_ends(tmp_path: Path, postgres_url: str) -> None:
    """The run waits for a human, followed by no process: denied at the URL its response named, it ends
    without the call, and nothing is left."""
    upstream = Upstream(lambda messages: text("refused") if messages[-1]["role"] == "tool" else calls("danger"))
    async with cluster(tmp_path, postgres_url, upstream) as c, pauses(c) as paused, deletions(c) as deleted:
        completion = Completion(c.client, {"model": "worker", "messages": [{"role": "user", "content": "Do it"}]})
        async with asyncio.timeout(60):
            run_id = await paused.get()
            await completion.task
        async with connected(c) as conn:
            cid = await conn.fetchval("SELECT conversation_id FROM runs WHERE id = $1", run_id)
            approval_id = await conn.fetchval("SELECT approval_id FROM approvals WHERE run_id = $1", run_id)
        assert f"/api/v1/approvals/{approval_id}" in completion.text
        denied = await c.client.post(f"/api/v1/approvals/{approval_id}", json={"approved": False})
        assert denied.status_code == 200, denied.text
        async with asyncio.timeout(30):
            assert await deleted.get() == cid
        record = await c.run_record(run_id)
        assert record["status"] == "completed"
        assert c.effects_seen() == []
        assert len(upstream.requests) == 2
        await nothing_left(c, run_id)
