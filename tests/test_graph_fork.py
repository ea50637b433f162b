"""Forking a graph run from any stored checkpoint, its state edited or not (issue 44): the library side
(`GraphAgent.fork`, `ringlet.graph.fork`) and every checkpoint store's history."""

from __future__ import annotations

from pathlib import Path

import pytest

from ringlet.context import Caller
from ringlet.graph import FileCheckpoints, MemoryCheckpoints
from ringlet.graph.fork import ForkError, ForkFrom, StatePatchError
from ringlet.store import Store
from test_graph_support import graph_agent, make_graph

GRAPH = """
name: g
reducers: {trail: append}
initial_state: {n: 0, city: Paris}
start: a
nodes:
  a: {type: script, script: a.sh, state_updates: {trail: a}, next: b}
  b: {type: script, script: b.py, state_updates: {trail: b}, next: c}
  c: {type: script, script: c.py, next: z}
  z: {type: end, output: "{{city}} {{n}} {{trail}}"}
"""
FILES = {
    # every node that runs says so in side.log (in the scripts' working directory): a side effect
    "a.sh": "echo a >> side.log\necho '{}'\n",
    "b.py": "import json, os\nopen('side.log', 'a').write('b\\n')\n"
            "print(json.dumps({'n': json.loads(os.environ['GRAPH_STATE'])['n'] + 1}))\n",
    "c.py": "import json, os, sys\nopen('side.log', 'a').write('c\\n')\nstate = json.loads(os.environ['GRAPH_STATE'])\n"
            "if state['city'] == 'Mars':\n    sys.exit('no route to Mars')\n"
            "print(json.dumps({'n': state['n'] + 10}))\n",
}
SCHEMA_GRAPH = """
name: s
start: ask
nodes:
  ask:
    type: llm
    prompt: "{{initial_prompt}}"
    output_schema: {type: object, properties: {count: {type: integer, minimum: 0}}}
    next: z
  z: {type: end, output: "{{count}}"}
"""


def _agent(tmp_path: Path, checkpoints=None, text: str = GRAPH):
    directory = make_graph(tmp_path, text, files=FILES)
    store = MemoryCheckpoints() if checkpoints is None else checkpoints
    return graph_agent(directory, checkpoints=store, script_cwd=tmp_path)


def _side(tmp_path: Path) -> list[str]:
    path = tmp_path / "side.log"
    return path.read_text().split() if path.exists() else []


