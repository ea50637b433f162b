"""Load on `ringlet serve`: N concurrent conversations against a streaming mock model.

Starts an OpenAI-compatible mock model server (a subprocess: 200 ms to the first chunk, then 20 tokens
10 ms apart) and `ringlet serve` pointed at it (another subprocess), then, for each N, drives N
concurrent conversations from one asyncio process: each creates a conversation, then (all N released
together by a barrier once every conversation exists) sends one message and reads its SSE stream up to
`message_end`. Side by side in the same run, the same driver streams `/v1/chat/completions` from the
mock alone with the same N, so the latency ringlet adds is ringlet's percentile minus the mock's.

Prints, per N, medians over the runs of: throughput (conversations/s from the release to the last
`message_end`), p50/p99 end-to-end latency (message POST to `message_end`; mock: POST to `[DONE]`),
the latency ringlet adds per percentile, and the total error count (non-2xx, `event: error`, a
`message_end` not ending its turn, an exception). Target: N=1000, no errors, p99 added ≤ 50 ms.

The driver itself spends a few ms of CPU per streamed conversation (httpx), so at large N on a small
machine the mock-alone figures measure the driver too; `cpu ms/conv` (ringlet's own CPU time per
conversation, from /proc) tells how much of the load is ringlet's.

The default store is a SQLite file. `--postgres` adds, side by side in the same run (each round drives
the mock alone, then each server), a server whose store is on a private PostgreSQL server (started here,
like the tests'), where runs execute as DBOS workflows (durable execution, `engine: auto`). At the end it
prints each server's idle CPU (ms per second, nothing running) and, for PostgreSQL, the commits,
rollbacks and WAL bytes of one turn (`--turns` conversations one after another, from `pg_stat_database`,
net of the idle rate), and the rows and bytes a turn leaves in DBOS's tables. `--idle N` opens N event
streams (`GET …/events`) on N idle conversations and prints each server's resident memory before and with
them open.

Run: `.venv/bin/python bench/server_load.py [--n 100 1000] [--runs 3] [--postgres] [--turns 20]
[--idle 1000] [--profile /tmp/prof.out]` (`--runs` defaults to 3 for N < 1000 and 1 from 1000 on; `--profile` runs the
server under cProfile; SQLAlchemy's greenlets blur its attribution, so read it with care).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
FIRST_TOKEN_S, TOKENS, TOKEN_GAP_S = 0.2, 20, 0.01
PERCENTILES = "statistics.quantiles(n=100, method='inclusive') (linear interpolation between ranks)"


# ---------------------------------------------------------------- the mock model (its own process)

def chunk(delta: dict[str, str] | None, finish: str | None, **extra: object) -> bytes:
    """One `chat.completion.chunk` line of the mock's stream (also `scale_out.py`'s)."""
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    body = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 0, "model": "mock",
            "choices": choices, **extra}
    return f"data: {json.dumps(body)}\n\n".encode()


def run_mock(port: int) -> None:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse, StreamingResponse
    from starlette.routing import Route

    first, token = chunk({"role": "assistant", "content": ""}, None), chunk({"content": "tok "}, None)
    usage = {"prompt_tokens": 10, "completion_tokens": TOKENS, "total_tokens": 10 + TOKENS}
    last = chunk({}, "stop") + chunk(None, None, usage=usage) + b"data: [DONE]\n\n"

    async def stream():
        await asyncio.sleep(FIRST_TOKEN_S)
        yield first
        for _ in range(TOKENS):
            await asyncio.sleep(TOKEN_GAP_S)
            yield token
        yield last

    async def completions(request: Request) -> StreamingResponse:
        await request.json()
        return StreamingResponse(stream(), media_type="text/event-stream")

    async def health(_: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"]),
                            Route("/health", health)])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", backlog=4096, limit_concurrency=None)


# ---------------------------------------------------------------- the driver

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_ready(url: str, process: subprocess.Popen[bytes], deadline_s: float = 60) -> None:
    deadline = time.monotonic() + deadline_s
    async with httpx.AsyncClient(timeout=2) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"{process.args} exited with {process.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(url)).status_code == 200:
                    return
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} not ready after {deadline_s} s")


async def sse_events(response: httpx.Response):
    """(event, data) pairs of an SSE response, parsed from the raw bytes (cheaper than `aiter_lines`)."""
    buffer = b""
    async for raw in response.aiter_raw():
        buffer = (buffer + raw).replace(b"\r\n", b"\n")
        *frames, buffer = buffer.split(b"\n\n")
        for frame in frames:
            event, data = "message", []
            for line in frame.decode().split("\n"):
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].lstrip())
            if data:
                yield event, "\n".join(data)


async def ringlet_prepare(client: httpx.AsyncClient, base: str) -> str:
    r = await client.post(f"{base}/api/v1/chat/conversations", json={"agent": "bench"})
    r.raise_for_status()
    return r.json()["id"]


async def ringlet_send(client: httpx.AsyncClient, base: str, cid: str) -> bool:
    url = f"{base}/api/v1/chat/conversations/{cid}/messages"
    async with client.stream("POST", url, json={"content": "hello"},
                             headers={"Accept": "text/event-stream"}) as r:
        if not r.is_success:
            return False
        async for event, data in sse_events(r):
            if event == "error":
                return False
            if event == "message_end":
                return json.loads(data).get("finish_reason") == "end_turn"
    return False


async def mock_prepare(client: httpx.AsyncClient, base: str) -> str:
    (await client.get(f"{base}/health")).raise_for_status()  # opens the connection the send reuses
    return ""


async def mock_send(client: httpx.AsyncClient, base: str, _: str) -> bool:
    body = {"model": "mock", "stream": True, "messages": [{"role": "user", "content": "hello"}]}
    async with client.stream("POST", f"{base}/v1/chat/completions", json=body) as r:
        if not r.is_success:
            return False
        async for _event, data in sse_events(r):
            if data == "[DONE]":
                return True
    return False


Prepare = Callable[[httpx.AsyncClient, str], Awaitable[str]]
Send = Callable[[httpx.AsyncClient, str, str], Awaitable[bool]]


async def drive(n: int, base: str, prepare: Prepare, send: Send) -> dict[str, float]:
    """N workers prepare, wait at the barrier, then send together: throughput, p50, p99 (ms), errors."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    ready, go = asyncio.Event(), asyncio.Event()
    prepared = 0
    latencies: list[float] = []
    errors = 0

    async def worker() -> float:
        # One client (one connection) per conversation: httpcore scans its whole pool on every request,
        # so a single shared client costs O(N) per request and the driver, not the server, saturates.
        async with httpx.AsyncClient(limits=limits, timeout=120, verify=False) as client:
            return await conversation(client)

    async def conversation(client: httpx.AsyncClient) -> float:
        nonlocal prepared, errors
        try:
            key = await prepare(client, base)
        except Exception:  # a failed preparation counts as an error
            key = None
        prepared += 1
        if prepared == n:
            ready.set()
        await go.wait()
        started = time.perf_counter()
        try:
            ok = key is not None and await send(client, base, key)
        except Exception:
            ok = False
        ended = time.perf_counter()
        if ok:
            latencies.append(ended - started)
        else:
            errors += 1
        return ended

    tasks = [asyncio.create_task(worker()) for _ in range(n)]
    await ready.wait()
    released = time.perf_counter()
    go.set()
    ends = await asyncio.gather(*tasks)
    q = statistics.quantiles(latencies, n=100, method="inclusive") if len(latencies) > 1 else [0.0] * 99
    return {"throughput": n / (max(ends) - released), "p50": q[49] * 1000, "p99": q[98] * 1000,
            "errors": errors}


