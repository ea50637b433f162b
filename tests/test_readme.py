"""The README's Python examples run, with a scripted model standing in for `local:`."""

from __future__ import annotations

import re
from pathlib import Path

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
