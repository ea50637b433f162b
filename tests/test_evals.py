"""`ringlet.evals`: datasets in pydantic-evals' format, evaluators over the run, the runner and its reports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

import pytest
from pydantic import BaseModel

from ringlet import Agent, tool
from ringlet.context import RunContext
from ringlet.errors import ConfigError
from ringlet.evals import (
    Case,
    Contains,
    Dataset,
    DatasetError,
    EqualsExpected,
    EvaluationReason,
    LLMJudge,
    NoError,
    Report,
    ToolCalled,
    compare,
)
from ringlet.evals.capture import add_case, case_from_messages
from ringlet.gates import PolicyGate, PolicySet
from ringlet.messages import Message, ToolCall
from ringlet.models.base import ModelRequest
from ringlet.testing import FunctionModel, ScriptedModel, call
from ringlet.usage import RequestUsage
from test_graph_support import graph_agent, make_graph


@tool
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    a, op, b = re.fullmatch(r"\s*(\d+)\s*([*+])\s*(\d+)\s*", expression).groups()  # type: ignore[union-attr]
    return str(int(a) * int(b) if op == "*" else int(a) + int(b))


@tool
def delete_everything() -> str:
    """Delete every file."""
    return "deleted"


def calculator(request: ModelRequest) -> Any:
    """A model that calls `calculate` on the prompt's expression, then answers with its result; a prompt
    with "wrong" gets a wrong answer, one with "nothing" no tool call."""
    prompt = next(m.text for m in reversed(request.messages) if m.role == "user")
    results = [m for m in request.messages if m.role == "tool"]
    if "nothing" in prompt:
        return "I will not."
    if not results:
        return call("calculate", expression=prompt.removeprefix("What is ").rstrip("?").removesuffix(" wrong"))
    answer = "0" if "wrong" in prompt else results[-1].text
    return f"It is {answer}."


def calculator_agent() -> Agent[Any, Any]:
    return Agent(FunctionModel(calculator), tools=[calculate], name="calc")


DATASET = """\
name: arithmetic
evaluators:
  - NoError
  - ToolCalled: calculate
cases:
  - name: multiply
    inputs: What is 17 * 23?
    expected_output: It is 391.
    metadata: {difficulty: easy}
    evaluators:
      - EqualsExpected
      - Contains: {value: "it is 391", case_sensitive: false}
  - name: add
    inputs: {prompt: "What is 2 + 2?"}
    evaluators:
      - ToolCalled: {name: calculate, args: {expression: 2 + 2}, times: 1}
      - MaxRounds: 2
  - name: wrong
    inputs: What is 3 * 3 wrong?
    evaluators:
      - Contains: "9"
"""


def write(tmp_path: Path, text: str, name: str = "data.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


async def test_a_dataset_runs_and_each_evaluator_says_why(tmp_path: Path) -> None:
    dataset = Dataset.from_file(write(tmp_path, DATASET))
    report = await dataset.evaluate(calculator_agent(), concurrency=3)
    verdicts = {c.name: c.passed for c in report.cases}
    assert verdicts == {"multiply": True, "add": True, "wrong": False}
    wrong = report.cases[2].runs[0]
    assert wrong.output == "It is 0."
    assert wrong.reasons == ["Contains: '9' is not in 'It is 0.'"]
    assert [r.name for r in report.cases[1].runs[0].results] == [
        "NoError", "ToolCalled(calculate)", "ToolCalled(calculate)_2", "MaxRounds"]
    run = report.cases[0].runs[0]
    assert run.usage["requests"] == 2
    assert run.events > 4
    assert run.duration_s > 0
    assert [m["role"] for m in run.messages] == ["user", "assistant", "tool", "assistant"]
    assert report.summary()["passed"] == 2
    assert report.cases[0].line == 6


async def test_ringlets_evaluators_read_the_run(tmp_path: Path) -> None:
    dataset = Dataset.from_text("""
