"""Helpers for the graph tests (this module holds no tests): graph directories on disk, runs that keep
their events, and a model that answers by what the prompt says (parallel branches ask in any order)."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ringlet.graph import GraphAgent, load_agent, load_graph
from ringlet.models.base import ModelRequest
from ringlet.testing import FunctionModel

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "graphs"


def make_graph(root: Path, yaml_text: str, *, name: str = "g", files: Mapping[str, str] | None = None) -> Path:
    """An agent directory `root/name` with graph.yaml and other files (scripts are made executable)."""
    directory = root / name
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "graph.yaml").write_text(textwrap.dedent(yaml_text).lstrip(), encoding="utf-8")
    for rel, text in (files or {}).items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
        if rel.endswith(".sh"):
            path.chmod(0o755)
    return directory


def graph_agent(directory: Path, **options: Any) -> GraphAgent:
    agent = load_agent(directory, **options)
    assert isinstance(agent, GraphAgent)
    return agent


def spec_of(root: Path, yaml_text: str, **kw: Any) -> Any:
    return load_graph(make_graph(root, yaml_text, **kw))


async def run_graph(agent: Any, prompt: str = "go", **options: Any) -> tuple[list[Any], Any]:
    stream = agent.stream(prompt, **options)
    events = [e async for e in stream]
    return events, stream.result


def last_user_text(request: ModelRequest) -> str:
    users = [m for m in request.messages if m.role == "user"]
    return users[-1].text if users else ""


def by_prompt(answers: Mapping[str, Any], default: Any = None) -> FunctionModel:
    """A model answering with the first entry whose key occurs in the latest user message (or the
    instructions); an answer may be a callable of the request."""

    def answer(request: ModelRequest) -> Any:
        text = last_user_text(request) + "\n" + (request.instructions or "")
        for key, reply in answers.items():
            if key in text:
                return reply(request) if isinstance(reply, Callable) else reply  # type: ignore[arg-type]
        if default is None:
            raise AssertionError(f"no scripted answer for prompt {text!r}")
        return default

    return FunctionModel(answer)


def types(events: list[Any]) -> list[str]:
    return [e.type for e in events]


def of_type(events: list[Any], kind: str) -> list[Any]:
    return [e for e in events if e.type == kind]