async def test_a_fork_starts_at_its_step_with_the_state_edited_and_runs_nothing_before_it(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    original = await agent.run("go", caller=Caller(run_id="r_orig"))
    assert (original.status, original.output) == ("completed", 'Paris 11 ["a","b"]')
    before = await agent.checkpoints("r_orig")
    assert [(c.step, c.frontier, c.status) for c in before] == [
        (0, ["a"], "working"), (1, ["b"], "working"), (2, ["c"], "working"), (3, ["z"], "working"),
        (4, [], "completed")]
    assert _side(tmp_path) == ["a", "b", "c"]

    result = await agent.fork("r_orig", 2, {"city": "Oslo", "n": 5}, caller=Caller(run_id="r_fork"))

    assert (result.run_id, result.status, result.output) == ("r_fork", "completed", 'Oslo 15 ["a","b"]')
    assert _side(tmp_path) == ["a", "b", "c", "c"]  # only the nodes from step 2 on ran again
    forked = await agent.checkpoints("r_fork")
    assert [c.step for c in forked] == [2, 3, 4]
    assert forked[0].state["city"] == "Oslo"
    assert forked[0].run["forked_from"] == {"run_id": "r_orig", "step": 2}
    assert forked[0].run["prompt"] == "go"
    assert [c.to_json() for c in await agent.checkpoints("r_orig")] == [c.to_json() for c in before]


async def test_a_fork_without_a_patch_runs_the_same_way_and_a_fork_of_step_0_runs_everything(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    await agent.run("go", caller=Caller(run_id="r1"))
    again = await agent.fork("r1", 0)
    assert again.output == 'Paris 11 ["a","b"]'
    assert again.run_id != "r1"
    assert _side(tmp_path) == ["a", "b", "c", "a", "b", "c"]


async def test_a_failed_run_is_forked_from_its_last_step_with_the_state_fixed(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    await agent.run("go", caller=Caller(run_id="r1"))
    broken = await agent.fork("r1", 1, {"city": "Mars"}, caller=Caller(run_id="r_mars"))  # a run that fails at c
    assert broken.status == "failed"
    assert broken.error is not None
    assert "no route to Mars" in broken.error["message"]
    last = (await agent.checkpoints("r_mars"))[-1]
    assert (last.step, last.frontier) == (2, ["c"])  # the end did not replace the step it failed on
    fixed = await agent.fork("r_mars", 2, {"city": "Lima"})
    assert (fixed.status, fixed.output) == ("completed", 'Lima 11 ["a","b"]')


@pytest.mark.parametrize(("patch", "key", "words"), [
    ({"citty": "Oslo"}, "citty", "not a key of this graph's state"),
    ({"trail": "x"}, "trail", "reducer 'append'"),
    ({"trail": {}}, "trail", "give an array"),
    ({"n": "five"}, "n", "initial_state gives it a number (0) and no state_updates writes it: give a number"),
])
async def test_a_patch_that_does_not_fit_the_state_names_the_key_and_the_fix(tmp_path: Path, patch, key,
                                                                             words) -> None:
    agent = _agent(tmp_path)
    await agent.run("go", caller=Caller(run_id="r1"))
    with pytest.raises(StatePatchError) as caught:
        await agent.fork("r1", 2, patch)
    assert caught.value.problems[0][0] == key
    assert words in caught.value.problems[0][1]
    assert _side(tmp_path) == ["a", "b", "c"]  # nothing ran


async def test_a_patch_is_checked_against_an_output_schema_property(tmp_path: Path) -> None:
    from ringlet.testing import ScriptedModel

    directory = make_graph(tmp_path, SCHEMA_GRAPH, name="s")
    agent = graph_agent(directory, model=ScriptedModel(['{"count": 2}', '{"count": 3}']))
    await agent.run("go", caller=Caller(run_id="r1"))
    with pytest.raises(StatePatchError, match="output_schema of node 'ask'"):
        await agent.check_fork(ForkFrom("r1", 1, {"count": -1}))
    checkpoint = await agent.check_fork(ForkFrom("r1", 1, {"count": 7}))
    assert checkpoint.frontier == ["z"]
    assert (await agent.fork("r1", 1, {"count": 7})).output == "7"


async def test_unknown_ended_and_changed_checkpoints_are_refused(tmp_path: Path) -> None:
    store = MemoryCheckpoints()
    agent = _agent(tmp_path, store)
    await agent.run("go", caller=Caller(run_id="r1"))
    with pytest.raises(ForkError, match="no checkpoint at step 9; its checkpoints are steps 0, 1, 2, 3, 4") as e:
        await agent.fork("r1", 9)
    assert e.value.code == "checkpoint_not_found"
    with pytest.raises(ForkError, match="nothing is left to run") as e:
        await agent.fork("r1", 4)
    assert e.value.code == "checkpoint_ended"
    with pytest.raises(ForkError) as e:
        await agent.fork("r_never", 0)
    assert e.value.code == "checkpoint_not_found"
    changed = _agent(tmp_path, store, GRAPH.replace("{{city}} {{n}}", "{{n}} in {{city}}"))
    with pytest.raises(ForkError, match="graph changed since checkpoint") as e:
        await changed.fork("r1", 3)
    assert e.value.code == "graph_changed"
    assert (await changed.fork("r1", 3, force=True)).output == '11 in Paris ["a","b"]'


async def test_a_store_that_keeps_only_the_latest_checkpoint_cannot_fork(tmp_path: Path) -> None:
    class Latest(MemoryCheckpoints):
        load_step = None  # type: ignore[assignment]

    agent = _agent(tmp_path, Latest())
    await agent.run("go", caller=Caller(run_id="r1"))
    with pytest.raises(ForkError, match="keeps only each run's latest") as e:
        await agent.fork("r1", 1)
    assert e.value.code == "no_history"


async def test_file_checkpoints_keep_every_step_and_forget_them_with_the_run(tmp_path: Path) -> None:
    store = FileCheckpoints(tmp_path / "runs", clock=lambda: 1e12)
    agent = _agent(tmp_path, store)
    await agent.run("go", caller=Caller(run_id="r1"))
    assert [c.step for c in await store.history("r1")] == [0, 1, 2, 3, 4]
    second = await store.load_step("r1", 2)
    assert second is not None
    assert second.frontier == ["c"]
    forked = await agent.fork("r1", 3, {"city": "Rome"})
    assert forked.output == 'Rome 11 ["a","b"]'
    assert await store.prune(older_than_s=0) == 2
    assert await store.history("r1") == []
    assert list((tmp_path / "runs").iterdir()) == []


async def test_the_store_keeps_every_step_in_the_same_save_and_prunes_and_deletes_them(tmp_path: Path) -> None:
    from ringlet.graph import Checkpoint

    store = await Store.open(f"sqlite:///{tmp_path / 'r.db'}")
    try:
        checkpoints = store.checkpoints.decoding(Checkpoint.from_json)
        agent = _agent(tmp_path, checkpoints)
        await agent.run("go", caller=Caller(run_id="r1"))
        await agent.run("go", caller=Caller(run_id="r2"))
        assert [(c.step, c.status) for c in await checkpoints.history("r1")] == [
            (0, "working"), (1, "working"), (2, "working"), (3, "working"), (4, "completed")]
        assert (await checkpoints.load_step("r1", 1)).state["trail"] == ["a"]
        assert await checkpoints.load_step("r1", 7) is None
        result = await agent.fork("r1", 1, {"n": 100})
        assert result.output == 'Paris 111 ["a","b"]'
        await checkpoints.delete("r2")
        assert await checkpoints.history("r2") == []
        assert await checkpoints.prune(older_than_s=-60) == 2  # r1 and the fork ended
        assert await checkpoints.history("r1") == []
        assert await checkpoints.history(result.run_id) == []
    finally:
        await store.close()
