"""AG-UI conformance through the real client: `@ag-ui/client`'s `HttpAgent` (npm, installed by the Makefile
into .venv/node) runs every scenario against a ringlet server on loopback, and its `runAgent` applies the
package's schema and event verifier (`verifyEvents`: RUN_STARTED first, nothing after the run's end, no
RUN_FINISHED while a step, text message or tool call is open, …) to every event. The driver is
tests/js/agui.mjs; it prints one JSON summary per scenario, asserted on here."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ringlet import Agent, Gates, tool
from ringlet.gates import ApprovalRules
from ringlet.server import ServerSettings, create_app
from ringlet.server.catalog import Catalog, HostedGraph
from ringlet.store import Store
from ringlet.testing import FunctionModel, call
from ringlet.tools.builtin.question import ask_question_tool
from serving import serving
from test_agui import COUNTER, COUNTER_FILES, GATE, GATE_FILES, add, adding, asking, broken, deploy, deploying, styling
from test_graph_support import make_graph

ROOT = Path(__file__).resolve().parent.parent
DRIVER = ROOT / "tests" / "js" / "agui.mjs"
NODE_MODULES = ROOT / ".venv" / "node" / "node_modules"
FAILING = """
name: failing
start: prepare
nodes:
  prepare: {type: script, script: prepare.py, next: boom}
  boom: {type: script, script: boom.py, next: done}
  done: {type: end, output: "never"}
