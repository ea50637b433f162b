"""Memory (issue #6, memory-and-context.md §1–§4): the tools on SQLite and PostgreSQL, realm isolation,
context notes in the request the model receives, implicit capture, degrade-to-keyword, graph import."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from helpers import of_type
from ringlet import Agent, ConfigError, Gates, tool
from ringlet.context import Caller, RunContext
from ringlet.errors import ToolFailure
from ringlet.gates import ApprovalRules
from ringlet.memory import Memory, MemoryConfig, memory_toolset
from ringlet.memory.embeddings import EmbeddingError
from ringlet.memory.graph_import import import_file
from ringlet.store import Store
from ringlet.store.memory_records import Scope
from ringlet.testing import ScriptedModel, call


def ctx(realm: str = "blue", org: str = "acme") -> RunContext:
    return RunContext(run_id="r_test", agent="a", realm=realm, org_id=org)


class Tools:
    """The memory tools of one memory, called as a run in `realm` would call them."""

    def __init__(self, memory: Memory, realm: str = "blue") -> None:
        self.tools = {t.name: t for t in memory_toolset(memory).static_tools or ()}
        self.ctx = ctx(realm)

    async def __call__(self, name: str, **args: Any) -> Any:
        t = self.tools[name]
        return await t.run(t.validate(args), self.ctx)


async def failure(coro: Any) -> ToolFailure:
    with pytest.raises(ToolFailure) as info:
        await coro
    return info.value


# -- the tools, on each backend ------------------------------------------------------------------------------

async def test_store_and_recall(store: Store) -> None:
    call_tool = Tools(Memory(store))
    first = await call_tool("store", content="Ada prefers dark roast coffee", tags=["pref", "coffee"])
    assert first == {"id": first["id"], "title": "Ada prefers dark roast coffee", "embedded": False}
    long = await call_tool("store", content="x" * 150, type="Note", metadata={"source": "chat"})
    assert long["title"] == "x" * 100
    await call_tool("store", content="Deploys happen on Tuesdays", labels=["Fact", "Ops"], tags=["pref"])
    got = await call_tool("recall", id=first["id"])
    assert got["count"] == 1
    assert got["nodes"][0]["content"] == "Ada prefers dark roast coffee"
    assert set(got["nodes"][0]) == {"id", "type", "title", "content", "tags", "properties", "created_at"}
    newest_first = await call_tool("recall")
    assert [n["type"] for n in newest_first["nodes"]] == ["Fact", "Note", "Memory"]
    assert [n["type"] for n in (await call_tool("recall", type=["Ops", "Note"]))["nodes"]] == ["Fact", "Note"]
    tagged = await call_tool("recall", tags=["pref", "coffee"])  # all of the tags
    assert [n["id"] for n in tagged["nodes"]] == [first["id"]]
    limited = await call_tool("recall", tags=["pref"], limit=1)  # the filter runs before the limit
    assert limited["nodes"][0]["type"] == "Fact"
    assert (await call_tool("recall", since="2999-01-01T00:00:00Z"))["count"] == 0
    assert (await failure(call_tool("recall", id="n_missing"))).code == "not_found"
    reserved = await failure(call_tool("store", content="x", metadata={"realm": "red", "ok": 1}))
    assert reserved.code == "invalid_arguments"
    assert "realm" in reserved.message
    with pytest.raises(Exception, match="labels"):
        await call_tool("store", content="x", labels=["not a label"])


async def test_discover_link_and_related(store: Store) -> None:
    call_tool = Tools(Memory(store))
    api = await call_tool("store", content="The checkout service handles payments for the shop", type="Service")
    db = await call_tool("store", content="Postgres cluster orders-db", type="Database")
    await call_tool("store", content="Lunch is at noon", type="Memory")
    linked = await call_tool("link", **{"from": api["id"], "to": db["id"], "relation": "depends_on"})
    assert linked["relation"] == "DEPENDS_ON"
    again = await call_tool("link", **{"from": api["id"], "to": db["id"], "relation": "DEPENDS_ON", "strength": 0.5})
    assert again["edge_id"] == linked["edge_id"]  # same (from, to, relation): updated, not duplicated
    found = await call_tool("discover", query="which service handles payments?")
    assert found["method"] == "keyword"
    assert found["results"][0]["id"] == api["id"]
    assert found["results"][0]["related"] == [{"id": db["id"], "relation": "DEPENDS_ON", "direction": "out",
                                               "type": "Database", "title": "Postgres cluster orders-db"}]
    assert (await call_tool("discover", query="payments", type=["Database"]))["results"] == []
    long = await call_tool("store", content="payments " + "y" * 400)
    preview = next(r for r in (await call_tool("discover", query="payments"))["results"] if r["id"] == long["id"])
    assert len(preview["content_preview"]) == 200
    assert (await failure(call_tool("link", **{"from": api["id"], "to": "n_nope", "relation": "X"}))).code == \
        "not_found"


async def test_tasks(store: Store) -> None:
    call_tool = Tools(Memory(store))
    assert (await failure(call_tool("task", description="no title"))).code == "invalid_arguments"
    design = (await call_tool("task", title="Design", priority="high"))["task"]
    assert (design["status"], design["priority"]) == ("pending", "high")
    build = await call_tool("task", title="Build", depends_on=[design["id"]])
    assert build["next_action"] == "1 dependency still open"
    build_id = build["task"]["id"]
    cycle = await failure(call_tool("task", id=design["id"], depends_on=[build_id]))
    assert cycle.code == "invalid_arguments"
    assert f"{design['id']} → {build_id} → {design['id']}" in cycle.message
    assert (await failure(call_tool("task", title="X", depends_on=["t_nope"]))).code == "not_found"
    unblocked = await call_tool("tasks", unblocked_only=True)
    assert [t["title"] for t in unblocked["tasks"]] == ["Design"]
    assert (await call_tool("task", id=design["id"]))["task"]["status"] == "active"  # one step along
    assert (await call_tool("task", id=design["id"]))["task"]["status"] == "completed"
    assert (await call_tool("task", id=design["id"]))["task"]["status"] == "completed"  # stays completed
    assert [t["title"] for t in (await call_tool("tasks", unblocked_only=True))["tasks"]] == ["Build", "Design"]
    assert (await call_tool("task", id=build_id, status="done"))["task"]["status"] == "completed"
    listing = await call_tool("tasks", status=["completed"], priority=["medium"])
    assert [t["title"] for t in listing["tasks"]] == ["Build"]
    assert listing["stats"] == {"total": 2, "by_status": {"completed": 2}, "by_priority": {"high": 1, "medium": 1}}
    assert (await call_tool("task", id=build_id, delete=True))["task"]["deleted"] is True
    assert (await failure(call_tool("task", id=build_id, complete=True))).code == "not_found"
    assert (await call_tool("tasks"))["stats"]["total"] == 1


async def test_remember_links_to_named_entities(store: Store, tmp_path: Path) -> None:
    memory = Memory(store)
    graph = tmp_path / "graph.jsonl"
    graph.write_text('{"id": "svc_checkout", "name": "checkout", "type": "Service", "aliases": ["co-svc"]}\n')
    await import_file(memory, graph, Scope("acme", "blue"))
    call_tool = Tools(memory)
    made = await call_tool("remember", kind="incident_root", text="The Checkout outage came from a bad config")
    node = (await call_tool("recall", id=made["id"]))["nodes"][0]
    assert node["properties"] == {"kind": "incident_root"}
    edges = await (await memory.records()).edges(Scope("acme", "blue"), [made["id"]])
    assert [(e.dst, e.relation) for e in edges] == [("svc_checkout", "MENTIONS")]


# -- realms --------------------------------------------------------------------------------------------------

async def test_nothing_written_in_one_realm_is_visible_from_another(store: Store, tmp_path: Path) -> None:
    memory = Memory(store)
    blue, red = Tools(memory, "blue"), Tools(memory, "red")
    secret = await blue("store", content="The launch code is swordfish", tags=["secret"])
    task = (await blue("task", title="Rotate the launch code"))["task"]
    graph = tmp_path / "graph.jsonl"
    graph.write_text('{"id": "svc_vault", "name": "vault", "type": "Service"}\n'
                     '{"from": "svc_vault", "to": "svc_vault", "relation": "guards"}\n')
    await import_file(memory, graph, Scope("acme", "blue"))
    # every tool in the other realm sees nothing, and a foreign id is exactly a missing id
    assert (await failure(red("recall", id=secret["id"]))).message == (
        await failure(red("recall", id="n_never_existed"))).message.replace("n_never_existed", secret["id"])
    assert (await red("recall"))["count"] == 0
    assert (await red("recall", tags=["secret"]))["count"] == 0
    assert (await red("discover", query="launch code swordfish"))["results"] == []
    assert (await failure(red("link", **{"from": secret["id"], "to": task["id"], "relation": "x"}))).code == \
        "not_found"
    assert (await failure(red("task", id=task["id"], complete=True))).code == "not_found"
    assert (await red("tasks"))["tasks"] == []
    assert (await failure(red("task", title="x", depends_on=[task["id"]]))).code == "not_found"
    # nor a context note
    assert await memory.memory_note(Scope("acme", "red"), "what is the launch code?") is None
    assert await memory.graph_note(Scope("acme", "red"), "is the vault up?") is None
    assert await memory.graph_note(Scope("acme", "blue"), "is the vault up?") is not None
    # another organisation's realm of the same name is another realm
    other_org = Tools(memory, "blue")
    other_org.ctx = ctx("blue", org="globex")
    assert (await other_org("discover", query="launch code"))["results"] == []
    # an id taken in another realm cannot be overwritten by an import
    clash = tmp_path / "clash.jsonl"
    clash.write_text('{"id": "svc_vault", "name": "mine", "type": "Service"}\n')
    with pytest.raises(ConfigError, match="belongs to another realm"):
        await import_file(memory, clash, Scope("acme", "red"))
    assert (await blue("recall", id="svc_vault"))["nodes"][0]["title"] == "vault"


# -- context notes -------------------------------------------------------------------------------------------

async def test_context_notes_reach_the_model_in_order_and_escaped(store: Store, tmp_path: Path) -> None:
    memory = Memory(store)
    graph = tmp_path / "graph.jsonl"
    graph.write_text('{"id": "svc_checkout", "name": "checkout", "type": "Service"}\n'
                     '{"id": "db_orders", "name": "orders-db", "type": "Database"}\n'
                     '{"from": "svc_checkout", "to": "db_orders", "relation": "depends_on"}\n')
    await import_file(memory, graph, Scope("acme", "blue"))
    await Tools(memory)("remember", kind="fact", text="checkout deploys need a </memory> freeze <b>ticket</b>")
    model = ScriptedModel(["ok"])
    await Agent(model, tools=[memory], instructions="Be brief.").run("Can I deploy Checkout today?",
                                                                     caller=Caller(realm="blue", org_id="acme"))
    request = model.requests[0]
    assert request.instructions is not None
    assert request.instructions.startswith("Be brief.\n\nRealm: blue.")
    assert "reference data" in request.instructions
    kinds = [(m.role, m.text.split("\n")[0]) for m in request.messages]
    assert kinds == [("system", "<memory>"), ("system", '<graph_context realm="blue">'),
                     ("user", "Can I deploy Checkout today?")]
    memory_note = request.messages[0].text
    assert "[fact]: checkout deploys need a &lt;/memory&gt; freeze &lt;b&gt;ticket&lt;/b&gt;" in memory_note
    assert memory_note.count("</memory>") == 1
    assert request.messages[1].text.splitlines()[1] == "Service: checkout → DEPENDS_ON: orders-db"


async def test_a_fact_remembered_in_one_conversation_is_used_in_another(store: Store) -> None:
    memory = Memory(store)
    first = ScriptedModel([call("remember", kind="user_preference", text="Ada drinks her tea without sugar"),
                           "Noted."])
    await Agent(first, tools=[memory]).run("No sugar in my tea, please",
                                           caller=Caller(realm="blue", conversation_id="c_1"))
    second = ScriptedModel(["Without sugar."])
    await Agent(second, tools=[memory]).run("How do I take my tea?", caller=Caller(realm="blue", conversation_id="c_2"))
    assert "Ada drinks her tea without sugar" in second.requests[0].messages[0].text
    elsewhere = ScriptedModel(["?"])
    await Agent(elsewhere, tools=[memory]).run("How do I take my tea?",
                                               caller=Caller(realm="red", conversation_id="c_3"))
    assert [m.role for m in elsewhere.requests[0].messages] == ["user"]


async def test_notes_are_capped_and_a_failed_lookup_is_left_out(store: Store) -> None:
    memory = Memory(store, max_note_tokens=60, recall_top_k=20)
    for i in range(20):
        await Tools(memory)("store", content=f"tea fact number {i} " + "word " * 40)
    note = await memory.memory_note(Scope("acme", "blue"), "tea")
    assert note is not None
    assert 1 <= note.count("\n- ") < 20
    assert all(len(line) <= 320 for line in note.splitlines())

    class Stuck(Memory):
        async def graph_note(self, scope: Scope, message: str) -> str | None:
            await asyncio.Event().wait()  # a lookup that never answers
            return None

    stuck = Stuck(store, lookup_timeout_s=0.05)
    model = ScriptedModel(["ok"])
    stream = Agent(model, tools=[stuck]).stream("tea?", caller=Caller(realm="blue", org_id="acme"))
    events = [e async for e in stream]
    warning = of_type(events, "notification")[0]
    assert (warning.level, warning.title, warning.message) == ("warning", "graph_context note left out",
                                                               "timed out")
    assert [m.text.split("\n")[0] for m in model.requests[0].messages] == ["<memory>", "tea?"]
    assert stream.state.context_notes["memory"].startswith("<memory>")  # recorded for audit and replay


# -- embeddings: degrade to keywords; the real local model ---------------------------------------------------

class Broken:
    name = "test:broken"

    async def embed(self, texts: list[str]) -> np.ndarray:
        raise EmbeddingError("connection refused")


async def test_a_broken_embedding_provider_degrades_to_keyword_search(store: Store) -> None:
    memory = Memory(store, embeddings=Broken())
    model = ScriptedModel([call("store", content="keyword only memory about tea"), call("discover", query="tea"),
                           "done"])
    stream = Agent(model, tools=[memory]).stream("tea?", caller=Caller(realm="blue", org_id="acme"))
    events = [e async for e in stream]
    assert stream.result is not None
    assert stream.result.status == "completed"
    stored, result = (json.loads(e.result) for e in of_type(events, "tool_result"))
    assert stored["embedded"] is False
    assert result["method"] == "keyword"
    assert result["results"][0]["content_preview"] == "keyword only memory about tea"
    warnings = [e for e in of_type(events, "notification") if e.level == "warning"]
    assert warnings
    assert warnings[0].title == "embeddings unavailable"


class Fixed:
    """Deterministic 3-d embeddings by topic word, for hybrid search without a model."""

    name = "test:fixed"
    TOPICS = {"fruit": [1, 0, 0], "apple": [1, 0, 0], "banana": [1, 0, 0], "car": [0, 1, 0], "engine": [0, 1, 0]}

    async def embed(self, texts: list[str]) -> np.ndarray:
        rows = []
        for text in texts:
            v = np.array([0.0, 0.0, 0.1])
            for word, topic in self.TOPICS.items():
                if word in text.lower():
                    v += topic
            rows.append(v / np.linalg.norm(v))
        return np.array(rows, np.float32)


async def test_hybrid_search_fuses_vectors_and_keywords(store: Store) -> None:
    memory = Memory(store, embeddings=Fixed())
    t = Tools(memory)
    apple = await t("store", content="An apple a day")
    await t("store", content="The engine needs oil")
    banana = await t("store", content="Bananas are yellow banana")
    assert apple["embedded"] is True
    found = await t("discover", query="fruit", min_similarity=0.5)
    assert found["method"] == "vector"  # no stored text says "fruit": only vectors find these
    assert {r["id"] for r in found["results"]} == {apple["id"], banana["id"]}
    assert all(r["similarity"] >= 0.5 for r in found["results"])
    both = await t("discover", query="apple engine")
    assert both["method"] == "hybrid"
    assert both["results"][0]["id"] == apple["id"]  # first in both lists


@pytest.mark.slow
async def test_a_real_local_embedding_model(tmp_path: Path, torch_on_one_thread: None) -> None:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'm.db'}")
    try:
        memory = Memory(store, embeddings="local")
        t = Tools(memory)
        cat = await t("store", content="My cat sleeps on the windowsill all afternoon")
        await t("store", content="The quarterly tax return is due in April")
        await t("store", content="Our Kubernetes cluster runs three nodes")
        assert cat["embedded"] is True
        found = await t("discover", query="feline naps", min_similarity=0.2)
        assert found["method"] == "vector"  # no keyword overlap at all
        assert found["results"][0]["id"] == cat["id"]
    finally:
        await store.close()


# -- implicit capture ----------------------------------------------------------------------------------------

async def test_durable_results_and_human_decisions_are_captured(store: Store) -> None:
    @tool(effect="read", durable=True)
    def incident(name: str) -> str:
        """Look up an incident."""
        return f"{name}: root cause was an expired certificate"

    @tool(effect="write")
    def rollback(service: str) -> str:
        """Roll back a service."""
        return "rolled back"

    memory = Memory(store)
    model = ScriptedModel([[call("incident", name="INC-7"), call("rollback", service="api", id="c_rb")], "ok"])
    agent = Agent(model, tools=[incident, rollback, memory], gates=Gates(approvals=ApprovalRules()))
    paused = await agent.run("what broke?", caller=Caller(realm="blue", org_id="acme"))
    from ringlet.gates.approval import deny

    await agent.resume(paused.state, {"c_rb": deny("wait for the morning", "ana")})
    nodes = (await Tools(memory)("recall", limit=10))["nodes"]
    kinds = {n["properties"]["kind"]: n["content"] for n in nodes}
    assert kinds["tool_result"] == "incident: INC-7: root cause was an expired certificate"
    assert kinds["decision"].startswith("ana denied rollback(")
    assert kinds["decision"].endswith(": wait for the morning")



async def test_a_questions_answer_is_captured(store: Store) -> None:
    from ringlet.gates.approval import ApprovalDecision
    from ringlet.tools.builtin.question import ask_question_tool

    memory = Memory(store)
    model = ScriptedModel([call("ask_question", {"question": "Which region?", "input_type": "text"}, id="q"),
                           "ok"])
    agent = Agent(model, tools=[ask_question_tool(), memory])
    paused = await agent.run("deploy", caller=Caller(realm="blue", org_id="acme"))
    await agent.resume(paused.state, {"q": ApprovalDecision("answered", "ana",
                                                            answer={"answer": "eu-west", "freeform": False})})
    nodes = (await Tools(memory)("recall", limit=10))["nodes"]
    assert [n["content"] for n in nodes if n["properties"]["kind"] == "decision"] == \
        ["ana answered 'Which region?': eu-west"]


# -- graph import --------------------------------------------------------------------------------------------

async def test_graph_import_is_all_or_nothing_and_names_the_bad_line(store: Store, tmp_path: Path) -> None:
    memory = Memory(store)
    scope = Scope("acme", "blue")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "name": "alpha"}\n\n{"id": "b", "name": "beta", "colour": "red"}\n')
    with pytest.raises(ConfigError, match=r"bad\.jsonl:3: colour: Extra inputs are not permitted"):
        await import_file(memory, bad, scope)
    dangling = tmp_path / "dangling.jsonl"
    dangling.write_text('{"id": "a", "name": "alpha"}\n{"from": "a", "to": "zzz", "relation": "uses"}\n')
    with pytest.raises(ConfigError, match=r"dangling\.jsonl:2: edge end 'zzz'"):
        await import_file(memory, dangling, scope)
    assert await (await memory.records()).get_node(scope, "a") is None  # nothing was imported
    good = tmp_path / "good.jsonl"
    good.write_text('{"id": "a", "name": "alpha", "type": "Service"}\n{"id": "b", "name": "beta"}\n'
                    '{"from": "a", "to": "b", "relation": "uses"}\n')
    assert await import_file(memory, good, scope) == (2, 1)
    assert await import_file(memory, good, scope) == (2, 1)  # upserted by id: nothing doubles
    assert len(await (await memory.records()).edges(scope, ["a"])) == 1
    note = await memory.graph_note(scope, "Is Alpha healthy?")
    assert note == '<graph_context realm="blue">\nService: alpha → USES: beta\n</graph_context>'


async def test_the_vector_cache_follows_writes_updates_and_deletes(store: Store) -> None:
    memory = Memory(store, embeddings=Fixed())
    t, scope = Tools(memory), Scope("acme", "blue")
    first = await t("store", content="apple pie")
    assert [r["id"] for r in (await t("discover", query="fruit"))["results"]] == [first["id"]]
    second = await t("store", content="banana bread")  # appended to the cached matrix
    found = {r["id"] for r in (await t("discover", query="fruit", min_similarity=0.5))["results"]}
    assert found == {first["id"], second["id"]}
    await (await memory.records()).delete_node(scope, first["id"])  # a delete reloads the cache
    found = {r["id"] for r in (await t("discover", query="fruit", min_similarity=0.5))["results"]}
    assert found == {second["id"]}
    ids, matrix = await (await memory.records()).search.vectors(scope)
    assert ids == [second["id"]]
    assert matrix.shape == (1, 3)


async def test_the_server_keeps_memory_per_realm_across_conversations(store: Store) -> None:
    import httpx

    from ringlet.server import ServerSettings, create_app
    from serving import serving

    model = ScriptedModel([call("remember", kind="fact", text="The staging password rotates on Mondays"),
                           "Noted.", "On Mondays.", "No idea."])
    app = create_app(ServerSettings(auth_mode="none"), store=store,
                     agents=[Agent(model, name="keeper", tools=[MemoryConfig()])])
    async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as c:
        async def ask(realm: str, text: str) -> None:
            cid = (await c.post("/api/v1/chat/conversations", json={"agent": "keeper", "realm": realm})).json()["id"]
            done = await c.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": text},
                                headers={"Accept": "application/json"})
            assert done.json()["status"] == "completed", done.text

        await ask("blue", "Remember: staging password rotates on Mondays")
        await ask("blue", "When does the staging password rotate?")
        await ask("red", "When does the staging password rotate?")
    blue, red = model.requests[2], model.requests[3]
    assert "The staging password rotates on Mondays" in blue.messages[0].text
    assert [m.role for m in red.messages] == ["user"]
    assert len(await store.memory.find(Scope("local", "blue"))) == 1  # in the server's store, the key's org


async def test_a_realm_crowded_out_of_the_index_ranking_still_finds_its_memories(store: Store) -> None:
    """Keyword search ranks the whole index first; when another realm's matches fill that ranking, the
    realm's own are ranked again inside it (SQLite), so they are found all the same."""
    records = store.memory
    loud, quiet = Scope("acme", "loud"), Scope("acme", "quiet")
    crowd = [{"id": f"n_loud_{i}", "labels": ["Memory"], "title": "falcon falcon falcon", "tags": [],
              "content": "falcon falcon falcon", "properties": {}} for i in range(60)]
    await records.import_items(loud, crowd, [])
    await records.import_items(quiet, [{"id": "n_quiet", "labels": ["Memory"], "title": "a falcon nests here",
                                        "content": "a falcon nests here, among many other words", "tags": [],
                                        "properties": {}}], [])
    assert [i for i, _ in await records.search.keyword(quiet, "falcon", limit=5)] == ["n_quiet"]
    found = [i for i, _ in await records.search.keyword(loud, "falcon", limit=5)]
    assert len(found) == 5
    assert all(i.startswith("n_loud_") for i in found)
