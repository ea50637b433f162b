"""A run lost between its record and its workflow (issue 50): on the engine a run is stored (`working`), then
its workflow is enqueued. A process killed between the two used to leave a stored run that no workflow
executes, and recovery closed it `failed` (`interrupted`). Now its workflow's input is stored with it, and
recovery enqueues it under the run's id (`Engine.requeue`): it completes on another process.

Each entry point's process is killed at that exact moment by the test hook `RINGLET_TEST_CRASH_AT=after_record`
(`ringlet.server.runs.crash`): the API process for native messages, `/v1` (with a conversation, and without
one), AG-UI and A2A; for webhook fires and agents' schedules, whichever process executes the fire. Then new
processes (an API process, a worker) are started: the run completes, and its conversation holds its answer."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import asyncpg
import httpx
import pytest

from helpers import eventually
from processes import start_all
from test_durable import Cluster, Upstream, alarming, cluster, kill, ringlet

pytestmark = pytest.mark.slow
CRASH = {"RINGLET_TEST_CRASH_AT": "after_record"}
ENTRIES = ["messages", "v1", "v1_stateless", "agui", "a2a", "webhook", "schedule"]


script = alarming(6)
"""The model: asked for an alarm, it sets one a few seconds ahead (then says so); else it answers `done`."""


async def rows(c: Cluster, sql: str, *args: Any) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(c.db.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        return await conn.fetch(sql, *args)
    finally:
        await conn.close()


async def send(c: Cluster, entry: str) -> None:
    """What a client sends to `entry`; the request dies with its API process, or (a fire) is answered first."""
    if entry == "messages":
        cid = (await c.client.post("/api/v1/chat/conversations", json={"agent": "worker"})).json()["id"]
        await c.client.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": "hello"})
    elif entry in ("v1", "v1_stateless"):
        headers = {}
        if entry == "v1":
            cid = (await c.client.post("/api/v1/chat/conversations", json={"agent": "worker"})).json()["id"]
            headers["X-Ringlet-Conversation-Id"] = cid
        await c.client.post("/v1/chat/completions", headers=headers, json={
            "model": "worker", "messages": [{"role": "user", "content": "hello"}]})
    elif entry == "agui":
        await c.client.post("/ag-ui/worker", json={"threadId": "thread-1", "runId": "client-run", "tools": [],
                                                   "context": [], "messages": [{"id": "u0", "role": "user",
                                                                                "content": "hello"}]})
    elif entry == "a2a":
        await c.client.post("/a2a/worker", headers={"A2A-Version": "1.0"}, json={
            "jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {
                "messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hello"}]}}})
    elif entry == "webhook":
        trigger = await c.client.post("/api/v1/triggers", json={"name": "hook", "agent": "worker", "kind": "webhook"})
        fired = await c.client.post(f"/api/v1/triggers/{trigger.json()['id']}/fire", json={"n": 1})
        assert fired.status_code == 202, fired.text  # accepted: the fire is stored before its answer


async def processes(c: Cluster, tmp_path: Path, stack: AsyncExitStack, **env: str) -> None:
    """A new API process (on the cluster's port) and a new worker, with `env`."""
    port = str(c.client.base_url).rsplit(":", 1)[1].strip("/")
    env = {"EFFECTS": str(c.effects), "HOLD_URL": "http://127.0.0.1:9/hold", **env}
    c.api, worker = await start_all(stack, [
        ringlet(["serve", "--no-worker", "--port", port], c.db, tmp_path / "agents", b"Uvicorn running on", **env),
        ringlet(["worker"], c.db, tmp_path / "agents", b"ready", **env)])
    c.workers.append(worker)


async def set_alarm(c: Cluster, tmp_path: Path, stack: AsyncExitStack) -> str:
    """A conversation whose agent set an alarm a few seconds ahead (its run completed), on processes that are
    then killed; the crashing ones take over (the alarm fires on them)."""
    cid = (await c.client.post("/api/v1/chat/conversations", json={"agent": "worker"})).json()["id"]
    answer = await c.client.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": "set an alarm"},
                                 headers={"Accept": "application/json"})
    assert answer.status_code == 200, answer.text
    assert (await rows(c, "SELECT count(*) AS n FROM schedules WHERE conversation_id = $1", cid))[0]["n"] == 1
    await asyncio.gather(kill(c.api), *[kill(w) for w in c.workers])  # before the alarm is due
    c.workers.clear()
    await processes(c, tmp_path, stack, **CRASH)
    return cid


