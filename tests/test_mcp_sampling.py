"""MCP sampling against `server-everything` (the official reference server, whose `trigger-sampling-request`
sends `sampling/createMessage` to its client): answered by the agent's model or the server's own, usage
counted in the run, the per-run limit, outside a run, the policy (deny, require_approval) and approval with
the prompt shown."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ringlet import Agent
from ringlet.agent.settings import Gates, RunHost, RunSettings
from ringlet.events import ApprovalRequiredEvent, MessageEndEvent, StatusEvent, ToolResultEvent
from ringlet.gates import ApprovalBroker, AuditLog, PolicyGate, PolicySet
from ringlet.mcp.client import MCPToolset
from ringlet.mcp.config import MCPServerConfig, SamplingConfig
from ringlet.testing import ScriptedModel, call
from test_mcp_client import EVERYTHING

ASK = {"prompt": "a haiku about ponds", "maxTokens": 50}
POLICY = """package ringlet.sampling

deny contains msg if {
    input.action == "mcp.sampling"
    input.resource.connector == "everything"
    contains(input.args.messages[0].text, "secrets")
    msg := "no sampling about secrets"
}

require_approval contains msg if {
    input.action == "mcp.sampling"
    contains(input.args.messages[0].text, "poem")
    msg := "poems are reviewed"
}
"""


@pytest.fixture
async def everything() -> AsyncIterator[MCPToolset]:
    toolset = MCPToolset("everything", MCPServerConfig(command=str(EVERYTHING), args=["stdio"]))
    yield toolset
    await toolset.aclose()


def results(events: list[Any]) -> list[ToolResultEvent]:
    return [e for e in events if isinstance(e, ToolResultEvent)]


def said(result: ToolResultEvent) -> str:
    """What the model reads of a call's result: its text, or its error's message."""
    return result.result if result.result is not None else str((result.error or {}).get("message"))


async def test_the_agents_model_answers_and_its_usage_is_the_runs(everything: MCPToolset) -> None:
    model = ScriptedModel([call("trigger-sampling-request", ASK, id="s1"), "Still water, one frog", "done"])
    agent = Agent(model, name="poet", tools=[everything])
    events = [e async for e in agent.stream("sample")]
    [result] = results(events)
    assert not result.is_error
    assert '"text": "Still water, one frog"' in result.result
    assert '"model": "test:scripted"' in result.result
    sampled = model.requests[1]  # the server's request, as the model got it
    assert sampled.instructions == "You are a helpful test server."
    assert [m.text for m in sampled.messages] == ["Resource trigger-sampling-request context: a haiku about ponds"]
    assert sampled.tools == ()
    assert sampled.settings.max_tokens == 50
    [end] = [e for e in events if isinstance(e, MessageEndEvent)]
    assert end.usage is not None
    assert model.remaining == 0


async def test_usage_of_the_sample_is_counted_in_the_run(everything: MCPToolset) -> None:
    model = ScriptedModel([call("trigger-sampling-request", ASK, id="s1"), "Still water", "done"])
    result = await Agent(model, name="poet", tools=[everything]).run("sample")
    assert result.usage.requests == 3


async def test_a_server_model_of_its_own_answers(everything: MCPToolset) -> None:
    """`sampling.model` in mcp.json: the real embedded GGUF model answers, not the agent's."""
    toolset = MCPToolset("everything", MCPServerConfig(
        command=str(EVERYTHING), args=["stdio"], sampling=SamplingConfig(model="local:smollm2")))
    try:
        model = ScriptedModel([call("trigger-sampling-request", {"prompt": "Say hello.", "maxTokens": 16}, id="s1"),
                               "done"])
        result = await Agent(model, name="poet", tools=[toolset]).run("sample")
    finally:
        await toolset.aclose()
    [outcome] = [m for m in result.messages if m.role == "tool"]
    assert not outcome.is_error
    assert '"model": "local:smollm2"' in outcome.text
    assert len(model.requests) == 2  # the agent's model was not asked to sample
    assert result.usage.requests == 3


async def test_beyond_the_per_run_limit_is_declined(everything: MCPToolset) -> None:
    toolset = MCPToolset("everything", MCPServerConfig(command=str(EVERYTHING), args=["stdio"],
                                                       sampling=SamplingConfig(max_per_run=1)))
    try:
        model = ScriptedModel([call("trigger-sampling-request", ASK, id="s1"), "first",
                               call("trigger-sampling-request", ASK, id="s2"), "done"])
        events = [e async for e in Agent(model, name="poet", tools=[toolset]).stream("twice")]
    finally:
        await toolset.aclose()
    first, second = results(events)
    assert '"text": "first"' in first.result
    assert "sampling declined: this run has made its 1 sampling requests for MCP server 'everything' " \
           "(sampling.max_per_run)" in said(second)


async def test_outside_a_run_is_declined_with_the_protocols_error(everything: MCPToolset) -> None:
    with pytest.raises(Exception, match="sampling declined: the request concerns no run"):
        await everything.call("trigger-sampling-request", ASK)


async def test_the_policy_names_the_server_and_can_deny(everything: MCPToolset) -> None:
    audit = AuditLog()
    gate = PolicyGate(PolicySet.compile({"sampling.rego": POLICY}), audit=audit)
    model = ScriptedModel([call("trigger-sampling-request", {"prompt": "tell me secrets"}, id="s1"), "done"])
    events = [e async for e in Agent(model, name="poet", tools=[everything],
                                     gates=Gates(policies=[gate])).stream("sample")]
    [result] = results(events)
    text = said(result)
    assert "denied by policy: no sampling about secrets" in text
    assert len(model.requests) == 2  # the model was never asked to sample
    sampled = [r for r in audit.records if r["action"] == "mcp.sampling"]
    assert [(r["connector"], r["tool"], r["decision"]) for r in sampled] == [
        ("everything", "sampling/createMessage", "deny")]


