"""A rolling restart under load (issue 55): every process of a cluster stopped with SIGTERM and started again,
one after the other, while clients keep talking; nobody should notice but for a little latency.

Starts a private PostgreSQL server, the model double of `bench/chaos.py` (two parallel tool calls, then a
streamed answer; ~1.2 s a run), `--apis` `ringlet serve --no-worker` and `--workers` `ringlet worker`s, all
with `RINGLET_DRAIN_S` (`--drain-s`). `--concurrency` clients each talk in a loop: a new conversation, one
message streamed over SSE (`POST …/messages`, with an `Idempotency-Key`), until the run's own `message_end`.
A client whose request is refused (503 while its API process drains) or whose connection fails sends it again
to another API process (the same key: at most one run); one whose stream ends early (its API process drains)
reconnects to another with `Last-Event-ID`. After `--steady-s` seconds of steady load, each API process, then
each worker, gets SIGTERM while its replacement starts (a rolling update's surge of one), and the next waits
until both are done (the old one drained and exited, the new one ready); then the load stops.

Checked for every run (a run that broke a check is listed with what it broke):
    ended      its record is `completed` (no run fails)
    ids        the client saw each event id once, in order, with no gap (its stream and its reconnections)
    once       the run's own `message_end` is in the event log exactly once
    replayed   `GET …/events` from 0 replays what the client saw, event for event
Printed: the latency of a run as its client sees it (message sent → its `message_end`), p50 and p99, for runs
started in steady state and for runs started while processes restart; and the reconnections and retries.

Run: `.venv/bin/python bench/rolling_restart.py [--concurrency 6] [--apis 2] [--workers 3] [--steady-s 6]
[--drain-s 20]`; exits 1 when a check failed. Loopback only; every process and the PostgreSQL server are
stopped on exit. `tests/test_rolling_restart.py` runs it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from httpx_sse import aconnect_sse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from chaos import CONFIG, TOOLS, Cluster, model_double  # noqa: E402
from postgres import postgres_server  # noqa: E402
from serving import serving  # noqa: E402


@dataclass
class Talk:
    """One client's conversation and run: what its streams showed, in order, and when."""

    cid: str = ""
    events: list[tuple[int, str, dict[str, Any]]] = field(default_factory=list)
    sent_at: float = 0.0
    ended_at: float = 0.0
    reconnects: int = 0
    retries: int = 0


class Load:
    """`concurrency` clients talking in a loop until `stop` is set."""

    def __init__(self, c: Cluster, client: httpx.AsyncClient) -> None:
        self.c, self.client = c, client
        self.talks: list[Talk] = []
        self.stop = asyncio.Event()

    async def client_loop(self, i: int) -> None:
        while not self.stop.is_set():
            talk = Talk()
            self.talks.append(talk)
            await self.talk(i, talk)

    async def _post(self, i: int, talk: Talk, path: str, **kwargs: Any) -> httpx.Response:
        """POST to an API process, to the next one when refused (503: it drains) or unreachable."""
        for attempt in range(200):
            try:
                response = await self.client.post(self.c.base(i + attempt) + path, **kwargs)
                if response.status_code != 503:
                    return response
            except httpx.TransportError:
                pass
            talk.retries += 1
            await asyncio.sleep(0.05)  # (another process answers at once; this one is stopping)
        raise RuntimeError(f"no API process took POST {path}")

    async def talk(self, i: int, talk: Talk) -> None:
        talk.cid = (await self._post(i, talk, "/api/v1/chat/conversations", json={"agent": "chaos"})).json()["id"]
        key, last = f"k-{uuid.uuid4().hex}", None
        talk.sent_at = time.monotonic()
        for attempt in range(200):
            base = self.c.base(i + attempt)
            try:
                path = f"{base}/api/v1/chat/conversations/{talk.cid}"
                if last is None:  # nothing seen yet: (re)send the message; the key makes it one run
                    request = aconnect_sse(self.client, "POST", f"{path}/messages", json={"content": "Do both"},
                                           headers={"Idempotency-Key": key})
                else:  # seen some: follow on from there
                    request = aconnect_sse(self.client, "GET", f"{path}/events", headers={"Last-Event-ID": str(last)})
                async with request as source:
                    if source.response.status_code != 200:
                        talk.retries += 1
                        await asyncio.sleep(0.05)
                        continue
                    async for event in source.aiter_sse():
                        if event.event == "ping" or not event.id:
                            continue
                        data = json.loads(event.data)
                        talk.events.append((int(event.id), event.event, data))
                        last = int(event.id)
                        if event.event == "message_end" and "agent_path" not in data:
                            talk.ended_at = time.monotonic()
                            return
            except (httpx.TransportError, httpx.RemoteProtocolError):
                pass
            talk.reconnects += 1
        raise RuntimeError(f"conversation {talk.cid} never saw its run end")


