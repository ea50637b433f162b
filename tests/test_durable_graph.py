"""Durable graph runs on DBOS (issue 18): each node call of a super-step is a step of the run's workflow, so a
worker killed mid super-step loses only the node that was running; a graph paused on a question waits in its
workflow, and the answer posted to the API process wakes it on a worker."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from helpers import eventually
from test_durable import Upstream, cluster, kill, start, text, watch_cid, whole
from test_graph_server import pid_reports
from test_graph_support import make_graph

pytestmark = pytest.mark.slow

FANOUT = """
name: fanout
reducers: {trail: append}
initial_state: {n: 0}
start: first
nodes:
  first: {type: script, script: first.py, state_updates: {trail: first}, next: [quick, slow]}
  quick: {type: script, script: quick.py, state_updates: {trail: quick}, next: last}
  slow: {type: script, script: slow.py, state_updates: {trail: slow}, next: last}
  last: {type: end, output: "{{n}} {{q}} {{trail}}"}
"""
FANOUT_FILES = {
    "first.py": "import json\nprint(json.dumps({'n': 1}))\n",
    # A side effect, and done: it must happen once however often its worker dies afterwards.
    "quick.py": """
        import json, os
        with open(os.environ["EFFECTS"], "a") as f:
            f.write(f"quick {os.getpid()}\\n")
        print(json.dumps({"q": "quick-done"}))
    """,
    # The first time: report the pid to the test's listener, then hang. Run again: finish at once.
    "slow.py": """
        import json, os, socket, time
        state = json.loads(os.environ["GRAPH_STATE"])
        with open(os.environ["EFFECTS"], "a") as f:
            f.write(f"slow {os.getpid()}\\n")
        marker = os.environ["CRASH_MARKER"]
        if not os.path.exists(marker):
            open(marker, "w").close()
            with socket.create_connection(("127.0.0.1", int(os.environ["CRASH_PORT"]))) as s:
                s.sendall(f"{os.getpid()}\\n".encode())
                time.sleep(60)
        print(json.dumps({"n": state["n"] + 10}))
    """,
}

ASKING = """
name: asking
start: ask
nodes:
  ask: {type: input, question: "Which colour?", state_updates: {colour: "{{input}}"}, next: paint}
  paint: {type: script, script: paint.py, next: z}
  z: {type: end, output: "painted {{colour}} by {{painter}}"}
"""
ASKING_FILES = {"paint.py": "import json, os\nprint(json.dumps({'painter': os.getppid()}))\n"}


async def test_a_worker_killed_mid_super_step_loses_only_the_node_that_was_running(tmp_path: Path,
                                                                                   postgres_url: str) -> None:
    """`quick` and `slow` run in one super-step; `quick` has finished (its step recorded) when the worker dies
    while `slow` runs: another worker goes on, `quick` does not run again, `slow` does, and the merged state
    is what an uninterrupted run makes."""
    async with pid_reports() as (port, pids):
        directory = make_graph(tmp_path / "agents", FANOUT, name="fanout", files=FANOUT_FILES)
        (directory / ".env").write_text(f"CRASH_MARKER={tmp_path / 'fanout.marker'}\nCRASH_PORT={port}\n")
        async with cluster(tmp_path, postgres_url, Upstream(lambda messages: text("unused"))) as c:
            _, watch = await start(c, "go", agent="fanout")
            async with asyncio.timeout(60):
                await pids.get()  # `slow` hangs on a worker
                await watch.until("node_end", lambda d: d["node_id"] == "quick")  # and `quick` is done,
                await eventually(lambda: c.step_recorded(watch.run_id, "node quick"))  # its step recorded
            victim = await c.executor(watch.run_id)
            await kill(victim)
            async with asyncio.timeout(60):
                await watch.task
            whole(watch.seen)
            started = sorted(json.loads(e.data)["node_id"] for e in watch.seen if e.event == "node_start")
            assert started == ["first", "last", "quick", "slow"]  # each sent once (the log has no duplicate)
            assert c.effects_seen().count("quick") == 1  # its side effect once: its step was replayed
            assert c.effects_seen().count("slow") == 2  # in flight at the kill: it ran again
            ended = [json.loads(e.data) for e in watch.seen if e.event == "node_end"]
            assert [e["node_id"] for e in ended if e["node_id"] == "slow"] == ["slow"]
            assert json.loads(watch.seen[-1].data)["finish_reason"] == "end_turn"
            assert (await c.run_record(watch.run_id))["status"] == "completed"
            messages = (await c.client.get(f"/api/v1/chat/conversations/{watch_cid(watch)}")).json()["messages"]
            assert messages[-1]["content"] == '11 quick-done ["first","quick","slow"]'


async def test_a_graph_paused_on_a_question_is_woken_on_a_worker_by_an_answer_to_the_api_process(
        tmp_path: Path, postgres_url: str) -> None:
    """The paused graph run's workflow waits for the answer; posted to the API process (which executes no
    runs), it wakes the run on a worker, in the same run and message."""
    make_graph(tmp_path / "agents", ASKING, name="asking", files=ASKING_FILES)
    async with cluster(tmp_path, postgres_url, Upstream(lambda messages: text("unused"))) as c:
        cid, watch = await start(c, "go", agent="asking")
        async with asyncio.timeout(60):
            asked = await watch.until("question")
            await watch.until("status", lambda d: d["state"] == "input_required")
        path = f"/api/v1/chat/conversations/{cid}/questions/{asked['question_id']}"
        answered = await c.client.post(path, json={"answer": "blue"})
        assert answered.status_code == 200, answered.text
        async with asyncio.timeout(60):
            await watch.task
        whole(watch.seen)
        assert [e.event for e in watch.seen].count("message_start") == 1
        messages = (await c.client.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"]
        painter = int(messages[-1]["content"].rsplit(" ", 1)[1])
        assert messages[-1]["content"] == f"painted blue by {painter}"
        assert painter in {w.pid for w in c.workers}  # a worker's script, not the API process's
        assert (await c.run_record(watch.run_id))["status"] == "completed"
