"""Loki agent directories run unchanged (issue 23): tools.sh with argc annotations, Loki's global tools and
its MCP config, Loki's config.yaml keys and special variables, model names in Loki's form, an agent's own
tools offered without global_tools — each run against a scripted OpenAI-compatible upstream on loopback."""

from __future__ import annotations

import json
import logging
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from helpers import eventually
from ringlet.agent.settings import RunSettings
from ringlet.errors import ConfigError
from ringlet.gates import AutoApprove
from ringlet.graph import load_agent
from ringlet.graph.validate import validate
from ringlet.testing import ScriptedModel
from ringlet.tools.shell import bash_tools, parse_argc
from serving import openai_model, serving

TOOLS_SH = """\
#!/usr/bin/env bash
set -e

# @env LLM_OUTPUT=/dev/stdout The output path
# @env OPS_REGION=eu-west The region

# @cmd Look up a host's address.
# @option --host! The host name
# @option --family[=ipv4|ipv6] Address family
# @flag --verbose Say more
lookup-host() {
    echo "host=$argc_host family=$argc_family verbose=${argc_verbose:-0} region=$OPS_REGION agent=$LLM_AGENT_NAME" \\
        >> "$LLM_OUTPUT"
}

# @cmd Add numbers up.
# @option --n+ <INT> The numbers
# @option --label The label
sum() {
    local total=0
    for x in "${argc_n[@]}"; do total=$((total + x)); done
    echo "{\\"label\\": \\"${argc_label:-none}\\", \\"total\\": $total}" >> "$LLM_OUTPUT"
}

# @cmd Print without LLM_OUTPUT.
# @option --word! A word
shout() {
    echo "${argc_word^^}"
}

# @cmd Fail loudly.
explode() {
    echo "it broke" >&2
    exit 4
}

# @cmd Wait a long time.
linger() {
    echo $$ > "$PID_FILE"
    sleep 60
}

_helper() { :; }

eval "$(argc --argc-eval "$0" "$@")"
"""

FS_CAT = """\
#!/usr/bin/env bash
set -e

# @describe Read a file.
# @option --path! The file to read
# @env LLM_OUTPUT=/dev/stdout

main() {
    cat "$argc_path" >> "$LLM_OUTPUT"
}

eval "$(argc --argc-eval "$0" "$@")"
"""

GET_TIME_PY = '''\
def run(zone: str) -> str:
    """Tell the time in a zone.

    Args:
        zone: An IANA zone name
    """
    return f"noon in {zone}"
'''


def test_argc_annotations_become_json_schemas(tmp_path: Path) -> None:
    (tmp_path / "tools.sh").write_text(TOOLS_SH)
    tools = {t.name: t for t in bash_tools(tmp_path / "tools.sh")}
    assert list(tools) == ["lookup_host", "sum", "shout", "explode", "linger"]  # `_helper` is private
    assert tools["lookup_host"].description == "Look up a host's address."
    assert tools["lookup_host"].parameters == {
        "type": "object", "additionalProperties": False, "required": ["host"],
        "properties": {"host": {"type": "string", "description": "The host name"},
                       "family": {"type": "string", "enum": ["ipv4", "ipv6"],
                                  "description": "Address family (default: ipv4)"},
                       "verbose": {"type": "boolean", "description": "Say more"}}}
    assert tools["sum"].parameters["properties"]["n"] == {"type": "array", "items": {"type": "integer"},
                                                          "description": "The numbers"}
    assert tools["sum"].parameters["required"] == ["n"]
    (tmp_path / "bad.sh").write_text("# @cmd\nnothing() { :; }\n")
    with pytest.raises(ConfigError, match=r"bad\.sh: function nothing has no description"):
        parse_argc(tmp_path / "bad.sh")
    (tmp_path / "worse.sh").write_text("# @describe x\n# @option !!\n")
    with pytest.raises(ConfigError, match=r"worse\.sh:2: cannot read `# @option !!`"):
        parse_argc(tmp_path / "worse.sh")


