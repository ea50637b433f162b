"""Graph agents on the server (graph-workflows.md §8, §10.4–10.6; server-contract.md §3–5): a graph run
streams over SSE like an agent run, pauses durably on approval and input nodes until `POST …/questions/{id}`
answers them, and resumes from its checkpoint after its process died (`POST /api/v1/runs/{id}/resume`, or
by itself with `graph_auto_resume`), ending in the state an uninterrupted run reaches."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from httpx_sse import aconnect_sse

from ringlet import Agent
from ringlet.events import ContentDeltaEvent, MessageStartEvent
from ringlet.graph import Checkpoint, load_graph, to_mermaid
from ringlet.server import ServerSettings, create_app
from ringlet.server.catalog import Catalog, HostedGraph
from ringlet.server.runs.runner import Runner
from ringlet.store import Store
from ringlet.testing import FunctionModel, ScriptedModel
from serving import serving
from test_graph_support import last_user_text, make_graph
from test_recovery import events_until_end, free_port, ringlet_serve
from test_server import new_conversation
from test_server_approvals import client_for

DRAFTER = """
name: drafter
description: Drafts a note, then stamps it with where its script ran.
conversation_starters: [Draft a note]
start: draft
nodes:
  draft: {type: llm, prompt: "Draft: {{initial_prompt}}", state_updates: {note: "{{output}}"}, next: stamp}
  stamp: {type: script, script: scripts/stamp.py, next: done}
  done: {type: end, output: "{{note}} ({{where}})"}
"""
STAMP = "import json, os\nprint(json.dumps({'where': os.path.basename(os.getcwd())}))\n"
REVIEW = """
name: review
start: ask
nodes:
  ask:
    type: approval
    question: "Publish '{{initial_prompt}}'?"
    options: [publish, revise]
    routes: {publish: done, revise: feedback}
    on_other: done
    state_updates: {decision: "{{choice}}"}
  feedback:
    type: input
    question: What should change?
    default: shorter
    validation: "len(input) <= 10"
    state_updates: {wish: "{{input}}"}
    next: done
  done: {type: end, output: "{{decision}}: {{wish}}"}
"""
CRASHY = """
name: {name}
reducers: {{trail: append}}
initial_state: {{n: 0}}
start: first
nodes:
  first: {{type: script, script: first.py, state_updates: {{trail: first}}, next: slow}}
  slow: {{type: script, script: slow.py, state_updates: {{trail: slow}}, next: last}}
  last: {{type: script, script: last.py, state_updates: {{trail: last}}, next: z}}
  z: {{type: end, output: "{{{{n}}}} {{{{trail}}}} {{{{where}}}}"}}
"""
CRASHY_FILES = {
    "first.py": "import json\nprint(json.dumps({'n': 1}))\n",
    # The first time: report the pid to the test's listener, then hang. Replayed: finish at once.
    "slow.py": """
        import json, os, socket, time
        state = json.loads(os.environ["GRAPH_STATE"])
        marker = os.environ["CRASH_MARKER"]
        if not os.path.exists(marker):
            open(marker, "w").close()
            with socket.create_connection(("127.0.0.1", int(os.environ["CRASH_PORT"]))) as s:
                s.sendall(f"{os.getpid()}\\n".encode())
                time.sleep(60)
        print(json.dumps({"n": state["n"] + 10, "where": os.path.basename(os.getcwd())}))
    """,
    "last.py": "import json\nprint(json.dumps({'done': True}))\n",
}


def crashy(root: Path, name: str, port: int) -> Path:
    """A graph whose `slow` script hangs the first time it runs (after telling `port` its pid)."""
    directory = make_graph(root, CRASHY.format(name=name), name=name, files=CRASHY_FILES)
    (directory / ".env").write_text(f"CRASH_MARKER={root / (name + '.marker')}\nCRASH_PORT={port}\n")
    return directory


@asynccontextmanager
async def pid_reports() -> AsyncIterator[tuple[int, asyncio.Queue[int]]]:
    """A loopback listener a hanging script reports its pid to (so the test knows the step is under way)."""
    pids: asyncio.Queue[int] = asyncio.Queue()

    async def report(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        pids.put_nowait(int((await reader.readline()).decode()))
        writer.close()

    listener = await asyncio.start_server(report, "127.0.0.1", 0)
    try:
        yield listener.sockets[0].getsockname()[1], pids
    finally:
        listener.close()


async def checkpoint(store: Store, run_id: str) -> Checkpoint:
    found = await store.checkpoints.decoding(Checkpoint.from_json).load(run_id)
    assert found is not None, f"no checkpoint for {run_id}"
    return found


def data(event: Any) -> dict[str, Any]:
    return json.loads(event.data)


async def follow_message(client: httpx.AsyncClient, cid: str, content: str, seen: list[Any],
                         pauses: asyncio.Queue[None]) -> None:
    """Follow a message's stream to its `message_end`, signalling each `input_required`."""
    async with aconnect_sse(client, "POST", f"/api/v1/chat/conversations/{cid}/messages",
                            json={"content": content}) as source:
        assert source.response.status_code == 200, await source.response.aread()
        async for event in source.aiter_sse():
            if event.event == "ping":
                continue
            seen.append(event)
            if event.event == "status" and data(event)["state"] == "input_required":
                pauses.put_nowait(None)
            if event.event == "message_end":
                return


