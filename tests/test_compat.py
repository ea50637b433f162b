"""The OpenAI-compatible API (server-contract.md §7) driven by the official `openai` client over real HTTP."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import pytest
from httpx_sse import aconnect_sse

from ringlet import Agent, Limits, tool
from ringlet.errors import ProviderError
from ringlet.loop.run import EMPTY_ANSWER_SENTENCE
from ringlet.models.pricing import Price, Pricing
from ringlet.models.providers import resolve_model
from ringlet.models.retry import RetryPolicy
from ringlet.server import ServerSettings, create_app
from ringlet.store import Store
from ringlet.testing import FunctionModel, Reply, call
from serving import serving

seen_requests: list[Any] = []


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def adding(request: Any) -> Any:
    return "The sum is 5." if request.messages[-1].role == "tool" else call("add", a=2, b=3)


def mixed(request: Any) -> Any:
    """Calls a server tool and a client tool together; answers from both results."""
    seen_requests.append(request)
    results = {m.name or m.tool_call_id: m.text for m in request.messages if m.role == "tool"}
    if not results:
        return [call("add", a=2, b=3), call("lookup", city="Paris")]
    return f"results: {sorted(results.values())}"


async def slow(request: Any) -> AsyncIterator[str]:
    yield "first words"
    await asyncio.Event().wait()  # then nothing, until the run is cancelled


def broken(request: Any) -> Any:
    raise ProviderError("upstream exploded", provider="test", status=400)


@pytest.fixture
async def base_url(store: Store) -> AsyncIterator[str]:
    agents = [Agent(FunctionModel(adding), name="adder", tools=[add], instructions="Add numbers."),
              Agent(FunctionModel(mixed), name="mixed", tools=[add]),
              Agent(FunctionModel(broken), name="broken"), Agent(FunctionModel(slow), name="slow")]
    app = create_app(ServerSettings(), store=store, agents=agents)
    async with serving(app) as url:
        key, _ = await store.keys.create("k", scopes=["chat"])
        yield url, key  # type: ignore[misc]


@pytest.fixture
def client(base_url: Any) -> openai.AsyncOpenAI:
    url, key = base_url
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


async def test_models_lists_the_agents(client: openai.AsyncOpenAI) -> None:
    models = await client.models.list()
    assert {m.id for m in models.data} == {"adder", "mixed", "broken", "slow"}
    assert all(m.owned_by == "ringlet" for m in models.data)


async def test_non_streaming_completion_runs_the_loop_server_side(client: openai.AsyncOpenAI, store: Store) -> None:
    completion = await client.chat.completions.create(model="adder", messages=[{"role": "user", "content": "2+3?"}])
    choice = completion.choices[0]
    assert choice.message.content == "The sum is 5."
    assert choice.finish_reason == "stop"
    assert completion.usage is not None
    assert completion.usage.prompt_tokens > 0
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens
    extra = completion.model_extra or {}
    assert extra["ringlet"]["run_id"].startswith("r_")
    assert extra["ringlet"]["finish_reason"] == "end_turn"
    run = await store.runs.get(extra["ringlet"]["run_id"])  # the transcript is not kept, the run's usage is
    assert run is not None
    assert (run.status, run.conversation_id) == ("completed", None)
    assert run.usage.out_tokens == completion.usage.completion_tokens


async def test_streaming_sends_real_chunks_and_usage(client: openai.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(model="adder", messages=[{"role": "user", "content": "2+3?"}],
                                                  stream=True, stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "The sum is 5."
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens > 0
    assert "add" not in text  # server-side tool activity never shows in content


async def test_client_tools_come_back_as_tool_calls_and_the_run_continues(client: openai.AsyncOpenAI) -> None:
    seen_requests.clear()
    tools = [{"type": "function", "function": {"name": "lookup", "description": "Look a city up.",
                                               "parameters": {"type": "object",
                                                              "properties": {"city": {"type": "string"}}}}}]
    messages: list[Any] = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "go"}]
    first = await client.chat.completions.create(model="mixed", messages=messages, tools=tools)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None
    assert [c.function.name for c in choice.message.tool_calls] == ["lookup"]  # only the client's call
    assert json.loads(choice.message.tool_calls[0].function.arguments) == {"city": "Paris"}
    assert "Be terse." in (seen_requests[0].instructions or "")  # client system text follows the agent's
    call_id = choice.message.tool_calls[0].id
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call_id, "content": "sunny"}]
    second = await client.chat.completions.create(model="mixed", messages=messages, tools=tools)
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == "results: ['5', 'sunny']"  # the server result was kept


async def test_streamed_client_tool_calls(client: openai.AsyncOpenAI) -> None:
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    stream = await client.chat.completions.create(model="mixed", messages=[{"role": "user", "content": "go"}],
                                                  tools=tools, stream=True)
    chunks = [c async for c in stream]
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert [(tc.index, tc.function.name) for tc in calls if tc.function] == [(0, "lookup")]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


async def test_errors_use_openai_shape(client: openai.AsyncOpenAI, base_url: Any) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        await client.chat.completions.create(model="nobody", messages=[{"role": "user", "content": "x"}])
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        await client.chat.completions.create(model="adder", n=2, messages=[{"role": "user", "content": "x"}])
    clash = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    with pytest.raises(openai.BadRequestError, match="defined twice"):
        await client.chat.completions.create(model="adder", tools=clash, messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.InternalServerError, match="upstream exploded"):
        await client.chat.completions.create(model="broken", messages=[{"role": "user", "content": "x"}])
    url, key = base_url
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}) as raw:
        streamed = await raw.post("/v1/chat/completions", json={"model": "broken", "stream": True,
                                                                "messages": [{"role": "user", "content": "x"}]})
        lines = [line for line in streamed.text.splitlines() if line.startswith("data: ")]
        assert json.loads(lines[-2].removeprefix("data: "))["error"]["message"] == "upstream exploded"
        assert lines[-1] == "data: [DONE]"
        unauthorized = await raw.get("/v1/models", headers={"Authorization": "Bearer rk_wrong"})
        assert unauthorized.status_code == 401
        assert unauthorized.json()["error"]["type"] == "authentication_error"


async def test_conversation_header_stores_the_transcript(client: openai.AsyncOpenAI, base_url: Any) -> None:
    url, key = base_url
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}) as raw:
        cid = (await raw.post("/api/v1/chat/conversations", json={"agent": "adder"})).json()["id"]
        completion = await client.chat.completions.create(
            model="adder", messages=[{"role": "user", "content": "2+3?"}],
            extra_headers={"X-Ringlet-Conversation-Id": cid})
        assert completion.choices[0].message.content == "The sum is 5."
        stored = (await raw.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"]
        assert [m["role"] for m in stored] == ["user", "assistant", "tool", "assistant"]
        again = await client.chat.completions.create(
            model="adder", stream=True, messages=[{"role": "user", "content": "once more"}],
            extra_headers={"X-Ringlet-Conversation-Id": cid})
        text = "".join([c.choices[0].delta.content or "" async for c in again if c.choices])
        assert text == "The sum is 5."
        stored = (await raw.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"]
        assert [m["content"] for m in stored if m["role"] == "user"] == ["2+3?", "once more"]


async def test_continuations_never_cross_between_runs(client: openai.AsyncOpenAI) -> None:
    """Two clients get the same provider call ids (`call_2`); each follow-up resumes its own transcript."""
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    firsts = [await client.chat.completions.create(model="mixed", tools=tools,
                                                   messages=[{"role": "user", "content": who}])
              for who in ("alice", "bob")]
    ids = [f.choices[0].message.tool_calls[0].id for f in firsts]  # type: ignore[index]
    assert ids[0] != ids[1]
    assert all(i.startswith("call_") and ".r_" in i for i in ids)
    for who, first, answer in zip(("bob", "alice"), reversed(firsts), ("rainy", "sunny"), strict=True):
        message = first.choices[0].message
        follow = await client.chat.completions.create(model="mixed", tools=tools, messages=[
            {"role": "user", "content": who}, message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": answer}])  # type: ignore[index]
        assert follow.choices[0].message.content == f"results: {sorted(['5', answer])}"
    assert seen_requests[-1].messages[0].text == "alice"  # alice's own transcript, server result included


async def test_a_continuation_outlives_the_server_that_kept_it(store: Store) -> None:
    """Continuations are stored: the results of a client's tool calls continue the run through another server
    process on the same store (here, a restarted one), once; a second delivery of them finds nothing kept."""
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    key, _ = await store.keys.create("k", scopes=["chat"])

    def app() -> Any:
        return create_app(ServerSettings(), store=store, agents=[Agent(FunctionModel(mixed), name="mixed",
                                                                       tools=[add])])

    async with serving(app()) as url:
        first = await openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0).chat.completions.create(
            model="mixed", tools=tools, messages=[{"role": "user", "content": "carol"}])
    message = first.choices[0].message
    follow_up = [{"role": "user", "content": "something else"}, message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "foggy"}]  # type: ignore[index]
    async with serving(app()) as url:
        other = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
        follow = await other.chat.completions.create(model="mixed", tools=tools, messages=follow_up)  # type: ignore[arg-type]
        assert follow.choices[0].message.content == f"results: {sorted(['5', 'foggy'])}"
        assert seen_requests[-1].messages[0].text == "carol"  # the kept transcript, not the one sent again
        await other.chat.completions.create(model="mixed", tools=tools, messages=follow_up)  # type: ignore[arg-type]
        assert seen_requests[-1].messages[0].text == "something else"  # taken once: now the client's own


async def test_a_streaming_client_leaving_cancels_an_ephemeral_run(client: openai.AsyncOpenAI, store: Store,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    finished, record = asyncio.Event(), store.runs.finish

    async def finish_run(*args: Any, **kwargs: Any) -> Any:
        ids = await record(*args, **kwargs)  # the server sends the closing events under these ids
        finished.set()
        return ids

    monkeypatch.setattr(store.runs, "finish", finish_run)
    stream = await client.chat.completions.create(model="slow", stream=True,
                                                  messages=[{"role": "user", "content": "go"}])
    chunks = aiter(stream)
    first = await anext(chunks)
    await chunks.aclose()  # closed here, not by the garbage collector while another task runs
    await stream.close()  # the client leaves mid-answer
    run_id = first.id.removeprefix("chatcmpl-")
    async with asyncio.timeout(10):  # the run is closed (not left working) once the server notices
        await finished.wait()
    run = await store.runs.get(run_id)
    assert run is not None
    assert (run.status, run.finish_reason) == ("canceled", "cancelled")


@pytest.mark.slow
async def test_models_are_the_keys_agents_and_a_busy_stream_sends_ping_comments(store: Store) -> None:
    """`: ping` lines keep a stream alive while server-side tools run (nothing reaches the content)."""
    release = asyncio.Event()

    @tool
    async def wait_for_release() -> str:
        """Wait until the test lets go."""
        await release.wait()
        return "done"

    def waiting(request: Any) -> Any:
        return "finished" if request.messages[-1].role == "tool" else call("wait_for_release")

    agents = [Agent(FunctionModel(waiting), name="waiter", tools=[wait_for_release]),
              Agent(FunctionModel(adding), name="adder", tools=[add])]
    app = create_app(ServerSettings(ping_interval_s=0.05), store=store, agents=agents)
    async with serving(app) as url:
        key, _ = await store.keys.create("w", scopes=["chat"], agents=["waiter"])
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as raw:
            assert [m["id"] for m in (await raw.get("/v1/models")).json()["data"]] == ["waiter"]
            lines = []
            async with asyncio.timeout(20), raw.stream("POST", "/v1/chat/completions", json={
                    "model": "waiter", "stream": True, "messages": [{"role": "user", "content": "go"}]}) as response:
                async for line in response.aiter_lines():
                    lines.append(line)
                    if line == ": ping":
                        release.set()  # the tool is still running, and the client has heard from us
            assert ": ping" in lines
            contents = [json.loads(x.removeprefix("data: "))["choices"][0]["delta"].get("content")
                        for x in lines if x.startswith("data: {") and '"choices":[{' in x]
            assert "".join(c or "" for c in contents) == "finished"
            assert [x for x in lines if x][-1] == "data: [DONE]"


# -- a blank model and a failing provider: what the official client sees (issue 16) ------------------------


def counting(app: Any, hits: list[str]) -> Any:
    """`app`, noting the path of every HTTP request that reaches it (to see what a client retried)."""
    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            hits.append(scope["path"])
        await app(scope, receive, send)

    return wrapped


async def native_events(url: str, key: str, agent: str) -> list[tuple[str, dict[str, Any]]]:
    """One message through the native API: the run's SSE events as (type, payload)."""
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as raw:
        cid = (await raw.post("/api/v1/chat/conversations", json={"agent": agent})).json()["id"]
        seen = []
        async with aconnect_sse(raw, "POST", f"/api/v1/chat/conversations/{cid}/messages",
                                json={"content": "hello?"}) as source:
            assert source.response.status_code == 200
            async for event in source.aiter_sse():
                seen.append((event.event, json.loads(event.data)))
                if event.event == "message_end":
                    break
    return seen


