"""Concurrency limits in process (SQLite, no engine): `max_concurrent_runs` holds here too, and a run waiting
for a slot reports `status: queued` until it executes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx

from helpers import eventually
from ringlet import Agent
from ringlet.server import ServerSettings, create_app
from ringlet.store import Store
from ringlet.testing import FunctionModel
from serving import serving


async def test_a_global_limit_holds_runs_in_process_and_the_waiting_ones_are_queued(store: Store) -> None:
    inflight, most, release = 0, 0, asyncio.Event()

    async def slow(request: Any) -> AsyncIterator[str]:
        nonlocal inflight, most
        inflight += 1
        most = max(most, inflight)
        try:
            await release.wait()
            yield "done"
        finally:
            inflight -= 1

    settings = ServerSettings(auth_mode="none", ping_interval_s=0.2, max_concurrent_runs=1, engine="local")
    app = create_app(settings, store=store, agents=[Agent(FunctionModel(slow), name="slow")])
    async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as client:
        cids = [(await client.post("/api/v1/chat/conversations", json={"agent": "slow"})).json()["id"]
                for _ in range(3)]
        sent = [asyncio.create_task(client.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": "go"},
                                                headers={"Accept": "application/json"})) for cid in cids]
        runner = app.state.ringlet.runner

        async def two_wait() -> bool:
            return inflight == 1 and len(runner.here.queued) == 2

        await eventually(two_wait)
        statuses = [(await client.get(f"/api/v1/runs/{run_id}")).json()["status"] for run_id in runner.here.queued]
        assert statuses == ["queued", "queued"]
        release.set()
        async with asyncio.timeout(30):
            answers = await asyncio.gather(*sent)
    assert [a.json()["status"] for a in answers] == ["completed"] * 3
    assert most == 1  # never two runs at once


def test_a_graph_agent_sets_its_own_limit_in_its_settings(tmp_path: Any) -> None:
    from ringlet.server.catalog import HostedGraph
    from test_graph_support import make_graph

    directory = make_graph(tmp_path, """
        name: limited
        settings: {max_concurrent_runs: 2}
        start: z
        nodes:
          z: {type: end, output: done}
    """, name="limited")
    assert HostedGraph.at(directory).max_concurrent_runs == 2
