"""What a turn commits (issue 54, `docs/operations/durable-cost.md`): a workflow takes its run's lease and reads
its history in one transaction; a run's `message_start` and the status behind it share one commit, and so do an
answer's text and the tool call's start behind it. Every event is still stored before it is sent, in order."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from ringlet import Agent, tool
from ringlet.messages import Message
from ringlet.server import ServerSettings, create_app
from ringlet.store import Store
from ringlet.store.writer import EventWriter
from ringlet.testing import Reply, ScriptedModel, call
from serving import serving
from test_server import sse_events


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def counting(store: Store) -> list[list[str]]:
    """The types of each batch of events the store appends (each batch is one transaction), in order."""
    batches: list[list[str]] = []
    append = store.events.append_batch

    async def counted(batch: Any) -> list[int]:
        batches.append([kind for _, kind, _ in batch])
        return await append(batch)

    store.events.append_batch = counted  # type: ignore[method-assign]
    return batches


async def test_a_lead_event_waits_a_window_for_the_one_behind_it(tmp_path: Path) -> None:
    """A lingering event after a quiet spell is committed at once; one that leads (a run's `message_start`)
    waits the window, and the event appended behind it shares its commit."""
    store = await Store.open(f"sqlite:///{tmp_path}/s.db")
    batches = counting(store)
    try:
        cid = (await store.conversations.create(agent="a")).id
        async with asyncio.timeout(30):  # only a guard: nothing here waits for time to pass
            writer = EventWriter(store, window_s=3600)
            start = writer.put(cid, "message_start", {"message_id": "m"}, linger=True, lead=True)
            await asyncio.to_thread(lambda: None)  # a thread's answer: the writer's steps ran before
            assert batches == []
            assert not start.done()
            status = await writer.append(cid, "status", {"state": "working"})
            assert batches == [["message_start", "status"]]
            assert status == await start + 1
            await writer.close()
    finally:
        await store.close()


async def test_a_runs_first_events_and_a_tool_calls_start_share_commits(tmp_path: Path) -> None:
    """With a commit window, a run's `message_start` and its status `working` are one commit; the answer's text
    and the tool call's start behind it are one commit. The client gets every event, in order, each with the
    id it was stored under."""
    store = await Store.open(f"sqlite:///{tmp_path}/s.db")
    batches = counting(store)
    model = ScriptedModel([Reply("Let me add.", calls=[call("add", a=2, b=3)]), "The sum is 5."])
    app = create_app(ServerSettings(events_commit_s=1, auth_mode="none"), store=store,
                     agents=[Agent(model, name="adder", tools=[add])])
    try:
        async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as client, \
                asyncio.timeout(60):
            cid = (await client.post("/api/v1/chat/conversations", json={"agent": "adder"})).json()["id"]
            seen = await sse_events(client, "POST", f"/api/v1/chat/conversations/{cid}/messages",
                                    json={"content": "2+3?"})
            stored = await store.events.after(cid)
    finally:
        await store.close()
    assert [e.event for e in seen] == [kind for _, kind, _ in stored]
    assert [int(e.id) for e in seen] == [i for i, _, _ in stored]
    assert batches[0] == ["message_start", "status"]
    text_then_call = next(b for b in batches if "tool_call_start" in b)
    assert text_then_call == ["content_delta", "tool_call_start"]


async def test_a_run_taken_by_its_workflow_reads_its_history_with_its_lease(store: Store) -> None:
    """`RunLog.take`: the process that started the run takes its lease and gets the conversation's history
    before the run's input; another process gets None (and nothing is read or changed)."""
    cid = (await store.conversations.create(agent="a")).id
    earlier = [Message.user("hi"), Message.assistant("hello")]
    await store.conversations.append_messages(cid, earlier)
    incoming = Message.user("again")
    await store.runs.create("r_1", agent="a", conversation_id=cid, lease_owner="me",
                            lease_expires_at="2000-01-01T00:00:00Z", incoming=[incoming])
    assert await store.runs.take("r_1", "other", "2999-01-01T00:00:00Z", conversation_id=cid,
                                 before=incoming.id) is None
    row = next(r for r in await store.runs.working() if r.id == "r_1")
    assert (row.lease_owner, row.lease_expires_at) == ("me", "2000-01-01T00:00:00Z")
    history = await store.runs.take("r_1", "me", "2999-01-01T00:00:00Z", conversation_id=cid, before=incoming.id)
    assert [m.id for m in history or []] == [m.id for m in earlier]
    row = next(r for r in await store.runs.working() if r.id == "r_1")
    assert row.lease_expires_at == "2999-01-01T00:00:00Z"
    assert await store.runs.take("r_1", "me", "2999-01-01T00:00:00Z", conversation_id=cid, before=None) == []

