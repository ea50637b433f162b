"""Checkpoints and resume (graph-workflows.md §10.4), including a run killed mid-step in another process."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ringlet.errors import ConfigError
from ringlet.graph import Checkpoint, FileCheckpoints, MemoryCheckpoints
from test_graph_support import graph_agent, make_graph, run_graph

SRC = Path(__file__).resolve().parent.parent / "src"

CRASHY = """
name: crashy
reducers: {trail: append}
initial_state: {n: 0}
start: first
nodes:
  first: {type: script, script: first.py, state_updates: {trail: first}, next: slow}
  slow: {type: script, script: slow.py, state_updates: {trail: slow}, next: last}
  last: {type: script, script: last.sh, state_updates: {trail: last}, next: z}
  z: {type: end, output: "{{n}} {{trail}}"}
"""
FILES = {
    "first.py": "import json\nprint(json.dumps({'n': 1}))\n",
    # The first time: say so through the FIFO (with the pid), then hang. Afterwards (replayed): finish at once.
    "slow.py": """
        import json, os, time
        state = json.loads(os.environ["GRAPH_STATE"])
        marker = os.environ["CRASH_MARKER"]
        if not os.path.exists(marker):
            open(marker, "w").close()
            with open(os.environ["CRASH_FIFO"], "w") as fifo:
                fifo.write(f"{os.getpid()}\\n")
            time.sleep(60)
        print(json.dumps({"n": state["n"] + 10}))
    """,
    "last.sh": "echo '{\"done\": true}'\n",
}
DRIVER = """
import asyncio, json, sys
from ringlet import Caller
from ringlet.graph import FileCheckpoints, load_agent

directory, runs, run_id, mode = sys.argv[1:5]
agent = load_agent(directory, checkpoints=FileCheckpoints(runs))
if mode == "run":
    result = asyncio.run(agent.run("go", caller=Caller(run_id=run_id)))
else:
    result = asyncio.run(agent.resume(run_id))
print(json.dumps({"status": result.status, "output": result.output, "state": result.state}))
"""


def _driver(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", DRIVER, *args], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(SRC), **env}, start_new_session=True)


def _finish(process: subprocess.Popen[str]) -> dict:
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0, out
    return json.loads(out)


def _wait_for_line(fifo: Path, process: subprocess.Popen[str]) -> str:
    """The first line written to the FIFO; if the process dies first, opening a writer ends the wait."""

    def unblock() -> None:
        process.wait()
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    threading.Thread(target=unblock, daemon=True).start()
    with open(fifo) as reader:
        return reader.readline().strip()


@pytest.mark.slow
def test_a_run_killed_during_a_script_resumes_to_the_same_state(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, CRASHY, name="crashy", files=FILES)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    env = {"CRASH_MARKER": str(tmp_path / "marker"), "CRASH_FIFO": str(fifo)}
    runs = str(tmp_path / "runs")

    first = _driver(str(directory), runs, "r_crash", "run", env=env)
    script_pid = int(_wait_for_line(fifo, first))  # the slow script is running: step 2 is under way
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    os.kill(script_pid, signal.SIGKILL)  # a crash leaves the script behind; do not leave it here
    checkpoint = json.loads((tmp_path / "runs" / "r_crash.json").read_text())
    assert (checkpoint["step"], checkpoint["frontier"], checkpoint["status"]) == (1, ["slow"], "working")
    assert checkpoint["state"] == {"n": 1, "initial_prompt": "go", "trail": ["first"]}

    resumed = _finish(_driver(str(directory), runs, "r_crash", "resume", env=env))

    clean_env = {**env, "CRASH_MARKER": str(tmp_path / "marker")}  # the marker exists: no pause this time
    uninterrupted = _finish(_driver(str(directory), str(tmp_path / "other"), "r_clean", "run", env=clean_env))
    assert resumed == uninterrupted
    assert resumed["output"] == '11 ["first","slow","last"]'
    assert resumed["state"]["done"] is True


async def test_a_checkpoint_after_every_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    saved: list[tuple[int, list[str], str]] = []

    class Recording(MemoryCheckpoints):
        async def save(self, checkpoint: Checkpoint) -> None:
            saved.append((checkpoint.step, list(checkpoint.frontier), checkpoint.status))
            await super().save(checkpoint)

    directory = make_graph(tmp_path, CRASHY, name="crashy", files=FILES)
    (tmp_path / "marker").touch()
    monkeypatch.setenv("CRASH_MARKER", str(tmp_path / "marker"))
    store = Recording()
    _, result = await run_graph(graph_agent(directory, checkpoints=store))
    assert saved == [(0, ["first"], "working"), (1, ["slow"], "working"), (2, ["last"], "working"),
                     (3, ["z"], "working"), (4, [], "completed")]
    cp = await store.load(result.run_id)
    assert cp is not None
    assert cp.output == result.output
    assert cp.ended_at is not None
    assert cp.node_stats["slow"]["runs"] == 1
    assert cp.visit_counts == {"first": 1, "slow": 1, "last": 1, "z": 1}
    assert set(json.loads(cp.to_json())) >= {"run_id", "graph_hash", "step", "state", "frontier", "visit_counts",
                                             "elapsed_active_s", "pending_question", "node_stats"}
    assert len(store) == 1  # only the latest checkpoint of a run is kept


async def test_a_changed_graph_blocks_resume_unless_forced(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, """
        name: g
        start: ask
        nodes:
          ask: {type: input, question: q, state_updates: {said: "{{input}}"}, next: z}
          z: {type: end, output: "{{said}}"}
    """)
    store = FileCheckpoints(tmp_path / "runs")
    _, paused = await run_graph(graph_agent(directory, checkpoints=store))
    graph = directory / "graph.yaml"
    graph.write_text(graph.read_text().replace("{{said}}", "said {{said}}"))
    changed = graph_agent(directory, checkpoints=store)
    with pytest.raises(ConfigError, match="graph changed since checkpoint"):
        await changed.resume(paused.run_id, answer="hi")
    result = await changed.resume(paused.run_id, answer="hi", force=True)
    assert result.output == "said hi"
    with pytest.raises(ConfigError, match="already ended"):
        await changed.resume(paused.run_id, force=True)
    with pytest.raises(ConfigError, match="no checkpoint for run 'r_nope'"):
        await changed.resume("r_nope")


async def test_retention_and_atomic_files(tmp_path: Path) -> None:
    store = FileCheckpoints(tmp_path / "runs")
    old = Checkpoint("r_old", "h", 3, {}, [], {}, 1.0, status="completed", ended_at=time.time() - 73 * 3600)
    live = Checkpoint("r_live", "h", 1, {"k": [1]}, ["a"], {"a": 1}, 0.5)
    for cp in (old, live):
        await store.save(cp)
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [
        "r_live.json", "r_live.steps.jsonl", "r_old.json", "r_old.steps.jsonl"]  # every step's too (forks)
    assert await store.prune() == 1
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["r_live.json", "r_live.steps.jsonl"]
    assert await store.load("r_old") is None
    assert (await store.load("r_live")) == live
    memory = MemoryCheckpoints()
    await memory.save(old)
    await memory.save(live)
    assert await memory.prune() == 1
    assert await memory.load("r_live") == live
    with pytest.raises(ValueError, match="not a run id"):
        await store.load("../escape")