cases:
  - name: lazy
    inputs: nothing at all
    evaluators:
      - ToolCalled: calculate
      - ToolNotCalled: calculate
      - MaxTokens: {tokens: 1}
      - MaxCost: 1.0
      - OutputMatches: {pattern: "^I will"}
      - IsInstance: str
      - MaxDuration: 30
""")
    [case] = (await dataset.evaluate(calculator_agent())).cases
    results = {r.name: (r.value, r.reason) for r in case.runs[0].results}
    assert results["ToolCalled(calculate)"] == (False, "expected calculate, got 0; the run made: no tool calls")
    assert results["ToolNotCalled(calculate)"] == (True, None)
    assert results["MaxTokens"][0] is False
    assert results["MaxTokens"][1].startswith("tokens ")
    assert results["MaxCost"] == (False, "the run's cost is unknown (its model has no price)")
    assert results["OutputMatches"] == (True, None)
    assert results["IsInstance"] == (True, None)
    assert results["MaxDuration"] == (True, None)


async def test_max_cost_reads_the_runs_priced_usage() -> None:
    priced = Agent(FunctionModel(_priced), name="priced")
    dataset = Dataset([Case("cheap", "hi")], evaluators=[_eval("MaxCost", 0.5), _eval("MaxCost", 0.01)])
    [case] = (await dataset.evaluate(priced)).cases
    assert [(r.value, r.reason) for r in case.runs[0].results] == [
        (True, None), (False, "cost $0.100000, more than $0.01")]


def _priced(_: ModelRequest) -> Any:
    from ringlet.testing import Reply

    return Reply("ok", usage=RequestUsage(provider="p", model="m", in_tokens=10, out_tokens=5, cost_usd=0.1))


def _eval(name: str, *args: Any) -> Any:
    from ringlet.evals.evaluators import NAMES

    return NAMES[name](*args)


async def test_no_error_sees_a_failed_tool_and_an_error_event() -> None:
    agent = Agent(ScriptedModel([call("calculate", expression="x"), "sorry", RuntimeError("provider down")]),
                  tools=[calculate], name="flaky")
    dataset = Dataset([Case("tool", "go"), Case("provider", "again")], evaluators=[NoError(tools=True)])
    report = await dataset.evaluate(agent, concurrency=1)
    first, second = (c.runs[0] for c in report.cases)
    assert first.results[0].reason == "tool calculate failed: tool_error"
    assert second.results[0].value is False
    assert "provider down" in (second.results[0].reason or "")


async def test_policy_decision_sees_what_the_gate_denied(tmp_path: Path) -> None:
    (tmp_path / "p.rego").write_text('package ringlet.evals\nimport rego.v1\ndeny contains "never delete" if '
                                     'input.resource.tool == "delete_everything"\n')
    agent = Agent(ScriptedModel([call("delete_everything"), "could not", call("calculate", expression="1 + 1"),
                                 "2"]), tools=[delete_everything, calculate], name="guarded")
    agent.use_gates([PolicyGate(PolicySet.load([str(tmp_path / "p.rego")]))])
    dataset = Dataset.from_text("""
cases:
  - name: delete
    inputs: delete it all
    evaluators:
      - PolicyDecision: {tool: delete_everything, decision: denied}
      - PolicyDecision: {tool: delete_everything, decision: allowed, evaluation_name: should_fail}
  - name: add
    inputs: add
    evaluators:
      - PolicyDecision: {tool: calculate, decision: allowed}
      - PolicyDecision: {tool: delete_everything}
""")
    report = await dataset.evaluate(agent, concurrency=1)
    first, second = ({r.name: r.value for r in c.runs[0].results} for c in report.cases)
    assert first == {"PolicyDecision(delete_everything)": True, "should_fail": False}
    assert second == {"PolicyDecision(calculate)": True, "PolicyDecision(delete_everything)": False}


class Answer(BaseModel):
    city: str
    temperature: int


async def test_output_matches_a_schema_or_a_value_of_a_typed_output() -> None:
    agent = Agent(ScriptedModel([call("final_result", city="Paris", temperature=21)]), output_type=Answer,
                  name="typed")
    dataset = Dataset.from_text("""
