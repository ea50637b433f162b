"""graph.yaml parsing (graph-workflows.md §1–§3, §10.1): models, defaults, load errors with file:line:column."""

from __future__ import annotations

from pathlib import Path

import pytest

from ringlet.errors import ConfigError
from ringlet.graph import GraphLoadError, agent_kind, load_agent, load_graph
from ringlet.graph.spec import (
    NODE_TYPES,
    AgentNode,
    EndNode,
    InputNode,
    LlmNode,
    MapNode,
    RagNode,
    ScriptNode,
    required_fields,
)
from test_graph_support import EXAMPLES, make_graph, spec_of

MINIMAL = """
name: g
start: done
nodes:
  done:
    type: end
"""


def test_top_level_defaults(tmp_path: Path) -> None:
    spec = spec_of(tmp_path, MINIMAL)
    assert (spec.description, spec.version, spec.model, spec.temperature, spec.top_p) == ("", "1.0", None, None, None)
    assert spec.global_tools == []
    assert spec.mcp_servers == []
    assert spec.conversation_starters == []
    assert spec.variables == []
    assert spec.initial_state == {}
    assert spec.reducers == {}
    assert spec.inject_skill_instructions is True
    s = spec.settings
    assert (s.max_loop_iterations, s.log_state_snapshots, s.validate_before_run, s.timeout, s.max_concurrency) == \
        (100, True, True, None, 8)


def test_node_defaults(tmp_path: Path) -> None:
    spec = spec_of(tmp_path, """
        name: g
        start: a
        nodes:
          a: {type: llm, prompt: hi, next: b}
          b: {type: agent, agent: x, prompt: hi, next: c}
          c: {type: script, script: s.sh, next: d}
          d: {type: input, question: q, next: e}
          e: {type: rag, documents: [a.md], next: f}
          f: {type: map, over: "{{xs}}", as: x, branch: a, collect_into: ys, next: z}
          z: {type: end}
    """)
    a, b, c, d, e, f, z = spec.nodes.values()
    assert isinstance(a, LlmNode)
    assert (a.tools, a.max_attempts, a.max_iterations, a.timeout, a.id) == \
        ([], 1, 10, None, "a")
    assert isinstance(b, AgentNode)
    assert b.timeout == 300
    assert isinstance(c, ScriptNode)
    assert c.timeout == 30
    assert isinstance(d, InputNode)
    assert (d.default, d.validation) == (None, None)
    assert isinstance(e, RagNode)
    assert (e.query, e.top_k, e.timeout) == ("{{initial_prompt}}", 5, 120)
    assert isinstance(f, MapNode)
    assert (f.output_key, f.max_concurrency, f.as_) == ("output", None, "x")
    assert isinstance(z, EndNode)
    assert z.output is None
    assert list(spec.nodes) == ["a", "b", "c", "d", "e", "f", "z"]  # file order


def test_version_as_a_number_and_global_tool_suffixes(tmp_path: Path) -> None:
    spec = spec_of(tmp_path, "version: 1.0\nglobal_tools: [web.sh, calc.py, fmt.ts, plain]\n" + MINIMAL)
    assert spec.version == "1.0"
    assert spec.tool_names == ["web", "calc", "fmt", "plain"]


def _problems(tmp_path: Path, text: str, name: str = "g") -> str:
    with pytest.raises(GraphLoadError) as info:
        load_graph(make_graph(tmp_path, text, name=name))
    return str(info.value)


def test_unsupported_version(tmp_path: Path) -> None:
    message = _problems(tmp_path, 'version: "2.0"\n' + MINIMAL)
    assert message.startswith("Failed to load graph.yaml for agent 'g': ")
    assert "graph.yaml:1:10: Unsupported graph schema version '2.0'. Supported versions: 1.0" in message


def test_empty_name(tmp_path: Path) -> None:
    message = _problems(tmp_path, 'name: ""\nstart: a\nnodes: {a: {type: end}}\n')
    assert "graph.yaml:1:7: Graph must have a non-empty 'name' field" in message


def test_missing_start_and_empty_nodes(tmp_path: Path) -> None:
    assert "missing required field 'start'" in _problems(tmp_path, "name: g\nnodes: {a: {type: end}}\n")
    message = _problems(tmp_path, "name: g\nstart: a\nnodes: {}\n")
    assert "graph.yaml:3:1: Graph 'g' has no nodes defined" in message


