"""The OpenAPI document (server-contract.md §9): every route documented, /docs served locally, and
schemathesis, with every check and a real API key, finding no request, response or status that breaks it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute

from ringlet import Agent
from ringlet.server import ServerSettings, create_app
from ringlet.server.app import ROUTERS
from ringlet.store import Store
from ringlet.testing import FunctionModel
from serving import serving

IMPLEMENTED = {  # the contract's routes this version serves (approvals and questions arrive with the gates)
    ("GET", "/api/v1/agents"), ("POST", "/api/v1/stream-tokens"), ("POST", "/api/v1/chat/conversations"),
    ("GET", "/api/v1/chat/conversations"), ("GET", "/api/v1/chat/conversations/{cid}"),
    ("DELETE", "/api/v1/chat/conversations/{cid}"), ("POST", "/api/v1/chat/conversations/{cid}/messages"),
    ("GET", "/api/v1/chat/conversations/{cid}/events"), ("POST", "/api/v1/chat/conversations/{cid}/cancel"),
    ("GET", "/api/v1/chat/conversations/{cid}/context"), ("GET", "/api/v1/runs/{run_id}"),
    ("POST", "/api/v1/triggers"), ("GET", "/api/v1/triggers"), ("GET", "/api/v1/triggers/{trigger_id}"),
    ("PATCH", "/api/v1/triggers/{trigger_id}"), ("DELETE", "/api/v1/triggers/{trigger_id}"),
    ("POST", "/api/v1/triggers/{trigger_id}/fire"), ("GET", "/v1/models"), ("POST", "/v1/chat/completions"),
    ("GET", "/healthz"), ("GET", "/readyz"),
}


def app_of(tmp: Path) -> Any:
    agent = Agent(FunctionModel(lambda request: "ok"), name="echo")
    return create_app(ServerSettings(auth_mode="none", db_url=f"sqlite+aiosqlite:///{tmp / 'r.db'}"), agents=[agent])


def test_every_route_is_documented(tmp_path: Path) -> None:
    app = app_of(tmp_path)
    doc = app.openapi()
    assert doc["openapi"].startswith("3.1")
    documented = {(method.upper(), path) for path, item in doc["paths"].items() for method in item}
    routes = [*app.routes, *(route for router, _ in ROUTERS for route in router.routes)]
    served = {(method, route.path) for route in routes if isinstance(route, APIRoute)
              for method in route.methods if route.path != "/docs"}
    assert served - documented == set()
    assert served >= IMPLEMENTED
    assert doc["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    stream = doc["paths"]["/api/v1/chat/conversations/{cid}/messages"]["post"]["responses"]["200"]["content"]
    events = stream["text/event-stream"]["x-sse-events"]
    assert {"message_start", "content_delta", "tool_result", "message_end", "error", "ping"} <= set(events)
    assert "ErrorBody" in doc["components"]["schemas"]


def test_every_status_a_route_answers_with_is_documented(tmp_path: Path) -> None:
    doc = app_of(tmp_path).openapi()
    messages = doc["paths"]["/api/v1/chat/conversations/{cid}/messages"]["post"]["responses"]
    assert {"200", "400", "401", "403", "404", "409", "413", "422", "429", "5XX"} <= set(messages)
    assert messages["413"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorBody"}
    assert messages["429"]["headers"]["Retry-After"]["required"] is True
    assert messages["401"]["headers"]["WWW-Authenticate"]["required"] is True
    assert set(doc["paths"]["/healthz"]["get"]["responses"]) == {"200", "5XX"}  # no key, no parameters
    completions = doc["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert "422" not in completions  # /v1 answers an invalid request with 400, in OpenAI's shape
    assert completions["413"]["content"]["application/json"]["schema"]["$ref"].endswith("/OpenAIError")
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    responses = [r for item in doc["paths"].values() for op in item.values() for r in op["responses"].values()]
    assert all(r["headers"]["X-Request-Id"] == {"$ref": "#/components/headers/X-Request-Id"} for r in responses)
    parameters = [p for item in doc["paths"].values() for op in item.values() for p in op.get("parameters", [])]
    assert [p["name"] for p in parameters if "null" in json.dumps(p["schema"])] == []  # left out, never null
    request = doc["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert request["n"]["anyOf"][0]["maximum"] == 1
    event = doc["paths"]["/api/v1/chat/conversations/{cid}/events"]["get"]["responses"]["200"]
    assert event["content"]["text/event-stream"]["schema"]["required"] == ["data"]  # each event, not the stream


async def test_a_method_a_path_lacks_gets_405_naming_every_method_it_has(tmp_path: Path) -> None:
    async with serving(app_of(tmp_path)) as url, httpx.AsyncClient(base_url=url) as client:
        for method, path, allowed in (("OPTIONS", "/api/v1/triggers", "GET, POST"),
                                      ("PUT", "/api/v1/triggers/tr_1", "DELETE, GET, PATCH"),
                                      ("POST", "/healthz", "GET")):
            response = await client.request(method, path)
            assert (response.status_code, response.headers["allow"]) == (405, allowed)
            assert response.json()["error"]["code"] == "method_not_allowed"


async def test_requests_are_held_to_their_documented_types(tmp_path: Path) -> None:
    async with serving(app_of(tmp_path)) as url, httpx.AsyncClient(base_url=url, timeout=30) as client:
        cid = (await client.post("/api/v1/chat/conversations", json={"agent": "echo"})).json()["id"]
        for body in ({"content": "hi", "overrides": {"temperature": True}},
                     {"content": "hi", "overrides": {"max_iterations": "5"}}):
            response = await client.post(f"/api/v1/chat/conversations/{cid}/messages", json=body,
                                         headers={"Accept": "application/json"})
            assert response.status_code == 422, response.text
        for params in ({"cursor": "x"}, {"cursor": "²"}):
            assert (await client.get("/api/v1/audit", params=params)).status_code == 422
        assert (await client.get("/api/v1/audit", params={"cursor": ""})).status_code == 200
        trigger = (await client.post("/api/v1/triggers", json={"name": "t", "agent": "echo", "kind": "webhook"})).json()
        changed = await client.patch(f"/api/v1/triggers/{trigger['id']}", json={"name": None})
        assert (changed.status_code, changed.json()["error"]["code"]) == (422, "validation_error")
        completion = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}
        for extra in ({"n": 2}, {"max_tokens": True}, {"stream": "yes"}):
            response = await client.post("/v1/chat/completions", json={**completion, **extra})
            assert (response.status_code, response.json()["error"]["type"]) == (400, "invalid_request_error")
        whole = await client.post("/v1/chat/completions", json={**completion, "n": 1.0, "max_tokens": 64.0})
        assert whole.status_code == 200, whole.text  # JSON Schema's integers include 1.0


async def test_docs_are_served_without_a_cdn(tmp_path: Path) -> None:
    async with serving(app_of(tmp_path)) as url, httpx.AsyncClient(base_url=url) as client:
        page = await client.get("/docs")
        assert page.status_code == 200
        assert "/docs/assets/swagger-ui-bundle.js" in page.text
        assert "cdn" not in page.text.lower()
        script = await client.get("/docs/assets/swagger-ui-bundle.js")
        assert script.status_code == 200
        assert len(script.content) > 100_000
        assert (await client.get("/openapi.json")).json()["info"]["title"] == "ringlet"


# -- schemathesis against a live server --------------------------------------------------------------------

ACCEPTED = ["2xx", "3xx", "401", "403", "404", "409", "429", "5xx"]
"""schemathesis's default for a schema-valid request (`positive_data_acceptance`)."""
CONFIG = """
[generation]  # a NUL character (U+0000) is refused in every request (400): PostgreSQL cannot store one
allow-x00 = false

[parameters]  # the routes of a conversation work on a real one (a generated id only ever finds 404)
cid = "{cid}"

[[operations]]  # deleting it would leave the others nothing to work on
include-name = "DELETE /api/v1/chat/conversations/{{cid}}"
parameters = {{ cid = "{doomed}" }}

[[operations]]  # the stream stays open for live events: read its first (a ping at the latest)
include-name = "GET /api/v1/chat/conversations/{{cid}}/events"
max-stream-events = 1

# Schema-valid requests the server refuses for reasons no schema can state, each on the one status it
# documents for them (schemathesis still checks every other status, and every other check):
[[operations]]  # `cursor` is opaque: only a `next_cursor` this API returned reads as one (400)
include-name = ["GET /api/v1/chat/conversations", "GET /api/v1/runs"]
checks.positive_data_acceptance.expected-statuses = {accepted_400}

[[operations]]  # 422: a cron expression croniter cannot read, a time zone the tz database lacks, or
# `conversation_id` naming a conversation of another agent or realm
include-name = ["POST /api/v1/triggers", "PATCH /api/v1/triggers/{{trigger_id}}"]
checks.positive_data_acceptance.expected-statuses = {accepted_422}

[[operations]]  # 422: `overrides` or `variables` the conversation's agent does not take (its config.yaml)
include-name = "POST /api/v1/chat/conversations/{{cid}}/messages"
checks.positive_data_acceptance.expected-statuses = {accepted_422}
"""