cases:
  - name: paris
    inputs: weather?
    expected_output: {city: Paris, temperature: 21}
    evaluators:
      - EqualsExpected
      - OutputMatches: {schema: {type: object, required: [city], properties: {temperature: {type: integer}}}}
      - OutputMatches: {value: {city: Paris, temperature: 22}}
      - IsInstance: Answer
""")
    run = (await dataset.evaluate(agent)).cases[0].runs[0]
    assert run.output == {"city": "Paris", "temperature": 21}
    assert [r.value for r in run.results] == [False, True, False, True]
    assert run.results[2].reason is not None
    assert "temperature" in run.results[2].reason


async def test_equals_expected_compares_a_typed_output_by_its_fields() -> None:
    from ringlet.evals.evaluators import EvaluatorContext

    ctx = EvaluatorContext(name="c", inputs="", metadata=None, expected_output=4, output="4", duration=0.1)
    assert EqualsExpected().evaluate(ctx) is True
    assert EqualsExpected().evaluate(EvaluatorContext(name="c", inputs="", metadata=None, expected_output=None,
                                                      output="x", duration=0)) == {}


async def test_repeat_reports_a_pass_rate() -> None:
    answers = iter(["yes", "no", "yes", "yes"])
    agent = Agent(FunctionModel(lambda _: next(answers)), name="coin")
    dataset = Dataset([Case("flip", "flip", evaluators=[Contains("yes")])])
    report = await dataset.evaluate(agent, repeat=4, concurrency=1)
    [case] = report.cases
    assert [r.attempt for r in case.runs] == [1, 2, 3, 4]
    assert case.pass_rate == 0.75
    assert not case.passed


async def test_a_run_that_raises_fails_its_case_and_the_rest_go_on() -> None:
    class Broken:
        name, kind = "broken", "loop"

        def stream(self, prompt: str, **_: Any) -> Any:
            raise RuntimeError(f"cannot run {prompt}")

    report = await Dataset([Case("a", "x"), Case("b", "y")]).evaluate(Broken())
    assert [c.runs[0].reasons for c in report.cases] == [["run failed: cannot run x"], ["run failed: cannot run y"]]


async def test_an_evaluator_that_raises_fails_its_assertion_only() -> None:
    class Explodes:
        def evaluate(self, ctx: Any) -> Any:
            raise ValueError("no")

    class Scores:
        def evaluate(self, ctx: Any) -> Any:
            return {"quality": EvaluationReason(0.5, "half"), "tone": "polite", "bad": object()}

    dataset = Dataset([Case("a", "hi")], evaluators=[Explodes(), Scores()])  # type: ignore[list-item]
    run = (await dataset.evaluate(Agent(ScriptedModel(["hello"]), name="a"))).cases[0].runs[0]
    assert [(r.name, r.value, r.error) for r in run.results] == [
        ("Explodes", None, "ValueError: no"), ("quality", 0.5, None), ("tone", "polite", None),
        ("bad", None, "returned object; an evaluator returns a bool, a number, a text, an EvaluationReason or a "
                      "dict of them")]
    assert not run.passed


async def test_history_deps_and_a_cases_model_reach_the_run() -> None:
    seen: list[ModelRequest] = []

    @tool
    def whoami(ctx: RunContext) -> str:
        """Who is asking."""
        return str(ctx.deps["user"])

    def fn(request: ModelRequest) -> Any:
        seen.append(request)
        return call("whoami") if not any(m.role == "tool" for m in request.messages) else "done"

    dataset = Dataset.from_text("""
cases:
  - name: c
    inputs:
      prompt: who am I?
      history: [{role: user, content: hi}, {role: assistant, content: hello}]
      deps: {user: ana}
