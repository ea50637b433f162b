"""Upgrades (issue 55 §4): `ringlet migrate`; a database written by the previous release opens, migrates and
runs; schema changes only expand, and a process of the previous release and one of this checkout share one
database (a rolling upgrade). The previous release's code comes from git history (`git archive`)."""

from __future__ import annotations

import asyncio
import importlib.util
import sqlite3
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, inspect
from typer.testing import CliRunner

from processes import free_port
from ringlet import Agent
from ringlet.cli import app as cli
from ringlet.server import ServerSettings, create_app
from ringlet.store import SCHEMA_VERSION, Store
from ringlet.testing import FunctionModel
from serving import serving
from test_durable import CONFIG, TOOLS_PY, Upstream, database, ringlet
from test_durable import text as answer

FIXTURE = Path(__file__).parent / "fixtures" / "previous-release"


def _release() -> Any:
    spec = importlib.util.spec_from_file_location("make_release", FIXTURE / "make.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def previous_release_db(tmp_path: Path) -> Path:
    """A SQLite file written by the previous release (`fixtures/previous-release/release.sql`)."""
    path = tmp_path / "release.db"
    with sqlite3.connect(path) as conn:
        conn.executescript((FIXTURE / "release.sql").read_text())
    return path


def test_migrate_is_idempotent_and_says_what_it_did(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    first = CliRunner().invoke(cli, ["migrate", "--db", url])
    assert first.exit_code == 0, first.output
    assert f"applied migration {SCHEMA_VERSION}:" in first.stdout
    assert f"schema at version {SCHEMA_VERSION} (was 0)" in first.stdout
    again = CliRunner().invoke(cli, ["migrate", "--db", url])
    assert again.exit_code == 0
    assert again.stdout.strip() == f"schema at version {SCHEMA_VERSION}: up to date, nothing applied"


def test_migrate_refuses_a_schema_newer_than_it(tmp_path: Path) -> None:
    path = previous_release_db(tmp_path)
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO ringlet_schema VALUES (?, '2099-01-01T00:00:00.000Z')", (SCHEMA_VERSION + 1,))
    refused = CliRunner().invoke(cli, ["migrate", "--db", f"sqlite:///{path}"])
    assert refused.exit_code == 1
    assert f"schema version {SCHEMA_VERSION + 1}, newer than" in refused.output


def test_a_previous_release_database_migrates_and_runs(tmp_path: Path) -> None:
    path = previous_release_db(tmp_path)
    migrated = CliRunner().invoke(cli, ["migrate", "--db", f"sqlite:///{path}"])
    assert migrated.exit_code == 0, migrated.output
    assert f"schema at version {SCHEMA_VERSION}" in migrated.stdout
    seen: list[list[str]] = []

    def reply(request: Any) -> str:
        seen.append([m.text for m in request.messages])
        return "The sum is 7."

    async def main() -> None:
        store = await Store.open(f"sqlite:///{path}")
        app = create_app(ServerSettings(auth_mode="none"), store=store,
                         agents=[Agent(FunctionModel(reply), name="adder")])
        async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=60) as client:
            cid = "c_previous_release"  # the previous release's conversation goes on
            done = await client.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": "And 3 + 4?"},
                                     headers={"Accept": "application/json"})
            assert done.status_code == 200, done.text
            detail = (await client.get(f"/api/v1/chat/conversations/{cid}")).json()
            fresh = (await client.post("/api/v1/chat/conversations", json={"agent": "adder"})).json()["id"]
            again = await client.post(f"/api/v1/chat/conversations/{fresh}/messages", json={"content": "Hi"},
                                      headers={"Accept": "application/json"})
            assert again.status_code == 200, again.text
            runs = (await client.get("/api/v1/runs", params={"conversation_id": cid})).json()
        await store.close()
        texts = [m["content"] if isinstance(m["content"], str) else m["content"][0]["text"]
                 for m in detail["messages"]]
        assert texts == ["What is 2 + 3?", "The sum is 5.", "And 3 + 4?", "The sum is 7."]
        assert {r["id"] for r in runs["data"]} >= {"r_previous_release"}

    asyncio.run(main())
    assert seen[0] == ["What is 2 + 3?", "The sum is 5.", "And 3 + 4?"]  # the model read the old transcript


