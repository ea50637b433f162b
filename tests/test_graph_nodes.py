"""Node types (graph-workflows.md §3, §7, §10.2–§10.3, §10.7): llm, agent, approval, input, rag, map."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest

from ringlet.agent import Agent
from ringlet.errors import AuthError, RateLimitError, ServerError
from ringlet.graph import Question
from ringlet.graph.agent import InvalidAnswer
from ringlet.models.base import TextDelta
from ringlet.testing import Chunks, FunctionModel, Reply, ScriptedModel, call
from test_graph_support import by_prompt, graph_agent, make_graph, of_type, run_graph

LLM = """
name: g
temperature: 0.4
top_p: 0.9
global_tools: [calculate, current_time]
start: a
nodes:
  a:
    type: llm
    instructions: "Be {{mood}}."
    prompt: "Work on {{initial_prompt}}"
    tools: [calculate]
    state_updates: {said: "{{output}}"}
    next: z
  z: {type: end, output: "{{said}}"}
"""


# -- llm ---------------------------------------------------------------------------------------------------------


async def test_llm_node_runs_on_the_loop_with_only_its_tools(tmp_path: Path) -> None:
    model = ScriptedModel([Reply("Let me compute.", [call("calculate", expression="6*7")]), "It is 42."])
    directory = make_graph(tmp_path, LLM.replace("start: a", "initial_state: {mood: brief}\nstart: a"))
    events, result = await run_graph(graph_agent(directory, model=model), "the sum", history=["ignored"])
    model.assert_complete()
    assert result.output == "Let me compute.\nIt is 42."  # every assistant text, joined
    first = model.requests[0]
    assert [t.name for t in first.tools] == ["calculate"]  # not current_time, and no terminal tool
    assert (first.settings.temperature, first.settings.top_p) == (0.4, 0.9)
    assert first.instructions == "Be brief."
    assert [m.text for m in first.messages] == ["Work on the sum"]  # fresh: no history
    inner = [e for e in events if e.type in ("content_delta", "tool_call_start", "tool_result")][:-1]
    assert inner
    assert all(e.node_id == "a" and e.run_id == result.run_id for e in inner)
    assert [e.type for e in events].count("message_start") == 1


async def test_llm_node_model_and_sampling_precedence(tmp_path: Path) -> None:
    seen: list[Any] = []

    def models(name: str) -> Any:
        seen.append(name)
        return ScriptedModel(["ok"], name=name)

    directory = make_graph(tmp_path, """
        name: g
        model: openai:graph-default
        temperature: 0.4
        start: a
        nodes:
          a: {type: llm, prompt: p, model: "openai:own", temperature: 0.1, next: b}
          b: {type: llm, prompt: p, next: z}
          z: {type: end, output: done}
    """)
    agent = graph_agent(directory, models=models)
    _, result = await run_graph(agent)
    assert result.status == "completed"
    assert seen == ["openai:own", "openai:graph-default"]
    a, b = (agent.runtime._agents[n].model for n in ("a", "b"))
    assert a.requests[0].settings.temperature == 0.1
    assert b.requests[0].settings.temperature == 0.4


async def test_llm_fallback_gets_the_error_as_output(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, """
        name: g
        start: a
        nodes:
          a: {type: llm, prompt: p, fallback: sorry, state_updates: {why: "{{output}}"}, next: z}
          sorry: {type: end, output: "sorry: {{why}}"}
          z: {type: end, output: fine}
    """)
    model = ScriptedModel([AuthError("bad key", status=401)])
    events, result = await run_graph(graph_agent(directory, model=model))
    assert result.output == "sorry: LLM node failed: bad key"
    end = of_type(events, "node_end")[0]
    assert (end.outcome, end.next, end.error) == ("fallback", ("sorry",), "bad key")


async def test_llm_failure_without_fallback(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, "name: g\nstart: a\nnodes:\n  a: {type: llm, prompt: p, next: z}\n"
                                     "  z: {type: end, output: x}\n")
    _, result = await run_graph(graph_agent(directory, model=ScriptedModel([AuthError("bad key", status=401)])))
    assert result.error["message"] == ("Graph 'g' failed at node 'a': LLM node failed and no fallback declared: "
                                       "bad key")


async def test_llm_max_iterations_is_an_error(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, """
        name: g
        global_tools: [calculate]
        start: a
        nodes:
          a: {type: llm, prompt: p, tools: [calculate], max_iterations: 2, next: z}
          z: {type: end, output: x}
    """)
    model = ScriptedModel([call("calculate", expression="1"), call("calculate", expression="2"), "never"])
    _, result = await run_graph(graph_agent(directory, model=model))
    assert result.error["message"].endswith("llm node hit max_iterations (2) before LLM concluded")
    assert model.remaining == 1  # no graceful final answer


async def test_llm_attempts_retry_empty_and_interrupted_output_only(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, "name: g\nstart: a\nnodes:\n  a: {type: llm, prompt: p, max_attempts: 3,"
                                     " state_updates: {o: '{{output}}'}, next: z}\n  z: {type: end, output: '{{o}}'}\n")
    model = ScriptedModel(["", Chunks([TextDelta("half"), ServerError("reset", status=502)]), "whole"])
    _, result = await run_graph(graph_agent(directory, model=model))
    assert result.output == "whole"
    model.assert_complete()
    transient = ScriptedModel([RateLimitError("slow down", status=429), "never"])
    _, result = await run_graph(graph_agent(directory, model=transient))
    assert result.error["message"].endswith("LLM node failed and no fallback declared: slow down")
    assert transient.remaining == 1  # a provider-layer error is not retried again
    empty = ScriptedModel(["", "", ""])
    _, result = await run_graph(graph_agent(directory, model=empty))
    assert result.error["message"].endswith("LLM node failed and no fallback declared: produced no output")


async def test_llm_timeout_covers_all_attempts(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, "name: g\nstart: a\nnodes:\n  a: {type: llm, prompt: p, timeout: 0.2, "
                                     "max_attempts: 5, next: z}\n  z: {type: end, output: x}\n")
    never = asyncio.Event()

    async def stuck(request: Any) -> str:
        await never.wait()
        return "late"

    _, result = await run_graph(graph_agent(directory, model=FunctionModel(stuck)))
    assert result.error["message"].endswith("no fallback declared: llm node timed out after 0.2s")


async def test_llm_unknown_tool_at_run_time(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, """
        name: g
        settings: {validate_before_run: false}
        global_tools: [calculate]
        start: a
        nodes:
          a: {type: llm, prompt: p, tools: [nope], next: z}
          z: {type: end, output: x}
    """)
    _, result = await run_graph(graph_agent(directory, model=ScriptedModel([])))
    assert result.error["message"].endswith(
        "LLM node failed and no fallback declared: llm node references unknown tool 'nope'. Agent 'g' provides: "
        "calculate")


SCHEMA = """
name: g
start: a
nodes:
  a:
    type: llm
    {instructions}
    prompt: "Extract"
    output_schema:
      type: object
      properties: {{n: {{type: integer}}, tags: {{type: array, items: {{type: string}}}}}}
      required: [n]
    fallback: sorry
    state_updates: {{out: "{{{{output}}}}"}}
    next: z
  sorry: {{type: end, output: "{{{{out}}}}"}}
  z: {{type: end, output: "{{{{n}}}} {{{{out}}}}"}}
