"""`ringlet run` with graph agents (graph-workflows.md §8, §10.4): the `▸` progress lines on stderr, the
End output on stdout, and `--resume RUN_ID` after the process was killed mid-script."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ringlet.cli import app
from test_graph_support import EXAMPLES

runner = CliRunner()


def test_a_graph_agent_runs_with_progress_lines(tmp_path: Path) -> None:
    result = runner.invoke(app, ["run", str(EXAMPLES / "poll"), "go"], env={"RINGLET_DATA_DIR": str(tmp_path)})
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "done after 3 polls"
    lines = [line for line in result.stderr.splitlines() if line.startswith("▸ ")]
    assert lines[0].split(" ", 2)[2] == "check (script) start"
    assert lines[1].split(" ", 2)[2].startswith("check (script) done in ")
    assert lines[1].endswith("-> check")
    assert lines[5].endswith("-> done")
    assert lines[-1].split(" ", 2)[2].startswith("done (end) done in")


def test_resume_is_for_graph_runs(tmp_path: Path) -> None:
    result = runner.invoke(app, ["run", "assistant", "--resume", "r_1"], env={"RINGLET_DATA_DIR": str(tmp_path)})
    assert result.exit_code == 2
    assert "--resume continues graph runs" in result.stderr
    neither = runner.invoke(app, ["run", str(EXAMPLES / "poll")])
    assert neither.exit_code == 2
    assert "give a prompt, or --resume RUN_ID" in neither.stderr


SLOW = """\
name: slow
start: first
nodes:
  first: {type: script, script: scripts/first.py, next: wait}
  wait: {type: script, script: scripts/wait.py, next: done}
  done: {type: end, output: "{{result}} after {{runs}} first run(s)"}
"""
FIRST = """\
import json, os, pathlib
marker = pathlib.Path(os.environ["MARKS"]) / "first"
marker.write_text(marker.read_text() + "x" if marker.exists() else "x")
print(json.dumps({"runs": len(marker.read_text())}))
"""
WAIT = """\
import json, os, pathlib, time
go = pathlib.Path(os.environ["MARKS"]) / "go"
while not go.exists():
    time.sleep(0.05)
print(json.dumps({"result": "finished"}))
"""


@pytest.mark.slow
def test_resume_after_the_process_was_killed_mid_script(tmp_path: Path) -> None:
    agent = tmp_path / "slow"
    (agent / "scripts").mkdir(parents=True)
    (agent / "graph.yaml").write_text(SLOW)
    (agent / "scripts" / "first.py").write_text(FIRST)
    (agent / "scripts" / "wait.py").write_text(WAIT)
    marks = tmp_path / "marks"
    marks.mkdir()
    env = {**os.environ, "RINGLET_DATA_DIR": str(tmp_path / "data"), "MARKS": str(marks)}
    command = [sys.executable, "-m", "ringlet", "run", str(agent)]
    with subprocess.Popen([*command, "go", "--events"], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True, start_new_session=True) as first:
        assert first.stdout is not None
        run_id = None
        for line in first.stdout:  # the run's own events tell when the wait script is running
            event = json.loads(line)
            run_id = run_id or event["run_id"]
            if event["type"] == "node_start" and event["node_id"] == "wait":
                os.killpg(first.pid, signal.SIGKILL)  # the CLI and its script, mid-step
                break
        first.wait()
    assert run_id is not None
    (marks / "go").write_text("")
    resumed = subprocess.run([*command, "--resume", run_id], env=env, capture_output=True, text=True, timeout=120,
                             check=False)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.strip() == "finished after 1 first run(s)"  # the finished step was not run again
    progress = [line.split(" ", 2)[2] for line in resumed.stderr.splitlines() if line.startswith("▸ ")]
    assert progress[0] == "wait (script) start"


KB = """\
name: kb
start: find
nodes:
  find: {type: rag, documents: [./knowledge/], query: "{{initial_prompt}}", state_updates: {found: "{{output}}"},
         next: done}
  done: {type: end, output: "{{found}}"}
