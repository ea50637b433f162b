"""The ASGI app: `create_app()` wires the store, the hosted agents and the routes; `serve()` runs it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from types import FrameType
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from sqlalchemy import text

from ringlet.agent import Agent
from ringlet.errors import ConfigError
from ringlet.gates import PolicyGate, PolicySet
from ringlet.logs import configure as configure_logs
from ringlet.server import ops
from ringlet.server.catalog import Catalog
from ringlet.server.durable.feed import Feed
from ringlet.server.firing import schedules, triggers
from ringlet.server.firing.fires import Firing
from ringlet.server.http import errors, sse
from ringlet.server.http.drain import Drain, DrainMiddleware
from ringlet.server.http.schemas import Health
from ringlet.server.http.settings import ServerSettings
from ringlet.server.protocols import (
    agui,
    aisdk,
    approvals,
    audit,
    chat,
    checkpoints,
    connections,
    evals,
    forks,
    openai,
    replays,
    tool_calls,
)
from ringlet.server.runs.runner import Runner
from ringlet.server.runs.service import Runs
from ringlet.store import Store

log = logging.getLogger("ringlet.server")
ROUTERS = ((chat.router, "conversations"), (forks.router, "conversations"), (approvals.router, "approvals"),
           (triggers.router, "triggers"), (audit.router, "audit"), (openai.router, "openai"),
           (tool_calls.router, "tool-calls"), (agui.router, "AG-UI"), (aisdk.router, "AI SDK"),
           (evals.router, "evals"),
           (replays.router, "runs"), (checkpoints.router, "runs"), (connections.router, "mcp"))


@dataclass(eq=False)
class AppState:
    settings: ServerSettings
    store: Store
    runner: Runner
    """The run machinery's parts, wired once (`runs/runner.py`)."""
    runs: Runs
    """The runs service the protocols and firing call (`runs/service.py`)."""
    firing: Firing
    """What starts runs by itself: cron triggers, webhook fires, agents' schedules (`firing.py`)."""
    policy: PolicyGate
    drain: Drain
    """Set once the process stops (SIGTERM): it is no longer ready, and what runs here has until its deadline."""
    durable: bool = False
    """Whether runs execute as DBOS workflows (`durable/executor.py`), else in process."""
    ready: bool = False

    def reload_policies(self) -> bool:
        """Reload `policy.paths` (on SIGHUP): the whole set is swapped at once, and a set that fails to
        load is rejected with the previous one still active."""
        try:
            loaded = self.policy.reload(self.settings.policy_paths)
        except ConfigError as exc:
            log.warning("policy reload rejected, the previous policies stay active: %s", exc)
            return False
        log.warning("policies reloaded: %d package(s), set %s", len(loaded.packages), loaded.hash)
        return True


def create_app(settings: ServerSettings | None = None, *, store: Store | None = None,
               agents: Iterable[Agent] | Catalog | None = None) -> FastAPI:
    """The server app. Without `store` it opens `settings.db_url`; without `agents` it hosts the agents
    found in `settings.agents_dir` (and the built-in ones)."""
    settings = settings or ServerSettings()
    settings.check()
    policies = PolicySet.load(settings.policy_paths)  # a bad policy file stops the server here

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        own_store = store is None
        opened = store or await Store.open(settings.db_url)
        catalog = agents if isinstance(agents, Catalog) else (
            Catalog.of(agents) if agents is not None else Catalog.from_dir(settings.agents_dir))
        policy = catalog.serve_on(opened, settings, policies)
        connections.install(app, catalog, settings, opened)  # users connect MCP servers behind OAuth here
        runner = Runner(opened, catalog, settings)
        feed, durable = await _shared(app, runner)
        firing = Firing(runner.runs, opened, shared=durable)
        state = app.state.ringlet = AppState(settings, opened, runner, runner.runs, firing, policy,
                                             app.state.drain, durable=durable)
        metrics = asyncio.create_task(app.state.metrics.watching(state), name="ringlet-metrics")  # before recovery
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not on every platform/thread
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, state.reload_policies)
        await runner.recovery.recover()
        await runner.pauses.expire_due()  # approvals that expired while no server ran, before serving
        schedules.watch(firing)  # changes of schedules wake them from now on
        # DBOS for firing (on SQLite, only once anything fires), or the engine's; then fires left pending go on,
        # cron triggers get their schedules (and slots missed while no server ran), schedules their wake-ups
        await firing.open(triggers.restore, schedules.restore)
        background = [asyncio.create_task(runner.recovery.upkeep(), name="ringlet-upkeep"), metrics]
        state.ready = True
        try:
            yield
        finally:
            state.ready = False
            await _stopping(state, background)
            await firing.stop()  # the fires in progress here stay pending: they go on elsewhere, or later
            await runner.here.executor.close()  # durable: its runs go on in other processes
            if feed is not None:
                await feed.close()
            await runner.close()
            await firing.close()
            if own_store:
                await opened.close()

    app = FastAPI(title="ringlet", version=_version(), lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="Agents over HTTP: conversations with SSE streams, an OpenAI-compatible API and "
                              "triggers. Every route but /healthz, /readyz, /openapi.json and /docs takes "
                              "`Authorization: Bearer <API key>`.")
    errors.install(app)
    app.state.drain = Drain()
    app.add_middleware(errors.BodyLimitMiddleware, limit=settings.max_body_bytes)
    app.add_middleware(DrainMiddleware, drain=app.state.drain)  # (`serve` and `work` start it: SIGTERM)
    app.add_middleware(errors.RequestIdMiddleware)
    for router, tag in ROUTERS:
        app.include_router(router, tags=[tag])
    _meta_routes(app)
    from ringlet.server.protocols import a2a

    a2a.install(app)  # A2A: every agent's card and JSON-RPC endpoint under /a2a/{agent}
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