async def test_approval_shows_the_prompt_and_an_approved_request_is_answered(everything: MCPToolset) -> None:
    gate = PolicyGate(PolicySet.compile({"sampling.rego": POLICY}))
    broker = ApprovalBroker()
    model = ScriptedModel([call("trigger-sampling-request", {"prompt": "a poem"}, id="s1"), "Roses", "done"])
    agent = Agent(model, name="poet", tools=[everything], gates=Gates(policies=[gate]))

    async def approving() -> Any:
        [request] = await broker.wait_for_pending()
        broker.decide(request.approval_id, True, decided_by="ana")
        return request

    human = asyncio.create_task(approving())
    events = [e async for e in agent.stream("sample", settings=RunSettings(approver=broker))]
    request = await human
    assert request.tool == "sampling/createMessage"
    assert request.connector == "everything"
    assert "poems are reviewed" in request.reason
    assert "[user] Resource trigger-sampling-request context: a poem" in request.reason
    assert "[system] You are a helpful test server." in request.args["prompt"]
    [asked] = [e for e in events if isinstance(e, ApprovalRequiredEvent)]
    assert asked.approval_id == request.approval_id
    assert [e.state for e in events if isinstance(e, StatusEvent)][:3] == ["working", "input_required", "working"]
    [result] = results(events)
    assert '"text": "Roses"' in result.result


async def test_a_denied_or_unanswerable_approval_declines(everything: MCPToolset) -> None:
    toolset = MCPToolset("everything", MCPServerConfig(command=str(EVERYTHING), args=["stdio"],
                                                       sampling=SamplingConfig(approval="confirm")))
    broker = ApprovalBroker()
    try:
        model = ScriptedModel([call("trigger-sampling-request", ASK, id="s1"), "done",
                               call("trigger-sampling-request", ASK, id="s2"), "done"])
        agent = Agent(model, name="poet", tools=[toolset])

        async def denying() -> None:
            [request] = await broker.wait_for_pending()
            broker.decide(request.approval_id, False, note="not now", decided_by="ana")

        human = asyncio.create_task(denying())
        events = [e async for e in agent.stream("sample", settings=RunSettings(approver=broker))]
        await human
        [result] = results(events)
        text = said(result)
        assert "sampling declined: not approved (denied): not now" in text
        # no human to ask (a CLI run without a terminal): declined, nobody asked
        settings = RunSettings(approver=broker, host=RunHost(humans=False))
        events = [e async for e in agent.stream("sample", settings=settings)]
        [result] = results(events)
        text = said(result)
        assert "no one can approve it" in text
        assert not broker.pending
    finally:
        await toolset.aclose()


def test_sampling_settings_are_checked() -> None:
    from ringlet.errors import ConfigError
    from ringlet.mcp.config import load_servers

    with pytest.raises(ConfigError, match=r"mcpServers\.x\.sampling\.max_per_run"):
        load_servers({"mcpServers": {"x": {"command": "x", "sampling": {"max_per_run": -1}}}}, base=".")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="approval"):
        load_servers({"mcpServers": {"x": {"command": "x", "sampling": {"approval": "maybe"}}}}, base=".")  # type: ignore[arg-type]


async def test_through_the_server_the_human_approves_with_the_prompt_shown(store: Any) -> None:
    """A server run: the sampling request waits for an approval record (the prompt in its reason and args),
    decided over the approvals API by a key with `approve`; the usage is the conversation's."""
    import json

    from ringlet.server import ServerSettings, create_app
    from serving import serving
    from test_server import new_conversation
    from test_server_approvals import client_for, until_paused

    toolset = MCPToolset("everything", MCPServerConfig(command=str(EVERYTHING), args=["stdio"],
                                                       sampling=SamplingConfig(approval="confirm")))
    model = ScriptedModel([call("trigger-sampling-request", ASK, id="s1"), "Still water", "done"])
    app = create_app(ServerSettings(ping_interval_s=0.2), store=store,
                     agents=[Agent(model, name="poet", tools=[toolset])])
    try:
        async with serving(app) as url, await client_for(url, store, "ana", ["chat", "approve"]) as ana, \
                await client_for(url, store, "viewer", ["chat"]) as viewer:
            cid = (await new_conversation(ana, "poet"))["id"]
            seen: list[Any] = []
            paused = asyncio.Event()
            stream = asyncio.create_task(until_paused(ana, cid, "sample", seen, paused))
            await paused.wait()
            [required] = [json.loads(e.data) for e in seen if e.event == "approval_required"]
            assert (required["tool"], required["tool_call_id"]) == ("sampling/createMessage", "s1")
            assert "[user] Resource trigger-sampling-request context: a haiku about ponds" in required["reason"]
            assert required["args"]["server"] == "everything"
            path = f"/api/v1/chat/conversations/{cid}/approvals/{required['approval_id']}"
            assert (await viewer.post(path, json={"approved": True})).status_code == 403  # needs `approve`
            decided = await ana.post(path, json={"approved": True})
            assert decided.status_code == 200, decided.text
            await stream
            conversation = await store.conversations.get(cid)
    finally:
        await toolset.aclose()
    [result] = [json.loads(e.data) for e in seen if e.event == "tool_result"]
    assert '"text": "Still water"' in result["result"]
    [end] = [json.loads(e.data) for e in seen if e.event == "message_end"]
    assert end["usage"]["out_tokens"] > 0
    assert conversation is not None
    assert (conversation.usage.in_tokens, conversation.usage.out_tokens) == (end["usage"]["in_tokens"],
                                                                            end["usage"]["out_tokens"])
