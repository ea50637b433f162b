"""`ringlet graph checkpoints` and `ringlet graph fork` (issue 44): the runs `ringlet run` kept, one run's
checkpoints, and a fork from one of them with its state edited by `--set key=JSON`."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ringlet.cli import app
from test_graph_fork import FILES, GRAPH
from test_graph_support import make_graph

runner = CliRunner()


@pytest.fixture
def ran(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str, dict[str, str]]:
    """A graph run by `ringlet run` (scripts run in the caller's directory: tmp_path): its directory, its run id."""
    monkeypatch.chdir(tmp_path)
    directory = make_graph(tmp_path, GRAPH, files=FILES)
    env = {"RINGLET_DATA_DIR": str(tmp_path / "data")}
    result = runner.invoke(app, ["run", str(directory), "go", "--json"], env=env)
    assert result.exit_code == 0, result.output
    return directory, json.loads(result.stdout)["run_id"], env


def test_checkpoints_lists_runs_and_a_runs_steps(ran: tuple[Path, str, dict[str, str]], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    directory, run_id, env = ran
    runs = runner.invoke(app, ["graph", "checkpoints"], env=env)
    assert runs.exit_code == 0, runs.output
    assert run_id in runs.stdout
    listed = runner.invoke(app, ["graph", "checkpoints", run_id, "--json"], env=env)
    assert listed.exit_code == 0, listed.output
    lines = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [(c["step"], c["frontier"]) for c in lines] == [(0, ["a"]), (1, ["b"]), (2, ["c"]), (3, ["z"]), (4, [])]
    state = runner.invoke(app, ["graph", "checkpoints", run_id, "--step", "2"], env=env)
    assert json.loads(state.stdout) == {"n": 1, "city": "Paris", "initial_prompt": "go", "trail": ["a", "b"]}
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # where its name ("g") finds no agent
    table = runner.invoke(app, ["graph", "checkpoints", run_id], env=env)
    assert "(end)" in table.stdout
    hint = next(line for line in table.stderr.splitlines() if line.startswith("fork: "))
    command = shlex.split(hint.removeprefix("fork: ").replace("STEP", "2").removesuffix(" [--set key=JSON]"))
    assert command[:4] == ["ringlet", "graph", "fork", str(directory.resolve())]  # run by path: its path
    forked = runner.invoke(app, command[1:], env=env)  # the hint works as printed
    assert forked.exit_code == 0, forked.output
    assert forked.stdout.strip() == 'Paris 11 ["a","b"]'  # c ran again from step 2
    unknown = runner.invoke(app, ["graph", "checkpoints", "r_nope"], env=env)
    assert unknown.exit_code == 2
    assert "no checkpoints kept for run 'r_nope'" in unknown.stderr


def test_fork_starts_at_the_checkpoint_with_the_state_set(ran: tuple[Path, str, dict[str, str]],
                                                          tmp_path: Path) -> None:
    directory, run_id, env = ran
    result = runner.invoke(app, ["graph", "fork", str(directory), run_id, "--checkpoint", "2", "--set", "city=Oslo",
                                 "--set", "n=5"], env=env)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == 'Oslo 15 ["a","b"]'
    assert f"fork of {run_id} at step 2: run r" in result.stderr
    assert (tmp_path / "side.log").read_text().split() == ["a", "b", "c", "c"]  # a and b did not run again


def test_fork_refuses_a_patch_that_does_not_fit(ran: tuple[Path, str, dict[str, str]]) -> None:
    directory, run_id, env = ran
    bad = runner.invoke(app, ["graph", "fork", str(directory), run_id, "-c", "2", "--set", "trail=x"], env=env)
    assert bad.exit_code == 2
    assert "--set trail: has reducer 'append'" in bad.stderr
    ended = runner.invoke(app, ["graph", "fork", str(directory), run_id, "-c", "4"], env=env)
    assert ended.exit_code == 2
    assert "nothing is left to run" in ended.stderr
    assert f"ringlet graph checkpoints {run_id}" in ended.stderr
