"""The AI SDK's chat stream through the real client: the `ai` package's `AbstractChat` (what `useChat` wraps)
and `DefaultChatTransport` (npm, installed by the Makefile into .venv/node) run each scenario against a ringlet
server on loopback. The transport validates every chunk with the package's own schema, and its stream
processor builds the assistant message (it throws on a chunk out of order, e.g. a delta of a text part never
started or an approval for an unknown tool call). The driver is tests/js/aisdk.mjs; it prints one JSON
summary per scenario, asserted on here."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ringlet import Agent, Gates
from ringlet.gates import ApprovalRules
from ringlet.server import ServerSettings, create_app
from ringlet.server.catalog import Catalog
from ringlet.store import Store
from ringlet.testing import FunctionModel
from ringlet.tools.builtin.question import ask_question_tool
from serving import serving
from test_agui import add, adding, asking, broken, deploy, deployed, deploying
from test_conformance_agui import wait_forever, waiting

ROOT = Path(__file__).resolve().parent.parent
DRIVER = ROOT / "tests" / "js" / "aisdk.mjs"
NODE_MODULES = Path(os.environ.get("RINGLET_NODE_MODULES", ROOT / ".venv" / "node" / "node_modules"))


@pytest.fixture
async def server(store: Store) -> AsyncIterator[tuple[str, str, Store]]:
    """A server hosting loop agents, and a key with the chat and approve scopes."""
    assert shutil.which("node"), "node is needed for the conformance tests"
    assert (NODE_MODULES / "ai").is_dir(), "run `make` (it installs the `ai` package into .venv/node)"
    deployed.clear()
    approvals = Gates(approvals=ApprovalRules({"deploy": {"mode": "confirm", "timeout_s": 60}}))
    agents = [Agent(FunctionModel(lambda request: "Hello from ringlet"), name="talker"),
              Agent(FunctionModel(adding), name="adder", tools=[add]),
              Agent(FunctionModel(deploying), name="ops", tools=[deploy], gates=approvals),
              Agent(FunctionModel(asking), name="painter", tools=[ask_question_tool()]),
              Agent(FunctionModel(broken), name="broken"),
              Agent(FunctionModel(waiting), name="waiter", tools=[wait_forever])]
    key, _ = await store.keys.create("ana", scopes=["chat", "approve"], user_id="ana")
    app = create_app(ServerSettings(ping_interval_s=0.2), store=store, agents=Catalog.of(agents))
    async with serving(app) as url:
        yield url, key, store


async def drive(server: tuple[str, str, Store], scenario: str) -> dict[str, Any]:
    """Run the driver's scenario (a node process; the server runs in this event loop, so it is awaited, never
    blocked on) and return its summary; the client library said nothing on the console."""
    url, key, _ = server
    process = await asyncio.create_subprocess_exec(
        "node", str(DRIVER), json.dumps({"url": url, "key": key, "scenario": scenario}),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "RINGLET_NODE_MODULES": str(NODE_MODULES)})
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout=240)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode == 0, err.decode()
    summary = json.loads(out.decode().strip().splitlines()[-1])
    assert summary["console"] == [], summary["console"]
    return summary


def whole(summary: dict[str, Any]) -> dict[str, Any]:
    """Every response a v1 UI message stream, and no error the client saw."""
    assert {(r["status"], r["stream"]) for r in summary["responses"]} == {(200, "v1")}, summary["responses"]
    assert summary["error"] is None, summary
    for turn in summary["turns"]:
        assert (turn["types"][0], turn["types"][-1]) == ("start", "finish"), turn["types"]
        assert (turn["isError"], turn["isAbort"]) == (False, False), turn
    return summary


async def test_a_loop_agents_text_and_usage(server: tuple[str, str, Store]) -> None:
    summary = whole(await drive(server, "text"))
    first, _second = summary["turns"]
    assert first["types"] == ["start", "start-step", "text-start", "text-delta", "text-end", "finish-step",
                              "finish"]
    assert (first["finishReason"], summary["text"]) == ("stop", "Hello from ringlet")
    assert summary["roles"] == ["user", "assistant", "user", "assistant"]
    ringlet = summary["metadata"]["ringlet"]
    assert ringlet["run_id"].startswith("r_")
    assert ringlet["finish_reason"] == "end_turn"
    usage = summary["metadata"]["usage"]
    assert usage["totalTokens"] == usage["inputTokens"] + usage["outputTokens"] > 0
    _, _, store = server
    conversation = await store.conversations.get(ringlet["conversation_id"])
    assert conversation is not None
    assert conversation.client_id == "s-text"
    stored = await store.conversations.load_messages(conversation.id)
    assert [m.role for m in stored] == ["user", "assistant", "user", "assistant"]  # the chat is one conversation


async def test_parallel_tool_calls(server: tuple[str, str, Store]) -> None:
    summary = whole(await drive(server, "tools"))
    [turn] = summary["turns"]
    assert turn["types"].count("tool-input-start") == turn["types"].count("tool-input-available") == 2
    assert turn["types"].count("tool-output-available") == 2
    assert turn["types"].count("start-step") == turn["types"].count("finish-step") == 2
    tools = {t["toolCallId"]: t for t in summary["tools"]}
    assert {k: (t["type"], t["state"], t["input"], t["output"]) for k, t in tools.items()} == {
        "c_one": ("tool-add", "output-available", {"a": 1, "b": 2}, "3"),
        "c_two": ("tool-add", "output-available", {"a": 3, "b": 4}, "7")}
    assert (summary["text"], summary["steps"], turn["finishReason"]) == ("sums: 3, 7", 2, "stop")


async def test_an_approval_answered_inline(server: tuple[str, str, Store]) -> None:
    summary = whole(await drive(server, "approval"))
    asked, answered = summary["turns"]
    assert asked["types"][-3:] == ["tool-approval-request", "finish-step", "finish"]
    assert asked["finishReason"] == "tool-calls"
    [waiting] = summary["asked"]["tools"]
    assert (waiting["toolCallId"], waiting["state"], waiting["input"]) == ("c_deploy", "approval-requested",
                                                                          {"service": "web"})
    assert waiting["approval"]["id"].startswith("ap_")
    assert deployed == ["web"]
    [tool] = summary["tools"]  # the same message goes on: the call's output, then the answer
    assert (tool["state"], tool["output"], tool["approval"]["approved"]) == ("output-available", "deployed web", True)
    assert summary["roles"] == ["user", "assistant"]
    assert (summary["text"], answered["finishReason"]) == ("deployed web", "stop")
    _, _, store = server
    [record] = await store.approvals.list(run_id=summary["metadata"]["ringlet"]["run_id"])
    assert (record.status, record.decided_by, record.note) == ("approved", "ana", "go")


async def test_an_approval_denied_inline(server: tuple[str, str, Store]) -> None:
    summary = whole(await drive(server, "denial"))
    [tool] = summary["tools"]
    assert (tool["state"], tool["approval"]["approved"]) == ("output-denied", False)
    assert "tool-output-denied" in summary["turns"][1]["types"]
    assert deployed == []


async def test_a_question_answered_through_the_approval_parts(server: tuple[str, str, Store]) -> None:
    summary = whole(await drive(server, "question"))
    [waiting] = summary["asked"]["tools"]
    assert (waiting["type"], waiting["state"]) == ("tool-ask_question", "approval-requested")
    assert waiting["approval"]["id"].startswith("q_")
    assert summary["text"] == "you said blue"


async def test_an_error(server: tuple[str, str, Store]) -> None:
    summary = await drive(server, "error")
    [turn] = summary["turns"]
    assert turn["isError"]
    assert summary["status"] == "error"
    assert "error" in turn["types"]
    assert summary["error"].startswith("provider_error: ")
    assert "upstream exploded" in summary["error"]


async def test_stop_cancels_the_run(server: tuple[str, str, Store]) -> None:
    summary = await drive(server, "cancel")
    [turn] = summary["turns"]
    assert turn["isAbort"]
    assert summary["error"] is None
    assert summary["status"] == "ready"
    assert summary["run"]["status"] == "canceled"
    [tool] = summary["tools"]
    assert (tool["toolCallId"], tool["state"]) == ("w1", "input-available")


async def test_the_docs_script_runs_as_written(store: Store, tmp_path: Path) -> None:
    """docs/how-to/ai-sdk.md's script, as written (only the address and key are this server's), run by node
    with the `ai` package as its import."""
    page = (ROOT / "docs" / "how-to" / "ai-sdk.md").read_text()
    [script] = [b for b in page.split("```js\n")[1:] if "readUIMessageStream({ stream })" in b]
    answers = FunctionModel(lambda request: "391" if "17 * 23" in request.messages[-1].text else "?")
    key, _ = await store.keys.create("docs", scopes=["chat"])
    (tmp_path / "node_modules").symlink_to(NODE_MODULES, target_is_directory=True)
    app = create_app(ServerSettings(), store=store, agents=[Agent(answers, name="assistant")])
    async with serving(app) as url:
        code = script.split("```", 1)[0].replace("http://localhost:8000", url).replace("rk_…", key)
        (tmp_path / "example.mjs").write_text(code)
        process = await asyncio.create_subprocess_exec("node", str(tmp_path / "example.mjs"),
                                                       stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode == 0, err.decode()
    answer, usage = out.decode().split("\n", 1)
    assert answer == "391"
    assert "totalTokens" in usage