def test_schema_changes_since_the_previous_release_only_expand(tmp_path: Path) -> None:
    """Expand-then-contract: every table and column of the previous release is still there with its type, and
    every column added to one of its tables is nullable or has a default, so its code keeps writing rows."""
    path = previous_release_db(tmp_path)
    before = _columns(path)
    assert CliRunner().invoke(cli, ["migrate", "--db", f"sqlite:///{path}"]).exit_code == 0
    after = _columns(path)
    for table, columns in before.items():
        assert table in after, f"table {table} was dropped"
        for name, (kind, _, _) in columns.items():
            assert name in after[table], f"column {table}.{name} was dropped"
            assert after[table][name][0] == kind, f"column {table}.{name} changed type"
        for name, (_, nullable, default) in after[table].items():
            if name not in columns:
                assert nullable or default is not None, f"{table}.{name} is added NOT NULL without a default"


def _columns(path: Path) -> dict[str, dict[str, tuple[str, bool, Any]]]:
    engine = create_engine(f"sqlite:///{path}")
    try:
        found = inspect(engine)
        return {table: {c["name"]: (str(c["type"]), c["nullable"], c.get("default")) for c in found.get_columns(table)}
                for table in found.get_table_names()}
    finally:
        engine.dispose()


@pytest.mark.slow
async def test_a_previous_release_process_and_this_one_share_a_database(tmp_path: Path, postgres_url: str) -> None:
    """A rolling upgrade on PostgreSQL: a `ringlet serve` of the previous release (its code from git history)
    runs beside one of this checkout on one database, after `ringlet migrate`; conversations started on either
    go on through the other, every run completes, and each reads the other's events."""
    if not (Path(__file__).parents[1] / ".git").exists():
        pytest.fail("this test needs the repository's git history (a clone, not an exported tree)")
    old_src = _release().source_at(_release().RELEASE, tmp_path / "previous")
    upstream = Upstream(lambda messages: answer("answer ", str(len(messages))))
    async with AsyncExitStack() as stack:
        model_url = await stack.enter_async_context(serving(upstream.app()))
        db = await stack.enter_async_context(database(postgres_url, empty=True))  # the old release makes its schema
        agent = tmp_path / "agents" / "worker"
        agent.mkdir(parents=True)
        (agent / "config.yaml").write_text(CONFIG.format(url=model_url))
        (agent / "tools.py").write_text(TOOLS_PY)
        ports = free_port(), free_port()
        await stack.enter_async_context(ringlet(["serve", "--port", str(ports[0])], db, tmp_path / "agents",
                                                b"Uvicorn running on", PYTHONPATH=str(old_src)))
        migrated = await asyncio.to_thread(CliRunner().invoke, cli, ["migrate", "--db", db])
        assert migrated.exit_code == 0, migrated.output
        await stack.enter_async_context(ringlet(["serve", "--port", str(ports[1])], db, tmp_path / "agents",
                                                b"Uvicorn running on"))
        old, new = [await stack.enter_async_context(httpx.AsyncClient(base_url=f"http://127.0.0.1:{p}", timeout=60))
                    for p in ports]
        assert (await old.get("/metrics")).status_code == 404  # the previous release's code indeed, which had none
        assert (await new.get("/metrics")).status_code == 200
        for first, second in ((old, new), (new, old)):
            cid = (await first.post("/api/v1/chat/conversations", json={"agent": "worker"})).json()["id"]
            for client in (first, second, first):
                done = await client.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": "hi"},
                                         headers={"Accept": "application/json"})
                assert done.status_code == 200, done.text
                assert done.json()["status"] == "completed", done.json()
            for client in (first, second):
                async with client.stream("GET", f"/api/v1/chat/conversations/{cid}/events",
                                         params={"last_event_id": 0}) as events:
                    ends = 0
                    async for line in events.aiter_lines():
                        ends += line == "event: message_end"
                        if ends == 3:
                            break
                assert ends == 3
