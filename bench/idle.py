"""What an idle `ringlet serve` spends, per timer: its CPU (and PostgreSQL's) with nothing to do.

For each store (a SQLite file; with `--postgres`, a private PostgreSQL server like the tests', where runs are
DBOS workflows), it starts `ringlet serve` once with the defaults and once per timer with that timer slowed to
once an hour (its setting, through the environment), lets it settle, and measures the CPU of the server's
process (all threads) and of PostgreSQL's processes over `--seconds`; a timer's cost is the defaults' figure
less the figure without it. "all slowed" leaves what no setting reaches (DBOS's fixed timers: its queue
manager, its background jobs, the internal queue's poll; asyncio's and uvicorn's own).

Then, for the defaults, the server's CPU per thread over the same span (`THREADS`: the server runs in a
wrapper that reads each Python thread's CPU from /proc when asked): the event loop (ringlet's own timers,
uvicorn's), DBOS's threads (its queues' polls, queue manager, scheduler, background jobs, notification
listener) and ringlet's heartbeat thread.

Run: `.venv/bin/python bench/idle.py [--postgres] [--seconds 10] [--runs 3]` (figures: medians over the runs).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # server_load, commits
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from commits import postgres_cpu
from server_load import cpu_seconds, free_port, start, stop, wait_ready

HOUR = "3600"
THREADS = """
import json, os, signal, sys, threading
def dump(*_):
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for t in threading.enumerate():
        try:
            f = open(f"/proc/self/task/{t.native_id}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = t.name.split(" (")[-1].rstrip(")") if "(" in t.name else t.name
        out[name] = out.get(name, 0) + (int(f[11]) + int(f[12])) / tick
    with open(os.environ["RINGLET_BENCH_THREADS"], "w") as file:
        json.dump(out, file)
signal.signal(signal.SIGUSR1, dump)
import runpy
sys.argv = ["ringlet", *sys.argv[1:]]
runpy.run_module("ringlet", run_name="__main__")
"""
"""The server's wrapper: on SIGUSR1 it writes each thread's CPU seconds (by its name) to $RINGLET_BENCH_THREADS."""
TIMERS: dict[str, dict[str, str]] = {
    "defaults": {},
    "fire_poll_s (fires queue's poll)": {"RINGLET_FIRE_POLL_S": HOUR},
    "queue_poll_s (run queues' polls)": {"RINGLET_QUEUE_POLL_S": HOUR},
    "cron_refresh_s (DBOS scheduler)": {"RINGLET_CRON_REFRESH_S": HOUR},
    "heartbeat_s (beat, dead-worker check)": {"RINGLET_HEARTBEAT_S": HOUR, "RINGLET_WORKER_TIMEOUT_S": "36000"},
    "sweep_interval_s (retention)": {"RINGLET_SWEEP_INTERVAL_S": HOUR},
}
TIMERS["all slowed"] = {k: v for env in TIMERS.values() for k, v in env.items()}


async def idle(url: str, env: dict[str, str], seconds: float, data: Path | None, tmp: Path, *,
               threads: dict[str, list[float]] | None = None) -> tuple[float, float]:
    """(server, PostgreSQL) CPU ms per second of one idle server started with `env`; `threads`: each thread's
    CPU ms per second is added to it (by thread name)."""
    port = free_port()
    saved = dict(os.environ)
    dumps = tmp / "threads.json"
    os.environ.update({**env, "RINGLET_BENCH_THREADS": str(dumps)})
    try:
        server = start([sys.executable, "-c", THREADS, "serve", "--host", "127.0.0.1", "--port", str(port),
                        "--db", url, "--agents", str(tmp / "agents"), "--auth", "none"], tmp / "ringlet.log")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        await wait_ready(f"http://127.0.0.1:{port}/readyz", server)
        await asyncio.sleep(3)  # startup's own work (recovery, restore, the first sweep) is over
        before = _threads(server, dumps)
        cpu, pg = cpu_seconds(server.pid), postgres_cpu(data) if data else 0.0
        await asyncio.sleep(seconds)
        figures = ((cpu_seconds(server.pid) - cpu) * 1000 / seconds,
                   ((postgres_cpu(data) - pg) * 1000 / seconds) if data else 0.0)
        after = _threads(server, dumps)
        if threads is not None:
            for name, spent in after.items():
                threads.setdefault(name, []).append((spent - before.get(name, 0.0)) * 1000 / seconds)
        return figures
    finally:
        stop(server)


def _threads(server: subprocess.Popen[bytes], dumps: Path) -> dict[str, float]:
    """Each thread's CPU seconds so far, by name (the wrapper writes them on SIGUSR1)."""
    dumps.unlink(missing_ok=True)
    server.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 10
    while not dumps.exists() or not dumps.read_text().endswith("}"):
        if time.monotonic() > deadline:
            raise RuntimeError("the server wrote no CPU per thread")
        time.sleep(0.01)
    return json.loads(dumps.read_text())


async def bench(stores: dict[str, tuple[str, Path | None]], seconds: float, runs: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="ringlet-idle-"))
    (tmp / "agents" / "bench").mkdir(parents=True)
    (tmp / "agents" / "bench" / "config.yaml").write_text(
        "description: idle agent\nmodel: openai:mock\nmodel_options: {base_url: \"http://127.0.0.1:9/v1\", "
        "api_key: x}\ninstructions: Answer briefly.\n")
    try:
        print(f"idle CPU, ms per second over {seconds:.0f} s, median of {runs} run(s); a timer's cost: the defaults' "
              "figure less the figure with that timer slowed to once an hour")
        print(f"{'store':<11} {'slowed':<40} {'server':>7} {'cost':>6} {'postgres':>9} {'cost':>6}")
        for name, (url, data) in stores.items():
            base: tuple[float, float] | None = None
            threads: dict[str, list[float]] = {}
            for timer, env in TIMERS.items():
                figures = [await idle(url, env, seconds, data, tmp, threads=threads if timer == "defaults" else None)
                           for _ in range(runs)]
                m = (statistics.median(f[0] for f in figures), statistics.median(f[1] for f in figures))
                base = base or m
                cost = "" if timer == "defaults" else f"{base[0] - m[0]:6.1f}"
                pg_cost = "" if timer == "defaults" or data is None else f"{base[1] - m[1]:6.1f}"
                print(f"{name:<11} {timer:<40} {m[0]:7.1f} {cost:>6} {m[1] if data else 0:9.1f} {pg_cost:>6}",
                      flush=True)
            print(f"{name}, defaults, per thread (ms/s): " + ", ".join(
                f"{thread} {statistics.median(spent):.1f}" for thread, spent in
                sorted(threads.items(), key=lambda kv: -statistics.median(kv[1])) if statistics.median(spent) >= 0.05))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--postgres", action="store_true", help="beside SQLite, a store on a private PostgreSQL")
    parser.add_argument("--seconds", type=float, default=10, help="seconds of idle measured per server")
    parser.add_argument("--runs", type=int, default=3, help="servers started per configuration")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        folder = Path(tempfile.mkdtemp(prefix="ringlet-idle-db-"))
        stack.callback(shutil.rmtree, folder, ignore_errors=True)
        stores: dict[str, tuple[str, Path | None]] = {"SQLite": (f"sqlite:///{folder}/ringlet.db", None)}
        if args.postgres:
            from postgres import postgres_server

            url = stack.enter_context(postgres_server()).replace("postgresql+asyncpg://", "postgresql://")

            async def data_dir() -> Path:
                import asyncpg

                conn = await asyncpg.connect(url)
                try:
                    return Path(await conn.fetchval("SHOW data_directory"))
                finally:
                    await conn.close()

            stores["PostgreSQL"] = (url, asyncio.run(data_dir()))
        asyncio.run(bench(stores, args.seconds, args.runs))


if __name__ == "__main__":
    main()