def test_start_not_found(tmp_path: Path) -> None:
    message = _problems(tmp_path, "name: g\nstart: x\nnodes:\n  a: {type: end}\n  b: {type: end}\n")
    assert "graph.yaml:2:8: Start node 'x' not found in graph 'g'. Available nodes: a, b" in message


def test_node_id_mismatch(tmp_path: Path) -> None:
    message = _problems(tmp_path, "name: g\nstart: a\nnodes:\n  a:\n    id: b\n    type: end\n")
    assert "graph.yaml:5:9: Node ID mismatch: key 'a' does not match node.id 'b'" in message


def test_a_misspelled_reducer_gets_a_did_you_mean(tmp_path: Path) -> None:
    message = _problems(tmp_path, "name: g\nstart: a\nreducers:\n  items: apend\nnodes:\n  a: {type: end}\n")
    assert "graph.yaml:4:3: graph: 'reducers.items': Input should be 'append', " in message
    assert message.endswith(" or 'overwrite'. Did you mean 'append'?")
    nothing_close = _problems(tmp_path, "name: g\nstart: a\nreducers:\n  items: zzz\nnodes:\n  a: {type: end}\n")
    assert "Did you mean" not in nothing_close


def test_unknown_type_lists_all_eight(tmp_path: Path) -> None:
    message = _problems(tmp_path, "name: g\nstart: a\nnodes:\n  a:\n    type: lm\n")
    assert "graph.yaml:5:11: node 'a' has unknown type 'lm'. Valid types: " \
           "llm, agent, script, approval, input, rag, map, end. Did you mean 'llm'?" in message
    assert len(NODE_TYPES) == 8


def test_missing_required_field_lists_what_the_type_requires(tmp_path: Path) -> None:
    message = _problems(tmp_path, "name: g\nstart: a\nnodes:\n  a:\n    type: approval\n    question: q\n")
    assert ("graph.yaml:4:3: approval node 'a' is missing required fields 'options', 'routes', 'on_other' "
            "(approval nodes require: type, question, options, routes, on_other)") in message
    assert required_fields("map") == ["type", "over", "as", "branch", "collect_into"]
    assert required_fields("agent") == ["type", "agent", "prompt"]


def test_bad_values_name_the_field_and_position(tmp_path: Path) -> None:
    message = _problems(tmp_path, "name: g\nstart: a\nnodes:\n  a:\n    type: script\n    script: s.sh\n"
                                  "    timeout: soon\n")
    assert "graph.yaml:7:5: node 'a' (script): 'timeout': Input should be a valid number" in message
    message = _problems(tmp_path, "name: g\nstart: a\nreducers: {k: apend}\nnodes:\n  a: {type: end}\n")
    assert "graph.yaml:3:12: graph: 'reducers.k': Input should be 'append'" in message


def test_unknown_keys_all_reported_together_with_suggestions(tmp_path: Path) -> None:
    message = _problems(tmp_path, """
        name: g
        strat: a
        settings:
          timout: 3
        variables:
          - name: v
            defualt: x
        start: fetch
        nodes:
          fetch:
            type: script
            script: s.sh
            nxt: done
            zzz: 1
          ask:
            type: agent
            agent: x
            prompt: p
            fallback: done
          done:
            type: end
    """)
    lines = message.splitlines()
    assert lines[0] == "Failed to load graph.yaml for agent 'g':"
    assert lines[1].endswith("graph.yaml:2:1: unknown key 'strat' at the top level. Did you mean 'start'?")
    assert lines[2].endswith("graph.yaml:4:3: unknown key 'timout' in settings. Did you mean 'timeout'?")
    assert lines[3].endswith("graph.yaml:7:5: unknown key 'defualt' in variables[0]. Did you mean 'default'?")
    assert lines[4].endswith("graph.yaml:13:5: unknown key 'nxt' in node 'fetch' (script). Did you mean 'next'?")
    assert "graph.yaml:14:5: unknown key 'zzz' in node 'fetch' (script). Remove it; allowed keys: id, " in lines[5]
    assert lines[6].endswith("graph.yaml:19:5: unknown key 'fallback' in node 'ask' (agent). 'fallback' is not a "
                             "field of agent nodes (it belongs to llm, script nodes); remove it")
    assert len(lines) == 7


