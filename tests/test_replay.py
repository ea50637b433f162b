"""Replay (issue 44): a recorded run runs again on its tape without calling the model or any tool, and its
events come out byte for byte; when the code changes, the report names the first divergence."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from ringlet import Agent, Gates, SubAgents, tool
from ringlet.errors import ConfigError
from ringlet.gates import ApprovalRules
from ringlet.models.base import ModelRequest
from ringlet.replay import Recording, canonical, replay
from ringlet.testing import FunctionModel, ScriptedModel, call

ran: list[str] = []


@tool(effect="read")
def lookup(city: str) -> str:
    """Look up the weather."""
    ran.append(f"lookup {city}")
    return f"{city}: 21C"


@tool(effect="write")
def deploy(service: str) -> str:
    """Deploy a service."""
    ran.append(f"deploy {service}")
    return f"deployed {service}"


def lead(model: Any, child_model: Any, instructions: str | None = None) -> Agent:
    child = Agent(child_model, name="researcher")
    return Agent(model, name="lead", instructions=instructions, tools=[lookup, deploy, SubAgents([child])],
                 gates=Gates(approvals=ApprovalRules()))


def script() -> ScriptedModel:
    """Four rounds: a parallel pair of lookups, a sub-agent, a deploy that waits for approval, the answer."""
    return ScriptedModel([[call("lookup", {"city": "Paris"}, id="c1"), call("lookup", {"city": "Oslo"}, id="c2")],
                          call("spawn_agent", {"task": "Summarise the weather", "agent": "researcher"}, id="s1"),
                          call("deploy", {"service": "web"}, id="d1"), "Deployed; Paris is warmer."])


def never(request: ModelRequest) -> str:
    raise AssertionError("a replay never calls the model")


async def recorded() -> Recording:
    recording = Recording()
    agent = lead(script(), FunctionModel(lambda r: "Paris is warmer than Oslo.", name="test:child"))
    first = await recording.run(agent, "Check the weather, then deploy web.")
    assert first.status == "input_required"  # the deploy waits for a human
    done = await recording.resume(agent, first.state, {"d1": True})
    assert done.status == "completed"
    assert done.output == "Deployed; Paris is warmer."
    return recording


async def test_a_recorded_run_replays_byte_for_byte_without_the_model_or_tools() -> None:
    recording = await recorded()
    assert ran.count("deploy web") == 1
    ran.clear()
    kinds = [e["type"] for e in recording.events]
    assert kinds.count("tool_result") >= 4
    assert "approval_required" in kinds
    assert any(e.get("agent_path") for e in recording.events)  # the sub-agent's own events are in the stream
    again = Recording.from_json(recording.to_json())  # as it would be read from a file
    report = await replay(lead(FunctionModel(never), FunctionModel(never)), again)
    assert report.same, report.divergence
    assert [canonical(e) for e in report.events] == [canonical(e) for e in recording.events]
    assert report.recorded == len(recording.events)
    assert ran == []  # no tool ran


async def test_a_code_change_is_reported_at_its_first_divergence(monkeypatch: pytest.MonkeyPatch) -> None:
    recording = await recorded()
    first_result = next(i for i, e in enumerate(recording.events) if e["type"] == "tool_result")
    monkeypatch.setattr("ringlet.loop.tools.truncate", lambda text, limit: (text[:4], True))  # "the loop changed"
    report = await replay(lead(FunctionModel(never), FunctionModel(never)), recording)
    assert not report.same
    first = report.divergence
    assert first is not None
    assert first.kind == "event"
    assert first.index == first_result
    assert "result" in first.message
    assert "truncated" in first.message
    assert first.expected["result"] == "Paris: 21C"
    assert first.actual["result"] == "Pari"
    assert any(d.kind == "request" for d in report.divergences)  # the next request then differs as well


async def test_other_instructions_are_a_different_request() -> None:
    recording = await recorded()
    report = await replay(lead(FunctionModel(never), FunctionModel(never), instructions="Be terse."), recording)
    first = report.divergence
    assert first is not None
    assert first.kind == "request"
    assert first.index == 0
    assert "instructions" in first.message


async def test_a_recording_is_saved_and_a_broken_file_is_refused(tmp_path: Path) -> None:
    recording = await recorded()
    recording.save(tmp_path / "run.json")
    assert Recording.load(tmp_path / "run.json").to_json() == recording.to_json()
    (tmp_path / "bad.json").write_text('{"segments": 3}')
    with pytest.raises(ConfigError, match="not a ringlet recording"):
        Recording.load(tmp_path / "bad.json")


# -- on the server: every loop run of a conversation is recorded; POST /api/v1/runs/{id}/replay -----------------


def server_lead(request: ModelRequest) -> Any:
    """Round by round: two lookups in parallel, a sub-agent, a deploy (approval), then the answer."""
    done = {m.tool_call_id for m in request.messages if m.role == "tool"}
    if not done:
        return [call("lookup", city="Paris", id="c1"), call("lookup", city="Oslo", id="c2")]
    if "s1" not in done:
        return call("spawn_agent", task="Summarise the weather", agent="researcher", id="s1")
    if "d1" not in done:
        return call("deploy", service="web", id="d1")
    return "Deployed; Paris is warmer."


@pytest.fixture
async def replay_server(store: Any) -> Any:
    from ringlet.server import ServerSettings, create_app
    from serving import serving

    ran.clear()
    child = Agent(FunctionModel(lambda r: "Paris is warmer than Oslo.", name="test:child"), name="researcher")
    agents = [Agent(FunctionModel(server_lead, name="test:lead"), name="lead",
                    tools=[lookup, deploy, SubAgents([child])],
                    gates=Gates(approvals=ApprovalRules({"deploy": {"mode": "confirm", "timeout_s": 60}}))), child]
    async with serving(create_app(ServerSettings(ping_interval_s=0.2), store=store, agents=agents)) as url:
        yield url, store


async def test_a_server_run_with_an_approval_and_a_sub_agent_replays_from_its_recording(
        replay_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import httpx
    from httpx_sse import aconnect_sse

    from test_server import new_conversation

    url, store = replay_server
    key, _ = await store.keys.create("ana", scopes=["chat", "approve", "admin"], user_id="ana")
    chatter, _ = await store.keys.create("bo", scopes=["chat"], user_id="bo")
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as client:
        cid = (await new_conversation(client, "lead"))["id"]
        paused = await client.post(f"/api/v1/chat/conversations/{cid}/messages", headers={"Accept": "application/json"},
                                   json={"content": "Check the weather, then deploy web."})
        assert paused.json()["status"] == "input_required", paused.text
        run_id = paused.json()["run_id"]
        [pending] = paused.json()["pending"]["approvals"]
        decided = await client.post(f"/api/v1/chat/conversations/{cid}/approvals/{pending['approval_id']}",
                                    json={"approved": True})
        assert decided.status_code == 200, decided.text
        async with aconnect_sse(client, "GET", f"/api/v1/chat/conversations/{cid}/events") as source:
            async for event in source.aiter_sse():  # the conversation's log, then live: until the run's end
                data = json.loads(event.data) if event.event == "message_end" else {}
                if data.get("finish_reason") == "end_turn" and not data.get("agent_path"):
                    break
        assert ran.count("deploy web") == 1
        ran.clear()

        replayed = await client.post(f"/api/v1/runs/{run_id}/replay")
        assert replayed.status_code == 200, replayed.text
        report = replayed.json()
        assert report["same"] is True, json.dumps(report["divergences"])
        assert report["events"] == report["recorded_events"] > 20
        assert ran == []  # nothing ran again

        monkeypatch.setattr("ringlet.loop.tools.truncate", lambda text, limit: (text[:4], True))
        changed = (await client.post(f"/api/v1/runs/{run_id}/replay")).json()
        assert changed["same"] is False
        assert changed["divergence"]["kind"] == "event"
        assert changed["divergence"]["expected"]["type"] == "tool_result"

        missing = await client.post("/api/v1/runs/r_nothere/replay")
        assert missing.status_code == 404
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {chatter}"}, timeout=30) as bo:
        assert (await bo.post(f"/api/v1/runs/{run_id}/replay")).status_code == 403  # an admin's tool


@pytest.mark.slow
async def test_ringlet_replay_on_a_run_of_the_built_in_assistant(tmp_path: Path) -> None:
    """The CLI, on a run the server made with the real local model: the same events (exit 0); after a stored
    event is altered, the divergence at that event (exit 1); an unknown run (exit 2)."""
    import os
    import subprocess
    import sys

    import httpx
    from sqlalchemy import update

    from ringlet.server import ServerSettings, create_app
    from ringlet.store import Store
    from ringlet.store.schema import events
    from serving import serving

    url_db = f"sqlite+aiosqlite:///{tmp_path / 'ringlet.db'}"
    store = await Store.open(url_db)
    (tmp_path / "agents").mkdir()
    try:
        app = create_app(ServerSettings(agents_dir=tmp_path / "agents", auth_mode="none"), store=store)
        async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=120) as client:
            cid = (await client.post("/api/v1/chat/conversations", json={"agent": "assistant"})).json()["id"]
            done = await client.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": "What is 17 * 23?"},
                                     headers={"Accept": "application/json"})
            assert done.json()["status"] == "completed", done.text
            run_id = done.json()["run_id"]

        def ringlet_replay(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "ringlet", "replay", *args, "--db", url_db, "--agents",
                                   str(tmp_path / "agents")], check=False, capture_output=True, text=True, timeout=300,
                                  env={**os.environ, "COLUMNS": "200"})

        same = ringlet_replay(run_id)
        assert same.returncode == 0, same.stdout + same.stderr
        assert "same:" in same.stdout
        assert "byte for byte" in same.stdout
        async with store.engine.begin() as conn:  # the stored answer no longer what the loop makes
            last = (await store.events.after(cid, 0, run_id=run_id))[-1]
            await conn.execute(update(events).where(events.c.conversation_id == cid, events.c.id == last[0])
                               .values(payload={**last[2], "finish_reason": "max_tokens"}))
        changed = ringlet_replay(run_id, "--json")
        assert changed.returncode == 1, changed.stdout + changed.stderr
        report = json.loads(changed.stdout)
        assert report["divergence"]["kind"] == "event"
        assert report["divergence"]["expected"]["finish_reason"] == "max_tokens"
        assert report["divergence"]["actual"]["finish_reason"] != "max_tokens"
        unknown = ringlet_replay("r_unknown")
        assert unknown.returncode == 2
        assert "no run 'r_unknown'" in unknown.stderr
    finally:
        await store.close()


async def test_recordings_go_with_their_event_log_and_their_conversation(store: Any) -> None:
    """A tape is kept as long as the events it is compared with, and deleting a conversation deletes its
    runs' tapes (they hold its transcript)."""
    from ringlet._ids import at, new_id

    kept, old = [], []
    for runs in (kept, old):
        conversation = await store.conversations.create(agent="lead")
        run_id = new_id("r")
        await store.runs.create(run_id, agent="lead", conversation_id=conversation.id)
        await store.runs.pause(run_id, state={}, requests=[], conversation_id=conversation.id,
                               tape={"kind": "start", "segment": 0, "models": []})
        await store.runs.pause(run_id, state={}, requests=[], conversation_id=conversation.id,  # the same tape,
                               tape={"kind": "start", "segment": 0, "models": [1]})  # longer: it replaces it
        await store.runs.finish(run_id, status="completed", finish_reason="end_turn", in_tokens=0, out_tokens=0,
                                cost_usd=None, conversation_id=conversation.id,
                                tape={"kind": "resume", "segment": 1_795_907_484_265})
        runs.append((conversation.id, run_id))
    assert [t["kind"] for t in await store.tapes.of(kept[0][1])] == ["start", "resume"]  # in segment order
    assert (await store.tapes.of(kept[0][1]))[0]["models"] == [1]
    from sqlalchemy import update

    from ringlet.store.schema import run_tapes

    async with store.engine.begin() as conn:
        await conn.execute(update(run_tapes).where(run_tapes.c.run_id == old[0][1]).values(created_at=at(0)))
    assert await store.tapes.prune(at(3600)) == 2
    assert await store.tapes.of(old[0][1]) == []
    assert len(await store.tapes.of(kept[0][1])) == 2
    await store.conversations.purge(kept[0][0])
    assert await store.tapes.of(kept[0][1]) == []