async def rolling_restart(*, concurrency: int = 6, apis: int = 2, workers: int = 3, steady_s: float = 6.0,
                          drain_s: float = 20.0, postgres_url: str | None = None,
                          logs: Path | None = None) -> dict[str, Any]:
    """Run the load, restart every process one by one, check every run; a report. The processes' logs are
    kept in `logs` when given (else in a temporary folder, removed)."""
    with tempfile.TemporaryDirectory(prefix="ringlet-rolling-") as kept, contextlib.ExitStack() as sync:
        tmp = str(logs) if logs is not None else kept
        server = postgres_url or sync.enter_context(postgres_server())
        name = f"rolling_{uuid.uuid4().hex[:8]}"
        admin = await asyncpg.connect(server.replace("postgresql+asyncpg://", "postgresql://"))
        await admin.execute(f"CREATE DATABASE {name}")
        await admin.close()
        db = server.rsplit("/", 1)[0] + f"/{name}"
        async with contextlib.AsyncExitStack() as stack:
            return await _rolling(stack, Path(tmp), db, concurrency=concurrency, apis=apis, workers=workers,
                                  steady_s=steady_s, drain_s=drain_s)


async def _rolling(stack: contextlib.AsyncExitStack, tmp: Path, db: str, *, concurrency: int, apis: int,
                   workers: int, steady_s: float, drain_s: float) -> dict[str, Any]:
    url = await stack.enter_async_context(serving(model_double(random.Random(0))))
    agent = tmp / "agents" / "chaos"
    agent.mkdir(parents=True)
    (agent / "config.yaml").write_text(CONFIG.format(url=url))
    (agent / "tools.py").write_text(TOOLS)
    (tmp / "effects.txt").touch()
    env = {"RINGLET_AUTH_MODE": "none", "RINGLET_HEARTBEAT_S": "0.2", "RINGLET_WORKER_TIMEOUT_S": "3",
           "RINGLET_DRAIN_S": str(drain_s), "EFFECTS": str(tmp / "effects.txt")}
    c = Cluster(db, tmp / "agents", env, stack)
    c.apis = list(await asyncio.gather(*[c.api() for _ in range(apis)]))
    c.workers = list(await asyncio.gather(*[c.worker() for _ in range(workers)]))
    client = await stack.enter_async_context(httpx.AsyncClient(timeout=httpx.Timeout(30, read=60)))
    load = Load(c, client)
    clients = [asyncio.create_task(load.client_loop(i)) for i in range(concurrency)]
    exits: Counter[str] = Counter()
    stops: list[float] = []
    starts: list[float] = []
    try:
        with contextlib.suppress(TimeoutError):  # steady load: wait for the clients (they only end by failing)
            await asyncio.wait_for(asyncio.shield(asyncio.gather(*clients)), steady_s)
        restarting = time.monotonic()
        for i in range(apis):  # its replacement starts as it drains (a rolling update's surge of one)
            status, c.apis[i] = await asyncio.gather(_stop(c.apis[i][1], drain_s, stops), _timed(c.api(), starts))
            exits[f"api {status}"] += 1
        for i in range(workers):
            status, c.workers[i] = await asyncio.gather(_stop(c.workers[i], drain_s, stops),
                                                        _timed(c.worker(), starts))
            exits[f"worker {status}"] += 1
        restarted = time.monotonic()
    finally:
        load.stop.set()
        await asyncio.gather(*clients)
    report = await _check(c, client, load.talks, restarting=restarting, restarted=restarted, exits=exits)
    return {**report, "stop_s": [round(t, 1) for t in stops], "start_s": [round(t, 1) for t in starts]}


