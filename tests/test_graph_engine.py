"""The executor (graph-workflows.md §4, §5, §8, §10.6): templates, reducers, super-steps, limits, events."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from ringlet.context import Caller
from ringlet.errors import RunError
from ringlet.graph.engine import Engine
from ringlet.graph.reducers import diff, merge_writes, reduce
from ringlet.graph.templates import TemplateError, reads, render
from ringlet.testing import FunctionModel
from test_graph_support import graph_agent, make_graph, of_type, run_graph, types

STATE = {"s": "text", "n": 3, "f": 1.5, "t": True, "z": None, "list": [1, {"x": "y"}], "obj": {"a": [1, 2]},
         "uni": "é"}


# -- templates ---------------------------------------------------------------------------------------------


def test_rendering_rules() -> None:
    assert render("{{s}}|{{n}}|{{f}}|{{t}}|{{z}}", STATE) == "text|3|1.5|true|null"
    assert render("{{list}} {{obj}}", STATE) == '[1,{"x":"y"}] {"a":[1,2]}'
    assert render("{{list[1].x}} {{obj.a[0]}} {{uni}}", STATE) == "y 1 é"
    assert render("{{ s }} {{s|upper}} {{s:1}} {s}", STATE) == "{{ s }} {{s|upper}} {{s:1}} {s}"


def test_strict_templates_name_every_missing_key() -> None:
    with pytest.raises(TemplateError) as info:
        render("{{a}} {{s}} {{list[5]}} {{a}} {{obj.b}}", STATE)
    assert info.value.message == "Template interpolation failed: 'a', 'list[5]', 'obj.b' not found in state"


def test_lenient_templates_leave_missing_keys_empty() -> None:
    assert render("[{{a}}] [{{s.x}}] [{{s}}]", STATE, strict=False) == "[] [] [text]"


def test_reads() -> None:
    assert reads("{{a.b}} {{c[0]}} {{ d }} {{e}}") == {"a", "c", "e"}


# -- reducers --------------------------------------------------------------------------------------------------


def test_reducers() -> None:
    assert reduce("append", "k", None, 1, present=False) == [1]
    assert reduce("append", "k", [1], [2], present=True) == [1, [2]]
    assert reduce("extend", "k", [1], [2, 3], present=True) == [1, 2, 3]
    assert reduce("extend", "k", None, [2], present=False) == [2]
    assert reduce("concat", "k", "", "a", present=True) == "a"
    assert reduce("concat", "k", "a", "b", present=True) == "a\nb"
    assert reduce("sum", "k", 1, 2, present=True) == 3
    assert reduce("sum", "k", 1.5, "1.5", present=True) == 3
    assert isinstance(reduce("sum", "k", 1.5, 1.5,
                                                                                  present=True), int)
    assert reduce("sum", "k", 1, 0.5, present=True) == 1.5
    assert reduce("max", "k", 4, "7", present=True) == 7
    assert reduce("min", "k", 4, 7, present=True) == 4
    assert reduce("merge", "k", {"a": 1, "b": 1}, {"b": 2}, present=True) == {"a": 1, "b": 2}
    assert reduce("overwrite", "k", 1, 2, present=True) == 2


@pytest.mark.parametrize(("name", "current", "write", "message"), [
    ("append", "s", 1, "reducer 'append' requires an array (or absent) for key 'k', got string"),
    ("extend", [1], 2, "reducer 'extend' requires an array to extend with for key 'k', got number"),
    ("concat", "a", 1, "reducer 'concat' requires strings for key 'k', got number"),
    ("sum", 1, "x", "reducer 'sum' requires a number for key 'k', got string"),
    ("merge", {}, [1], "reducer 'merge' requires objects for key 'k', got array"),
])
def test_reducer_type_errors(name: str, current: Any, write: Any, message: str) -> None:
    with pytest.raises(RunError) as info:
        reduce(name, "k", current, write, present=True)
    assert info.value.message == message


def test_writes_and_merge_order() -> None:
    assert diff({"a": 1, "b": [1]}, {"a": 1, "b": [1, 2], "c": None}) == {"b": [1, 2], "c": None}
    state = {"log": []}
    merge_writes(state, [("b", {"log": "b", "last": "b"}), ("a", {"log": "a"}), ("c", {"last": "c"})],
                 {"log": "append", "last": "overwrite"})
    assert state == {"log": ["a", "b"], "last": "c"}
    with pytest.raises(RunError, match=r"^Key 'k' was written by 2 parallel branches but has no reducer declared$"):
        merge_writes({}, [("a", {"k": 1}), ("b", {"k": 1})], {})


# -- super-steps -------------------------------------------------------------------------------------------------


SEE = "import json, os\ns = json.loads(os.environ['GRAPH_STATE'])\nprint(json.dumps({'saw_' + os.environ['RINGLET_NODE_ID']: sorted(s)}))\n"  # noqa: E501


async def test_siblings_see_only_the_pre_step_state(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, """
        name: g
        start: fan
        nodes:
          fan: {type: script, script: see.py, next: [b, c]}
          b: {type: script, script: see.py, state_updates: {from_b: "1"}, next: z}
          c: {type: script, script: see.py, state_updates: {from_c: "1"}, next: z}
          z: {type: end, output: done}
    """, files={"see.py": SEE})
    _, result = await run_graph(graph_agent(directory))
    assert result.state["saw_b"] == result.state["saw_c"] == ["initial_prompt", "saw_fan"]
    assert result.state["from_b"] == result.state["from_c"] == "1"


async def test_parallel_writes_without_a_reducer_fail_at_run_time(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, """
        name: g
        start: fan
        nodes:
          fan: {type: script, script: one.sh, next: [b, c]}
          b: {type: script, script: same.sh, state_updates: {b: "1"}, next: z}
          c: {type: script, script: same.sh, state_updates: {c: "1"}, next: z}
          z: {type: end, output: done}
    """, files={"one.sh": "echo '{}'\n", "same.sh": "echo \"{\\\"who\\\": \\\"$RINGLET_NODE_ID\\\"}\"\n"})
    _, result = await run_graph(graph_agent(directory))
    assert result.error["message"] == "Key 'who' was written by 2 parallel branches but has no reducer declared"


async def test_joins_are_not_barriers(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, """
        name: g
        reducers: {trail: append}
        start: a
        nodes:
          a: {type: script, script: ok.sh, next: [short, long]}
          short: {type: script, script: ok.sh, state_updates: {trail: short}, next: join}
          long: {type: script, script: ok.sh, state_updates: {trail: long}, next: longer}
          longer: {type: script, script: ok.sh, state_updates: {trail: longer}, next: join}
          join: {type: script, script: ok.sh, state_updates: {trail: "join"}, next: tail}
          tail: {type: script, script: ok.sh, state_updates: {trail: "tail"}, next: z}
          z: {type: end, output: "{{trail}}"}
    """, files={"ok.sh": "echo '{}'\n"})
    events, result = await run_graph(graph_agent(directory))
    joins = [(e.step, e.visit) for e in of_type(events, "node_start") if e.node_id == "join"]
    assert joins == [(3, 1), (4, 2)]  # once for each path length
    assert result.state["trail"] == ["long", "short", "join", "longer", "join", "tail"]  # node-id order per step


async def test_an_end_target_wins_and_two_ends_fail(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, """
        name: g
        start: a
        nodes:
          a: {type: script, script: ok.sh, state_updates: {x: "1"}, next: [b, z]}
          b: {type: script, script: ok.sh, state_updates: {ran_b: "1"}, next: z}
          z: {type: end, output: "x={{x}}"}
    """, files={"ok.sh": "echo '{}'\n"})
    events, result = await run_graph(graph_agent(directory))
    assert result.output == "x=1"
    assert "ran_b" not in result.state
    assert [e.node_id for e in of_type(events, "node_start")] == ["a", "z"]
    directory = make_graph(tmp_path, """
        name: g2
        start: a
        nodes:
          a: {type: script, script: ok.sh, state_updates: {x: "1"}, next: [y, z]}
          y: {type: end, output: y}
          z: {type: end, output: z}
    """, name="g2", files={"ok.sh": "echo '{}'\n"})
    _, result = await run_graph(graph_agent(directory))
    assert result.error["message"] == ("super-step ended with multiple End targets (y, z). Fan-out branches must "
                                       "converge before ending")


def test_an_empty_frontier_fails(tmp_path: Path) -> None:
    agent = graph_agent(make_graph(tmp_path, "name: g\nstart: z\nnodes: {z: {type: end, output: x}}\n"))
    engine = Engine.__new__(Engine)
    engine.spec = agent.spec
    with pytest.raises(RunError, match=r"^frontier emptied without reaching an End node$"):
        engine._next_frontier([])


async def test_no_route_at_run_time_is_not_caught_by_fallback(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, """
        name: g
        settings: {validate_before_run: false}
        start: a
        nodes:
          a: {type: script, script: ok.sh, fallback: z}
          z: {type: end, output: x}
    """, files={"ok.sh": "echo '{}'\n"})
    _, result = await run_graph(graph_agent(directory))
    assert result.error["message"] == "Graph 'g' failed at node 'a': script node 'a' has no 'next' and is not an " \
                                      "end node"


async def test_visit_cap(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, """
        name: g
        settings: {max_loop_iterations: 3}
        start: a
        nodes:
          a: {type: script, script: again.sh, next: z}
          z: {type: end, output: x}
    """, files={"again.sh": "echo '{\"_next\": \"a\"}'\n"})
    events, result = await run_graph(graph_agent(directory))
    assert result.error["message"] == "Node 'a' visited 4 times (max_loop_iterations=3). Possible infinite loop."
    assert len(of_type(events, "node_start")) == 3


async def test_initial_state_and_initial_prompt(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, """
        name: g
        initial_state: {initial_prompt: old, raw: "{{initial_prompt}}", nested: {n: [1]}}
        start: z
        nodes:
          z: {type: end, output: "{{initial_prompt}} {{raw}} {{nested.n[0]}}"}
    """)
    _, result = await run_graph(graph_agent(directory), "new")
    assert result.output == "new {{initial_prompt}} 1"
    assert result.state["nested"] == {"n": [1]}


async def test_state_updates_are_strings_and_scoped_variables_leave_no_trace(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, """
        name: g
        initial_state: {choice: before}
        start: ask
        nodes:
          ask:
            type: approval
            question: q
            options: [go]
            routes: {go: num}
            on_other: num
            state_updates: {picked: "{{choice}}", flag: "{{missing}}"}
          num:
            type: script
            script: n.sh
            state_updates: {as_text: "{{n}}"}
            next: z
          z: {type: end, output: "{{picked}}"}
    """, files={"n.sh": "echo '{\"n\": 5}'\n"})
    _, result = await run_graph(graph_agent(directory, approver=lambda q: "go"))
    assert result.state == {"choice": "before", "initial_prompt": "go", "picked": "go", "flag": "", "n": 5,
                            "as_text": "5"}


async def test_max_concurrency_bounds_a_step(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, """
        name: g
        settings: {max_concurrency: 1}
        start: fan
        nodes:
          fan: {type: script, script: ok.sh, next: [a, b, c]}
          a: {type: script, script: ok.sh, state_updates: {a: "1"}, next: z}
          b: {type: script, script: ok.sh, state_updates: {b: "1"}, next: z}
          c: {type: script, script: ok.sh, state_updates: {c: "1"}, next: z}
          z: {type: end, output: x}
    """, files={"ok.sh": "echo '{}'\n"})
    events, _ = await run_graph(graph_agent(directory))
    step2 = [(e.type, e.node_id) for e in events if e.type in ("node_start", "node_end") and e.step == 2]
    assert [t for t, _ in step2] == ["node_start", "node_end"] * 3  # one at a time


async def test_event_stream_framing(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, """
        name: g
        start: a
        nodes:
          a: {type: script, script: ok.sh, next: z}
          z: {type: end, output: "the result"}
    """, files={"ok.sh": "echo '{}'\n"})
    events, result = await run_graph(graph_agent(directory), caller=Caller(conversation_id="c_1"))
    assert types(events) == ["message_start", "status", "node_start", "node_end", "node_start", "node_end",
                             "content_delta", "status", "message_end"]
    start, end = events[0], events[-1]
    assert (start.agent, start.conversation_id) == ("g", "c_1")
    assert (end.finish_reason, end.message_id) == ("end_turn", start.message_id)
    assert events[-3].delta == "the result"
    assert events[-3].message_id == start.message_id
    assert [e.state for e in of_type(events, "status")] == ["working", "completed"]
    node_start, node_end = events[2], events[3]
    assert node_start.model_dump() | {"ts": None, "run_id": None} == {
        "type": "node_start", "node_id": "a", "node_type": "script", "step": 1, "visit": 1, "ts": None,
        "run_id": None}
    assert (node_end.outcome, node_end.next, node_end.node_type) == ("ok", ("z",), "script")
    assert node_end.duration_ms > 0
    assert "error" not in node_end.model_dump()
    assert {e.run_id for e in events} == {result.run_id}
    assert [m.role for m in result.messages] == ["user", "assistant"]
    assert result.messages[1].content == "the result"
    assert result.messages[1].id == start.message_id
    assert result.to_dict()["output"] == "the result"


async def test_end_without_output_gives_empty_result(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, "name: g\nstart: z\nnodes: {z: {type: end, state_updates: {k: v}}}\n")
    events, result = await run_graph(graph_agent(directory))
    assert result.output == ""
    assert result.state["k"] == "v"
    assert "content_delta" not in types(events)


# -- the whole-run timeout -------------------------------------------------------------------------------------------


async def test_timeout_during_a_step_kills_the_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from test_graph_support import EXAMPLES

    pid_file = tmp_path / "pid"
    monkeypatch.setenv("SLOW_PID_FILE", str(pid_file))
    events, result = await run_graph(graph_agent(EXAMPLES / "deadline"))
    assert result.error["message"] == "Graph 'deadline' timed out after 1s during super-step with frontier [slow]"
    assert result.error["code"] == "timeout"
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    (cancelled,) = of_type(events, "node_end")
    assert (cancelled.node_id, cancelled.outcome, cancelled.error) == ("slow", "failed", "cancelled")


async def test_timeout_interrupts_an_llm_node(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, """
        name: g
        settings: {timeout: 0.2}
        start: a
        nodes:
          a: {type: llm, prompt: p, fallback: z, next: z}
          z: {type: end, output: x}
    """)
    never = asyncio.Event()

    async def stuck(request: Any) -> str:
        await never.wait()
        return "late"

    events, result = await run_graph(graph_agent(directory, model=FunctionModel(stuck)))
    assert result.error["message"] == "Graph 'g' timed out after 0.2s during super-step with frontier [a]"
    assert types(events)[-3:] == ["error", "status", "message_end"]


async def test_timeout_before_a_step(tmp_path: Path) -> None:
    """A run resumed with its active time already spent times out before its next step."""
    directory = make_graph(tmp_path, """
        name: g
        settings: {timeout: 5}
        start: fan
        nodes:
          fan: {type: script, script: ok.sh, next: [b, c]}
          b: {type: script, script: ok.sh, state_updates: {b: "1"}, next: z}
          c: {type: script, script: ok.sh, state_updates: {c: "1"}, next: z}
          z: {type: end, output: x}
    """, files={"ok.sh": "echo '{}'\n"})
    agent = graph_agent(directory)
    store = agent.runtime.checkpoints
    _, done = await run_graph(agent)
    cp = done.checkpoint
    cp.status, cp.step, cp.frontier, cp.elapsed_active_s, cp.ended_at = "working", 1, ["b", "c"], 5.5, None
    await store.save(cp)
    result = await agent.resume(cp.run_id)
    assert result.error["message"] == "Graph 'g' timed out after 5s before super-step with frontier [b, c]"


async def test_a_humans_wait_does_not_count(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, """
        name: g
        settings: {timeout: 0.3}
        start: ask
        nodes:
          ask: {type: input, question: q, state_updates: {said: "{{input}}"}, next: z}
          z: {type: end, output: "{{said}}"}
    """)

    async def slow(question: Any) -> str:
        await asyncio.sleep(0.5)  # a slow human, not a synchronisation
        return "patient"

    _, result = await run_graph(graph_agent(directory, approver=slow))
    assert result.output == "patient"


async def test_log_state_snapshots(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    directory = make_graph(tmp_path, "name: g\nstart: z\ninitial_state: {k: 1}\nnodes: {z: {type: end}}\n")
    with caplog.at_level(1, "ringlet.graph"):
        await run_graph(graph_agent(directory), "hi")
    assert "[graph:g] [z] state: " in caplog.text
    assert "bytes, keys=[k, initial_prompt]" in caplog.text
    assert json.dumps({"k": 1, "initial_prompt": "hi"}) in caplog.text
    caplog.clear()
    quiet = make_graph(tmp_path, "name: q\nstart: z\nsettings: {log_state_snapshots: false}\nnodes: {z: {type: end}}\n",
                       name="q")
    with caplog.at_level(1, "ringlet.graph"):
        await run_graph(graph_agent(quiet), "hi")
    assert "state:" not in caplog.text
