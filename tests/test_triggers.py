"""Triggers (server-contract.md §6): webhooks by key or HMAC signature, templates, cron with misfire grace."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import re
import time
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import pytest
from dbos import DBOS

from helpers import eventually, heard
from ringlet import Agent
from ringlet._ids import at
from ringlet.messages import Message
from ringlet.server import ServerSettings, create_app
from ringlet.server.firing.triggers import next_fire, render, schedule_name
from ringlet.server.http.auth import LOCAL
from ringlet.store import Store
from ringlet.testing import FunctionModel
from ringlet.tools.builtin.schedule_timing import parse_time
from serving import serving

SECRET = "s3cret-s3cret-s3cret"


def echo(request: Any) -> str:
    return "got: " + request.messages[-1].text[:40]


@pytest.fixture
async def served(store: Store) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
    app = create_app(ServerSettings(), store=store, agents=[Agent(FunctionModel(echo), name="echo")])
    async with serving(app) as url:
        admin, _ = await store.keys.create("admin", scopes=["admin", "chat", "trigger"])
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {admin}"}) as client:
            yield client, app


async def _messages_of(client: httpx.AsyncClient, cid: str) -> list[dict[str, Any]]:
    async with client.stream("GET", f"/api/v1/chat/conversations/{cid}/events",
                             headers={"Last-Event-ID": "0"}) as events:
        async for line in events.aiter_lines():
            if line == "event: message_end":
                break
    return (await client.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"]


def test_templates_fence_the_payload_as_untrusted() -> None:
    trigger = "deploy"
    text = render(None, trigger, {"a": {"b": "x"}})
    assert text.startswith("Trigger deploy fired with payload:\n<untrusted-data")
    assert '"b": "x"' in text
    custom = render("Deploy of {{payload.a.b}} by {{trigger.name}}", trigger, {"a": {"b": "v1.2"}})
    assert "v1.2" in custom
    assert custom.endswith("by deploy")
    assert "<untrusted-data" in custom


async def test_webhook_fires_with_a_key_or_a_signature(served: tuple[httpx.AsyncClient, Any], store: Store) -> None:
    client, _ = served
    made = await client.post("/api/v1/triggers", json={"name": "hook", "agent": "echo", "kind": "webhook",
                                                       "secret": SECRET, "message_template": "Build {{payload.id}}"})
    assert made.status_code == 201, made.text
    trigger = made.json()
    assert trigger["has_secret"] is True
    assert "secret" not in trigger
    fired = await client.post(f"/api/v1/triggers/{trigger['id']}/fire", json={"id": 7})
    assert fired.status_code == 202
    messages = await _messages_of(client, fired.json()["conversation_id"])
    assert "Build" in messages[0]["content"]
    assert messages[0]["metadata"]["source"] == "webhook"
    assert messages[-1]["content"].startswith("got: Build")
    body = json.dumps({"id": 8}).encode()
    stamp = str(int(time.time()))
    signature = "sha256=" + hmac.new(SECRET.encode(), f"{stamp}.".encode() + body, hashlib.sha256).hexdigest()
    async with httpx.AsyncClient(base_url=str(client.base_url)) as anonymous:
        url = f"/api/v1/triggers/{trigger['id']}/fire"
        ok = await anonymous.post(url, content=body, headers={"X-Ringlet-Signature": signature,
                                                              "X-Ringlet-Timestamp": stamp})
        assert ok.status_code == 202
        bad = await anonymous.post(url, content=body, headers={"X-Ringlet-Signature": "sha256=00",
                                                               "X-Ringlet-Timestamp": stamp})
        assert bad.status_code == 401
        stale = await anonymous.post(url, content=body, headers={"X-Ringlet-Signature": signature,
                                                                 "X-Ringlet-Timestamp": str(int(time.time()) - 900)})
        assert stale.status_code == 401
        assert (await anonymous.post(url, json={})).status_code == 401
    chat_only, _ = await store.keys.create("c", scopes=["chat"])
    no_scope = await client.post(f"/api/v1/triggers/{trigger['id']}/fire", json={},
                                 headers={"Authorization": f"Bearer {chat_only}"})
    assert no_scope.status_code == 403
    assert (await client.post("/api/v1/triggers/tr_nope/fire", json={})).status_code == 404
    await client.patch(f"/api/v1/triggers/{trigger['id']}", json={"enabled": False})
    assert (await client.post(f"/api/v1/triggers/{trigger['id']}/fire", json={})).status_code == 404


async def test_idempotent_fire(served: tuple[httpx.AsyncClient, Any]) -> None:
    client, _ = served
    trigger = (await client.post("/api/v1/triggers", json={"name": "h", "agent": "echo", "kind": "webhook"})).json()
    url, headers = f"/api/v1/triggers/{trigger['id']}/fire", {"Idempotency-Key": "evt-1"}
    first = await client.post(url, json={"n": 1}, headers=headers)
    again = await client.post(url, json={"n": 1}, headers=headers)
    assert again.json() == first.json()
    assert (await client.post(url, json={"n": 2}, headers=headers)).status_code == 409


async def test_trigger_validation_and_management(served: tuple[httpx.AsyncClient, Any]) -> None:
    client, _ = served
    bad_cron = await client.post("/api/v1/triggers", json={"name": "c", "agent": "echo", "kind": "cron",
                                                           "cron": "every day"})
    assert bad_cron.status_code == 422
    assert "5-field" in bad_cron.json()["error"]["message"]
    bad_zone = await client.post("/api/v1/triggers", json={"name": "c", "agent": "echo", "kind": "cron",
                                                           "cron": "0 9 * * *", "timezone": "Mars/Olympus"})
    assert bad_zone.status_code == 422
    made = (await client.post("/api/v1/triggers", json={"name": "c", "agent": "echo", "kind": "cron",
                                                        "cron": "0 9 * * *", "timezone": "Europe/Paris"})).json()
    assert made["next_fire_at"].endswith("Z")
    assert [t["id"] for t in (await client.get("/api/v1/triggers")).json()["data"]] == [made["id"]]
    held = await DBOS.get_schedule_async(schedule_name(made["id"]))  # its DBOS schedule, seconds first
    assert held is not None
    assert (held["schedule"], held["cron_timezone"]) == ("0 0 9 * * *", "Europe/Paris")
    moved = await client.patch(f"/api/v1/triggers/{made['id']}", json={"cron": "30 8 * * 1-5"})
    assert moved.status_code == 200
    assert (await DBOS.get_schedule_async(schedule_name(made["id"])) or {}).get("schedule") == "0 30 8 * * 1-5"
    assert (await client.delete(f"/api/v1/triggers/{made['id']}")).status_code == 204
    assert (await client.get(f"/api/v1/triggers/{made['id']}")).status_code == 404
    assert await DBOS.get_schedule_async(schedule_name(made["id"])) is None
    seconds = await client.post("/api/v1/triggers", json={"name": "s", "agent": "echo", "kind": "cron",
                                                          "cron": "*/5 * * * * *"})  # 6 fields: seconds first
    assert seconds.status_code == 201
    assert (await client.post("/api/v1/triggers", json={"name": "s", "agent": "echo", "kind": "cron",
                                                        "cron": "* * * * * * *"})).status_code == 422
    assert (await client.delete(f"/api/v1/triggers/{seconds.json()['id']}")).status_code == 204


def test_next_fire_reads_the_timezone() -> None:
    noon_utc = 1767268800.0  # 2026-01-01T12:00:00Z
    assert next_fire("0 9 * * *", "UTC", noon_utc) == "2026-01-02T09:00:00.000Z"
    assert next_fire("0 9 * * *", "Europe/Paris", noon_utc) == "2026-01-02T08:00:00.000Z"


async def _fired(store: Store, agent: str) -> list[dict[str, Any]]:
    """The conversations the trigger's fires made, each with `slot` (the fire's `scheduled_for`) and
    `done` (its run ended)."""
    fires = []
    for c in await store.conversations.list(agent=agent, limit=1000):
        messages = await store.conversations.load_messages(c.id)
        slot = re.search(r'"scheduled_for": "([^"]+)"', messages[0].text) if messages else None
        fires.append({"slot": slot and slot.group(1), "done": c.status == "idle" and len(messages) == 2})
    return fires


@pytest.mark.slow
async def test_a_cron_trigger_fires_once_per_slot_and_one_fire_at_a_time(store: Store) -> None:
    """A 6-field (seconds) cron trigger on DBOS: each slot fires once; while a fire's run works the slots
    that come due are skipped and logged, not queued; disabled, its DBOS schedule goes."""
    entered, release, running, most = asyncio.Event(), asyncio.Event(), [0], [0]

    async def hold(request: Any) -> str:
        running[0] += 1
        most[0] = max(most[0], running[0])
        try:
            if not entered.is_set():
                entered.set()
                await release.wait()
            return "ok"
        finally:
            running[0] -= 1

    app = create_app(ServerSettings(), store=store, agents=[Agent(FunctionModel(hold), name="tick")])
    with heard("its previous fire is still running") as skips:  # logged as each slot is skipped
        async with serving(app) as url:
            admin, _ = await store.keys.create("admin", scopes=["admin"])
            async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {admin}"}) as client:
                made = await client.post("/api/v1/triggers", json={"name": "tick", "agent": "tick", "kind": "cron",
                                                                   "cron": "* * * * * *"})
                assert made.status_code == 201, made.text
                trigger = made.json()
                async with asyncio.timeout(30):
                    await entered.wait()

                async with asyncio.timeout(60):  # two slots came due meanwhile, each skipped and logged
                    await skips.until(2)
                released = time.time()
                release.set()

                async def three_done() -> bool:
                    return sum(f["done"] for f in await _fired(store, "tick")) >= 3

                await eventually(three_done)
                disabled = await client.patch(f"/api/v1/triggers/{trigger['id']}", json={"enabled": False})
                assert disabled.status_code == 200
                assert await DBOS.get_schedule_async(schedule_name(trigger["id"])) is None
                assert (await client.delete(f"/api/v1/triggers/{trigger['id']}")).status_code == 204
    fires = await _fired(store, "tick")
    slots = [f["slot"] for f in fires]
    assert len(set(slots)) == len(slots)  # each slot once
    assert most[0] == 1  # one fire of the trigger at a time
    _, *later = sorted(slots)
    assert all(parse_time(slot) >= released - 1 for slot in later)  # the skipped slots were not queued


async def test_a_missed_slot_fires_once_at_startup_within_the_grace(store: Store) -> None:
    """Cron slots that came due while no server ran: the latest fires once at startup when it is no more
    than `misfire_grace_s` late; one later than that is skipped (and logged); a restart fires nothing again."""
    zone = ZoneInfo("Europe/Paris")
    recent = datetime.fromtimestamp(time.time() - 90, zone)  # daily crons whose last slot just passed / is old
    old = datetime.fromtimestamp(time.time() - 2 * 3600, zone)
    crons = {"recent": f"{recent.minute} {recent.hour} * * *", "old": f"{old.minute} {old.hour} * * *"}

    def app() -> Any:
        return create_app(ServerSettings(), store=store, agents=[Agent(FunctionModel(echo), name="echo")])

    async with serving(app()) as url:
        admin, _ = await store.keys.create("admin", scopes=["admin", "chat"])
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {admin}"}) as client:
            made = {name: (await client.post("/api/v1/triggers", json={
                "name": name, "agent": "echo", "kind": "cron", "cron": cron, "timezone": "Europe/Paris"})).json()
                for name, cron in crons.items()}
    for trigger in made.values():  # as if no server ran since three hours ago
        await store.triggers.update(trigger["id"], {"next_fire_at": at(time.time() - 3 * 3600)})
    async with serving(app()) as url:
        async def fired() -> bool:
            return [f["done"] for f in await _fired(store, "echo")] == [True]

        await eventually(fired)
    [conversation] = await store.conversations.list(agent="echo")
    assert conversation.title == "recent (cron)"
    [first, _] = await store.conversations.load_messages(conversation.id)
    assert first.metadata["source"] == "cron"
    recent_slot = recent.replace(second=0, microsecond=0).timestamp()
    assert f'"scheduled_for": "{at(recent_slot)}"' in first.text
    fresh, stale = [await store.triggers.get(t["id"]) for t in made.values()]
    assert fresh is not None
    assert stale is not None
    assert fresh.last_fired_at is not None
    assert stale.last_fired_at is None  # skipped: over the grace
    assert parse_time(fresh.next_fire_at) > time.time()
    assert parse_time(stale.next_fire_at) > time.time()
    async with serving(app()) as url, httpx.AsyncClient(base_url=url) as client:  # started again: the slot
        assert (await client.get("/readyz")).status_code == 200  # has fired, nothing fires again
        workflows = await DBOS.list_workflows_async(name="ringlet.cron")
        assert [w.workflow_id for w in workflows if made["recent"]["id"] in w.workflow_id] == [
            f"sched-{schedule_name(made['recent']['id'])}-{datetime.fromtimestamp(recent_slot, zone).isoformat()}"]
    assert len(await store.conversations.list(agent="echo")) == 1


async def test_a_webhook_fire_waits_for_its_conversations_turn(store: Store) -> None:
    """A fire accepted (202) while its conversation's run works starts its run once that run has ended."""
    entered, release = asyncio.Event(), asyncio.Event()

    async def answer(request: Any) -> str:
        if request.messages[-1].text == "hold":
            entered.set()
            await release.wait()
            return "held"
        return echo(request)

    app = create_app(ServerSettings(), store=store, agents=[Agent(FunctionModel(answer), name="echo")])
    async with serving(app) as url:
        admin, _ = await store.keys.create("admin", scopes=["admin", "trigger"])
        conversation = await store.conversations.create(agent="echo")
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {admin}"}) as client:
            assert (await client.get("/readyz")).status_code == 200
            holding = await app.state.ringlet.runs.start(conversation, Message.user("hold"), principal=LOCAL)
            await entered.wait()
            trigger = (await client.post("/api/v1/triggers", json={
                "name": "h", "agent": "echo", "kind": "webhook", "conversation_id": conversation.id,
                "message_template": "ping {{payload.n}}"})).json()
            fired = await client.post(f"/api/v1/triggers/{trigger['id']}/fire", json={"n": 1})
            assert fired.status_code == 202
            assert fired.json()["conversation_id"] == conversation.id
            assert await store.runs.get(fired.json()["run_id"]) is None  # it waits its turn
            release.set()
            await holding.done.wait()

            async def ran() -> bool:
                run = await store.runs.get(fired.json()["run_id"])
                return run is not None and run.status == "completed"

            await eventually(ran)
    texts = [m.text for m in await store.conversations.load_messages(conversation.id)]
    assert texts[:2] == ["hold", "held"]
    assert texts[2].startswith("ping")
    assert texts[3].startswith("got: ping")


