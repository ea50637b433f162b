"""The README's Python examples run, with a scripted model standing in for `local:`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from ringlet.models import providers
from ringlet.testing import ScriptedModel, call

README = Path(__file__).parent.parent / "README.md"


def test_the_library_example_runs(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks
    model = ScriptedModel([call("get_weather", city="Paris"), "Sunny in Paris.", "Rome too."])
    import ringlet.agent

    for module in (providers, ringlet.agent):
        monkeypatch.setattr(module, "resolve_model", lambda spec, **_: model)
    exec(compile(blocks[0], str(README), "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out
    assert "Sunny in Paris. end_turn" in out
    assert "'type': 'message_end'" in out
    model.assert_complete()


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
        if hasattr(found, "commands"):  # a group (graph, keys, mcp, access): its subcommand too
            assert set(words[1].split("|")) <= set(found.commands), command  # `keys list|revoke`: each
