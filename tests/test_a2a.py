"""A2A (the official `a2a-sdk`, its client only): every hosted agent is an A2A agent whose tasks are ringlet
runs (send, stream, get in another process, cancel, input-required answered in the task), and a remote A2A
agent (a second `ringlet serve`) is a sub-agent through an `a2a:` reference."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import A2ACardResolver, Client, ClientConfig, create_client
from a2a.helpers import get_artifact_text, get_data_parts, get_message_text, new_data_part, new_text_message
from a2a.types.a2a_pb2 import (
    AgentCard,
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Role,
    SendMessageRequest,
    StreamResponse,
    Task,
    TaskState,
)
from a2a.utils.errors import A2AError
from google.protobuf.json_format import MessageToDict

from ringlet import Agent, Gates, SubAgents, tool
from ringlet.gates import ApprovalRules
from ringlet.server import ServerSettings, create_app
from ringlet.server.catalog import Catalog
from ringlet.server.protocols.a2a.tasks import task_of
from ringlet.store import Store
from ringlet.testing import FunctionModel, call
from ringlet.tools.builtin.question import ask_question_tool
from serving import openai_model, serving
from test_recovery import free_port, ringlet_serve
from test_server_approvals import deploying
from test_server_questions import asking

started: dict[str, asyncio.Event] = {}
"""The waiter's tool has started (one event per test: each test has its own event loop)."""


@tool
async def wait_forever() -> str:
    """Waits until cancelled."""
    started["waiter"].set()
    await asyncio.Event().wait()
    return "never"


def echo(request: Any) -> Any:
    """Repeats the prompt, with how many user messages it has seen (the context is the conversation)."""
    users = [m for m in request.messages if m.role == "user"]
    return f"echo {users[-1].text} ({len(users)})"


def waiting(request: Any) -> Any:
    return "stopped" if any(m.role == "tool" for m in request.messages) else call("wait_forever", id="w1")


def agents() -> Catalog:
    """The hosted agents (a catalog: the echo agent has a description, as a config.yaml gives one)."""
    catalog = Catalog.of([
            Agent(FunctionModel(echo), name="echo"),
            Agent(FunctionModel(waiting), name="waiter", tools=[wait_forever]),
            Agent(FunctionModel(asking), name="painter", tools=[ask_question_tool()]),
            Agent(FunctionModel(deploying), name="ops", tools=[deploy_tool()], gates=Gates(approvals=ApprovalRules(
                {"deploy": {"mode": "confirm", "timeout_s": 60}})))])
    catalog.hosted["echo"].description = "Repeats what it is told."
    return catalog


def deploy_tool() -> Any:
    from test_server_approvals import deploy

    return deploy


@pytest.fixture
async def server(store: Store) -> AsyncIterator[tuple[str, Store]]:
    started["waiter"] = asyncio.Event()
    app = create_app(ServerSettings(ping_interval_s=0.2), store=store, agents=agents())
    async with serving(app) as url:
        yield url, store


async def key_for(store: Store, user: str, scopes: list[str], agents: list[str] | str = "*") -> str:
    key, _ = await store.keys.create(user, scopes=scopes, user_id=user, agents=agents)
    return key


@asynccontextmanager
async def a2a(url: str, key: str, agent: str, *, streaming: bool = True) -> AsyncIterator[tuple[Client, AgentCard]]:
    """The SDK's client for `agent`, from its card (fetched with the key)."""
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
        card = await A2ACardResolver(http, f"{url}/a2a/{agent}").get_agent_card()
        client = await create_client(card, ClientConfig(httpx_client=http, streaming=streaming))
        yield client, card


def user(text: str = "", *, task: Task | None = None, data: Any = None, context_id: str = "") -> SendMessageRequest:
    message = new_text_message(text, role=Role.ROLE_USER) if text else Message(role=Role.ROLE_USER, message_id="x")
    if data is not None:
        message.parts.append(new_data_part(data))
    if task is not None:
        message.task_id, message.context_id = task.id, task.context_id
    elif context_id:
        message.context_id = context_id
    return SendMessageRequest(message=message)


async def sent(client: Client, request: SendMessageRequest) -> Task:
    """A non-streaming send's task."""
    [response] = [r async for r in client.send_message(request)]
    assert response.HasField("task"), response
    return response.task


async def streamed(client: Client, request: SendMessageRequest) -> list[StreamResponse]:
    return [r async for r in client.send_message(request)]


def asked(task: Task) -> list[dict[str, Any]]:
    assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    return get_data_parts(list(task.status.message.parts))