def test_free_form_mappings_are_not_checked(tmp_path: Path) -> None:
    spec = spec_of(tmp_path, """
        name: g
        initial_state: {anything: {goes: [1]}}
        reducers: {xs: append}
        start: a
        nodes:
          a:
            type: approval
            question: q
            options: [y]
            routes: {y: b}
            on_other: b
            state_updates: {whatever: "{{choice}}"}
          b:
            type: llm
            prompt: p
            output_schema: {type: object, properties: {x: {type: string}}, additionalProperties: false}
            next: c
          c: {type: end}
    """)
    assert spec.initial_state == {"anything": {"goes": [1]}}


def test_unknown_keys_are_errors_even_without_validation(tmp_path: Path) -> None:
    message = _problems(tmp_path, "name: g\nsettings: {validate_before_run: false}\nstart: a\n"
                                  "nodes:\n  a: {type: end, outptu: x}\n")
    assert "unknown key 'outptu' in node 'a' (end). Did you mean 'output'?" in message


def test_output_schema_must_be_a_json_schema(tmp_path: Path) -> None:
    message = _problems(tmp_path, "name: g\nstart: a\nnodes:\n  a:\n    type: llm\n    prompt: p\n"
                                  "    output_schema: {type: objekt}\n    next: b\n  b: {type: end}\n")
    assert "graph.yaml:7:20: node 'a': output_schema is not a valid JSON Schema (Draft 2020-12)" in message


def test_invalid_yaml_names_the_position(tmp_path: Path) -> None:
    message = _problems(tmp_path, "name: g\nstart: [a\nnodes: {}\n")
    assert "graph.yaml:3:" in message
    assert "invalid YAML" in message


def test_agent_directory_rules(tmp_path: Path) -> None:
    both = make_graph(tmp_path, MINIMAL, name="both")
    (both / "config.yaml").write_text("name: both\n")
    with pytest.raises(ConfigError, match=r"^Agent 'both' has both config.yaml and graph.yaml. Keep exactly one.$"):
        agent_kind(both)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match=f"^Agent 'empty' has neither a config.yaml nor a graph.yaml at '{empty}'$"):
        load_agent(empty)
    assert agent_kind(EXAMPLES / "helper") == "loop"
    assert agent_kind(EXAMPLES / "triage") == "graph"


def test_load_agent_gives_an_agent_or_a_graph_agent() -> None:
    from ringlet.agent import Agent
    from ringlet.graph import GraphAgent
    from ringlet.testing import ScriptedModel

    helper = load_agent(EXAMPLES / "helper", model=ScriptedModel([]))
    assert isinstance(helper, Agent)
    assert helper.name == "helper"
    graph = load_agent(EXAMPLES / "triage", model=ScriptedModel([]))
    assert isinstance(graph, GraphAgent)
    assert graph.name == "triage"
    assert graph.description.startswith("Reads a support ticket")


def test_yes_and_no_stay_strings_as_in_yaml_1_2(tmp_path: Path) -> None:
    spec = spec_of(tmp_path, """
        name: g
        initial_state: {flag: true, word: yes, off: off}
        start: a
        nodes:
          a:
            type: approval
            question: q
            options: [yes, no]
            routes: {yes: z, no: z}
            on_other: z
          z: {type: end, output: x}
    """)
    assert spec.nodes["a"].options == ["yes", "no"]
    assert list(spec.nodes["a"].routes) == ["yes", "no"]
    assert spec.initial_state == {"flag": True, "word": "yes", "off": "off"}


def test_the_public_api() -> None:
    from ringlet import graph

    for name in graph.__all__:
        assert getattr(graph, name) is not None, name
    assert sorted(graph.__all__) == graph.__all__


def test_run_sync(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, "name: g\nstart: z\nnodes: {z: {type: end, output: '{{initial_prompt}}!'}}\n")
    agent = load_agent(directory)
    result = agent.run_sync("hi")
    assert (result.output, result.status, result.finish_reason) == ("hi!", "completed", "end_turn")
