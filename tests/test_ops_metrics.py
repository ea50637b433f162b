"""`/metrics` (issue 55 §1): Prometheus's text format from the official client, one registry per app, the
`metrics` scope, bounded labels; a worker's own metrics port. On SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ringlet import Agent, tool
from ringlet.server import ServerSettings, create_app
from ringlet.server.ops import METRICS
from ringlet.store import Store
from ringlet.testing import FunctionModel, call
from serving import serving


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@tool
def broken() -> str:
    """Always fails."""
    raise RuntimeError("no")


def adding(request: Any) -> Any:
    if request.messages[-1].role == "tool":
        return "The sum is 5."
    return call("add", a=2, b=3) if "add" in request.messages[-1].text else call("broken")


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a scrape, by name and labels."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(scraped: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return scraped.get((name, frozenset(labels.items())), 0.0)


async def converse(client: httpx.AsyncClient, text: str) -> str:
    """A conversation with one message, followed to its end; its id."""
    created = await client.post("/api/v1/chat/conversations", json={"agent": "adder"})
    cid = created.json()["id"]
    async with client.stream("POST", f"/api/v1/chat/conversations/{cid}/messages",
                             json={"content": text}) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line == "event: message_end":
                break
    return cid


@pytest.fixture
async def served(store: Store) -> AsyncIterator[tuple[str, Store]]:
    agent = Agent(FunctionModel(adding), name="adder", tools=[add, broken])
    async with serving(create_app(ServerSettings(), store=store, agents=[agent])) as url:
        yield url, store


async def test_metrics_count_a_conversation_with_bounded_labels(served: tuple[str, Store]) -> None:
    url, store = served
    chat, _ = await store.keys.create("c", scopes=["chat"])
    scraper, _ = await store.keys.create("prometheus", scopes=["metrics"])
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {chat}"}, timeout=60) as client:
        ids = [await converse(client, "add 2 and 3"), await converse(client, "try the broken tool")]
        assert (await client.get("/metrics")).status_code == 403  # chat's key lacks the scope
        assert (await client.get("/metrics", headers={"Authorization": ""})).status_code == 401
        response = await client.get("/metrics", headers={"Authorization": f"Bearer {scraper}"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    text = response.text
    for cid in ids:  # no label names a conversation (nor its run)
        assert cid not in text
    assert "run_" not in text.replace("ringlet_run", "")
    scraped = samples(text)
    assert value(scraped, "ringlet_runs_started_total", agent="adder", kind="loop") == 2
    assert value(scraped, "ringlet_runs_ended_total", agent="adder", outcome="completed") == 2
    assert value(scraped, "ringlet_tool_call_seconds_count", tool="add") == 1
    assert value(scraped, "ringlet_tool_call_errors_total", tool="add") == 0
    assert value(scraped, "ringlet_tool_call_errors_total", tool="broken") == 1
    model = next(dict(labels)["model"] for name, labels in scraped if name == "ringlet_model_request_seconds_count")
    assert value(scraped, "ringlet_model_request_seconds_count", model=model) == 4  # two rounds a run
    assert value(scraped, "ringlet_model_tokens_total", model=model, direction="in") > 0
    assert value(scraped, "ringlet_event_log_write_seconds_count") > 0
    assert value(scraped, "ringlet_runs_in_flight") == 0
    assert value(scraped, "ringlet_pauses_waiting") == 0
    assert value(scraped, "ringlet_open_streams") == 0
    route = "/api/v1/chat/conversations/{cid}/messages"
    assert value(scraped, "ringlet_http_request_seconds_count", method="POST", route=route, status="200") == 2
    assert value(scraped, "ringlet_http_request_seconds_count", method="GET", route="/metrics", status="403") == 1
    families = {family.name for family in text_string_to_metric_families(text)}
    assert families >= {spec.name.removesuffix("_total") for spec in METRICS}  # every metric the docs list


async def test_each_app_has_its_own_registry(tmp_path: Path) -> None:
    """Two apps in one process: neither clashes with the other, and each counts only its own requests."""
    store = await Store.open(f"sqlite:///{tmp_path / 'ringlet.db'}")
    apps = [create_app(ServerSettings(auth_mode="none"), store=store, agents=[]) for _ in range(2)]
    assert apps[0].state.metrics.registry is not apps[1].state.metrics.registry
    async with serving(apps[0]) as first, serving(apps[1]) as second, httpx.AsyncClient() as client:
        for _ in range(3):
            await client.get(f"{first}/healthz")
        scraped = [samples((await client.get(f"{u}/metrics")).text) for u in (first, second)]
    assert value(scraped[0], "ringlet_http_request_seconds_count", method="GET", route="/healthz", status="200") == 3
    assert value(scraped[1], "ringlet_http_request_seconds_count", method="GET", route="/healthz", status="200") == 0
    await store.close()


def test_the_metrics_reference_lists_every_metric() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_reference", Path(__file__).parents[1] / "docs" /
                                                  "gen_reference.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    page = module.metrics_page()
    assert all(f"| `{m.name}` | {m.kind}" in page and m.help.split()[0] in page for m in METRICS)
    assert "reference/metrics.md" in module.PAGES


async def test_a_dead_process_s_run_closed_at_startup_counts_as_a_recovery(tmp_path: Path) -> None:
    """A run left working by a process that died (its lease long expired) is closed as the server starts: a
    recovery, counted, and an ended run."""
    store = await Store.open(f"sqlite:///{tmp_path / 'ringlet.db'}")
    conversation = await store.conversations.create(agent="adder")
    await store.runs.create("r_dead", agent="adder", conversation_id=conversation.id,
                            lease_owner="proc_gone@elsewhere:1", lease_expires_at="2000-01-01T00:00:00.000Z")
    agent = Agent(FunctionModel(adding), name="adder", tools=[add])
    async with serving(create_app(ServerSettings(auth_mode="none"), store=store, agents=[agent])) as url, \
            httpx.AsyncClient(base_url=url) as client:
        scraped = samples((await client.get("/metrics")).text)
        record = (await client.get("/api/v1/runs/r_dead")).json()
    await store.close()
    assert record["status"] != "working"
    assert value(scraped, "ringlet_run_recoveries_total", engine="local") == 1
    assert value(scraped, "ringlet_runs_ended_total", agent="adder", outcome=record["status"]) == 1