@dataclass(frozen=True)
class Live:
    url: str
    key: str
    """An admin key: every route is reachable."""
    cid: str
    doomed: str
    """A second conversation, for `DELETE`."""


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """The server with API keys on, in its own thread and event loop, as schemathesis calls it synchronously."""
    ready, stop, box = threading.Event(), None, {}
    db_url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('live') / 'r.db'}"

    def run() -> None:
        async def main() -> None:
            nonlocal stop
            stop = asyncio.Event()
            store = await Store.open(db_url)
            key, _ = await store.keys.create("schemathesis", scopes=["chat", "approve", "trigger", "admin"])
            cid, doomed = [(await store.conversations.create(agent="echo")).id for _ in range(2)]
            agent = Agent(FunctionModel(lambda request: "ok"), name="echo")
            settings = ServerSettings(auth_mode="key", db_url=db_url, ping_interval_s=0.5,
                                      rate_limit_per_minute=0)  # no 429s that depend on the clock
            try:
                async with serving(create_app(settings, store=store, agents=[agent])) as url:
                    box["live"] = Live(url, key, cid, doomed)
                    ready.set()
                    await stop.wait()
            finally:
                await store.close()

        loop = asyncio.new_event_loop()
        box["loop"] = loop
        loop.run_until_complete(main())
        loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(30)
    yield box["live"]
    box["loop"].call_soon_threadsafe(stop.set)  # type: ignore[union-attr]
    thread.join(30)


@pytest.mark.slow
def test_schemathesis_finds_no_failure_of_any_check(live: Live, tmp_path: Path) -> None:
    """The schemathesis CLI against the live server, every check on, as an admin key: generated and edge-case
    requests for every route, then sequences of them along the document's links."""
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG.format(cid=live.cid, doomed=live.doomed, accepted_400=json.dumps([*ACCEPTED, "400"]),
                                    accepted_422=json.dumps([*ACCEPTED, "422"])))
    result = subprocess.run(
        [str(Path(sys.executable).with_name("schemathesis")), "--config-file", str(config), "run",
         f"{live.url}/openapi.json", "--checks", "all", "-H", f"Authorization: Bearer {live.key}",
         "--max-examples", "10", "--seed", "1", "--workers", "1", "--request-timeout", "20",
         "--report-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]
    assert "passed" in result.stdout.lower()