@pytest.mark.parametrize("entry", ENTRIES)
async def test_a_run_stored_just_before_its_process_dies_completes_elsewhere(tmp_path: Path, postgres_url: str,
                                                                             entry: str) -> None:
    upstream = Upstream(script)
    crashing = {} if entry == "schedule" else CRASH
    # A request's run is stored by the API process, which dies before it enqueues it: no worker takes part
    # until the new processes start (one started here would only be killed unused). A fire's run is stored by
    # whichever process executes the fire, and a schedule needs a worker to run the run that sets its alarm.
    workers = 1 if entry in ("webhook", "schedule") else 0
    async with cluster(tmp_path, postgres_url, upstream, workers=workers, RINGLET_MISFIRE_GRACE_S="3600",
                       **crashing) as c, AsyncExitStack() as stack:
        alarmed = await set_alarm(c, tmp_path, stack) if entry == "schedule" else None
        armed = [c.api, *c.workers]
        try:
            await send(c, entry)
        except httpx.TransportError:  # its API process died
            assert entry not in ("webhook", "schedule")
        async with asyncio.timeout(60):  # the process that stored the run kills itself before enqueueing it
            await asyncio.wait([asyncio.ensure_future(p.wait()) for p in armed], return_when="FIRST_COMPLETED")
        assert [p.returncode for p in armed if p.returncode is not None] == [-9]  # killed by the hook
        await asyncio.gather(*[kill(p) for p in armed if p.returncode is None])  # (its recovery may have found
        c.workers.clear()  # the run already; it is not left to do it)
        run_id, cid = (await rows(c, "SELECT id, conversation_id FROM runs ORDER BY started_at DESC LIMIT 1"))[0]
        await processes(c, tmp_path, stack)

        async def ended() -> bool:
            return (await rows(c, "SELECT status FROM runs WHERE id = $1", run_id))[0]["status"] != "working"

        await eventually(ended, seconds=90)  # new processes start and recover the run: slow on a loaded machine
        record = (await rows(c, "SELECT status, finish_reason FROM runs WHERE id = $1", run_id))[0]
        assert (record["status"], record["finish_reason"]) == ("completed", "end_turn"), record
        if alarmed is not None:
            assert cid == alarmed
        async def workflow() -> list[str]:
            return [w["status"] for w in await rows(
                c, "SELECT status FROM dbos.workflow_status WHERE workflow_uuid = $1", run_id)]

        async def settled() -> bool:  # DBOS records the workflow's end just after the run's record ends
            return await workflow() != ["PENDING"]

        await eventually(settled, seconds=30)
        assert await workflow() == ["SUCCESS"]  # enqueued by recovery, under the run's id
        transcript = await c.client.get(f"/api/v1/chat/conversations/{cid}")
        if entry == "v1_stateless":  # its hidden conversation: nobody can read it (its client left with the
            assert transcript.status_code == 404  # process), and the sweep removes it
            return
        messages = transcript.json()["messages"]
        assert (messages[-1]["role"], messages[-1]["content"]) == ("assistant", "done")
        events = (await rows(c, "SELECT type FROM events WHERE run_id = $1 ORDER BY id", run_id))
        assert [e["type"] for e in events].count("message_start") == 1
        assert "error" not in [e["type"] for e in events]


async def test_recovery_queues_a_stored_run_from_its_record_and_closes_one_without_input(postgres_url: str) -> None:
    """Two runs a dead process stored and never enqueued: the one whose record holds its workflow's input
    (as every run `Starter.start` stores on the engine) is enqueued by recovery and completes; one without
    (stored by an older ringlet) is closed `interrupted`, as before."""
    from ringlet import Agent
    from ringlet.messages import Message
    from ringlet.server.durable.executor import kept
    from ringlet.server.durable.reconcile import HOST
    from ringlet.server.runs.spec import spec_of
    from ringlet.testing import FunctionModel
    from test_durable_children import one_process

    exited = await asyncio.create_subprocess_exec("true")
    await exited.wait()
    dead = f"proc_dead@{HOST}:{exited.pid}"  # a process of this machine that has exited
    async with one_process(postgres_url, [Agent(FunctionModel(lambda request: "done"), name="helper")]) as (app, c):
        runner = app.state.ringlet.runner
        principal = SimpleNamespace(key_id="k", user_id="u", org_id="default", roles=(), realms=None)
        runs = {}
        for name, keep in (("queued", True), ("closed", False)):
            cid = (await c.client.post("/api/v1/chat/conversations", json={"agent": "helper"})).json()["id"]
            conversation, incoming = await runner.store.conversations.get(cid), [Message.user(f"hi {name}")]
            runs[name] = run_id = f"r_{name}"
            spec = spec_of(SimpleNamespace(run_id=run_id, conversation_id=cid, agent="helper"), conversation.realm,
                           incoming, principal=principal, channel="chat", overrides=None, request_id=None, deny=False)
            await runner.store.runs.create(run_id, agent="helper", conversation_id=cid, lease_owner=dead,
                                           lease_expires_at="9999", incoming=incoming, realm=conversation.realm,
                                           key_id="k", state=kept(spec, incoming) if keep else None)
        assert await runner.recovery.recover() == 1  # the one without input closed; the other queued

        async def ended() -> bool:
            return (await runner.store.runs.get(runs["queued"])).status != "working"

        await eventually(ended)
        queued, closed = [await runner.store.runs.get(runs[name]) for name in ("queued", "closed")]
        assert (queued.status, queued.finish_reason) == ("completed", "end_turn")
        assert (closed.status, closed.finish_reason) == ("failed", "error")
        transcript = await runner.store.conversations.load_messages(queued.conversation_id)
        assert [(m.role, m.text) for m in transcript] == [("user", "hi queued"), ("assistant", "done")]
