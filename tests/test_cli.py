"""The `ringlet` command, with scripted models standing in for providers."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from ringlet.cli import app
from ringlet.cli.render import TerminalApprover
from ringlet.models import providers
from ringlet.testing import ScriptedModel, call

runner = CliRunner()


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> list[ScriptedModel]:
    """`--model scripted:<n>` picks the n-th scripted model below."""
    models = [
        ScriptedModel([call("calculate", expression="17 * 23"), "It is 391."], name="scripted:0"),
        ScriptedModel(["plain answer"], name="scripted:1"),
        ScriptedModel([RuntimeError("boom")], name="scripted:2"),
    ]
    real = providers.resolve_model

    def resolve(spec: Any, **options: Any) -> Any:
        if isinstance(spec, str) and spec.startswith("scripted:"):
            return models[int(spec.split(":")[1])]
        return real(spec, **options)

    monkeypatch.setattr(providers, "resolve_model", resolve)
    monkeypatch.setenv("RINGLET_AGENTS_DIR", "/nonexistent")
    return models


def test_run_streams_text_tool_calls_and_a_usage_line(scripted: list[ScriptedModel]) -> None:
    result = runner.invoke(app, ["run", "assistant", "What is 17 * 23?", "--model", "scripted:0"])
    assert result.exit_code == 0, result.output
    assert "It is 391." in result.stdout
    assert "calculate" in result.stderr
    assert "→ 391" in result.stderr
    assert "end_turn · " in result.stderr
    assert "tokens" in result.stderr
    scripted[0].assert_complete()


def test_run_json_prints_the_run_result(scripted: list[ScriptedModel]) -> None:
    result = runner.invoke(app, ["run", "assistant", "hi", "--model", "scripted:1", "--json"])
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["output"] == "plain answer"
    assert data["finish_reason"] == "end_turn"
    assert set(data["usage"]) >= {"in_tokens", "out_tokens", "cost_usd"}
    assert [m["role"] for m in data["messages"]] == ["user", "assistant"]


def test_run_events_prints_json_lines(scripted: list[ScriptedModel]) -> None:
    result = runner.invoke(app, ["run", "assistant", "hi", "--model", "scripted:0", "--events"])
    assert result.exit_code == 0
    events = [json.loads(line) for line in result.stdout.splitlines()]
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message_start"
    assert kinds[-1] == "message_end"
    assert "tool_result" in kinds
    assert all("run_id" in e for e in events)


def test_a_failed_run_exits_1(scripted: list[ScriptedModel]) -> None:
    result = runner.invoke(app, ["run", "assistant", "hi", "--model", "scripted:2"])
    assert result.exit_code == 1
    assert "internal_error" in result.stderr


def test_an_unknown_agent_exits_2_with_a_hint(scripted: list[ScriptedModel]) -> None:
    result = runner.invoke(app, ["run", "asistant", "hi"])
    assert result.exit_code == 2
    assert "no agent named 'asistant'; did you mean 'assistant'?" in result.stderr
    assert "hint:" in result.stderr


def test_a_bad_config_exits_2_naming_file_and_line(tmp_path: Path, scripted: list[ScriptedModel]) -> None:
    agent = tmp_path / "helper"
    agent.mkdir()
    (agent / "config.yaml").write_text("name: helper\ninstructions: hi\nmax_iteration: 3\n")
    result = runner.invoke(app, ["run", str(agent), "hi", "--model", "scripted:1"])
    assert result.exit_code == 2
    assert f"{agent / 'config.yaml'}:3:1: unknown key 'max_iteration'; did you mean 'max_iterations'?" in result.stderr


def test_a_bad_model_name_exits_2(scripted: list[ScriptedModel]) -> None:
    result = runner.invoke(app, ["run", "assistant", "hi", "--model", "nope"])
    assert result.exit_code == 2
    assert "is not `provider:model`" in result.stderr


def test_json_and_events_exclude_each_other(scripted: list[ScriptedModel]) -> None:
    assert runner.invoke(app, ["run", "assistant", "hi", "--json", "--events"]).exit_code == 2


def test_agents_and_models_list(scripted: list[ScriptedModel]) -> None:
    result = runner.invoke(app, ["agents"])
    assert result.exit_code == 0
    assert "assistant" in result.stdout
    result = runner.invoke(app, ["models"])
    assert result.exit_code == 0
    for name in ("openai", "anthropic", "gemini", "ollama", "local"):
        assert name in result.stdout
    assert "default model:" in result.stdout


def test_agents_lists_a_graph_agents_description(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "flow").mkdir()
    (tmp_path / "flow" / "graph.yaml").write_text("name: flow\ndescription: Sorts the mail.\nstart: done\n"
                                                 "nodes:\n  done: {type: end, output: ok}\n")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "graph.yaml").write_text("name: [unclosed\n")
    monkeypatch.setenv("RINGLET_AGENTS_DIR", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "200")
    result = runner.invoke(app, ["agents"])
    assert result.exit_code == 0, result.output
    row = next(line for line in result.stdout.splitlines() if " flow " in line)
    assert "graph" in row
    assert "Sorts the mail." in row
    assert "broken" in result.stdout  # listed, with no description, not an error


def test_chat_keeps_the_conversation(scripted: list[ScriptedModel], monkeypatch: pytest.MonkeyPatch) -> None:
    model = ScriptedModel(["first", "second", "after reset"], name="scripted:3")
    scripted.append(model)
    result = runner.invoke(app, ["chat", "assistant", "--model", "scripted:3"],
                           input="hello\nmore\n/reset\nagain\n/exit\n")
    assert result.exit_code == 0
    assert [len(r.messages) for r in model.requests] == [1, 3, 1]
    assert "conversation cleared" in result.stderr


def test_keys_create_list_revoke(tmp_path: Path) -> None:
    db = f"sqlite+aiosqlite:///{tmp_path / 'keys.db'}"
    created = runner.invoke(app, ["keys", "create", "ci", "--scope", "chat", "--scope", "admin", "--db", db])
    assert created.exit_code == 0, created.output
    key = created.stdout.strip()
    assert key.startswith("rk_")
    listed = runner.invoke(app, ["keys", "list", "--db", db])
    assert "ci" in listed.stdout
    assert key not in listed.stdout
    key_id = created.stderr.split(":")[0].strip()
    assert runner.invoke(app, ["keys", "revoke", key_id, "--db", db]).exit_code == 0
    assert runner.invoke(app, ["keys", "revoke", key_id, "--db", db]).exit_code == 1
    bad = runner.invoke(app, ["keys", "create", "x", "--scope", "god", "--db", db])
    assert bad.exit_code == 2
    assert "unknown scope 'god'" in bad.stderr


def test_runs_lists_the_stored_runs_newest_first(tmp_path: Path) -> None:
    """`ringlet runs`: the ids `ringlet replay` takes, newest first, filtered by agent and status."""
    import asyncio

    from ringlet.store import Store

    db = f"sqlite+aiosqlite:///{tmp_path / 'runs.db'}"

    async def seed() -> list[str]:
        store = await Store.open(db)
        try:
            conversation = await store.conversations.create(agent="helper", realm="default")
            for n, (agent, status) in enumerate((("helper", "completed"), ("other", "completed"),
                                                 ("helper", "failed"))):
                await store.runs.create(f"r_{n}", agent=agent, conversation_id=conversation.id, realm="default")
                await store.runs.finish(f"r_{n}", status=status, finish_reason="end_turn", in_tokens=1,
                                        out_tokens=2, cost_usd=None, conversation_id=conversation.id)
            return [r.id for r in await store.runs.list()]
        finally:
            await store.close()

    newest = asyncio.run(seed())
    assert sorted(newest) == ["r_0", "r_1", "r_2"]
    listed = runner.invoke(app, ["runs", "--db", db, "--json"])
    assert listed.exit_code == 0, listed.output
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [r["id"] for r in rows] == newest
    assert rows[0]["usage"] == {"in_tokens": 1, "out_tokens": 2, "cost_usd": None}
    helper = runner.invoke(app, ["runs", "--db", db, "--agent", "helper", "--status", "completed"])
    assert helper.exit_code == 0, helper.output
    assert "r_0" in helper.stdout
    assert "r_1" not in helper.stdout
    assert "r_2" not in helper.stdout
    assert runner.invoke(app, ["runs", "--db", db, "-n", "1", "--json"]).stdout.count("\n") == 1


def test_run_behind_a_policy(scripted: list[ScriptedModel], tmp_path: Any) -> None:
    rule = tmp_path / "no_math.rego"
    rule.write_text('package ringlet\nimport rego.v1\ndeny contains "no arithmetic today" if {\n'
                    '  input.resource.tool == "calculate"\n  input.subject.channel == "cli"\n}\n')
    result = runner.invoke(app, ["run", "assistant", "17 * 23?", "--model", "scripted:0", "--events",
                                 "--policy", str(rule)])
    assert result.exit_code == 0, result.output
    results = [json.loads(line) for line in result.stdout.splitlines() if '"tool_result"' in line]
    assert results[0]["error"]["code"] == "policy_denied"
    assert results[0]["error"]["message"] == "no arithmetic today"
    assert scripted[0].requests[1].messages[-1].role == "tool"
    broken = tmp_path / "broken.rego"
    broken.write_text("package ringlet\ndeny[msg] { msg := 1 }\n")
    refused = runner.invoke(app, ["run", "assistant", "hi", "--model", "scripted:1", "--policy", str(broken)])
    assert refused.exit_code == 2
    assert "`deny[msg] { … }` is Rego v0 syntax" in refused.stderr  # brackets survive the terminal markup


def approval_agent(tmp_path: Path) -> Path:
    """An agent whose `shout` tool (a write tool) needs approval."""
    agent = tmp_path / "loud"
    agent.mkdir()
    (agent / "config.yaml").write_text("tools: [shout]\n")
    (agent / "tools.py").write_text("def shout(text: str) -> str:\n    '''Upper-case.'''\n    return text.upper()\n")
    return agent


def test_without_a_terminal_a_run_that_needs_approval_pauses_with_exit_3(
        scripted: list[ScriptedModel], tmp_path: Path) -> None:
    scripted.append(ScriptedModel([call("shout", text="hi")], name="scripted:3"))
    result = runner.invoke(app, ["run", str(approval_agent(tmp_path)), "go", "--model", "scripted:3"])
    assert result.exit_code == 3, result.output
    assert "needs approval: write tool requires approval" in result.stderr
    assert "paused: waiting for approval of shout" in result.stderr
    assert "--yes" in result.stderr


def test_yes_approves_every_call(scripted: list[ScriptedModel], tmp_path: Path) -> None:
    scripted.append(ScriptedModel([call("shout", text="hi"), "done"], name="scripted:3"))
    result = runner.invoke(app, ["run", str(approval_agent(tmp_path)), "go", "--model", "scripted:3", "--yes",
                                 "--json"])
    assert result.exit_code == 0, result.output
    tool = next(m for m in json.loads(result.stdout)["messages"] if m["role"] == "tool")
    assert tool["content"] == "HI"


@pytest.mark.parametrize(("answer", "expected"), [
    ("y", "HI"),
    ("n", {"error": {"code": "approval_denied", "message": "denied by cli:user", "decided_by": "cli:user",
                     "note": None}}),
    ("not now", {"error": {"code": "approval_denied", "message": "denied by cli:user: not now",
                           "decided_by": "cli:user", "note": "not now"}}),
])
def test_a_terminal_asks_y_n_or_note(scripted: list[ScriptedModel], tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch, answer: str, expected: Any) -> None:
    model = ScriptedModel([call("shout", text="hi"), "done"], name="scripted:3")
    scripted.append(model)
    monkeypatch.setattr("ringlet.cli.approver", lambda yes: TerminalApprover(Console(stderr=True)))
    result = runner.invoke(app, ["run", str(approval_agent(tmp_path)), "go", "--model", "scripted:3"],
                           input=f"{answer}\n")
    assert result.exit_code == 0, result.output
    assert "approve? [y/n/note]" in result.stdout  # the prompt of input()
    content = model.requests[1].messages[-1].content
    assert (content if answer == "y" else json.loads(content)) == expected


@contextlib.contextmanager
def http_server(paths: list[str]) -> Iterator[int]:
    """A real HTTP server on a loopback port that answers every GET with `{}` (noting its path)."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            paths.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def model_rows(stdout: str) -> dict[str, list[str]]:
    names = set(providers.PROVIDERS)
    return {cells[0]: cells[1:] for line in stdout.splitlines() if (cells := line.split()) and cells[0] in names}


