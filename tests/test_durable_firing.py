"""Triggers on the engine (issue 19): several real `ringlet` processes on one PostgreSQL database fire cron
triggers through DBOS schedules and webhook fires through DBOS workflows. Workers are SIGKILLed and restarted
around the fires; each cron slot still fires once (a run per slot, counted in the database), and a webhook
fire answered 202 just before the processes executing it die still runs, once."""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from contextlib import AsyncExitStack
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from helpers import eventually
from processes import start_all
from test_durable import Cluster, Upstream, alarming, cluster, kill, ringlet, text

pytestmark = pytest.mark.slow
PERIOD_S = 2
SLOT = re.compile(r'\\"scheduled_for\\": \\"([^\\"]+)\\"')


class Db:
    """Reads of the cluster's database (ringlet's tables and DBOS's)."""

    def __init__(self, c: Cluster) -> None:
        self.dsn = c.db.replace("postgresql+asyncpg://", "postgresql://")

    async def rows(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        conn = await asyncpg.connect(self.dsn)
        try:
            return await conn.fetch(sql, *args)
        finally:
            await conn.close()

    async def fires(self, title: str) -> list[dict[str, Any]]:
        """Each conversation a trigger's fires made: its slot (the `scheduled_for` of its message), its runs'
        statuses, its transcript's roles."""
        found = []
        for c in await self.rows("SELECT id FROM conversations WHERE title = $1", title):
            messages = await self.rows("SELECT role, body::text AS body FROM messages WHERE conversation_id = $1 "
                                       "ORDER BY seq", c["id"])
            slot = SLOT.search(messages[0]["body"]) if messages else None
            runs = await self.rows("SELECT status FROM runs WHERE conversation_id = $1", c["id"])
            found.append({"slot": slot.group(1) if slot else None, "runs": [r["status"] for r in runs],
                          "roles": [m["role"] for m in messages]})
        return found

    async def pending(self, workflow: str) -> int:
        """Workflows of that name not finished (waiting in the queue, or executing somewhere)."""
        rows = await self.rows("SELECT count(*) AS n FROM dbos.workflow_status WHERE name = $1 AND status IN "
                               "('PENDING', 'ENQUEUED', 'DELAYED')", workflow)
        return rows[0]["n"]

    async def working(self) -> int:
        return (await self.rows("SELECT count(*) AS n FROM runs WHERE status = 'working'"))[0]["n"]

    async def executor_of_newest(self) -> int | None:
        """The pid of the process executing the newest cron fire, else holding the newest run's lease."""
        for sql in ("SELECT executor_id AS who FROM dbos.workflow_status WHERE name = 'ringlet.cron' AND "
                    "status = 'PENDING' ORDER BY created_at DESC LIMIT 1",
                    "SELECT lease_owner AS who FROM runs WHERE status = 'working' ORDER BY started_at DESC LIMIT 1"):
            rows = await self.rows(sql)
            if rows and rows[0]["who"] and ":" in rows[0]["who"]:
                return int(rows[0]["who"].rsplit(":", 1)[1])
        return None


async def respawn(c: Cluster, tmp_path: Path, stack: AsyncExitStack) -> None:
    """One more `ringlet worker` in the cluster."""
    env = {"EFFECTS": str(c.effects), "HOLD_URL": "http://127.0.0.1:9/hold"}
    c.workers.append(await stack.enter_async_context(ringlet(["worker"], c.db, tmp_path / "agents", b"ready", **env)))


def skipped(tmp_path: Path, name: str) -> set[str]:
    """The slots the processes' logs say were skipped (their previous fire still running)."""
    pattern = re.compile(rf"cron trigger {name}: skipped the fire due at (\S+)")
    return {m.group(1) for log in tmp_path.glob("*.log") for m in pattern.finditer(log.read_text())}


async def test_a_cron_trigger_fires_once_per_slot_while_workers_die(tmp_path: Path, postgres_url: str) -> None:
    """Every process schedules the trigger's slots; workers are SIGKILLed while they execute a fire or its run,
    and replaced: each slot runs once, every run completes, no slot between the first and the last is lost."""
    upstream = Upstream(lambda messages: text("tick", " done"))
    async with cluster(tmp_path, postgres_url, upstream, workers=3) as c, AsyncExitStack() as spares:
        db = Db(c)
        made = await c.client.post("/api/v1/triggers", json={"name": "tick", "agent": "worker", "kind": "cron",
                                                             "cron": f"*/{PERIOD_S} * * * * *"})
        assert made.status_code == 201, made.text
        seen = 0
        for round_ in range(5):  # a new slot fires: kill the worker executing it (or a run), then replace it
            async def fired(after: int = seen) -> bool:
                return len(await db.fires("tick (cron)")) > after

            await eventually(fired)
            seen = len(await db.fires("tick (cron)"))
            pid = await db.executor_of_newest()
            victim = next((w for w in c.workers if w.pid == pid), c.workers[round_ % len(c.workers)])
            c.workers.remove(victim)
            await kill(victim)
            await respawn(c, tmp_path, spares)
        off = await c.client.patch(f"/api/v1/triggers/{made.json()['id']}", json={"enabled": False})
        assert off.status_code == 200

        async def settled() -> bool:
            fires = await db.fires("tick (cron)")
            return await db.pending("ringlet.cron") == 0 and await db.working() == 0 and \
                all(f["roles"] == ["user", "assistant"] for f in fires)

        await eventually(settled, seconds=180)  # runs of killed workers wait out their leases, slower under load
        fires = await db.fires("tick (cron)")
        counted = Counter(f["slot"] for f in fires)
        assert all(n == 1 for n in counted.values()), counted  # each slot ran once
        assert all(f["runs"] == ["completed"] for f in fires), fires  # one run per fire, completed
        assert len(fires) >= 5
        lost = skipped(tmp_path, "tick")
        assert not lost & set(counted)  # a slot runs or is skipped, not both
        ran, passed = ({round(datetime.fromisoformat(s).timestamp()) for s in slots} for slots in (counted, lost))
        missing = set(range(min(ran), max(ran) + 1, PERIOD_S)) - ran - passed
        assert not missing, (sorted(ran), sorted(passed))  # a slot that did not run was skipped (and logged)


async def test_a_webhook_fire_accepted_just_before_a_sigkill_runs_once(tmp_path: Path, postgres_url: str) -> None:
    """Fires answered 202, then at once the API process that accepted them and the only worker are SIGKILLed:
    the fires were stored before the 202, so new processes run each once."""
    upstream = Upstream(lambda messages: text("got", " it"))
    async with cluster(tmp_path, postgres_url, upstream, workers=1) as c, AsyncExitStack() as spares:
        db = Db(c)
        trigger = await c.client.post("/api/v1/triggers", json={"name": "hook", "agent": "worker",
                                                                "kind": "webhook"})
        assert trigger.status_code == 201, trigger.text
        answers = [await c.client.post(f"/api/v1/triggers/{trigger.json()['id']}/fire", json={"n": n})
                   for n in range(3)]
        assert [a.status_code for a in answers] == [202, 202, 202]
        await asyncio.gather(kill(c.api), kill(c.workers.pop()))
        port = int(str(c.client.base_url).rsplit(":", 1)[1].strip("/"))
        env = {"EFFECTS": str(c.effects), "HOLD_URL": "http://127.0.0.1:9/hold"}
        _, worker = await start_all(spares, [
            ringlet(["serve", "--no-worker", "--port", str(port)], c.db, tmp_path / "agents", b"Uvicorn running on",
                    **env),
            ringlet(["worker"], c.db, tmp_path / "agents", b"ready", **env)])
        c.workers.append(worker)

        async def all_ran() -> bool:
            records = [await c.run_record(a.json()["run_id"]) for a in answers]
            return all(r.get("status") == "completed" for r in records)

        await eventually(all_ran, seconds=90)  # new processes start and recover the runs: slow on a loaded machine
        for answer in answers:
            cid = answer.json()["conversation_id"]
            messages = (await c.client.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"]
            assert [(m["role"], m["content"]) for m in messages][1:] == [("assistant", "got it")]
            assert messages[0]["metadata"]["source"] == "webhook"
            runs = await db.rows("SELECT id FROM runs WHERE conversation_id = $1", cid)
            assert [r["id"] for r in runs] == [answer.json()["run_id"]]  # one run, the one the 202 named
        assert await db.pending("ringlet.webhook") == 0


async def test_a_fire_starts_when_it_is_enqueued_not_at_its_queues_poll(tmp_path: Path, postgres_url: str) -> None:
    """The fires queue is polled once an hour here, yet a webhook fire (enqueued by its request) and an alarm's
    wake-up (enqueued delayed, made due by DBOS's background job) start their runs at once: DBOS's table
    announces every fire that becomes due (`dbos.WAKE_FIRES`), and every process takes it."""
    upstream = Upstream(alarming(2))  # an alarm two seconds ahead
    async with cluster(tmp_path, postgres_url, upstream, workers=1, RINGLET_FIRE_POLL_S="3600",
                       RINGLET_MISFIRE_GRACE_S="3600") as c:
        db = Db(c)
        assert (await db.rows("SELECT polling_interval_sec FROM dbos.queues WHERE name = 'ringlet-fires'"))[0][0] \
            == 3600
        trigger = await c.client.post("/api/v1/triggers", json={"name": "hook", "agent": "worker", "kind": "webhook"})
        fired = await c.client.post(f"/api/v1/triggers/{trigger.json()['id']}/fire", json={"n": 1})
        assert fired.status_code == 202, fired.text

        async def ran() -> bool:
            return (await c.run_record(fired.json()["run_id"])).get("status") == "completed"

        await eventually(ran, seconds=30)
        cid = (await c.client.post("/api/v1/chat/conversations", json={"agent": "worker"})).json()["id"]
        answer = await c.client.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": "set an alarm"},
                                     headers={"Accept": "application/json"})
        assert answer.status_code == 200, answer.text

        async def woke() -> bool:
            runs = await db.rows("SELECT status FROM runs WHERE conversation_id = $1", cid)
            return len(runs) == 2 and all(r["status"] == "completed" for r in runs)

        await eventually(woke, seconds=30)
