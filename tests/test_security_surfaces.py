"""Security of the surfaces added since issue 26 (issue 37), each finding over real HTTP on SQLite and
PostgreSQL: a realm field never opens another realm's agent; every run a key causes counts against its
active runs (webhook fires, resumed pauses) and its schedules are limited; bad input is 4xx everywhere;
streams of every protocol end with their key; nothing says whether another agent's or realm's conversation
exists; client-chosen ids are scoped to their realm; lists show only the agents a key may run; the A2A card
never takes its address from the `Host` header."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from ringlet import Agent
from ringlet.models.base import ModelRequest
from ringlet.server import ServerSettings, create_app
from ringlet.server.catalog import Catalog, Hosted
from ringlet.store import Store
from ringlet.testing import FunctionModel, call
from ringlet.tools.builtin.question import ask_question_tool
from ringlet.tools.builtin.schedules import SCHEDULE_TOOLS
from serving import serving


class Gate:
    """A model whose requests wait until `release`d, one at a time in arrival order; `peak` is the most that
    were in flight at once. A request after a tool result asks nothing more (`ask`: the first request of a
    run calls `ask_question` at once instead of waiting)."""

    def __init__(self, *, ask: bool = False) -> None:
        self.ask, self.in_flight, self.peak, self.answered = ask, 0, 0, 0
        self.waiting: deque[asyncio.Future[None]] = deque()
        self.changed = asyncio.Condition()

    async def __call__(self, request: ModelRequest) -> Any:
        if self.ask and not any(m.role == "tool" for m in request.messages):
            return call("ask_question", {"question": "Go on?", "input_type": "text"}, id="q1")
        turn = asyncio.get_running_loop().create_future()
        self.waiting.append(turn)
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        async with self.changed:
            self.changed.notify_all()
        try:
            await turn
        finally:
            self.in_flight -= 1
            self.answered += 1
        return "done"

    def open_all(self) -> None:
        """Answer every request still waiting (the test is over)."""
        for turn in self.waiting:
            if not turn.done():
                turn.set_result(None)

    async def drain(self, total: int, at_once: int) -> None:
        """Answer `total` requests, oldest first, each once `at_once` (or all that are left) are waiting."""
        async with asyncio.timeout(90):
            for done in range(total):
                wanted = min(at_once, total - done)
                async with self.changed:
                    await self.changed.wait_for(lambda wanted=wanted: len(self.waiting) >= wanted)
                self.waiting.popleft().set_result(None)


def _agents(model: Any) -> Catalog:
    def agent(name: str, **more: Any) -> Agent:
        return Agent(FunctionModel(model), name=name, **more)

    return Catalog([Hosted("mine", "loop", realm="r1", _agent=agent("mine", tools=list(SCHEDULE_TOOLS))),
                    Hosted("theirs", "loop", realm="r2", _agent=agent("theirs")),
                    Hosted("open", "loop", _agent=agent("open")),
                    Hosted("asker", "loop", realm="r1", _agent=agent("asker", tools=[ask_question_tool()]))])


@pytest.fixture
async def calls(store: Store) -> AsyncIterator[tuple[str, Store, list[ModelRequest]]]:
    seen: list[ModelRequest] = []

    def model(request: ModelRequest) -> str:
        seen.append(request)
        return "ok"

    settings = ServerSettings(ping_interval_s=0.2, auth_recheck_s=0.2)
    async with serving(create_app(settings, store=store, agents=_agents(model))) as url:
        yield url, store, seen


async def _client(url: str, store: Store, **key: Any) -> httpx.AsyncClient:
    secret, _ = await store.keys.create(key.pop("name", "k"), **key)
    return httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {secret}"}, timeout=30)


def _a2a_send(text: str, context_id: str = "") -> dict[str, Any]:
    message = {"messageId": f"m-{text}", "role": "ROLE_USER", "parts": [{"text": text}]}
    if context_id:
        message["contextId"] = context_id
    return {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message}}


A2A = {"A2A-Version": "1.0"}


# -- 1. a realm field never opens another realm's agent ----------------------------------------------------------


async def test_a_realm_field_cannot_open_another_realms_agent(
        calls: tuple[str, Store, list[ModelRequest]]) -> None:
    url, store, seen = calls
    async with await _client(url, store, realms=["r1"]) as r1, \
            await _client(url, store, realms=["r1"], scopes=["admin"]) as admin:
        named = await r1.post("/api/v1/chat/conversations", json={"agent": "theirs", "realm": "r1"})
        assert (named.status_code, named.json()["error"]["code"]) == (403, "realm_forbidden"), named.text
        moved = await r1.post("/api/v1/chat/conversations", json={"agent": "mine", "realm": "r2"})
        assert (moved.status_code, moved.json()["error"]["code"]) == (403, "realm_forbidden")
        trigger = await admin.post("/api/v1/triggers", json={"name": "t", "agent": "theirs", "kind": "webhook",
                                                              "realm": "r1"})
        assert (trigger.status_code, trigger.json()["error"]["code"]) == (403, "realm_forbidden"), trigger.text
        agui = await r1.post("/ag-ui/theirs", json={"threadId": "t1", "runId": "x", "messages": [
            {"id": "u1", "role": "user", "content": "hi"}], "tools": [], "context": []})
        assert agui.status_code == 403, agui.text
        a2a = await r1.post("/a2a/theirs", json=_a2a_send("hi"), headers=A2A)
        assert a2a.status_code == 404  # an agent the key may not run is not there for it
        # a conversation stored in the wrong realm (made before this check existed) never runs either
        stray = await store.conversations.create(agent="theirs", realm="r1")
        sent = await r1.post(f"/api/v1/chat/conversations/{stray.id}/messages", json={"content": "hi"},
                             headers={"Accept": "application/json"})
        assert (sent.status_code, sent.json()["error"]["code"]) == (403, "realm_forbidden"), sent.text
        direct = await r1.post(f"/api/v1/chat/conversations/{stray.id}/tool-calls",
                               json={"tool": "list_schedules", "args": {}})
        assert (direct.status_code, direct.json()["error"]["code"]) == (403, "realm_forbidden"), direct.text
        assert seen == []  # the agent never ran
        # an agent without a realm lives in the key's realm when the key has one
        made = await r1.post("/api/v1/chat/conversations", json={"agent": "open"})
        assert (made.status_code, made.json()["realm"]) == (201, "r1")


# -- 3. every run a key causes counts against it -------------------------------------------------------------------


@pytest.fixture
async def gated(store: Store) -> AsyncIterator[tuple[str, Store, Gate]]:
    gate = Gate(ask=True)
    settings = ServerSettings(ping_interval_s=0.2, max_runs_per_key=2)
    async with serving(create_app(settings, store=store, agents=_agents(gate))) as url:
        yield url, store, gate
        gate.open_all()  # nothing left waiting when the server stops


@pytest.mark.slow
async def test_webhook_fires_wait_their_turn_among_the_keys_runs(gated: tuple[str, Store, Gate]) -> None:
    url, store, gate = gated
    gate.ask = False
    async with await _client(url, store, scopes=["admin", "trigger"], realms=["r1"]) as key:
        made = await key.post("/api/v1/triggers", json={"name": "hook", "agent": "mine", "kind": "webhook"})
        fires = [await key.post(f"/api/v1/triggers/{made.json()['id']}/fire", json={"n": i}) for i in range(8)]
        assert [f.status_code for f in fires] == [202] * 8  # accepted: they wait, not refused
        await gate.drain(8, 2)
    assert (gate.answered, gate.peak) == (8, 2)


@pytest.mark.slow
async def test_answered_questions_resume_within_the_keys_runs(gated: tuple[str, Store, Gate]) -> None:
    url, store, gate = gated
    async with await _client(url, store, realms=["r1"]) as key:
        asked = []
        for _ in range(5):
            cid = (await key.post("/api/v1/chat/conversations", json={"agent": "asker"})).json()["id"]
            paused = await key.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": "go"},
                                    headers={"Accept": "application/json"})
            assert paused.json()["status"] == "input_required", paused.text
            asked.append((cid, paused.json()["pending"]["questions"][0]["question_id"]))
        for cid, question in asked:  # five answers at once: the runs go on two at a time
            answered = await key.post(f"/api/v1/chat/conversations/{cid}/questions/{question}",
                                      json={"answer": "yes"})
            assert answered.status_code == 200, answered.text
        await gate.drain(5, 2)
    assert (gate.answered, gate.peak) == (5, 2)


async def test_schedules_are_limited_per_key(store: Store) -> None:
    settings = ServerSettings(max_schedules_per_key=3, min_schedule_interval_s=600)
    async with serving(create_app(settings, store=store, agents=_agents(lambda r: "ok"))) as url, \
            await _client(url, store, realms=["r1"]) as key:
        async def schedule(cid: str, **task: Any) -> dict[str, Any]:
            made = await key.post(f"/api/v1/chat/conversations/{cid}/tool-calls", json={
                "tool": "schedule_task", "args": {"message": "ping", **task}})
            assert made.status_code == 200, made.text
            return made.json()

        cids = [(await key.post("/api/v1/chat/conversations", json={"agent": "mine"})).json()["id"]
                for _ in range(2)]
        often = await schedule(cids[0], kind="interval", interval_minutes=1)  # one run a minute
        assert (often["status"], "min_schedule_interval_s" in often["error"]["message"]) == ("error", True), often
        cron = await schedule(cids[0], kind="cron", cron="*/5 * * * *")
        assert (cron["status"], "min_schedule_interval_s" in cron["error"]["message"]) == ("error", True), cron
        made = [await schedule(cids[i % 2], kind="interval", interval_minutes=15) for i in range(3)]
        assert [m["status"] for m in made] == ["completed"] * 3
        over = await schedule(cids[1], kind="cron", cron="0 9 * * *")  # another conversation: the key's limit
        assert (over["status"], "max_schedules_per_key" in over["error"]["message"]) == ("error", True), over
    rows = await store.schedules.list(status="active")
    assert len(rows) == 3
    assert {r.created_by_key for r in rows} == {rows[0].created_by_key}
    assert rows[0].created_by_key.startswith("key_")


# -- 4. bad input is 4xx everywhere -------------------------------------------------------------------------


async def test_bad_input_is_a_4xx_everywhere(calls: tuple[str, Store, list[ModelRequest]]) -> None:
    url, store, seen = calls
    deep = b"[" * 100_000 + b"]" * 100_000
    async with await _client(url, store, realms=["r1"], scopes=["chat", "admin", "trigger"]) as key:
        cid = (await key.post("/api/v1/chat/conversations", json={"agent": "mine"})).json()["id"]
        for control, status in (("\u0000", 400), ("\u0001", 422)):  # a NUL is refused anywhere in a body
            bad = await key.post(f"/api/v1/chat/conversations/{cid}/messages", headers={"Accept": "application/json"},
                                 json={"content": "hi", "overrides": {"model": f"local:/models/ok.gguf{control}.gguf"}})
            assert bad.status_code == status, bad.text
        trigger = (await key.post("/api/v1/triggers", json={"name": "h", "agent": "mine", "kind": "webhook"})).json()
        for path, headers in ((f"/api/v1/triggers/{trigger['id']}/fire", {}), ("/a2a/mine", A2A),
                              (f"/api/v1/chat/conversations/{cid}/messages", {}), ("/v1/chat/completions", {}),
                              ("/ag-ui/mine", {})):
            answer = await key.post(path, content=deep, headers={"Content-Type": "application/json", **headers})
            assert 400 <= answer.status_code < 500, (path, answer.status_code, answer.text[:200])
        # a NUL character: PostgreSQL cannot store one, so it is refused at the door (was a 500 there)
        for path, body in (("/api/v1/chat/conversations", {"agent": "mine", "title": "a\u0000b"}),
                           (f"/api/v1/chat/conversations/{cid}/messages", {"content": "a\u0000b"}),
                           ("/api/v1/triggers", {"name": "n\u0000", "agent": "mine", "kind": "webhook"}),
                           ("/a2a/mine", _a2a_send("a\u0000b"))):
            refused = await key.post(path, json=body, headers=A2A)
            assert (refused.status_code, refused.json()["error"]["code"]) == (400, "invalid_request"), path
            assert "NUL" in refused.json()["error"]["message"]
        assert (await key.get("/api/v1/chat/conversations", params={"agent": "a\u0000"})).status_code == 400
        quoted = await key.post("/api/v1/chat/conversations", json={"agent": "mine", "title": "the text \\u0000"})
        assert (quoted.status_code, quoted.json()["title"]) == (201, "the text \\u0000")  # text, not a NUL
    assert seen == []


async def test_an_a2a_failure_never_shows_its_exception() -> None:
    from a2a.utils.errors import InternalError

    from ringlet.server.http.errors import request_id
    from ringlet.server.protocols.a2a.errors import hidden as _hidden

    @_hidden
    async def failing() -> None:
        raise RuntimeError("SELECT secret FROM api_keys")

    request_id.set("req_test")
    with pytest.raises(InternalError) as raised:
        await failing()
    assert "SELECT" not in str(raised.value)
    assert "req_test" in str(raised.value)


# -- 5. every stream ends with its key ------------------------------------------------------------------------------


async def test_v1_and_a2a_streams_end_when_their_key_is_revoked(store: Store) -> None:
    gate = Gate()
    settings = ServerSettings(ping_interval_s=0.2, auth_recheck_s=0.2)
    async with serving(create_app(settings, store=store, agents=_agents(gate))) as url:
        secret, record = await store.keys.create("watcher", realms=["r1"])
        headers = {"Authorization": f"Bearer {secret}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as client:
            async with client.stream("POST", "/v1/chat/completions", json={
                    "model": "mine", "stream": True, "messages": [{"role": "user", "content": "hi"}]}) as v1:
                lines = []
                async for line in v1.aiter_lines():
                    lines.append(line)
                    if line == ": ping" and lines.count(": ping") == 1:
                        await store.keys.revoke(record.id)
            assert [ln for ln in lines if ln][-1] == "data: [DONE]", lines[-4:]
            error = json.loads(next(ln for ln in lines if ln.startswith("data: {\"error\"")).removeprefix("data: "))
            assert error["error"]["code"] == "unauthorized"
        secret, record = await store.keys.create("watcher2", realms=["r1"])
        headers = {"Authorization": f"Bearer {secret}", **A2A}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as client:
            body = {**_a2a_send("hi"), "method": "SendStreamingMessage"}
            async with client.stream("POST", "/a2a/mine", json=body) as a2a:
                frames = []
                async for line in a2a.aiter_lines():
                    if line.startswith("data: "):
                        frames.append(json.loads(line.removeprefix("data: ")))
                        if len(frames) == 1:
                            await store.keys.revoke(record.id)
            assert "unauthorized" in frames[-1]["error"]["message"], frames[-1]
        gate.open_all()


# -- 6, 7. nothing says what exists outside a key's reach; client ids are scoped to realms --------------------


async def test_other_agents_and_realms_conversations_are_not_found(
        calls: tuple[str, Store, list[ModelRequest]]) -> None:
    url, store, _ = calls
    async with await _client(url, store, realms=["r1"], agents=["mine"], scopes=["chat", "admin"]) as one, \
            await _client(url, store, realms=["r1"]) as every_agent:
        other = (await every_agent.post("/api/v1/chat/conversations", json={"agent": "asker"})).json()["id"]
        for cid in (other, "c_unknown"):
            v1 = await one.post("/v1/chat/completions", json={"model": "mine", "messages": [
                {"role": "user", "content": "hi"}]}, headers={"X-Ringlet-Conversation-Id": cid})
            trigger = await one.post("/api/v1/triggers", json={"name": "t", "agent": "mine", "kind": "webhook",
                                                                "conversation_id": cid})
            assert (v1.status_code, trigger.status_code) == (404, 404), (cid, v1.text, trigger.text)
            assert trigger.json()["error"]["message"] == f"no conversation {cid!r}"


async def test_client_chosen_ids_are_scoped_to_their_realm(store: Store) -> None:
    catalog = Catalog([Hosted("open", "loop", _agent=Agent(FunctionModel(lambda r: "ok"), name="open"))])
    async with serving(create_app(ServerSettings(ping_interval_s=0.2), store=store, agents=catalog)) as url, \
            await _client(url, store, realms=["r1"]) as r1, await _client(url, store, realms=["r2"]) as r2:
        def thread(text: str) -> dict[str, Any]:
            return {"threadId": "shared-thread", "runId": "x", "tools": [], "context": [],
                    "messages": [{"id": f"u-{text}", "role": "user", "content": text}]}

        first = await r1.post("/ag-ui/open", json=thread("one"))
        assert first.status_code == 200
        assert '"threadId":"shared-thread"' in first.text  # events name the thread as the client does
        squatted = await r2.post("/ag-ui/open", json=thread("two"))  # the same name in r2: its own thread
        assert squatted.status_code == 200, squatted.text
        listed = {r: (await c.get("/api/v1/chat/conversations")).json()["data"] for r, c in (("r1", r1), ("r2", r2))}
        assert [(c["realm"], c["client_id"]) for c in listed["r1"]] == [("r1", "shared-thread")]
        assert [(c["realm"], c["client_id"]) for c in listed["r2"]] == [("r2", "shared-thread")]
        # A2A: another realm's conversation id is a fresh context, never an error that says it exists
        theirs = listed["r1"][0]["id"]
        answer = (await r2.post("/a2a/open", json=_a2a_send("hi", theirs), headers=A2A)).json()
        assert "error" not in answer, answer
        assert answer["result"]["task"]["contextId"] == theirs  # as the client named it
        unknown = (await r2.post("/a2a/open", json=_a2a_send("hi", "c_unknown"), headers=A2A)).json()
        assert "error" not in unknown, unknown
        mine = {c["id"] for c in (await r2.get("/api/v1/chat/conversations")).json()["data"]}
        assert theirs not in mine
        assert len(mine) == 3
        detail = (await r1.get(f"/api/v1/chat/conversations/{theirs}")).json()
        assert len(detail["messages"]) == 2  # r1's thread was never touched


# -- 8, 9. lists show the agents a key may run; the card's address is never the client's Host -------------------


async def test_lists_and_cards_show_only_agents_the_key_may_run(
        calls: tuple[str, Store, list[ModelRequest]]) -> None:
    url, store, _ = calls
    async with await _client(url, store, realms=["r1"]) as r1:
        agents = [a["name"] for a in (await r1.get("/api/v1/agents")).json()["data"]]
        models = [m["id"] for m in (await r1.get("/v1/models")).json()["data"]]
        assert sorted(agents) == sorted(models) == ["asker", "mine", "open"]
        assert (await r1.get("/a2a/theirs/.well-known/agent-card.json")).status_code == 404
        card = await r1.get("/a2a/mine/.well-known/agent-card.json", headers={"Host": "attacker.example"})
        assert card.status_code == 200
        endpoint = card.json()["supportedInterfaces"][0]["url"]
        assert endpoint == f"{url}/a2a/mine", endpoint


async def test_the_card_uses_the_configured_public_url(store: Store) -> None:
    settings = ServerSettings(public_url="https://agents.example.com/")
    async with serving(create_app(settings, store=store, agents=_agents(lambda r: "ok"))) as url, \
            await _client(url, store, realms=["r1"]) as r1:
        card = (await r1.get("/a2a/mine/.well-known/agent-card.json", headers={"Host": "attacker.example"})).json()
        assert card["supportedInterfaces"][0]["url"] == "https://agents.example.com/a2a/mine"