"""


@pytest.mark.slow
def test_a_missing_knowledge_base_is_offered_on_a_terminal_and_fails_clearly_without_one(tmp_path: Path) -> None:
    import pty

    agent = tmp_path / "kb"
    (agent / "knowledge" / "pets").mkdir(parents=True)
    (agent / "graph.yaml").write_text(KB)
    (agent / "knowledge" / "pets" / "otters.md").write_text("Otters hold hands while they sleep.")
    env = {**os.environ, "RINGLET_DATA_DIR": str(tmp_path / "data"), "RINGLET_DB_URL":
           f"sqlite+aiosqlite:///{tmp_path / 'r.db'}"}
    command = [sys.executable, "-m", "ringlet", "run", str(agent), "otters"]
    headless = subprocess.run(command, check=False, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=120)
    assert headless.returncode == 1
    assert "Agent 'kb' requires RAG for rag node 'find', but its knowledge base is not built" in headless.stderr
    leader, follower = pty.openpty()
    os.write(leader, b"y\n")  # the terminal's answer waits in its buffer until the question reads it
    try:
        asked = subprocess.run(command, check=False, env=env, stdin=follower, capture_output=True, text=True,
                               timeout=120)
    finally:
        os.close(follower)
        os.close(leader)
    assert "Build the knowledge base of rag node 'find' with default settings" in asked.stderr
    assert asked.returncode == 0, asked.stderr
    assert json.loads(asked.stdout)["sources"] == ["knowledge/pets/otters.md"]


ASK = """\
name: ask
start: review
nodes:
  review:
    type: approval
    question: "Publish {{initial_prompt}}?"
    options: [publish, drop]
    routes: {publish: published, drop: dropped}
    on_other: dropped
    state_updates: {decision: "{{choice}}"}
  published: {type: end, output: "published {{initial_prompt}}"}
  dropped: {type: end, output: "dropped: {{decision}}"}
"""


def test_an_approval_node_without_a_terminal_pauses_and_resumes_with_the_printed_command(tmp_path: Path) -> None:
    agent = tmp_path / "ask"
    agent.mkdir()
    (agent / "graph.yaml").write_text(ASK)
    env = {"RINGLET_DATA_DIR": str(tmp_path / "data")}
    paused = runner.invoke(app, ["run", str(agent), "the note"], env=env)  # no terminal: nobody to ask
    assert paused.exit_code == 3, paused.output
    assert "paused: Publish the note?" in paused.stderr
    resume = next(line for line in paused.stderr.splitlines() if line.startswith("resume: "))
    command = shlex.split(resume.removeprefix("resume: ").partition(" --answer ")[0])
    assert command[:2] == ["ringlet", "run"]
    assert resume.endswith("--answer ANSWER (one of: publish, drop, or other text)")
    done = runner.invoke(app, [*command[1:], "--answer", "publish"], env=env)
    assert done.exit_code == 0, done.output
    assert done.stdout.strip() == "published the note"
    again = runner.invoke(app, [*command[1:], "--answer", "publish"], env=env)
    assert again.exit_code == 1  # it ended: nothing to resume
    assert runner.invoke(app, ["run", str(agent), "x", "--answer", "y"], env=env).exit_code == 2


HELLO = """\
name: hello
start: greet
nodes:
  greet: {type: llm, prompt: "Say hello to {{initial_prompt}}.", next: done}
  done: {type: end, output: done}
"""


@pytest.mark.slow
def test_an_llm_node_on_the_embedded_model_shows_its_node_start(tmp_path: Path) -> None:
    """Loading the embedded model silences the process for a moment (llama.cpp points stdout and stderr at
    /dev/null); the llm node's node_start was sent just then, and lost, on stdout and on stderr alike."""
    agent = tmp_path / "hello"
    agent.mkdir()
    (agent / "graph.yaml").write_text(HELLO)
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")} | {"RINGLET_DATA_DIR": str(tmp_path)}
    command = [sys.executable, "-m", "ringlet", "run", str(agent), "Ada", "--model", "local:smollm2"]
    events = subprocess.run([*command, "--events"], env=env, capture_output=True, text=True, timeout=240, check=False)
    assert events.returncode == 0, events.stderr
    framing = [(e["type"], e.get("node_id")) for e in map(json.loads, events.stdout.splitlines())
               if e["type"] in ("node_start", "node_end")]
    assert framing == [("node_start", "greet"), ("node_end", "greet"), ("node_start", "done"), ("node_end", "done")]
    shown = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240, check=False)
    progress = [line.split(" ", 2)[2] for line in shown.stderr.splitlines() if line.startswith("▸ ")]
    assert progress[0] == "greet (llm) start", shown.stderr
