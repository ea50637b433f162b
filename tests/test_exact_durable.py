"""Exact durable runs (issue 39): whatever dies, what a client assembled from a run's stream is what the
transcript holds and what the log replays, and every tool call settles with exactly one result.

A worker is SIGKILLed while the model streams a request that a real model would answer differently when it
is sent again (other tool-call ids, other text): the abandoned attempt is closed (`superseded` results,
`retracted`) before the new one streams."""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from ringlet._ids import now

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from chaos import assembled as client_view
from test_durable import TOOLS_PY, Upstream, Watch, calls, cluster, kill, start, text, watch_cid, whole
from test_graph_support import make_graph

pytestmark = pytest.mark.slow


def fresh_calls(*names: str) -> list[dict[str, Any]]:
    """Tool calls with ids never seen before, as hosted models draw them."""
    drawn = next(_DRAWS)
    return [{"role": "assistant", "content": None},
            *[{"tool_calls": [{"index": i, "id": f"call_{drawn}_{name}", "type": "function",
                               "function": {"name": name, "arguments": json.dumps({"n": i})}}]}
              for i, name in enumerate(names)]]


_DRAWS = itertools.count(1)


def assembled(events: list[dict[str, Any]]) -> tuple[str, list[str], Counter[str]]:
    """What a client following the protocol assembles (`bench/chaos.py`'s reading, `retracted` applied)."""
    return client_view([(e["id"], e["event"], e["data"]) for e in events])


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
        assert sorted(c.effects_seen()) == ["again", "fast"]  # the abandoned calls never ran; the new ones once
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