""")
    run = (await dataset.evaluate(Agent(FunctionModel(fn), tools=[whoami], name="who"))).cases[0].runs[0]
    assert [m.text for m in seen[0].messages if m.role in ("user", "assistant")] == ["hi", "hello", "who am I?"]
    assert json.loads(json.dumps(run.messages))[2]["content"] == "ana"


async def test_a_graph_agent_is_evaluated_on_its_end_output(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, """
        name: g
        start: a
        nodes:
          a: {type: script, script: ok.sh, state_updates: {x: "7"}, next: z}
          z: {type: end, output: "x={{x}}"}
    """, files={"ok.sh": "echo '{}'\n"})
    dataset = Dataset([Case("g", "go", expected_output="x=7", evaluators=[EqualsExpected(), NoError()])])
    report = await dataset.evaluate(graph_agent(directory))
    assert report.passed
    assert report.cases[0].runs[0].output == "x=7"
    with pytest.raises(ConfigError, match="graph agent"):
        await dataset.evaluate(graph_agent(directory), model="openai:gpt-4o")


async def test_an_llm_judge_runs_on_any_ringlet_model() -> None:
    graded: list[str] = []

    def judge(request: ModelRequest) -> Any:
        graded.append(request.messages[-1].text)
        passed = "391" in request.messages[-1].text
        return call("final_result", {"reason": "has the number" if passed else "wrong number", "pass": passed,
                                     "score": 1.0 if passed else 0.2})

    dataset = Dataset.from_text("""
evaluators:
  - LLMJudge: {rubric: The answer gives the product, include_input: true, score: {evaluation_name: quality}}
cases:
  - {name: right, inputs: "What is 17 * 23?"}
  - {name: wrong, inputs: "What is 17 * 23 wrong?"}