async def test_the_card_names_the_agent_its_endpoint_and_bearer_keys(server: tuple[str, Store]) -> None:
    url, store = server
    key = await key_for(store, "ana", ["chat"])
    async with a2a(url, key, "echo") as (_, card):
        assert (card.name, card.description) == ("echo", "Repeats what it is told.")
        [interface] = card.supported_interfaces
        assert (interface.url, interface.protocol_binding, interface.protocol_version) == \
            (f"{url}/a2a/echo", "JSONRPC", "1.0")
        assert card.capabilities.streaming is True
        assert card.security_schemes["bearer"].http_auth_security_scheme.scheme == "bearer"
        assert [s.description for s in card.skills] == ["Repeats what it is told."]
    narrow = await key_for(store, "bo", ["chat"], agents=["echo"])
    async with httpx.AsyncClient(base_url=url) as http:
        card_path = "/a2a/echo/.well-known/agent-card.json"
        assert (await http.get(card_path)).status_code == 401
        for agent in ("nobody", "ops"):  # unknown, and one this key may not use: the same 404
            response = await http.get(f"/a2a/{agent}/.well-known/agent-card.json",
                                      headers={"Authorization": f"Bearer {narrow}"})
            assert (response.status_code, response.json()["error"]["code"]) == (404, "agent_not_found")


async def test_send_then_get_in_another_process_then_continue_the_context(server: tuple[str, Store]) -> None:
    url, store = server
    key = await key_for(store, "ana", ["chat"])
    async with a2a(url, key, "echo", streaming=False) as (client, _):
        task = await sent(client, user("hello"))
        assert task.status.state == TaskState.TASK_STATE_COMPLETED
        assert task.id.startswith("r_")
        assert task.context_id.startswith("c_")
        assert [get_artifact_text(a) for a in task.artifacts] == ["echo hello (1)"]
        assert get_message_text(task.status.message) == "echo hello (1)"
        run = await store.runs.get(task.id)  # the task is the run, in the conversation of the context
        assert run is not None
        assert (run.status, run.conversation_id) == ("completed", task.context_id)
        for bad in ("has space/and?query", "x" * 300):  # not a conversation id: a clear error, nothing stored
            with pytest.raises(A2AError, match="contextId"):
                await sent(client, user("hello", context_id=bad))
        again = await sent(client, user("again", context_id=task.context_id))
        assert again.id != task.id
        assert [get_artifact_text(a) for a in again.artifacts] == ["echo again (2)"]  # the conversation goes on
    other = await Store.open(store.engine.url.render_as_string(hide_password=False))
    try:  # a second server process on the same database reads the task from ringlet's records
        async with serving(create_app(ServerSettings(), store=other, agents=agents())) as second, \
                a2a(second, key, "echo", streaming=False) as (client, _):
            got = await client.get_task(GetTaskRequest(id=task.id))
            assert got.status.state == TaskState.TASK_STATE_COMPLETED
            assert [get_artifact_text(a) for a in got.artifacts] == ["echo hello (1)"]
            assert [get_message_text(m) for m in got.history] == ["hello"]
            assert got.history[0].message_id == task.history[0].message_id  # the A2A message keeps its id
            meta = MessageToDict(got.metadata)["ringlet"]
            assert meta["finish_reason"] == "end_turn"
            assert set(meta["usage"]) == {"in_tokens", "out_tokens", "cost_usd"}  # JSON, not a Python repr
            assert meta["usage"]["in_tokens"] == run.usage.in_tokens > 0
            assert meta["usage"]["cost_usd"] == run.usage.cost_usd
            with pytest.raises(A2AError):
                await client.get_task(GetTaskRequest(id="r_nope"))
    finally:
        await other.close()
    async with a2a(url, await key_for(store, "bo", ["chat"], agents=["echo", "ops"]), "ops") as (client, _):
        with pytest.raises(A2AError):  # the task of another agent is not found under this one
            await client.get_task(GetTaskRequest(id=task.id))


async def test_a_stream_carries_the_answer_as_it_is_written_then_completes(server: tuple[str, Store]) -> None:
    url, store = server
    async with a2a(url, await key_for(store, "ana", ["chat"]), "echo") as (client, _):
        events = await streamed(client, user("streams"))
    kinds = [e.WhichOneof("payload") for e in events]
    assert kinds[0] == "task"  # A2A 1.0: a stream opens with the Task (or a Message), then its updates
    assert "task" not in kinds[1:]
    opening = events[0].task
    assert opening.status.state == TaskState.TASK_STATE_WORKING
    assert opening.id == events[-1].status_update.task_id
    assert [get_message_text(m) for m in opening.history] == ["streams"]
    assert list(opening.artifacts) == []  # the answer streams after it
    chunks = [e.artifact_update for e in events if e.HasField("artifact_update")]
    assert "".join(get_artifact_text(c.artifact) for c in chunks if not c.last_chunk) == "echo streams (1)"
    assert (get_artifact_text(chunks[-1].artifact), chunks[-1].append) == ("echo streams (1)", False)
    assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED


async def test_a_task_read_from_a_record_taken_before_its_run_ended_is_the_ended_task(store: Store) -> None:
    """A record read just before the run's end (a stream's opening, a listing) and the transcript read just
    after it must not mix: the task is read as it now stands, the answer is its status and artifact, and it is
    never also a line of history under a working status."""
    app = create_app(ServerSettings(), store=store, agents=agents())
    async with serving(app) as url, a2a(url, await key_for(store, "ana", ["chat"]), "echo",
                                         streaming=False) as (client, _):
        task = await sent(client, user("hello"))
        ended = await store.runs.get(task.id)
        assert ended is not None
        assert ended.status == "completed"
        stale = dataclasses.replace(ended, status="working", finish_reason=None, ended_at=None)
        read = await task_of(app.state.ringlet.runner.runs, stale)
    assert read.status.state == TaskState.TASK_STATE_COMPLETED
    assert [get_message_text(m) for m in read.history] == ["hello"]
    assert [get_artifact_text(a) for a in read.artifacts] == ["echo hello (1)"]
    assert get_message_text(read.status.message) == "echo hello (1)"


async def test_cancel_stops_the_run_and_the_stream_ends_canceled(server: tuple[str, Store]) -> None:
    url, store = server
    async with a2a(url, await key_for(store, "ana", ["chat"]), "waiter") as (client, _):
        stream = asyncio.create_task(streamed(client, user("wait")))
        await started["waiter"].wait()  # the run is inside its tool call
        [working] = await store.runs.working()
        task_id = working.id
        cancelled = await client.cancel_task(CancelTaskRequest(id=task_id))
        assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
        events = await stream
        assert events[-1].status_update.status.state == TaskState.TASK_STATE_CANCELED
        run = await store.runs.get(task_id)
        assert run is not None
        assert (run.status, run.finish_reason) == ("canceled", "cancelled")
        assert (await client.get_task(GetTaskRequest(id=task_id))).status.state == TaskState.TASK_STATE_CANCELED
        with pytest.raises(A2AError):
            await client.cancel_task(CancelTaskRequest(id=task_id))