@pytest.mark.slow
async def test_the_cli_and_the_api_give_one_answer_on_a_run_resumed_after_an_approval(tmp_path: Path) -> None:
    """A run of an agent from the agents folder that paused for an approval and was resumed: `ringlet replay`
    and `POST …/replay` run the same replay on the agent built as the server builds it (its approval decision
    audited, so the audit record's id and time are the run's), and both say `same` (the CLI diverged at the
    resumed segment's `au_` id, a `tool_result`'s `ts` and the next request's last message). The model's
    server is gone by the time the CLI replays: nothing calls it."""
    import os
    import subprocess
    import sys

    import httpx

    from ringlet.server import ServerSettings, create_app
    from ringlet.store import Store
    from serving import openai_model, serving
    from test_server import sse_events
    from test_server_approvals import deploy_then_quote

    url_db = f"sqlite+aiosqlite:///{tmp_path / 'ringlet.db'}"
    agent = tmp_path / "agents" / "ops"
    agent.mkdir(parents=True)
    (agent / "tools.py").write_text("def deploy(service: str) -> str:\n    \"\"\"Deploy a service.\"\"\"\n"
                                    "    return f'deployed {service}'\n")
    store = await Store.open(url_db)
    try:
        async with serving(openai_model(deploy_then_quote)) as model_url:
            (agent / "config.yaml").write_text(
                f"model: openai:m\nmodel_options: {{base_url: '{model_url}/v1', api_key: x}}\n"
                "tools:\n  deploy:\n    approval: {mode: confirm, timeout_s: 600}\n")
            app = create_app(ServerSettings(agents_dir=tmp_path / "agents", auth_mode="none"), store=store)
            async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=60) as client:
                cid = (await client.post("/api/v1/chat/conversations", json={"agent": "ops"})).json()["id"]
                paused = (await client.post(f"/api/v1/chat/conversations/{cid}/messages", json={
                    "content": "Deploy the api"}, headers={"Accept": "application/json"})).json()
                assert paused["status"] == "input_required", paused
                [approval] = paused["pending"]["approvals"]
                decided = await client.post(f"/api/v1/chat/conversations/{cid}/approvals/{approval['approval_id']}",
                                            json={"approved": True, "note": "go"})
                assert decided.status_code == 200, decided.text
                log = await sse_events(client, "GET", f"/api/v1/chat/conversations/{cid}/events",
                                       headers={"Last-Event-ID": "0"})
                assert json.loads(log[-1].data)["finish_reason"] == "end_turn"
                api = (await client.post(f"/api/v1/runs/{paused['run_id']}/replay")).json()
        audited = await store.audit.list(run_id=paused["run_id"])
        assert [e.record["decided_by"] for e in audited if e.record.get("action") == "approval.decide"] == ["local"]
        command = [sys.executable, "-m", "ringlet", "replay", paused["run_id"], "--json", "--db", url_db, "--agents",
                   str(tmp_path / "agents")]
        cli = await asyncio.to_thread(subprocess.run, command, check=False, capture_output=True, text=True,
                                      timeout=300, env={**os.environ, "COLUMNS": "200"})
        assert cli.returncode == 0, cli.stdout + cli.stderr
        assert "Traceback" not in cli.stderr
        assert json.loads(cli.stdout) == api
        assert api["same"] is True, api["divergences"]
        assert api["events"] == api["recorded_events"] == len(log)
        assert await store.audit.list(run_id=paused["run_id"]) == audited  # the replays audited nothing
    finally:
        await store.close()