def test_models_prints_hints_unbroken_and_calls_a_local_server_usable_only_when_it_answers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("ringlet.cli.out", Console(width=40, soft_wrap=True, highlight=False))  # a narrow terminal
    paths: list[str] = []
    with http_server(paths) as port:
        monkeypatch.setenv("OLLAMA_HOST", f"127.0.0.1:{port}")  # as Ollama takes it: no scheme
        result = runner.invoke(app, ["models"])
        assert result.exit_code == 0, result.output
        rows = model_rows(result.stdout)
        assert rows["ollama"][:1] == ["yes"]
        assert rows["openai"][:3] == ["no", "no", "key"]
        lines = result.stdout.splitlines()
        assert "openai: set OPENAI_API_KEY or OPENAI_BASE_URL (the base URL of an OpenAI-compatible server)" in lines
        assert "gemini: set GEMINI_API_KEY or GOOGLE_API_KEY" in lines
        assert not any(line.startswith("ollama:") for line in lines)

        monkeypatch.setenv("OPENAI_BASE_URL", f"http://127.0.0.1:{port}/v1/")  # a local server, no key
        rows = model_rows(runner.invoke(app, ["models"]).stdout)
        assert rows["openai"][:1] == ["yes"]
        assert sorted(set(paths)) == ["/api/tags", "/v1/models"]

    result = runner.invoke(app, ["models"])  # the servers are gone: nothing answers on that port any more
    rows = model_rows(result.stdout)
    assert rows["ollama"][:3] == ["no", "no", "server"]
    assert rows["openai"][:3] == ["no", "no", "server"]
    lines = result.stdout.splitlines()
    assert (f"ollama: nothing answers at http://127.0.0.1:{port}: start the server, or set OLLAMA_HOST to where "
            "it runs") in lines
    assert f"openai: nothing answers at http://127.0.0.1:{port}/v1: start the server, or set OPENAI_BASE_URL to " \
           "where it runs" in lines


