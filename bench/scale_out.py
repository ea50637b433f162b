"""Scale-out on DBOS: throughput and CPU with 1, 2 and 4 workers, DBOS's cost per step, recovery after SIGKILL,
and database writes per conversation.

Starts a private PostgreSQL server (as the tests do) and an OpenAI-compatible mock model (a subprocess:
200 ms to the first chunk, then 20 tokens 5 ms apart, usage in the final chunk), then prints four tables:

1. `load`: per topology, conversations/s and CPU ms per conversation, medians over `--runs` rounds. Each
   round measures every topology once, side by side (the machine varies up to 2x over minutes): `ringlet
   serve` with `RINGLET_ENGINE=local` (runs execute in that process: the baseline without the engine),
   and one `ringlet serve --no-worker` plus 1, 2, 4 `ringlet worker`s (`RINGLET_ENGINE=dbos`), each on a
   fresh database of the same server. The driver (this process) creates `--n` conversations and sends one
   message each (`Accept: application/json`: the POST returns once the run ended, in any process), at most
   `--concurrency` at once, after a warm-up of a few. `ringlet cpu` is the user+system CPU time of every
   ringlet process (/proc), `pg cpu` PostgreSQL's (the postmaster and all its backends).
2. `steps`: in process, no HTTP: a DBOS workflow of K trivial async steps (`@DBOS.step` and
   `DBOS.run_step_async`) against K awaited plain async calls; a step's cost is (workflow of K steps -
   empty workflow) / K. DBOS's system database on PostgreSQL, then on SQLite; one subprocess each.
3. `recovery`: `ringlet serve --no-worker` and 2 workers; a message whose model answer stalls after 3
   tokens; the worker whose pid holds the run's lease (`runs.lease_owner`) is SIGKILLed, the model
   released, and the time from the kill until `GET /api/v1/runs/{id}` shows the run ended is taken (it
   includes the model's answer, requested again: ~0.3 s). A replacement worker is started after each kill.
   Default `heartbeat_s`/`worker_timeout_s` (a dead worker on the same machine is seen at the next beat).
4. `writes`: from `pg_stat_database` (commits, rows inserted and updated), the next transaction id (write
   transactions) and the WAL position, per conversation, over the first round's batch of the local baseline
   and of 1 worker. Backends may hold their statistics up to 10 s when idle, so the batch starts after 11 s
   idle and ends with the processes stopped (a backend flushes them when it exits); the idle rate (the
   workers poll the queue) is measured over 5 s before the batch and shown, since it is not per conversation.

Run: `.venv/bin/python bench/scale_out.py [--quick] [--n 100] [--concurrency 32] [--runs 3] [--workers 1 2 4]
[--kills 20] [--steps 200] [--step-runs 5] [--sections steps load recovery] [--no-writes]`; `--quick`: n 20,
1 round, 3 kills, 3 step runs (~1.5 min; the whole bench ~4.5 min on 2 cores). A topology whose process is
stopped from outside during its batch is measured again once. Loopback only; every subprocess and the
PostgreSQL server are stopped on exit, Ctrl-C and SIGTERM included.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from postgres import postgres_server  # noqa: E402

FIRST_TOKEN_S, TOKENS, TOKEN_GAP_S, STALL_AFTER = 0.2, 20, 0.005, 3
WARM_UP = 8
STATS_SETTLE_S, IDLE_WINDOW_S, IDLE_CPU_S = 11.0, 5.0, 2.0
LIMITS_OFF = {"RINGLET_AUTH_MODE": "none", "RINGLET_RATE_LIMIT_PER_MINUTE": "0", "RINGLET_MAX_STREAMS_PER_KEY": "0",
              "RINGLET_MAX_RUNS_PER_KEY": "0"}
CHILDREN: list[subprocess.Popen[bytes]] = []
"""Every subprocess this script started and has not reaped: stopped on exit, whatever the exit."""


# ---------------------------------------------------------------- the mock model (its own process)

def run_mock(port: int) -> None:
    """`/v1/chat/completions` streaming; after `POST /arm`, a request whose last message says `stall` holds
    its stream after 3 tokens until `POST /release`; `GET /stalled` counts the streams held now."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    from server_load import chunk  # the same stream as server_load.py's mock

    first, token = chunk({"role": "assistant", "content": ""}, None), chunk({"content": "tok "}, None)
    usage = {"prompt_tokens": 10, "completion_tokens": TOKENS, "total_tokens": 10 + TOKENS}
    last = chunk({}, "stop") + chunk(None, None, usage=usage) + b"data: [DONE]\n\n"
    state = {"armed": False, "stalled": 0}
    release = asyncio.Event()

    async def stream(stall: bool):
        await asyncio.sleep(FIRST_TOKEN_S)
        yield first
        for i in range(TOKENS):
            if stall and i == STALL_AFTER:
                state["stalled"] += 1
                try:
                    await release.wait()
                finally:
                    state["stalled"] -= 1
            await asyncio.sleep(TOKEN_GAP_S)
            yield token
        yield last

    async def completions(request: Request) -> StreamingResponse:
        said = str((await request.json())["messages"][-1].get("content"))
        return StreamingResponse(stream(state["armed"] and "stall" in said), media_type="text/event-stream")

    async def arm(_: Request) -> JSONResponse:
        state["armed"] = True
        release.clear()
        return JSONResponse(state)

    async def free(_: Request) -> JSONResponse:
        state["armed"] = False
        release.set()
        return JSONResponse(state)

    async def stalled(_: Request) -> JSONResponse:
        return JSONResponse(state)

    app = Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"]),
                            Route("/arm", arm, methods=["POST"]), Route("/release", free, methods=["POST"]),
                            Route("/stalled", stalled)])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", backlog=4096)