def rss_mib(pid: int) -> float:
    """Resident memory of a process (Linux /proc; 0 elsewhere)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    return next((int(line.split()[1]) / 1024 for line in status.splitlines() if line.startswith("VmRSS:")), 0.0)


async def idle_streams(n: int, base: str, pid: int) -> None:
    """Open `n` event streams on `n` idle conversations (each on its own connection), wait until the
    server has answered every one, and print its resident memory before and with them open."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(limits=limits, timeout=120) as client:
        cids = [await ringlet_prepare(client, base) for _ in range(n)]
    before = rss_mib(pid)
    opened, release = asyncio.Semaphore(0), asyncio.Event()

    async def follow(cid: str) -> None:
        async with httpx.AsyncClient(timeout=None) as own, \
                own.stream("GET", f"{base}/api/v1/chat/conversations/{cid}/events") as r:
            r.raise_for_status()
            opened.release()
            await release.wait()

    tasks = [asyncio.create_task(follow(cid)) for cid in cids]
    for _ in range(n):
        async with asyncio.timeout(120):
            await opened.acquire()
    with_open = rss_mib(pid)
    release.set()
    await asyncio.gather(*tasks)
    print(f"server RSS: {before:.1f} MiB before, {with_open:.1f} MiB with {n} idle event streams open "
          f"({(with_open - before) * 1024 / n:.1f} KiB per stream)")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all threads (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)


def stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGINT)  # like Ctrl-C: cProfile still writes its file (uvicorn re-raises SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


DBOS_TABLES = ("workflow_status", "workflow_input", "workflow_output", "operation_outputs", "notifications",
               "workflow_events")
"""DBOS's tables that hold a run's records (until the retention deletes them)."""


