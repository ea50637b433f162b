"""A message queued after a working run, or steered into it, survives the process that answered its 202: the
process is SIGKILLed before the next run starts, and the message is answered after all (SQLite: by the
restarted server; PostgreSQL: by another process)."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
from httpx_sse import aconnect_sse

from processes import free_port
from serving import openai_model, serving
from test_recovery import ringlet_serve


def echo_model() -> Any:
    """Streams "Partial answer" then hangs for the first message; answers any later one with its text."""

    def reply(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        last = [m["content"] for m in messages if m["role"] == "user"][-1]
        if last == "Say something":
            return [{"role": "assistant", "content": ""}, {"content": "Partial"}, {"content": " answer"}]
        return [{"role": "assistant", "content": ""}, {"content": f"re: {last}"}]

    return openai_model(reply, hang=lambda messages: messages[-1]["content"] == "Say something")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["queue", "steer"])
async def test_a_message_sent_just_before_a_sigkill_is_answered_after_the_restart(tmp_path: Path, mode: str) -> None:
    async with serving(echo_model()) as model_url:
        agent = tmp_path / "agents" / "talker"
        agent.mkdir(parents=True)
        (agent / "config.yaml").write_text(
            f"model: openai:m\nmodel_options: {{base_url: '{model_url}/v1', api_key: x}}\ninstructions: Talk.\n")
        port, db = free_port(), tmp_path / "ringlet.db"
        base = f"http://127.0.0.1:{port}"
        async with ringlet_serve(port, db, tmp_path / "agents") as first, httpx.AsyncClient(base_url=base) as c:
            cid = (await c.post("/api/v1/chat/conversations", json={"agent": "talker"})).json()["id"]
            async with aconnect_sse(c, "POST", f"/api/v1/chat/conversations/{cid}/messages",
                                    json={"content": "Say something"}) as source:
                async for event in source.aiter_sse():  # the run hangs after its last token: it works on
                    if event.event == "content_delta" and json.loads(event.data)["delta"] == " answer":
                        break
            sent = await c.post(f"/api/v1/chat/conversations/{cid}/messages",
                                json={"content": "And then?", "mode": mode}, headers={"Accept": "application/json"})
            assert sent.status_code == 202, sent.text
            first.send_signal(signal.SIGKILL)  # the working run has not ended: no next run has started
            await first.wait()
        body = sent.json()
        async with ringlet_serve(port, db, tmp_path / "agents"), httpx.AsyncClient(base_url=base, timeout=60) as c:
            ends = await ends_of(c, cid, 2)  # the restarted server closes the dead run; the message starts the next
            assert [e["finish_reason"] for e in ends] == ["error", "end_turn"]
            messages = (await c.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"]
            assert messages[-1]["content"] == "re: And then?"
            asked = next(m for m in messages if m["content"] == "And then?")
            assert asked["id"] == body["message_id"]
            assert [m["content"] for m in messages if m["role"] == "user"] == ["Say something", "And then?"]
            runs = (await c.get("/api/v1/runs", params={"conversation_id": cid})).json()
            assert len(runs["data"] if isinstance(runs, dict) else runs) == 2
            if mode == "queue":  # the run the 202 named
                assert (await c.get(f"/api/v1/runs/{body['run_id']}")).json()["status"] == "completed"


async def ends_of(c: httpx.AsyncClient, cid: str, n: int) -> list[dict[str, Any]]:
    """The conversation's first `n` `message_end` events (stored, then live)."""
    ends: list[dict[str, Any]] = []
    async with aconnect_sse(c, "GET", f"/api/v1/chat/conversations/{cid}/events",
                            headers={"Last-Event-ID": "0"}) as source:
        async for event in source.aiter_sse():
            if event.event == "message_end":
                ends.append(json.loads(event.data))
                if len(ends) == n:
                    break
    return ends
