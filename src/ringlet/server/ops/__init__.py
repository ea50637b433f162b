"""Operating the server: `/metrics` (Prometheus), the admin status route, and the metrics port of processes
that serve no API (`ringlet worker`).

    install(app)          the routes and the HTTP latency middleware, and `app.state.metrics`
    serve_metrics(...)    prometheus-client's own HTTP server for `/metrics`, on `metrics_port`

`/metrics` on the API needs a key with the `metrics` scope (a scraper's key needs nothing else); the metrics
port serves it without a key, so bind it where only the scraper reaches (`metrics_host`, loopback by default).
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ringlet import logs
from ringlet.server.http.auth import Principal, need
from ringlet.server.http.errors import ApiError, request_id
from ringlet.server.ops import status
from ringlet.server.ops.metrics import METRICS, Metrics, queues_of

__all__ = ["METRICS", "Metrics", "install", "serve_metrics"]

logs.FIELDS["request_id"] = request_id  # JSON log lines of a request carry its X-Request-Id


class Middleware:
    """Each HTTP request's latency until its response starts, by method, route template and status."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started, observed = time.perf_counter(), False

        async def timed(message: Message) -> None:
            nonlocal observed
            if message["type"] == "http.response.start" and not observed:
                observed = True
                self.metrics.http(scope["method"], _template(scope), message["status"],
                                  time.perf_counter() - started)
            await send(message)

        await self.app(scope, receive, timed)


def _template(scope: Scope) -> str:
    """The route's path template (`/api/v1/chat/conversations/{conversation_id}`), never the path itself: a
    path with ids would make a label per conversation. A mounted app (the web UI's files) is its mount."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    if path:
        return path
    root = scope.get("root_path", "")
    return root or "unmatched"


def install(app: FastAPI) -> None:
    """`/metrics`, `GET /api/v1/admin/status` and the latency middleware; the registry is `app.state.metrics`."""
    metrics = app.state.metrics = Metrics()
    app.add_middleware(Middleware, metrics=metrics)

    @app.get("/metrics", tags=["operations"], response_class=Response,
             responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text format."}})
    async def scrape(principal: Annotated[Principal, Depends(need("metrics"))]) -> Response:
        """This process's metrics, in Prometheus's text format (`metrics` scope)."""
        del principal
        await metrics.cluster.refresh()
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/api/v1/admin/status", tags=["operations"], response_model=status.ClusterStatus)
    async def cluster_status(request: Request,
                             principal: Annotated[Principal, Depends(need("admin"))]) -> status.ClusterStatus:
        """The cluster's live workers and their last beat, its queues and their depth, the runs in flight,
        the oldest waiting approval and the schema version (`admin` scope)."""
        del principal
        state = getattr(request.app.state, "ringlet", None)
        if state is None:
            raise ApiError(503, "unavailable", "the server is starting; ask again once /readyz says ready")
        return await status.read(state.store, queues=await queues_of(state))


def serve_metrics(metrics: Metrics, host: str, port: int) -> Any:
    """Serve `/metrics` on `host:port` with prometheus-client's own server (a thread); returns the server,
    whose `shutdown()` stops it."""
    from prometheus_client import start_http_server

    server, _ = start_http_server(port, addr=host, registry=metrics.registry)
    return server