async def _stopping(state: AppState, background: list[asyncio.Task[None]]) -> None:
    """The first steps of stopping: no more policy reloads; when stopped by SIGTERM, the runs executing here
    finish within the drain's deadline (or go on in another worker); then the background tasks stop (only
    then: they renew the leases of the runs executing here)."""
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
    if state.drain.draining:
        await state.runner.here.executor.drain(state.drain.left())
    for task in background:
        task.cancel()
    await asyncio.gather(*background, return_exceptions=True)


async def _shared(app: FastAPI, runner: Runner) -> tuple[Feed | None, bool]:
    """On PostgreSQL, what lets processes share the work: other processes' events, live in this one's
    streams (`durable/feed.py`, started before any stream subscribes); and, when runs are durable, their
    executor (`durable/executor.py`: DBOS, imported only then). The feed (None on SQLite), and whether runs
    are durable."""
    store, settings = runner.store, runner.settings
    if store.engine.dialect.name != "postgresql":
        settings.durable("sqlite")  # engine 'dbos' without PostgreSQL: a ConfigError saying so
        return None, False
    feed = Feed(store, runner.here.hub)
    app.state.connections.listen(feed)  # MCP OAuth callbacks that reached another process
    durable = None
    if settings.durable("postgresql"):  # the one place that chooses how runs execute
        from ringlet.server.durable.executor import DbosExecutor

        durable = DbosExecutor(runner, url=settings.engine_url, feed=feed,
                               role=getattr(app.state, "role", "serve") if settings.worker else "api")
        runner.use(durable)
    await feed.start()
    if durable is not None:
        await durable.open()
    return feed, durable is not None


