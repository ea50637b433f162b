"""Fallback models (issue 21): `FallbackModel`, its events and metadata, and `model:` lists in config.yaml."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest

import ringlet
from helpers import collect, of_type
from ringlet import (
    Agent,
    AuthError,
    BadRequestError,
    ConfigError,
    ContextWindowError,
    FallbackModel,
    NetworkError,
    OverloadedError,
    ProviderError,
    ProviderTimeoutError,
    RateLimitError,
    ServerError,
)
from ringlet.agent.config import build_agent, load_config, load_spec
from ringlet.models import Chunk, Finish, Model, ModelRequest, ModelSwitch, TextDelta, ToolCallStart, providers
from ringlet.models.base import Retrying
from ringlet.models.retry import RetryingModel
from ringlet.testing import Chunks, ScriptedModel

CURED_BY_FALLBACK = [
    ServerError("down", status=503),
    OverloadedError("overloaded", status=529),
    RateLimitError("slow down", status=429),
    ProviderTimeoutError("timed out"),
    NetworkError("connection reset"),
]


def scripted(name: str, *script: Any, window: int | None = None) -> ScriptedModel:
    return ScriptedModel(list(script), name=f"test:{name}", context_window=window)


async def chunks_of(model: Model) -> list[Chunk]:
    return [c async for c in model.stream(ModelRequest([]))]


async def until_error(model: Model) -> tuple[list[Chunk], BaseException]:
    """The chunks a stream yields before it raises, and what it raised (StopAsyncIteration: it did not)."""
    stream, seen = model.stream(ModelRequest([])), []
    while True:
        try:
            seen.append(await anext(stream))
        except Exception as exc:  # the test checks what it is
            return seen, exc


# -- FallbackModel on its own ------------------------------------------------------------------------------


def test_it_is_a_model_named_after_its_primary() -> None:
    model = FallbackModel(scripted("a", window=1000), scripted("b", window=9000))
    assert isinstance(model, Model)
    assert (model.name, model.context_window) == ("test:a", 1000)
    assert ringlet.FallbackModel is FallbackModel
    assert "FallbackModel" in ringlet.__all__
    assert "FallbackModel" in ringlet.models.__all__


@pytest.mark.parametrize("error", CURED_BY_FALLBACK, ids=lambda e: type(e).__name__)
async def test_each_uncured_provider_failure_moves_on_to_the_next_model(error: ProviderError) -> None:
    a, b = scripted("a", error), scripted("b", "from b")
    chunks = await chunks_of(FallbackModel(a, b))
    assert chunks[0] == ModelSwitch("test:b", f"test:a failed with {type(error).__name__}: {error.message}")
    assert chunks[1:] == [TextDelta("from b"), Finish("stop")]
    assert b.requests == a.requests  # the same request, sent again
    a.assert_complete()
    b.assert_complete()


@pytest.mark.parametrize("error", [AuthError("bad key", status=401), BadRequestError("bad", status=400),
                                   ValueError("a bug")], ids=lambda e: type(e).__name__)
async def test_other_failures_are_raised_as_they_are(error: Exception) -> None:
    b = scripted("b", "from b")
    with pytest.raises(type(error)) as raised:
        await chunks_of(FallbackModel(scripted("a", error), b))
    assert raised.value is error
    assert b.requests == []


@pytest.mark.parametrize("output", [TextDelta("Hal"), ToolCallStart(0, "get_weather", "c1")],
                         ids=["text", "tool_call"])
async def test_no_fallback_once_output_was_yielded(output: Chunk) -> None:
    error = ServerError("reset", status=502)
    b = scripted("b", "from b")
    seen, raised = await until_error(FallbackModel(scripted("a", Chunks([output, error])), b))
    assert raised is error
    assert seen == [output]
    assert b.requests == []


async def test_retry_notices_and_empty_text_are_not_output() -> None:
    a = scripted("a", Chunks([Retrying(1, 0.5, "ServerError: down"), TextDelta(""), ServerError("down")]))
    chunks = await chunks_of(FallbackModel(a, scripted("b", "from b")))
    assert [type(c) for c in chunks] == [Retrying, TextDelta, ModelSwitch, TextDelta, Finish]
    assert chunks[-2] == TextDelta("from b")


async def test_a_prompt_too_long_skips_to_the_first_model_with_a_larger_window() -> None:
    error = ContextWindowError("prompt is too long", status=400)
    a, b, c, d = (scripted("a", error, window=8000), scripted("b", "never", window=8000),
                  scripted("c", "never", window=4000), scripted("d", "from d", window=32000))
    chunks = await chunks_of(FallbackModel(a, b, c, d))
    assert chunks[0] == ModelSwitch("test:d", "test:a failed with ContextWindowError: prompt is too long")
    assert chunks[1] == TextDelta("from d")
    assert b.requests == c.requests == []


@pytest.mark.parametrize(("failing", "others"), [(8000, [8000, 4000]), (8000, [None]), (None, [32000])],
                         ids=["none_larger", "next_unknown", "failing_unknown"])
async def test_a_prompt_too_long_is_raised_without_a_known_larger_window(failing: int | None,
                                                                         others: list[int | None]) -> None:
    error = ContextWindowError("prompt is too long", status=400)
    rest = [scripted(f"m{i}", "never", window=w) for i, w in enumerate(others)]
    with pytest.raises(ContextWindowError) as raised:
        await chunks_of(FallbackModel(scripted("a", error, window=failing), *rest))
    assert raised.value is error
    assert all(m.requests == [] for m in rest)


async def test_when_every_model_fails_the_last_error_is_raised() -> None:
    last = NetworkError("unreachable")
    model = FallbackModel(scripted("a", ServerError("down", status=500)), scripted("b", OverloadedError("busy")),
                          scripted("c", last))
    seen, raised = await until_error(model)
    assert raised is last
    assert [c.model for c in seen if isinstance(c, ModelSwitch)] == ["test:b", "test:c"]


# -- through Agent.run: events, metadata and failures ------------------------------------------------------


@pytest.mark.parametrize("error", CURED_BY_FALLBACK, ids=lambda e: type(e).__name__)
async def test_a_run_is_answered_by_the_fallback_and_says_so(error: ProviderError) -> None:
    a, b = scripted("a", error), scripted("b", "Hello from b.")
    events, result = await collect(Agent(FallbackModel(a, b)))
    assert result.status == "completed"
    assert result.output == "Hello from b."
    notes = [e for e in of_type(events, "notification") if e.title == "model fallback"]
    assert [(n.level, n.source, n.message) for n in notes] == [
        ("warning", "test:b", f"test:a failed with {type(error).__name__}: {error.message}; test:b answers now")]
    assert result.messages[-1].metadata["model"] == "test:b"


async def test_metadata_names_the_primary_when_it_answers() -> None:
    events, result = await collect(Agent(FallbackModel(scripted("a", "from a"), scripted("b", "never"))))
    assert result.output == "from a"
    assert result.messages[-1].metadata["model"] == "test:a"
    assert not [e for e in of_type(events, "notification") if e.title == "model fallback"]


@pytest.mark.parametrize(("error", "code"), [(AuthError("bad key", status=401), "auth_error"),
                                             (BadRequestError("bad", status=400), "bad_request_error")])
async def test_a_run_does_not_fall_back_on_auth_or_bad_request(error: ProviderError, code: str) -> None:
    b = scripted("b", "never")
    _, result = await collect(Agent(FallbackModel(scripted("a", error), b)))
    assert result.status == "failed"
    assert result.error["code"] == code
    assert b.requests == []


async def test_a_run_fails_when_the_stream_breaks_after_text() -> None:
    b = scripted("b", "never")
    events, result = await collect(Agent(FallbackModel(
        scripted("a", Chunks([TextDelta("Hal"), ServerError("reset", status=502)])), b)))
    assert result.error["code"] == "stream_interrupted"
    assert result.messages[-1].text == "Hal"
    assert b.requests == []
    assert not [e for e in of_type(events, "notification") if e.title == "model fallback"]


async def test_a_run_whose_models_all_fail_fails_with_the_last_error() -> None:
    model = FallbackModel(scripted("a", ServerError("a is down", status=500)),
                          scripted("b", OverloadedError("b is busy", status=529)))
    _, result = await collect(Agent(model))
    assert result.status == "failed"
    assert (result.error["code"], result.error["message"]) == ("overloaded_error", "b is busy")


async def test_a_stream_interrupted_on_the_fallback_names_it() -> None:
    model = FallbackModel(scripted("a", ServerError("down", status=503)),
                          scripted("b", Chunks([TextDelta("Hal"), ServerError("reset", status=502)])))
    _, result = await collect(Agent(model))
    assert result.error["code"] == "stream_interrupted"
    assert result.messages[-1].metadata["model"] == "test:b"


# -- resolve_model and config.yaml -------------------------------------------------------------------------


@pytest.fixture
def fake_provider(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    """A provider `fake:` whose models answer "from <name>"; records each model built and its options."""
    built: list[tuple[str, dict[str, Any]]] = []

    def factory(name: str, **options: Any) -> ScriptedModel:
        built.append((name, options))
        return ScriptedModel([f"from {name}"], name=f"fake:{name}", context_window=options.get("context_window"))

    module = types.ModuleType("fake_provider")
    module.FakeModel = factory  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_provider", module)
    monkeypatch.setitem(providers.PROVIDERS, "fake", providers.Provider("fake", "fake_provider", "FakeModel",
                                                                         "fake", ()))
    return built


def test_resolve_model_builds_a_fallback_of_a_list(fake_provider: list[tuple[str, dict[str, Any]]]) -> None:
    model = providers.resolve_model(["fake:a", "fake:b"], context_window=4096)
    assert isinstance(model, FallbackModel)
    assert [m.name for m in model.models] == ["fake:a", "fake:b"]
    assert all(isinstance(m, RetryingModel) for m in model.models)  # each behind its own retry layer
    assert fake_provider == [("a", {"context_window": 4096}), ("b", {"context_window": 4096})]
    single = scripted("x")
    assert providers.resolve_model([single]) is single
    with pytest.raises(ConfigError, match="empty list of models"):
        providers.resolve_model([])
    with pytest.raises(ConfigError, match="unknown provider 'nope'"):
        providers.resolve_model(["fake:a", "nope:b"])


def write_config(tmp_path: Path, text: str) -> Path:
    directory = tmp_path / "agent"
    directory.mkdir()
    (directory / "config.yaml").write_text(text)
    return directory


async def test_a_config_model_list_builds_a_fallback_model(
        tmp_path: Path, fake_provider: list[tuple[str, dict[str, Any]]]) -> None:
    directory = write_config(tmp_path, "model: [fake:a, fake:b]\nmodel_options: {context_window: 2048}\n")
    spec = load_spec(directory)
    assert spec.config is not None
    assert spec.config.model == ["fake:a", "fake:b"]
    assert spec.config.primary_model == "fake:a"
    agent = build_agent(spec)
    assert isinstance(agent.model, FallbackModel)
    assert [m.name for m in agent.model.models] == ["fake:a", "fake:b"]
    assert fake_provider == [("a", {"context_window": 2048}), ("b", {"context_window": 2048})]
    result = await agent.run("hi")
    assert (result.output, result.messages[-1].metadata["model"]) == ("from a", "fake:a")


def test_a_config_single_model_stays_a_single_model(
        tmp_path: Path, fake_provider: list[tuple[str, dict[str, Any]]]) -> None:
    spec = load_spec(write_config(tmp_path, "model: fake:a\nmodel_options: {context_window: 2048}\n"))
    assert spec.config is not None
    assert spec.config.primary_model == "fake:a"
    agent = build_agent(spec)
    assert isinstance(agent.model, RetryingModel)
    assert fake_provider == [("a", {"context_window": 2048})]


@pytest.mark.parametrize(("text", "problem"), [
    ("model: []\n", "an empty list names no model"),
    ("model: [fake:a, 3]\n", "3 is not a model name"),
    ("model: [fake:a, '']\n", "'' is not a model name"),
    ("model: [local:, fake:a]\n", "{'local': None} is not a model name; a list of models holds `provider:model` "
                                  'names, tried in order (quote a name that ends in ":", e.g. "local:")'),
    ("model: {fake: a}\n", "model: Input should be a valid"),
], ids=["empty", "number", "blank", "unquoted_colon", "mapping"])
def test_a_bad_model_list_is_a_clear_error(tmp_path: Path, text: str, problem: str) -> None:
    path = write_config(tmp_path, "name: x\n" + text) / "config.yaml"
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    message = str(raised.value)
    assert f"{path}:2:1: model: " in message
    assert problem in message
