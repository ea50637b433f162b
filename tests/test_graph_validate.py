"""The validator (graph-workflows.md §7, §10): every error and warning, reported all at once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ringlet.graph import Checks, GraphValidationError, load_agent, load_graph
from ringlet.graph.validate import Report, validate
from test_graph_support import EXAMPLES, make_graph, spec_of


def check(tmp_path: Path, text: str, *, files: dict[str, str] | None = None, name: str = "g",
          agents: tuple[str, ...] = ("helper",), models: tuple[str, ...] = ("openai",)) -> Report:
    spec = spec_of(tmp_path, text, files=files, name=name)
    checks = Checks(spec.directory, agent_exists=lambda a: a in agents,
                    model_known=lambda m: m.split(":")[0] in models)
    return validate(spec, checks)


def errors(report: Report) -> list[str]:
    return [str(e) for e in report.errors]


def warnings(report: Report) -> list[str]:
    return [str(w) for w in report.warnings]


def test_examples_are_valid() -> None:
    for directory in sorted(EXAMPLES.iterdir()):
        if (directory / "graph.yaml").is_file():
            report = validate(load_graph(directory))
            assert report.errors == [], directory.name
            assert report.warnings == [], directory.name


def test_references_to_missing_nodes(tmp_path: Path) -> None:
    report = check(tmp_path, """
        name: g
        start: a
        nodes:
          a: {type: script, script: s.sh, next: nope, fallback: gone}
          b:
            type: approval
            question: q
            options: [y]
            routes: {y: missing}
            on_other: absent
          m: {type: map, over: "{{xs}}", as: x, branch: ghost, collect_into: ys, next: z}
          z: {type: end, output: x}
    """, files={"s.sh": "echo {}"})
    assert errors(report) == [
        "[a] References non-existent node 'nope' in 'next'",
        "[a] References non-existent node 'gone' in 'fallback'",
        "[b] References non-existent node 'missing' in 'routes'",
        "[b] References non-existent node 'absent' in 'on_other'",
        "[m] References non-existent node 'ghost' in 'branch'",
    ]
    first = report.errors[0]
    assert first.where.endswith("graph.yaml:4:41")
    assert "use one of: a, b, m, z" in first.fix


def test_cycles_over_declared_edges(tmp_path: Path) -> None:
    report = check(tmp_path, """
        name: g
        start: a
        nodes:
          a: {type: llm, prompt: p, next: b}
          b: {type: llm, prompt: p, next: [a, z]}
          z: {type: end, output: x}
    """)
    assert errors(report) == ["[a] Cycle detected: a -> b -> a"]
    assert "_next" in report.errors[0].fix


def test_no_end_nodes(tmp_path: Path) -> None:
    report = check(tmp_path, "name: g\nstart: a\nnodes:\n  a: {type: script, script: s.sh, next: a}\n",
                   files={"s.sh": "echo {}"})
    assert "[graph] Graph has no end nodes; execution would never terminate" in errors(report)


def test_missing_script_and_agent(tmp_path: Path) -> None:
    report = check(tmp_path, """
        name: g
        start: a
        nodes:
          a: {type: script, script: scripts/nope.sh, next: b}
          b: {type: agent, agent: stranger, prompt: p, next: z}
          z: {type: end, output: x}
    """)
    assert errors(report) == ["[a] Script file not found: 'scripts/nope.sh'", "[b] Agent 'stranger' not found"]


def _outside(tmp_path: Path) -> Path:
    """A script next to the agent directory `g`, not inside it."""
    evil = tmp_path / "outside" / "evil.sh"
    evil.parent.mkdir()
    evil.write_text("echo '{\"pwned\": true}'\n")
    return evil


def test_scripts_must_lie_inside_the_agent_directory(tmp_path: Path) -> None:
    evil = _outside(tmp_path)
    (tmp_path / "g" / "scripts").mkdir(parents=True)
    (tmp_path / "g" / "scripts" / "link.sh").symlink_to(evil)  # inside by name, outside once resolved
    report = check(tmp_path, f"""
        name: g
        start: up
        nodes:
          up: {{type: script, script: ../outside/evil.sh, next: abs}}
          abs: {{type: script, script: {evil}, next: link}}
          link: {{type: script, script: scripts/link.sh, next: m}}
          m: {{type: map, over: "{{{{xs}}}}", as: x, branch: item, collect_into: ys, next: ok}}
          item: {{type: script, script: scripts/../../outside/evil.sh}}
          ok: {{type: script, script: scripts/ok.sh, next: z}}
          z: {{type: end, output: x}}
    """, files={"scripts/ok.sh": "echo {}"})
    root, real = (tmp_path / "g").resolve(), evil.resolve()
    assert errors(report) == [
        f"[up] Script '../outside/evil.sh' resolves outside the agent directory {root} (to {real}); scripts "
        "must lie inside it",
        f"[abs] Script '{evil}' resolves outside the agent directory {root} (to {real}); scripts must lie "
        "inside it",
        f"[link] Script 'scripts/link.sh' resolves outside the agent directory {root} (to {real}); scripts "
        "must lie inside it",
        f"[item] Script 'scripts/../../outside/evil.sh' resolves outside the agent directory {root} "
        f"(to {real}); scripts must lie inside it",
    ]
    up = report.errors[0]
    assert up.where.endswith("graph.yaml:4:30")  # the path's own position
    assert up.fix.startswith("move the script into the agent directory (e.g. scripts/evil.sh)")
    assert "a symlink must point inside it too" in report.errors[2].fix


def test_scripts_inside_the_agent_directory_pass(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, "name: g\nstart: z\nnodes: {z: {type: end, output: x}}\n",
                           files={"scripts/real.sh": "echo {}", "top.sh": "echo {}"})
    (directory / "scripts" / "current.sh").symlink_to(directory / "scripts" / "real.sh")  # a link within
    report = check(tmp_path, f"""
        name: g
        start: a
        nodes:
          a: {{type: script, script: scripts/real.sh, next: b}}
          b: {{type: script, script: scripts/current.sh, next: c}}
          c: {{type: script, script: scripts/../top.sh, next: d}}
          d: {{type: script, script: {directory / "top.sh"}, next: z}}
          z: {{type: end, output: x}}
    """)
    assert errors(report) == []


def test_an_escaping_script_fails_the_load(tmp_path: Path) -> None:
    _outside(tmp_path)
    directory = make_graph(tmp_path, "name: g\nstart: a\nnodes:\n  a: {type: script, script: ../outside/evil.sh, "
                                     "next: z}\n  z: {type: end, output: x}\n")
    with pytest.raises(GraphValidationError, match=r"\[a\] Script '\.\./outside/evil\.sh' resolves outside the "
                       r"agent directory .*\n      at .*graph\.yaml:4:29: move the script"):
        load_agent(directory)


def test_default_agent_check_finds_sibling_directories(tmp_path: Path) -> None:
    make_graph(tmp_path, "name: sib\nstart: z\nnodes: {z: {type: end, output: x}}\n", name="sib")
    spec = spec_of(tmp_path, "name: g\nstart: a\nnodes:\n  a: {type: agent, agent: sib, prompt: p, next: z}\n"
                             "  z: {type: end, output: x}\n")
    assert validate(spec, Checks(spec.directory, model_known=lambda m: True)).errors == []


def test_approval_rules(tmp_path: Path) -> None:
    report = check(tmp_path, """
        name: g
        start: a
        nodes:
          a:
            type: approval
            question: q
            options: [yes, no]
            routes: {yes: z, maybe: z}
            on_other: z
          z: {type: end, output: x}
    """)
    assert errors(report) == ["[a] Approval option 'no' has no route defined"]
    assert warnings(report) == ["[a] Route 'maybe' matches no option"]


def test_rag_rules(tmp_path: Path) -> None:
    report = check(tmp_path, """
        name: g
        start: a
        nodes:
          a: {type: rag, documents: [], driver: sqlite, extractor_prompt: "no marker", next: z}
          z: {type: end, output: x}
    """)
    assert errors(report) == ["[a] rag node has no documents",
                              "[a] Unsupported rag driver 'sqlite' (supported: yaml, duckdb)",
                              "[a] extractor_prompt must contain __CHUNK__"]
    assert warnings(report) == ["[a] rag node has no state_updates; its {{output}} is lost"]


def test_rag_documents_must_exist(tmp_path: Path) -> None:
    (tmp_path / "g" / "knowledge").mkdir(parents=True)
    (tmp_path / "g" / "manual").mkdir()
    (tmp_path / "g" / "manual" / "a.md").write_text("alpha")
    report = check(tmp_path, """
        name: g
        start: a
        nodes:
          a:
            type: rag
            documents: [./manual/, ./missing/, "docs/**/*.md", knowledge, "https://example.com/x", "pdf:x.pdf"]
            state_updates: {context: "{{output}}"}
            next: z
          z: {type: end, output: x}
    """)
    directory = tmp_path / "g"
    assert errors(report) == [f"[a] rag document './missing/' does not exist: no file or directory {directory}/missing",
                              "[a] rag document 'pdf:x.pdf': unknown loader 'pdf' (supported: text, file)"]
    empty = "names no file; the knowledge base gets nothing from it"
    assert warnings(report) == [f"[a] rag document 'docs/**/*.md' {empty}", f"[a] rag document 'knowledge' {empty}"]


def test_llm_tools_servers_and_models(tmp_path: Path) -> None:
    report = check(tmp_path, """
        name: g
        model: nowhere:big
        global_tools: [calculate.py, not_a_function]
        mcp_servers: [files]
        start: a
        nodes:
          a:
            type: llm
            prompt: p
            model: mystery:m
            tools: [calculate, web_search, mcp:github, not_a_function]
            next: z
          z: {type: end, output: x}
    """)
    assert errors(report) == [
        "[graph] MCP server 'files' is not defined in the MCP config (none found)",
        "[graph] Unknown model 'nowhere:big': no installed provider handles it",
        "[a] llm node references unknown tool 'web_search'. Agent 'g' provides: calculate, not_a_function, "
        "mcp:files",
        "[a] llm node references unknown MCP server 'github' (mcp:github)",
        "[a] Tool 'not_a_function' is neither a built-in tool, a function of tools.py or tools.sh, nor a file of "
        "Loki's functions/tools",
        "[a] Unknown model 'mystery:m': no installed provider handles it",
    ]


def test_mcp_servers_from_the_agents_mcp_json(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, """
        name: g
        mcp_servers: [files]
        start: a
        nodes:
          a: {type: llm, prompt: p, tools: ["mcp:files"], next: z}
          z: {type: end, output: x}
    """)
    (directory / "mcp.json").write_text(json.dumps({"mcpServers": {"files": {"command": "true"}}}))
    spec = load_graph(directory)
    assert validate(spec, Checks(directory, model_known=lambda m: True)).errors == []


def test_tools_from_tools_py(tmp_path: Path) -> None:
    report = check(tmp_path, """
        name: g
        global_tools: [shout]
        start: a
        nodes:
          a: {type: llm, prompt: p, tools: [shout], next: z}
          z: {type: end, output: x}
    """, files={"tools.py": "def shout(text: str) -> str:\n    'Shout.'\n    return text.upper()\n"})
    assert errors(report) == []


def test_skills(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    skills = tmp_path / "skills"
    for name in ("pdf", "charts"):
        (skills / name).mkdir(parents=True)
        (skills / name / "SKILL.md").write_text(f"# {name}\n")
    monkeypatch.setenv("RINGLET_SKILLS_DIR", str(skills))
    report = check(tmp_path, """
        name: g
        enabled_skills: [pdf, Bad_Name]
        start: a
        nodes:
          a: {type: llm, prompt: p, enabled_skills: [charts, pdf, absent], next: b}
          b: {type: llm, prompt: p, enabled_skills: [absent, Bad_Name], next: z}
          z: {type: end, output: x}
    """)
    assert errors(report) == ["[graph] Invalid skill name 'Bad_Name'",
                              "[a] Skill 'charts' is not among the graph's enabled_skills",
                              "[a] Skill 'absent' is not installed"]  # once per graph, not again for b


def test_max_concurrency_zero(tmp_path: Path) -> None:
    report = check(tmp_path, """
        name: g
        settings: {max_concurrency: 0}
        start: m
        nodes:
          m: {type: map, over: "{{xs}}", as: x, branch: b, collect_into: ys, max_concurrency: 0, next: z}
          b: {type: script, script: s.sh}
          z: {type: end, output: x}
    """, files={"s.sh": "echo {}"})
    assert errors(report) == ["[graph] settings.max_concurrency must be at least 1, got 0",
                              "[m] max_concurrency must be at least 1, got 0"]


def test_input_validation_grammar(tmp_path: Path) -> None:
    report = check(tmp_path, """
        name: g
        start: a
        nodes:
          a: {type: input, question: q, validation: "len(input) > 3", next: b}
          b: {type: input, question: q, validation: "input != ''", next: z}
          z: {type: end, output: x}
    """)
    assert errors(report) == ["[b] Invalid validation expression 'input != '''"]
    assert "len(input) OP N" in report.errors[0].fix


def test_map_branch_rules(tmp_path: Path) -> None:
    report = check(tmp_path, """
        name: g
        initial_state: {xs: [1]}
        start: m1
        nodes:
          m1: {type: map, over: "{{xs}}", as: x, branch: ask, collect_into: ys, next: m2}
          ask: {type: input, question: q}
          m2: {type: map, over: "{{xs}}", as: x, branch: work, collect_into: ys, next: z}
          work:
            type: llm
            prompt: p
            state_updates: {output: "{{output}}", extra: "1"}
            next: z
          z: {type: end, output: x}
    """)
    assert errors(report) == [
        "[m1] Map branch 'ask' is a input node; a branch cannot be an approval, input, end or map node",
        "[work] Map branch 'work' of map 'm2' must not have 'next'",
        "[work] Map branch 'work' state_updates must write exactly 'output' (the map's output_key), got: extra, "
        "output",
    ]


def test_fan_out_rules(tmp_path: Path) -> None:
    report = check(tmp_path, """
        name: g
        reducers: {shared: append}
        start: fan
        nodes:
          fan: {type: script, script: s.sh, next: [ask, quiet, one, two, three]}
          ask: {type: approval, question: q, options: [y], routes: {y: z}, on_other: z}
          quiet: {type: script, script: s.sh, next: z}
          one:
            type: llm
            prompt: p
            output_schema: {type: object, properties: {topic: {type: string}}}
            state_updates: {shared: "{{output}}", result: "{{output}}"}
            next: z
          two:
            type: llm
            prompt: "uses {{topic}}"
            state_updates: {result: "{{output}}", shared: x}
            next: z
          three: {type: agent, agent: helper, prompt: p, state_updates: {other: x}, next: z}
          z: {type: end, output: x}
    """, files={"s.sh": "echo {}"})
    assert errors(report) == [
        "[fan] Parallel branch 'ask' is an approval node; approval and input nodes cannot be targets of a next list",
        "[fan] Parallel branch 'quiet' is a script without state_updates",
        "[fan] Parallel branches 'one' and 'two' both write 'result' with no reducer declared",
        "[fan] Parallel branch 'two' reads 'topic', which its sibling 'one' writes",
    ]


def test_warnings(tmp_path: Path) -> None:
    report = check(tmp_path, """
        name: other
        start: a
        nodes:
          a: {type: script, script: s.sh, next: a2}
          a2: {type: script, script: s.sh, next: a}
          lost: {type: end}
    """, files={"s.sh": "echo {}"})
    assert warnings(report) == [
        "[graph] No end node is reachable from start 'a' over the declared edges",
        "[lost] End node has no 'output'; the run's result will be \"\"",
        "[lost] Node 'lost' is unreachable from start 'a'",
        "[graph] Graph name 'other' does not match its agent directory 'g'",
    ]


def test_the_error_message_lists_every_error(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, """
        name: g
        start: a
        nodes:
          a: {type: script, script: nope.sh, next: b}
          b: {type: end, output: x}
          c: {type: input, question: q, validation: "bad", next: b}
    """)
    with pytest.raises(GraphValidationError) as info:
        load_agent(directory)
    message = str(info.value)
    assert message.startswith("Graph validation failed with 2 error(s):\n  [a] Script file not found: 'nope.sh'\n")
    assert "\n  [c] Invalid validation expression 'bad'\n" in message
    assert f"at {directory / 'graph.yaml'}:4:" in message
    assert len(info.value.errors) == 2
    assert len(info.value.warnings) == 1


def test_validate_before_run_false_skips_the_validator(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, """
        name: g
        settings: {validate_before_run: false}
        start: a
        nodes:
          a: {type: script, script: nope.sh, next: b}
          b: {type: end, output: x}
    """)
    assert load_agent(directory).name == "g"


def test_a_broken_tools_py_is_named(tmp_path: Path) -> None:
    report = check(tmp_path, """
        name: g
        global_tools: [shout]
        start: a
        nodes:
          a: {type: llm, prompt: p, tools: [shout], next: z}
          z: {type: end, output: x}
    """, files={"tools.py": "import no_such_module_here\n"})
    assert errors(report) == ["[a] Tool 'shout' is neither a built-in tool, a function of tools.py or tools.sh, "
                              "nor a file of Loki's functions/tools"]
    assert "No module named 'no_such_module_here'" in report.errors[0].fix


def test_nodes_a_script_may_route_to_are_one_quiet_warning(tmp_path: Path) -> None:
    report = check(tmp_path, """
        name: g
        start: a
        nodes:
          a: {type: script, script: route.sh, next: z}
          retry: {type: script, script: route.sh, next: z}
          later: {type: end, output: y}
          z: {type: end, output: x}
    """, files={"route.sh": """echo '{"_next": "retry"}'"""})
    assert warnings(report) == ["[graph] 2 node(s) are reached only if a script routes to them with _next: retry, "
                                "later"]
    assert report.warnings[0].quiet


TYPO = """
    name: g
    variables: [{name: lang, default: en}]
    initial_state: {name: Ada}
    start: hello
    nodes:
      hello:
        type: llm
        instructions: |
          You greet people on {{__os__}}.
          Be brief with {{nam}}.
        prompt: "Greet {{name}} in {{lang}}, {{nobody}}"
        output_schema: {type: object, properties: {greeting: {type: string}}}
        state_updates: {said: "{{output}} {{outptu}}"}
        next: done
      done: {type: end, output: "{{greeting}} {{said}} {{choice}}"}