"""


async def test_output_schema_parses_merges_typed_and_hints(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, SCHEMA.format(instructions="instructions: Be exact."))
    model = ScriptedModel(['<think>hmm {"n": "x"}</think>\n```json\n{"n": 3, "tags": ["a"]}\n```'])
    _, result = await run_graph(graph_agent(directory, model=model))
    assert result.state["n"] == 3
    assert result.state["tags"] == ["a"]
    assert result.output == '3 {"n":3,"tags":["a"]}'
    request = model.requests[0]
    assert request.instructions.startswith("Be exact.\n\nAnswer with only a JSON value that matches this JSON Schema")
    assert request.messages[0].text == "Extract"
    no_instructions = make_graph(tmp_path, SCHEMA.format(instructions=""), name="g2")
    model = ScriptedModel(['{"n": 1}'])
    await run_graph(graph_agent(no_instructions, model=model))
    assert model.requests[0].instructions.startswith("Answer with only a JSON value")  # typed output's hint
    assert model.requests[0].messages[0].text == "Extract"


async def test_output_schema_repair_request(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, SCHEMA.format(instructions=""))
    model = ScriptedModel(['{"n": "three", "tags": [1]}', '{"n": 3}'])
    _, result = await run_graph(graph_agent(directory, model=model))
    assert result.state["n"] == 3
    repair = model.requests[1]  # the same conversation, told what was wrong (typed output's retry)
    assert repair.tools == ()
    assert [m.role for m in repair.messages] == ["user", "assistant", "user"]
    assert repair.messages[1].text == '{"n": "three", "tags": [1]}'
    text = repair.messages[2].text
    assert "n: 'three' is not of type 'integer'" in text
    assert "tags/0: 1 is not of type 'string'" in text


async def test_output_schema_still_failing_takes_the_fallback(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, SCHEMA.format(instructions=""))
    model = ScriptedModel(["not json", '{"tags": []}'])
    _, result = await run_graph(graph_agent(directory, model=model))
    assert result.output == ("LLM node failed: output_schema validation failed: (root): 'n' is a required "
                             "property")


# -- agent ---------------------------------------------------------------------------------------------------------


AGENT = """
name: g
start: a
nodes:
  a:
    type: agent
    agent: helper
    prompt: "Help with {{initial_prompt}}"
    timeout: 0.3
    state_updates: {got: "{{output}}"}
    next: z
  z: {type: end, output: "{{got}}"}
