"""Agent directories and config.yaml (issue #3; `graph-workflows.md` agent-directory rules)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from ringlet import ConfigError
from ringlet.agent.config import build_agent, discover, find, load_config
from ringlet.agent.settings import RunSettings
from ringlet.context import RunContext
from ringlet.gates import AutoApprove
from ringlet.testing import ScriptedModel, call


def write(directory: Path, files: dict[str, str]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text)
    return directory


def test_config_and_graph_together_is_an_error_naming_the_directory(tmp_path: Path) -> None:
    d = write(tmp_path / "both", {"config.yaml": "name: x\n", "graph.yaml": "version: '1.0'\n"})
    with pytest.raises(ConfigError, match=f"{d}: has both config.yaml and graph.yaml"):
        find(str(d))


def test_unknown_keys_are_all_reported_with_lines_and_suggestions(tmp_path: Path) -> None:
    config = "name: a\ninstruction: hi\ntools: []\ntemprature: 0.2\n"
    path = write(tmp_path / "a", {"config.yaml": config}) / "config.yaml"
    with pytest.raises(ConfigError) as err:
        load_config(path)
    text = str(err.value)
    assert f"{path}:2:1: unknown key 'instruction'; did you mean 'instructions'?" in text
    assert f"{path}:4:1: unknown key 'temprature'; did you mean 'temperature'?" in text


def test_bad_values_name_the_field_and_line(tmp_path: Path) -> None:
    config = "name: a\nmax_iterations: 0\nvariables:\n  - nam: x\n"
    path = write(tmp_path / "a", {"config.yaml": config}) / "config.yaml"
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert f"{path}:2:1: max_iterations: Input should be greater than or equal to 1" in str(err.value)
    assert f"{path}:4:5: unknown key 'variables.0.nam'" in str(err.value)


def test_invalid_yaml_points_at_the_line(tmp_path: Path) -> None:
    path = write(tmp_path / "a", {"config.yaml": "name: a\ntools: [one, two\n"}) / "config.yaml"
    with pytest.raises(ConfigError, match=rf"{path}:3:1: invalid YAML"):
        load_config(path)


DEFAULT_TOOLS = ["ask_question", "alarm_clock", "schedule_task", "list_schedules", "update_schedule",
                 "remove_schedule", "web_fetch"]


def listed(agent: Any) -> dict[str, Any]:
    """The tools a run of `agent` is offered, by name (the catalog lists few tools directly)."""
    ctx = RunContext(run_id="r", agent=agent.name)
    return {t.name: t for ts in agent.toolsets for t in asyncio.run(ts.list_tools(ctx))}


def test_tools_from_tools_py_module_paths_and_built_ins(tmp_path: Path) -> None:
    d = write(tmp_path / "helper", {
        "config.yaml": "name: helper\ntools: [shout, current_time, 'ringlet.tools.builtin:calculate']\n"
                       "instructions: Help {{who}}.\nvariables:\n  - name: who\n    default: everyone\n"
                       "max_iterations: 2\nlimits:\n  max_tool_concurrency: 2\n",
        "tools.py": "def shout(text: str) -> str:\n    '''Upper-case the text.'''\n    return text.upper()\n",
    })
    model = ScriptedModel([call("shout", text="hi"), call("shout", text="hi"), "done"])
    agent = build_agent(find(str(d)), model=model, variables={"who": "Ada"})
    assert agent.instructions == "Help Ada."
    assert agent.settings.max_iterations == 2
    assert agent.settings.max_tool_concurrency == 2
    names = list(listed(agent))
    # the built-ins pinned (the default set, then those named under tools), then the catalog's, listed directly
    assert names == [*DEFAULT_TOOLS, "current_time", "shout", "calculate"]
    paused = agent.run_sync("x")  # shout is a write tool: config agents ask a human by default
    assert paused.status == "input_required"
    assert list(paused.pending_approvals) == ["call_1"]
    result = agent.run_sync("x", settings=RunSettings(approver=AutoApprove()))
    assert result.messages[2].text == "HI"
    assert build_agent(find(str(d / "config.yaml")), model=model).instructions == "Help everyone."


def test_tool_settings_effects_and_approval_rules(tmp_path: Path) -> None:
    d = write(tmp_path / "ops", {
        "config.yaml": "tools:\n  shout: {effect: read, idempotent: true, timeout_s: 3}\n  current_time:\n"
                       "  'ringlet.tools.builtin:calculate':\n"
                       "    approval: {mode: confirm, deny_patterns: ['\\*\\*']}\n"
                       "approval_defaults: {write: deny}\napproval_timeout_s: 20\n",
        "tools.py": "def shout(text: str) -> str:\n    '''Upper-case the text.'''\n    return text.upper()\n",
    })
    agent = build_agent(find(str(d)), model=ScriptedModel([]))
    tools = listed(agent)
    assert (tools["shout"].effect, tools["shout"].idempotent, tools["shout"].timeout_s) == ("read", True, 3)
    rules = agent.approvals
    assert rules.judge("shout", "read", {}).allowed
    assert rules.judge("calculate", "read", {"expression": "2**9"}).decided_by == "rule:deny_pattern"
    assert rules.judge("calculate", "read", {"expression": "2*9"}).timeout_s == 20
    assert rules.judge("other", "write", {}).decided_by == "rule:effect"


def test_an_invalid_approval_pattern_is_a_load_error_naming_it(tmp_path: Path) -> None:
    d = write(tmp_path / "bad", {"config.yaml": "tools:\n  current_time:\n    approval:\n"
                                                "      deny_patterns: ['ok', 'rm[ -rf']\n"})
    with pytest.raises(ConfigError) as err:
        build_agent(find(str(d)), model=ScriptedModel([]))
    message = str(err.value)
    assert f"{d / 'config.yaml'}:4:" in message
    assert "tools.current_time.approval.deny_patterns.1" in message
    assert "invalid regular expression 'rm[ -rf'" in message
    assert "unterminated character set" in message


def test_unknown_tools_and_limits_are_errors(tmp_path: Path) -> None:
    d = write(tmp_path / "a", {"config.yaml": "tools: [current_tme]\n"})
    with pytest.raises(ConfigError, match="unknown tool 'current_tme'; did you mean 'current_time'"):
        build_agent(find(str(d)), model=ScriptedModel([]))
    d = write(tmp_path / "b", {"config.yaml": "limits:\n  max_tool_concurency: 2\n"})
    with pytest.raises(ConfigError, match="did you mean 'max_tool_concurrency'"):
        build_agent(find(str(d)), model=ScriptedModel([]))


def test_a_missing_template_variable_is_an_error(tmp_path: Path) -> None:
    d = write(tmp_path / "a", {"config.yaml": "instructions: Hello {{name}}\n"})
    with pytest.raises(ConfigError, match=r"instructions use \{\{name\}\}"):
        build_agent(find(str(d)), model=ScriptedModel([]))


def test_discovery_user_agents_win_and_broken_ones_are_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    write(tmp_path / "assistant", {"config.yaml": "description: my own assistant\n"})
    write(tmp_path / "flow", {"graph.yaml": "version: '1.0'\n"})
    write(tmp_path / "broken", {"config.yaml": "nme: x\n"})
    monkeypatch.setenv("RINGLET_AGENTS_DIR", str(tmp_path))
    agents = discover()
    assert agents["assistant"].description == "my own assistant"
    assert not agents["assistant"].builtin
    assert agents["flow"].kind == "graph"
    assert "broken" not in agents
    assert "unknown key 'nme'" in caplog.text
    with pytest.raises(ConfigError, match="graph agent"):
        build_agent(agents["flow"], model=ScriptedModel([]))


def test_the_built_in_assistant_loads() -> None:
    spec = find("assistant")
    assert spec.builtin
    assert spec.config is not None
    assert spec.config.conversation_starters
    # a public address (a literal: no name to resolve here), so the call gets as far as its approval
    agent = build_agent(spec, model=ScriptedModel([call("web_fetch", {"url": "https://93.184.215.14/"})]))
    assert set(listed(agent)) == {"current_time", "calculate", "web_fetch"}
    assert agent.settings.terminal_tool is None
    paused = agent.run_sync("read example.com")  # fetching a page asks the user first
    assert [r.tool for r in paused.pending_approvals.values()] == ["web_fetch"]


def test_builtin_tools_are_safe() -> None:
    from ringlet.tools.builtin import calculate, current_time

    assert calculate.validate({"expression": "2 ** 10"}) == {"expression": "2 ** 10"}
    import asyncio

    from ringlet import RunContext

    ctx = RunContext(run_id="r", agent="a")
    run = lambda t, **a: asyncio.run(t.run(a, ctx))  # noqa: E731
    assert run(calculate, expression="(17 * 23) / 1") == "391"
    assert run(calculate, expression="sqrt(16) + pi - pi") == "4"
    assert "unsupported" in run(calculate, expression="__import__('os').system('true')")
    assert "too large" in run(calculate, expression="9 ** 99999")
    assert "unknown time zone" in run(current_time, timezone="Mars/Base")
    assert run(current_time, timezone="Asia/Tokyo").endswith("JST")


def test_bad_pricing_and_model_options_are_config_errors(tmp_path: Path) -> None:
    d = write(tmp_path / "p", {"config.yaml": "pricing:\n  'openai:x': {in: 1}\n"})
    with pytest.raises(ConfigError, match=r"config.yaml:2:\d+: .*pricing"):
        find(str(d))
    d = write(tmp_path / "o", {"config.yaml": "model: 'local:'\nmodel_options: {nonsense: 1}\n"})
    with pytest.raises(ConfigError, match="model_options for 'local:'"):
        build_agent(find(str(d)))


def test_an_empty_config_is_an_agent_with_defaults(tmp_path: Path) -> None:
    d = write(tmp_path / "blank", {"config.yaml": ""})
    spec = find(str(d))
    assert spec.name == "blank"
    assert spec.config is not None
    assert spec.config.max_iterations == 10


def test_calculate_refuses_results_that_would_eat_the_machine() -> None:
    import asyncio

    from ringlet import RunContext
    from ringlet.tools.builtin import calculate

    ctx = RunContext(run_id="r", agent="a")
    for expression in ("((9**999)**999)**999", "9**9**9", "2**5000", "(10**1000) * (10**1000) * (10**1000)"):
        assert "too large" in asyncio.run(calculate.run({"expression": expression}, ctx)), expression


def test_builtin_tools_select_the_set(tmp_path: Path) -> None:
    d = write(tmp_path / "picky", {"config.yaml": "builtin_tools: [web_fetch, current_time]\n"
                                                  "web_fetch: {allow_private: true, allow_hosts: [intranet]}\n"
                                                  "tools:\n  web_fetch: {timeout_s: 5}\n"})
    agent = build_agent(find(str(d)), model=ScriptedModel([]))
    tools = listed(agent)
    assert list(tools) == ["web_fetch", "current_time"]
    assert tools["web_fetch"].timeout_s == 5
    assert agent.settings.terminal_tool is None  # summary was not selected
    d = write(tmp_path / "spawner", {"config.yaml": "can_spawn_agents: true\n"
                                                    "sub_agents: {tool_names: [spawn_agent, dispatch_sub_agent]}\n"})
    spawner = build_agent(find(str(d)), model=ScriptedModel([]))
    assert list(listed(spawner)) == [*DEFAULT_TOOLS, "spawn_agent", "dispatch_sub_agent"]
    assert spawner.settings.terminal_tool == "summary"


def test_unknown_builtin_tool_is_a_load_error(tmp_path: Path) -> None:
    d = write(tmp_path / "typo", {"config.yaml": "name: typo\nbuiltin_tools:\n  - web_fetch\n  - ask_questoin\n"})
    with pytest.raises(ConfigError) as err:
        find(str(d))
    assert "config.yaml:4:5: builtin_tools.1: unknown built-in tool 'ask_questoin'; did you mean 'ask_question'?" \
        in str(err.value)
