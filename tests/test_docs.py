"""The docs site: every Python example in `docs/` runs (a scripted model standing in for the hosted one it
names), is clean under ruff, every shell command shown exists or is run, the generated reference pages
describe everything they list, and `mkdocs build --strict` passes.

An example is found by a phrase of its code (`EXAMPLES`); one that names a hosted model runs with
`resolve_model` answering with the example's scripted model instead, in a folder of its own where
`examples/` and `.venv/` are the checkout's. A block preceded by `<!-- not run: why -->` is not run: the
test only checks that it says why.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ringlet.errors import ServerError
from ringlet.models import providers
from ringlet.testing import FunctionModel, ScriptedModel, call

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>\w*)[^\n]*\n(?P<code>.*?)^(?P=indent)```", re.S | re.M)
NOT_RUN = re.compile(r"<!-- not run: (?P<why>.{10,}?) -->")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    code: str
    note: str | None  # why it is not run, when it says so

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(DOCS)}:{self.line}"


def blocks(*langs: str) -> list[Block]:
    """Every fenced block of these languages in docs/**/*.md, dedented, with the note just before it."""
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text()
        for m in FENCE.finditer(text):
            if m["lang"] not in langs:
                continue
            before = text[:m.start()].rstrip().splitlines()
            note = NOT_RUN.fullmatch(before[-1].strip()) if before else None
            indent = len(m["indent"])
            code = "".join(line[indent:] for line in m["code"].splitlines(keepends=True))
            found.append(Block(page, text[:m.start()].count("\n") + 1, m["lang"], code, note and note["why"]))
    return found


# ------------------------------------------------------------------------------------------ the examples

def weather_fork(ran: list[str]) -> Any:
    def answer(request: Any) -> Any:
        last = request.messages[-1]
        if last.role == "user":
            return call("get_weather", city=last.text.split()[-1].rstrip("?"))
        ran.append(last.text)
        return f"It says: {last.text}"

    return FunctionModel(answer)


@dataclass
class Run:
    """What an example printed, the model that stood in (or None), and its working folder."""

    out: str
    model: Any
    folder: Path
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def lines(self) -> list[str]:
        return self.out.splitlines()


@dataclass(frozen=True)
class Example:
    model: Callable[[dict[str, Any]], Any] | None = None
    """The model that answers in place of the hosted one it names (from the test's scratch dict), or a dict
    of them by the name; None: the example runs as written."""
    check: Callable[[Run], None] = lambda run: None
    process: str | None = None
    """For an example that owns process-wide state (DBOS): the model's source, and it runs in a process of
    its own."""


def _check_library(run: Run) -> None:
    assert "Sunny in Paris. end_turn" in run.out
    assert "'type': 'message_end'" in run.out
    run.model.assert_complete()
    follow_up = [(m.role, m.text) for m in run.model.requests[-1].messages]  # the follow-up continues the chat
    assert follow_up[0] == ("user", "What's the weather in Paris?")
    assert ("assistant", "Sunny in Paris.") in follow_up
    assert follow_up[-1] == ("user", "And in Rome?")


def _check_approvals(run: Run) -> None:
    """The rules decide without a human where they can (a read tool, a deny pattern); an unmarked tool is
    `write` and asks; the run pauses, and resumes with the decisions, a denial's note reaching the model."""
    assert run.lines[0] == "input_required"
    assert run.lines[1:3] == [
        "call_2 send_message {'to': 'team@example.com', 'text': 'logs cleared'} write tool requires approval",
        "call_3 shell_exec {'cmd': 'rm logs/app.log.1'} shell_exec requires confirmation"]
    assert run.lines[3] == "Messaged the team; the shell command was refused."
    run.model.assert_complete()
    results = {m.tool_call_id: m.text for m in run.model.requests[-1].messages if m.role == "tool"}
    assert results["call_1"] == "app.log  app.log.1"  # read: ran at once
    assert results["call_2"] == "sent to team@example.com"  # approved after the pause
    assert json.loads(results["call_3"])["error"]["note"] == "not on Fridays"
    assert json.loads(results["call_4"])["error"] == {  # a deny pattern: no human was asked
        "code": "approval_denied", "message": r"blocked by approval rule 'rm\s+-rf'", "decided_by": "rule:deny_pattern",
        "note": None}


def _check_fork(run: Run) -> None:
    """Edit, a replaced tool result (the tool does not run) and a re-run (it does), each going on from there."""
    assert run.lines == ["It says: Sunny and 21 °C in Rome", "It says: Snowing and -2 °C in Paris",
                         "It says: Sunny and 21 °C in Paris"]
    assert run.extra["ran"] == ["Sunny and 21 °C in Paris", "Sunny and 21 °C in Rome", "Snowing and -2 °C in Paris",
                                "Sunny and 21 °C in Paris"]


def _check_replay(run: Run) -> None:
    """The recorded run replays without a second model request: the script holds one run only."""
    assert run.out == "same\n"
    run.model.assert_complete()
    assert len(run.model.requests) == 2
    assert (run.folder / "paris.json").exists()


def _check_hooks(run: Run) -> None:
    run.model.assert_complete()
    [result] = [m.text for m in run.model.requests[-1].messages if m.role == "tool"]
    assert json.loads(result)["error"]["code"] == "aborted"
    assert "searching for passwords is not allowed" in result
    assert run.out == "I may not look that up.\n"


def _check_settings(run: Run) -> None:
    [request] = run.model.requests
    assert request.settings.temperature == 0.2
    assert request.settings.max_tokens == 200
    assert run.out == "Tools in a row\n"


def _printed(run: Run, text: str, *, whole: bool = False) -> None:
    assert run.out == text if whole else text in run.out, run.out


def _check_steer(run: Run) -> None:
    """Queued while the tool ran, taken before the second request, which sees it last."""
    assert run.lines == ["steer_queued", "taken: True", "Two errors: the disk is full."]
    assert run.model.requests[1].messages[-1].text == "Only the errors, please"
    assert run.model.requests[1].messages[-2].role == "tool"


def _check_typed(run: Run) -> None:
    assert run.out == "A-17 12.5\n"
    assert "the total must be positive" in run.model.requests[1].messages[-1].text


def _check_evals(run: Run) -> None:
    assert run.out == "True 1.0\n"
    assert json.loads((run.folder / "report.json").read_text())["summary"]["passed"] == 1


def _check_graph_fork(run: Run) -> None:
    """A poll run, its checkpoints, a fork after the first poll with the count edited, and a patch that misses."""
    assert run.lines[0] == "done after 3 polls"
    assert run.lines[1:6] == ["0 ['check'] 0", "1 ['check'] 1", "2 ['check'] 2", "3 ['done'] 3", "4 [] 3"]
    assert run.lines[6:] == ["done after 6 polls", "cuont"]


def _check_cache_points(run: Run) -> None:
    [request] = run.model.requests
    assert (request.settings.prompt_cache, request.settings.cache_points) == (True, ("tools", "system"))
    assert run.out == "Shipped Monday. 0\n"


def _check_prompts(run: Run) -> None:
    assert "args-prompt" in run.lines[0]
    assert "Lyon" in run.lines[1]


def _check_guardrails(run: Run) -> None:
    [request] = run.model.requests
    assert request.messages[-1].text == "Where is [order]? Mail me at [email]"
    assert run.lines == ["input redact ('order', 'email')", "output allow ()"]


def _check_no_shouting(run: Run) -> None:
    assert run.model.requests == []  # blocked before the model saw it
    assert run.out == "guardrail_blocked guardrail 'no_shouting' blocked the message: please write without capitals\n"


EXAMPLES: dict[str, Example] = {
    'agent.stream("And in Rome?"': Example(
        lambda _: ScriptedModel([call("get_weather", city="Paris"), "Sunny in Paris.", "Rome too."]), _check_library),
    "ApprovalRules({": Example(lambda _: ScriptedModel([
        [call("list_files", folder="logs"), call("send_message", to="team@example.com", text="logs cleared"),
         call("shell_exec", cmd="rm logs/app.log.1"), call("shell_exec", cmd="sudo rm -rf /")],
        "Messaged the team; the shell command was refused."]), _check_approvals),
    "first.fork(": Example(lambda scratch: weather_fork(scratch.setdefault("ran", [])), _check_fork),
    "Recording()": Example(lambda _: ScriptedModel([call("get_weather", city="Paris"), "Sunny in Paris."]),
                           _check_replay),
    "output_validator": Example(
        lambda _: ScriptedModel([call("final_result", number="A-17", total=-12.5),
                                 call("final_result", number="A-17", total=12.5)]), _check_typed),
    "trigger-elicitation-request": Example(None, lambda run: _printed(run, "Name: Ada")),
    'OAuthToolset("files"': Example(
        None, lambda run: _printed(run, "Connected.") or _printed(run, "signed in as ana\n")),
    "trigger-sampling-request": Example(
        None, lambda run: _printed(run, "Still pond, one frog") or _printed(run, "\n3\n")),
    "from ringlet.evals import": Example(
        lambda _: ScriptedModel([call("get_weather", city="Paris"), "It is sunny in Paris."]), _check_evals),
    "agent.fork(first.run_id": Example(None, _check_graph_fork),
    'print(agent.run_sync("Weather in Paris?").output)': Example(
        lambda _: ScriptedModel([call("get_weather", city="Paris"), "Sunny in Paris."]),
        lambda run: _printed(run, "Sunny in Paris.\n", whole=True)),
    "class NoSecrets(Plugin)": Example(
        lambda _: ScriptedModel([call("search", query="admin password"), "I may not look that up."]), _check_hooks),
    "Write a haiku about tools.": Example(lambda _: ScriptedModel(["Tools in a row"]), _check_settings),
    'caller=Caller(user_id="ada"': Example(None, lambda run: _printed(run, "ada c_1\n", whole=True)),
    "FallbackModel(": Example(  # the primary is down: the fallback answers, and the answer says which model gave it
        lambda _: {"openai:gpt-4o": ScriptedModel([ServerError("down", status=503)], name="openai:gpt-4o"),
                   "anthropic:claude-sonnet-4-6": ScriptedModel(["Hello!"], name="anthropic:claude-sonnet-4-6")},
        lambda run: _printed(run, "Hello! from anthropic:claude-sonnet-4-6\n", whole=True)),
    "folder / \"ops.rego\"": Example(None, lambda run: _printed(run, "I may not delete it.\ndeny\n", whole=True)),
    "model.assert_complete()": Example(None),
    "The sum is": Example(None),
    "DurableAgent(": Example(check=lambda run: _printed(run, "Logged.\n", whole=True),
                             process='ScriptedModel([call("log_expense", amount=12.5, note="taxi"), "Logged."])'),
    "everything.list_prompts()": Example(None, _check_prompts),
    "hmac.new(": Example(None),
    "cache_points=(": Example(lambda _: ScriptedModel(["Shipped Monday."]), _check_cache_points),
    "InjectionGuardrail(),": Example(lambda _: ScriptedModel(["It ships tomorrow."]), _check_guardrails),
    "class NoShouting": Example(lambda _: ScriptedModel([]), _check_no_shouting),
    'stream.steer("Only the errors, please")': Example(
        lambda _: ScriptedModel([call("read_logs", service="api"), "Two errors: the disk is full."]), _check_steer),
}
"""Each Python example of the docs, by a phrase of its code: the model standing in, and what it must print."""

SERVED = ("OpenAI(base_url=", "A2ACardResolver(")
"""Examples that are clients of a running server: they run against a real one on loopback."""


def python_blocks() -> list[Block]:
    return blocks("python")


def example_of(block: Block) -> Example | None:
    found = [example for phrase, example in EXAMPLES.items() if phrase in block.code]
    assert len(found) <= 1, f"{block.id}: more than one example matches"
    return found[0] if found else None


def _folder(tmp_path: Path) -> Path:
    """A working folder where `examples/` and `.venv/` are the checkout's (as paths in the docs name them)."""
    for name in ("examples", ".venv"):
        (tmp_path / name).symlink_to(ROOT / name)
    return tmp_path


def _exec(block: Block) -> None:
    exec(compile(block.code, block.id, "exec"), {"__name__": "__main__"})


RUNNER = """import runpy, sys
import ringlet.agent
from ringlet.errors import ServerError
from ringlet.models import providers
from ringlet.testing import FunctionModel, ScriptedModel, call
model = {model}
providers.resolve_model = ringlet.agent.resolve_model = lambda spec, **_: model
runpy.run_path(sys.argv[1], run_name="__main__")
"""


def _exec_apart(block: Block, model: str, folder: Path) -> str:
    """Run `block` in a Python process of its own, `model` answering for the one it names; its output."""
    (folder / "example.py").write_text(block.code)
    (folder / "runner.py").write_text(RUNNER.format(model=model))
    done = subprocess.run([sys.executable, "runner.py", "example.py"], cwd=folder, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, f"{block.id}: {done.stderr[-3000:]}"
    return done.stdout


@pytest.mark.parametrize("block", [b for b in python_blocks() if not any(s in b.code for s in SERVED)],
                         ids=lambda b: b.id)
def test_the_example_runs(block: Block, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                          tmp_path: Path) -> None:
    import ringlet.agent

    assert block.note is None, f"{block.id}: a Python example is run, not marked '{block.note}'"
    example = example_of(block)
    assert example is not None, f"{block.id}: add the example to EXAMPLES (the model it runs on, what it prints)"
    scratch: dict[str, Any] = {}
    model = example.model(scratch) if example.model is not None else None

    def resolve(spec: Any, **_: Any) -> Any:
        if model is None:
            raise AssertionError(f"{block.id} names a model ({spec!r}): give it one in EXAMPLES")
        return model[spec] if isinstance(model, dict) else model

    for module in (providers, ringlet.agent):
        monkeypatch.setattr(module, "resolve_model", resolve)
    monkeypatch.chdir(_folder(tmp_path))
    monkeypatch.setenv("RINGLET_AGENTS_DIR", str(tmp_path / "agents"))
    if example.process is not None:
        example.check(Run(_exec_apart(block, example.process, tmp_path), None, tmp_path))
        return
    _exec(block)
    example.check(Run(capsys.readouterr().out, model, tmp_path, scratch))


def _assistant(request: Any) -> Any:
    return "391" if "17 * 23" in request.messages[-1].text else "Hello!"


async def test_the_client_examples_run_against_a_real_server(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The openai SDK and A2A client examples, as written, against `ringlet serve`'s app on loopback (an
    `assistant` agent on a FunctionModel); only the address and the key are this server's."""
    from ringlet import Agent
    from ringlet.server import ServerSettings, create_app
    from ringlet.store import Store
    from serving import serving

    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'ringlet.db'}")
    try:
        app = create_app(ServerSettings(), store=store, agents=[Agent(FunctionModel(_assistant), name="assistant")])
        served = [b for b in python_blocks() if any(s in b.code for s in SERVED)]
        assert len(served) == 4
        async with serving(app) as url:
            key, _ = await store.keys.create("docs", scopes=["chat"])
            for block in served:
                code = block.code.replace("http://localhost:8000", url).replace("http://127.0.0.1:8000", url)
                await asyncio.to_thread(_exec, Block(block.page, block.line, block.lang, code.replace("rk_…", key),
                                                     None))
    finally:
        await store.close()
    out = capsys.readouterr().out
    assert "ChatCompletion(" in out  # the first openai example prints the completion
    assert "'Hello!'" in out
    assert "391\n" in out  # the streamed one prints the tokens
    assert "TASK_STATE_COMPLETED" in out  # the A2A client's task


def test_every_example_is_clean_under_ruff(tmp_path: Path) -> None:
    """No unused import, nothing undefined, no line past 120 characters: what a reader copies works."""
    for i, block in enumerate(python_blocks()):
        (tmp_path / f"{block.page.stem}_{block.line}_{i}.py").write_text(block.code)
    ruff = Path(sys.executable).with_name("ruff")
    done = subprocess.run([str(ruff), "check", "--no-cache", "--isolated", "--select", "F,E501,E9",
                           "--line-length", "120", str(tmp_path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout


def test_every_example_names_a_model_that_does_what_its_text_says() -> None:
    """A 135M local model does not call the examples' tools or fill their typed fields reliably: an example
    names a model that does (and runs here on a scripted one), never the embedded `local:`."""
    agents = [b for b in python_blocks() if "Agent(" in b.code]
    assert len(agents) >= 10
    assert [b.id for b in agents if re.search(r"""Agent\(\s*["']local:""", b.code)] == []


def docstring_examples() -> list[Block]:
    """Every ```python example in a docstring of src/ (and any `>>>` line, which is refused)."""
    import ast

    found = []
    for path in sorted((ROOT / "src").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node)
                assert doc is None or ">>> " not in doc, f"{path}: write a ```python example, run by test_docs.py"
                for m in FENCE.finditer(doc or ""):
                    if m["lang"] == "python":
                        line = node.lineno if not isinstance(node, ast.Module) else 1
                        found.append(Block(path, line, "python", m["code"], None))
    return found


def test_the_docstring_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each example in a docstring runs as written (on a test double: nothing in src/ names a hosted model
    there) and is clean under ruff."""
    examples = docstring_examples()
    assert len(examples) >= 1
    monkeypatch.chdir(tmp_path)
    for block in examples:
        exec(compile(block.code, str(block.page), "exec"), {"__name__": "__main__"})
        (tmp_path / f"{block.page.stem}_{block.line}.py").write_text(block.code)
    ruff = Path(sys.executable).with_name("ruff")
    done = subprocess.run([str(ruff), "check", "--no-cache", "--isolated", "--select", "F,E501,E9",
                           "--line-length", "120", str(tmp_path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout


# ------------------------------------------------------------------------------------------ shell commands

SHELL_RUN = {
    ".venv/bin/ringlet graph validate examples/graphs/triage",
    ".venv/bin/ringlet run examples/graphs/poll go --json",
    '.venv/bin/ringlet run examples/graphs/signoff "v2 ships"',
    ".venv/bin/ringlet eval assistant examples/evals/assistant.yaml --json report.json --junit report.xml",
}
"""Shell blocks run by a test (here or elsewhere), by their first command."""


def shell_commands(block: Block) -> list[str]:
    """The commands of a shell block: comments dropped, continued lines joined."""
    commands, current = [], ""
    for raw in block.code.splitlines():
        line = raw.split(" #")[0].rstrip() if not raw.startswith("#") else ""
        current += line.removesuffix("\\")
        if not line.endswith("\\") and current.strip():
            commands.append(current.strip())
            current = ""
    return commands


def test_every_shell_block_is_run_or_says_why_not() -> None:
    unexplained = [b.id for b in blocks("sh", "bash")
                   if b.note is None and not any(c.startswith(tuple(SHELL_RUN)) for c in shell_commands(b))]
    assert unexplained == []


def test_every_command_shown_starts_as_a_fresh_checkout_can_run_it() -> None:
    """make, curl, or `.venv/bin/…` (a bare `ringlet` is not on PATH), and every environment line an export."""
    starts = ("make ", "curl ", ".venv/bin/ringlet ", ".venv/bin/python ", "export ")
    wrong = [(b.id, c) for b in blocks("sh", "bash") for c in shell_commands(b) if not c.startswith(starts)]
    assert wrong == []


def _cli_words() -> list[tuple[str, list[str]]]:
    """Every `.venv/bin/ringlet …` command of the docs (blocks and inline code), as its words."""
    found = []
    for block in blocks("sh", "bash"):
        found += [(block.id, shlex.split(c.split("<")[0])[1:]) for c in shell_commands(block)
                  if c.startswith(".venv/bin/ringlet ")]
    for page in DOCS.rglob("*.md"):
        for inline in re.findall(r"`(\.venv/bin/ringlet [^`]+)`", page.read_text()):
            if "[" not in inline and "|" not in inline:
                found.append((page.name, shlex.split(inline)[1:]))
    return found


def test_every_ringlet_command_shown_exists_with_its_options() -> None:
    """Each command line parses against the real Typer app: the command, its subcommand and every option."""
    import click
    import typer.main

    from ringlet.cli import app

    root: Any = typer.main.get_command(app)
    words = _cli_words()
    assert len(words) >= 25
    for where, args in words:
        command, ctx_args = root, list(args)
        while hasattr(command, "commands") and ctx_args and ctx_args[0] in command.commands:
            command = command.commands[ctx_args.pop(0)]
        assert not hasattr(command, "commands") or command.name == "eval", f"{where}: {args}"
        try:
            command.make_context(command.name, ctx_args, resilient_parsing=False)
        except click.exceptions.Exit:
            pass
        except click.UsageError as exc:
            pytest.fail(f"{where}: ringlet {' '.join(args)}: {exc}")


def test_the_graph_commands_run_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`graph validate`, `graph show` and a run of `poll` (which needs no model), as the Graphs page shows them
    (`--resume` is run on the paused signoff graph below)."""
    from typer.testing import CliRunner

    from ringlet.cli import app

    monkeypatch.chdir(_folder(tmp_path))
    monkeypatch.setenv("RINGLET_DATA_DIR", str(tmp_path / "data"))
    [block] = [b for b in blocks("sh") if "graph validate examples/graphs/triage" in b.code]
    ran = [CliRunner().invoke(app, shlex.split(c)[1:]) for c in shell_commands(block)[:3]]
    assert [r.exit_code for r in ran] == [0, 0, 0], [r.output for r in ran]
    assert ran[1].stdout.startswith("flowchart")
    assert "done after 3 polls" in ran[2].stdout


def _graph_session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first_command: str) -> list[list[str]]:
    monkeypatch.chdir(_folder(tmp_path))
    monkeypatch.setenv("RINGLET_DATA_DIR", str(tmp_path / "data"))
    [block] = [b for b in blocks("sh") if first_command in b.code]
    return [shlex.split(c.split("<")[0]) for c in shell_commands(block)]


def test_the_graph_fork_commands_run_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A poll run, its checkpoints, one checkpoint's state and a fork with the count edited (Forks and replay),
    the run id the first command prints standing for `r_…`."""
    from typer.testing import CliRunner

    from ringlet.cli import app

    commands = _graph_session(tmp_path, monkeypatch, "ringlet run examples/graphs/poll go --json")
    first = CliRunner().invoke(app, commands[0][1:])
    assert first.exit_code == 0, first.output
    run_id = json.loads(first.stdout)["run_id"]
    done = [CliRunner().invoke(app, [w.replace("r_…", run_id) for w in c[1:]]) for c in commands[1:]]
    assert [d.exit_code for d in done] == [0, 0, 0], [d.output for d in done]
    assert json.loads(done[1].stdout) == {"count": 1, "initial_prompt": "go"}
    assert "done after 6 polls" in done[2].stdout


def test_the_paused_graph_commands_run_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a terminal the signoff graph pauses (exit 3) saying how to go on; the second command does."""
    from typer.testing import CliRunner

    from ringlet.cli import app

    commands = _graph_session(tmp_path, monkeypatch, "examples/graphs/signoff")
    paused = CliRunner().invoke(app, commands[0][1:], input="")
    assert paused.exit_code == 3, paused.output
    run_id = re.search(r"--resume (r_\w+)", paused.output)
    assert run_id is not None, paused.output
    resumed = CliRunner().invoke(app, [w.replace("r_…", run_id[1]) for w in commands[1][1:]])
    assert resumed.exit_code == 0, resumed.output


def test_the_evals_commands_run_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`ringlet eval` as the CI guide shows it, on the example dataset the Evals page quotes, with a scripted
    model standing in for the embedded one."""
    from xml.etree import ElementTree as ET

    from typer.testing import CliRunner

    from ringlet.cli import app

    evals = (DOCS / "concepts" / "evals.md").read_text()
    quoted = re.search(r"```yaml\n# examples/evals/assistant.yaml\n(.*?)```", evals, re.S)
    assert quoted is not None
    dataset = (ROOT / "examples/evals/assistant.yaml").read_text()
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
    monkeypatch.chdir(_folder(tmp_path))
    monkeypatch.setenv("RINGLET_AGENTS_DIR", str(tmp_path / "agents"))
    [block] = [b for b in blocks("sh") if "ringlet eval assistant" in b.code]
    commands = [shlex.split(c)[1:] for c in shell_commands(block)]
    assert len(commands) == 2
    first = CliRunner().invoke(app, commands[0])
    assert first.exit_code == 0, first.output
    assert ET.parse(tmp_path / "report.xml").getroot().get("tests") == "3"
    second = CliRunner().invoke(app, commands[1])
    assert second.exit_code == 0, second.output
    assert "no change against report.json" in second.stdout


def test_the_rego_examples_compile() -> None:
    """Each Rego policy shown loads in the real interpreter."""
    from ringlet.gates import PolicySet

    policies = blocks("rego")
    assert len(policies) >= 3
    for block in policies:
        package = re.search(r"^package ([\w.]+)", block.code, re.M)
        assert package is not None, block.id
        PolicySet.compile({f"{block.page.stem}_{block.line}.rego": block.code})


def test_the_config_examples_are_valid_config_yaml() -> None:
    """Each `config.yaml` shown (or part of one) is YAML the agent loader takes: every key known, every
    value of its type. The eval dataset, the CI step and the deployment files (included with `--8<--`,
    tests/test_deploy.py) are checked elsewhere."""
    import yaml

    from ringlet.agent.config import AgentConfig

    configs = [b for b in blocks("yaml") if not b.code.startswith(("# examples/evals/", "- run:", "--8<-- "))]
    assert len(configs) >= 8
    for block in configs:
        AgentConfig.model_validate(yaml.safe_load(block.code))


# ------------------------------------------------------------------------------------------ the reference

def _reference() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_reference", DOCS / "gen_reference.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_setting_has_a_description() -> None:
    rows = _reference().settings_rows()
    assert len(rows) >= 40
    assert [r["variable"] for r in rows if not r["description"]] == []


def test_every_ringlet_variable_read_in_src_is_on_the_settings_page() -> None:
    gen = _reference()
    read = {v for p in (ROOT / "src").rglob("*.py") for v in re.findall(r"RINGLET_[A-Z0-9_]*[A-Z0-9]", p.read_text())}
    read -= {"RINGLET_"}
    page = gen.settings_page()
    assert sorted(v for v in read if f"`{v}`" not in page) == []
    assert all(text for text in gen.OTHER_VARIABLES.values())


def test_every_cli_command_and_option_has_a_description() -> None:
    gen = _reference()
    commands = list(gen.cli_commands())
    assert len(commands) >= 20
    assert [path for path, command in commands if not (command.help or "").strip()] == []
    assert [(path, p["names"]) for path, command in commands for p in gen.cli_params(command) if not p["help"]] == []
    page = gen.cli_page()
    assert all(f"## `{path}`" in page for path, _ in commands if path != "ringlet")


def test_every_event_type_has_a_description() -> None:
    from ringlet.events import event_adapter

    gen = _reference()
    rows = gen.event_rows()
    schema = event_adapter.json_schema()
    kinds = {d["properties"]["type"]["const"] for d in schema["$defs"].values() if "type" in d.get("properties", {})}
    assert {r["type"] for r in rows} == kinds
    assert [r["type"] for r in rows if not r["doc"]] == []
    page = gen.events_page()
    assert all(f"## `{kind}`" in page for kind in kinds)


def _codes_reported() -> set[str]:
    """Error codes the source reports: raised, returned as a tool's error, answered over HTTP."""
    from ringlet import errors

    patterns = [r'(?:RunError|ToolFailure|ChildFailure|ForkError|NotReplayable|Deny)\(\s*"([a-z_]+)"',
                r'error_outcome\([\w.]+,\s*"([a-z_]+)"', r'ApiError\(\d+,\s*"([a-z_]+)"', r'\bcode="([a-z_]+)"',
                r'"code": "([a-z_]+)"', r'error_body\(\d+,\s*"([a-z_]+)"']
    found = {code for p in (ROOT / "src").rglob("*.py") for pattern in patterns
             for code in re.findall(pattern, p.read_text())}
    from ringlet.server.http.errors import _HTTP_CODES  # the status → code table itself

    found |= set(_HTTP_CODES.values())
    found |= {cls("x").code for cls in vars(errors).values()
              if isinstance(cls, type) and issubclass(cls, errors.ProviderError)}
    return found


def test_every_error_code_has_a_description() -> None:
    from ringlet.error_codes import CODES

    documented = {code for codes in CODES.values() for code in codes}
    assert sorted(_codes_reported() - documented) == []
    assert [code for codes in CODES.values() for code, text in codes.items() if len(text) < 10] == []
    page = _reference().errors_page()
    assert all(f"| `{code}` |" in page for code in documented)


def test_the_config_reference_lists_every_key() -> None:
    from ringlet.agent.config import AgentConfig
    from ringlet.graph.spec import GraphSpec

    page = _reference().config_page()
    for model in (AgentConfig, GraphSpec):
        assert all(f"| `{f.alias or name}` |" in page for name, f in model.model_fields.items())


def test_the_http_reference_lists_every_route() -> None:
    gen = _reference()
    doc = gen.openapi_document()
    page = gen.http_page()
    routes = [(m.upper(), path) for path, item in doc["paths"].items() for m in item]
    assert len(routes) >= 40
    assert [r for r in routes if f"| `{r[0]}` | `{r[1]}` |" not in page] == []


# ------------------------------------------------------------------------------------------ the site

def test_every_page_is_in_the_navigation_and_two_clicks_from_home() -> None:
    """Each page is in mkdocs.yml's nav, and linked from the home page or from a page it links to."""
    import yaml

    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)  # !ENV tags as text
    nav = json.dumps(config["nav"])
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")} | set(_reference().PAGES)
    assert sorted(p for p in pages if f'"{p}"' not in nav) == []
    home = (DOCS / "index.md").read_text()
    first = {os.path.normpath(link) for link in re.findall(r"\]\(([^)#]+\.md)", home)}
    reached = set(first)
    for page in first:
        source = DOCS / page
        if source.exists():
            reached |= {os.path.normpath(os.path.join(os.path.dirname(page), link))
                        for link in re.findall(r"\]\(([^)#:]+\.md)", source.read_text())}
    assert sorted(pages - reached - {"index.md"}) == []


def test_the_docs_speak_of_features_not_of_how_the_work_was_organised() -> None:
    text = "\n".join(p.read_text() for p in DOCS.rglob("*.md"))
    assert re.findall(r"(?i)\bissue\s*#?\d+", text) == []
    assert "shared/specs" not in text
    assert "README" not in text


def test_the_get_started_page_gives_the_embedded_model_s_measured_figure() -> None:
    """The embedded model's held-out figure, as the README states it (tests/test_held_out.py)."""
    assert "`bench/assistant.py --set held-out`) it answered" in (DOCS / "get-started.md").read_text()


def test_the_screenshots_are_the_test_suites() -> None:
    """Each picture of the web UI is taken by a web UI test from a real server (`DOCS_IMAGES` in
    test_webui.py), and each one is shown on a page."""
    from test_webui import DOCS_IMAGES

    shown = {Path(m).name for p in DOCS.rglob("*.md") for m in re.findall(r"\]\(([^)]*images/[^)]+)\)", p.read_text())}
    taken = {f"{name}.png" for name in DOCS_IMAGES.values()}
    assert shown == taken
    assert {p.name for p in (DOCS / "images").iterdir()} == taken


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """`make docs`: `mkdocs build --strict` (any warning, broken link or missing reference fails), with
    llms.txt and llms-full.txt beside the pages."""
    mkdocs = Path(sys.executable).with_name("mkdocs")
    started = time.monotonic()
    done = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                          capture_output=True, text=True, check=False,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1",
                               "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])})
    assert done.returncode == 0, done.stderr[-4000:]
    print(f"mkdocs build --strict: {time.monotonic() - started:.1f} s")
    assert "Get started" in (tmp_path / "site" / "llms.txt").read_text()
    full = (tmp_path / "site" / "llms-full.txt").read_text()
    assert "RINGLET_WORKER_TIMEOUT_S" in full
    assert "approval_required" in full
    assert (tmp_path / "site" / "reference" / "openapi.json").exists()