"""


def resolver(children: dict[str, Any]) -> Any:
    return lambda name: children[name]


async def test_agent_node_runs_the_child_and_nests_its_events(tmp_path: Path) -> None:
    child_model = ScriptedModel(["child answer"])
    child = Agent(child_model, name="helper")
    directory = make_graph(tmp_path, AGENT)
    events, result = await run_graph(graph_agent(directory, resolver=resolver({"helper": child}),
                                                 checks=None), "x")
    assert result.output == "child answer"
    assert child_model.requests[0].messages[0].text == "Help with x"
    nested = [e for e in events if e.agent_path]
    assert {e.agent_path for e in nested} == {("g", "helper")}
    assert {e.depth for e in nested} == {1}
    assert next(e.type for e in nested) == "message_start"
    assert [e.type for e in nested][-1] == "message_end"
    assert all(e.node_id == "a" for e in nested)


async def test_agent_node_failures_are_fatal(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, AGENT)
    failing = Agent(ScriptedModel([AuthError("denied", status=403)]), name="helper")
    _, result = await run_graph(graph_agent(directory, resolver=resolver({"helper": failing})))
    assert result.error["message"] == "Graph 'g' failed at node 'a': Agent 'helper' failed: denied"
    never = asyncio.Event()

    async def stuck(request: Any) -> str:
        await never.wait()
        return "late"

    slow = Agent(FunctionModel(stuck), name="helper")
    _, result = await run_graph(graph_agent(directory, resolver=resolver({"helper": slow})))
    assert result.error["message"] == "Graph 'g' failed at node 'a': Agent 'helper' timed out after 0.3s"


async def test_an_agent_node_whose_model_says_nothing_fails(tmp_path: Path) -> None:
    """The loop's fixed "no answer" sentence is not the child's output (graph state gets no filler text)."""
    mute = Agent(ScriptedModel(["", " ", ""]), name="helper")
    _, result = await run_graph(graph_agent(make_graph(tmp_path, AGENT), resolver=resolver({"helper": mute})))
    assert result.error["message"] == "Graph 'g' failed at node 'a': Agent 'helper' failed: its model gave no answer"


async def test_agent_node_output_schema(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, AGENT.replace("    timeout: 0.3\n", "    output_schema: {type: object, "
                                                   "properties: {k: {type: integer}}, required: [k]}\n"))
    model = ScriptedModel(["k is 5", '{"k": 5}'])  # the repair goes to the child's own model
    child = Agent(model, name="helper")
    _, result = await run_graph(graph_agent(directory, resolver=resolver({"helper": child})))
    assert result.state["k"] == 5
    assert result.output == '{"k":5}'
    assert model.requests[1].tools == ()
    assert "k is 5" in model.requests[1].messages[0].text
    child = Agent(ScriptedModel(["no", "still no"]), name="helper")
    _, result = await run_graph(graph_agent(directory, resolver=resolver({"helper": child})))
    assert result.error["message"].startswith("Graph 'g' failed at node 'a': output_schema validation failed: ")


async def test_a_graph_child_returns_its_end_output(tmp_path: Path) -> None:
    make_graph(tmp_path, """
        name: inner
        start: s
        nodes:
          s: {type: script, script: s.sh, next: z}
          z: {type: end, output: "inner got {{initial_prompt}}"}
    """, name="inner", files={"s.sh": "echo '{}'\n"})
    directory = make_graph(tmp_path, AGENT.replace("agent: helper", "agent: inner"))
    events, result = await run_graph(graph_agent(directory), "y")
    assert result.output == "inner got Help with y"
    nested = [e for e in events if e.agent_path and e.type == "node_start"]
    assert [(e.agent_path, e.node_id, e.depth) for e in nested] == [(("g", "inner"), "s", 1),
                                                                     (("g", "inner"), "z", 1)]


async def test_agent_depth_is_limited(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, """
        name: rec
        start: a
        nodes:
          a: {type: agent, agent: rec, prompt: "deeper", next: z}
          z: {type: end, output: x}
    """, name="rec")
    events, result = await run_graph(graph_agent(directory))
    assert "Max agent depth exceeded (4/3)" in result.error["message"]
    assert max(e.depth or 0 for e in events) == 3


# -- approval and input -----------------------------------------------------------------------------------------------


APPROVAL = """
name: g
start: ask
nodes:
  ask:
    type: approval
    question: "Ship {{initial_prompt}}?"
    options: [Yes, No]
    routes: {Yes: shipped, No: held}
    on_other: other
    state_updates: {choice_made: "{{choice}}"}
  shipped: {type: end, output: "shipped"}
  held: {type: end, output: "held"}
  other: {type: end, output: "other: {{choice_made}}"}