async def test_a_bash_tool_runs_with_lokis_calling_convention(tmp_path: Path) -> None:
    from ringlet.errors import ToolFailure

    (tmp_path / "tools.sh").write_text(TOOLS_SH)
    tools = {t.name: t for t in bash_tools(tmp_path / "tools.sh", env={"LLM_AGENT_NAME": "ops"})}

    async def call(name: str, args: dict[str, Any]) -> Any:
        return await tools[name].run(tools[name].validate(args), None)  # type: ignore[arg-type]

    assert await call("lookup_host", {"host": "db1", "verbose": True}) == \
        "host=db1 family=ipv4 verbose=1 region=eu-west agent=ops"  # defaults of @option and @env, run once
    assert json.loads(await call("sum", {"n": [1, 2, 39], "label": "it's"})) == {"label": "it's", "total": 42}
    assert await call("shout", {"word": "hey"}) == "HEY"  # stdout, when LLM_OUTPUT stays empty
    with pytest.raises(ToolFailure) as failed:
        await call("explode", {})
    assert (failed.value.code, failed.value.message) == ("tool_failed", "Tool call 'explode' exited with code 4")
    assert failed.value.extra["stderr"] == "it broke\n"


async def test_a_cancelled_bash_tool_is_killed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    (tmp_path / "tools.sh").write_text(TOOLS_SH)
    pid_file = tmp_path / "pid"
    monkeypatch.setenv("PID_FILE", str(pid_file))
    linger = next(t for t in bash_tools(tmp_path / "tools.sh") if t.name == "linger")
    task = asyncio.create_task(linger.run({}, None))  # type: ignore[arg-type]

    async def started() -> bool:
        return pid_file.exists() and bool(pid_file.read_text().strip())

    await eventually(started)  # the tool's own pid file says it runs
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), signal.SIGCONT)


# -- whole agent directories ------------------------------------------------------------------------------------


def loki_home(tmp_path: Path, model_url: str) -> Path:
    """Loki's configuration directory: a client of its config.yaml serving the scripted upstream, two global
    tools and an MCP config."""
    home = tmp_path / "loki"
    (home / "functions" / "tools").mkdir(parents=True)
    (home / "config.yaml").write_text(f"clients:\n  - type: openai-compatible\n    name: office\n"
                                      f"    api_base: {model_url}/v1\n    api_key: '{{{{OFFICE_KEY}}}}'\n")
    (home / "functions" / "tools" / "fs_cat.sh").write_text(FS_CAT)
    (home / "functions" / "tools" / "get_time.py").write_text(GET_TIME_PY)
    return home


def calls(*pairs: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"role": "assistant", "tool_calls": [
        {"index": i, "id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
        for i, (n, a) in enumerate(pairs)]}]


LOOP_CONFIG = """\
name: ops
version: 0.3.1
description: Looks after hosts.
model: office:qwen3
instructions: |
  You run on {{__os__}} ({{__arch__}}) in {{__cwd__}} for {{team}}. Your tools:
  {{__tools__}}
variables:
  - name: team
    description: The team
    default: infra
global_tools: [fs_cat.sh, get_time]
auto_continue: true
max_auto_continues: 5
inject_todo_instructions: true
agent_session: temp
"""


