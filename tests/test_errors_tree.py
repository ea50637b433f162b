"""One exception tree (issue 21): every exception class ringlet defines derives from `RingletError`, and is
drawn in the tree of `ringlet.errors`' docstring, unless it is one of a few internal signals that never
escape a public API (listed there too, and below with the reason).

Every module of the package is imported (a module that needs an optional extra which is not installed is
skipped), then every subclass of BaseException whose module is ringlet's is checked, nested ones included.
"""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import ringlet
from ringlet import errors
from ringlet.errors import ConfigError, InvalidAnswer, ModelRetry, RingletError, RunError, ToolFailure

INTERNAL = {
    # Caught by `_attempts` in the same module: one more attempt of the llm node, else a NodeFailure.
    "ringlet.graph.llm.Retry",
    # Raised by the output_schema check; caught in graph/llm.py (repair request, Retry or NodeFailure).
    "ringlet.graph.structured.SchemaFailure",
    # No one to answer a node's question: caught by the graph engine, which pauses the run (input_required).
    "ringlet.graph.human.NeedsAnswer",
    # A tool call's own deadline: caught in the same module, the call's result is `tool_timeout`.
    "ringlet.loop.tools._Expired",
    # A remote A2A sub-agent that cannot run: caught by its stream, the call's result is `sub_agent_failed`.
    "ringlet.agent.remote._RemoteFailure",
    # An MCP server's connection closed: caught by MCPToolset.call (starts it again) and list_tools.
    "ringlet.mcp.session.Disconnected",
    # A starlette HTTPException (so FastAPI lets it through body parsing); caught by the body-size middleware.
    "ringlet.server.http.errors._TooLarge",
    # Likewise: a NUL character in a request body, caught by the same middleware (400).
    "ringlet.server.http.errors._Nul",
    # An unknown unit or a mixed conversion: caught by `calculate`, whose result is then a clear error.
    "ringlet.tools.builtin.units.UnitError",
    # A server's sampling request not answered: caught by `mcp.sampling.answer`, sent as the protocol's error.
    "ringlet.mcp.sampling.SamplingDeclined",
}


def _import_all() -> list[str]:
    """Import every module of ringlet; the names of those skipped for a missing optional dependency."""
    skipped = []
    for info in pkgutil.walk_packages(ringlet.__path__, "ringlet."):
        if info.name.rpartition(".")[2] == "__main__":  # runs the CLI
            continue
        try:
            importlib.import_module(info.name)
        except ImportError as exc:
            if (exc.name or "").startswith("ringlet"):
                raise
            skipped.append(info.name)
    return skipped


def _subclasses(cls: type[BaseException]) -> set[type[BaseException]]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub, *_subclasses(sub)}
    return found


def _ours() -> dict[str, type[BaseException]]:
    _import_all()
    return {f"{c.__module__}.{c.__qualname__}": c for c in _subclasses(BaseException)
            if c.__module__ == "ringlet" or c.__module__.startswith("ringlet.")}


@pytest.fixture(scope="module")
def ours() -> dict[str, type[BaseException]]:
    return _ours()


def test_every_exception_is_in_the_tree_or_an_internal_signal(ours: dict[str, type[BaseException]]) -> None:
    outside = sorted(name for name, cls in ours.items() if not issubclass(cls, RingletError))
    assert outside == sorted(INTERNAL), "derive it from RingletError (and draw it in ringlet/errors.py's tree)"


def test_the_docstring_draws_every_class(ours: dict[str, type[BaseException]]) -> None:
    doc = errors.__doc__ or ""
    missing = [name for name, cls in ours.items() if cls.__qualname__ not in doc]
    assert missing == []


def test_the_walk_sees_classes_outside_errors_py(ours: dict[str, type[BaseException]]) -> None:
    """The test above cannot pass by finding nothing: the known members of the tree are there."""
    assert {"ringlet.errors.ModelRetry", "ringlet.tools.base.ArgumentsInvalid", "ringlet.mcp.session.StartFailed",
            "ringlet.graph.parse.GraphLoadError", "ringlet.server.http.errors.ApiError"} <= set(ours)


def test_moved_classes_keep_their_imports_and_builtin_bases() -> None:
    from ringlet.gates.policy import PolicyError
    from ringlet.graph.agent import InvalidAnswer as from_graph
    from ringlet.memory.embeddings import EmbeddingError
    from ringlet.tools import ArgumentsInvalid

    assert PolicyError is errors.PolicyError
    assert EmbeddingError is errors.EmbeddingError
    assert from_graph is InvalidAnswer
    assert issubclass(InvalidAnswer, ValueError)
    assert issubclass(ConfigError, ValueError)
    invalid = ArgumentsInvalid(["a: required", "b: required"])
    assert isinstance(invalid, ToolFailure)
    assert (invalid.code, invalid.message, invalid.extra) == ("invalid_arguments", "a: required; b: required",
                                                              {"errors": ["a: required", "b: required"]})


def test_model_retry_is_public() -> None:
    assert ringlet.ModelRetry is ModelRetry
    assert "ModelRetry" in ringlet.__all__
    retry = ModelRetry("use an ISO date")
    assert isinstance(retry, RingletError)
    assert not isinstance(retry, RunError)
    assert retry.message == str(retry) == "use an ISO date"


def test_a_wrong_answer_is_invalid_answer() -> None:
    from ringlet.tools.builtin.question import check_answer

    question = {"input_type": "single-select", "options": [{"label": "yes"}, {"label": "no"}]}
    with pytest.raises(InvalidAnswer, match="expected one option label; options: yes, no"):
        check_answer(question, "maybe")