async def test_a_trigger_cannot_post_into_another_realm_or_agent(served: tuple[httpx.AsyncClient, Any],
                                                                  store: Store) -> None:
    client, _ = served
    blue = await store.conversations.create(agent="echo", realm="blue")
    red_admin, _ = await store.keys.create("red", scopes=["admin"], realms=["red"])
    headers = {"Authorization": f"Bearer {red_admin}"}
    made = await client.post("/api/v1/triggers", headers=headers, json={
        "name": "t", "agent": "echo", "kind": "webhook", "realm": "red", "conversation_id": blue.id})
    assert made.status_code == 404  # a conversation this key cannot see
    own = (await client.post("/api/v1/triggers", headers=headers,
                             json={"name": "t", "agent": "echo", "kind": "webhook", "realm": "red"})).json()
    moved = await client.patch(f"/api/v1/triggers/{own['id']}", headers=headers, json={"conversation_id": blue.id})
    assert moved.status_code == 404
    admin_moved = await client.patch(f"/api/v1/triggers/{own['id']}", json={"conversation_id": blue.id})
    assert admin_moved.status_code == 422  # even a key that sees both: blue is another realm
    assert (await client.patch(f"/api/v1/triggers/{own['id']}", json={"enabled": None})).status_code == 422


async def test_a_timestamp_must_be_unix_seconds(served: tuple[httpx.AsyncClient, Any]) -> None:
    client, _ = served
    trigger = (await client.post("/api/v1/triggers", json={"name": "h", "agent": "echo", "kind": "webhook",
                                                           "secret": SECRET})).json()
    body = b"{}"
    async with httpx.AsyncClient(base_url=str(client.base_url)) as anonymous:
        for stamp in ("nan", "inf", "1e99", str(time.time()), f"0{int(time.time())}", f"+{int(time.time())}"):
            signature = "sha256=" + hmac.new(SECRET.encode(), f"{stamp}.".encode() + body,
                                             hashlib.sha256).hexdigest()
            refused = await anonymous.post(f"/api/v1/triggers/{trigger['id']}/fire", content=body, headers={
                "X-Ringlet-Signature": signature, "X-Ringlet-Timestamp": stamp})
            assert refused.status_code == 401, stamp