def end_output(events: list[Any]) -> str:
    """The End node's output: the run's own content deltas (not those inside llm nodes)."""
    return "".join(data(e)["delta"] for e in events if e.event == "content_delta" and "node_id" not in data(e))


# -- in process, on SQLite and PostgreSQL -------------------------------------------------------------------


def drafting(request: Any) -> str:
    return f"Note about {last_user_text(request).removeprefix('Draft: ')}"


@pytest.fixture
async def server(store: Store, tmp_path: Path) -> AsyncIterator[tuple[str, Store, Path]]:
    agents = tmp_path / "agents"
    drafter = make_graph(agents, DRAFTER, name="drafter", files={"scripts/stamp.py": STAMP})
    review = make_graph(agents, REVIEW, name="review")
    plain = Agent(ScriptedModel(["plain answer"]), name="plain")
    catalog = Catalog([HostedGraph.at(drafter, model=FunctionModel(drafting)), HostedGraph.at(review),
                       *Catalog.of([plain]).hosted.values()])
    app = create_app(ServerSettings(ping_interval_s=0.2), store=store, agents=catalog)
    async with serving(app) as url:
        yield url, store, agents


async def test_a_graph_agent_chats_over_sse(server: tuple[str, Store, Path]) -> None:
    url, store, agents = server
    async with await client_for(url, store, "ana", ["chat"]) as ana:
        listed = {a["name"]: a for a in (await ana.get("/api/v1/agents")).json()["data"]}
        assert (listed["drafter"]["kind"], listed["drafter"]["conversation_starters"]) == ("graph", ["Draft a note"])
        assert listed["drafter"]["description"].startswith("Drafts a note")
        cid = (await new_conversation(ana, "drafter"))["id"]
        seen: list[Any] = []
        await follow_message(ana, cid, "release 2.0", seen, asyncio.Queue())
        kinds = [e.event for e in seen]
        assert (kinds[0], kinds[-1]) == ("message_start", "message_end")
        assert kinds.count("message_start") == kinds.count("message_end") == 1
        nodes = [(e.event, data(e)["node_id"]) for e in seen if e.event in ("node_start", "node_end")]
        assert nodes == [("node_start", "draft"), ("node_end", "draft"), ("node_start", "stamp"),
                         ("node_end", "stamp"), ("node_start", "done"), ("node_end", "done")]
        assert [data(e)["next"] for e in seen if e.event == "node_end"] == [["stamp"], ["done"], []]
        assert data(seen[-1])["finish_reason"] == "end_turn"
        # the script ran in the agent's directory (server runs: graph.script_cwd)
        assert end_output(seen) == "Note about release 2.0 (drafter)"
        detail = (await ana.get(f"/api/v1/chat/conversations/{cid}")).json()
        assert detail["conversation"]["status"] == "idle"
        assert [(m["role"], m["content"]) for m in detail["messages"]] == [
            ("user", "release 2.0"), ("assistant", "Note about release 2.0 (drafter)")]
        run_id = data(seen[0])["run_id"]
        run = (await ana.get(f"/api/v1/runs/{run_id}")).json()
        assert (run["kind"], run["status"], run["finish_reason"]) == ("graph", "completed", "end_turn")
        logged = await events_until_end(ana, cid, "0")  # the event log holds exactly what was streamed
        assert [(e.id, e.data) for e in logged] == [(e.id, e.data) for e in seen]
        assert (await checkpoint(store, run_id)).status == "completed"
        no_context = await ana.get(f"/api/v1/chat/conversations/{cid}/context")
        assert (no_context.status_code, no_context.json()["error"]["code"]) == (409, "graph_agent")
        diagram = (await ana.get("/api/v1/agents/drafter/graph")).json()["mermaid"]
        assert diagram == to_mermaid(load_graph(agents / "drafter" / "graph.yaml"))  # what `graph show` prints
        assert diagram.startswith("flowchart TD")
        loop_agent = await ana.get("/api/v1/agents/plain/graph")
        assert (loop_agent.status_code, loop_agent.json()["error"]["code"]) == (404, "agent_not_found")