async def _stop(process: Any, drain_s: float, took: list[float]) -> int:
    """SIGTERM, and the process's exit status once it has drained and stopped (how long it took: `took`)."""
    began = time.monotonic()
    process.send_signal(signal.SIGTERM)
    async with asyncio.timeout(drain_s + 30):
        status = await process.wait()
    took.append(time.monotonic() - began)
    return status


async def _timed(starting: Any, took: list[float]) -> Any:
    began = time.monotonic()
    try:
        return await starting
    finally:
        took.append(time.monotonic() - began)


def _percentiles(latencies: list[float]) -> dict[str, float]:
    if len(latencies) < 2:
        return {"n": len(latencies), "p50": latencies[0] if latencies else 0.0, "p99": max(latencies, default=0.0)}
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    return {"n": len(latencies), "p50": statistics.median(latencies), "p99": cuts[98]}


async def _check(c: Cluster, client: httpx.AsyncClient, talks: list[Talk], *, restarting: float, restarted: float,
                 exits: Counter[str]) -> dict[str, Any]:
    broken: dict[str, list[str]] = {}
    for talk in talks:
        problems = []
        ids = [i for i, _, _ in talk.events]
        if not ids or ids != list(range(ids[0], ids[0] + len(ids))):
            problems.append("ids")
        run_id = talk.events[0][2]["run_id"] if talk.events else ""
        record = (await client.get(c.base(0) + f"/api/v1/runs/{run_id}")).json()
        errors = [f"{data.get('code')}: {data.get('message')}" for _, kind, data in talk.events if kind == "error"]
        if record.get("status") != "completed" or errors:
            problems.append(f"ended ({record.get('status')}{''.join(f'; error {e}' for e in errors)})")
        replay = await _replay(client, c.base(1), talk.cid)
        if [kind for _, kind, data in replay if "agent_path" not in data].count("message_end") != 1:
            problems.append("once")
        if [(i, k) for i, k, _ in replay if i >= (ids or [0])[0]] != [(i, k) for i, k, _ in talk.events]:
            problems.append("replayed")
        if problems:
            broken[run_id or talk.cid] = problems
    steady = [t.ended_at - t.sent_at for t in talks if t.sent_at < restarting]
    during = [t.ended_at - t.sent_at for t in talks if restarting <= t.sent_at < restarted]
    return {"runs": len(talks), "steady": _percentiles(steady), "restarting": _percentiles(during),
            "restart_s": restarted - restarting, "exits": dict(exits),
            "reconnects": sum(t.reconnects for t in talks), "retries": sum(t.retries for t in talks),
            "retracted": sum(k == "retracted" for t in talks for _, k, _ in t.events), "broken": broken}


async def _replay(client: httpx.AsyncClient, base: str, cid: str) -> list[tuple[int, str, dict[str, Any]]]:
    """The conversation's whole log, from `GET …/events` (its run has ended: up to its own message_end)."""
    replay: list[tuple[int, str, dict[str, Any]]] = []
    async with aconnect_sse(client, "GET", base + f"/api/v1/chat/conversations/{cid}/events",
                            headers={"Last-Event-ID": "0"}) as source:
        async for event in source.aiter_sse():
            if event.event == "ping" or not event.id:
                continue
            replay.append((int(event.id), event.event, json.loads(event.data)))
            if event.event == "message_end" and "agent_path" not in replay[-1][2]:
                return replay
    return replay


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=6)
    parser.add_argument("--apis", type=int, default=2)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--steady-s", type=float, default=6.0)
    parser.add_argument("--drain-s", type=float, default=20.0)
    args = parser.parse_args()
    report = asyncio.run(rolling_restart(concurrency=args.concurrency, apis=args.apis, workers=args.workers,
                                         steady_s=args.steady_s, drain_s=args.drain_s))
    for phase in ("steady", "restarting"):
        p = report[phase]
        print(f"{phase:>11}  runs {p['n']:>4}  p50 {p['p50'] * 1000:7.0f} ms  p99 {p['p99'] * 1000:7.0f} ms")
    for name in ("runs", "restart_s", "stop_s", "start_s", "exits", "reconnects", "retries", "retracted"):
        print(f"{name:>11}  {report[name]}")
    print(f"{'broken':>11}  {len(report['broken'])}")
    for run, problems in report["broken"].items():
        print(f"    {run}: {', '.join(problems)}")
    sys.exit(1 if report["broken"] else 0)


if __name__ == "__main__":
    main()