# -- finding a run to replay: GET /api/v1/runs, ringlet runs ------------------------------------------------


async def test_runs_are_listed_newest_first_a_page_at_a_time_as_the_key_may_see_them(store: Any) -> None:
    """`GET /api/v1/runs`: the runs of the key's realms and agents (as `GET /api/v1/runs/{id}` finds them),
    newest first, `limit` at a time with `next_cursor`; filtered by agent, realm, status, conversation; a
    `/v1` run without a conversation is listed, a deleted conversation's runs are not."""
    import httpx

    from ringlet.server import ServerSettings, create_app
    from serving import serving

    agents = [Agent(FunctionModel(lambda r: "ok", name="test:echo"), name="echo"),
              Agent(FunctionModel(lambda r: "fine", name="test:other"), name="other")]
    async with serving(create_app(ServerSettings(), store=store, agents=agents)) as url:
        admin, _ = await store.keys.create("admin", scopes=["chat"])
        narrow, _ = await store.keys.create("narrow", scopes=["chat"], realms=["r1"], agents=["echo"])
        clients = [httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {k}"}, timeout=30)
                   for k in (admin, narrow)]
        async with clients[0] as a, clients[1] as n:
            async def ran(agent: str, realm: str, times: int = 1) -> tuple[str, list[str]]:
                cid = (await a.post("/api/v1/chat/conversations", json={"agent": agent, "realm": realm})).json()["id"]
                ids = []
                for _ in range(times):
                    done = await a.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": "hi"},
                                        headers={"Accept": "application/json"})
                    assert done.json()["status"] == "completed", done.text
                    ids.append(done.json()["run_id"])
                return cid, ids

            mine, first = await ran("echo", "r1", 3)
            _, elsewhere = await ran("echo", "r2")
            _, others = await ran("other", "r1")
            gone, deleted = await ran("echo", "r1")
            assert (await a.delete(f"/api/v1/chat/conversations/{gone}")).status_code == 204
            stateless = await a.post("/v1/chat/completions", json={"model": "echo", "messages": [
                {"role": "user", "content": "hi"}]})
            assert stateless.status_code == 200, stateless.text

            async def pages(client: httpx.AsyncClient, **params: Any) -> list[dict[str, Any]]:
                seen, cursor = [], None
                while True:
                    got = await client.get("/api/v1/runs", params={**params, **({"cursor": cursor} if cursor else {})})
                    assert got.status_code == 200, got.text
                    seen += got.json()["data"]
                    if (cursor := got.json()["next_cursor"]) is None:
                        return seen
                    assert len(got.json()["data"]) == params.get("limit", 50)

            everything = await pages(a, limit=2)
            ids = [r["id"] for r in everything]
            records = [await store.runs.get(i) for i in ids]
            assert [(r.started_at, r.id) for r in records] == sorted(((r.started_at, r.id) for r in records),
                                                                     reverse=True)  # newest first
            assert set(first + elsewhere + others + [stateless.json()["ringlet"]["run_id"]]) <= set(ids)
            assert not set(deleted) & set(ids)  # its conversation was deleted: GET …/runs/{id} is 404 too
            for listed in everything:  # as GET …/runs/{id} shows each (the realm: its conversation's)
                assert (await a.get(f"/api/v1/runs/{listed['id']}")).json() == listed
            assert everything[ids.index(first[0])]["realm"] == "r1"
            assert [r["id"] for r in await pages(n)] == list(reversed(first))  # its realm and agent only
            assert [r["id"] for r in await pages(a, agent="other")] == others
            assert [r["id"] for r in await pages(a, realm="r2")] == elsewhere
            assert [r["id"] for r in await pages(a, conversation_id=mine, limit=1)] == list(reversed(first))
            assert await pages(a, status="failed") == []
            assert (await n.get("/api/v1/runs", params={"realm": "r2"})).status_code == 403
            bad = await a.get("/api/v1/runs", params={"cursor": "%%%"})
            assert (bad.status_code, bad.json()["error"]["code"]) == (400, "invalid_request")
            assert (await a.get("/api/v1/runs", params={"status": "sleeping"})).status_code == 422
            schema = (await a.get("/openapi.json")).json()
            assert schema["paths"]["/api/v1/runs"]["get"]["responses"]["200"]["content"]["application/json"][
                "schema"]["$ref"].endswith("/RunList")
