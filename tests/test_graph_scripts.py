"""The script protocol (graph-workflows.md §6)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path

import pytest

from ringlet.graph.scripts import STATE_ENV_LIMIT, ScriptCall, ScriptError, command, read_env_file, run_script
from test_graph_support import graph_agent, make_graph, run_graph

DUMP_ENV = """
import json, os, sys
keys = [k for k in os.environ if k.startswith(("LLM_AGENT_", "RINGLET_", "GRAPH_STATE", "FROM_DOTENV"))]
keys += ["AUTO_CONFIRM", "CLICOLOR_FORCE", "FORCE_COLOR"]
print(json.dumps({"env": {k: os.environ.get(k) for k in keys}, "stdin": sys.stdin.read(), "cwd": os.getcwd()}))
"""


def call(directory: Path, script: str, state: dict | None = None, **kw) -> ScriptCall:
    return ScriptCall(script, directory, state if state is not None else {"a": 1}, kw.pop("timeout_s", 10), **kw)


def write(directory: Path, rel: str, text: str) -> None:
    path = directory / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_runtime_by_extension(tmp_path: Path) -> None:
    assert command(call(tmp_path, "s/x.sh")) == ["bash", str(tmp_path / "s/x.sh")]
    assert command(call(tmp_path, "x.py", python="python3.11")) == ["python3.11", str(tmp_path / "x.py")]
    assert command(call(tmp_path, "x.ts")) == ["npx", "tsx", str(tmp_path / "x.ts")]
    with pytest.raises(ScriptError, match=r"^Unsupported script extension '\.rb' \(supported: \.sh, \.py, \.ts\)$"):
        command(call(tmp_path, "x.rb"))


@pytest.fixture
def escapes(tmp_path: Path) -> tuple[Path, list[str]]:
    """An agent directory `g` and script paths that leave it: `..`, absolute, a symlink pointing out.
    The script outside writes a marker file if it ever runs."""
    directory, outside = tmp_path / "g", tmp_path / "outside"
    write(outside, "evil.sh", f"touch {tmp_path}/ran; echo '{{\"pwned\": true}}'\n")
    (directory / "scripts").mkdir(parents=True)
    (directory / "scripts" / "link.sh").symlink_to(outside / "evil.sh")
    return directory, ["../outside/evil.sh", str(outside / "evil.sh"), "scripts/link.sh",
                       "scripts/../../outside/evil.sh"]


async def test_scripts_outside_the_agent_directory_never_run(tmp_path: Path,
                                                             escapes: tuple[Path, list[str]]) -> None:
    directory, paths = escapes
    for script in paths:
        with pytest.raises(ScriptError) as info:
            await run_script(call(directory, script))
        assert info.value.message == (f"Script '{script}' resolves outside the agent directory "
                                      f"{directory.resolve()} (to {(tmp_path / 'outside/evil.sh').resolve()}); "
                                      "scripts must lie inside it")
    assert not (tmp_path / "ran").exists()


async def test_a_graph_run_refuses_an_escaping_script(tmp_path: Path, escapes: tuple[Path, list[str]]) -> None:
    directory, paths = escapes
    for script in paths:  # the validator is off: the engine still refuses, and the fallback is taken
        make_graph(tmp_path, f"""
            name: g
            settings: {{validate_before_run: false}}
            start: s
            nodes:
              s: {{type: script, script: "{script}", fallback: ok, next: z}}
              ok: {{type: script, script: scripts/ok.sh, next: z}}
              z: {{type: end, output: "{{{{pwned}}}}|{{{{fine}}}}"}}
        """, files={"scripts/ok.sh": "echo '{\"fine\": true}'\n"})
        events, result = await run_graph(graph_agent(directory))
        assert result.output == "|true", script
        failed = next(e for e in events if e.type == "node_end" and e.node_id == "s")
        assert failed.outcome == "fallback"
        assert f"Script '{script}' resolves outside the agent directory" in failed.error
    assert not (tmp_path / "ran").exists()


async def test_scripts_inside_the_agent_directory_run(tmp_path: Path) -> None:
    write(tmp_path, "scripts/x.sh", "echo '{\"x\": 1}'\n")
    (tmp_path / "scripts" / "alias.sh").symlink_to(tmp_path / "scripts" / "x.sh")  # a link that stays inside
    for script in ("scripts/x.sh", "scripts/alias.sh", "scripts/../scripts/x.sh", str(tmp_path / "scripts/x.sh")):
        assert (await run_script(call(tmp_path, script))).data == {"x": 1}


async def test_environment_stdin_and_cwd(tmp_path: Path) -> None:
    write(tmp_path, "dump.py", DUMP_ENV)
    write(tmp_path, ".env", "# comment\nexport FROM_DOTENV_A=1\nFROM_DOTENV_B=\"two words\"\n")
    result = await run_script(call(tmp_path, "dump.py", {"k": "v", "n": [1, 2]}, variables={"city-name": "Oslo"},
                                   run_id="r_1", node_id="n1", data_dir=tmp_path / "data", cwd=tmp_path))
    env = result.data["env"]
    assert env["GRAPH_STATE"] == '{"k":"v","n":[1,2]}'
    assert "GRAPH_STATE_FILE" not in env
    assert env["LLM_AGENT_VAR_CITY_NAME"] == "Oslo"
    assert env["LLM_AGENT_DATA_DIR"] == str(tmp_path / "data")
    assert (env["RINGLET_AGENT_DIR"], env["RINGLET_RUN_ID"], env["RINGLET_NODE_ID"]) == (str(tmp_path), "r_1", "n1")
    assert (env["AUTO_CONFIRM"], env["CLICOLOR_FORCE"], env["FORCE_COLOR"]) == ("true", "1", "1")
    assert (env["FROM_DOTENV_A"], env["FROM_DOTENV_B"]) == ("1", "two words")
    assert result.data["stdin"] == ""
    assert result.data["cwd"] == str(tmp_path)


async def test_large_state_goes_through_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPH_STATE", "stale")  # never leaks: exactly one of the two is set
    write(tmp_path, "big.py", "import json, os\npath = os.environ['GRAPH_STATE_FILE']\n"
                              "print(json.dumps({'has_env': 'GRAPH_STATE' in os.environ, 'path': path,"
                              " 'size': len(json.load(open(path))['blob'])}))\n")
    blob = "x" * STATE_ENV_LIMIT
    result = await run_script(call(tmp_path, "big.py", {"blob": blob}))
    assert result.data["has_env"] is False
    assert result.data["size"] == len(blob)
    assert not await asyncio.to_thread(os.path.exists, result.data["path"])  # removed afterwards


async def test_next_routing_and_its_removal(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write(tmp_path, "a.sh", "echo '  {\"x\": 1, \"_next\": \"b\"}  '\n")
    write(tmp_path, "b.sh", "echo '{\"x\": 2, \"_next\": 7}'\necho 'note' >&2\n")
    result = await run_script(call(tmp_path, "a.sh"))
    assert (result.data, result.next) == ({"x": 1}, "b")
    with caplog.at_level(logging.WARNING, "ringlet.graph"):
        result = await run_script(call(tmp_path, "b.sh"))
    assert (result.data, result.next, result.stderr) == ({"x": 2}, None, "note\n")
    assert "ignoring a non-string _next" in caplog.text


@pytest.mark.parametrize(("body", "message"), [
    ("echo oops >&2; exit 3", "Script 's.sh' failed with exit code 3:\noops\n"),
    ("true", "Script 's.sh' produced no output (scripts must emit a single JSON object on stdout)"),
    ("echo '{nope'", "Script output must be valid JSON: Expecting property name enclosed in double quotes: "
                     "line 1 column 2 (char 1)"),
    ("echo '[1, 2]'", "Script output must be a JSON object, not array or primitive"),
    ("echo '\"text\"'", "Script output must be a JSON object, not array or primitive"),
])
async def test_failures(tmp_path: Path, body: str, message: str) -> None:
    write(tmp_path, "s.sh", body + "\n")
    with pytest.raises(ScriptError) as info:
        await run_script(call(tmp_path, "s.sh"))
    assert info.value.message == message


async def test_stderr_tail_is_the_last_4_kib(tmp_path: Path) -> None:
    write(tmp_path, "s.sh", "python3 -c \"import sys; sys.stderr.write('a' * 5000 + 'END')\"; exit 1\n")
    with pytest.raises(ScriptError) as info:
        await run_script(call(tmp_path, "s.sh"))
    tail = info.value.message.split(":\n", 1)[1]
    assert len(tail) == 4096
    assert tail.endswith("END")


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")  # a zombie is dead; its parent (init, here) reaps it when it likes


async def test_timeout_kills_the_process_group(tmp_path: Path) -> None:
    write(tmp_path, "s.sh", f"sleep 30 & echo $! > {tmp_path}/child; echo $$ > {tmp_path}/parent; wait\n")
    with pytest.raises(ScriptError, match=r"^Script 's.sh' timed out after 1s$"):
        await run_script(call(tmp_path, "s.sh", timeout_s=1))
    assert _gone(int((tmp_path / "parent").read_text()))
    assert _gone(int((tmp_path / "child").read_text()))


async def test_sigkill_after_the_grace_period(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ringlet.tools import shell

    monkeypatch.setattr(shell, "KILL_GRACE_S", 0.2)
    write(tmp_path, "s.sh", f"trap '' TERM; echo $$ > {tmp_path}/pid; sleep 30; sleep 30\n")
    with pytest.raises(ScriptError, match=r"timed out after 0\.5s"):
        await run_script(call(tmp_path, "s.sh", timeout_s=0.5))
    assert _gone(int((tmp_path / "pid").read_text()))


def test_env_file_parsing(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("A=1\n export B = 'x y' \nC=plain # comment\nnot a line\n\n#D=4\nE=\n")
    assert read_env_file(tmp_path / ".env") == {"A": "1", "B": "x y", "C": "plain", "E": ""}
    assert read_env_file(tmp_path / "missing") == {}


# -- in a graph -----------------------------------------------------------------------------------------------


async def test_script_output_merges_typed_then_state_updates_apply(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, """
        name: g
        initial_state: {keep: true}
        start: s
        nodes:
          s:
            type: script
            script: s.py
            state_updates: {summary: "{{count}} {{tags}}"}
            next: z
          z: {type: end, output: "{{summary}}"}
    """, files={"s.py": "import json\nprint(json.dumps({'count': 2, 'tags': ['a'], 'obj': {'k': None}}))\n"})
    _, result = await run_graph(graph_agent(directory))
    assert result.state == {"keep": True, "initial_prompt": "go", "count": 2, "tags": ["a"], "obj": {"k": None},
                            "summary": '2 ["a"]'}
    assert result.output == '2 ["a"]'


async def test_failed_script_merges_nothing_and_takes_its_fallback(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, """
        name: g
        start: s
        nodes:
          s:
            type: script
            script: s.sh
            fallback: recover
            state_updates: {touched: "yes"}
            next: z
          recover: {type: script, script: ok.sh, next: z}
          z: {type: end, output: "{{partial}}|{{touched}}|{{recovered}}"}
    """, files={"s.sh": "echo '{\"partial\": 1}'\nexit 2\n", "ok.sh": "echo '{\"recovered\": true}'\n"})
    events, result = await run_graph(graph_agent(directory))
    assert result.output == "||true"
    ends = [e for e in events if e.type == "node_end"]
    assert (ends[0].node_id, ends[0].outcome, ends[0].next) == ("s", "fallback", ("recover",))
    assert ends[0].error == "Script 's.sh' failed with exit code 2:\n"


async def test_script_failure_without_fallback_fails_the_run(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, "name: g\nstart: s\nnodes:\n  s: {type: script, script: s.sh, next: z}\n"
                                     "  z: {type: end, output: x}\n", files={"s.sh": "echo '[1]'\n"})
    events, result = await run_graph(graph_agent(directory))
    assert result.status == "failed"
    assert result.finish_reason == "error"
    assert result.error["message"] == ("Graph 'g' failed at node 's': Script output must be a JSON object, not "
                                       "array or primitive")
    assert [e.type for e in events][-3:] == ["error", "status", "message_end"]


async def test_variables_reach_scripts_but_not_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = make_graph(tmp_path, """
        name: my-agent
        variables:
          - {name: city, default: Paris}
          - {name: units}
          - {name: lang, default: en}
        start: s
        nodes:
          s: {type: script, script: s.sh, next: z}
          z: {type: end, output: "{{seen}}"}
    """, name="my-agent", files={"s.sh": 'echo "{\\"seen\\": \\"$LLM_AGENT_VAR_CITY/$LLM_AGENT_VAR_UNITS/'
                                         '$LLM_AGENT_VAR_LANG\\"}"\n'})
    agent = graph_agent(directory)
    with pytest.raises(Exception, match=r"^The following agent variables are required: units$"):
        agent.stream("go")
    monkeypatch.setenv("MY_AGENT_VARIABLES", json.dumps({"units": "metric", "lang": "fr"}))
    _, result = await run_graph(agent, variables={"lang": "de"})
    assert result.output == "Paris/metric/de"
    assert set(result.state) == {"initial_prompt", "seen"}


async def test_script_cwd_is_the_callers_unless_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = make_graph(tmp_path, "name: g\nstart: s\nnodes:\n  s: {type: script, script: s.sh, next: z}\n"
                                     "  z: {type: end, output: '{{cwd}}'}\n",
                           files={"s.sh": "echo \"{\\\"cwd\\\": \\\"$PWD\\\"}\"\n"})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert (await graph_agent(directory).run("go")).output == str(elsewhere)
    assert (await graph_agent(directory, script_cwd=directory).run("go")).output == str(directory)
    assert os.getcwd() == str(elsewhere)
