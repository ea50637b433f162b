"""`ringlet eval`: the table, the exit codes, the JSON and JUnit files, the baseline, capture; and the example
dataset on the embedded default model."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

import pytest
from typer.testing import CliRunner

from ringlet.cli import app
from ringlet.evals import Dataset, Report
from ringlet.messages import Message, ToolCall
from ringlet.models import providers
from ringlet.models.base import ModelRequest
from ringlet.store import Store
from ringlet.testing import FunctionModel, call

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]


def calculator(request: ModelRequest) -> Any:
    """Calls `calculate` on the prompt's expression, then answers with its result ("wrong": answers 0)."""
    prompt = next(m.text for m in reversed(request.messages) if m.role == "user")
    results = [m for m in request.messages if m.role == "tool"]
    if not results:
        return call("calculate", expression=prompt.removeprefix("What is ").rstrip("?").removesuffix(" wrong"))
    return f"It is {'0' if 'wrong' in prompt else results[-1].text}."


@pytest.fixture
def agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A calculator agent on `fn:calc` (and `fn:other`, which its allowed_models allows)."""
    real = providers.resolve_model

    def resolve(spec: Any, **options: Any) -> Any:
        if isinstance(spec, str) and spec.startswith("fn:"):
            return FunctionModel(calculator, name=spec)
        return real(spec, **options)

    monkeypatch.setattr(providers, "resolve_model", resolve)
    monkeypatch.setenv("RINGLET_AGENTS_DIR", str(tmp_path / "agents"))
    directory = tmp_path / "agents" / "calc"
    directory.mkdir(parents=True)
    (directory / "config.yaml").write_text("model: fn:calc\nallowed_models: ['fn:oth*']\ntools: [calculate]\n")
    (directory / "tools.py").write_text(
        "import re\n"
        "def calculate(expression: str) -> str:\n"
        "    '''Evaluate a sum or product.'''\n"
        "    a, op, b = re.fullmatch(r'\\s*(\\d+)\\s*([*+])\\s*(\\d+)\\s*', expression).groups()\n"
        "    return str(int(a) * int(b) if op == '*' else int(a) + int(b))\n")
    return directory


def dataset(tmp_path: Path, *prompts: str, name: str = "data.yaml") -> Path:
    cases = "\n".join(f"  - name: case{i}\n    inputs: \"{p}\"\n    evaluators:\n      - Contains: "
                      f"\"{eval(p.removeprefix('What is ').rstrip('?').removesuffix(' wrong'))}\""
                      for i, p in enumerate(prompts))
    path = tmp_path / name
    path.write_text(f"name: sums\nevaluators:\n  - NoError\n  - ToolCalled: calculate\ncases:\n{cases}\n")
    return path


def test_a_passing_dataset_exits_0_with_a_table_json_and_junit(agent: Path, tmp_path: Path) -> None:
    data = dataset(tmp_path, "What is 2 + 2?", "What is 17 * 23?")
    result = runner.invoke(app, ["eval", "calc", str(data), "--json", str(tmp_path / "r.json"),
                                 "--junit", str(tmp_path / "r.xml"), "--concurrency", "2"])
    assert result.exit_code == 0, result.output
    assert re.search(r"case0\s+│\s+pass\s+│\s+3/3", result.stdout), result.stdout
    assert "2/2 cases passed (100% of 2 runs)" in result.stdout
    report = Report.from_file(tmp_path / "r.json")
    assert (report.agent, report.model, report.concurrency) == ("calc", "fn:calc", 2)
    assert [r.output for c in report.cases for r in c.runs] == ["It is 4.", "It is 391."]
    suite = ET.parse(tmp_path / "r.xml").getroot()
    assert (suite.get("tests"), suite.get("failures")) == ("2", "0")


def test_a_failing_case_exits_1_and_says_why(agent: Path, tmp_path: Path) -> None:
    data = dataset(tmp_path, "What is 2 + 2?", "What is 3 * 3 wrong?")
    result = runner.invoke(app, ["eval", str(agent), str(data), "--junit", str(tmp_path / "r.xml")])
    assert result.exit_code == 1, result.output
    assert re.search(r"case1\s+│\s+FAIL", result.stdout)
    assert "✗ case1 (line 10)" in result.stdout
    assert "Contains: '9' is not in 'It is 0.'" in result.stdout
    failure = ET.parse(tmp_path / "r.xml").getroot().find("testcase[@name='case1']/failure")
    assert failure is not None
    assert "is not in 'It is 0.'" in (failure.text or "")


def test_a_regression_against_the_baseline_exits_1(agent: Path, tmp_path: Path) -> None:
    good = dataset(tmp_path, "What is 2 + 2?", "What is 3 * 3?")
    assert runner.invoke(app, ["eval", "calc", str(good), "--json", str(tmp_path / "before.json")]).exit_code == 0
    same = runner.invoke(app, ["eval", "calc", str(good), "--baseline", str(tmp_path / "before.json")])
    assert same.exit_code == 0
    assert "no change against" in same.stdout
    worse = dataset(tmp_path, "What is 2 + 2?", "What is 3 * 3 wrong?", name="worse.yaml")
    result = runner.invoke(app, ["eval", "calc", str(worse), "--baseline", str(tmp_path / "before.json"),
                                 "--json", str(tmp_path / "after.json")])
    assert result.exit_code == 1
    assert re.search(r"case1\s+│\s+pass_rate\s+│\s+100%\s+│\s+0%\s+│\s+REGRESSION", result.stdout), result.stdout
    assert "2 regression(s), 0 improvement(s)" in result.stdout
    better = runner.invoke(app, ["eval", "calc", str(good), "--baseline", str(tmp_path / "after.json")])
    assert better.exit_code == 0
    assert "0 regression(s), 2 improvement(s)" in better.stdout


def test_repeat_shows_a_pass_rate_and_case_picks_cases(agent: Path, tmp_path: Path) -> None:
    data = dataset(tmp_path, "What is 2 + 2?", "What is 3 * 3 wrong?")
    result = runner.invoke(app, ["eval", "calc", str(data), "--repeat", "3", "--case", "case0"])
    assert result.exit_code == 0, result.output
    assert re.search(r"case0\s+│\s+pass 100%", result.stdout)
    assert "case1" not in result.stdout
    assert "1/1 cases passed (100% of 3 runs)" in result.stdout
    unknown = runner.invoke(app, ["eval", "calc", str(data), "--case", "nope"])
    assert unknown.exit_code == 2
    assert "no case named ['nope']" in unknown.stderr


def test_usage_and_dataset_errors_exit_2(agent: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("cases:\n  - name: a\n    inputs: hi\n    evaluators:\n      - Contain: x\n")
    result = runner.invoke(app, ["eval", "calc", str(bad)])
    assert result.exit_code == 2
    assert f"{bad}:5: cases[0].evaluators[0]: unknown evaluator 'Contain'" in result.stderr
    missing = runner.invoke(app, ["eval", "calc", str(tmp_path / "nope.yaml")])
    assert missing.exit_code == 2
    assert "cannot read the dataset" in missing.stderr
    nobody = runner.invoke(app, ["eval", "nobody", str(bad)])
    assert nobody.exit_code == 2


def test_model_runs_the_dataset_on_an_allowed_model_only(agent: Path, tmp_path: Path) -> None:
    data = dataset(tmp_path, "What is 2 + 2?")
    refused = runner.invoke(app, ["eval", "calc", str(data), "--model", "fn:elsewhere"])
    assert refused.exit_code == 2
    assert "agent 'calc' may not run on 'fn:elsewhere'; it may use ['fn:calc', 'fn:oth*']" in refused.stderr
    assert "allowed_models" in refused.stderr
    allowed = runner.invoke(app, ["eval", "calc", str(data), "--model", "fn:other", "--json",
                                  str(tmp_path / "r.json")])
    assert allowed.exit_code == 0, allowed.output
    assert Report.from_file(tmp_path / "r.json").model == "fn:other"
    assert "(fn:other)" in allowed.stdout


def test_capture_adds_a_stored_conversation_as_a_case(agent: Path, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"

    async def store_one() -> str:
        store = await Store.open(url)
        try:
            conversation = await store.conversations.create(agent="calc")
            await store.conversations.append_messages(conversation.id, [
                Message.user("What is 6 * 7?"),
                Message.assistant("", [ToolCall(id="c1", name="calculate", arguments={"expression": "6 * 7"})]),
                Message.tool("c1", "calculate", "42"), Message.assistant("It is 42.")])
            return conversation.id
        finally:
            await store.close()

    cid = asyncio.run(store_one())
    target = tmp_path / "captured.yaml"
    result = runner.invoke(app, ["eval", "capture", cid, "--to", str(target), "--db", url])
    assert result.exit_code == 0, result.output
    assert "added case what-is-6-7" in result.stderr
    assert "1 tool call(s)" in result.stderr
    case = Dataset.from_file(target).cases[0]
    assert case.inputs == "What is 6 * 7?"
    assert case.metadata["captured_output"] == "It is 42."
    rerun = runner.invoke(app, ["eval", "calc", str(target)])
    assert rerun.exit_code == 0, rerun.output
    missing = runner.invoke(app, ["eval", "capture", "c_nope", "--to", str(target), "--db", url])
    assert missing.exit_code == 1
    assert "no conversation 'c_nope'" in missing.stderr


@pytest.mark.slow
def test_the_example_dataset_runs_on_the_embedded_default_model(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The docs' example: the built-in assistant on the real local GGUF model (greedy decoding: the same
    answers each time). Its three cases pass, every evaluator of each holds, and the exit code says so."""
    monkeypatch.setenv("RINGLET_AGENTS_DIR", str(tmp_path / "none"))
    result = runner.invoke(app, ["eval", "assistant", str(ROOT / "examples/evals/assistant.yaml"),
                                 "--json", str(tmp_path / "r.json")])
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["model"] == "local:smollm2"
    summary = {k: report["summary"][k] for k in ("cases", "runs", "passed", "failed")}
    assert summary == {"cases": 3, "runs": 3, "passed": 3, "failed": 0}, result.output
    held = {c["name"]: {e["name"]: e["value"] for r in c["runs"] for e in r["results"]} for c in report["cases"]}
    assert held == {
        "multiplication": {"NoError": True, "MaxRounds": True, "ToolCalled(calculate)": True, "Contains": True},
        "addition": {"NoError": True, "MaxRounds": True, "ToolCalled(calculate)": True, "Contains": True},
        "time-in-tokyo": {"NoError": True, "MaxRounds": True, "ToolCalled(current_time)": True,
                          "ToolNotCalled(web_fetch)": True}}, result.output
    assert all(r["usage"]["requests"] >= 1 for c in report["cases"] for r in c["runs"])
    assert "3/3 cases passed (100% of 3 runs)" in result.stdout
    assert result.exit_code == 0, result.output


def test_durable_runs_each_case_as_a_dbos_workflow(agent: Path, tmp_path: Path) -> None:
    data = dataset(tmp_path, "What is 2 + 2?", "What is 3 * 3 wrong?")
    db = f"sqlite:///{tmp_path / 'dbos.sqlite'}"
    result = runner.invoke(app, ["eval", "calc", str(data), "--durable", "--db", db, "--json",
                                 str(tmp_path / "r.json")])
    assert result.exit_code == 1, result.output
    assert re.search(r"case0\s+│\s+pass", result.stdout)
    assert re.search(r"case1\s+│\s+FAIL", result.stdout)
    assert (tmp_path / "dbos.sqlite").exists()
    report = Report.from_file(tmp_path / "r.json")
    assert [r.output for c in report.cases for r in c.runs] == ["It is 4.", "It is 0."]
