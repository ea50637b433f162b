"""An idle SQLite server launches no DBOS (its threads would be most of its idle CPU): firing launches it for
the first trigger, schedule or fire (`Firing.open`, `Firing.up`), and at startup for one left from before."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx

from ringlet import Agent
from ringlet.server import ServerSettings, create_app
from ringlet.server.catalog import Catalog
from ringlet.server.durable.dbos import Dbos
from ringlet.server.firing.fires import Firing
from ringlet.server.firing.schedules import wake_id, woken
from ringlet.server.runs.runner import Runner
from ringlet.store import Store
from ringlet.testing import FunctionModel
from serving import serving


def _dbos_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if "dbos" in t.name.lower() or "queue" in t.name.lower()]


async def test_dbos_launches_for_the_first_trigger_and_fires(tmp_path: Path) -> None:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'ringlet.db'}")
    app = create_app(ServerSettings(), store=store, agents=[Agent(FunctionModel(lambda r: "pong"), name="echo")])
    try:
        async with serving(app) as url:
            firing: Firing = app.state.ringlet.firing
            assert Dbos.url is None, "nothing fires yet: no DBOS"
            assert not firing.launched
            assert not _dbos_threads()
            admin, _ = await store.keys.create("admin", scopes=["admin", "chat", "trigger"])
            async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {admin}"}) as client:
                made = await client.post("/api/v1/triggers", json={"name": "hook", "agent": "echo",
                                                                   "kind": "webhook"})
                assert made.status_code == 201, made.text
                assert firing.launched
                assert Dbos.url is not None
                fired = await client.post(f"/api/v1/triggers/{made.json()['id']}/fire", json={"id": 1})
                assert fired.status_code == 202, fired.text
                cid = fired.json()["conversation_id"]
                async with client.stream("GET", f"/api/v1/chat/conversations/{cid}/events",
                                         headers={"Last-Event-ID": "0"}) as events:
                    async for line in events.aiter_lines():
                        if line == "event: message_end":
                            break
                messages = (await client.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"]
                assert messages[-1]["content"] == "pong"
    finally:
        await store.close()


async def test_a_fire_pending_from_before_a_restart_launches_dbos_at_startup(tmp_path: Path) -> None:
    """A wake-up left delayed in DBOS's file (its schedule gone) has the next process launch DBOS at once;
    once none is pending, the next one does not."""
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'ringlet.db'}")
    runner = Runner(store, Catalog.of([]), ServerSettings())
    try:
        first = Firing(runner.runs, store)
        await first.open()
        assert not first.launched
        await first.up()
        await first.enqueue(wake_id("s_gone", 0), woken, "s_gone", 0, at=time.time() + 3600)
        await first.close()
        assert Dbos.url is None

        second = Firing(runner.runs, store)
        await second.open()
        assert second.launched, "a fire waits in DBOS's file: DBOS is launched at startup"
        await second.cancel(wake_id("s_gone", 0))
        await second.close()

        third = Firing(runner.runs, store)
        await third.open()
        assert not third.launched, "nothing pending, no trigger, no schedule: no DBOS"
        assert Dbos.url is None
        await third.close()
    finally:
        await runner.close()
        await store.close()


async def test_a_message_with_a_mode_and_no_run_working_launches_no_dbos(tmp_path: Path) -> None:
    """`mode` steers or queues only while a run works (a DBOS workflow then waits for its end); with none
    working, the message starts its run as usual and DBOS stays down."""
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'ringlet.db'}")
    app = create_app(ServerSettings(), store=store, agents=[Agent(FunctionModel(lambda r: "pong"), name="echo")])
    try:
        async with serving(app) as url:
            firing: Firing = app.state.ringlet.firing
            key, _ = await store.keys.create("ana", scopes=["chat"])
            async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}) as client:
                cid = (await client.post("/api/v1/chat/conversations", json={"agent": "echo"})).json()["id"]
                for mode in ("queue", "steer"):
                    sent = await client.post(f"/api/v1/chat/conversations/{cid}/messages",
                                             json={"content": "hi", "mode": mode},
                                             headers={"Accept": "application/json"})
                    assert sent.status_code == 200, sent.text
                    assert sent.json()["message"]["content"] == "pong"
            assert not firing.launched
            assert Dbos.url is None
    finally:
        await store.close()
