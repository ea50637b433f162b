"""`ringlet status` and `GET /api/v1/admin/status` (issue 55 §5) on SQLite and PostgreSQL; a worker's `/metrics`
on its own port (§1), in a cluster of real processes on PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import insert, text
from typer.testing import CliRunner

from processes import free_port
from ringlet._ids import at, now
from ringlet.cli import app as cli
from ringlet.server import ServerSettings, create_app
from ringlet.store import SCHEMA_VERSION, Store
from ringlet.store.schema import approvals, conversations, runs
from serving import serving
from test_durable import CONFIG, TOOLS_PY, Upstream, database, ringlet
from test_durable import text as answer


async def _cluster_facts(store: Store) -> None:
    """A working run, two approvals waiting (one for an hour), and a live worker's beat."""
    stamp = now()
    async with store.engine.begin() as conn:
        await conn.execute(insert(conversations).values(id="c_1", agent="a", created_at=stamp, updated_at=stamp))
        await conn.execute(insert(runs).values(id="run_1", conversation_id="c_1", agent="a", status="working",
                                               started_at=stamp))
        for approval_id, requested in (("ap_old", at(time.time() - 3600)), ("ap_new", stamp)):
            await conn.execute(insert(approvals).values(
                approval_id=approval_id, run_id="run_1", tool_call_id=approval_id, tool="t", args={},
                effect="write", reason="r", requested_at=requested, expires_at=at(time.time() + 7200), timeout_s=7200,
                status="pending"))
        clock = "EXTRACT(EPOCH FROM clock_timestamp())" if conn.dialect.name == "postgresql" else \
            "((julianday('now') - 2440587.5) * 86400.0)"
        await conn.execute(text(f"INSERT INTO workers (id, role, started_at, seen_at) VALUES "
                                f"('proc_live@h:1', 'worker', :s, {clock} - 2), ('proc_gone@h:2', 'worker', :s, 0)"),
                           {"s": stamp})


def _check(found: dict[str, Any]) -> None:
    assert found["schema_version"] == SCHEMA_VERSION
    assert found["runs_in_flight"] == 1
    assert found["pauses_waiting"] == 2
    assert found["oldest_pause_id"] == "ap_old"
    assert 3500 < found["oldest_pause_s"] < 3700
    live = {w["id"]: w for w in found["workers"]}  # (on PostgreSQL, a server process beats too)
    assert "proc_gone@h:2" not in live  # a retired worker (beat 0) is not live
    assert 1.5 < live["proc_live@h:1"]["last_beat_s"] < 60


async def test_status_from_the_cli_and_the_admin_route(store: Store) -> None:
    await _cluster_facts(store)
    url = store.engine.url.render_as_string(hide_password=False)
    result = await asyncio.to_thread(CliRunner().invoke, cli, ["status", "--db", url, "--json"])
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)
    _check(found)
    assert found["queues"] == []  # nothing enqueued in DBOS (PostgreSQL); SQLite's queue is per process
    shown = await asyncio.to_thread(CliRunner().invoke, cli, ["status", "--db", url])
    assert "oldest waiting approval: ap_old" in shown.stdout
    assert "proc_live@h:1" in shown.stdout
    async with serving(create_app(ServerSettings(), store=store, agents=[])) as base:
        admin, _ = await store.keys.create("admin", scopes=["admin"])
        chat, _ = await store.keys.create("chat", scopes=["chat"])
        async with httpx.AsyncClient(base_url=base) as client:
            refused = await client.get("/api/v1/admin/status", headers={"Authorization": f"Bearer {chat}"})
            assert refused.status_code == 403
            response = await client.get("/api/v1/admin/status", headers={"Authorization": f"Bearer {admin}"})
    assert response.status_code == 200
    _check(response.json())
    if store.engine.dialect.name == "sqlite":  # this process's own queue of runs waiting for a slot
        assert response.json()["queues"] == [{"name": "local", "depth": 0, "oldest_s": None}]


def _scrape(body: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(body) for s in family.samples}


@pytest.mark.slow
async def test_a_worker_serves_metrics_on_its_own_port(tmp_path: Path, postgres_url: str) -> None:
    """An API process and a worker on PostgreSQL: the worker, which serves no API, is scraped on its metrics
    port; the run it executed is counted there, and the cluster's gauges are read from the store and DBOS."""
    upstream = Upstream(lambda messages: answer("all ", "done"))
    async with AsyncExitStack() as stack:
        model_url = await stack.enter_async_context(serving(upstream.app()))
        db = await stack.enter_async_context(database(postgres_url))
        agent = tmp_path / "agents" / "worker"
        agent.mkdir(parents=True)
        (agent / "config.yaml").write_text(CONFIG.format(url=model_url))
        (agent / "tools.py").write_text(TOOLS_PY)
        port, metrics_port = free_port(), free_port()
        await stack.enter_async_context(ringlet(["serve", "--no-worker", "--port", str(port)], db,
                                                tmp_path / "agents", b"Uvicorn running on"))
        await stack.enter_async_context(ringlet(["worker", "--metrics-port", str(metrics_port)], db,
                                                tmp_path / "agents", b"ready"))
        client = await stack.enter_async_context(httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60))
        cid = (await client.post("/api/v1/chat/conversations", json={"agent": "worker"})).json()["id"]
        ended = await client.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": "hi"},
                                  headers={"Accept": "application/json"})
        assert ended.status_code == 200, ended.text
        worker = _scrape((await client.get(f"http://127.0.0.1:{metrics_port}/metrics")).text)
        api = _scrape((await client.get("/metrics")).text)  # development mode: principal local has the scope
    assert worker[("ringlet_runs_ended_total", frozenset({("agent", "worker"), ("outcome", "completed")}))] == 1
    assert worker[("ringlet_model_request_seconds_count", frozenset({("model", "openai:m")}))] == 1
    assert worker[("ringlet_runs_in_flight", frozenset())] == 0
    assert api[("ringlet_runs_started_total", frozenset({("agent", "worker"), ("kind", "loop")}))] == 1
    assert ("ringlet_runs_ended_total", frozenset({("agent", "worker"), ("outcome", "completed")})) not in api
