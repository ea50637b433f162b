"""The built-in `assistant` on the embedded model (SmolLM2-135M in process, no API key): it answers
greetings, does arithmetic through `calculate`, reads the clock through `current_time`, and streams its
text and its tool calls' arguments as they are decoded. The real GGUF model, no network."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncGenerator
from typing import cast
from urllib.parse import urlsplit

import pytest

from ringlet import Agent
from ringlet.agent.config import build_agent, find
from ringlet.messages import Message
from ringlet.models.base import Chunk, Finish, ModelRequest, TextDelta, ToolCallArgsDelta, ToolCallStart
from ringlet.models.local.examples import EXAMPLES, ROUTES
from ringlet.models.local.model import LocalModel, _load
from ringlet.models.local.prompt import ReplyReader
from ringlet.tools.builtin.web import blocked

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model() -> LocalModel:
    return LocalModel()


@pytest.fixture(scope="module")
def assistant(model: LocalModel) -> Agent:
    agent = build_agent(find("assistant"), model=model)
    # the fixed prefix (instructions, tools, worked examples: ~1,500 tokens) once for the module; a
    # snapshot of it in the cache directory makes later runs skip even that
    model.warm(agent.instructions, _tools(agent))
    return agent


def _tools(agent: Agent) -> list:
    return [t.definition for ts in agent.toolsets for t in ts.static_tools or ()]


async def test_a_greeting_gets_a_streamed_answer_and_no_error(assistant: Agent) -> None:
    # a reply's last 32 characters are held back until it ends (the repeat guard): a longer answer
    # streams in many deltas, a two-word one in one
    stream = assistant.stream("Hello! Who are you?")
    events = [e async for e in stream]
    result = stream.result
    assert result is not None
    assert (result.finish_reason, result.error) == ("end_turn", None)
    assert result.output.strip()
    assert not any(e.type == "tool_call_start" for e in events)
    deltas = [e.delta for e in events if e.type == "content_delta"]
    assert len(deltas) > 1, deltas  # token by token, not one block at the end
    assert "".join(deltas) == result.output


async def test_arithmetic_goes_through_calculate_and_its_arguments_stream(assistant: Agent) -> None:
    stream = assistant.stream("What is 17 * 23?")
    events = [e async for e in stream]
    result = stream.result
    assert result is not None
    assert result.error is None
    starts = [e for e in events if e.type == "tool_call_start"]
    assert [e.name for e in starts] == ["calculate"]
    pieces = [e.args_delta for e in events if e.type == "tool_call_delta" and e.tool_call_id == starts[0].tool_call_id]
    assert len(pieces) > 1, pieces  # the arguments arrive as they are decoded
    assert "17" in json.loads("".join(pieces))["expression"]
    assert [e.result for e in events if e.type == "tool_result"] == ["391"]
    assert "391" in result.output


async def test_a_question_about_the_time_calls_current_time(assistant: Agent) -> None:
    result = await assistant.run("What time is it?")
    assert result.error is None
    calls = [c for m in result.messages for c in m.tool_calls]
    assert [c.name for c in calls] == ["current_time"]
    clock = next(m.text for m in result.messages if m.role == "tool")
    assert clock.split()[1][:4] in result.output  # the answer quotes the tool's date (its year at least)


async def test_the_model_streams_text_while_it_is_still_decoding(model: LocalModel) -> None:
    request = ModelRequest(messages=[Message.user("Write three sentences about the sea.")])
    stream = cast(AsyncGenerator[Chunk, None], model.stream(request))
    first = await anext(stream)
    assert isinstance(first, TextDelta)
    assert first.text
    lock = _load(model.path, model.n_ctx, model.chat_format, model.n_threads).lock
    assert lock.locked()  # the first piece arrived while the model still holds its lock, decoding the rest
    second = await anext(stream)
    assert isinstance(second, TextDelta)
    await stream.aclose()  # stops the decoding early
    await asyncio.to_thread(lock.acquire)  # the worker let go of the model
    lock.release()


async def test_a_tool_call_streams_its_start_then_argument_deltas(model: LocalModel, assistant: Agent) -> None:
    request = ModelRequest(messages=[Message.user("What is 12 * 12?")], instructions=assistant.instructions,
                           tools=_tools(assistant))
    chunks = [c async for c in model.stream(request)]
    assert isinstance(chunks[0], ToolCallStart)
    assert chunks[0].name == "calculate"
    args = [c.delta for c in chunks if isinstance(c, ToolCallArgsDelta)]
    assert len(args) > 1
    assert json.loads("".join(args)) == {"expression": "12 * 12"}
    assert isinstance(chunks[-1], Finish)
    assert chunks[-1].finish_reason == "tool_calls"
    assert not any(isinstance(c, TextDelta) for c in chunks)


def test_a_call_decoded_in_pieces_streams_its_start_then_its_arguments() -> None:
    """The direct (one-pass) reply: the call's frame is held back, its arguments go out as they come."""
    reader = ReplyReader()
    text = '<tool_call>{"name": "calculate", "arguments": {"expression": "1 + 1"}}</tool_call>'
    chunks = [c for i in range(0, len(text), 4) for c in reader.feed(text[i:i + 4])]
    chunks += reader.close()
    assert isinstance(chunks[0], ToolCallStart)
    assert chunks[0].name == "calculate"
    args = [c.delta for c in chunks if isinstance(c, ToolCallArgsDelta)]
    assert len(args) > 1
    assert "".join(args) == '{"expression": "1 + 1"}'
    assert reader.is_call


def test_a_plain_reply_is_text_from_its_first_piece() -> None:
    reader = ReplyReader()
    chunks = [c for piece in ("Hel", "lo", "!") for c in reader.feed(piece)]
    assert [c.text for c in chunks if isinstance(c, TextDelta)] == ["Hel", "lo", "!"]
    assert not reader.is_call


def _refused_host(host: str) -> bool:
    """Whether `web_fetch` (without `allow_private`) refuses this host: a loopback, private or reserved
    address, or a name of this machine."""
    try:
        return blocked(host)
    except ValueError:  # a name, not an address
        return host == "localhost" or host.endswith(".localhost")


def test_every_page_the_local_model_is_shown_is_one_web_fetch_would_read() -> None:
    """The worked turns and routing requests fetch public-looking names only: an example fetching a
    private address (one read http://192.168.1.5/status, issue 50) teaches a call `web_fetch` refuses."""
    texts = [content for example in EXAMPLES for _, content in example.turns] + list(ROUTES["web_fetch"][1])
    urls = {url for text in texts for url in re.findall(r"https?://[^\s\"'\\,)]+", text)}
    assert len(urls) >= 3, urls
    assert [url for url in urls if _refused_host(urlsplit(url).hostname or "")] == []
