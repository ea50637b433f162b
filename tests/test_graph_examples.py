"""The example graph agents in examples/graphs, run with scripted models (no network)."""

from __future__ import annotations

from pathlib import Path

from ringlet.graph import FileCheckpoints, load_agent
from ringlet.testing import ScriptedModel
from test_graph_support import EXAMPLES, by_prompt, graph_agent, of_type, run_graph

TICKET = "My invoice   is wrong and nobody answers!"


async def test_triage_fans_out_and_merges_through_reducers() -> None:
    model = by_prompt({"Tone of this ticket": "angry",
                       "Topic and urgency": '{"topic": "billing", "score": 3}'})
    events, result = await run_graph(graph_agent(EXAMPLES / "triage", model=model), TICKET)
    assert result.output == 'billing (score 5): ["rules:billing","tone:angry","topic:billing"]'
    assert result.state["notes"] == "rules checked\ntone checked\ntopic checked"
    assert result.state["ticket"] == "My invoice is wrong and nobody answers!"
    step2 = {e.node_id for e in of_type(events, "node_start") if e.step == 2}
    assert step2 == {"by_tone", "by_topic", "by_rules"}
    assert {r.settings.temperature for r in model.requests} == {0.2}


async def test_batch_maps_llm_and_script_branches() -> None:
    model = by_prompt({"apples": "crisp red fruit", "pears": "soft green fruit", "plums": "small purple fruit"})
    events, result = await run_graph(graph_agent(EXAMPLES / "batch", model=model), "apples, pears, plums")
    assert result.state["summaries"] == ["crisp red fruit", "soft green fruit", "small purple fruit"]
    assert result.state["lengths"] == [6, 5, 5]
    items = [(e.node_id, e.item_index) for e in of_type(events, "node_end") if e.item_index is not None]
    assert sorted(items) == [("measure_one", 0), ("measure_one", 1), ("measure_one", 2),
                             ("summarise_one", 0), ("summarise_one", 1), ("summarise_one", 2)]


async def test_poll_loops_with_next_until_done_or_the_visit_cap() -> None:
    agent = graph_agent(EXAMPLES / "poll")
    events, result = await run_graph(agent)
    assert result.output == "done after 3 polls"
    assert [e.visit for e in of_type(events, "node_start") if e.node_id == "check"] == [1, 2, 3]
    _, result = await run_graph(agent, variables={"target": "10"})
    assert result.error["message"] == "Node 'check' visited 6 times (max_loop_iterations=5). Possible infinite loop."
    assert result.error["code"] == "max_loop_iterations"


async def test_resilient_takes_the_fallback_and_repairs_the_output() -> None:
    model = ScriptedModel(['{"item": "red bicycle", "quantity": "three"}', '{"item": "red bicycle", "quantity": 3}'])
    events, result = await run_graph(graph_agent(EXAMPLES / "resilient", model=model))
    assert result.output == "3 x red bicycle (from cache)"
    fetch = of_type(events, "node_end")[0]
    assert (fetch.node_id, fetch.outcome, fetch.next) == ("fetch", "fallback", ("cached",))
    assert fetch.error.startswith("Script 'scripts/fetch.sh' failed with exit code 3:\nupstream unavailable")
    assert "quantity: 'three' is not of type 'integer'" in model.requests[1].messages[-1].text


async def test_resilient_falls_back_when_the_repair_fails_too() -> None:
    model = ScriptedModel(["three bicycles", '{"item": "bicycle"}'])
    _, result = await run_graph(graph_agent(EXAMPLES / "resilient", model=model))
    assert result.output == ("Could not extract the order. LLM node failed: output_schema validation failed: "
                             "(root): 'quantity' is a required property")


SIGNOFF = {"Draft a one-line": "v2 is out.", "Rewrite": "v2: out now."}


async def test_signoff_answered_by_an_approver() -> None:
    agent = graph_agent(EXAMPLES / "signoff", model=by_prompt(SIGNOFF), approver=lambda q: "publish")
    _, result = await run_graph(agent, "version 2")
    assert result.output == "publish: v2 is out."


async def test_signoff_answered_headless_in_another_process(tmp_path: Path) -> None:
    store = FileCheckpoints(tmp_path / "runs")
    first = graph_agent(EXAMPLES / "signoff", model=by_prompt(SIGNOFF), checkpoints=store)
    events, paused = await run_graph(first, "version 2")
    question = of_type(events, "question")[0]
    assert (question.question, question.input_type, question.allow_freeform) == \
        ("Publish this note? v2 is out.", "single-select", True)
    assert paused.status == "input_required"
    model = by_prompt(SIGNOFF)
    second = graph_agent(EXAMPLES / "signoff", model=model, checkpoints=store)  # a fresh process's agent
    paused = await second.resume(paused.run_id, answer="revise")
    assert paused.status == "input_required"
    assert paused.pending_question.input_type == "text"
    assert paused.pending_question.default == "make it shorter"
    result = await second.resume(paused.run_id, answer="")
    assert result.output == "revise: v2: out now."
    assert "so that you make it shorter" in model.requests[-1].messages[0].text
    assert result.state["decision"] == "revise"
    assert result.state["wish"] == "make it shorter"


async def test_research_retrieves_then_asks_the_helper(tmp_path: Path) -> None:
    helper_model = ScriptedModel(['{"answer": "They hold hands."}'])
    helper = load_agent(EXAMPLES / "helper", model=helper_model)
    agent = graph_agent(EXAMPLES / "research", store=f"sqlite+aiosqlite:///{tmp_path / 'kb.db'}",
                        confirm_rag=lambda q: True, resolver=lambda name: {"helper": helper}[name])
    events, result = await run_graph(agent, "Why do otters hold hands")
    await agent.aclose()
    assert result.output.startswith('They hold hands. (sources: ["docs/otters.md"')
    assert "Sea otters hold hands while they sleep" in helper_model.requests[0].messages[0].text
    assert {e.agent_path for e in events if e.agent_path} == {("research", "helper")}