"""


@pytest.mark.parametrize(("answer", "output"), [("Yes", "shipped"), ("No", "held"), ("yes", "other: yes"),
                                                ("maybe later", "other: maybe later")])
async def test_approval_routes_exact_matches_and_other(tmp_path: Path, answer: str, output: str) -> None:
    asked: list[Question] = []

    async def approver(question: Question) -> str:
        asked.append(question)
        return answer

    events, result = await run_graph(graph_agent(make_graph(tmp_path, APPROVAL), approver=approver), "v2")
    assert result.output == output
    (question,) = asked
    assert (question.question, question.options, question.allow_freeform, question.input_type) == \
        ("Ship v2?", ("Yes", "No"), True, "single-select")
    event = of_type(events, "question")[0]
    assert (event.node_id, event.input_type, [o.label for o in event.options], event.allow_freeform) == \
        ("ask", "single-select", ["Yes", "No"], True)
    states = [e.state for e in of_type(events, "status")]
    assert states == ["working", "input_required", "working", "completed"]


INPUT = """
name: g
start: ask
nodes:
  ask:
    type: input
    question: "Name for {{initial_prompt}}?"
    default: "{{fallback_name}}-default"
    validation: "len(input) <= 6"
    state_updates: {name: "{{input}}"}
    next: z
  z: {type: end, output: "{{name}}"}
"""


async def test_input_default_before_validation_and_bytes(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, INPUT)
    _, result = await run_graph(graph_agent(directory, approver=lambda q: ""))
    # the empty answer became the default ("-default", lenient: 8 bytes) before it was validated
    assert result.error["message"].endswith("Input failed validation 'len(input) <= 6' (got 8 chars)")
    _, result = await run_graph(graph_agent(directory, approver=lambda q: "ééé"))
    assert result.output == "ééé"  # 6 bytes
    _, result = await run_graph(graph_agent(directory, approver=lambda q: "éééé"))
    assert result.error["message"] == ("Graph 'g' failed at node 'ask': Input failed validation 'len(input) <= 6' "
                                       "(got 8 chars)")
    events, _ = await run_graph(graph_agent(directory, approver=lambda q: "ok"), "app")
    event = of_type(events, "question")[0]
    assert (event.question, event.input_type, event.default) == ("Name for app?", "text", "-default")
    assert "validation" not in event.model_dump()


async def test_headless_questions_pause_and_resume(tmp_path: Path) -> None:
    agent = graph_agent(make_graph(tmp_path, INPUT))
    events, paused = await run_graph(agent, "app")
    assert paused.status == "input_required"
    assert paused.finish_reason is None
    assert [e.type for e in events][-2:] == ["question", "status"]
    assert "message_end" not in [e.type for e in events]
    question = paused.pending_question
    assert paused.checkpoint.pending_question["question_id"] == question.question_id
    with pytest.raises(InvalidAnswer, match=r"Input failed validation 'len\(input\) <= 6' \(got 7 chars\)"):
        await agent.resume(paused.run_id, answer="toolong")
    resumed = agent.resume_stream(paused.run_id, answer="bob")
    events = [e async for e in resumed]
    assert resumed.result.output == "bob"
    assert next(e.type for e in events) == "status"
    assert events[-1].type == "message_end"
    assert "question" not in [e.type for e in events]  # the same question is not asked again


async def test_without_a_human_questions_can_fail(tmp_path: Path) -> None:
    agent = graph_agent(make_graph(tmp_path, APPROVAL), on_question="fail")
    _, result = await run_graph(agent)
    assert result.error["message"] == ("Graph 'g' failed at node 'ask': approval node 'ask' needs a human answer, "
                                       "but there is no terminal or server to ask")


# -- rag --------------------------------------------------------------------------------------------------------------


RAG = """
name: g
start: find
nodes:
  find:
    type: rag
    documents: ["docs/*.md"]
    query: "{{initial_prompt}}"
    top_k: 1
    chunk_size: 200
    chunk_overlap: 20
    state_updates: {ctx: "{{output.context}}", src: "{{output.sources}}"}
    next: z
  z: {type: end, output: "{{src}}: {{ctx}}"}