"""


def test_a_template_that_reads_a_key_nothing_writes_is_reported_where_it_is(tmp_path: Path) -> None:
    report = check(tmp_path, TYPO)
    path = tmp_path / "g" / "graph.yaml"
    assert [e.describe() for e in report.errors] == [
        f"[hello] {{{{nam}}}} reads 'nam', which nothing in the graph writes. Did you mean 'name'?\n"
        f"      at {path}:10:21: write {{{{name}}}} (as it is, the node fails: {{{{nam}}}} is strict here)"]
    assert [(str(w), w.where.removeprefix(f"{path}:")) for w in report.warnings] == [
        ("[hello] {{lang}} reads 'lang', a variable; variables are not in the graph's state", "11:32"),
        ("[hello] {{nobody}} reads 'nobody', which nothing in the graph writes", "11:42"),
        ("[hello] {{outptu}} reads 'outptu', which nothing in the graph writes. Did you mean 'output'?", "13:39"),
        ("[done] {{choice}} reads 'choice', which nothing in the graph writes", "15:52")]


def test_keys_a_script_prints_are_known_when_its_source_names_them(tmp_path: Path) -> None:
    graph = """
        name: g
        start: s
        nodes:
          s: {type: script, script: s.py, next: ask}
          ask: {type: llm, prompt: "{{topic}} {{topik}}", next: z}
          z: {type: end, output: x}
    """
    report = check(tmp_path, graph, files={"s.py": "import json\nprint(json.dumps({'topic': 'otters'}))\n"})
    assert errors(report) == []  # a script may print any key: at most a warning
    assert warnings(report) == ["[ask] {{topik}} reads 'topik', which nothing in the graph writes. "
                                "Did you mean 'topic'?"]


def test_the_triage_example_names_the_model_it_needs() -> None:
    """Its by_topic node needs JSON the embedded 135M model cannot write reliably; the graph says so and names a
    model, and `ringlet graph validate` still accepts it (as the README runs it)."""
    from typer.testing import CliRunner

    from ringlet.cli import app
    from ringlet.graph.parse import load_graph
    from test_graph_support import EXAMPLES

    spec = load_graph(EXAMPLES / "triage")
    assert spec.model == "openai:gpt-4o-mini"
    assert "not the embedded local:smollm2" in " ".join(spec.description.split())
    result = CliRunner().invoke(app, ["graph", "validate", str(EXAMPLES / "triage")])
    assert result.exit_code == 0, result.output