def _meta_routes(app: FastAPI) -> None:
    from swagger_ui_bundle import swagger_ui_path

    from ringlet.server import webui

    app.mount("/docs/assets", StaticFiles(directory=swagger_ui_path), name="docs-assets")
    webui.install(app)  # the web UI at / (static files of the public API's reference client)
    ops.install(app)  # /metrics, the admin status route, HTTP requests' latency

    @app.get("/healthz", response_model=Health, tags=["meta"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/livez", response_model=Health, tags=["meta"])
    async def livez() -> dict[str, str]:
        """The process lives (a liveness probe): 200 while it drains too, so it is not killed mid-drain."""
        return {"status": "ok"}

    @app.get("/readyz", response_model=Health, tags=["meta"], responses={503: {"model": Health}})
    async def readyz(request: Request) -> Any:
        state: AppState | None = getattr(request.app.state, "ringlet", None)
        if request.app.state.drain.draining:
            return JSONResponse({"status": "draining"}, 503)
        if state is None or not state.ready:
            return JSONResponse({"status": "starting"}, 503)
        try:
            async with state.store.engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
            writable = await state.store.db.probe()  # after a failed write: do writes succeed again?
        except Exception as exc:
            log.warning("readiness check: storage unreachable: %s", exc)
            return JSONResponse({"status": "storage unreachable"}, 503)
        if not writable:
            return JSONResponse({"status": "storage unavailable"}, 503)
        return {"status": "ready"}

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title="ringlet API",
                                   swagger_js_url="/docs/assets/swagger-ui-bundle.js",
                                   swagger_css_url="/docs/assets/swagger-ui.css",
                                   swagger_favicon_url="/docs/assets/favicon-32x32.png")


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document, plus the responses every route gets from the app's layers (`errors.document`) and
    one schema per SSE event under `x-sse-events` on every stream response of the native API."""
    if app.openapi_schema:
        return app.openapi_schema
    from fastapi.openapi.utils import get_openapi

    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    agui.document(doc)
    errors.document(doc)
    _parameters_not_null(doc)
    events = _event_schemas()
    for route, path in doc["paths"].items():
        if not route.startswith("/api/"):
            continue  # /v1 streams OpenAI's chunks, not these events
        for operation in path.values():
            for response in operation.get("responses", {}).values():
                if "text/event-stream" in response.get("content", {}):
                    response["content"]["text/event-stream"]["x-sse-events"] = events
    app.openapi_schema = doc
    return doc


def _parameters_not_null(doc: dict[str, Any]) -> None:
    """An optional parameter is left out, never null (a query string or header has no null): drop the `null`
    that FastAPI documents for a parameter typed `X | None`, which a client could only send as the text "null"."""
    for path in doc["paths"].values():
        for operation in path.values():
            for parameter in operation.get("parameters", []):
                schema = parameter["schema"]
                kept = [branch for branch in schema.get("anyOf", ()) if branch != {"type": "null"}]
                if len(kept) == 1:
                    del schema["anyOf"]
                    schema.update(kept[0])


def _event_schemas() -> dict[str, Any]:
    import typing

    from pydantic import TypeAdapter

    from ringlet import events

    union = typing.get_args(typing.get_args(events.Event)[0])
    return {cls.__dataclass_fields__["type"].default: TypeAdapter(cls).json_schema(mode="serialization")
            for cls in union}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ringlet")
    except PackageNotFoundError:
        return "0"


def serve(settings: ServerSettings) -> None:
    """Run the server with uvicorn until interrupted."""
    import uvicorn

    settings.check()
    configure_logs(settings.log_format, settings.log_level)
    app = create_app(settings)
    metrics = _metrics_port(app, settings)

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            """Stopping drains (`http/drain.py`): not ready, new requests refused with 503, the open event
            streams ended (their clients reconnect elsewhere with `Last-Event-ID`), so that the requests
            still in flight, then the runs executing here, are what the shutdown waits for (`drain_s`)."""
            app.state.drain.start(settings.drain_s)
            super().handle_exit(sig, frame)
            with contextlib.suppress(RuntimeError):  # the loop is not running yet
                asyncio.get_running_loop().call_soon_threadsafe(sse.close_all)

    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_config=None,
                            timeout_graceful_shutdown=max(1, round(settings.drain_s)))
    try:
        Server(config).run()
    finally:
        if metrics is not None:
            metrics.shutdown()


def _metrics_port(app: FastAPI, settings: ServerSettings) -> Any:
    """`/metrics` on `metrics_port` too, when set (prometheus-client's server); None otherwise."""
    if settings.metrics_port is None:
        return None
    server = ops.serve_metrics(app.state.metrics, settings.metrics_host, settings.metrics_port)
    log.info("metrics at http://%s:%d/metrics", settings.metrics_host, server.server_port)
    return server


def work(settings: ServerSettings) -> None:
    """Execute runs without serving the API (`ringlet worker`) until SIGINT or SIGTERM; the runs this process
    was executing then go on in another one."""

    async def main() -> None:
        app = create_app(settings)
        app.state.role = "worker"
        stop = asyncio.Event()

        def stopping() -> None:  # drains: the runs executing here have `drain_s` to finish (`Engine.drain`)
            app.state.drain.start(settings.drain_s)
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, stopping)
        async with app.router.lifespan_context(app):
            runner = app.state.ringlet.runner
            if not app.state.ringlet.durable:
                raise ConfigError("ringlet worker needs runs on the engine: a PostgreSQL store (RINGLET_DB_URL="
                                  "postgresql://…) and engine 'dbos' or 'auto'")
            metrics = _metrics_port(app, settings)
            log.info("worker %s ready: executing runs from the queue", runner.here.owner)
            try:
                await stop.wait()
            finally:
                if metrics is not None:
                    metrics.shutdown()
        log.info("worker stopped; the runs it was still executing go on in another process")

    settings.check()
    configure_logs(settings.log_format, settings.log_level)
    asyncio.run(main())