"""


async def test_rag_builds_at_load_queries_and_rebuilds_on_change(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, RAG, files={"docs/otters.md": "Sea otters sleep holding hands in a raft.",
                                                 "docs/herons.md": "Grey herons strike fish in shallow water."})
    store = f"sqlite+aiosqlite:///{tmp_path / 'kb.db'}"
    agent = graph_agent(directory, store=store)
    with pytest.raises(Exception, match=r"^Agent 'g' requires RAG for rag node 'find', but its knowledge base is "
                                        r"not built and the node does not fully specify how to build it$"):
        await agent.prepare()
    asked: list[str] = []
    agent = graph_agent(directory, store=store, confirm_rag=lambda q: asked.append(q) or True)
    _, result = await run_graph(agent, "otters")
    assert asked
    assert result.output == '["docs/otters.md"]: Sea otters sleep holding hands in a raft.'
    await agent.aclose()
    again = graph_agent(directory, store=store)  # built: no confirmation needed
    assert (await again.run("herons")).output.startswith('["docs/herons.md"]')
    kb = again.runtime.knowledge("find")
    assert await kb.ensure_built() is False
    (directory / "docs/herons.md").write_text("Grey herons now also eat frogs.")
    assert await kb.ensure_built() is True
    assert (await again.run("frogs")).output == '["docs/herons.md"]: Grey herons now also eat frogs.'
    await again.aclose()


# -- map ---------------------------------------------------------------------------------------------------------------


MAP = """
name: g
initial_state: {{xs: [3, 1, 2], text: "not a list"}}
start: m
nodes:
  m:
    type: map
    over: "{over}"
    as: x
    branch: b
    collect_into: ys
    {extra}
    next: z
  b: {branch}
  z: {{type: end, output: "{{{{ys}}}}"}}