async def test_a_loki_loop_agent_runs_unchanged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                caplog: pytest.LogCaptureFixture) -> None:
    seen: list[list[dict[str, Any]]] = []

    def reply(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        seen.append(messages)
        if messages[-1]["role"] != "tool":
            return calls(("lookup_host", {"host": "db1"}), ("fs_cat", {"path": str(notes)}),
                         ("get_time", {"zone": "Europe/Paris"}))
        return [{"role": "assistant", "content": "All three answered."}]

    notes = tmp_path / "notes.txt"
    notes.write_text("disk at 91%")
    async with serving(openai_model(reply)) as model_url:
        monkeypatch.setenv("RINGLET_LOKI_DIR", str(loki_home(tmp_path, model_url)))
        monkeypatch.setenv("OFFICE_KEY", "k")
        agent_dir = tmp_path / "agents" / "ops"
        agent_dir.mkdir(parents=True)
        (agent_dir / "config.yaml").write_text(LOOP_CONFIG)
        (agent_dir / "tools.sh").write_text(TOOLS_SH)
        with caplog.at_level(logging.WARNING, logger="ringlet.agent"):
            agent = load_agent(agent_dir)
        ignored = [r.getMessage() for r in caplog.records if "accepted and ignored" in r.getMessage()]
        assert [m.split("'")[2] for m in ignored] == ["auto_continue", "max_auto_continues",
                                                       "inject_todo_instructions", "agent_session"]
        paused = await agent.run("Check db1")  # bash tools are `write` tools to the gates, as any undeclared tool
        assert sorted(r.tool for r in paused.pending_approvals.values()) == ["fs_cat", "get_time", "lookup_host"]
        # like `ringlet run --yes`
        result = await agent.run("Check db1", settings=RunSettings(approver=AutoApprove("test")))
        await agent.aclose()
    assert result.output == "All three answered."
    results = [m for m in seen[-1] if m["role"] == "tool"]
    assert [r["content"] for r in results] == [
        "host=db1 family=ipv4 verbose=0 region=eu-west agent=ops", "disk at 91%", "noon in Europe/Paris"]
    system = seen[0][0]["content"]
    assert f"You run on linux ({os.uname().machine}) in {os.getcwd()} for infra." in system
    assert "\n1. " in system
    assert ". lookup_host: Look up a host's address." in system
    assert ". fs_cat: Read a file." in system
    assert ". get_time: Tell the time in a zone." in system


GRAPH = """\
name: triage
model: office:qwen3
global_tools: [fs_cat.sh]
start: look
nodes:
  look:
    type: llm
    instructions: "You run on {{__os__}} with:\\n{{__tools__}}"
    prompt: "Look into {{initial_prompt}}"
    tools: [lookup_host, fs_cat]
    state_updates: {finding: "{{output}}"}
    next: done
  done: {type: end, output: "{{finding}}"}
"""


async def test_a_loki_graph_agent_offers_its_own_tools_without_global_tools(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[dict[str, Any]]] = []

    def reply(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        seen.append(messages)
        if messages[-1]["role"] != "tool":
            return calls(("lookup_host", {"host": "web2", "family": "ipv6"}))
        return [{"role": "assistant", "content": f"Found: {messages[-1]['content']}"}]

    async with serving(openai_model(reply)) as model_url:
        monkeypatch.setenv("RINGLET_LOKI_DIR", str(loki_home(tmp_path, model_url)))
        monkeypatch.setenv("OFFICE_KEY", "k")
        agent_dir = tmp_path / "agents" / "triage"
        agent_dir.mkdir(parents=True)
        (agent_dir / "graph.yaml").write_text(GRAPH)
        (agent_dir / "tools.sh").write_text(TOOLS_SH)
        agent = load_agent(agent_dir)
        result = await agent.run("web2")
        await agent.aclose()
    assert result.output == "Found: host=web2 family=ipv6 verbose=0 region=eu-west agent=triage"
    assert seen[0][0] == {"role": "system", "content": "You run on linux with:\n1. lookup_host: Look up a host's "
                                                       "address.\n2. fs_cat: Read a file."}


def test_a_missing_global_tool_fails_validation_naming_where_it_looked(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "loki"
    (home / "functions" / "tools").mkdir(parents=True)
    monkeypatch.setenv("RINGLET_LOKI_DIR", str(home))
    agent_dir = tmp_path / "agents" / "triage"
    agent_dir.mkdir(parents=True)
    (agent_dir / "graph.yaml").write_text(GRAPH.replace("model: office:qwen3\n", "")
                                          .replace("[fs_cat.sh]", "[fs_cat.sh, web_search.sh]"))
    (agent_dir / "tools.sh").write_text(TOOLS_SH)
    from ringlet.graph.parse import load_graph

    report = validate(load_graph(agent_dir))
    messages = [str(e) for e in report.errors]
    folder = home / "functions" / "tools"
    assert messages == [
        f"[graph] global tool 'web_search.sh' not found: looked for {folder / 'web_search.sh'} (Loki's "
        "functions/tools; set RINGLET_LOKI_DIR to Loki's config directory, or LOKI_FUNCTIONS_DIR to its "
        "functions directory)",
        "[look] Tool 'fs_cat' is neither a built-in tool, a function of tools.py or tools.sh, nor a file of "
        "Loki's functions/tools"]
    assert str(folder / "fs_cat.sh") in report.errors[1].fix


def test_loki_model_names_resolve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ringlet.graph.resources import model_known
    from ringlet.models.providers import resolve_model

    home = loki_home(tmp_path, "http://127.0.0.1:9")
    monkeypatch.setenv("RINGLET_LOKI_DIR", str(home))
    monkeypatch.setenv("OFFICE_KEY", "secret")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "x")
    office = resolve_model("office:qwen3")
    assert office.name == "openai:qwen3"
    assert office.inner.base_url == "http://127.0.0.1:9/v1"  # type: ignore[attr-defined]
    assert resolve_model("claude:claude-sonnet-4-6").name == "anthropic:claude-sonnet-4-6"
    model_known.cache_clear()
    assert model_known("office:qwen3")
    assert model_known("claude:x")
    assert not model_known("elsewhere:x")


def test_validate_loads_every_sub_agent_a_graph_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ringlet.graph.parse import load_graph

    monkeypatch.setenv("RINGLET_LOKI_DIR", str(tmp_path / "loki"))
    agents = tmp_path / "agents"
    for name, config in (("helper", "name: helper\nversion: 2\nauto_continue: true\nglobal_tools: [gone.sh]\n"),
                         ("typo", "name: typo\ninstructons: hi\n")):
        (agents / name).mkdir(parents=True)
        (agents / name / "config.yaml").write_text(config)
    (agents / "boss").mkdir()
    (agents / "boss" / "graph.yaml").write_text(
        "name: boss\nstart: a\nnodes:\n  a: {type: agent, agent: helper, prompt: p, next: b}\n"
        "  b: {type: agent, agent: typo, prompt: p, next: c}\n  c: {type: agent, agent: researcher, prompt: p, "
        "next: z}\n  z: {type: end, output: x}\n")
    researcher = tmp_path / "loki" / "agents" / "researcher"  # only in Loki's agents folder
    researcher.mkdir(parents=True)
    (researcher / "config.yaml").write_text("name: researcher\ninstructions: Dig.\n")
    monkeypatch.setenv("RINGLET_AGENTS_DIR", str(tmp_path / "elsewhere"))
    errors = [str(e) for e in validate(load_graph(agents / "boss")).errors]
    assert len(errors) == 2
    assert errors[0].startswith("[a] Agent 'helper' cannot be loaded: global tool 'gone.sh' not found: looked for "
                                f"{tmp_path / 'loki' / 'functions' / 'tools' / 'gone.sh'}")
    assert errors[1].startswith("[b] Agent 'typo' cannot be loaded: invalid agent config:")
    assert "unknown key 'instructons'; did you mean 'instructions'?" in errors[1]


SKILLED = """\
name: skilled
model: office:qwen3
enabled_skills: [runbooks]
start: look
nodes:
  look:
    type: llm
    instructions: Be brief.
    prompt: "Check {{initial_prompt}}"
    tools: [lookup_host]
    state_updates: {finding: "{{output}}"}
    next: done
  done: {type: end, output: "{{finding}}"}
"""
RUNBOOK = """\
---
description: How we check hosts
enabled_tools: fs_cat.sh
---
Always read the runbook at the path the user gives before answering.
"""


async def test_skills_bring_their_instructions_and_tools_to_llm_nodes(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[dict[str, Any]]] = []

    def reply(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        seen.append(messages)
        if messages[-1]["role"] != "tool":
            return calls(("fs_cat", {"path": str(runbook)}))  # a tool only the skill grants
        return [{"role": "assistant", "content": f"Runbook says: {messages[-1]['content']}"}]

    runbook = tmp_path / "runbook.md"
    runbook.write_text("restart nginx first")
    async with serving(openai_model(reply)) as model_url:
        home = loki_home(tmp_path, model_url)
        (home / "skills" / "runbooks").mkdir(parents=True)
        (home / "skills" / "runbooks" / "SKILL.md").write_text(RUNBOOK)
        monkeypatch.setenv("RINGLET_LOKI_DIR", str(home))
        monkeypatch.setenv("RINGLET_SKILLS_DIR", str(tmp_path / "no-ringlet-skills"))
        monkeypatch.setenv("OFFICE_KEY", "k")
        agent_dir = tmp_path / "agents" / "skilled"
        agent_dir.mkdir(parents=True)
        (agent_dir / "graph.yaml").write_text(SKILLED)
        (agent_dir / "tools.sh").write_text(TOOLS_SH)
        agent = load_agent(agent_dir)
        result = await agent.run("web2")
        await agent.aclose()
    assert result.output == "Runbook says: restart nginx first"
    assert seen[0][0] == {"role": "system", "content": (
        "Be brief.\n\n## Skills\nFollow these skills where they apply.\n\n### Skill: runbooks — How we check hosts\n"
        "Always read the runbook at the path the user gives before answering.")}


async def test_a_loop_agent_gets_its_skills_and_a_missing_one_is_named(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[dict[str, Any]]] = []

    def reply(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        seen.append(messages)
        if messages[-1]["role"] != "tool":
            return calls(("fs_cat", {"path": str(runbook)}))
        return [{"role": "assistant", "content": f"Runbook says: {messages[-1]['content']}"}]

    runbook = tmp_path / "runbook.md"
    runbook.write_text("drain the node")
    async with serving(openai_model(reply)) as model_url:
        home = loki_home(tmp_path, model_url)
        (home / "skills" / "runbooks").mkdir(parents=True)
        (home / "skills" / "runbooks" / "SKILL.md").write_text(RUNBOOK.replace("check hosts", "check {{__os__}} hosts"))
        monkeypatch.setenv("RINGLET_LOKI_DIR", str(home))
        monkeypatch.setenv("RINGLET_SKILLS_DIR", str(tmp_path / "no-ringlet-skills"))
        monkeypatch.setenv("OFFICE_KEY", "k")
        agent_dir = tmp_path / "agents" / "ops"
        agent_dir.mkdir(parents=True)
        (agent_dir / "config.yaml").write_text("model: office:qwen3\nenabled_skills: [runbooks]\n"
                                               "approval_defaults: {write: allow}\n")
        agent = load_agent(agent_dir)
        result = await agent.run("node 7")
        await agent.aclose()
        (agent_dir / "config.yaml").write_text("model: office:qwen3\nenabled_skills: [runbooks, pager]\n")
        with pytest.raises(ConfigError, match=r"skill 'pager' is not installed \(looked in .*no-ringlet-skills, "
                                              r".*loki/skills\)"):
            load_agent(agent_dir)
    assert result.output == "Runbook says: drain the node"
    assert seen[0][0]["content"] == ("## Skills\nFollow these skills where they apply.\n\n### Skill: runbooks — How "
                                     "we check linux hosts\nAlways read the runbook at the path the user gives "
                                     "before answering.")


TOOLS_TS = """\
/**
 * Look up a host's address.
 * @param host - The host name
 * @param family - Address family
 */
export async function lookup_host(host: string, family?: "ipv4" | "ipv6", tries: number = 1): Promise<string> {
  return `host=${host} family=${family ?? "ipv4"} tries=${tries} agent=${process.env.LLM_AGENT_NAME}`;
}

/** Count the items. */
export function count(items: string[], label: string | null): { label: string | null; n: number } {
  return { label, n: items.length };
}

/** Fail loudly. */
export function explode(): string {
  throw new Error("it broke");
}

function helper(): void {}
"""

GLOBAL_JS = """\
/**
 * Tell the time in a zone.
 * @param {string} zone - An IANA zone name
 */
export function run(zone) {
  return `noon in ${zone}`;
}
"""


def test_typescript_signatures_become_json_schemas(tmp_path: Path) -> None:
    from ringlet.tools.node import parse_js

    (tmp_path / "tools.ts").write_text(TOOLS_TS)
    functions = {f.name: f for f in parse_js(tmp_path / "tools.ts")}
    assert list(functions) == ["lookup_host", "count", "explode"]  # `helper` is not exported
    assert functions["lookup_host"].parameters() == {
        "type": "object", "additionalProperties": False, "required": ["host"],
        "properties": {"host": {"type": "string", "description": "The host name"},
                       "family": {"type": "string", "enum": ["ipv4", "ipv6"], "description": "Address family"},
                       "tries": {"type": "number"}}}
    assert functions["count"].parameters()["properties"] == {"items": {"type": "array", "items": {"type": "string"}},
                                                             "label": {"type": "string"}}
    assert functions["count"].required == ["items"]
    (tmp_path / "bad.ts").write_text("export function f({a}: {a: string}) {}\n")
    with pytest.raises(ConfigError, match=r"bad\.ts: function f has no description"):
        parse_js(tmp_path / "bad.ts")


async def test_typescript_and_javascript_tools_run_with_lokis_convention(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from ringlet.agent import loki
    from ringlet.errors import ToolFailure

    agent_dir = tmp_path / "agents" / "ops"
    agent_dir.mkdir(parents=True)
    (agent_dir / "tools.ts").write_text(TOOLS_TS)
    home = tmp_path / "loki"
    (home / "functions" / "tools").mkdir(parents=True)
    (home / "functions" / "tools" / "get_time.js").write_text(GLOBAL_JS)
    monkeypatch.setenv("RINGLET_LOKI_DIR", str(home))
    tools = loki.own_tools(agent_dir, "ops")
    tools["get_time"] = loki.global_tool("get_time")

    async def call(name: str, args: dict[str, Any]) -> Any:
        return await tools[name].run(tools[name].validate(args), None)  # type: ignore[arg-type]

    assert await call("lookup_host", {"host": "db1", "family": "ipv6"}) == "host=db1 family=ipv6 tries=1 agent=ops"
    assert json.loads(await call("count", {"items": ["a", "b"]})) == {"n": 2}  # undefined is left out of JSON
    assert await call("get_time", {"zone": "UTC"}) == "noon in UTC"
    with pytest.raises(ToolFailure) as failed:
        await call("explode", {})
    assert failed.value.message == "Tool call 'explode' exited with code 1"
    assert "it broke" in failed.value.extra["stderr"]


async def test_a_loop_agents_documents_give_each_question_its_context(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[dict[str, Any]]] = []

    def reply(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        seen.append(messages)
        return [{"role": "assistant", "content": "Otters hold hands."}]

    async with serving(openai_model(reply)) as model_url:
        monkeypatch.setenv("RINGLET_LOKI_DIR", str(loki_home(tmp_path, model_url)))
        monkeypatch.setenv("OFFICE_KEY", "k")
        monkeypatch.setenv("RINGLET_DB_URL", f"sqlite+aiosqlite:///{tmp_path / 'kb.db'}")
        agent_dir = tmp_path / "agents" / "zoo"
        (agent_dir / "knowledge" / "mammals").mkdir(parents=True)
        (agent_dir / "knowledge" / "mammals" / "otters.md").write_text("Sea otters hold hands while they sleep.")
        (agent_dir / "knowledge" / "birds.md").write_text("Penguins cannot fly.")
        (agent_dir / "config.yaml").write_text("model: office:qwen3\ndocuments: [./knowledge/]\n")
        agent = load_agent(agent_dir)
        result = await agent.run("Why do otters hold hands?")
        await agent.aclose()
        (agent_dir / "config.yaml").write_text("model: office:qwen3\ndocuments: [./knowledge/, ./manuals/]\n")
        with pytest.raises(ConfigError, match=r"documents: rag document './manuals/' does not exist"):
            load_agent(agent_dir)
    assert result.output == "Otters hold hands."
    asked = seen[0][-1]["content"]
    assert asked.startswith("Why do otters hold hands?\n\n<context sources=\"knowledge/mammals/otters.md")
    assert "Sea otters hold hands while they sleep." in asked
    assert [m.content for m in result.messages if m.role == "user"] == ["Why do otters hold hands?"]  # as written


def test_dynamic_instructions_come_from_the_instructions_function(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RINGLET_LOKI_DIR", str(tmp_path / "loki"))
    agent_dir = tmp_path / "agents" / "ops"
    agent_dir.mkdir(parents=True)
    (agent_dir / "config.yaml").write_text("model: openai:m\ndynamic_instructions: true\ninstructions: static\n"
                                           "variables: [{name: team, default: infra}]\n")
    (agent_dir / "tools.sh").write_text(TOOLS_SH.replace("_helper() { :; }", '_instructions() {\n'
                                        '    echo "You serve $LLM_AGENT_VAR_TEAM on {{__os__}}." >> "$LLM_OUTPUT"\n}'))
    agent = load_agent(agent_dir, model=ScriptedModel([]))
    assert agent.instructions == "You serve infra on linux."  # the variable's default, and Loki's specials


async def test_mcp_servers_by_name_come_from_lokis_mcp_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from ringlet.testing import call

    home = tmp_path / "loki"
    (home / "functions").mkdir(parents=True)
    server = Path(sys.executable).parent / "mcp-server-time"
    (home / "functions" / "mcp.json").write_text(json.dumps({"mcpServers": {"time": {"command": str(server)}}}))
    monkeypatch.setenv("RINGLET_LOKI_DIR", str(home))
    monkeypatch.delenv("RINGLET_MCP_CONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.config/ringlet/mcp.json of this machine's user
    agent_dir = tmp_path / "agents" / "clock"
    agent_dir.mkdir(parents=True)
    (agent_dir / "config.yaml").write_text("mcp_servers: [time]\ncatalog: false\n"
                                           "approval_defaults: {write: allow}\n")
    model = ScriptedModel([call("get_current_time", timezone="UTC"), "It is now."])
    agent = load_agent(agent_dir, model=model)
    try:
        result = await agent.run("What time is it?")
    finally:
        await agent.aclose()
    assert result.output == "It is now."
    assert {"get_current_time", "convert_time"} <= {t.name for t in model.requests[0].tools}
    tool = next(m for m in result.messages if m.role == "tool")
    assert '"timezone": "UTC"' in tool.text
    (agent_dir / "config.yaml").write_text("mcp_servers: [time, files]\n")
    with pytest.raises(ConfigError, match=r"mcp_servers: files not defined in .*functions/mcp\.json"):
        load_agent(agent_dir, model=model)


COYOTE = Path(__file__).parent / "fixtures" / "coyote"
"""Coyote's published deep-research agent and the parts of its Loki directory it uses (see its README.md)."""


def lokis_home(monkeypatch: pytest.MonkeyPatch, home: Path, tmp_path: Path) -> None:
    monkeypatch.setenv("RINGLET_LOKI_DIR", str(home))
    for name in ("RINGLET_MCP_CONFIG", "LOKI_FUNCTIONS_DIR", "LOKI_CONFIG_DIR", "RINGLET_SKILLS_DIR",
                 "LOKI_SKILLS_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.config/ringlet/mcp.json of this machine's user


def test_coyotes_deep_research_agent_validates_as_published(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from ringlet.cli import app

    lokis_home(monkeypatch, COYOTE, tmp_path)
    mcp = json.loads((COYOTE / "functions" / "mcp.json").read_text())["mcpServers"]
    assert mcp["ddg-search"] == {"type": "stdio", "command": "uvx", "args": ["duckduckgo-mcp-server"]}  # as is
    result = CliRunner().invoke(app, ["graph", "validate", str(COYOTE / "agents" / "deep-research")])
    assert result.exit_code == 0, result.output
    assert "ok: 0 error(s)" in result.output
    assert "MCP server" not in result.output


def test_a_broken_mcp_json_is_reported_where_it_is_broken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "loki"
    (home / "functions").mkdir(parents=True)
    (home / "functions" / "mcp.json").write_text(
        '{\n  "mcpServers": {\n    "ddg-search": {\n      "type": "stdio",\n      "comand": "uvx"\n    }\n  }\n}\n')
    lokis_home(monkeypatch, home, tmp_path)
    agent_dir = tmp_path / "agents" / "search"
    agent_dir.mkdir(parents=True)
    (agent_dir / "graph.yaml").write_text("name: search\nmcp_servers: [ddg-search]\nstart: ask\nnodes:\n"
                                          "  ask: {type: llm, prompt: '{{initial_prompt}}', tools: [mcp:ddg-search],"
                                          " next: done}\n  done: {type: end, output: ok}\n")
    from ringlet.graph.parse import load_graph

    errors = validate(load_graph(agent_dir)).errors
    assert [e.message for e in errors] == [
        f"the MCP config cannot be read: {home / 'functions' / 'mcp.json'}:5:7: mcpServers.ddg-search.comand: "
        "unknown key; did you mean 'command'? (accepted: type, command, args, env, cwd, url, headers, oauth, "
        "transport, tools, exclude_tools, prefix, timeout_s, required, description, sampling)"]
    assert "not defined" not in str(errors)