async def test_a_model_that_says_nothing_gets_a_fixed_answer_not_a_server_error(store: Store) -> None:
    mute = FunctionModel(lambda request: ["", "\n", " "][len(mute.requests) % 3])  # blank, whitespace
    hits: list[str] = []
    app = create_app(ServerSettings(), store=store, agents=[Agent(mute, name="mute")])
    async with serving(counting(app, hits)) as url:
        key, _ = await store.keys.create("k", scopes=["chat"])
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)  # a 5xx fails here, at once
        completion = await client.chat.completions.create(model="mute", messages=[{"role": "user", "content": "?"}])
        assert hits == ["/v1/chat/completions"]  # answered once: nothing for the client to retry
        assert len(mute.requests) == 3  # the loop's own blank-stop retries (max_blank_stops)
        choice = completion.choices[0]
        assert choice.finish_reason == "stop"  # whitespace the model streamed went out before the answer
        assert (choice.message.content or "").lstrip() == EMPTY_ANSWER_SENTENCE
        assert (completion.model_extra or {})["ringlet"]["finish_reason"] == "empty_response"
        run = await store.runs.get((completion.model_extra or {})["ringlet"]["run_id"])
        assert run is not None
        assert (run.status, run.finish_reason) == ("completed", "empty_response")

        stream = await client.chat.completions.create(model="mute", stream=True,
                                                      messages=[{"role": "user", "content": "?"}])
        chunks = [c async for c in stream]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text.lstrip() == EMPTY_ANSWER_SENTENCE
        assert chunks[-1].choices[0].finish_reason == "stop"
        assert (chunks[-1].model_extra or {})["ringlet"]["finish_reason"] == "empty_response"

        events = await native_events(url, key, "mute")  # the native stream says the same, with no error
        kinds = [kind for kind, _ in events]
        assert "error" not in kinds
        assert "".join(e["delta"] for kind, e in events if kind == "content_delta").lstrip() == EMPTY_ANSWER_SENTENCE
        assert events[-1][1]["finish_reason"] == "empty_response"
        assert [e["state"] for kind, e in events if kind == "status"][-1] == "completed"


