"""Drain (issue 55, point 3): a process stopped by SIGTERM turns not-ready, refuses new requests with 503 and
`Retry-After`, and a worker finishes the runs it executes (within `RINGLET_DRAIN_S`) but takes no new ones.
The whole cluster restarted under load is tests/test_rolling_restart.py."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
from httpx_sse import aconnect_sse

from processes import ringlet_process
from ringlet import Agent
from ringlet.server import ServerSettings, create_app
from ringlet.testing import FunctionModel
from serving import serving
from test_durable import Upstream, cluster, ringlet, start, text


async def test_a_draining_api_process_is_not_ready_and_sends_new_requests_elsewhere(tmp_path: Path) -> None:
    settings = ServerSettings(auth_mode="none", db_url=f"sqlite:///{tmp_path / 'ringlet.db'}")
    app = create_app(settings, agents=[Agent(FunctionModel(lambda request: "hi"), name="helper")])
    async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as c:
        assert (await c.get("/readyz")).status_code == 200
        cid = (await c.post("/api/v1/chat/conversations", json={"agent": "helper"})).json()["id"]
        app.state.drain.start(30)  # what SIGTERM does (`serve`, `work`)
        ready = await c.get("/readyz")
        assert (ready.status_code, ready.json()) == (503, {"status": "draining"})
        for probe in ("/livez", "/healthz"):  # alive: not restarted while it drains
            assert (await c.get(probe)).status_code == 200
        sent = await c.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": "hello"})
        assert sent.status_code == 503
        assert sent.headers["retry-after"] == "1"
        assert sent.json()["error"]["code"] == "unavailable"
        assert sent.json()["error"]["request_id"] == sent.headers["x-request-id"]
        events = await c.get(f"/api/v1/chat/conversations/{cid}/events")  # no new stream either
        assert events.status_code == 503
        compat = await c.post("/v1/chat/completions", json={"model": "helper", "messages": []})
        assert compat.status_code == 503
        assert compat.headers["x-should-retry"] == "true"  # official OpenAI clients send it again
        assert compat.json()["error"]["code"] == "unavailable"
        state = app.state.ringlet  # the refused message started nothing and stored nothing
        assert not state.runner.here.active
        assert await state.store.conversations.load_messages(cid) == []


@pytest.mark.slow
async def test_a_draining_worker_finishes_its_run_and_takes_no_new_one(tmp_path: Path, postgres_url: str) -> None:
    upstream = Upstream(lambda messages: text("Par", "tial", " answer"), hold_after=3)
    async with cluster(tmp_path, postgres_url, upstream, workers=0) as c:
        draining = asyncio.Event()

        def heard(line: bytes) -> None:  # said once it takes no more work (`Engine.drain`)
            if b"draining" in line:
                draining.set()

        env = {"RINGLET_AUTH_MODE": "none", "RINGLET_HEARTBEAT_S": "0.2", "RINGLET_WORKER_TIMEOUT_S": "3",
               "RINGLET_DRAIN_S": "60"}
        async with ringlet_process(["worker", "--db", c.db, "--agents", str(tmp_path / "agents")], b"ready", env,
                                   heard=heard) as victim:
            c.workers.append(victim)
            _, first = await start(c, "Say something")
            async with asyncio.timeout(60):  # its model request is in flight, held
                await first.until("content_delta", lambda d: d["delta"] == "tial")
            assert await c.executor(first.run_id) is victim
            victim.send_signal(signal.SIGTERM)
            async with asyncio.timeout(30):
                await draining.wait()
            queued = asyncio.Event()
            second = asyncio.create_task(_send(c.client, "And again", queued))
            async with asyncio.timeout(30):  # stored and queued: the draining worker does not take it
                await queued.wait()
            upstream.release.set()
            async with asyncio.timeout(30):  # the first run ends where it executes, not handed on
                await first.task
                assert await victim.wait() == 0  # and then the worker exits
        kinds = [e.event for e in first.seen]
        assert "retracted" not in kinds
        assert kinds[-1] == "message_end"
        assert json.loads(first.seen[-1].data)["finish_reason"] == "end_turn"
        assert (await c.run_record(first.run_id))["status"] == "completed"
        assert len(upstream.requests) == 1  # nothing was sent again, and the second run has not started
        async with ringlet(["worker"], c.db, tmp_path / "agents", b"ready") as fresh:
            c.workers.append(fresh)
            async with asyncio.timeout(30):  # a live worker takes the queued run
                seen = await second
            run_id = json.loads(seen[0].data)["run_id"]
            assert (await c.run_record(run_id))["status"] == "completed"
            assert len(upstream.requests) == 2  # its one request, sent by the fresh worker


async def _send(client: httpx.AsyncClient, content: str, queued: asyncio.Event) -> list[Any]:
    """A new conversation and a message to it, streamed: `queued` is set once its run is stored and queued
    (the stream's response has started); the run's events until its end."""
    cid = (await client.post("/api/v1/chat/conversations", json={"agent": "worker"})).json()["id"]
    seen = []
    async with aconnect_sse(client, "POST", f"/api/v1/chat/conversations/{cid}/messages",
                            json={"content": content}) as source:
        assert source.response.status_code == 200
        queued.set()
        async for event in source.aiter_sse():
            if event.event != "ping":
                seen.append(event)
            if event.event == "message_end":
                return seen
    return seen