async def test_a_stream_holds_a_place_among_the_keys_open_streams(store: Store) -> None:
    started["waiter"] = asyncio.Event()
    app = create_app(ServerSettings(ping_interval_s=0.2, max_streams_per_key=1), store=store, agents=agents())
    async with serving(app) as url:
        ana = await key_for(store, "ana", ["chat"])
        async with a2a(url, ana, "waiter") as (client, _):
            stream = asyncio.create_task(streamed(client, user("wait")))
            await started["waiter"].wait()  # the first stream is open
            with pytest.raises(A2AError, match=r"429|max_streams_per_key|open event streams"):
                await streamed(client, user("again"))
            assert len(await store.runs.working()) == 1  # refused before a run started
            [working] = await store.runs.working()
            await client.cancel_task(CancelTaskRequest(id=working.id))
            await stream
        async with a2a(url, ana, "echo") as (echo, _):
            done = await streamed(echo, user("hi"))  # the first stream's place was given back when it ended
        assert done[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED


async def test_a_question_is_input_required_and_the_next_message_answers_it(server: tuple[str, Store]) -> None:
    url, store = server
    async with a2a(url, await key_for(store, "ana", ["chat"]), "painter", streaming=False) as (client, _):
        task = await sent(client, user("paint"))
        [question] = asked(task)
        assert (question["kind"], question["question"], question["input_type"]) == \
            ("question", "Which colours?", "multi-select")
        assert [o["label"] for o in question["options"]] == ["red", "green", "blue"]
        assert "Which colours?" in get_message_text(task.status.message)
        assert asked(await client.get_task(GetTaskRequest(id=task.id)))[0]["question_id"] == question["question_id"]
        wrong = await sent(client, user(task=task, data={"answer": ["red", "pink"]}))
        assert wrong.id == task.id
        assert asked(wrong)[0]["question_id"] == question["question_id"]  # asked again, saying why
        assert "options: red, green, blue" in get_message_text(wrong.status.message)
        done = await sent(client, user(task=task, data={"answer": ["red", "blue"]}))
        assert done.status.state == TaskState.TASK_STATE_COMPLETED
        said = json.loads(get_artifact_text(done.artifacts[0]).removeprefix("you said "))
        assert (said["answer"], said["answered_by"]) == (["red", "blue"], "ana")
        with pytest.raises(A2AError):  # the task has ended: nothing more to answer
            await sent(client, user("more", task=task))


async def test_an_approval_needs_the_approve_scope_and_the_stream_goes_on(server: tuple[str, Store]) -> None:
    url, store = server
    viewer, ana = await key_for(store, "viewer", ["chat"]), await key_for(store, "ana", ["chat", "approve"])
    async with a2a(url, viewer, "ops") as (client, _):
        first = await streamed(client, user("web"))
        assert first[0].HasField("task")
        paused = first[-1].status_update
        assert paused.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
        [approval] = get_data_parts(list(paused.status.message.parts))
        assert (approval["kind"], approval["tool"], approval["args"]) == ("approval", "deploy", {"service": "web"})
        task = Task(id=paused.task_id, context_id=paused.context_id)
        refused = await streamed(client, user(task=task, data={"approved": True}))
        [refused_task] = [e.task for e in refused]  # asked again: an answer's stream opens with the task too
        refused_state = refused_task.status
        assert refused_state.state == TaskState.TASK_STATE_INPUT_REQUIRED
        assert "approve" in get_message_text(refused_state.message)
    async with a2a(url, ana, "ops") as (client, _):
        rest = await streamed(client, user("yes", task=task))
    assert rest[0].HasField("task")
    assert rest[0].task.id == task.id
    assert rest[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert get_message_text(rest[-1].status_update.status.message) == "deployed web"
    [record] = await store.approvals.list(run_id=task.id)
    assert (record.status, record.decided_by) == ("approved", "ana")


async def test_the_endpoint_with_a_trailing_slash_is_answered_not_redirected(server: tuple[str, Store]) -> None:
    """Clients do not follow a 307 on POST: `/a2a/{agent}/` is the endpoint too."""
    url, store = server
    key = await key_for(store, "ana", ["chat"])
    call = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {
        "messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "slash"}]}}}
    async with httpx.AsyncClient(base_url=url, follow_redirects=False, timeout=30, headers={
            "Authorization": f"Bearer {key}", "A2A-Version": "1.0"}) as http:
        for path in ("/a2a/echo", "/a2a/echo/"):
            response = await http.post(path, json=call)
            assert response.status_code == 200, (path, response.status_code, response.text)
            task = response.json()["result"]["task"]
            assert task["status"]["state"] == "TASK_STATE_COMPLETED"
            assert task["artifacts"][0]["parts"][0]["text"].startswith("echo slash")
    async with httpx.AsyncClient(base_url=url) as anonymous:
        assert (await anonymous.post("/a2a/echo/", json=call)).status_code == 401


# -- a remote A2A agent as a sub-agent ----------------------------------------------------------------------


def spawning(reference: str) -> Any:
    def reply(request: Any) -> Any:
        results = [m for m in request.messages if m.role == "tool"]
        if results:
            return f"boss got: {results[-1].content}"
        return call("spawn_agent", {"task": "greet the boss", "agent": reference}, id="s1")

    return reply


def boss(reference: str) -> Agent:
    return Agent(FunctionModel(spawning(reference)), name="boss", tools=[SubAgents(allowed=(reference,))])


@pytest.mark.slow
async def test_a_remote_ringlet_is_a_sub_agent_through_its_card(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    def helper(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"role": "assistant", "content": f"hello from helper ({messages[-1]['content']})"}]

    db = tmp_path / "remote.db"
    remote_store = await Store.open(f"sqlite+aiosqlite:///{db}")
    key, _ = await remote_store.keys.create("boss", scopes=["chat"], user_id="boss")
    await remote_store.close()
    port = free_port()
    async with serving(openai_model(helper)) as model_url:
        agents_dir = tmp_path / "agents"
        (agents_dir / "helper").mkdir(parents=True)
        (agents_dir / "helper" / "config.yaml").write_text(
            f"model: openai:m\nmodel_options: {{base_url: '{model_url}/v1', api_key: x}}\n"
            "description: Greets people.\n")
        card = f"http://127.0.0.1:{port}/a2a/helper/.well-known/agent-card.json"
        async with ringlet_serve(port, db, agents_dir, RINGLET_AUTH_MODE="key"):
            monkeypatch.setenv("HELPER_KEY", key)
            result = await boss(f"a2a:{card}#token_env=HELPER_KEY").run("go")
            assert result.output == "boss got: hello from helper (greet the boss)"
            [spawned] = [m for m in result.messages if m.role == "tool"]
            assert spawned.content == "hello from helper (greet the boss)"
            monkeypatch.setenv("HELPER_KEY", "rk_wrong")
            refused = await boss(f"a2a:{card}#token_env=HELPER_KEY").run("go")
            assert "401" in refused.output
            assert "sub_agent_failed" in refused.output
    gone = await boss(f"a2a:http://127.0.0.1:{free_port()}/a2a/helper/.well-known/agent-card.json").run("go")
    assert "cannot read the agent card" in gone.output
    assert "sub_agent_failed" in gone.output
