"""Steering a durable run executed by another process: an API-only `ringlet serve --no-worker` takes the steer,
and the `ringlet worker` executing the run receives it (a DBOS message) at its next round boundary; a worker
killed after it took one is replaced by another, whose execution receives it at the same boundary again."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

import test_durable
from helpers import eventually
from processes import start_all
from test_durable import Cluster, calls, cluster, kill, ringlet, start, text, whole

pytestmark = pytest.mark.slow


class Upstream(test_durable.Upstream):
    """A scripted OpenAI-compatible model for the `worker` agent: its first request asks for `slow` (which
    waits on /hold until `tool` is set), later ones answer with the user messages they saw; with `hold_answer`,
    an answer waits after its first delta until `answer` is set (`answering` is set then)."""

    def __init__(self, *, hold_answer: bool = False) -> None:
        super().__init__(lambda messages: [])  # (its script and gates are this class's own)
        self.requests: list[list[dict[str, Any]]] = []
        self.looking, self.tool = asyncio.Event(), asyncio.Event()
        self.answering, self.answer, self.hold_answer = asyncio.Event(), asyncio.Event(), hold_answer

    def app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import PlainTextResponse, StreamingResponse
        from starlette.routing import Route

        async def completions(request: Request) -> StreamingResponse:
            messages = (await request.json())["messages"]
            self.requests.append(messages)
            users = [m["content"] for m in messages if m["role"] == "user"]
            answering = any(m["role"] == "tool" for m in messages)
            deltas = text("seen: ", " | ".join(users)) if answering else calls("slow")

            async def chunks() -> AsyncIterator[str]:
                for i, delta in enumerate(deltas):
                    if answering and self.hold_answer and i == 2:
                        self.answering.set()
                        await self.answer.wait()
                    yield _chunk({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
                yield _chunk({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}})
                yield "data: [DONE]\n\n"

            return StreamingResponse(chunks(), media_type="text/event-stream")

        async def hold(request: Request) -> PlainTextResponse:
            self.looking.set()
            await self.tool.wait()
            return PlainTextResponse("ok")

        return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"]),
                                 Route("/hold", hold)])


def _chunk(body: dict[str, Any]) -> str:
    return f"data: {json.dumps({'id': 'x', 'object': 'chat.completion.chunk', 'created': 0, 'model': 'm', **body})}\n\n"


async def steer(c: Cluster, cid: str, content: str) -> dict[str, Any]:
    response = await c.client.post(f"/api/v1/chat/conversations/{cid}/messages",
                                   json={"content": content, "mode": "steer"})
    assert response.status_code == 202, response.text
    return response.json()


async def test_a_steer_is_taken_by_the_run_on_another_worker(tmp_path: Path, postgres_url: str) -> None:
    upstream = Upstream()
    async with cluster(tmp_path, postgres_url, upstream) as c:
        cid, watch = await start(c, "go")
        async with asyncio.timeout(60):
            await upstream.looking.wait()  # the worker executing the run is inside `slow`
            sent = await steer(c, cid, "only the errors")
            await watch.until("steer_queued")
        assert await c.executor(sent["run_id"]) in c.workers  # executed by a worker, steered through the API
        upstream.tool.set()
        async with asyncio.timeout(60):
            await watch.task
        whole(watch.seen)
        kinds = [e.event for e in watch.seen]
        assert kinds.index("tool_result") < kinds.index("steer_taken") < kinds.index("content_delta")
        taken = await watch.until("steer_taken")
        assert (taken["steer_id"], taken["message_id"]) == (sent["steer_id"], sent["message_id"])
        assert upstream.requests[1][-1] == {"role": "user", "content": "only the errors"}
        messages = (await c.client.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"]
        assert messages[-1]["content"] == "seen: go | only the errors"


async def test_a_worker_killed_after_taking_a_steer_is_replaced_at_the_same_boundary(
        tmp_path: Path, postgres_url: str) -> None:
    upstream = Upstream(hold_answer=True)
    async with cluster(tmp_path, postgres_url, upstream) as c:
        cid, watch = await start(c, "go")
        async with asyncio.timeout(60):
            await upstream.looking.wait()
            sent = await steer(c, cid, "only the errors")
            await watch.until("steer_queued")
            upstream.tool.set()
            await upstream.answering.wait()  # the steer was taken; the answer to it is in flight
        await kill(await c.executor(sent["run_id"]))
        upstream.answer.set()
        async with asyncio.timeout(60):  # another worker executes the workflow again and ends it
            await watch.task
        whole(watch.seen)
        assert [e.event for e in watch.seen].count("steer_taken") == 1  # taken once, not again on the replay
        end = json.loads(watch.seen[-1].data)
        assert end["finish_reason"] == "end_turn"
        assert len(upstream.requests) == 3  # the question, its answer (lost with the worker), the answer again
        assert [m["content"] for m in upstream.requests[2] if m["role"] == "user"] == ["go", "only the errors"]
        messages = (await c.client.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"]
        assert [m["content"] for m in messages if m["role"] == "user"] == ["go", "only the errors"]
        assert messages[-1]["content"] == "seen: go | only the errors"
        assert (await c.run_record(sent["run_id"]))["status"] == "completed"


async def test_a_queued_message_is_answered_after_the_processes_that_took_it_died(
        tmp_path: Path, postgres_url: str) -> None:
    """Queued (202) while the run works on the only worker, then at once the API process that took it and that
    worker are SIGKILLed: the message was stored before the 202 (a DBOS workflow), so new processes answer it
    once the run they take over has ended, as the run the 202 named."""
    upstream = Upstream()
    async with cluster(tmp_path, postgres_url, upstream, workers=1) as c, AsyncExitStack() as spares:
        cid, _ = await start(c, "go")
        async with asyncio.timeout(60):
            await upstream.looking.wait()  # the run works (inside `slow`)
        queued = await c.client.post(f"/api/v1/chat/conversations/{cid}/messages",
                                     json={"content": "and then?", "mode": "queue"})
        assert queued.status_code == 202, queued.text
        sent = queued.json()
        await asyncio.gather(kill(c.api), kill(c.workers.pop()))
        port = int(str(c.client.base_url).rsplit(":", 1)[1].strip("/"))
        env = {"EFFECTS": str(c.effects), "HOLD_URL": "http://127.0.0.1:9/hold"}  # `slow` fails at once now
        _, worker = await start_all(spares, [
            ringlet(["serve", "--no-worker", "--port", str(port)], c.db, tmp_path / "agents", b"Uvicorn running on",
                    **env),
            ringlet(["worker"], c.db, tmp_path / "agents", b"ready", **env)])
        c.workers.append(worker)

        async def answered() -> bool:
            return (await c.run_record(sent["run_id"])).get("status") == "completed"

        await eventually(answered, seconds=90)  # new processes start and recover: slow on a loaded machine
        messages = (await c.client.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"]
        assert [m["content"] for m in messages if m["role"] == "user"] == ["go", "and then?"]
        assert next(m for m in messages if m["content"] == "and then?")["id"] == sent["message_id"]
        assert messages[-1]["content"] == "seen: go | and then?"
        runs = (await c.client.get("/api/v1/runs", params={"conversation_id": cid})).json()
        assert len(runs["data"]) == 2  # the run it waited for, and the one it started: once