async def test_approval_and_input_nodes_are_answered_headless(server: tuple[str, Store, Path]) -> None:
    url, store, _ = server
    async with await client_for(url, store, "ana", ["chat"]) as ana:
        cid = (await new_conversation(ana, "review"))["id"]
        seen: list[Any] = []
        pauses: asyncio.Queue[None] = asyncio.Queue()
        stream = asyncio.create_task(follow_message(ana, cid, "v2 notes", seen, pauses))
        await pauses.get()
        asked = next(data(e) for e in seen if e.event == "question")
        assert (asked["node_id"], asked["input_type"], asked["allow_freeform"]) == ("ask", "single-select", True)
        assert [o["label"] for o in asked["options"]] == ["publish", "revise"]
        detail = (await ana.get(f"/api/v1/chat/conversations/{cid}")).json()
        assert detail["conversation"]["status"] == "input_required"
        [pending] = detail["pending"]["questions"]
        assert (pending["question_id"], pending["node_id"], pending["question"]) == (
            asked["question_id"], "ask", "Publish 'v2 notes'?")
        run_id = asked["run_id"]
        assert (await ana.get(f"/api/v1/runs/{run_id}")).json()["status"] == "input_required"
        assert (await checkpoint(store, run_id)).pending_question["question_id"] == asked["question_id"]
        path = f"/api/v1/chat/conversations/{cid}/questions/{asked['question_id']}"
        wrong = await ana.post(path, json={"answer": ["publish", "revise"]})
        assert wrong.status_code == 422, wrong.text
        assert "one string" in wrong.json()["error"]["message"]
        answered = await ana.post(path, json={"answer": "revise"})
        assert answered.json() == {"question_id": asked["question_id"], "status": "answered"}
        await pauses.get()  # the same run goes on to the input node, and pauses again
        feedback = [data(e) for e in seen if e.event == "question"][-1]
        assert (feedback["node_id"], feedback["input_type"], feedback["default"]) == ("feedback", "text", "shorter")
        path = f"/api/v1/chat/conversations/{cid}/questions/{feedback['question_id']}"
        too_long = await ana.post(path, json={"answer": "make it much shorter please"})
        assert too_long.status_code == 422
        assert "Input failed validation 'len(input) <= 10' (got 27 chars)" in too_long.json()["error"]["message"]
        detail = (await ana.get(f"/api/v1/chat/conversations/{cid}")).json()
        assert [q["question_id"] for q in detail["pending"]["questions"]] == [feedback["question_id"]]  # still open
        assert (await ana.post(path, json={"answer": ""})).status_code == 200  # empty: the node's default
        await stream
        kinds = [e.event for e in seen]
        assert kinds.count("message_start") == kinds.count("message_end") == 1  # one message, resumed twice
        assert data(seen[-1])["finish_reason"] == "end_turn"
        assert end_output(seen) == "revise: shorter"
        assert (await ana.post(path, json={"answer": "again"})).status_code == 409
        detail = (await ana.get(f"/api/v1/chat/conversations/{cid}")).json()
        assert detail["conversation"]["status"] == "idle"
        assert [m["content"] for m in detail["messages"]] == ["v2 notes", "revise: shorter"]
        assert (await checkpoint(store, run_id)).state["wish"] == "shorter"


async def test_a_chat_message_answers_an_approval_node_in_free_text(server: tuple[str, Store, Path]) -> None:
    url, store, _ = server
    async with await client_for(url, store, "ana", ["chat"]) as ana:
        cid = (await new_conversation(ana, "review"))["id"]
        first: list[Any] = []
        pauses: asyncio.Queue[None] = asyncio.Queue()
        stream = asyncio.create_task(follow_message(ana, cid, "v3 notes", first, pauses))
        await pauses.get()
        rest: list[Any] = []
        await follow_message(ana, cid, "ship it friday", rest, asyncio.Queue())  # free text: on_other
        await stream
        assert "message_start" not in [e.event for e in rest]  # the same run, resumed
        assert end_output(rest) == "ship it friday: "