async def pg_stats(db: str) -> dict[str, float]:
    """The database's commits and rollbacks so far (`pg_stat_database`) and the WAL position, in bytes."""
    import asyncpg

    conn = await asyncpg.connect(db)
    try:
        row = await conn.fetchrow(
            "SELECT xact_commit, xact_rollback, pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint AS wal "
            "FROM pg_stat_database WHERE datname = current_database()")
        kept = [await conn.fetchrow(f"SELECT count(*) AS n, coalesce(sum(pg_column_size(t.*)), 0) AS b "
                                    f"FROM dbos.{table} t") for table in DBOS_TABLES]
        return {"commits": row["xact_commit"], "rollbacks": row["xact_rollback"], "wal": row["wal"],
                "dbos_rows": sum(k["n"] for k in kept), "dbos_bytes": sum(k["b"] for k in kept),
                "at": time.monotonic()}
    finally:
        await conn.close()


async def writes(db: str, base: str, server: subprocess.Popen[bytes], turns: int) -> dict[str, float]:
    """PostgreSQL's commits, rollbacks and WAL per turn: `turns` conversations one after another, net of the
    idle rate measured just before. A backend reports its statistics within a second while it works and
    after 10 s idle, so the idle span starts after 11 s of quiet, and the batch ends with the server
    stopped (an exiting backend reports at once). Also the server's idle CPU (ms per second)."""
    await asyncio.sleep(11)
    before, cpu = await pg_stats(db), cpu_seconds(server.pid)
    await asyncio.sleep(10)
    idle, cpu_idle = await pg_stats(db), (cpu_seconds(server.pid) - cpu) * 100  # over 10 s: ms/s
    span = idle["at"] - before["at"]
    rate = {k: (idle[k] - before[k]) / span for k in ("commits", "rollbacks", "wal")}
    async with httpx.AsyncClient(timeout=60) as client:
        for _ in range(turns):
            cid = await ringlet_prepare(client, base)
            if not await ringlet_send(client, base, cid):
                raise RuntimeError("a turn failed while counting writes")
    stop(server)
    await asyncio.sleep(0.5)
    after = await pg_stats(db)
    per_turn = {k: (after[k] - idle[k] - rate[k] * (after["at"] - idle["at"])) / turns
                for k in ("commits", "rollbacks", "wal")}
    per_turn |= {k: (after[k] - idle[k]) / turns for k in ("dbos_rows", "dbos_bytes")}
    return {**per_turn, "idle_commits": rate["commits"], "idle_cpu": cpu_idle}


async def idle_cpu(server: subprocess.Popen[bytes], seconds: float = 10) -> float:
    """The server's CPU while nothing happens, ms per second."""
    await asyncio.sleep(2)
    cpu = cpu_seconds(server.pid)
    await asyncio.sleep(seconds)
    return (cpu_seconds(server.pid) - cpu) * 1000 / seconds


async def rounds(n: int, count: int, mock_base: str, bases: dict[str, str],
                 servers: dict[str, subprocess.Popen[bytes]]) -> None:
    """`count` rounds of N conversations (the mock alone, then each server); one line per server."""
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in bases}
    for _ in range(count):
        alone = await drive(n, mock_base, mock_prepare, mock_send)
        for name, base in bases.items():
            pid = servers[name].pid
            cpu = cpu_seconds(pid)
            full = await drive(n, base, ringlet_prepare, ringlet_send)
            full["cpu_ms"] = (cpu_seconds(pid) - cpu) * 1000 / n
            rows[name].append({**full, "mock_p50": alone["p50"], "mock_p99": alone["p99"],
                               "added_p50": full["p50"] - alone["p50"], "added_p99": full["p99"] - alone["p99"],
                               "errors": full["errors"] + alone["errors"]})
    for name in bases:
        m = {k: statistics.median(r[k] for r in rows[name]) for k in rows[name][0]}
        print(f"{name:<11} {n:>5} {count:>4} {m['throughput']:>8.1f} {m['p50']:>8.1f} {m['p99']:>8.1f}"
              f" {m['mock_p50']:>9.1f} {m['mock_p99']:>9.1f} {m['added_p50']:>10.1f}"
              f" {m['added_p99']:>10.1f} {sum(r['errors'] for r in rows[name]):>6} {m['cpu_ms']:>11.1f}")


async def quiet(servers: dict[str, subprocess.Popen[bytes]], bases: dict[str, str], db: str | None,
                turns: int) -> None:
    """Each server's idle CPU; PostgreSQL's commits, rollbacks and WAL per turn (it stops that server)."""
    print(f"\nidle: ringlet serve's CPU with nothing to do, over 10 s; PostgreSQL: per turn ({turns} turns one "
          "after another, a turn with no tool call), net of the idle rate")
    for name, server in servers.items():
        if name == "PostgreSQL" and db:
            w = await writes(db, bases[name], server, turns)
            print(f"{name:<11} idle CPU {w['idle_cpu']:6.1f} ms/s, idle commits {w['idle_commits']:5.1f}/s;"
                  f" per turn: {w['commits']:5.1f} commits, {w['rollbacks']:5.1f} rollbacks,"
                  f" {w['wal'] / 1024:6.1f} kB of WAL; left in DBOS's tables until the retention deletes them:"
                  f" {w['dbos_rows']:.1f} rows, {w['dbos_bytes'] / 1024:.1f} kB")
        else:
            print(f"{name:<11} idle CPU {await idle_cpu(server):6.1f} ms/s")