"""


def map_graph(tmp_path: Path, branch: str, over: str = "{{xs}}", extra: str = "", **kw: Any) -> Path:
    return make_graph(tmp_path, MAP.format(over=over, branch=branch, extra=extra), **kw)


async def test_map_collects_in_input_order(tmp_path: Path) -> None:
    model = by_prompt({"item 3": "three", "item 1": "one", "item 2": "two"})
    directory = map_graph(tmp_path, '{type: llm, prompt: "item {{x}}"}')
    events, result = await run_graph(graph_agent(directory, model=model))
    assert result.state["ys"] == ["three", "one", "two"]
    items = [e for e in of_type(events, "node_end") if e.node_id == "b"]
    assert sorted(e.item_index for e in items) == [0, 1, 2]
    assert all(e.next == () for e in items)
    assert "x" not in result.state  # only collect_into is written back


async def test_map_results_by_precedence(tmp_path: Path) -> None:
    explicit = map_graph(tmp_path, '{type: script, script: s.sh, state_updates: {output: "n{{x}}"}}',
                         files={"s.sh": "echo '{\"output\": \"ignored\"}'\n"})
    assert (await graph_agent(explicit).run("go")).state["ys"] == ["n3", "n1", "n2"]
    stdout = map_graph(tmp_path, "{type: script, script: s.py}", extra="output_key: doubled", name="g2",
                       files={"s.py": "import json, os\nx = json.loads(os.environ['GRAPH_STATE'])['x']\n"
                                      "print(json.dumps({'doubled': x * 2}))\n"})
    assert (await graph_agent(stdout).run("go")).state["ys"] == [6, 2, 4]
    schema = map_graph(tmp_path, "{type: llm, prompt: 'n {{x}}', output_schema: {type: object, properties: "
                                 "{v: {type: integer}}}}", name="g3")
    model = by_prompt({"n 3": '{"v": 3}', "n 1": '{"v": 1}', "n 2": '{"v": 2}'})
    _, result = await run_graph(graph_agent(schema, model=model))
    assert result.state["ys"] == [{"v": 3}, {"v": 1}, {"v": 2}]
    assert "v" not in result.state
    missing = map_graph(tmp_path, "{type: script, script: s.sh}", name="g4", files={"s.sh": "echo '{}'\n"})
    _, result = await run_graph(graph_agent(missing))
    # every item fails alike; they run at once, so whichever fails first is named
    assert re.search(r"map node 'm': item \[[012]\] produced no 'output'", result.error["message"]), result.error


async def test_map_over_rules_and_empty_lists(tmp_path: Path) -> None:
    empty = map_graph(tmp_path, "{type: llm, prompt: p}", over="{{none}}")
    _, result = await run_graph(graph_agent(empty, model=ScriptedModel([])))
    assert "Template interpolation failed: 'none' not found in state" in result.error["message"]
    text = map_graph(tmp_path, "{type: llm, prompt: p}", over="{{text}}", name="g2")
    _, result = await run_graph(graph_agent(text, model=ScriptedModel([])))
    assert result.error["message"].endswith("map node 'm': 'over' must resolve to an array, got string")
    literal = map_graph(tmp_path, "{type: llm, prompt: p}", over="items: {{xs}}", name="g3")
    _, result = await run_graph(graph_agent(literal, model=ScriptedModel([])))
    assert result.error["message"].endswith("'over' must resolve to an array, got string")
    nothing = make_graph(tmp_path, MAP.format(over="{{xs}}", branch="{type: llm, prompt: p}", extra="")
                         .replace("xs: [3, 1, 2]", "xs: []"), name="g4")
    _, result = await run_graph(graph_agent(nothing, model=ScriptedModel([])))
    assert result.state["ys"] == []
    assert result.output == "[]"


async def test_map_item_failure_fails_the_map_and_fallback_is_unused(tmp_path: Path) -> None:
    directory = map_graph(tmp_path, "{type: script, script: s.py, fallback: z}",
                          files={"s.py": "import json, os, sys\nx = json.loads(os.environ['GRAPH_STATE'])['x']\n"
                                         "sys.exit(1) if x == 1 else print(json.dumps({'output': x}))\n"})
    _, result = await run_graph(graph_agent(directory))
    assert result.error["message"].startswith("Graph 'g' failed at node 'm': map node 'm': item [1] failed: "
                                              "Script 's.py' failed with exit code 1")


async def test_map_concurrency(tmp_path: Path) -> None:
    running, peak = 0, 0
    gate = asyncio.Event()

    async def answer(request: Any) -> str:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        if peak == 2:
            gate.set()
        await gate.wait()
        running -= 1
        return "ok"

    directory = map_graph(tmp_path, "{type: llm, prompt: p}", extra="max_concurrency: 2")
    _, result = await run_graph(graph_agent(directory, model=FunctionModel(answer)))
    assert result.state["ys"] == ["ok"] * 3
    assert peak == 2


async def test_state_dump_is_json(tmp_path: Path) -> None:
    directory = map_graph(tmp_path, "{type: llm, prompt: p}")
    _, result = await run_graph(graph_agent(directory, model=by_prompt({}, default="ok")))
    json.dumps(result.to_dict())


async def test_llm_node_with_an_mcp_server(tmp_path: Path) -> None:
    import sys

    server = Path(sys.executable).parent / "mcp-server-time"
    directory = make_graph(tmp_path, """
        name: g
        mcp_servers: [time]
        global_tools: [calculate]
        start: a
        nodes:
          a: {type: llm, prompt: "What time is it?", tools: ["mcp:time"], state_updates: {t: "{{output}}"}, next: z}
          z: {type: end, output: "{{t}}"}
    """, files={"mcp.json": json.dumps({"mcpServers": {"time": {"command": str(server)}}})})
    model = ScriptedModel([call("get_current_time", timezone="UTC"), "It is now."])
    agent = graph_agent(directory, model=model)
    try:
        events, result = await run_graph(agent)
    finally:
        await agent.aclose()
    assert result.output == "It is now."
    assert {t.name for t in model.requests[0].tools} == {"get_current_time", "convert_time"}
    (tool_result,) = of_type(events, "tool_result")
    assert not tool_result.is_error
    assert '"timezone": "UTC"' in tool_result.result


def test_reasoning_effort_reaches_openai_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ringlet.models import providers

    seen: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(providers, "resolve_model",
                        lambda name, **options: seen.append((name, options)) or ScriptedModel([], name=name))
    directory = make_graph(tmp_path, """
        name: g
        model: openai:o4-mini
        reasoning_effort: low
        start: a
        nodes:
          a: {type: llm, prompt: p, next: b}
          b: {type: llm, prompt: p, reasoning_effort: high, next: c}
          c: {type: llm, prompt: p, model: "anthropic:claude", next: z}
          z: {type: end, output: x}
    """)
    agent = graph_agent(directory, checks=None)
    for node_id in ("a", "b", "c"):
        agent.runtime.node_agent(node_id, agent.spec.nodes[node_id])
    assert seen == [("openai:o4-mini", {"extra_body": {"reasoning_effort": "low"}}),
                    ("openai:o4-mini", {"extra_body": {"reasoning_effort": "high"}}),
                    ("anthropic:claude", {})]


async def test_rag_document_sources(tmp_path: Path) -> None:
    from ringlet.errors import ConfigError
    from ringlet.memory.documents import load_documents

    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.md").write_text("alpha")
    assert await load_documents(["text:notes/*.md", "notes/a.md"], tmp_path) == [("notes/a.md", "alpha")] * 2
    with pytest.raises(ConfigError, match=r"unknown loader 'pdf' \(supported: text, file\)"):
        await load_documents(["pdf:notes/a.pdf"], tmp_path)
    assert await load_documents(["missing/*.md"], tmp_path) == []  # an empty glob adds nothing (a warning)
    with pytest.raises(ConfigError, match=r"rag document 'gone\.md' does not exist: no file or directory .*gone"):
        await load_documents(["gone.md"], tmp_path)
    with pytest.raises(ConfigError, match=r"cannot fetch: 127\.0\.0\.1 resolves to a private address"):
        await load_documents(["http://127.0.0.1:9/doc"], tmp_path)  # URLs go through web_fetch's checks


async def test_a_documents_directory_loads_every_file_under_it(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    from ringlet.memory.documents import load_documents

    knowledge = tmp_path / "knowledge"
    (knowledge / "deep" / "deeper").mkdir(parents=True)
    (knowledge / "a.md").write_text("alpha")
    (knowledge / "deep" / "b.txt").write_text("beta")
    (knowledge / "deep" / "deeper" / "c.md").write_text("gamma")
    (knowledge / ".hidden").write_text("secret")
    (knowledge / "deep" / "logo.png").write_bytes(b"\x89PNG\0\0binary")
    (tmp_path / "empty").mkdir()
    with caplog.at_level("WARNING", logger="ringlet.graph"):
        found = await load_documents(["./knowledge/", "knowledge", "empty"], tmp_path)
    assert found == [("knowledge/a.md", "alpha"), ("knowledge/deep/b.txt", "beta"),
                     ("knowledge/deep/deeper/c.md", "gamma")] * 2
    assert "logo.png: left out, it is not text" in caplog.text
    assert "rag document 'empty' names no file" in caplog.text


async def test_an_explicit_output_update_keeps_its_value(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, """
        name: g
        initial_state: {output: earlier}
        start: a
        nodes:
          a: {type: llm, prompt: p, state_updates: {output: "{{output}}"}, next: b}
          b: {type: llm, prompt: q, state_updates: {other: "{{output}}"}, next: z}
          z: {type: end, output: "{{output}} / {{other}}"}
    """)
    _, result = await run_graph(graph_agent(directory, model=by_prompt({"p": "first", "q": "second"})))
    assert result.output == "first / second"  # b's scoped output came and went; a's explicit write stayed
