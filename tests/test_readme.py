"""The README: one page that says what ringlet is, the two commands, one library and one server example,
and a map into the docs. Its example runs, with a scripted model standing in for the hosted one it names;
everything else it used to explain lives in docs/ (tests/test_docs.py runs those examples)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from ringlet.models import providers
from ringlet.testing import ScriptedModel, call

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"


def test_the_readme_fits_on_a_page_and_starts_with_what_ringlet_is() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    first = text.split("\n\n")[1]
    assert first.startswith("ringlet is a Python runtime for tool-using LLM agents")
    first_block = re.search(r"```(\w*)\n(.*?)```", text, re.S)
    assert first_block is not None
    assert [line.split()[:2] for line in first_block[2].splitlines()] == [["make", "run"], ["make", "test"]]
    assert "`bench/assistant.py --set held-out`) it answered" in text  # the measured figure (test_held_out)


def test_the_library_example_runs(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import ringlet.agent

    [block] = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    model = ScriptedModel([call("get_weather", city="Paris"), "Sunny in Paris.", "Rome too."])
    for module in (providers, ringlet.agent):
        monkeypatch.setattr(module, "resolve_model", lambda spec, **_: model)
    exec(compile(block, str(README), "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out
    assert "Sunny in Paris. end_turn" in out
    assert "'type': 'message_end'" in out
    model.assert_complete()
    follow_up = [(m.role, m.text) for m in model.requests[-1].messages]  # the follow-up continues the chat
    assert follow_up[0] == ("user", "What's the weather in Paris?")
    assert follow_up[-1] == ("user", "And in Rome?")


def test_the_commands_work_as_written() -> None:
    """Each shell command starts with what a fresh checkout has after `make run` (make, curl, or
    `.venv/bin/ringlet`: a bare `ringlet` is not on PATH); each make target exists, and each ringlet
    command parses against the Typer app."""
    import typer.main

    from ringlet.cli import app

    text = README.read_text()
    lines, continued = [], False
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.splitlines():
            if line.strip() and not continued:
                lines.append(line.split(" #")[0].strip())
            continued = line.rstrip().endswith("\\")
    assert [line for line in lines if line.split()[0] not in ("make", "curl", ".venv/bin/ringlet")] == []
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    assert {line.split()[1] for line in lines if line.startswith("make ")} <= targets
    cli: Any = typer.main.get_command(app)
    ringlet = [line for line in lines if line.startswith(".venv/bin/ringlet ")]
    assert ringlet
    for line in ringlet:
        words = shlex.split(line)[1:]
        cli.commands[words[0]].make_context(words[0], words[1:])  # a usage error raises


def test_every_link_into_the_docs_exists() -> None:
    links = re.findall(r"\]\((docs/[^)#]+)\)", README.read_text())
    assert len(links) >= 20
    assert [link for link in links if not (ROOT / link).exists()] == []