def dangerous(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return text("Approved", " and done") if messages[-1]["role"] == "tool" else calls("danger")


async def paused(c: Any, content: str) -> tuple[Watch, dict[str, Any], Any]:
    """A run paused on `danger`'s approval; the worker whose workflow waits for the decision."""
    _, watch = await start(c, content)
    async with asyncio.timeout(60):
        approval = await watch.until("approval_required")
        await watch.until("status", lambda d: d["state"] == "input_required")
    conn = await asyncpg.connect(c.db.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        executor = await conn.fetchval("SELECT executor_id FROM dbos.workflow_status WHERE workflow_uuid = $1",
                                       watch.run_id)
    finally:
        await conn.close()
    return watch, approval, next(w for w in c.workers if w.pid == int(executor.rsplit(":", 1)[1]))


async def sql(c: Any, statement: str, *args: Any) -> None:
    conn = await asyncpg.connect(c.db.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        await conn.execute(statement, *args)
    finally:
        await conn.close()


async def approved_once(c: Any, watch: Watch) -> None:
    async with asyncio.timeout(60):
        await watch.task
    whole(watch.seen)
    assert c.effects_seen().count("danger") == 1
    result = next(json.loads(e.data) for e in watch.seen if e.event == "tool_result")
    assert result["is_error"] is False, result
    assert json.loads(watch.seen[-1].data)["finish_reason"] == "end_turn"
    assert (await c.run_record(watch.run_id))["status"] == "completed"


STORED_BY_A_DEAD_PROCESS = ("UPDATE approvals SET status = 'approved', decided_by = 'u', decided_at = $2 "
                            "WHERE approval_id = $1")
"""What `POST /approvals/{id}` stores before it wakes the run: a process killed right after wrote only this."""


async def test_a_decision_whose_process_died_before_waking_the_run_is_applied_on_retry(
        tmp_path: Path, postgres_url: str) -> None:
    async with cluster(tmp_path, postgres_url, Upstream(dangerous)) as c:
        watch, approval, _ = await paused(c, "Do the dangerous thing")
        await sql(c, STORED_BY_A_DEAD_PROCESS, approval["approval_id"], now())
        retried = await c.client.post(f"/api/v1/approvals/{approval['approval_id']}", json={"approved": True})
        assert (retried.status_code, retried.json()["error"]["code"]) == (409, "approval_already_decided")
        await approved_once(c, watch)  # the retry woke it


async def test_a_decision_whose_process_died_before_waking_the_run_is_applied_by_recovery(
        tmp_path: Path, postgres_url: str) -> None:
    async with cluster(tmp_path, postgres_url, Upstream(dangerous), RINGLET_RUN_LEASE_S="3") as c:
        watch, approval, _ = await paused(c, "Do the dangerous thing")
        await sql(c, STORED_BY_A_DEAD_PROCESS, approval["approval_id"], now())
        await approved_once(c, watch)  # nobody retried: a process's upkeep found it


async def test_a_worker_killed_after_taking_a_paused_run_leaves_it_to_another(tmp_path: Path,
                                                                           postgres_url: str) -> None:
    async with cluster(tmp_path, postgres_url, Upstream(dangerous)) as c:
        watch, approval, waiting = await paused(c, "Do the dangerous thing")
        await kill(waiting)
        # what the killed worker would have written in the step that takes the run, had it been woken by the
        # decision: the decision, the run taken (working, its lease), the approved call marked executing
        await sql(c, STORED_BY_A_DEAD_PROCESS, approval["approval_id"], now())
        await sql(c, "UPDATE runs SET status = 'working', lease_owner = $2, lease_expires_at = '9999' WHERE id = $1",
                  watch.run_id, f"dead@host:{waiting.pid}")
        await sql(c, "UPDATE approvals SET status = 'executing' WHERE approval_id = $1", approval["approval_id"])
        await sql(c, "UPDATE conversations SET status = 'running' WHERE id = $1", watch_cid(watch))
        retried = await c.client.post(f"/api/v1/approvals/{approval['approval_id']}", json={"approved": True})
        assert retried.status_code == 409  # the client's retry wakes the workflow, now on another worker,
        await approved_once(c, watch)  # which takes the run over (its taking step never finished) and goes on


TOOLING = """
name: tooling
model: openai:m
start: work
nodes:
  work: {type: llm, prompt: "Do both", tools: [fast, slow], state_updates: {said: "{{output}}"}, next: z}
  z: {type: end, output: "{{said}}"}
"""


async def test_a_finished_tool_call_inside_a_graph_llm_node_never_runs_again(tmp_path: Path,
                                                                             postgres_url: str) -> None:
    def script(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        answered = [m for m in messages if m["role"] == "tool"]
        return fresh_calls("fast") if not answered else fresh_calls("slow") if len(answered) == 1 else \
            text("Both", " done")

    upstream = Upstream(script)
    make_graph(tmp_path / "agents", TOOLING, name="tooling", files={"tools.py": TOOLS_PY})
    async with cluster(tmp_path, postgres_url, upstream, OPENAI_BASE_URL="{url}/v1", OPENAI_API_KEY="x") as c:
        cid, watch = await start(c, "go", agent="tooling")
        async with asyncio.timeout(60):  # `fast` has finished; `slow` is running
            await watch.until("tool_result", lambda d: d["name"] == "fast")
            async with upstream.holds:
                await upstream.holds.wait_for(lambda: upstream.holding == 1)
        await kill(await c.executor(watch.run_id))
        upstream.release.set()
        async with asyncio.timeout(60):
            await watch.task
        seen = parsed(watch.seen)
        whole(watch.seen)
        assert c.effects_seen() == ["fast", "slow"]  # neither ran again
        results = [e["data"] for e in seen if e["event"] == "tool_result"]
        assert [(r["name"], r["is_error"]) for r in results] == [("fast", False), ("slow", True)]
        assert results[1]["error"]["code"] == "interrupted"  # not idempotent: cut off, not run twice
        _, _, settled = assembled([{**e, "data": {k: v for k, v in e["data"].items() if k != "node_id"}}
                                   for e in seen])
        assert all(n == 1 for n in settled.values()), settled
        assert (await transcript(c, cid))[-1]["content"] == "Both done"
        assert len(upstream.requests) == 3  # the two finished requests were not sent again
