"""Compaction (issue #6, memory-and-context.md §5): at the threshold, on a context-window error and on
request; turn pairs stay whole, protected turns stay, the removed messages stay stored, the budget holds."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from helpers import of_type
from ringlet import Agent, Limits, Message, tool
from ringlet.errors import ContextWindowError
from ringlet.memory.compaction import SUMMARY_INSTRUCTIONS, CompactionConfig
from ringlet.messages import ToolCall
from ringlet.server import ServerSettings, create_app
from ringlet.store import Store
from ringlet.testing import ScriptedModel
from serving import serving

WORDS = "lorem ipsum dolor sit amet " * 12  # ~80 tokens


def long_history(turns: int = 6) -> list[Message]:
    """`turns` user/assistant pairs; the second pair has a tool call and its (durable) result."""
    history: list[Message] = []
    for i in range(turns):
        history.append(Message(id=f"m_u{i}", role="user", content=f"question {i}: {WORDS}"))
        if i == 1:
            history.append(Message(id="m_call", role="assistant", content="",
                                   tool_calls=(ToolCall(id="call_9", name="lookup", arguments={"key": "K-42"}),)))
            history.append(Message(id="m_result", role="tool", content="the deploy key is K-42", tool_call_id="call_9",
                                   name="lookup", metadata={"durable": True, "is_tool_result": True}))
        history.append(Message(id=f"m_a{i}", role="assistant", content=f"answer {i}: {WORDS}"))
    return history


@tool(effect="read")
def lookup(key: str) -> str:
    """Look something up."""
    return key


def summary_requests(model: ScriptedModel) -> list[Any]:
    return [r for r in model.requests if r.instructions == SUMMARY_INSTRUCTIONS]


async def test_compaction_at_the_threshold_keeps_pairs_and_recent_turns() -> None:
    model = ScriptedModel(["The user asked questions 0-3; the deploy key is K-42.", "final answer"])
    agent = Agent(model, tools=[lookup], limits=Limits(max_tokens_per_turn=900))
    stream = agent.stream("question now?", history=long_history())
    events = [e async for e in stream]
    result = stream.result
    assert result is not None
    assert result.status == "completed"
    [event] = of_type(events, "compaction")
    assert (event.trigger, event.method) == ("threshold", "summarize")
    assert event.tokens_after < event.tokens_before
    summary = summary_requests(model)[0]
    assert summary.tools == ()
    fed = summary.messages[0].text
    assert "question 0" in fed
    assert "TOOL RESULT DURABLE (lookup): the deploy key is K-42" in fed  # marked for verbatim keeping
    answer = model.requests[-1]
    assert answer.messages[0].role == "system"
    assert answer.messages[0].text.startswith("<compacted>\nThe user asked questions 0-3")
    seen = {m.id for m in answer.messages}
    assert {"m_u4", "m_a4", "m_u5", "m_a5"} <= seen  # the last two turn pairs are protected
    assert answer.messages[-1].text == "question now?"
    assert ("m_call" in seen) == ("m_result" in seen)  # a tool call is never separated from its result
    covered = [m for m in result.messages if m.metadata.get("compacted_into") == event.summary_message_id]
    assert {m.id for m in covered} >= {"m_u0", "m_a0"}
    assert len(covered) == event.removed_messages
    assert {m.id for m in result.messages} >= {m.id for m in long_history()}  # removed from the prompt only
    note = next(m for m in result.messages if m.id == event.summary_message_id)
    assert note.metadata["kind"] == "compaction"
    assert note.metadata["covers"] == [m.id for m in covered]
    model.assert_complete()


async def test_a_failed_summary_truncates_and_keeps_durable_results_verbatim() -> None:
    model = ScriptedModel([RuntimeError("summary model down"), "final answer"])
    agent = Agent(model, tools=[lookup], limits=Limits(max_tokens_per_turn=900))
    stream = agent.stream("question now?", history=long_history())
    events = [e async for e in stream]
    [event] = of_type(events, "compaction")
    assert event.method == "truncate"
    assert any(e.title == "compaction fell back to truncation" for e in of_type(events, "notification"))
    note = model.requests[-1].messages[0].text
    assert "durable result of lookup: the deploy key is K-42" in note
    assert stream.result is not None
    assert stream.result.output == "final answer"


async def test_a_context_window_error_compacts_once_and_retries() -> None:
    model = ScriptedModel([ContextWindowError("prompt too long", status=400), "short summary", "fits now"])
    result = await Agent(model, tools=[lookup]).run("question now?", history=long_history())
    assert result.output == "fits now"
    assert len(summary_requests(model)) == 1
    assert model.requests[-1].messages[0].text == "<compacted>\nshort summary\n</compacted>"
    again = ScriptedModel([ContextWindowError("too long"), "summary", ContextWindowError("still too long")])
    failed = await Agent(again, tools=[lookup]).run("question now?", history=long_history())
    assert failed.error is not None
    assert failed.error["code"] == "context_window"  # compacted once; the second failure ends the run


async def test_the_budget_still_holds_after_compaction() -> None:
    huge = [Message(id="m_u", role="user", content=WORDS * 30)]
    model = ScriptedModel([])
    result = await Agent(model, limits=Limits(max_tokens_per_turn=500)).run("and?", history=huge)
    assert result.error is not None
    assert result.error["code"] == "context_budget_exceeded"  # nothing could be compacted: the turn is current


async def test_a_message_outside_its_duration_is_never_summarised() -> None:
    history = long_history()
    history.insert(1, Message(id="m_secret", role="user", content="one-shot hint: PINEAPPLE",
                              metadata={"duration": 0}))
    model = ScriptedModel(["summary", "ok"])
    await Agent(model, tools=[lookup], limits=Limits(max_tokens_per_turn=900)).run("question now?", history=history)
    assert "PINEAPPLE" not in summary_requests(model)[0].messages[0].text


async def test_compaction_can_be_turned_off() -> None:
    model = ScriptedModel([])
    result = await Agent(model, tools=[lookup], limits=Limits(max_tokens_per_turn=900, compaction=False)).run(
        "question now?", history=long_history())
    assert result.error is not None
    assert result.error["code"] == "context_budget_exceeded"
    assert CompactionConfig(threshold=0.9).keep_recent_turns == 2


async def test_manual_compaction_over_http(store: Store) -> None:
    model = ScriptedModel(["manual summary"])
    agent = Agent(model, name="talker")
    app = create_app(ServerSettings(auth_mode="none"), store=store, agents=[agent])
    async with serving(app) as url, httpx.AsyncClient(base_url=url) as c:
        cid = (await c.post("/api/v1/chat/conversations", json={"agent": "talker"})).json()["id"]
        await store.conversations.append_messages(cid, long_history())
        done = await c.post(f"/api/v1/chat/conversations/{cid}/compact")
        assert done.status_code == 200, done.text
        event = done.json()["event"]
        assert (event["trigger"], event["method"]) == ("manual", "summarize")
        messages = (await c.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"]
        marked = [m["id"] for m in messages if m["metadata"].get("compacted_into") == event["summary_message_id"]]
        assert marked[:2] == ["m_u0", "m_a0"]  # still returned by the transcript API, marked
        assert messages[-1]["content"] == "<compacted>\nmanual summary\n</compacted>"
        log = [item async for item in _events(c, cid)]
        assert [kind for kind, _ in log] == ["compaction"]


async def _events(c: httpx.AsyncClient, cid: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    async with c.stream("GET", f"/api/v1/chat/conversations/{cid}/events", headers={"Last-Event-ID": "0"}) as r:
        kind = None
        async for line in r.aiter_lines():
            if line.startswith("event: "):
                kind = line.removeprefix("event: ")
            elif line.startswith("data: ") and kind not in (None, "ping"):
                yield kind, json.loads(line.removeprefix("data: "))
                return


@pytest.mark.parametrize("busy", [True])
async def test_manual_compaction_is_refused_while_a_run_is_active(store: Store, busy: bool) -> None:
    agent = Agent(ScriptedModel([]), name="talker")
    app = create_app(ServerSettings(auth_mode="none"), store=store, agents=[agent])
    async with serving(app) as url, httpx.AsyncClient(base_url=url) as c:
        cid = (await c.post("/api/v1/chat/conversations", json={"agent": "talker"})).json()["id"]
        await store.conversations.set_status(cid, "running")
        refused = await c.post(f"/api/v1/chat/conversations/{cid}/compact")
        assert refused.status_code == 409
        assert refused.json()["error"]["code"] == "run_in_progress"


async def test_the_context_report_counts_what_a_compaction_left() -> None:
    model = ScriptedModel(["short summary", "ok"])
    agent = Agent(model, tools=[lookup], limits=Limits(max_tokens_per_turn=900))
    result = await agent.run("question now?", history=long_history())
    before = await agent.context(long_history())
    after = await agent.context(result.messages)
    assert after["user"] < before["user"]  # the compacted turns no longer count
    assert after["system"] > before["system"]  # the note does
