"""A2A conformance through the real JS client: `@a2a-js/sdk` (npm, installed by the Makefile into .venv/node)
talks JSON-RPC to a ringlet server on loopback from the agent's card: send, get, list, stream, cancel, an
input-required task answered, and the endpoint with a trailing slash. Every stream is held to A2A 1.0's rule
that it opens with the Task (or a Message), which the client itself does not check. The driver is
tests/js/a2a.mjs; it prints one JSON summary per scenario, asserted on here."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ringlet.server import ServerSettings, create_app
from ringlet.store import Store
from serving import serving
from test_a2a import agents, key_for, started

ROOT = Path(__file__).resolve().parent.parent
DRIVER = ROOT / "tests" / "js" / "a2a.mjs"
NODE_MODULES = ROOT / ".venv" / "node" / "node_modules"


@pytest.fixture
async def server(store: Store) -> AsyncIterator[tuple[str, str]]:
    assert shutil.which("node"), "node is needed for the conformance tests"
    assert (NODE_MODULES / "@a2a-js" / "sdk").is_dir(), "run `make` (it installs @a2a-js/sdk into .venv/node)"
    started["waiter"] = asyncio.Event()
    async with serving(create_app(ServerSettings(ping_interval_s=0.2), store=store, agents=agents())) as url:
        yield url, await key_for(store, "ana", ["chat", "approve"])


async def drive(server: tuple[str, str], scenario: str) -> dict[str, Any]:
    """Run the driver's scenario (a node process; the server runs in this event loop, so it is awaited, never
    blocked on) and return its summary; the client library said nothing on the console."""
    url, key = server
    process = await asyncio.create_subprocess_exec(
        "node", str(DRIVER), json.dumps({"url": url, "key": key, "scenario": scenario}),
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


def opens_with_the_task(stream: dict[str, Any]) -> list[dict[str, Any]]:
    """A stream that the client took whole and that A2A 1.0 allows: its first event is the Task (never a
    status update), and no second Task follows; its events."""
    assert stream["error"] is None, stream
    events = stream["events"]
    assert events, stream
    assert events[0]["kind"] == "task", events[0]  # A2A 1.0: the Task (or a Message) first
    assert [e["kind"] for e in events[1:] if e["kind"] == "task"] == []
    assert {e.get("taskId", e.get("id")) for e in events} == {events[0]["id"]}
    return events


@pytest.mark.slow
async def test_send_get_list_and_continue_the_context(server: tuple[str, str]) -> None:
    summary = await drive(server, "send")
    first, got, again = summary["first"], summary["got"], summary["again"]
    assert (first["state"], first["artifacts"], first["status"]) == (
        "TASK_STATE_COMPLETED", ["echo hello (1)"], "echo hello (1)")
    assert first["id"].startswith("r_")
    assert (got["id"], got["state"], got["artifacts"], got["history"]) == (
        first["id"], "TASK_STATE_COMPLETED", ["echo hello (1)"], ["hello"])
    assert (again["contextId"], again["artifacts"]) == (first["contextId"], ["echo again (2)"])
    assert summary["listed"] == [first["id"], again["id"]]


async def test_a_stream_opens_with_the_task_then_streams_the_answer(server: tuple[str, str]) -> None:
    summary = await drive(server, "stream")
    events = opens_with_the_task(summary)
    assert (events[0]["state"], events[0]["history"], events[0]["artifacts"]) == (
        "TASK_STATE_WORKING", ["streams"], [])
    chunks = [e for e in events if e["kind"] == "artifactUpdate"]
    assert chunks[-1]["text"] == "echo streams (1)"
    assert (events[-1]["kind"], events[-1]["state"]) == ("statusUpdate", "TASK_STATE_COMPLETED")


async def test_a_streamed_task_cancelled(server: tuple[str, str]) -> None:
    summary = await drive(server, "cancel")
    events = opens_with_the_task(summary)
    assert summary["cancelled"]["state"] == "TASK_STATE_CANCELED"
    assert (events[-1]["kind"], events[-1]["state"]) == ("statusUpdate", "TASK_STATE_CANCELED")


async def test_an_input_required_task_answered_in_the_task(server: tuple[str, str]) -> None:
    summary = await drive(server, "inputRequired")
    asked = opens_with_the_task(summary["asked"])
    paused = asked[-1]
    assert paused["state"] == "TASK_STATE_INPUT_REQUIRED"
    [question] = paused["asks"]
    assert (question["kind"], question["question"]) == ("question", "Which colours?")
    answered = opens_with_the_task(summary["answered"])  # an answer's stream opens with the task too
    assert answered[0]["id"] == asked[0]["id"]
    assert answered[-1]["state"] == "TASK_STATE_COMPLETED"
    said = json.loads(answered[-1]["status"].removeprefix("you said "))
    assert said["answer"] == ["red", "blue"]
    assert summary["got"]["state"] == "TASK_STATE_COMPLETED"


async def test_the_endpoint_with_a_trailing_slash(server: tuple[str, str]) -> None:
    """Clients do not follow a 307 on POST: `/a2a/{agent}/` is answered."""
    summary = await drive(server, "trailingSlash")
    assert summary["url"].endswith("/a2a/echo/")
    assert (summary["sent"]["state"], summary["sent"]["artifacts"]) == ("TASK_STATE_COMPLETED", ["echo slash (1)"])
    events = opens_with_the_task(summary)
    assert events[-1]["state"] == "TASK_STATE_COMPLETED"
