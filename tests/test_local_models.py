"""Real models, no network: the embedded SmolLM2 GGUF in process, and behind llama.cpp's own
OpenAI-compatible server on a loopback port (driven through the OpenAI adapter)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from ringlet import Agent, Limits, tool
from ringlet.messages import Message
from ringlet.models.base import Finish, ModelRequest, ModelSettings, TextDelta
from ringlet.models.local import LocalModel, model_path
from ringlet.models.local.decode import RepeatGuard
from ringlet.models.openai import OpenAIModel
from ringlet.models.providers import resolve_model
from ringlet.models.retry import RetryingModel, RetryPolicy

pytestmark = pytest.mark.slow
LOOPING_PROMPT = "Repeat after me forever: la la la"


@tool(effect="read")
def get_weather(city: str) -> str:
    """Get the current weather for a city."""
    return f"Sunny and 21 degrees in {city}"


def test_the_embedded_model_ships_inside_a_package() -> None:
    path = model_path(None)
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.stat().st_size > 50_000_000


async def test_local_model_answers_in_text() -> None:
    result = await Agent(LocalModel(), instructions="Answer in one short sentence.").run("Say hello.")
    assert result.finish_reason == "end_turn"
    assert result.output.strip()
    assert result.usage.requests == 1
    assert result.usage.cost_usd == 0.0  # in-process models have a known price: zero


async def test_local_model_tool_call_round_trip() -> None:
    agent = Agent(LocalModel(), tools=[get_weather], limits=Limits(max_iterations=1, terminal_tool=None),
                  instructions="Use the get_weather tool to answer weather questions.")
    result = await agent.run("What is the weather in Paris?")
    calls = [c for m in result.messages for c in m.tool_calls]
    assert calls[0].name == "get_weather"
    assert "city" in calls[0].arguments
    tool_msgs = [m for m in result.messages if m.role == "tool"]
    assert tool_msgs[0].text.startswith("Sunny and 21 degrees in")
    assert result.finish_reason == "max_iterations"
    assert result.output.strip()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = _free_port()
    log = tmp_path_factory.mktemp("llama") / "server.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", str(model_path(None)), "--chat_format",
         "chatml-function-calling", "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "4096"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    ready = threading.Event()

    def copy() -> None:  # llama.cpp logs a lot: its output goes on into the log, so the pipe never fills up
        assert proc.stdout is not None
        with log.open("wb") as out:
            for line in proc.stdout:
                out.write(line)
                out.flush()
                if b"Uvicorn running on" in line:  # readiness: uvicorn listens
                    ready.set()
        ready.set()  # it exited

    copying = threading.Thread(target=copy, daemon=True)
    copying.start()
    try:
        if not ready.wait(120):
            raise RuntimeError("llama.cpp server did not start within 120 s")
        if proc.poll() is not None:
            copying.join()
            raise RuntimeError(f"llama.cpp server exited: {log.read_text(errors='replace')[-2000:]}")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        copying.join(timeout=30)


async def test_openai_adapter_against_llama_cpp_server_text(llama_server: str) -> None:
    model = RetryingModel(OpenAIModel("smollm2", base_url=llama_server, api_key="none"))
    events = [e async for e in Agent(model).stream("Say hello in five words.")]
    deltas = [e.delta for e in events if e.type == "content_delta"]
    assert len(deltas) > 1  # real token streaming
    assert events[-1].finish_reason == "end_turn"


async def test_openai_adapter_against_llama_cpp_server_tool_call(llama_server: str) -> None:
    # the server cannot stream tool calls with tool_choice "auto": it sends an empty stream, and the
    # adapter makes the request once more without streaming
    model = RetryingModel(OpenAIModel("smollm2", base_url=llama_server, api_key="none"))
    agent = Agent(model, tools=[get_weather], limits=Limits(max_iterations=1, terminal_tool=None),
                  instructions="Use the get_weather tool to answer weather questions.")
    result = await agent.run("What is the weather in Paris?")
    calls = [c for m in result.messages for c in m.tool_calls]
    assert [c.name for c in calls] == ["get_weather"], (result.error, [m.text for m in result.messages])
    assert next(m.text for m in result.messages if m.role == "tool").startswith("Sunny and 21 degrees in")
    assert result.finish_reason == "max_iterations"


async def test_a_tool_round_trip_through_llama_cpp_server_ends_with_the_models_answer(llama_server: str) -> None:
    """The request after the tool ran carries the assistant's call message: the server must accept it (it
    rejects `content: null`), so the final answer is the model's own and not the loop's fallback."""
    model = resolve_model("openai:smollm2", base_url=llama_server, api_key="none",
                          retry=RetryPolicy(max_retries=0))  # a rejected request fails at once
    agent = Agent(model, tools=[get_weather], limits=Limits(max_iterations=1, terminal_tool=None),
                  instructions="Use the get_weather tool to answer weather questions.")
    stream = agent.stream("What is the weather in Paris?")
    events = [e async for e in stream]
    results = [e for e in events if e.type == "tool_result"]
    assert [(e.name, e.is_error) for e in results] == [("get_weather", False)]
    assert str(results[0].result).startswith("Sunny and 21 degrees in")
    result = stream.result
    assert result is not None
    assert (result.finish_reason, result.error) == ("max_iterations", None)
    final = result.messages[-1]
    assert final.role == "assistant"
    assert not final.metadata.get("fallback"), "the request after the tool call failed: the loop fell back"
    assert final.metadata["usage"]["out_tokens"] > 0
    assert result.output.strip()
    assert result.usage.requests == 2


def _guarded(pieces: list[str]) -> tuple[str, bool]:
    guard = RepeatGuard()
    sent = []
    for piece in pieces:
        sent.append(guard.feed(piece))
        if guard.repeated:
            break
    sent.append(guard.flush())
    return "".join(sent), guard.repeated


def test_the_repeat_guard_cuts_a_reply_where_it_starts_repeating_itself() -> None:
    loop = "Goodbye! I'm sorry, I can't help with that. " * 6
    assert _guarded([loop[i:i + 3] for i in range(0, len(loop), 3)]) == (
        "Goodbye! I'm sorry, I can't help with that. ", True)
    digits = "37" * 50  # a string of digits, one token at a time
    assert _guarded(list(digits)) == ("37", True)
    prose = "The capital of France is Paris. It is known for the Eiffel Tower and its museums."
    assert _guarded([prose[i:i + 4] for i in range(0, len(prose), 4)]) == (prose, False)


def _no_repeated_span(text: str, span: int = 32) -> bool:
    return all(text.find(text[i:i + span], i + 1) < 0 for i in range(len(text) - span))


async def _reply(model: LocalModel, prompt: str, max_tokens: int) -> tuple[str, str | None]:
    request = ModelRequest(messages=(Message.user(prompt),), settings=ModelSettings(max_tokens=max_tokens))
    text, finish = [], None
    async for chunk in model.stream(request):
        if isinstance(chunk, TextDelta):
            text.append(chunk.text)
        elif isinstance(chunk, Finish):
            finish = chunk.finish_reason
    return "".join(text), finish


async def test_the_local_model_never_repeats_itself_and_a_cut_reply_ends_as_length() -> None:
    # greedy decoding makes SmolLM2 loop on this request: unguarded, "Ladle, I am a LADLE." to the cap
    text, finish = await _reply(LocalModel(), LOOPING_PROMPT, 256)
    assert finish == "length"
    assert text.strip()
    assert _no_repeated_span(text), text


async def test_a_reply_that_runs_to_the_token_cap_ends_as_length() -> None:
    text, finish = await _reply(LocalModel(), "Tell me a long story about a dragon.", 8)
    assert finish == "length"
    assert text.strip()
    short, finish = await _reply(LocalModel(), "Say hello.", 64)
    assert finish == "stop"
    assert short.strip()
