"""Nothing is lost (issue #4 reliability): a run whose server dies is closed as interrupted, with its
partial answer kept. One test SIGKILLs a real `ringlet serve` mid-stream and restarts it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from httpx_sse import aconnect_sse

from processes import free_port, ringlet_process
from ringlet.events import ContentDeltaEvent, MessageStartEvent
from ringlet.messages import Message, ToolCall
from ringlet.server import ServerSettings
from ringlet.server.catalog import Catalog
from ringlet.server.runs.runner import Runner
from ringlet.store import Store
from serving import openai_model, serving


async def test_an_expired_run_is_closed_as_interrupted(store: Store) -> None:
    conversation = await store.conversations.create(agent="a")
    cid = conversation.id
    await store.runs.create("r_dead", agent="a", conversation_id=cid, lease_owner="proc_gone",
                           lease_expires_at="2000-01-01T00:00:00.000Z")
    for event in (MessageStartEvent(run_id="r_dead", ts="t", message_id="m_1", agent="a"),
                  ContentDeltaEvent(run_id="r_dead", ts="t", message_id="m_1", delta="Hel"),
                  ContentDeltaEvent(run_id="r_dead", ts="t", message_id="m_1", delta="lo")):
        await store.events.append(cid, event)
    await store.conversations.append_messages(cid, [Message(id="m_0", role="assistant", run_id="r_dead", content="",
                                              tool_calls=(ToolCall(id="call_1", name="lookup"),))])
    runner = Runner(store, Catalog([]), ServerSettings())
    assert await runner.recovery.recover() == 1
    assert await runner.recovery.recover() == 0  # closed once
    await runner.writer.close()
    run = await store.runs.get("r_dead")
    assert run is not None
    assert (run.status, run.finish_reason) == ("failed", "error")
    _, partial, result = await store.conversations.load_messages(cid)
    assert (partial.id, partial.text, partial.metadata["interrupted"]) == ("m_1", "Hello", True)
    # the call that was running gets an error result, so the transcript stays valid for any provider
    assert (result.role, result.tool_call_id, result.metadata["is_error"]) == ("tool", "call_1", True)
    assert "interrupted" in result.text
    tail = await store.events.after(cid, 3)
    # the call the transcript kept but the log never got (an older ringlet ran ahead of its log) is logged
    # now, start and arguments before its result
    assert [(kind, p.get("code") or (p.get("error") or {}).get("code"), p.get("finish_reason"))
            for _, kind, p in tail] == [("tool_call_start", None, None), ("tool_call_delta", None, None),
                                        ("tool_result", "interrupted", None), ("error", "interrupted", None),
                                        ("message_end", None, "error")]
    assert tail[0][2]["tool_call_id"] == tail[2][2]["tool_call_id"] == "call_1"
    assert tail[4][2]["message_id"] == "m_1"


# -- the real thing: SIGKILL a server mid-stream -------------------------------------------------------------


def stalling_model() -> Any:
    """An OpenAI-compatible endpoint that streams three tokens, then hangs."""
    return openai_model(lambda messages: [{"role": "assistant", "content": ""}, {"content": "Par"},
                                          {"content": "tial"}, {"content": " answer"}], hang=True)


@asynccontextmanager
async def ringlet_serve(port: int, db: Path | str, agents: Path,
                        **env: str) -> AsyncIterator[asyncio.subprocess.Process]:
    """`ringlet serve` in a subprocess on `db` (a SQLite file, or a database URL), with `env` added; yields
    once the server has started (uvicorn binds its socket after the app's startup: "Uvicorn running on" is
    when it accepts), kills it at the end."""
    url = f"sqlite+aiosqlite:///{db}" if isinstance(db, Path) else db
    async with ringlet_process(["serve", "--port", str(port), "--db", url, "--agents", str(agents)],
                               b"Uvicorn running on", {"RINGLET_RUN_LEASE_S": "0.6", "RINGLET_AUTH_MODE": "none",
                                                       **env}) as process:
        yield process


async def paused_then_killed(port: int, db: Path, agents: Path, agent: str, content: str) -> tuple[str, list[Any]]:
    """Start `ringlet serve`, send `content` to a new conversation with `agent`, and SIGKILL the server as
    soon as the run pauses for a human; the conversation id and the events received until then."""
    received: list[Any] = []
    async with ringlet_serve(port, db, agents) as server, \
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
        cid = (await c.post("/api/v1/chat/conversations", json={"agent": agent})).json()["id"]
        async with aconnect_sse(c, "POST", f"/api/v1/chat/conversations/{cid}/messages",
                                json={"content": content}) as source:
            async for event in source.aiter_sse():
                received.append(event)
                if event.event == "status" and json.loads(event.data)["state"] == "input_required":
                    server.send_signal(signal.SIGKILL)
                    break
        await server.wait()
    return cid, received


async def events_until_end(client: httpx.AsyncClient, cid: str, after: str) -> list[Any]:
    """The conversation's events after the event id `after`, up to the next `message_end` (no pings)."""
    rest = []
    async with aconnect_sse(client, "GET", f"/api/v1/chat/conversations/{cid}/events",
                            headers={"Last-Event-ID": after}) as source:
        async for event in source.aiter_sse():
            if event.event != "ping":
                rest.append(event)
            if event.event == "message_end":
                break
    return rest


