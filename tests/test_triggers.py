"""Triggers (server-contract.md §6): webhooks by key or HMAC signature, templates, cron with misfire grace."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from ringlet import Agent
from ringlet.server import ServerSettings, create_app
from ringlet.server.triggers import Scheduler, next_fire, render
from ringlet.store import Store
from ringlet.testing import FunctionModel
from serving import serving

SECRET = "s3cret-s3cret-s3cret"


def echo(request: Any) -> str:
    return "got: " + request.messages[-1].text[:40]


@pytest.fixture
async def served(store: Store) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
    app = create_app(ServerSettings(cron_poll_s=3600), store=store, agents=[Agent(FunctionModel(echo), name="echo")])
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
    trigger = {"name": "deploy"}
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
    assert (await client.delete(f"/api/v1/triggers/{made['id']}")).status_code == 204
    assert (await client.get(f"/api/v1/triggers/{made['id']}")).status_code == 404


def test_next_fire_reads_the_timezone() -> None:
    noon_utc = 1767268800.0  # 2026-01-01T12:00:00Z
    assert next_fire("0 9 * * *", "UTC", noon_utc) == "2026-01-02T09:00:00.000Z"
    assert next_fire("0 9 * * *", "Europe/Paris", noon_utc) == "2026-01-02T08:00:00.000Z"


async def test_cron_fires_once_within_grace_and_skips_beyond(served: tuple[httpx.AsyncClient, Any],
                                                              store: Store) -> None:
    client, app = served
    schedules = {"recent": "* * * * *", "old": "0 0 1 1 *"}  # every minute; once a year
    made = [(await client.post("/api/v1/triggers", json={"name": name, "agent": "echo", "kind": "cron",
                                                         "cron": cron})).json() for name, cron in schedules.items()]
    stamp = lambda ago: time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(time.time() - ago))  # noqa: E731
    # both were due an hour ago (the server was down): the every-minute trigger's last missed fire is
    # seconds old, so it runs once; the yearly one's is months old, far past the grace, so it is skipped
    await store.triggers.update(made[0]["id"], {"next_fire_at": stamp(3600)})
    await store.triggers.update(made[1]["id"], {"next_fire_at": stamp(3600)})
    scheduler: Scheduler = app.state.ringlet.scheduler
    fires = await scheduler.tick()
    assert len(fires) == 1
    await asyncio.gather(*fires)
    assert await scheduler.tick() == []  # nothing is due any more: each fire runs once
    conversations = (await client.get("/api/v1/chat/conversations")).json()["data"]
    assert [c["title"] for c in conversations] == ["recent (cron)"]
    recent, old = [await store.triggers.get(t["id"]) for t in made]
    assert recent is not None
    assert old is not None
    assert recent["last_fired_at"] is not None
    assert old["last_fired_at"] is None
    assert recent["next_fire_at"] > stamp(0)
    assert old["next_fire_at"] > stamp(0)
    messages = await _messages_of(client, conversations[0]["id"])
    assert messages[0]["metadata"]["source"] == "cron"


async def test_a_trigger_cannot_post_into_another_realm_or_agent(served: tuple[httpx.AsyncClient, Any],
                                                                  store: Store) -> None:
    client, _ = served
    blue = await store.create_conversation(agent="echo", realm="blue")
    red_admin, _ = await store.keys.create("red", scopes=["admin"], realms=["red"])
    headers = {"Authorization": f"Bearer {red_admin}"}
    made = await client.post("/api/v1/triggers", headers=headers, json={
        "name": "t", "agent": "echo", "kind": "webhook", "realm": "red", "conversation_id": blue["id"]})
    assert made.status_code == 404  # a conversation this key cannot see
    own = (await client.post("/api/v1/triggers", headers=headers,
                             json={"name": "t", "agent": "echo", "kind": "webhook", "realm": "red"})).json()
    moved = await client.patch(f"/api/v1/triggers/{own['id']}", headers=headers, json={"conversation_id": blue["id"]})
    assert moved.status_code == 404
    admin_moved = await client.patch(f"/api/v1/triggers/{own['id']}", json={"conversation_id": blue["id"]})
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