def test_worker_and_the_dbos_engine_need_postgresql(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RINGLET_DB_URL", raising=False)
    monkeypatch.delenv("RINGLET_ENGINE", raising=False)
    sqlite = f"sqlite:///{tmp_path / 'r.db'}"
    worker = runner.invoke(app, ["worker", "--db", sqlite])
    assert worker.exit_code == 2
    assert "ringlet worker needs runs on the engine" in worker.output
    assert "PostgreSQL" in worker.output
    monkeypatch.setenv("RINGLET_ENGINE", "dbos")
    serve = runner.invoke(app, ["serve", "--db", sqlite])
    assert serve.exit_code == 2
    assert "engine 'dbos' needs a PostgreSQL store" in serve.output


SMALL_POINTS = """\
name: small
start: think
nodes:
  think: {type: llm, prompt: "Think about {{initial_prompt}}", state_updates: {idea: "{{output}}"}, next: pick}
  pick:
    type: approval
    question: "Ship {{idea}}?"
    options: [ship, hold]
    routes: {ship: shipped, hold: held}
    on_other: custom
    state_updates: {choice: "{{choice}}"}
  shipped: {type: end, output: "shipped"}
  held: {type: end, output: "held"}
  custom: {type: end, output: "custom: {{choice}}"}
"""


def test_a_graph_run_prints_only_its_end_output_and_offers_other_on_approvals(
        scripted: list[ScriptedModel], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agent = tmp_path / "small"
    agent.mkdir()
    (agent / "graph.yaml").write_text(SMALL_POINTS)
    scripted.append(ScriptedModel(["a long musing about the plan"], name="scripted:3"))
    monkeypatch.setattr("ringlet.cli.approver", lambda yes: TerminalApprover(Console(stderr=True)))
    result = runner.invoke(app, ["run", str(agent), "the plan", "--model", "scripted:3"], input="3\nnext week\n",
                           env={"RINGLET_DATA_DIR": str(tmp_path / "data")})
    assert result.exit_code == 0, result.output
    assert "3. Other (type your own answer)" in result.stderr
    assert result.stdout.endswith("custom: next week\n")  # the prompts of input() come first on stdout
    assert "musing" not in result.stdout


def test_a_failed_node_shows_its_whole_error_and_resuming_a_failed_run_says_why_not(tmp_path: Path) -> None:
    agent = tmp_path / "fails"
    (agent / "scripts").mkdir(parents=True)
    (agent / "graph.yaml").write_text("name: fails\nstart: a\nnodes:\n  a: {type: script, script: scripts/a.sh, "
                                      "next: z}\n  z: {type: end, output: x}\n")
    (agent / "scripts" / "a.sh").write_text("echo 'first line: a long account of what the script was doing when it "
                                            "failed, and more' >&2\necho 'the cause, at a.sh:2' >&2\nexit 3\n")
    env = {"RINGLET_DATA_DIR": str(tmp_path / "data")}
    failed = runner.invoke(app, ["run", str(agent), "go", "--json"], env=env)
    assert failed.exit_code == 1
    shown = runner.invoke(app, ["run", str(agent), "go"], env=env)
    assert "FAILED after" in shown.stderr
    assert "the cause, at a.sh:2" in shown.stderr.split("FAILED after", 1)[1].split("error script_failed")[0]
    again = runner.invoke(app, ["run", str(agent), "--resume", json.loads(failed.stdout)["run_id"]], env=env)
    assert again.exit_code == 1
    assert "already ended (failed); there is nothing to resume" in again.stderr
    assert f'hint: only a run that paused or was interrupted resumes; start a new one: ringlet run {agent} "PROMPT"' \
        in " ".join(again.stderr.split())
