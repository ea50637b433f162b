"""Several processes opening one fresh database at once (issue 25): migrations run under a lock every
process honours, exactly once each, on SQLite and PostgreSQL; a schema newer than ringlet is refused."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from ringlet.store import SCHEMA_VERSION, Store

PROCESSES = 8
OPEN_AND_WRITE = """
import asyncio, json, sys
from ringlet.store import Store

async def main(url: str) -> None:
    print("ready", flush=True)
    sys.stdin.readline()  # every process is started and imported: all open the database at once
    store = await Store.open(url)
    await store.conversations.create(agent="probe")
    print(json.dumps({"applied": store.applied}), flush=True)
    await store.close()

asyncio.run(main(sys.argv[1]))
"""


@pytest.fixture(params=["sqlite", "postgresql"])
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of a database nobody has opened yet."""
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'fresh.db'}"
        return
    server = request.getfixturevalue("postgres_url")
    name = "fresh_" + uuid.uuid4().hex[:12]
    import asyncpg

    dsn = server.replace("postgresql+asyncpg", "postgresql")

    async def admin(sql: str) -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(admin(f"CREATE DATABASE {name}"))
    yield server.rsplit("/", 1)[0] + "/" + name
    asyncio.run(admin(f"DROP DATABASE {name} WITH (FORCE)"))


@pytest.mark.slow
def test_processes_starting_together_migrate_once(fresh_url: str) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", OPEN_AND_WRITE, fresh_url], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(PROCESSES)]
    try:
        for proc in procs:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outcomes = [proc.communicate(timeout=120) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    failures = [err for proc, (_, err) in zip(procs, outcomes, strict=True) if proc.returncode != 0]
    assert failures == []
    applied = [v for out, _ in outcomes for v in json.loads(out.strip().splitlines()[-1])["applied"]]
    assert sorted(applied) == list(range(1, SCHEMA_VERSION + 1))  # each migration ran once, in one process

    async def check() -> tuple[list[int], int]:
        store = await Store.open(fresh_url)
        try:
            async with store.engine.connect() as conn:
                versions = [r[0] for r in await conn.execute(text("SELECT version FROM ringlet_schema "
                                                                  "ORDER BY version"))]
                probes = (await conn.execute(text("SELECT count(*) FROM conversations"))).scalar_one()
            return versions, probes
        finally:
            await store.close()

    versions, probes = asyncio.run(check())
    assert versions == list(range(1, SCHEMA_VERSION + 1))
    assert probes == PROCESSES  # every process's write landed


def test_a_newer_schema_is_refused_naming_both_versions(fresh_url: str) -> None:
    async def from_the_future() -> None:  # a later release contracted the schema (dropped what we read)
        store = await Store.open(fresh_url)
        async with store.engine.begin() as conn:
            await conn.execute(text("INSERT INTO ringlet_schema (version, applied_at, oldest_reader) "
                                    "VALUES (:v, 'later', :v)"), {"v": SCHEMA_VERSION + 5})
        await store.close()

    asyncio.run(from_the_future())
    ringlet = Path(sys.executable).with_name("ringlet")
    done = subprocess.run([str(ringlet), "keys", "list", "--db", fresh_url], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode != 0
    message = " ".join((done.stderr + done.stdout).split())
    assert f"schema version {SCHEMA_VERSION + 5}, newer than this ringlet's {SCHEMA_VERSION}" in message
    assert f"needs schema {SCHEMA_VERSION + 5} or later" in message
    assert "upgrade ringlet" in message


def test_a_newer_schema_that_only_expanded_is_opened(fresh_url: str) -> None:
    """A rolling upgrade's older process, restarted after `ringlet migrate` applied a later release's
    expand-only migration: it opens the database and works on it."""
    async def expanded() -> list[str]:
        store = await Store.open(fresh_url)
        async with store.engine.begin() as conn:
            await conn.execute(text("INSERT INTO ringlet_schema (version, applied_at, oldest_reader) "
                                    "VALUES (:v, 'later', 1)"), {"v": SCHEMA_VERSION + 1})
        await store.close()
        again = await Store.open(fresh_url)
        try:
            await again.keys.create("after")
            return [k.name for k in await again.keys.list()]
        finally:
            await again.close()

    assert asyncio.run(expanded()) == ["after"]

def test_version_11_brings_an_older_schema_to_firing_on_dbos(fresh_url: str) -> None:
    """A database a ringlet of schema 10 left (schedules and cron triggers without their firing columns, no
    `/v1` continuations) is migrated once: a schedule gets its wake-up slot 0, continuations are stored."""

    async def older_then_current() -> tuple[list[int], dict[str, object], list[dict[str, object]] | None]:
        store = await Store.open(fresh_url)
        conversation = await store.conversations.create(agent="a")
        book = store.schedules.book(conversation.id, agent="a")
        made = await book.create("at", {"at": "2030-01-01T00:00:00Z", "timezone": "UTC"}, "m",
                                 "2030-01-01T00:00:00.000Z")
        assert made is not None
        async with store.engine.begin() as conn:  # as schema 10 had them
            for table, column in (("schedules", "slot"), ("schedules", "firing"), ("triggers", "firing")):
                await conn.execute(text(f"ALTER TABLE {table} DROP COLUMN {column}"))
            await conn.execute(text("DROP TABLE continuations"))
            await conn.execute(text("DELETE FROM ringlet_schema WHERE version >= 11"))
        await store.close()
        store = await Store.open(fresh_url)
        try:
            schedule = await store.schedules.get(made.schedule_id)
            await store.continuations.keep("r_1", key_id="k", agent="a", messages=[{"role": "user"}],
                                           expires_at="2999-01-01T00:00:00.000Z")
            taken = await store.continuations.take("r_1", key_id="k", agent="a")
            assert await store.continuations.take("r_1", key_id="k", agent="a") is None  # taken once
            return store.applied, schedule, taken
        finally:
            await store.close()

    applied, schedule, taken = asyncio.run(older_then_current())
    assert applied == list(range(11, SCHEMA_VERSION + 1))
    assert schedule is not None
    assert (schedule.slot, schedule.firing, schedule.status) == (0, None, "active")
    assert taken == [{"role": "user"}]