async def test_cancelling_a_paused_graph_run_ends_it(server: tuple[str, Store, Path]) -> None:
    url, store, _ = server
    async with await client_for(url, store, "ana", ["chat", "admin"]) as ana:
        cid = (await new_conversation(ana, "review"))["id"]
        seen: list[Any] = []
        pauses: asyncio.Queue[None] = asyncio.Queue()
        stream = asyncio.create_task(follow_message(ana, cid, "v4", seen, pauses))
        await pauses.get()
        run_id = data(seen[0])["run_id"]
        paused = await ana.post(f"/api/v1/runs/{run_id}/resume")
        assert (paused.status_code, paused.json()["error"]["code"]) == (409, "question_pending")
        assert (await ana.post(f"/api/v1/chat/conversations/{cid}/cancel")).json() == {"run_id": run_id}
        await stream
        assert [(e.event, data(e).get("state") or data(e).get("finish_reason")) for e in seen[-2:]] == [
            ("status", "canceled"), ("message_end", "cancelled")]
        run = (await ana.get(f"/api/v1/runs/{run_id}")).json()
        assert (run["status"], run["finish_reason"]) == ("canceled", "cancelled")
        assert (await checkpoint(store, run_id)).status == "canceled"
        assert (await ana.get(f"/api/v1/chat/conversations/{cid}")).json()["conversation"]["status"] == "idle"
        ended = await ana.post(f"/api/v1/runs/{run_id}/resume")
        assert (ended.status_code, ended.json()["error"]["code"]) == (409, "run_not_resumable")


async def test_resume_refuses_what_it_cannot_resume(server: tuple[str, Store, Path]) -> None:
    url, store, _ = server
    async with await client_for(url, store, "ana", ["chat", "admin"]) as ana, \
            await client_for(url, store, "bob", ["chat"]) as bob:
        missing = await ana.post("/api/v1/runs/r_nope/resume")
        assert (missing.status_code, missing.json()["error"]["code"]) == (404, "run_not_found")
        cid = (await new_conversation(ana, "plain"))["id"]
        loop_run = (await ana.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": "hi"},
                                   headers={"Accept": "application/json"})).json()["run_id"]
        refused = await ana.post(f"/api/v1/runs/{loop_run}/resume")
        assert refused.status_code == 409
        assert "only graph runs resume from a checkpoint" in refused.json()["error"]["message"]
        cid = (await new_conversation(ana, "drafter"))["id"]
        graph_run = (await ana.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": "x"},
                                    headers={"Accept": "application/json"})).json()["run_id"]
        done = await ana.post(f"/api/v1/runs/{graph_run}/resume", json={"force": True})
        assert (done.status_code, done.json()["error"]["code"]) == (409, "run_not_resumable")
        assert (await bob.post(f"/api/v1/runs/{graph_run}/resume")).status_code == 403  # needs admin


