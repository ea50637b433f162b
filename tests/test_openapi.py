"""The OpenAPI document (server-contract.md §9): every route documented, /docs served locally, and
schemathesis finding no 5xx and no response that breaks the schema."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute

from ringlet import Agent
from ringlet.server import ServerSettings, create_app
from ringlet.server.app import ROUTERS
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


@pytest.fixture(scope="module")
def live_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The server in its own thread and event loop, as schemathesis calls it synchronously."""
    ready, stop, box = threading.Event(), None, {}

    def run() -> None:
        async def main() -> None:
            nonlocal stop
            stop = asyncio.Event()
            async with serving(app_of(tmp_path_factory.mktemp("live"))) as url:
                box["url"] = url
                ready.set()
                await stop.wait()

        loop = asyncio.new_event_loop()
        box["loop"] = loop
        loop.run_until_complete(main())
        loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(30)
    yield box["url"]
    box["loop"].call_soon_threadsafe(stop.set)  # type: ignore[union-attr]
    thread.join(30)


@pytest.mark.slow
def test_schemathesis_finds_no_server_error_and_no_schema_violation(live_url: str, tmp_path: Path) -> None:
    """The schemathesis CLI against the live server: generated and edge-case requests for every route."""
    result = subprocess.run(
        [str(Path(sys.executable).with_name("schemathesis")), "run", f"{live_url}/openapi.json",
         "--checks", "not_a_server_error,response_schema_conformance", "--max-examples", "15", "--seed", "1",
         "--request-timeout", "20", "--report-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600, check=False, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert "passed" in result.stdout.lower()
