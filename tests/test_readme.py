"""The README's Python examples run, with a scripted model standing in for `local:`."""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

import pytest

from ringlet.models import providers
from ringlet.testing import FunctionModel, ScriptedModel, call

README = Path(__file__).parent.parent / "README.md"


def _python_block(containing: str) -> str:
    """The README's one ```python block that contains `containing`."""
    blocks = [b for b in re.findall(r"```python\n(.*?)```", README.read_text(), re.S) if containing in b]
    assert len(blocks) == 1, containing
    return blocks[0]


def _section(title: str) -> str:
    """The text of one `## title` section of the README."""
    return README.read_text().split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def _run(block: str, model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import ringlet.agent

    for module in (providers, ringlet.agent):
        monkeypatch.setattr(module, "resolve_model", lambda spec, **_: model)
    exec(compile(block, str(README), "exec"), {"__name__": "readme"})


def test_the_library_example_runs(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    model = ScriptedModel([call("get_weather", city="Paris"), "Sunny in Paris.", "Rome too."])
    _run(_python_block("agent.stream("), model, monkeypatch)
    out = capsys.readouterr().out
    assert "Sunny in Paris. end_turn" in out
    assert "'type': 'message_end'" in out
    model.assert_complete()
    # the follow-up continues the conversation: the model sees the first turn, its tool call and answer
    follow_up = [(m.role, m.text) for m in model.requests[-1].messages]
    assert follow_up[0] == ("user", "What's the weather in Paris?")
    assert ("assistant", "Sunny in Paris.") in follow_up
    assert follow_up[-1] == ("user", "And in Rome?")


def test_the_approvals_example_runs(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The rules decide without a human where they can (a read tool, a deny pattern); an unmarked tool is
    `write` and asks; the run pauses, and resumes with the decisions, a denial's note reaching the model."""
    model = ScriptedModel([
        [call("list_files", folder="logs"), call("send_message", to="team@example.com", text="logs cleared"),
         call("shell_exec", cmd="rm logs/app.log.1"), call("shell_exec", cmd="sudo rm -rf /")],
        "Messaged the team; the shell command was refused.",
    ])
    _run(_python_block("ApprovalRules("), model, monkeypatch)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "input_required"
    assert out[1:3] == ["call_2 send_message {'to': 'team@example.com', 'text': 'logs cleared'} write tool requires "
                        "approval", "call_3 shell_exec {'cmd': 'rm logs/app.log.1'} shell_exec requires confirmation"]
    assert out[3] == "Messaged the team; the shell command was refused."
    model.assert_complete()
    results = {m.tool_call_id: m.text for m in model.requests[-1].messages if m.role == "tool"}
    assert results["call_1"] == "app.log  app.log.1"  # read: ran at once
    assert results["call_2"] == "sent to team@example.com"  # approved after the pause
    assert json.loads(results["call_3"])["error"]["note"] == "not on Fridays"
    assert json.loads(results["call_4"])["error"] == {  # a deny pattern: no human was asked
        "code": "approval_denied", "message": r"blocked by approval rule 'rm\s+-rf'", "decided_by": "rule:deny_pattern",
        "note": None}


def test_the_forking_example_runs(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Edit, a replaced tool result (the tool does not run) and a re-run (it does), each going on from there."""
    ran: list[str] = []

    def weather(request: Any) -> Any:
        last = request.messages[-1]
        if last.role == "user":
            return call("get_weather", city=last.text.split()[-1].rstrip("?"))
        ran.append(last.text)
        return f"It says: {last.text}"

    _run(_python_block("first.fork("), FunctionModel(weather), monkeypatch)
    assert capsys.readouterr().out.splitlines() == [
        "It says: Sunny and 21 °C in Rome", "It says: Snowing and -2 °C in Paris", "It says: Sunny and 21 °C in Paris"]
    assert ran == ["Sunny and 21 °C in Paris", "Sunny and 21 °C in Rome", "Snowing and -2 °C in Paris",
                   "Sunny and 21 °C in Paris"]


def test_the_replay_example_runs(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                 tmp_path: Path) -> None:
    """The recorded run replays without a second model request: the model's script holds one run only."""
    import asyncio

    monkeypatch.chdir(tmp_path)
    model = ScriptedModel([call("get_weather", city="Paris"), "Sunny in Paris."])
    namespace: dict[str, Any] = {}
    import ringlet.agent

    for module in (providers, ringlet.agent):
        monkeypatch.setattr(module, "resolve_model", lambda spec, **_: model)
    exec(compile(_python_block("Recording()"), str(README), "exec"), namespace)
    asyncio.run(namespace["main"]())
    assert capsys.readouterr().out == "same\n"
    model.assert_complete()
    assert len(model.requests) == 2  # the run's own two; the replay asked nothing
    assert (tmp_path / "paris.json").exists()


def test_the_readme_says_what_users_trip_over() -> None:
    """The default effect next to approvals (with the way to mark a read-only tool), and that
    post_execute runs in the background until `wait_background()`."""
    approvals = _section("Approvals")
    assert "does not say its effect is `write`" in approvals
    assert '`@tool(effect="read")`' in approvals
    plugins = next(line for line in _section("The library").split("\n- ") if line.startswith("**Plugins**"))
    assert "`post_execute` runs in the background" in plugins
    assert "await agent.wait_background()" in plugins


def test_the_commands_work_as_written() -> None:
    """Each shell command starts with what a fresh checkout has after `make run` (make, curl, or
    `.venv/bin/ringlet`: a bare `ringlet` is not on PATH), and each ringlet subcommand it names exists."""
    import typer.main

    from ringlet.cli import app

    text = README.read_text()
    lines, continued = [], False
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.splitlines():
            if line.strip() and not continued:
                lines.append(line)
            continued = line.rstrip().endswith("\\")
    inline = re.findall(r"`(\.venv/bin/ringlet [^`]+)`", text)
    assert len(lines) >= 10
    assert [line for line in lines if line.split()[0] not in ("make", "curl", ".venv/bin/ringlet")] == []
    cli: Any = typer.main.get_command(app)  # a click-style group: `.commands` by name
    for command in [line.split("#")[0] for line in lines if line.startswith(".venv/bin/ringlet")] + inline:
        words = command.split()[1:]
        found = cli.commands.get(words[0])
        assert found is not None, command
        if hasattr(found, "commands") and words[0] != "eval":  # a group (graph, keys, mcp, access): its subcommand
            # too (`eval AGENT DATASET` is `eval run …`)
            assert set(words[1].split("|")) <= set(found.commands), command  # `keys list|revoke`: each


def test_the_typed_output_example_runs(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    model = ScriptedModel([call("final_result", number="A-17", total=-12.5),
                           call("final_result", number="A-17", total=12.5)])
    _run(_python_block("output_validator"), model, monkeypatch)
    assert capsys.readouterr().out == "A-17 12.5\n"
    assert "the total must be positive" in model.requests[1].messages[-1].text


def test_the_mcp_elicitation_example_runs(monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The README's elicitation example, as written, against the real `server-everything`."""
    monkeypatch.chdir(README.parent)
    exec(compile(_python_block("trigger-elicitation-request"), str(README), "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out
    assert "Name: Ada" in out


def test_the_evals_example_runs(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    model = ScriptedModel([call("get_weather", city="Paris"), "It is sunny in Paris."])
    _run(_python_block("ringlet.evals import"), model, monkeypatch)
    assert capsys.readouterr().out == "True 1.0\n"
    assert json.loads((tmp_path / "report.json").read_text())["summary"]["passed"] == 1


def test_the_evals_commands_run_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`ringlet eval` as the README shows it, with a scripted model standing in for the embedded one; the
    example dataset's file is the one the README quotes."""
    from typer.testing import CliRunner

    from ringlet.cli import app

    section = _section("Evals")
    quoted = re.search(r"```yaml\n# examples/evals/assistant.yaml\n(.*?)```", section, re.S)
    assert quoted is not None
    dataset = (README.parent / "examples/evals/assistant.yaml").read_text()
    assert all(line in dataset for line in quoted.group(1).splitlines())

    def answer(request: Any) -> Any:  # a tool call for each question, then the tool's result as the answer
        done = [m.text for m in request.messages if m.role == "tool"]
        if done:
            return f"It is {done[-1]}."
        prompt = request.messages[-1].text
        if "Tokyo" in prompt:
            return call("current_time", timezone="Asia/Tokyo")
        return call("calculate", expression=prompt.removeprefix("What is ").rstrip("?"))

    model = FunctionModel(answer)
    monkeypatch.setattr(providers, "resolve_model", lambda spec, **_: model)
    shutil.copytree(README.parent / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RINGLET_AGENTS_DIR", str(tmp_path / "agents"))
    commands = [shlex.split(line)[1:] for line in re.findall(r"^\.venv/bin/ringlet eval assistant .*$", section,
                                                               re.M)]
    assert len(commands) == 2
    first = CliRunner().invoke(app, commands[0])
    assert first.exit_code == 0, first.output
    assert ET.parse(tmp_path / "report.xml").getroot().get("tests") == "3"
    second = CliRunner().invoke(app, commands[1])
    assert second.exit_code == 0, second.output
    assert "no change against report.json" in second.stdout
    assert "no change against" in second.stdout


def _python_blocks() -> list[str]:
    import textwrap

    return [textwrap.dedent(b) for b in re.findall(r"```python\n(.*?)```", README.read_text(), re.S)]


def test_every_example_names_a_model_that_does_what_its_text_says() -> None:
    """A 135M local model does not call the examples' tools or fill their typed fields reliably: an example
    names a model that does (and runs here on a ScriptedModel), never the embedded `local:`."""
    agents = [b for b in _python_blocks() if "Agent(" in b]
    assert len(agents) >= 5
    assert [b.splitlines()[0] for b in agents if re.search(r"""Agent\(\s*["']local:""", b)] == []


def test_the_python_examples_have_no_unused_imports_and_fit_the_page(tmp_path: Path) -> None:
    import subprocess
    import sys

    for i, block in enumerate(_python_blocks()):
        (tmp_path / f"block_{i}.py").write_text(block)
    ruff = Path(sys.executable).with_name("ruff")
    done = subprocess.run([str(ruff), "check", "--no-cache", "--isolated", "--select", "F401,F811,F841,E501",
                           "--line-length", "120", str(tmp_path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout


def test_typed_output_is_optional_where_a_run_can_fail(tmp_path: Path) -> None:
    """pyright flags reading a field of `result.output` unchecked (it is None when the run failed); the
    README's typed-output example, which checks, has no error."""
    import subprocess
    import sys

    (tmp_path / "unchecked.py").write_text(
        "from pydantic import BaseModel\nfrom ringlet import Agent\n\n\nclass Invoice(BaseModel):\n"
        "    number: str\n\n\nresult = Agent('openai:gpt-4o-mini', output_type=Invoice).run_sync('x')\n"
        "print(result.output.number)\n")
    (tmp_path / "readme_typed.py").write_text(_python_block("output_validator"))
    pyright = Path(sys.executable).with_name("pyright")
    done = subprocess.run([str(pyright), "--outputjson", "--pythonpath", sys.executable, str(tmp_path)],
                          capture_output=True, text=True, check=False)
    found = [(Path(d["file"]).name, d["rule"]) for d in json.loads(done.stdout)["generalDiagnostics"]
             if d["severity"] == "error"]
    assert found == [("unchecked.py", "reportOptionalMemberAccess")]


def test_the_graph_forking_example_runs(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A poll run, its checkpoints, a fork after the first poll with the count edited, and a patch that misses."""
    monkeypatch.chdir(README.parent)
    _run(_python_block("agent.fork("), None, monkeypatch)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "done after 3 polls"
    assert out[1:6] == ["0 ['check'] 0", "1 ['check'] 1", "2 ['check'] 2", "3 ['done'] 3", "4 [] 3"]
    assert out[6:] == ["done after 6 polls", "cuont"]