@pytest.mark.slow
async def test_sigkill_mid_stream_loses_nothing(tmp_path: Path) -> None:
    async with serving(stalling_model()) as model_url:
        agent = tmp_path / "agents" / "talker"
        agent.mkdir(parents=True)
        (agent / "config.yaml").write_text(
            f"model: openai:m\nmodel_options: {{base_url: '{model_url}/v1', api_key: x}}\ninstructions: Talk.\n")
        port, db = free_port(), tmp_path / "ringlet.db"
        base = f"http://127.0.0.1:{port}"
        received: list[Any] = []
        async with ringlet_serve(port, db, tmp_path / "agents") as first, httpx.AsyncClient(base_url=base) as c:
            cid = (await c.post("/api/v1/chat/conversations", json={"agent": "talker"})).json()["id"]
            async with aconnect_sse(c, "POST", f"/api/v1/chat/conversations/{cid}/messages",
                                    json={"content": "Say something"}) as source:
                async for event in source.aiter_sse():
                    received.append(event)
                    if event.event == "content_delta" and json.loads(event.data)["delta"] == " answer":
                        first.send_signal(signal.SIGKILL)
                        break
            await first.wait()
        run_id = json.loads(received[0].data)["run_id"]
        async with ringlet_serve(port, db, tmp_path / "agents"), httpx.AsyncClient(base_url=base) as c:
            closing = []
            async with aconnect_sse(c, "GET", f"/api/v1/chat/conversations/{cid}/events",
                                    headers={"Last-Event-ID": received[-1].id}) as source:
                async for event in source.aiter_sse():  # the restarted server closes the run by itself
                    if event.event != "ping":
                        closing.append(event)
                    if event.event == "message_end":
                        break
            assert [e.event for e in closing] == ["error", "message_end"]
            assert json.loads(closing[0].data)["code"] == "interrupted"
            assert json.loads(closing[1].data)["finish_reason"] == "error"
            log = []
            async with aconnect_sse(c, "GET", f"/api/v1/chat/conversations/{cid}/events",
                                    headers={"Last-Event-ID": "0"}) as source:
                async for event in source.aiter_sse():
                    log.append(event)
                    if event.event == "message_end":
                        break
            assert [(e.id, e.data) for e in log[:len(received)]] == [(e.id, e.data) for e in received]
            messages = (await c.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"]
            assert [m["role"] for m in messages] == ["user", "assistant"]
            assert messages[1]["content"] == "Partial answer"
            assert messages[1]["metadata"]["interrupted"] is True
            run = (await c.get(f"/api/v1/runs/{run_id}")).json()
            assert run["status"] == "failed"
            conversation = (await c.get(f"/api/v1/chat/conversations/{cid}")).json()["conversation"]
            assert conversation["status"] == "idle"


def exited_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    return int(done.stdout)


async def test_a_run_of_a_process_gone_from_this_machine_closes_at_once_with_its_start(store: Store) -> None:
    """Its lease is far from expiring, but its owner ran here and has exited: closed now, and since it
    died before its first event was stored, its log gets `message_start` (and `status working`) before the
    closing events."""
    from ringlet.server.durable.reconcile import HOST, gone

    conversation = await store.conversations.create(agent="a")
    cid = conversation.id
    dead = f"proc_old@{HOST}:{exited_pid()}"
    assert gone(dead)
    assert not gone(f"proc_live@{HOST}:{os.getppid()}")  # alive
    assert not gone(f"proc_far@elsewhere-{HOST}:1")  # another machine: its lease decides
    await store.runs.create("r_orphan", agent="a", conversation_id=cid, lease_owner=dead,
                           lease_expires_at="2999-01-01T00:00:00.000Z", incoming=[Message.user("hi")])
    await store.runs.create("r_alive", agent="a", lease_owner="proc_far@elsewhere:1",
                           lease_expires_at="2999-01-01T00:00:00.000Z")
    runner = Runner(store, Catalog([]), ServerSettings())
    assert await runner.recovery.recover() == 1
    await runner.writer.close()
    assert (await store.runs.get("r_alive") or {}).status == "working"  # untouched
    assert (await store.runs.get("r_orphan") or {}).status == "failed"
    assert (await store.conversations.get(cid) or {}).status == "idle"
    log = await store.events.after(cid, 0)
    assert [kind for _, kind, _ in log] == ["message_start", "status", "error", "message_end"]
    assert log[1][2]["state"] == "working"  # the opening a stream expects, as any run's
    assert log[0][2]["message_id"] == log[3][2]["message_id"]


@pytest.mark.slow
async def test_a_restarted_server_closes_its_predecessors_runs_before_it_is_ready(tmp_path: Path) -> None:
    async with serving(stalling_model()) as model_url:
        agent = tmp_path / "agents" / "talker"
        agent.mkdir(parents=True)
        (agent / "config.yaml").write_text(
            f"model: openai:m\nmodel_options: {{base_url: '{model_url}/v1', api_key: x}}\ninstructions: Talk.\n")
        port, db, lease = free_port(), tmp_path / "ringlet.db", {"RINGLET_RUN_LEASE_S": "600"}
        base = f"http://127.0.0.1:{port}"
        async with ringlet_serve(port, db, tmp_path / "agents", **lease) as first, \
                httpx.AsyncClient(base_url=base) as c:
            cid = (await c.post("/api/v1/chat/conversations", json={"agent": "talker"})).json()["id"]
            async with aconnect_sse(c, "POST", f"/api/v1/chat/conversations/{cid}/messages",
                                    json={"content": "Say something"}) as source:
                async for event in source.aiter_sse():
                    if event.event == "content_delta":
                        first.send_signal(signal.SIGKILL)
                        break
            await first.wait()
        async with ringlet_serve(port, db, tmp_path / "agents", **lease), httpx.AsyncClient(base_url=base) as c:
            detail = (await c.get(f"/api/v1/chat/conversations/{cid}")).json()  # read at once: no lease wait
            assert detail["conversation"]["status"] == "idle"
            async with c.stream("POST", f"/api/v1/chat/conversations/{cid}/messages",
                                json={"content": "again"}) as sent:
                assert sent.status_code == 200  # a new run starts: not 409 `run_in_progress`