@pytest.mark.parametrize("auto", [False, True], ids=["by-hand", "auto-resume"])
@pytest.mark.slow
async def test_a_run_left_by_a_stopped_server_resumes_from_its_checkpoint(store: Store, tmp_path: Path,
                                                                          auto: bool) -> None:
    """A graceful stop leaves a working graph run for recovery; the next server resumes it (by hand after
    closing it as interrupted, or by itself) and it ends in the state of an uninterrupted run."""
    async with pid_reports() as (port, pids):
        catalog = Catalog([HostedGraph.at(crashy(tmp_path, "crashy", port))])
        settings = ServerSettings(ping_interval_s=0.2, run_lease_s=0.5, graph_auto_resume=auto)
        async with serving(create_app(settings, store=store, agents=catalog)) as url, \
                await client_for(url, store, "ana", ["chat", "admin"]) as ana:
            cid = (await new_conversation(ana, "crashy"))["id"]
            received: list[Any] = []
            async with aconnect_sse(ana, "POST", f"/api/v1/chat/conversations/{cid}/messages",
                                    json={"content": "go"}) as source:
                async for event in source.aiter_sse():
                    if event.event != "ping":  # keepalives come while the run waits for the queue
                        received.append(event)
                    if event.event == "node_start" and data(event)["node_id"] == "slow":
                        break
            await pids.get()  # the slow script is running: step 2 is under way when the server stops
        run_id = data(received[0])["run_id"]
        assert (await store.runs.get(run_id) or {}).status == "working"  # left for recovery, not ended
        assert (await checkpoint(store, run_id)).frontier == ["slow"]
        catalog = Catalog([HostedGraph.at(tmp_path / "crashy")])
        async with serving(create_app(settings, store=store, agents=catalog)) as url, \
                await client_for(url, store, "ana", ["chat", "admin"]) as ana:
            rest = await events_until_end(ana, cid, received[-1].id)
            if not auto:  # closed as interrupted, then resumed by hand
                assert [(e.event, data(e).get("code")) for e in rest] == [("error", "interrupted"),
                                                                          ("message_end", None)]
                resumed = await ana.post(f"/api/v1/runs/{run_id}/resume")
                assert resumed.status_code == 202, resumed.text
                assert resumed.json() == {"run_id": run_id, "conversation_id": cid, "status": "working"}
                rest = await events_until_end(ana, cid, rest[-1].id)
            assert "error" not in [e.event for e in rest]
            assert data(rest[-1])["finish_reason"] == "end_turn"
            replayed = auto and store.engine.dialect.name == "postgresql"  # a workflow: its log is not repeated
            assert [data(e)["node_id"] for e in rest if e.event == "node_start"] == \
                ["slow", "last", "z"][1 if replayed else 0:]  # slow ran again (its node_start was logged)
            clean = (await ana.post(f"/api/v1/chat/conversations/{(await new_conversation(ana, 'crashy'))['id']}"
                                    "/messages", json={"content": "go"}, headers={"Accept": "application/json"}))
            run = (await ana.get(f"/api/v1/runs/{run_id}")).json()
            assert (run["status"], run["finish_reason"]) == ("completed", "end_turn")
            messages = (await ana.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"]
            assert [m["content"] for m in messages] == ["go", clean.json()["message"]["content"]]
        resumed_state = (await checkpoint(store, run_id)).state
        assert resumed_state == (await checkpoint(store, clean.json()["run_id"])).state
        assert resumed_state["trail"] == ["first", "slow", "last"]
        assert resumed_state["where"] == "crashy"


async def test_an_interrupted_graph_run_keeps_no_llm_node_text_as_its_answer(store: Store) -> None:
    cid = (await store.conversations.create(agent="g")).id
    await store.runs.create("r_dead", agent="g", conversation_id=cid, kind="graph", lease_owner="proc_gone",
                           lease_expires_at="2000-01-01T00:00:00.000Z")
    for event in (MessageStartEvent(run_id="r_dead", ts="t", message_id="m_1", agent="g"),
                  ContentDeltaEvent(run_id="r_dead", ts="t", message_id="m_node", delta="draft", node_id="draft")):
        await store.events.append(cid, event)
    runner = Runner(store, Catalog([]), ServerSettings(graph_auto_resume=True))  # no such agent: closed
    assert await runner.recovery.recover() == 1
    await runner.writer.close()
    assert await store.conversations.load_messages(cid) == []
    assert [(kind, p.get("message_id")) for _, kind, p in await store.events.after(cid, 2)] == [
        ("error", None), ("message_end", "m_1")]
    assert (await store.runs.get("r_dead") or {}).status == "failed"


async def test_checkpoints_in_the_store(store: Store) -> None:
    checkpoints = store.checkpoints.decoding(Checkpoint.from_json)
    cp = Checkpoint(run_id="r_1", graph_hash="h", step=1, state={"a": [1, "é"]}, frontier=["x"],
                    visit_counts={"x": 1}, elapsed_active_s=0.5, agent="g", run={"prompt": "go"})
    await checkpoints.save(cp)
    cp.step, cp.state, cp.status = 2, {"a": {"b": None}}, "input_required"
    cp.pending_question = {"question_id": "q_1", "node_id": "x"}
    await checkpoints.save(cp)  # replaces the run's checkpoint: only the latest is kept
    assert await checkpoints.load("r_1") == cp
    assert (await store.checkpoints.load("r_1"))["step"] == 2  # undecoded: the JSON object
    assert await checkpoints.load("r_none") is None
    day = 24 * 3600
    for run_id, ended in (("r_old", time.time() - 3 * day - 60), ("r_recent", time.time() - day)):
        await checkpoints.save(Checkpoint(run_id=run_id, graph_hash="h", step=3, state={}, frontier=[],
                                          visit_counts={}, elapsed_active_s=1.0, status="completed", ended_at=ended))
    runner = Runner(store, Catalog([]), ServerSettings())
    await runner.recovery.sweep()  # the server's sweep keeps finished runs' checkpoints for 72 h
    await runner.writer.close()
    assert await checkpoints.load("r_old") is None
    assert await checkpoints.load("r_recent") is not None
    assert await checkpoints.load("r_1") is not None  # still running: kept
    assert await checkpoints.prune(older_than_s=3600) == 1
    await checkpoints.delete("r_1")
    assert await checkpoints.load("r_1") is None


# -- a real `ringlet serve`, killed mid-script ---------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("auto", [False, True], ids=["by-hand", "auto-resume"])
@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
async def test_sigkill_mid_script_then_resume(tmp_path: Path, request: pytest.FixtureRequest, engine: str,
                                              auto: bool) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'ringlet.db'}" if engine == "sqlite" else \
        request.getfixturevalue("postgres_url")
    name = f"crash_{engine}_{'auto' if auto else 'hand'}"  # runs left in a shared database stay apart
    async with pid_reports() as (report_port, pids):
        crashy(tmp_path / "agents", name, report_port)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        received: list[Any] = []
        async with ringlet_serve(port, url, tmp_path / "agents") as first, \
                httpx.AsyncClient(base_url=base, timeout=30) as c:
            cid = (await c.post("/api/v1/chat/conversations", json={"agent": name})).json()["id"]
            async with aconnect_sse(c, "POST", f"/api/v1/chat/conversations/{cid}/messages",
                                    json={"content": "go"}) as source:
                async for event in source.aiter_sse():
                    if event.event != "ping":  # keepalives come while the run waits for the queue
                        received.append(event)
                    if event.event == "node_start" and data(event)["node_id"] == "slow":
                        break
            script = await pids.get()  # the script runs: kill the server mid-script
            first.send_signal(signal.SIGKILL)
            await first.wait()
            os.killpg(script, signal.SIGKILL)  # its orphaned script too
    run_id = data(received[0])["run_id"]
    env = {"RINGLET_GRAPH_AUTO_RESUME": "1" if auto else "0"}
    async with ringlet_serve(port, url, tmp_path / "agents", **env), httpx.AsyncClient(base_url=base, timeout=30) as c:
        rest = await events_until_end(c, cid, received[-1].id)
        if not auto:
            assert [e.event for e in rest] == ["error", "message_end"]  # closed as interrupted at startup
            assert (await c.get(f"/api/v1/runs/{run_id}")).json()["status"] == "failed"
            resumed = await c.post(f"/api/v1/runs/{run_id}/resume")
            assert resumed.status_code == 202, resumed.text
            rest = await events_until_end(c, cid, rest[-1].id)
        assert "error" not in [e.event for e in rest]
        if auto and engine == "postgresql":  # a workflow executed again: its message goes on, nothing repeated
            assert "message_start" not in [e.event for e in rest]
            ends = {data(e)["message_id"] for e in rest if e.event == "message_end"}
            assert ends == {data(received[0])["message_id"]}
        else:  # resumed from its checkpoint: the same message again
            assert rest[0].event == "message_start"
            assert data(rest[0])["message_id"] == data(received[0])["message_id"]
        assert data(rest[-1])["finish_reason"] == "end_turn"
        other = (await c.post("/api/v1/chat/conversations", json={"agent": name})).json()["id"]
        clean = (await c.post(f"/api/v1/chat/conversations/{other}/messages", json={"content": "go"},
                              headers={"Accept": "application/json"})).json()
        assert end_output(rest) == clean["message"]["content"] == '11 ["first","slow","last"] ' + name
        assert (await c.get(f"/api/v1/runs/{run_id}")).json()["status"] == "completed"
        again = await c.post(f"/api/v1/runs/{run_id}/resume")
        assert (again.status_code, again.json()["error"]["code"]) == (409, "run_not_resumable")
    store = await Store.open(url)
    try:
        assert (await checkpoint(store, run_id)).state == (await checkpoint(store, clean["run_id"])).state
    finally:
        await store.close()