# ---------------------------------------------------------------- DBOS steps (one subprocess per database)

async def steps_child(url: str, k: int, runs: int) -> None:
    """Print JSON: per run, seconds for K plain calls, an empty workflow, and workflows of K steps."""
    from dbos import DBOS

    async def plain(i: int) -> int:
        return i

    @DBOS.step(name="bench.trivial")
    async def trivial(i: int) -> int:
        return i

    @DBOS.workflow(name="bench.empty")
    async def empty() -> int:
        return 0

    @DBOS.workflow(name="bench.decorated")
    async def decorated(k: int) -> int:
        for i in range(k):
            await trivial(i)
        return k

    @DBOS.workflow(name="bench.run_step")
    async def run_step(k: int) -> int:
        for i in range(k):
            await DBOS.run_step_async({"name": "bench.plain"}, plain, i)
        return k

    async def timed(work: Any) -> float:
        started = time.perf_counter()
        await work
        return time.perf_counter() - started

    async def plain_loop(k: int) -> None:
        for i in range(k):
            await plain(i)

    DBOS(config={"name": "ringlet-bench", "system_database_url": url, "log_level": "WARNING"})
    DBOS.launch()
    try:
        await empty(), await decorated(10), await run_step(10)  # warm-up
        out = [{"plain": await timed(plain_loop(k)), "empty": await timed(empty()),
                "decorated": await timed(decorated(k)), "run_step": await timed(run_step(k))} for _ in range(runs)]
        print(json.dumps(out))
    finally:
        DBOS.destroy()


# ---------------------------------------------------------------- processes