@pytest.fixture
def nowhere() -> Iterator[str]:
    """A provider's URL on loopback that refuses connections: its port is bound here and never listened on,
    so no other process (another test's server) can take it while the test runs, as it could a port closed."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{bound.getsockname()[1]}/v1"


async def test_an_upstream_failure_is_a_502_the_openai_client_does_not_retry(store: Store, nowhere: str) -> None:
    upstream_hits: list[str] = []

    async def down(scope: Any, receive: Any, send: Any) -> None:  # a provider that always answers 503
        if scope["type"] == "http":
            upstream_hits.append(scope["path"])
            body = json.dumps({"error": {"message": "the model is down"}}).encode()
            await send({"type": "http.response.start", "status": 503,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": body})
        elif scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})

    quick = RetryPolicy(max_retries=1, initial_delay_s=0.01)
    hits: list[str] = []
    async with serving(down) as upstream:
        agents = [Agent(resolve_model("openai:m", base_url=f"{upstream}/v1", api_key="x", retry=quick), name="down"),
                  Agent(resolve_model("openai:m", base_url=nowhere, api_key="x", retry=quick), name="gone")]
        app = create_app(ServerSettings(), store=store, agents=agents)
        async with serving(counting(app, hits)) as url:
            key, _ = await store.keys.create("k", scopes=["chat"])
            client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key)  # the default: 2 retries on 5xx
            for agent, code in (("down", "server_error"), ("gone", "network_error")):
                hits.clear()
                with pytest.raises(openai.APIStatusError) as failed:
                    await client.chat.completions.create(model=agent, messages=[{"role": "user", "content": "x"}])
                assert failed.value.status_code == 502
                assert failed.value.response.headers["x-should-retry"] == "false"
                assert failed.value.code == code
                assert failed.value.type == "upstream_error"
                assert hits == ["/v1/chat/completions"]  # the client did not run the agent again
                async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}) as raw:
                    streamed = await raw.post("/v1/chat/completions", json={
                        "model": agent, "stream": True, "messages": [{"role": "user", "content": "x"}]})
                lines = [line for line in streamed.text.splitlines() if line.startswith("data: ")]
                error = json.loads(lines[-2].removeprefix("data: "))["error"]  # in a stream: the same error
                assert (error["type"], error["code"], lines[-1]) == ("upstream_error", code, "data: [DONE]")
                events = await native_events(url, key, agent)  # the native stream: the same code, then the end
                assert [e["code"] for kind, e in events if kind == "error"] == [code]
                assert events[-1][1]["finish_reason"] == "error"
            assert len(upstream_hits) == 2 * 3  # ringlet's own retry only: 2 attempts a run, 3 runs of "down"


async def test_cost_reads_the_same_on_v1_and_the_native_api(store: Store) -> None:
    """A model with a price: the same number everywhere; without one: null everywhere, never 0.0."""
    priced = Agent(FunctionModel(lambda r: "fine", name="test:priced"), name="priced",
                   limits=Limits(pricing=Pricing({"test:priced": Price(1.0, 2.0)})))
    agents = [priced, Agent(FunctionModel(lambda r: "fine"), name="unpriced")]
    app = create_app(ServerSettings(), store=store, agents=agents)
    async with serving(app) as url:
        key, _ = await store.keys.create("k", scopes=["chat"])
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
        for agent in ("priced", "unpriced"):
            completion = await client.chat.completions.create(model=agent,
                                                              messages=[{"role": "user", "content": "hello?"}])
            assert completion.usage is not None
            info = (completion.model_extra or {})["ringlet"]
            usage = completion.usage
            expected = (usage.prompt_tokens * 1.0 + usage.completion_tokens * 2.0) / 1e6 if agent == "priced" else None
            assert info["cost_usd"] == (pytest.approx(expected) if expected else None)
            run = await store.runs.get(info["run_id"])
            assert run is not None
            assert run.usage.cost_usd == info["cost_usd"]

            events = await native_events(url, key, agent)
            end = events[-1][1]
            assert end["usage"]["cost_usd"] == info["cost_usd"]  # the same prompt, the same tokens, the same cost
            async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}) as raw:
                listed = (await raw.get("/api/v1/chat/conversations")).json()["data"]
                conversation = next(c for c in listed if c["agent"] == agent)
            assert conversation["usage"]["cost_usd"] == info["cost_usd"]


def structured(request: Any) -> Any:
    """Calls the final-result tool it is offered (with a wrong type first, if the schema wants an integer)."""
    if not any(t.name == "city_answer" for t in request.tools):
        return "no output tool was offered"
    retried = any(m.role == "tool" for m in request.messages)
    return call("city_answer", city="Rome", rank=1 if retried else "first")


async def test_response_format_json_schema_gives_validated_json(store: Store) -> None:
    app = create_app(ServerSettings(), store=store, agents=[Agent(FunctionModel(structured), name="s")])
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "rank": {"type": "integer"}},
              "required": ["city", "rank"]}
    async with serving(app) as url:
        key, _ = await store.keys.create("k", scopes=["chat"])
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
        fmt: Any = {"type": "json_schema", "json_schema": {"name": "city_answer", "schema": schema}}
        done = await client.chat.completions.create(model="s", messages=[{"role": "user", "content": "Where?"}],
                                                    response_format=fmt)
        assert json.loads(done.choices[0].message.content or "") == {"city": "Rome", "rank": 1}
        streamed = await client.chat.completions.create(model="s", messages=[{"role": "user", "content": "?"}],
                                                        response_format=fmt, stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in streamed if c.choices])
        assert json.loads(text) == {"city": "Rome", "rank": 1}
        bad: Any = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(model="s", messages=[{"role": "user", "content": "?"}],
                                                 response_format=bad)
        assert refused.value.body["param"] == "response_format.json_schema.schema"  # type: ignore[index]


async def test_an_answer_cut_at_the_token_cap_finishes_with_length(store: Store) -> None:
    """A reply that ran to the token cap (the model's `length`) ends `finish_reason: "length"`, streamed
    and not, with and without a conversation; a whole answer still ends `stop`."""
    capped = FunctionModel(lambda request: Reply("The answer goes on and", finish_reason="length")
                           if "long" in request.messages[-1].text else Reply("Short."))
    app = create_app(ServerSettings(), store=store, agents=[Agent(capped, name="capped")])
    async with serving(app) as url:
        key, _ = await store.keys.create("k", scopes=["chat"])
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}) as raw:
            cid = (await raw.post("/api/v1/chat/conversations", json={"agent": "capped"})).json()["id"]
        for headers in ({}, {"X-Ringlet-Conversation-Id": cid}):
            for prompt, reason in (("long", "length"), ("short", "stop")):
                messages: Any = [{"role": "user", "content": prompt}]
                completion = await client.chat.completions.create(model="capped", messages=messages,
                                                                  max_tokens=5, extra_headers=headers)
                assert completion.choices[0].finish_reason == reason
                ringlet = (completion.model_extra or {})["ringlet"]  # the run's own reason agrees
                assert ringlet["finish_reason"] == ("length" if reason == "length" else "end_turn")
                run = await store.runs.get(ringlet["run_id"])
                assert run is not None
                assert run.finish_reason == ringlet["finish_reason"]
                stream = await client.chat.completions.create(model="capped", messages=messages, max_tokens=5,
                                                              stream=True, extra_headers=headers)
                chunks = [c async for c in stream]
                assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == reason
                last = [c for c in chunks if c.choices][-1]
                assert (last.model_extra or {})["ringlet"]["finish_reason"] == ringlet["finish_reason"]
                assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
                    ("The answer goes on and" if reason == "length" else "Short.")