"""
FAILING_FILES = {"prepare.py": "import json\nprint(json.dumps({'ready': True}))\n",
                 "boom.py": "import sys\nsys.exit('the script failed')\n"}


@tool
async def wait_forever() -> str:
    """Waits until cancelled."""
    await asyncio.Event().wait()
    return "never"


def waiting(request: Any) -> Any:
    return "stopped" if any(m.role == "tool" for m in request.messages) else call("wait_forever", id="w1")


@pytest.fixture
async def server(store: Store, tmp_path: Path) -> AsyncIterator[tuple[str, str]]:
    """A server hosting loop and graph agents, and a key with the chat and approve scopes."""
    assert shutil.which("node"), "node is needed for the conformance tests"
    assert (NODE_MODULES / "@ag-ui" / "client").is_dir(), "run `make` (it installs @ag-ui/client into .venv/node)"
    approvals = Gates(approvals=ApprovalRules({"deploy": {"mode": "confirm", "timeout_s": 60}}))
    agents = [Agent(FunctionModel(lambda request: "Hello from ringlet"), name="talker"),
              Agent(FunctionModel(adding), name="adder", tools=[add]),
              Agent(FunctionModel(deploying), name="ops", tools=[deploy], gates=approvals),
              Agent(FunctionModel(asking), name="painter", tools=[ask_question_tool()]),
              Agent(FunctionModel(broken), name="broken"),
              Agent(FunctionModel(styling), name="stylist", tools=[add]),
              Agent(FunctionModel(waiting), name="waiter", tools=[wait_forever])]
    root = tmp_path / "agents"
    graphs = [make_graph(root, COUNTER, name="counter", files=COUNTER_FILES),
              make_graph(root, GATE, name="gate", files=GATE_FILES),
              make_graph(root, FAILING, name="failing", files=FAILING_FILES)]
    catalog = Catalog([*(HostedGraph.at(g) for g in graphs), *Catalog.of(agents).hosted.values()])
    key, _ = await store.keys.create("ana", scopes=["chat", "approve"], user_id="ana")
    async with serving(create_app(ServerSettings(ping_interval_s=0.2), store=store, agents=catalog)) as url:
        yield url, key


async def drive(server: tuple[str, str], scenario: str, **extra: Any) -> dict[str, Any]:
    """Run the driver's scenario (a node process; the server runs in this event loop, so it is awaited, never
    blocked on) and return its summary; the client library said nothing on the console."""
    url, key = server
    process = await asyncio.create_subprocess_exec(
        "node", str(DRIVER), json.dumps({"url": url, "key": key, "scenario": scenario, **extra}),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
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


def verified(run: dict[str, Any]) -> dict[str, Any]:
    """A run the client took whole: no verifier or schema error, RUN_STARTED first, its end last."""
    assert run["error"] is None, run
    assert run["types"][0] == "RUN_STARTED", run["types"]
    assert run["types"][-1] in ("RUN_FINISHED", "RUN_ERROR"), run["types"]
    return run


async def test_a_loop_agents_text(server: tuple[str, str]) -> None:
    [run] = (await drive(server, "text"))["runs"]
    verified(run)
    assert (run["text"], run["outcome"], run["runId"]) == ("Hello from ringlet", "success", "c-text-1")
    assert run["ringletRun"].startswith("r_")
    assert run["messages"] == ["user", "assistant"]


@pytest.mark.slow
async def test_streamed_tool_calls(server: tuple[str, str]) -> None:
    [run] = (await drive(server, "tools"))["runs"]
    verified(run)
    assert sorted(run["toolResults"]) == [["c_one", "3"], ["c_two", "7"]]  # parallel calls: either order
    assert (run["text"], run["outcome"]) == ("sums: 3, 7", "success")
    assert sorted(run["messages"]) == ["assistant", "assistant", "tool", "tool", "user"]


@pytest.mark.slow
async def test_a_front_end_tool_continued_the_moment_run_finished_arrives(server: tuple[str, str]) -> None:
    """Twenty times: the client's tool result goes out from its RUN_FINISHED handler, before the stream has
    even closed; every continuation is taken (no 409) and finishes the run."""
    runs = (await drive(server, "frontEnd", repeat=20))["runs"]
    assert len(runs) == 40
    for first, second in zip(runs[::2], runs[1::2], strict=True):
        verified(first)
        assert first["outcome"] == "success"
        assert first["toolResults"] == [["c_add", "4"]]  # the server's own call ran; the client's is handed back
        verified(second)
        assert (second["text"], second["outcome"]) == ("theme: ok, sum: 4", "success")


async def test_an_approval_interrupt_resumed(server: tuple[str, str]) -> None:
    summary = await drive(server, "approval")
    first, second = (verified(r) for r in summary["runs"])
    assert first["outcome"] == "interrupt"
    assert [i["reason"] for i in summary["pending"]] == ["approval_required"]
    assert first["interrupts"] == summary["pending"]
    assert (second["text"], second["outcome"], summary["after"]) == ("deployed web", "success", 0)
    assert second["ringletRun"] == first["ringletRun"]  # the same ringlet run goes on


async def test_a_question_interrupt_answered(server: tuple[str, str]) -> None:
    summary = await drive(server, "question")
    first, second = (verified(r) for r in summary["runs"])
    assert (first["outcome"], [i["reason"] for i in first["interrupts"]]) == ("interrupt", ["question"])
    assert (second["text"], second["outcome"]) == ("you said blue", "success")


async def test_a_question_interrupt_cancelled(server: tuple[str, str]) -> None:
    summary = await drive(server, "questionCancelled")
    first, second = (verified(r) for r in summary["runs"])
    assert first["outcome"] == "interrupt"
    assert second["outcome"] == "cancelled"


async def test_a_model_error_is_run_error(server: tuple[str, str]) -> None:
    [run] = (await drive(server, "error"))["runs"]
    verified(run)
    assert run["outcome"] == "RUN_ERROR"
    assert "upstream exploded" in run["runError"][0]


async def test_a_run_cancelled_while_its_tool_call_streams(server: tuple[str, str]) -> None:
    summary = await drive(server, "cancel")
    [run] = summary["runs"]
    verified(run)
    assert summary["cancelled"] == 202
    assert run["outcome"] == "cancelled"
    assert "TOOL_CALL_START" in run["types"]


async def test_a_client_abort_then_a_reconnect(server: tuple[str, str]) -> None:
    summary = await drive(server, "abort")
    aborted, again = summary["runs"]
    assert aborted["error"] is None  # the client's own abort is not a failure
    assert aborted["types"][0] == "RUN_STARTED"
    assert summary["cancelled"] == 202  # the run went on without its client until cancelled
    verified(again)
    assert again["types"] == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]  # nothing new: the thread


async def test_a_graph_agent_completes_with_steps_and_state(server: tuple[str, str]) -> None:
    [run] = (await drive(server, "graph"))["runs"]
    verified(run)
    assert run["steps"] == [["STEP_STARTED", "first"], ["STEP_FINISHED", "first"], ["STEP_STARTED", "second"],
                            ["STEP_FINISHED", "second"], ["STEP_STARTED", "done"], ["STEP_FINISHED", "done"]]
    assert (run["state"]["n"], run["state"]["notes"]) == (2, {"a/b": "x"})  # the client applied the deltas
    assert (run["text"], run["outcome"]) == ("n=2", "success")


async def test_a_graph_paused_at_an_approval_node_then_resumed(server: tuple[str, str]) -> None:
    """The issue's case: `AGUIError: Cannot send 'RUN_FINISHED' while steps are still active: gate_blocked`."""
    summary = await drive(server, "graphApproval")
    first, second = (verified(r) for r in summary["runs"])
    assert (first["outcome"], [i["reason"] for i in first["interrupts"]]) == ("interrupt", ["question"])
    assert first["steps"][-2:] == [["STEP_STARTED", "gate_blocked"], ["STEP_FINISHED", "gate_blocked"]]
    assert second["steps"][0] == ["STEP_STARTED", "gate_blocked"]
    assert (second["text"], second["outcome"]) == ("decided: ship", "success")


async def test_a_graph_paused_at_an_approval_node_then_cancelled(server: tuple[str, str]) -> None:
    summary = await drive(server, "graphApprovalCancelled")
    first, second = (verified(r) for r in summary["runs"])
    assert first["outcome"] == "interrupt"
    assert second["outcome"] == "cancelled"


async def test_a_failing_graph_is_run_error(server: tuple[str, str]) -> None:
    [run] = (await drive(server, "graphError"))["runs"]
    verified(run)
    assert run["outcome"] == "RUN_ERROR"
    assert ["STEP_STARTED", "boom"] in run["steps"]
    assert run["steps"][-1] == ["STEP_FINISHED", "boom"]