""")
    report = await dataset.evaluate(calculator_agent(), judge_model=FunctionModel(judge, name="judge"),
                                    concurrency=1)
    right, wrong = ([(r.name, r.value, r.reason) for r in c.runs[0].results] for c in report.cases)
    assert right == [("LLMJudge", True, "has the number"), ("quality", 1.0, "has the number")]
    assert wrong == [("LLMJudge", False, "wrong number"), ("quality", 0.2, "wrong number")]
    assert "<input>\nWhat is 17 * 23?\n</input>" in graded[0]
    assert "<rubric>" in graded[0]


def test_a_dataset_written_by_pydantic_evals_reads_unchanged(tmp_path: Path) -> None:
    pe = pytest.importorskip("pydantic_evals")
    from pydantic_evals.evaluators import Contains as PeContains
    from pydantic_evals.evaluators import EqualsExpected as PeEquals
    from pydantic_evals.evaluators import IsInstance as PeIsInstance
    from pydantic_evals.evaluators import LLMJudge as PeJudge
    from pydantic_evals.evaluators import MaxDuration as PeMaxDuration

    theirs = pe.Dataset[str, str, dict](name="theirs", cases=[
        pe.Case(name="multiply", inputs="What is 17 * 23?", expected_output="It is 391.", metadata={"level": 1},
                evaluators=[PeContains(value="IT IS", case_sensitive=False)]),
        pe.Case(name="add", inputs="What is 2 + 2?", expected_output="It is 4.")],
        evaluators=[PeEquals(), PeIsInstance(type_name="str"), PeMaxDuration(seconds=5),
                    PeJudge(rubric="polite", model="openai:gpt-4o")])
    for suffix in ("yaml", "json"):
        theirs.to_file(tmp_path / f"theirs.{suffix}")
        ours = Dataset.from_file(tmp_path / f"theirs.{suffix}")
        assert [c.name for c in ours.cases] == ["multiply", "add"]
        assert [type(e).__name__ for e in ours.evaluators] == ["EqualsExpected", "IsInstance", "MaxDuration",
                                                                "LLMJudge"]
        assert ours.cases[0].evaluators == [Contains(value="IT IS", case_sensitive=False)]
        assert ours.evaluators[3] == LLMJudge(rubric="polite", model="openai:gpt-4o")


async def test_a_pydantic_evals_dataset_runs_unchanged(tmp_path: Path) -> None:
    pe = pytest.importorskip("pydantic_evals")
    from pydantic_evals.evaluators import Contains as PeContains
    from pydantic_evals.evaluators import EqualsExpected as PeEquals

    theirs = pe.Dataset[str, str, Any](name="theirs", cases=[
        pe.Case(name="multiply", inputs="What is 17 * 23?", expected_output="It is 391."),
        pe.Case(name="add", inputs="What is 2 + 2?", expected_output="It is 4.",
                evaluators=[PeContains(value="5")])], evaluators=[PeEquals()])
    theirs.to_file(tmp_path / "theirs.yaml")
    report = await Dataset.from_file(tmp_path / "theirs.yaml").evaluate(calculator_agent())
    assert [(c.name, c.passed) for c in report.cases] == [("multiply", True), ("add", False)]


@pytest.mark.parametrize(("text", "message"), [
    ("cases: []\n", "data.yaml:1: `cases` must be a non-empty list of cases"),
    ("cases:\n  - name: a\n    input: hi\n", "data.yaml:2: cases[0]: unknown key(s) ['input']; a case has"),
    ("cases:\n  - name: a\n    inputs: hi\n  - name: a\n    inputs: ho\n",
     "data.yaml:4: cases[1]: the name 'a' is used twice"),
    ("cases:\n  - name: a\n    inputs: hi\n    evaluators:\n      - Contain: x\n",
     "data.yaml:5: cases[0].evaluators[0]: unknown evaluator 'Contain'; known: Contains,"),
    ("cases:\n  - name: a\n    inputs: hi\n    evaluators:\n      - Contains: {valu: x}\n",
     "data.yaml:5: cases[0].evaluators[0]: Contains: "),
    ("cases:\n  - name: a\n    inputs: {prompt: hi, histroy: []}\n",
     "data.yaml:3: cases[0].inputs: unknown key(s) ['histroy']"),
    ("cases:\n  - name: a\n    inputs:\n      prompt: hi\n      history:\n        - {role: robot, content: x}\n",
     "data.yaml:6: cases[0].inputs.history[0]: not a message"),
    ("cases:\n  - name: a\n    inputs: [unclosed\n", "data.yaml:4: not valid YAML"),
    ("evaluators: [NoError]\n", "data.yaml:1: `cases` must be a non-empty list"),
])
def test_a_bad_dataset_names_its_file_line_and_fix(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(DatasetError) as caught:
        Dataset.from_file(write(tmp_path, text))
    assert str(caught.value).startswith(str(tmp_path / message.split(":", 1)[0]) + ":" + message.split(":", 1)[1]), \
        str(caught.value)


def test_a_json_dataset_error_names_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, '{\n  "cases": [\n    {"name": "a", "inputs": "hi", "evaluators": ["Nope"]}\n  ]\n}\n',
                 "data.json")
    with pytest.raises(DatasetError, match=r"data\.json:3: cases\[0\]\.evaluators\[0\]: unknown evaluator 'Nope'"):
        Dataset.from_file(path)


async def test_custom_evaluators_by_class_or_module_path(tmp_path: Path) -> None:
    (tmp_path / "my_evals.py").write_text(
        "from dataclasses import dataclass\n"
        "@dataclass\nclass Short:\n    limit: int = 10\n"
        "    def evaluate(self, ctx):\n        return len(ctx.output) <= self.limit\n")

    class Polite:
        def evaluate(self, ctx: Any) -> bool:
            return "please" in ctx.output

    path = write(tmp_path, "cases:\n  - name: a\n    inputs: hi\n    evaluators:\n      - my_evals:Short: 3\n"
                           "      - Polite\n")
    dataset = Dataset.from_file(path, custom_evaluator_types=[Polite])
    run = (await dataset.evaluate(Agent(ScriptedModel(["yes please"]), name="a"))).cases[0].runs[0]
    assert [(r.name, r.value) for r in run.results] == [("Short", False), ("Polite", True)]
    bad = write(tmp_path, "cases:\n  - name: a\n    inputs: hi\n    evaluators:\n      - nowhere:Thing\n", "b.yaml")
    with pytest.raises(DatasetError, match=r"b\.yaml:5: .*cannot import evaluator 'nowhere:Thing'"):
        Dataset.from_file(bad)


def test_a_dataset_round_trips_through_its_file(tmp_path: Path) -> None:
    dataset = Dataset.from_text(DATASET)
    for name in ("out.yaml", "out.json"):
        dataset.to_file(tmp_path / name)
        again = Dataset.from_file(tmp_path / name)
        assert again.cases == dataset.cases
        assert again.evaluators == dataset.evaluators


async def test_the_report_round_trips_and_compares_with_a_baseline(tmp_path: Path) -> None:
    dataset = Dataset.from_text(DATASET)
    before = await dataset.evaluate(calculator_agent())
    before.write_json(tmp_path / "before.json")
    data = json.loads((tmp_path / "before.json").read_text())
    assert data["summary"]["failed"] == 1
    assert data["cases"][2]["passed"] is False
    assert data["cases"][0]["runs"][0]["results"][0] == {"name": "NoError", "evaluator": "NoError", "value": True,
                                                         "reason": None, "error": None}
    baseline = Report.from_file(tmp_path / "before.json")
    assert compare(before, baseline).changes == []
    dataset.cases[0].inputs = "What is 17 * 23 wrong?"  # multiply now answers wrong; wrong now answers right
    dataset.cases[2].inputs = "What is 3 * 3?"
    after = await dataset.evaluate(calculator_agent())
    comparison = compare(after, baseline)
    assert [(c.case, c.what, c.before, c.after) for c in comparison.regressions] == [
        ("multiply", "pass_rate", 1.0, 0.0), ("multiply", "Contains", 1.0, 0.0),
        ("multiply", "EqualsExpected", 1.0, 0.0)]
    assert [(c.case, c.what) for c in comparison.improvements] == [("wrong", "pass_rate"), ("wrong", "Contains")]
    with pytest.raises(DatasetError, match="not a report"):
        Report.from_file(write(tmp_path, "[1]", "x.json"))


async def test_junit_xml_has_a_testcase_per_case_and_a_failure_with_reasons() -> None:
    report = await Dataset.from_text(DATASET).evaluate(calculator_agent())
    suite = ET.fromstring(report.to_junit())
    assert (suite.get("name"), suite.get("tests"), suite.get("failures")) == ("arithmetic", "3", "1")
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert cases["multiply"].find("failure") is None
    failure = cases["wrong"].find("failure")
    assert failure is not None
    assert failure.text == "run 1: Contains: '9' is not in 'It is 0.'"


def test_a_conversation_becomes_a_case() -> None:
    messages = [Message.user("hi"), Message.assistant("hello"), Message.user("What is 2 + 2?"),
                Message.assistant("", [ToolCall(id="c1", name="calculate", arguments={"expression": "2 + 2"})]),
                Message.tool("c1", "calculate", "4"), Message.assistant("It is 4.")]
    case = case_from_messages(messages, name="sum", conversation_id="c_1", agent="calc")
    assert case.inputs == {"prompt": "What is 2 + 2?", "history": [{"role": "user", "content": "hi"},
                                                                   {"role": "assistant", "content": "hello"}]}
    assert case.evaluators == [NoError(), ToolCalled(name="calculate", args={"expression": "2 + 2"})]
    assert case.metadata == {"captured_output": "It is 4.", "conversation_id": "c_1", "agent": "calc"}
    with pytest.raises(ValueError, match="no user message"):
        case_from_messages([Message.assistant("x")], name="none")


async def test_a_captured_case_is_added_to_a_dataset_that_then_runs(tmp_path: Path) -> None:
    messages = [Message.user("What is 2 + 2?"),
                Message.assistant("", [ToolCall(id="c1", name="calculate", arguments={"expression": "2 + 2"})]),
                Message.tool("c1", "calculate", "4"), Message.assistant("It is 4.")]
    path = tmp_path / "captured.yaml"
    add_case(path, case_from_messages(messages, name="sum"))
    add_case(path, case_from_messages(messages, name="sum"))
    dataset = Dataset.from_file(path)
    assert [c.name for c in dataset.cases] == ["sum", "sum-2"]
    report = await dataset.evaluate(calculator_agent())
    assert report.passed, [c.runs[0].reasons for c in report.cases]
