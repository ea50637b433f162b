"""`/v1` and humans (issue 42, server-contract.md §7): a run that needs an approval or asks a question ends
the response at once with an assistant message saying what is asked and where, and in a conversation the
next user message answers it; a stateless request says where to approve; an agent may deny instead. Driven
by the official `openai` client over real HTTP, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from ringlet import Agent, Gates, tool
from ringlet.gates import ApprovalRules
from ringlet.server import ServerSettings, create_app
from ringlet.store import Store
from ringlet.testing import FunctionModel, call
from ringlet.tools.builtin.selection import BUILTIN_TOOLS
from serving import serving

deployed: list[str] = []
landed = threading.Event()
"""Set when `deploy` has run (a test waits for it, from any thread)."""


@tool(effect="write")
def deploy(service: str) -> str:
    """Deploy a service."""
    deployed.append(service)
    landed.set()
    return f"deployed {service}"


def deploying(request: Any) -> Any:
    """Deploys the service the last user message names; then says what the tool said."""
    if request.messages[-1].role == "tool":
        return f"Result: {request.messages[-1].text}"
    return call("deploy", service=request.messages[-1].text)


def asking(request: Any) -> Any:
    if request.messages[-1].role == "tool":
        return f"Noted: {request.messages[-1].text}"
    return call("ask_question", question="Which colour?", input_type="text")


@pytest.fixture
async def served(store: Store) -> AsyncIterator[tuple[str, str, Store]]:
    deployed.clear()
    landed.clear()
    confirm = Gates(approvals=ApprovalRules({"deploy": {"mode": "confirm", "timeout_s": 60}}))
    hasty = Gates(approvals=ApprovalRules({"deploy": {"mode": "confirm", "timeout_s": 0.5}}))
    agents = [Agent(FunctionModel(deploying, name="openai:gpt-4o-mini"), name="ops", tools=[deploy], gates=confirm),
              Agent(FunctionModel(deploying), name="hasty", tools=[deploy], gates=hasty),
              Agent(FunctionModel(asking), name="curious", tools=[BUILTIN_TOOLS["ask_question"]])]
    async with serving(create_app(ServerSettings(), store=store, agents=agents)) as url:
        key, _ = await store.keys.create("k", scopes=["chat", "approve"], user_id="kim")
        yield url, key, store


def clients(url: str, key: str) -> tuple[openai.AsyncOpenAI, httpx.AsyncClient]:
    return (openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=30),
            httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30))


async def streamed(client: openai.AsyncOpenAI, model: str, text: str, cid: str) -> tuple[str, Any]:
    stream = await client.chat.completions.create(model=model, stream=True, messages=[{"role": "user",
                                                                                       "content": text}],
                                                  extra_headers={"X-Ringlet-Conversation-Id": cid})
    chunks = [c async for c in stream]
    last = [c for c in chunks if c.choices][-1]
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), last


async def test_an_approval_ends_the_response_and_the_next_message_answers_it(
        served: tuple[str, str, Store]) -> None:
    url, key, store = served
    client, raw = clients(url, key)
    async with raw:
        cid = (await raw.post("/api/v1/chat/conversations", json={"agent": "ops"})).json()["id"]
        headers = {"X-Ringlet-Conversation-Id": cid}
        async with asyncio.timeout(10):  # at once, not after the approval's 60 s
            asked = await client.chat.completions.with_raw_response.create(
                model="ops", messages=[{"role": "user", "content": "api"}], extra_headers=headers)
        assert asked.headers["x-ringlet-conversation-id"] == cid
        completion = asked.parse()
        choice, extra = completion.choices[0], completion.model_extra or {}
        assert choice.finish_reason == "stop"
        assert extra["ringlet"]["finish_reason"] == "input_required"
        run = await store.runs.get(extra["ringlet"]["run_id"])  # what it has used so far, as any answer says it
        assert run is not None
        assert completion.usage is not None
        assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == \
            (run.usage.in_tokens, run.usage.out_tokens)
        assert run.usage.in_tokens > 0
        assert extra["ringlet"]["cost_usd"] == run.usage.cost_usd > 0  # the model is priced: its cost, not null
        [pending] = extra["ringlet"]["pending"]
        assert (pending["kind"], pending["tool"], pending["args"]) == ("approval", "deploy", {"service": "api"})
        text = choice.message.content or ""
        assert 'Approval needed: deploy({"service": "api"})' in text
        assert pending["approval_id"] in text
        assert f"{url}/api/v1/chat/conversations/{cid}/approvals" in text
        assert "Reply yes or no in this conversation" in text
        assert deployed == []

        again, last = await streamed(client, "ops", "maybe later", cid)  # not an answer: asked again
        assert again.startswith("The answer was not taken: reply yes or no")
        assert 'Approval needed: deploy({"service": "api"})' in again
        assert last.choices[0].finish_reason == "stop"
        assert deployed == []

        async with asyncio.timeout(10):  # the answer resumes the run; its continuation is this response
            answer, last = await streamed(client, "ops", "Yes", cid)
        assert answer == "Result: deployed api"
        assert last.choices[0].finish_reason == "stop"
        assert (last.model_extra or {})["ringlet"]["finish_reason"] == "end_turn"
        assert deployed == ["api"]
        record = (await raw.get(f"/api/v1/chat/conversations/{cid}/approvals")).json()["data"][0]
        assert (record["status"], record["decided_by"]) == ("approved", "kim")

        await client.chat.completions.create(model="ops", messages=[{"role": "user", "content": "db"}],
                                             extra_headers=headers)
        refused = await client.chat.completions.create(model="ops", messages=[{"role": "user", "content": "deny"}],
                                                       extra_headers=headers)
        assert "approval_denied" in (refused.choices[0].message.content or "")
        assert "denied by kim" in (refused.choices[0].message.content or "")
        assert deployed == ["api"]


async def test_a_question_is_answered_by_the_next_message(served: tuple[str, str, Store]) -> None:
    url, key, _ = served
    client, raw = clients(url, key)
    async with raw:
        cid = (await raw.post("/api/v1/chat/conversations", json={"agent": "curious"})).json()["id"]
        async with asyncio.timeout(10):
            question, last = await streamed(client, "curious", "paint it", cid)
        assert "Question: Which colour?" in question
        assert "Reply with your answer to the question in this conversation" in question
        assert [p["kind"] for p in (last.model_extra or {})["ringlet"]["pending"]] == ["question"]
        answer = await client.chat.completions.create(model="curious", messages=[{"role": "user", "content": "blue"}],
                                                      extra_headers={"X-Ringlet-Conversation-Id": cid})
        text = answer.choices[0].message.content or ""
        assert text.startswith("Noted: ")
        assert json.loads(text.removeprefix("Noted: "))["answer"] == "blue"


async def test_a_stateless_request_says_where_to_approve(served: tuple[str, str, Store]) -> None:
    url, key, _ = served
    client, raw = clients(url, key)
    async with raw:
        async with asyncio.timeout(10):
            completion = await client.chat.completions.create(model="ops",
                                                              messages=[{"role": "user", "content": "web"}])
        text = completion.choices[0].message.content or ""
        [pending] = (completion.model_extra or {})["ringlet"]["pending"]
        assert completion.usage is not None
        assert completion.usage.prompt_tokens > 0  # a run without a conversation: its usage so far, in memory
        assert (completion.model_extra or {})["ringlet"]["cost_usd"] > 0
        assert f"{url}/api/v1/approvals/{pending['approval_id']}" in text
        assert "has no conversation" in text
        assert completion.choices[0].finish_reason == "stop"
        decided = await raw.post(f"/api/v1/approvals/{pending['approval_id']}", json={"approved": True})
        assert decided.status_code == 200, decided.text  # the run waited there, and goes on
        assert await asyncio.to_thread(landed.wait, 10)  # the call ran, once allowed
        assert deployed == ["web"]
        questioned = await client.chat.completions.create(model="curious",
                                                          messages=[{"role": "user", "content": "paint"}])
        text = questioned.choices[0].message.content or ""
        assert "Question: Which colour?" in text
        assert "nothing can answer the question: the run was stopped" in text


async def test_a_stateless_run_left_waiting_ends_when_its_approval_expires(served: tuple[str, str, Store]) -> None:
    """The response of a stateless request ends when its run waits for an approval, and the client goes; the
    run does not: it waits (in the process that runs it) for a decision through the approvals API, until the
    approval expires. Then it ends as any run whose approval timed out: the call is not run, the approval is
    `expired` (a late decision gets 409), the run `completed`. Nothing waits for ever: every approval has a
    timeout (`approval_timeout_s`, 300 s by default). A question, which may have none, is not waited for: such
    a run is stopped when its response ends (`test_a_stateless_request_says_where_to_approve`)."""
    url, key, store = served
    client, raw = clients(url, key)
    async with raw:
        async with asyncio.timeout(10):
            completion = await client.chat.completions.create(model="hasty",
                                                              messages=[{"role": "user", "content": "web"}])
        extra = (completion.model_extra or {})["ringlet"]
        [pending] = extra["pending"]
        assert (extra["finish_reason"], pending["kind"]) == ("input_required", "approval")
        async with asyncio.timeout(10):  # the approval's 0.5 s, and no more (the engine's run is found once
            while (got := await raw.get(f"/api/v1/runs/{extra['run_id']}")).status_code != 200 or \
                    got.json()["status"] != "completed":  # noqa: ASYNC110 (its hidden conversation gone with it)
                await asyncio.sleep(0.05)
        assert got.json()["finish_reason"] == "end_turn"
        record = await store.approvals.get(pending["approval_id"])
        assert record is not None
        assert (record.status, record.decided_by) == ("expired", "system:timeout")
        late = await raw.post(f"/api/v1/approvals/{pending['approval_id']}", json={"approved": True})
        assert (late.status_code, late.json()["error"]["code"]) == (409, "approval_expired")
        assert deployed == []


async def test_an_agent_can_deny_v1_approvals(store: Store, tmp_path: Path) -> None:
    """`v1_approvals: deny` in config.yaml: `/v1` runs get no human (a question: `no_human_available`)."""
    from ringlet.agent.config import build_agent, find

    (tmp_path / "shy").mkdir()
    (tmp_path / "shy" / "config.yaml").write_text("builtin_tools: [ask_question]\nv1_approvals: deny\n")
    agent = build_agent(find(str(tmp_path / "shy")), model=FunctionModel(asking))
    async with serving(create_app(ServerSettings(), store=store, agents=[agent])) as url:
        key, _ = await store.keys.create("k", scopes=["chat"])
        client, raw = clients(url, key)
        async with raw:
            cid = (await raw.post("/api/v1/chat/conversations", json={"agent": "shy"})).json()["id"]
            for headers in ({}, {"X-Ringlet-Conversation-Id": cid}):
                completion = await client.chat.completions.create(
                    model="shy", messages=[{"role": "user", "content": "paint"}], extra_headers=headers)
                assert "no_human_available" in (completion.choices[0].message.content or "")
                assert (completion.model_extra or {})["ringlet"]["finish_reason"] == "end_turn"