async def bench(ns: list[int], runs: int | None, profile: str | None, db: str | None = None, *,
                idle: int = 0, turns: int = 20) -> None:
    """Each N, `runs` rounds; in each round the mock alone, then every server (SQLite; with `db`, PostgreSQL
    too), one after another, so the targets are compared side by side in one run."""
    tmp = Path(tempfile.mkdtemp(prefix="ringlet-load-"))
    mock_port = free_port()
    mock_base = f"http://127.0.0.1:{mock_port}"
    (tmp / "agents" / "bench").mkdir(parents=True)
    (tmp / "agents" / "bench" / "config.yaml").write_text(
        "description: load benchmark agent\nmodel: openai:mock\n"
        f'model_options: {{base_url: "{mock_base}/v1", api_key: "not-needed"}}\n'
        "instructions: Answer briefly.\n")
    python = sys.executable
    targets = {"SQLite": f"sqlite:///{tmp}/ringlet.db", **({"PostgreSQL": db} if db else {})}
    servers: dict[str, subprocess.Popen[bytes]] = {}
    bases: dict[str, str] = {}
    mock = start([python, __file__, "--mock-port", str(mock_port)], tmp / "mock.log")
    try:
        for name, url in targets.items():
            port = free_port()
            serve = ["-m", "ringlet", "serve", "--host", "127.0.0.1", "--port", str(port), "--db", url, "--agents",
                     str(tmp / "agents"), "--auth", "none"]
            if profile:
                serve = ["-m", "cProfile", "-o", f"{profile}.{name}", *serve]
            servers[name] = start([python, *serve], tmp / f"ringlet-{name}.log")
            bases[name] = f"http://127.0.0.1:{port}"
        await wait_ready(f"{mock_base}/health", mock)
        for name in targets:
            await wait_ready(f"{bases[name]}/readyz", servers[name])
        await drive(5, mock_base, mock_prepare, mock_send)  # warm-up, not counted
        for name in targets:
            await drive(5, bases[name], ringlet_prepare, ringlet_send)
        print(f"percentiles: {PERCENTILES}; figures are medians over the runs; errors are totals;\n"
              "cpu ms/conv: ringlet serve's CPU time (all threads) per conversation, creation included")
        print(f"{'store':<11} {'N':>5} {'runs':>4} {'conv/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'mock p50':>9}"
              f" {'mock p99':>9} {'added p50':>10} {'added p99':>10} {'errors':>6} {'cpu ms/conv':>11}")
        for n in ns:
            await rounds(n, runs or (3 if n < 1000 else 1), mock_base, bases, servers)
        if idle:
            for name in targets:
                print(f"{name}: ", end="")
                await idle_streams(idle, bases[name], servers[name].pid)
        await quiet(servers, bases, db, turns)
    finally:
        for server in servers.values():
            stop(server)
        stop(mock)
        for name in targets:
            log = (tmp / f"ringlet-{name}.log").read_text(errors="replace").splitlines()
            if notes := [line for line in log if not line.startswith("INFO:")][-20:]:
                print(f"ringlet serve ({name}) log, other than INFO (last lines):\n" + "\n".join(notes))
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, nargs="+", default=[100, 1000], help="concurrent conversations")
    parser.add_argument("--runs", type=int, default=None, help="runs per N (default 3 below 1000, else 1)")
    parser.add_argument("--profile", default=None, help="run the server under cProfile, writing here")
    parser.add_argument("--postgres", action="store_true",
                        help="beside SQLite, a server whose store is on a private PostgreSQL server")
    parser.add_argument("--turns", type=int, default=20, help="turns counted for PostgreSQL's writes per turn")
    parser.add_argument("--idle", type=int, default=0, help="then measure RSS with this many idle event streams")
    parser.add_argument("--mock-port", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mock_port is not None:
        run_mock(args.mock_port)
        return
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:  # the driver's own CPU is the scarce resource at N=1000: use uvloop when it is there
        import uvloop
        loop_factory = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    with contextlib.ExitStack() as stack:
        db = None
        if args.postgres:
            sys.path.insert(0, str(ROOT / "tests"))
            from postgres import postgres_server

            db = stack.enter_context(postgres_server()).replace("postgresql+asyncpg://", "postgresql://")
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(bench(args.n, args.runs, args.profile, db, idle=args.idle, turns=args.turns))


if __name__ == "__main__":
    main()
