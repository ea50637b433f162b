"""The store on SQLite and PostgreSQL (issue #4, in progress): migrations, conversations, transcripts,
runs and the event log. Every test that takes `store` runs on both engines."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from postgres import fresh_database
from ringlet import Agent, ConfigError, Message
from ringlet.events import ContentDeltaEvent, StatusEvent
from ringlet.store import SCHEMA_VERSION, Store, statements
from ringlet.store.driven import Driven
from ringlet.store.engine import storage_error
from ringlet.store.records import Usage
from ringlet.store.schema import schema_version
from ringlet.testing import ScriptedModel


async def test_migrations_are_versioned_and_run_once(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'a' / 'ringlet.db'}"  # the directory is created
    first = await Store.open(url)
    await first.close()
    again = await Store.open(url)
    async with again.engine.connect() as conn:
        versions = [r.version for r in await conn.execute(schema_version.select())]
    assert versions == list(range(1, SCHEMA_VERSION + 1))
    async with again.engine.begin() as conn:
        await conn.execute(schema_version.insert().values(version=SCHEMA_VERSION + 1, applied_at="x",
                                                          oldest_reader=SCHEMA_VERSION + 1))  # a contract step
    await again.close()
    with pytest.raises(ConfigError, match="upgrade ringlet"):
        await Store.open(url)


async def test_a_bad_url_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="database URL"):
        await Store.open("nosuchdb://x")


@pytest.mark.parametrize(("url", "error"), [
    ("not a url", "is not a URL; use sqlite:///FILE or postgresql://USER@HOST/DB"),
    ("mysql://u@127.0.0.1/db", "SQLite or PostgreSQL"),
    ("postgresql+psycopg2://u:secret@127.0.0.1/db", "psycopg2 is not an async driver; leave the driver out "
                                                     r"\(postgresql://…\) and ringlet uses asyncpg"),
    ("sqlite+pysqlite:///x.db", "pysqlite is not an async driver"),
])
async def test_database_urls_that_cannot_work_say_why(url: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error) as failed:
        await Store.open(url)
    assert "secret" not in str(failed.value)  # the password is never shown


async def test_plain_database_urls_take_the_async_drivers(tmp_path: Path, postgres_url: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """`sqlite:///FILE`, `postgresql://…` and `postgres://…` work as written, everywhere a URL is taken
    (`--db`, `RINGLET_DB_URL`, `Store.open`, `Memory`: all open the store here)."""
    monkeypatch.setenv("RINGLET_DB_URL", f"sqlite:///{tmp_path / 'env' / 'ringlet.db'}")
    plain_pg = postgres_url.replace("postgresql+asyncpg://", "postgresql://")
    assert plain_pg != postgres_url
    for url, driver in ((f"sqlite:///{tmp_path / 'a' / 'ringlet.db'}", "sqlite+aiosqlite"),
                        (None, "sqlite+aiosqlite"),  # from RINGLET_DB_URL
                        (plain_pg, "postgresql+asyncpg"),
                        (plain_pg.replace("postgresql://", "postgres://"), "postgresql+asyncpg"),
                        (f"{plain_pg}?sslmode=disable", "postgresql+asyncpg")):  # libpq's sslmode, as asyncpg's ssl
        store = await Store.open(url)
        try:
            assert store.engine.url.drivername == driver
            conversation = await store.conversations.create(agent="a")
            assert await store.conversations.get(conversation.id) is not None
        finally:
            await store.close()
    assert (tmp_path / "a" / "ringlet.db").is_file()
    assert (tmp_path / "env" / "ringlet.db").is_file()


async def test_conversations(store: Store) -> None:
    a = await store.conversations.create(agent="assistant", realm="prod")
    b = await store.conversations.create(agent="assistant", realm="dev")
    child = await store.conversations.create(agent="helper", realm="prod", parent_run_id="r_1")
    assert a.status == "idle"
    assert a.usage == Usage(0, 0, None)
    assert await store.conversations.get(a.id, realm="dev") is None  # another realm: like a missing id
    assert (await store.conversations.get(a.id, realm="prod")).id == a.id
    assert [c.id for c in await store.conversations.list(realms=["prod"])] == [a.id]
    listed = await store.conversations.list(realms=["prod"], include_sub_agents=True)
    assert {c.id for c in listed} == {a.id, child.id}
    assert await store.conversations.delete(b.id)
    assert not await store.conversations.delete(b.id)
    assert await store.conversations.get(b.id) is None


async def test_transcripts_are_stored_once_in_order(store: Store) -> None:
    conversation = await store.conversations.create(agent="assistant")
    result = await Agent(ScriptedModel(["Hello there."])).run("Tell me   something\\nnice " + "x" * 80)
    messages = result.new_messages()
    assert await store.conversations.append_messages(conversation.id, messages) == 2
    assert await store.conversations.append_messages(conversation.id, messages) == 0  # a retry stores nothing twice
    loaded = await store.conversations.load_messages(conversation.id)
    assert [m.id for m in loaded] == [m.id for m in messages]
    assert all(m.metadata["is_persisted"] for m in loaded)
    assert loaded[1].text == "Hello there."
    title = (await store.conversations.get(conversation.id)).title
    assert title.startswith("Tell me something\\nnice x")
    assert len(title) == 60
    extra = [Message.user(f"m{i}") for i in range(5)]
    await store.conversations.append_messages(conversation.id, extra)
    assert [m.text for m in await store.conversations.load_messages(conversation.id, limit=2)] == ["m3", "m4"]


async def test_usage_totals_and_unknown_cost(store: Store) -> None:
    conversation = await store.conversations.create(agent="assistant")
    await store.conversations.add_usage(conversation.id, 10, 5, 0.25)
    await store.conversations.add_usage(conversation.id, 1, 1, 0.5)
    assert (await store.conversations.get(conversation.id)).usage == Usage(11, 6, 0.75)
    await store.conversations.add_usage(conversation.id, 1, 1, None)
    await store.conversations.add_usage(conversation.id, 1, 1, 1.0)
    assert (await store.conversations.get(conversation.id)).usage == Usage(13, 8, None)


async def test_runs(store: Store) -> None:
    conversation = await store.conversations.create(agent="assistant")
    await store.runs.create("r_1", agent="assistant", conversation_id=conversation.id)
    assert (await store.runs.get("r_1")).status == "working"
    await store.runs.finish("r_1", status="completed", finish_reason="end_turn", in_tokens=3, out_tokens=4,
                           cost_usd=None)
    run = await store.runs.get("r_1")
    assert (run.status, run.finish_reason, run.usage) == (
        "completed", "end_turn", Usage(3, 4, None))
    assert run.ended_at is not None
    assert await store.runs.get("r_nope") is None


async def test_event_ids_are_strictly_increasing_per_conversation(store: Store) -> None:
    one = await store.conversations.create(agent="assistant")
    two = await store.conversations.create(agent="assistant")
    deltas = [ContentDeltaEvent(run_id="r_1", ts="t", message_id="m", delta=str(i)) for i in range(20)]
    ids = await asyncio.gather(*(store.events.append(one.id, e) for e in deltas))
    assert sorted(ids) == list(range(1, 21))
    assert await store.events.append(two.id, StatusEvent(run_id="r_2", ts="t", state="working")) == 1
    replay = await store.events.after(one.id, after=15)
    assert [i for i, _, _ in replay] == [16, 17, 18, 19, 20]
    assert replay[0][1] == "content_delta"
    assert replay[0][2]["run_id"] == "r_1"


async def test_api_keys_are_stored_as_hashes_and_verified(store: Store) -> None:
    from ringlet.store.schema import api_keys

    key, record = await store.keys.create("ci", scopes=["chat", "approve"], realms=["prod"], user_id="u_1")
    assert key.startswith("rk_")
    assert len(key) >= 40
    async with store.engine.connect() as conn:
        stored = [dict(r) for r in (await conn.execute(api_keys.select())).mappings()]
    assert key not in str(stored)  # only the hash is kept
    verified = await store.keys.verify(key)
    assert verified is not None
    assert (verified.scopes, verified.realms, verified.agents) == (["chat", "approve"], ["prod"], "*")
    assert await store.keys.verify(key + "x") is None
    assert [k.id for k in await store.keys.list()] == [record.id]
    assert await store.keys.revoke(record.id)
    assert await store.keys.verify(key) is None
    expired, _ = await store.keys.create("old", expires_in_days=-1)
    assert await store.keys.verify(expired) is None
    with pytest.raises(ConfigError, match="unknown scope 'god'"):
        await store.keys.create("bad", scopes=["god"])


def approval(approval_id: str, run_id: str, call_id: str, expires_at: str = "2999-01-01T00:00:00.000Z") -> dict:
    return {"approval_id": approval_id, "run_id": run_id, "conversation_id": None, "tool_call_id": call_id,
            "tool": "deploy", "connector": None, "args": {"service": "api"}, "effect": "write",
            "reason": "write tool requires approval", "requested_at": "2026-01-01T00:00:00.000Z",
            "expires_at": expires_at, "timeout_s": 300.0, "status": "pending", "decided_by": None,
            "decided_at": None, "note": None}


async def test_approvals_are_decided_once_and_executed_at_most_once(store: Store) -> None:
    await store.runs.create("r_1", agent="ops")
    await store.runs.pause("r_1", state={"awaiting": {"c_1": {}}}, conversation_id=None, requests=[
        approval("ap_1", "r_1", "c_1"), approval("ap_2", "r_1", "c_2", expires_at="2000-01-01T00:00:00.000Z")])
    await store.approvals.add("r_1", [approval("ap_1", "r_1", "c_1")])  # stored once
    assert [a.approval_id for a in await store.approvals.list(run_id="r_1")] == ["ap_1", "ap_2"]
    now = "2026-06-01T00:00:00.000Z"
    decided = await asyncio.gather(*(store.approvals.decide("ap_1", status=s, decided_by=s, note=None, when=now)
                                     for s in ("approved", "denied")))
    assert sorted(decided) == [False, True]  # the first decision wins
    assert not await store.approvals.decide("ap_2", status="approved", decided_by="x", note=None, when=now)
    assert [a.approval_id for a in await store.approvals.expire(now)] == ["ap_2"]
    assert (await store.approvals.get("ap_2")).decided_by == "system:timeout"  # type: ignore[union-attr]
    if (await store.approvals.get("ap_1")).status == "approved":  # type: ignore[union-attr]
        moved = await asyncio.gather(store.approvals.mark_executing(["ap_1"]), store.approvals.mark_executing(["ap_1"]))
        assert sorted(map(len, moved)) == [0, 1]  # one process runs the call
        await store.approvals.executed("r_1", ["c_1"])
        assert (await store.approvals.get("ap_1")).status == "approved"  # type: ignore[union-attr]
    taken = await asyncio.gather(*(store.runs.take_paused("r_1", owner, "2999-01-01T00:00:00.000Z")
                                   for owner in ("p1", "p2")))
    assert sum(t is not None for t in taken) == 1  # one process resumes the run
    assert await store.runs.paused() == []
    await store.runs.pause_again("r_1")
    assert await store.runs.paused() == ["r_1"]


async def test_postgresql_keeps_every_connection_it_opens_and_drops_a_broken_one(postgres_url: str) -> None:
    """The pool keeps what a burst opened (a connection closed on return costs a handshake and a prepare of
    each statement when the next burst comes), and a connection whose server side is gone is replaced: the
    statement on it fails with a storage error, and the next ones get working connections."""
    async with fresh_database(postgres_url) as url:
        store = await Store.open(url)
        try:
            cid = (await store.conversations.create(agent="a")).id
            held, release = 0, asyncio.Event()

            async def hold() -> None:
                nonlocal held
                async with store.db.driver() as pg:
                    await pg.fetchval("SELECT 1")
                    held += 1
                    if held == 30:
                        release.set()
                    await release.wait()

            async with asyncio.timeout(30):
                await asyncio.gather(*(hold() for _ in range(30)))
            pool: Any = store.engine.pool
            assert pool.checkedin() == 30  # all kept (a pool of 20 + 10 overflow closed 10 of them)
            with pytest.raises(asyncpg.ConnectionDoesNotExistError) as failed:  # its server side ends mid-statement
                async with store.db.driver() as pg:
                    await pg.fetchval("SELECT pg_terminate_backend(pg_backend_pid())")
            assert storage_error(failed.value) is not None
            assert store.db.failure is not None  # unready until a statement succeeds again
            for _ in range(30):  # each pooled connection in turn (the pool is first in, first out): the broken
                # one was replaced
                assert await store.conversations.get(cid) is not None
            assert store.db.failure is None
        finally:
            await store.close()


async def test_a_turns_statements_on_the_driver_store_what_sqlalchemy_stores(postgres_url: str) -> None:
    """`Driven` runs the statements SQLAlchemy compiled, with SQLAlchemy's value processors: a row written
    through it (a JSON state, a JSON null, a column left to its default) reads back byte for byte as the
    same row written through SQLAlchemy; an existing key is SQLAlchemy's `IntegrityError`; a result has
    what the store reads (`first`, `scalar`, `rowcount`, `mappings`)."""
    async with fresh_database(postgres_url) as url:
        store = await Store.open(url)
        try:
            for state in ({"a": [1, "é"], "b": None}, None):
                rows = []
                for way in ("sqlalchemy", "driver"):
                    run = {"id": f"r_{way}", "agent": "a", "kind": "loop", "status": "working", "state": state,
                           "started_at": "2026-01-01T00:00:00Z"}
                    async with (store.db.begin() if way == "sqlalchemy" else store.db.hot()) as conn:
                        await conn.execute(statements.INSERT_RUN, run)
                    async with store.engine.connect() as conn:
                        rows.append((await conn.execute(text(
                            "SELECT state::text, in_tokens, out_tokens, kind FROM runs WHERE id = :id"),
                            {"id": run["id"]})).one())
                        await conn.execute(text("DELETE FROM runs"))
                        await conn.commit()
                assert rows[0] == rows[1]
            cid = (await store.conversations.create(agent="a")).id
            async with store.db.hot() as conn:
                assert isinstance(conn, Driven)
                claimed = await conn.execute(statements.CLAIM, {"b_id": cid, "b_stamp": "t", "b_title": "x"})
                assert claimed.scalar() == 0
                again = await conn.execute(statements.CLAIM, {"b_id": cid, "b_stamp": "t", "b_title": "x"})
                assert again.first() is None  # running: not claimed twice
                taken = await conn.execute(statements.SET_STATUS, {"b_id": cid, "b_status": "idle", "b_stamp": "t"})
                assert taken.rowcount == 1
            async with store.db.hot_read() as conn:
                [found] = (await conn.execute(statements.CONVERSATION, {"b_id": cid})).mappings()
                assert (found["title"], found["status"], found["pruned_event_id"]) == ("x", "idle", 0)
            with pytest.raises(IntegrityError):
                async with store.db.hot() as conn:
                    await conn.execute(statements.INSERT_CONVERSATION, {
                        "id": cid, "agent": "a", "title": "", "realm": "default", "is_sub_agent": False,
                        "status": "idle", "in_tokens": 0, "out_tokens": 0, "priced": True, "last_event_id": 0,
                        "created_at": "t", "updated_at": "t"})
        finally:
            await store.close()