def launch(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:  # its own session: Ctrl-C reaches this script only, which stops it
        process = subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
    process.log = log  # type: ignore[attr-defined]
    CHILDREN.append(process)
    return process


async def ready(process: subprocess.Popen[bytes], marker: str, deadline_s: float = 90) -> None:
    """Wait until the process's log shows `marker`."""
    log: Path = process.log  # type: ignore[attr-defined]
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if marker in read(log):
            return
        if process.poll() is not None:
            raise RuntimeError(f"{log.stem} exited with {process.returncode}:\n{tail(log)}")
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{log.stem} not ready after {deadline_s} s:\n{tail(log)}")


def read(log: Path) -> str:
    return log.read_text(errors="replace")


def tail(log: Path, lines: int = 30) -> str:
    return "\n".join(read(log).splitlines()[-lines:])


def stop(*processes: subprocess.Popen[bytes], grace_s: float = 15) -> None:
    """SIGINT (like Ctrl-C: a worker hands its runs on), then SIGKILL after `grace_s`; reaped."""
    for p in processes:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGINT)
    for p in processes:
        try:
            p.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        if p in CHILDREN:
            CHILDREN.remove(p)


def stop_all() -> None:
    stop(*list(CHILDREN), grace_s=5)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, all threads (plus its reaped children's with `children`)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def pg_cpu_s(postmaster: int) -> float:
    """CPU seconds of PostgreSQL: the postmaster, its live backends, and (cutime, cstime) the exited ones."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            pid = int(stat.parent.name)
            if pid == postmaster:
                total += sum(int(f) for f in fields[11:15]) / tick
            elif int(fields[1]) == postmaster:
                total += (int(fields[11]) + int(fields[12])) / tick
    return total


class Bench:
    """The PostgreSQL server, the mock, the agents folder: what every section shares."""

    def __init__(self, server_url: str, tmp: Path, mock_port: int) -> None:
        self.server_url, self.tmp = server_url, tmp
        self.mock = f"http://127.0.0.1:{mock_port}"
        self.agents = tmp / "agents"
        (self.agents / "bench").mkdir(parents=True)
        (self.agents / "bench" / "config.yaml").write_text(
            "description: scale-out benchmark agent\nmodel: openai:mock\n"
            f'model_options: {{base_url: "{self.mock}/v1", api_key: "not-needed"}}\n'
            "instructions: Answer briefly.\n")
        self.postmaster = 0
        self.stop = False
        """Recovery: SIGSTOP the worker (found dead by its silence) instead of SIGKILL (seen exited at once)."""
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RINGLET_")} | LIMITS_OFF

    def dsn(self, db: str = "postgres") -> str:
        return self.server_url.replace("postgresql+asyncpg://", "postgresql://").rsplit("/", 1)[0] + f"/{db}"

    async def admin(self) -> asyncpg.Connection:
        return await asyncpg.connect(self.dsn())

    async def create_db(self, prefix: str) -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:8]}"
        conn = await self.admin()
        try:
            await conn.execute(f"CREATE DATABASE {name}")
            if not self.postmaster:
                self.postmaster = parent_of(int(await conn.fetchval("SELECT pg_backend_pid()")))
        finally:
            await conn.close()
        return name

    async def drop_db(self, name: str) -> None:
        conn = await self.admin()
        try:
            await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        finally:
            await conn.close()

    def ringlet(self, command: list[str], db: str, log: str, engine: str) -> subprocess.Popen[bytes]:
        url = self.server_url.rsplit("/", 1)[0] + f"/{db}"
        return launch([sys.executable, "-m", "ringlet", *command, "--db", url, "--agents", str(self.agents)],
                      self.tmp / log, env={**self.env, "RINGLET_ENGINE": engine})


class Topology:
    """`ringlet serve` (engine local) when `workers` is 0; else `serve --no-worker` and `workers` workers."""

    def __init__(self, bench: Bench, db: str, workers: int) -> None:
        self.bench, self.db, self.workers_wanted = bench, db, workers
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.api: subprocess.Popen[bytes] | None = None
        self.workers: list[subprocess.Popen[bytes]] = []

    async def start(self) -> None:
        serve = ["serve", "--host", "127.0.0.1", "--port", str(self.port)]
        if self.workers_wanted == 0:
            self.api = self.bench.ringlet(serve, self.db, f"{self.db}-serve.log", "local")
            await ready(self.api, "Uvicorn running on")
            return
        # the API first: it migrates the fresh database (ringlet's tables and DBOS's schema) alone
        self.api = self.bench.ringlet([*serve, "--no-worker"], self.db, f"{self.db}-api.log", "dbos")
        await ready(self.api, "Uvicorn running on")
        await asyncio.gather(*[self.add_worker() for _ in range(self.workers_wanted)])

    async def add_worker(self) -> subprocess.Popen[bytes]:
        n = len(list(self.bench.tmp.glob(f"{self.db}-worker*.log")))
        worker = self.bench.ringlet(["worker"], self.db, f"{self.db}-worker{n}.log", "dbos")
        self.workers.append(worker)
        await ready(worker, "ready: executing")
        return worker

    def processes(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in [self.api, *self.workers] if p is not None]

    def cpu(self) -> float:
        return sum(cpu_s(p.pid) for p in self.processes())

    def stop(self) -> None:
        stop(*self.workers, *([self.api] if self.api else []))

    def errors(self) -> str:
        """The processes' log lines that are not INFO (the last ones)."""
        lines = []
        for p in self.processes():
            log: Path = p.log  # type: ignore[attr-defined]
            lines += [f"{log.name}: {line}" for line in log.read_text(errors="replace").splitlines()
                      if line.strip() and not line.startswith("INFO:") and "ringlet worker: executing" not in line
                      and "ringlet serving at" not in line and "OpenAI-compatible API" not in line]
        return "\n".join(lines[-20:])


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- the load driver

async def converse(client: httpx.AsyncClient, base: str, content: str = "hello") -> str | None:
    """One conversation, one message; None when its run completed, else what went wrong."""
    r = await client.post(f"{base}/api/v1/chat/conversations", json={"agent": "bench"})
    if not r.is_success:
        return f"create: {r.status_code} {r.text[:200]}"
    r = await client.post(f"{base}/api/v1/chat/conversations/{r.json()['id']}/messages", json={"content": content},
                          headers={"Accept": "application/json"})
    if not r.is_success or r.json().get("status") != "completed":
        return f"message: {r.status_code} {r.text[:300]}"
    return None


async def drive(base: str, n: int, concurrency: int) -> dict[str, Any]:
    """`n` conversations, at most `concurrency` at once: elapsed s, p50 latency ms, errors, the first error."""
    gate = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    errors, first = 0, ""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async with httpx.AsyncClient(limits=limits, timeout=120) as client:
        async def one() -> None:
            nonlocal errors, first
            async with gate:
                started = time.perf_counter()
                try:
                    error = await converse(client, base)
                except Exception as exc:
                    error = f"{type(exc).__name__}: {exc}"
                if error is None:
                    latencies.append(time.perf_counter() - started)
                else:
                    errors += 1
                    first = first or error

        started = time.perf_counter()
        await asyncio.gather(*[one() for _ in range(n)])
        elapsed = time.perf_counter() - started
    return {"elapsed": elapsed, "p50": statistics.median(latencies) * 1000 if latencies else float("nan"),
            "errors": errors, "first": first}


async def pg_marks(bench: Bench, db: str) -> dict[str, float]:
    """The database's statistics and the server's next transaction id and WAL position, now."""
    conn = await bench.admin()
    try:
        row = await conn.fetchrow(
            "SELECT xact_commit, tup_inserted, tup_updated, tup_deleted, "
            "pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS xid, "
            "pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint AS wal FROM pg_stat_database WHERE datname = $1", db)
    finally:
        await conn.close()
    if row is None:
        raise RuntimeError(f"no statistics for database {db}")
    return {**{k: float(v) for k, v in row.items()}, "at": time.perf_counter()}


async def load_once(bench: Bench, workers: int, n: int, concurrency: int, writes: bool) -> dict[str, Any]:
    """One topology, one batch: conv/s, p50, CPU per conversation, idle CPU, errors (and, with `writes`, the
    database's writes per conversation)."""
    db = await bench.create_db("local" if workers == 0 else f"w{workers}")
    topology = Topology(bench, db, workers)
    try:
        await topology.start()
        warm = await drive(topology.base, WARM_UP, WARM_UP)  # first requests load the agent, warm pools
        if warm["errors"]:
            print(f"  [{describe(workers)}: warm-up, {warm['errors']} errors, the first: {warm['first']}]", flush=True)
        if writes:
            await asyncio.sleep(STATS_SETTLE_S)
        idle_from, cpu, pg = await pg_marks(bench, db), topology.cpu(), pg_cpu_s(bench.postmaster)
        await asyncio.sleep(IDLE_WINDOW_S if writes else IDLE_CPU_S)  # nothing to do: what polling costs
        before = await pg_marks(bench, db)
        idle_s = before["at"] - idle_from["at"]
        idle_cpu, idle_pg = (topology.cpu() - cpu) * 1000 / idle_s, (pg_cpu_s(bench.postmaster) - pg) * 1000 / idle_s
        cpu, pg = topology.cpu(), pg_cpu_s(bench.postmaster)
        result = await drive(topology.base, n, concurrency)
        cpu, pg = topology.cpu() - cpu, pg_cpu_s(bench.postmaster) - pg
        if lost := [p for p in topology.processes() if p.poll() is not None]:
            raise Lost(", ".join(f"{p.log.stem} exited with {p.returncode}" for p in lost)  # type: ignore[attr-defined]
                       + f" before the batch ended; its log:\n{tail(lost[0].log, 8)}")  # type: ignore[attr-defined]
        out: dict[str, Any] = {"conv_s": n / result["elapsed"], "p50": result["p50"], "cpu_ms": cpu * 1000 / n,
                               "pg_ms": pg * 1000 / n, "idle_cpu": idle_cpu, "idle_pg": idle_pg,
                               "errors": result["errors"]}
        if result["errors"]:
            print(f"  [{describe(workers)}: {result['errors']} errors, the first: {result['first']}]\n"
                  f"{topology.errors()}", flush=True)
        if writes:
            ended = time.perf_counter()
            topology.stop()  # its backends exit and flush their statistics
            await asyncio.sleep(0.5)
            after = await pg_marks(bench, db)
            idle = {k: (before[k] - idle_from[k]) / idle_s for k in ("xact_commit", "xid", "tup_updated")}
            written = {k: (after[k] - before[k]) / n
                       for k in ("xact_commit", "xid", "tup_inserted", "tup_updated", "tup_deleted", "wal")}
            written["net_commits"] = (after["xact_commit"] - before["xact_commit"]
                                      - idle["xact_commit"] * (ended - before["at"])) / n
            out["writes"] = {**written, "idle": idle}
        return out
    finally:
        topology.stop()
        await bench.drop_db(db)


class Lost(RuntimeError):
    """A process of the topology exited before the measurement ended (stopped from outside)."""


def describe(workers: int) -> str:
    return "serve (engine local)" if workers == 0 else f"API + {workers} worker{'s' * (workers > 1)} (dbos)"


async def section_load(bench: Bench, args: argparse.Namespace) -> None:
    configs = [0, *args.workers]
    rows: dict[int, list[dict[str, Any]]] = {w: [] for w in configs}
    for r in range(args.runs):
        for w in configs:
            for attempt in (1, 2):  # once more if a process was stopped from outside (not by ringlet)
                try:
                    rows[w].append(await load_once(bench, w, args.n, args.concurrency,
                                                   writes=r == 0 and w in (0, 1) and not args.no_writes))
                    break
                except Lost as exc:
                    print(f"  round {r + 1} {describe(w)}: attempt {attempt} lost: {exc}", flush=True)
            else:
                continue
            last = rows[w][-1]
            print(f"  round {r + 1}/{args.runs} {describe(w):<26} {last['conv_s']:6.1f} conv/s "
                  f"{last['cpu_ms']:6.1f} ms cpu/conv, errors {last['errors']}", flush=True)
    print(f"\n1. load: {args.n} conversations per batch, concurrency {args.concurrency}, mock model "
          f"{FIRST_TOKEN_S * 1000:.0f} ms + {TOKENS} x {TOKEN_GAP_S * 1000:.0f} ms; medians over {args.runs} "
          "round(s); errors are totals; p50: create + message until the run ended; idle: CPU ms per second "
          "with nothing to do (polling, heartbeats), included in the batch's CPU")
    print(f"{'topology':<27} {'conv/s':>7} {'p50 ms':>7} {'ringlet cpu ms/conv':>20} {'pg cpu ms/conv':>15}"
          f" {'total':>6} {'idle ringlet ms/s':>18} {'idle pg ms/s':>13} {'errors':>6}")
    for w in configs:
        if not rows[w]:
            print(f"{describe(w):<27} no measurement")
            continue
        m = {k: statistics.median(x[k] for x in rows[w])
             for k in ("conv_s", "p50", "cpu_ms", "pg_ms", "idle_cpu", "idle_pg")}
        print(f"{describe(w):<27} {m['conv_s']:>7.1f} {m['p50']:>7.0f} {m['cpu_ms']:>20.1f} {m['pg_ms']:>15.1f}"
              f" {m['cpu_ms'] + m['pg_ms']:>6.1f} {m['idle_cpu']:>18.1f} {m['idle_pg']:>13.1f}"
              f" {sum(x['errors'] for x in rows[w]):>6}")
    written = {w: rows[w][0]["writes"] for w in (0, 1) if rows.get(w) and "writes" in rows[w][0]}
    if written:
        print(f"\n4. writes per conversation (pg_stat_database of the topology's database; write xacts: transaction"
              f" ids drawn; round 1, {args.n} conversations; idle: per second over {IDLE_WINDOW_S:.0f} s before)")
        print(f"{'topology':<27} {'commits':>8} {'net of idle':>11} {'write xacts':>11} {'rows ins':>9}"
              f" {'rows upd':>9} {'WAL kB':>8} {'idle commits/s':>15} {'idle upd/s':>11}")
        for w, x in written.items():
            print(f"{describe(w):<27} {x['xact_commit']:>8.1f} {x['net_commits']:>11.1f} {x['xid']:>11.1f}"
                  f" {x['tup_inserted']:>9.1f} {x['tup_updated']:>9.1f}"
                  f" {x['wal'] / 1024:>8.1f} {x['idle']['xact_commit']:>15.1f} {x['idle']['tup_updated']:>11.1f}")


# ---------------------------------------------------------------- sections 2 and 3

async def section_steps(bench: Bench, args: argparse.Namespace) -> None:
    db = await bench.create_db("steps")
    targets = {"PostgreSQL": bench.dsn(db), "SQLite": f"sqlite:///{bench.tmp}/dbos-steps.sqlite"}
    print(f"\n2. steps: a workflow of K={args.steps} trivial async steps vs K awaited plain calls, in process; "
          f"medians over {args.step_runs} runs; step = (workflow of K steps - empty workflow) / K")
    print(f"{'system database':<16} {'plain us/call':>14} {'empty workflow ms':>18} {'@DBOS.step ms/step':>19}"
          f" {'run_step_async ms/step':>23}")
    try:
        for name, url in targets.items():
            child = launch([sys.executable, __file__, "--steps-child", url, str(args.steps), str(args.step_runs)],
                           bench.tmp / f"steps-{name}.log", env=bench.env)
            await asyncio.to_thread(child.wait)
            CHILDREN.remove(child)
            text = read(child.log)  # type: ignore[attr-defined]
            try:
                runs = json.loads(text.strip().splitlines()[-1])
            except (ValueError, IndexError):
                print(f"{name:<16} failed (exit {child.returncode}):\n{text[-3000:]}")
                continue
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            k = args.steps
            print(f"{name:<16} {med['plain'] * 1e6 / k:>14.2f} {med['empty'] * 1000:>18.2f}"
                  f" {(med['decorated'] - med['empty']) * 1000 / k:>19.3f}"
                  f" {(med['run_step'] - med['empty']) * 1000 / k:>23.3f}")
    finally:
        await bench.drop_db(db)


async def section_recovery(bench: Bench, args: argparse.Namespace) -> None:
    db = await bench.create_db("recovery")
    topology = Topology(bench, db, 2)
    times: list[float] = []
    failures: list[str] = []
    try:
        await topology.start()
        async with httpx.AsyncClient(timeout=120) as client:
            await drive(topology.base, 2, 2)  # warm-up
            for i in range(args.kills):
                try:
                    times.append(await kill_once(bench, topology, client, db))
                except Exception as exc:  # one failed kill is reported; the others still count
                    failures.append(f"kill {i + 1}: {type(exc).__name__}: {exc}")
                    print(f"  kill {i + 1}: {failures[-1]}", flush=True)
                else:
                    print(f"  kill {i + 1}/{args.kills}: recovered in {times[-1] * 1000:.0f} ms", flush=True)
                await client.post(f"{bench.mock}/release")
                alive = [w for w in topology.workers if w.poll() is None]
                topology.workers = alive
                await asyncio.gather(*[topology.add_worker() for _ in range(2 - len(alive))])
    finally:
        notes = topology.errors()
        topology.stop()
        await bench.drop_db(db)
    print(f"\n3. recovery: {'SIGSTOP' if bench.stop else 'SIGKILL'} of the worker executing a run (its model "
          "stream held), 2 workers + API; "
          "time from the kill until GET /api/v1/runs/{id} shows it ended (includes the model's ~0.3 s answer); "
          "heartbeat_s 1.0, worker_timeout_s 5.0 (defaults)")
    if times:
        q = statistics.quantiles(times, n=100, method="inclusive") if len(times) > 1 else [times[0]] * 99
        print(f"{'kills':>5} {'recovered':>9} {'p50 ms':>7} {'p99 ms':>7} {'min ms':>7} {'max ms':>7}")
        print(f"{args.kills:>5} {len(times):>9} {q[49] * 1000:>7.0f} {q[98] * 1000:>7.0f} {min(times) * 1000:>7.0f}"
              f" {max(times) * 1000:>7.0f}")
    for failure in failures:
        print(f"  {failure}")
    if failures and notes:
        print(f"process logs, other than INFO:\n{notes}")


async def kill_once(bench: Bench, topology: Topology, client: httpx.AsyncClient, db: str) -> float:
    """One stalled run, its worker killed: seconds from the kill until the API shows the run ended."""
    await client.post(f"{bench.mock}/arm")
    conn = await asyncpg.connect(bench.dsn(db))
    cid = (await client.post(f"{topology.base}/api/v1/chat/conversations", json={"agent": "bench"})).json()["id"]
    sent = asyncio.create_task(client.post(f"{topology.base}/api/v1/chat/conversations/{cid}/messages",
                                           json={"content": "stall here"}, headers={"Accept": "application/json"}))
    try:
        async with asyncio.timeout(30):  # the model stream is held and a worker holds the run's lease
            while True:
                row = await conn.fetchrow("SELECT id, lease_owner FROM runs WHERE conversation_id = $1", cid)
                held = (await client.get(f"{bench.mock}/stalled")).json()["stalled"]
                if row is not None and row["lease_owner"] and held:
                    break
                await asyncio.sleep(0.02)
        run_id, pid = row["id"], int(row["lease_owner"].rsplit(":", 1)[1])
        worker = next((w for w in topology.workers if w.pid == pid), None)
        if worker is None:
            raise RuntimeError(f"run {run_id} is leased by {row['lease_owner']}, not a worker of this topology")
        killed = time.perf_counter()
        if bench.stop:  # it stops answering but lives (a machine gone from the network): dead once silent
            os.kill(worker.pid, signal.SIGSTOP)
        else:
            worker.kill()
            worker.wait()  # reaped: a live process on this machine sees it gone at its next beat
        await client.post(f"{bench.mock}/release")
        async with asyncio.timeout(60):
            while True:
                record = (await client.get(f"{topology.base}/api/v1/runs/{run_id}")).json()
                if record.get("status") not in (None, "working", "queued"):
                    break
                await asyncio.sleep(0.01)
        took = time.perf_counter() - killed
        if bench.stop:
            worker.kill()
            worker.wait()
        CHILDREN.remove(worker)
        if record["status"] != "completed":
            raise RuntimeError(f"run {run_id} ended {record['status']!r} ({record.get('finish_reason')})")
        return took
    finally:
        with contextlib.suppress(TimeoutError, httpx.HTTPError):  # the message POST returns once the run ended
            await asyncio.wait_for(asyncio.shield(sent), 5)
        sent.cancel()
        await conn.close()


# ---------------------------------------------------------------- main

async def bench_all(args: argparse.Namespace) -> None:
    with contextlib.ExitStack() as stack:
        server_url = stack.enter_context(postgres_server())
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ringlet-scale-")))
        mock_port = free_port()
        bench = Bench(server_url, tmp, mock_port)
        bench.stop = args.stop
        mock = launch([sys.executable, __file__, "--mock-port", str(mock_port)], tmp / "mock.log", env=bench.env)
        async with httpx.AsyncClient(timeout=2) as client:
            for _ in range(200):
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(f"{bench.mock}/stalled")).is_success:
                        break
                await asyncio.sleep(0.05)
        try:
            print(f"PostgreSQL {server_url.rsplit('@', 1)[1]} (fsync off), {os.cpu_count()} cpus; "
                  f"sections: {', '.join(args.sections)}", flush=True)
            if "steps" in args.sections:
                await section_steps(bench, args)
            if "load" in args.sections:
                await section_load(bench, args)
            if "recovery" in args.sections:
                await section_recovery(bench, args)
        finally:
            stop_all()
            stop(mock)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100, help="conversations per batch (default 100)")
    parser.add_argument("--concurrency", type=int, default=32, help="conversations at once (default 32)")
    parser.add_argument("--runs", type=int, default=3, help="rounds of the load section (default 3)")
    parser.add_argument("--workers", type=int, nargs="*", default=[1, 2, 4], help="worker counts (default 1 2 4)")
    parser.add_argument("--kills", type=int, default=20, help="SIGKILLs in the recovery section (default 20)")
    parser.add_argument("--stop", action="store_true", help="recovery: SIGSTOP the worker instead (it lives but "
                        "stops answering, like a machine gone from the network: found dead by its silence)")
    parser.add_argument("--steps", type=int, default=200, help="K, steps per workflow (default 200)")
    parser.add_argument("--step-runs", type=int, default=5, help="runs of the steps section (default 5)")
    parser.add_argument("--sections", nargs="+", choices=["load", "steps", "recovery"],
                        default=["steps", "load", "recovery"])
    parser.add_argument("--no-writes", action="store_true", help="skip the writes table (saves 32 s)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: n 20, 1 round, 3 kills, 3 step runs")
    parser.add_argument("--mock-port", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--steps-child", nargs=3, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mock_port is not None:
        run_mock(args.mock_port)
        return
    if args.steps_child is not None:
        url, k, runs = args.steps_child
        asyncio.run(steps_child(url, int(k), int(runs)))
        return
    if args.quick:
        args.n, args.runs, args.kills, args.step_runs = min(args.n, 20), 1, min(args.kills, 3), 3
    signal.signal(signal.SIGTERM, _terminated)
    try:
        asyncio.run(bench_all(args))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
    finally:
        stop_all()  # a safety net: bench_all stops them on every path it can


def _terminated(*_: Any) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    main()
