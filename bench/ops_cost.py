"""What metrics and JSON logs cost per conversation, side by side with them off, in one process.

One SQLite store, one server app per round (real uvicorn on loopback), an agent whose scripted model calls a
tool, then answers (two model requests, one tool call: every counter and histogram is touched). Each round drives
`--n` conversations (`--c` at once), each created, then sent one message whose outcome is awaited (`Accept:
application/json`), then scrapes `/metrics` once. The modes run interleaved, round after round:

    off       no metrics: the telemetry subscriber and the HTTP middleware switched off (text logs)
    metrics   /metrics as shipped (text logs)
    +json     /metrics, and JSON logs (RINGLET_LOG_FORMAT=json) at INFO

Prints, per mode, the medians over `--runs` rounds of the process's CPU time per conversation (client and server
share the process, the same in every mode) and the wall time per conversation, and each mode's difference from
`off`. That difference is smaller than a loaded machine's noise, so it also prints the instruments' own cost,
measured precisely: the telemetry events and HTTP observations one conversation produced (recorded in a round),
replayed into a `Metrics` 2,000 times; a `/metrics` scrape; and the log lines a conversation writes at INFO,
with the JSON formatter's cost per line. Run: `.venv/bin/python bench/ops_cost.py [--n 300] [--c 10] [--runs 5]`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import socket
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from prometheus_client import generate_latest

from ringlet import Agent, logs, telemetry, tool
from ringlet.server import ServerSettings, create_app
from ringlet.server.ops import Middleware
from ringlet.server.ops import metrics as ops_metrics
from ringlet.store import Store
from ringlet.testing import FunctionModel, call


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def adding(request: Any) -> Any:
    return "The sum is 5." if request.messages[-1].role == "tool" else call("add", a=2, b=3)


@contextlib.contextmanager
def metrics_off() -> Iterator[None]:
    """No telemetry subscriber, no HTTP timing: what a ringlet without metrics does."""
    watching, call_ = ops_metrics.Metrics.watching, Middleware.__call__

    def idle(self: Any, state: Any) -> Any:
        return asyncio.Future()

    async def through(self: Any, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)

    ops_metrics.Metrics.watching, Middleware.__call__ = idle, through  # type: ignore[method-assign]
    try:
        yield
    finally:
        ops_metrics.Metrics.watching, Middleware.__call__ = watching, call_  # type: ignore[method-assign]


@contextlib.contextmanager
def log_format(form: str) -> Iterator[None]:
    with open(os.devnull, "w") as sink:
        handler = logs.configure(form, "INFO")
        handler.setStream(sink)  # type: ignore[attr-defined]
        try:
            yield
        finally:
            logging.getLogger().removeHandler(handler)


@contextlib.asynccontextmanager
async def served(app: Any) -> AsyncIterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    started = asyncio.Event()

    async def app_started(scope: Any, receive: Any, send: Any) -> None:
        async def sending(message: Any) -> None:
            await send(message)
            if message["type"] in ("lifespan.startup.complete", "lifespan.startup.failed"):
                started.set()

        await app(scope, receive, sending if scope["type"] == "lifespan" else send)

    server = uvicorn.Server(uvicorn.Config(app_started, log_config=None, lifespan="on"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    await started.wait()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task


async def round_(store: Store, mode: str, n: int, c: int) -> tuple[float, float]:
    """CPU ms and wall ms per conversation."""
    app = create_app(ServerSettings(auth_mode="none"), store=store,
                     agents=[Agent(FunctionModel(adding), name="adder", tools=[add])])
    async with served(app) as url, httpx.AsyncClient(base_url=url, timeout=60) as client:
        todo = iter(range(n))

        async def worker() -> None:
            for _ in todo:
                cid = (await client.post("/api/v1/chat/conversations", json={"agent": "adder"})).json()["id"]
                done = await client.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": "2+3?"},
                                         headers={"Accept": "application/json"})
                assert done.status_code == 200, done.text

        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(c)))
        assert (await client.get("/metrics")).status_code == 200
        return (time.process_time() - cpu) * 1000 / n, (time.perf_counter() - wall) * 1000 / n


async def bench(n: int, c: int, runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = await Store.open(f"sqlite:///{Path(tmp) / 'ringlet.db'}")
        modes = ["off", "metrics", "+json"]
        results: dict[str, list[tuple[float, float]]] = {mode: [] for mode in modes}
        await round_(store, "metrics", min(n, 50), c)  # warm up: imports, caches, the database file
        for i in range(runs):
            for mode in modes[i % 3:] + modes[:i % 3]:  # each mode first in turn
                with contextlib.ExitStack() as stack:
                    if mode == "off":
                        stack.enter_context(metrics_off())
                    stack.enter_context(log_format("json" if mode == "+json" else "text"))
                    results[mode].append(await round_(store, mode, n, c))
        await instruments(store)
        await store.close()
    base_cpu = statistics.median(r[0] for r in results["off"])
    base_wall = statistics.median(r[1] for r in results["off"])
    print(f"{n} conversations a round, {c} at once, median of {runs} rounds (CPU: the whole process)")
    print(f"{'mode':10} {'cpu ms/conv':>12} {'Δ cpu':>8} {'wall ms/conv':>13} {'Δ wall':>8}")
    for mode, rows in results.items():
        cpu, wall = statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows)
        print(f"{mode:10} {cpu:12.2f} {cpu - base_cpu:+8.2f} {wall:13.2f} {wall - base_wall:+8.2f}")


async def instruments(store: Store) -> None:
    """The metrics' own cost per conversation, and the JSON logs'."""
    seen: list[tuple[str, Any, Any]] = []
    lines: list[logging.LogRecord] = []

    class Count(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record)

    counter = Count()
    with log_format("json"):
        logging.getLogger().addHandler(counter)
        unsubscribe = telemetry.subscribe(lambda name, measured, meta: seen.append((name, measured, meta)))
        try:
            await round_(store, "metrics", 20, 1)
        finally:
            unsubscribe()
            logging.getLogger().removeHandler(counter)
    per_conv = [event for event in seen if event[0] in ops_metrics._HANDLERS]
    metrics = ops_metrics.Metrics()
    started = time.perf_counter()
    for _ in range(2000):
        for name, measured, meta in per_conv:
            metrics.observe(name, measured, meta)
        for _ in range(40):  # the 20 conversations' HTTP requests: create, then message
            metrics.http("POST", "/api/v1/chat/conversations/{cid}/messages", 200, 0.01)
    observe_us = (time.perf_counter() - started) / 2000 / 20 * 1e6
    started = time.perf_counter()
    for _ in range(200):
        generate_latest(metrics.registry)
    scrape_ms = (time.perf_counter() - started) / 200 * 1000
    record = logging.LogRecord("ringlet.server", logging.INFO, __file__, 1, "run %s ended: %s", ("r_1", "ok"), None)
    formatter = logs.JsonFormatter()
    started = time.perf_counter()
    with logs.bound("r_1", "c_1", "default"):
        for _ in range(20000):
            formatter.format(record)
    line_us = (time.perf_counter() - started) / 20000 * 1e6
    print(f"metrics: {len(per_conv) / 20:.1f} telemetry events a conversation, {observe_us:.1f} µs a conversation "
          f"to count them and its 2 HTTP requests; a scrape (generate_latest) {scrape_ms:.2f} ms")
    print(f"logs: {len(lines) / 20:.2f} lines a conversation at INFO; the JSON formatter {line_us:.1f} µs a line")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--n", type=int, default=300, help="conversations a round")
    parser.add_argument("--c", type=int, default=10, help="conversations at once")
    parser.add_argument("--runs", type=int, default=5, help="rounds of each mode")
    args = parser.parse_args()
    asyncio.run(bench(args.n, args.c, args.runs))


if __name__ == "__main__":
    main()
