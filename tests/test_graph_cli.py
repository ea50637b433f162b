"""`ringlet graph validate` and `ringlet graph show`, and the Mermaid flowchart."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from ringlet.cli import app
from ringlet.graph import load_graph, to_mermaid
from test_graph_support import EXAMPLES, make_graph

runner = CliRunner()


def test_validate_a_valid_graph() -> None:
    result = runner.invoke(app, ["graph", "validate", str(EXAMPLES / "triage")])
    assert result.exit_code == 0, result.output
    assert "ok: 0 error(s), 0 warning(s)" in result.stderr


def test_validate_prints_every_error_and_warning(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, """
        name: g
        start: a
        nodes:
          a: {type: script, script: nope.sh, next: [b, ghost]}
          b: {type: input, question: q, validation: "size > 3", next: z}
          z: {type: end}
          lonely: {type: end, output: x}
    """)
    result = runner.invoke(app, ["graph", "validate", str(directory)])
    assert result.exit_code == 1
    out = result.stdout
    assert "error [a] Script file not found: 'nope.sh'" in out
    assert "error [a] References non-existent node 'ghost' in 'next'" in out
    assert "error [b] Invalid validation expression 'size > 3'" in out
    assert f"at {directory / 'graph.yaml'}:5:" in out
    assert "len(input) OP N" in out
    assert "warning [z] End node has no 'output'" in out
    assert "warning [lonely] Node 'lonely' is unreachable from start 'a'" in out
    assert "Graph validation failed with 3 error(s), 2 warning(s)" in result.stderr


def test_validate_reports_load_errors(tmp_path: Path) -> None:
    directory = make_graph(tmp_path, "name: g\nstart: a\nnodes:\n  a: {type: end, nxt: b}\n")
    result = runner.invoke(app, ["graph", "validate", str(directory)])
    assert result.exit_code == 2
    assert "unknown key 'nxt' in node 'a' (end). Did you mean 'next'?" in result.stderr


def test_validate_refuses_loop_agents_and_unknown_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RINGLET_AGENTS_DIR", "/nonexistent")
    result = runner.invoke(app, ["graph", "validate", str(EXAMPLES / "helper")])
    assert result.exit_code == 2
    assert "is a loop agent (config.yaml)" in result.stderr
    result = runner.invoke(app, ["graph", "validate", "no-such-agent"])
    assert result.exit_code == 2
    assert "no agent directory or agent named 'no-such-agent'" in result.stderr


def test_show_prints_a_mermaid_flowchart() -> None:
    result = runner.invoke(app, ["graph", "show", str(EXAMPLES / "signoff")])
    assert result.exit_code == 0
    assert result.stdout == to_mermaid(load_graph(EXAMPLES / "signoff"))


def test_mermaid_shapes_and_edges(tmp_path: Path) -> None:
    spec = load_graph(make_graph(tmp_path, """
        name: g
        start: split
        nodes:
          split: {type: script, script: s.sh, fallback: end, next: [each, ask]}
          each: {type: map, over: "{{xs}}", as: x, branch: work, collect_into: ys, next: end}
          work: {type: llm, prompt: p}
          ask: {type: approval, question: 'Go "now"?', options: [yes], routes: {yes: end}, on_other: end}
          end: {type: end, output: x}
    """))
    assert to_mermaid(spec) == (
        'flowchart TD\n'
        '    __start__(("start")) --> n_split\n'
        '    n_split[["split (script)"]]\n'
        '    n_each{{"each (map)"}}\n'
        '    n_work("work (llm)")\n'
        '    n_ask{"ask (approval)"}\n'
        '    n_end(["end (end)"])\n'
        '    n_split --> n_each\n'
        '    n_split --> n_ask\n'
        '    n_split -. "fallback" .-> n_end\n'
        '    n_each --> n_end\n'
        '    n_each -. "each x" .-> n_work\n'
        '    n_ask -- "yes" --> n_end\n'
        '    n_ask -- "other" --> n_end\n'
    )


def test_mermaid_marks_missing_targets(tmp_path: Path) -> None:
    spec = load_graph(make_graph(tmp_path, """
        name: g
        settings: {validate_before_run: false}
        start: a
        nodes:
          a: {type: script, script: s.sh, next: ghost}
          z: {type: end, output: x}
    """))
    assert to_mermaid(spec).endswith("    n_a --> n_ghost\n    n_ghost:::missing\n"
                                     "    classDef missing stroke:#d00,stroke-dasharray:4\n")
