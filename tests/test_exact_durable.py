"""Exact durable runs (issue 39): whatever dies, what a client assembled from a run's stream is what the
transcript holds and what the log replays, and every tool call settles with exactly one result.

A worker is SIGKILLed while the model streams a request that a real model would answer differently when it
is sent again (other tool-call ids, other text): the abandoned attempt is closed (`superseded` results,
`retracted`) before the new one streams."""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from test_durable import Upstream, Watch, cluster, kill, start, text, whole

pytestmark = pytest.mark.slow


def fresh_calls(*names: str) -> list[dict[str, Any]]:
    """Tool calls with ids never seen before, as hosted models draw them."""
    drawn = next(_DRAWS)
    return [{"role": "assistant", "content": None},
            *[{"tool_calls": [{"index": i, "id": f"call_{drawn}_{name}", "type": "function",
                               "function": {"name": name, "arguments": json.dumps({"n": i})}}]}
              for i, name in enumerate(names)]]


_DRAWS = itertools.count(1)


def assembled(events: list[dict[str, Any]]) -> tuple[str, list[str], dict[str, int]]:
    """What a client following the protocol assembles: the answer's text (retracted text dropped), the tool
    calls it shows (retracted ones dropped), and how many results each started call got."""
    texts: dict[str, str] = {}
    calls: list[str] = []
    results: dict[str, int] = {}
    for e in events:
        kind, data = e["event"], e["data"]
        if "agent_path" in data:
            continue
        if kind == "content_delta":
            texts[data["message_id"]] = texts.get(data["message_id"], "") + data["delta"]
        elif kind == "tool_call_start":
            calls.append(data["tool_call_id"])
            results.setdefault(data["tool_call_id"], 0)
        elif kind == "tool_result":
            results[data["tool_call_id"]] = results.get(data["tool_call_id"], 0) + 1
        elif kind == "retracted":
            texts.pop(data.get("message_id") or "", None)
            calls = [c for c in calls if c not in data["tool_call_ids"]]
    return "".join(texts.values()), calls, results


def parsed(seen: list[Any]) -> list[dict[str, Any]]:
    return [{"id": int(e.id), "event": e.event, "data": json.loads(e.data)} for e in seen]


async def replayed(c: Any, cid: str) -> list[dict[str, Any]]:
    """The run's events as `GET …/events` replays them from the log once it has ended."""
    again = Watch(c.client, cid)
    async with asyncio.timeout(30):
        await again.task
    return parsed(again.seen)


async def transcript(c: Any, cid: str) -> list[dict[str, Any]]:
    return (await c.client.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"]


async def test_a_worker_killed_while_the_model_streams_tool_calls_leaves_no_call_open(
        tmp_path: Path, postgres_url: str) -> None:
    def script(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return text("Both", " done") if messages[-1]["role"] == "tool" else fresh_calls("fast", "again")

    upstream = Upstream(script, hold_after=2)  # the first call streamed, the second held: in flight
    async with cluster(tmp_path, postgres_url, upstream) as c:
        cid, watch = await start(c, "Do both things")
        async with asyncio.timeout(60):
            first = await watch.until("tool_call_start")
        await kill(await c.executor(watch.run_id))
        upstream.release.set()
        async with asyncio.timeout(60):
            await watch.task
        seen = parsed(watch.seen)
        whole(watch.seen)
        answer, shown, results = assembled(seen)
        assert all(n == 1 for n in results.values()), results  # every call settles exactly once
        superseded = next(e["data"] for e in seen if e["event"] == "tool_result"
                          and e["data"]["tool_call_id"] == first["tool_call_id"])
        assert superseded["error"]["code"] == "superseded"
        retracted = next(e for e in seen if e["event"] == "retracted")
        assert first["tool_call_id"] in retracted["data"]["tool_call_ids"]
        assert retracted["id"] < min(e["id"] for e in seen if e["event"] == "tool_call_start"
                                     and e["data"]["tool_call_id"] != first["tool_call_id"])  # closed first
        assert c.effects_seen() == ["fast", "again"]  # the abandoned calls never ran; the new ones once
        messages = await transcript(c, cid)
        kept = [call["id"] for m in messages for call in m.get("tool_calls") or []]
        assert shown == kept  # the calls a client shows are the transcript's
        assert answer == messages[-1]["content"] == "Both done"
        assert first["tool_call_id"] not in kept
        assert [(e["id"], e["event"]) for e in await replayed(c, cid)] == [(e["id"], e["event"]) for e in seen]
        assert (await c.run_record(watch.run_id))["status"] == "completed"


async def test_a_worker_killed_mid_answer_never_splices_two_attempts(tmp_path: Path, postgres_url: str) -> None:
    attempts = itertools.count(1)

    def script(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        n = next(attempts)
        return text("First", " try", " went on") if n == 1 else text("Another", " answer")

    upstream = Upstream(script, hold_after=3)
    async with cluster(tmp_path, postgres_url, upstream) as c:
        cid, watch = await start(c, "Say something")
        async with asyncio.timeout(60):
            await watch.until("content_delta", lambda d: d["delta"] == " try")
        await kill(await c.executor(watch.run_id))
        upstream.release.set()
        async with asyncio.timeout(60):
            await watch.task
        seen = parsed(watch.seen)
        whole(watch.seen)
        answer, _, _ = assembled(seen)
        messages = await transcript(c, cid)
        assert answer == messages[-1]["content"] == "Another answer"  # not "First try" + " answer"
        retracted = next(e["data"] for e in seen if e["event"] == "retracted")
        first_delta = next(e["data"] for e in seen if e["event"] == "content_delta")
        assert retracted["message_id"] == first_delta["message_id"]
        assert assembled(await replayed(c, cid))[0] == answer  # the log replays what the client saw
