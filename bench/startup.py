"""What a `ringlet` process costs to start (issue 51): CPU seconds from its spawn until it is ready.

Each case starts the real command line `--runs` times, on a fresh database each time (as the crash tests do),
and reads the process's own CPU time (user + system, `/proc/<pid>/stat`) once its stderr says it is ready;
then kills it. Printed per case: the median, min and max CPU seconds and the median wall seconds.

    serve           `ringlet serve` on a new SQLite file (in process runs; the default for users)
    serve-pg        `ringlet serve` (durable: a DBOS worker too) on a new PostgreSQL database
    serve-api-pg    `ringlet serve --no-worker` on a new PostgreSQL database
    worker-pg       `ringlet worker` on a new PostgreSQL database
    import          `python -c "import ringlet.server.app"`: the imports alone

The PostgreSQL cases start a private server (`tests/postgres.py`) and copy its migrated template database.
Run: `.venv/bin/python bench/startup.py [--runs 5] [--cases serve,serve-pg,...]`. Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from postgres import fresh_database, make_template, postgres_server

TICK = os.sysconf("SC_CLK_TCK")
CASES = ("import", "serve", "serve-pg", "serve-api-pg", "worker-pg")


def _cpu(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (its reaped children included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / TICK


async def _start(args: list[str], ready: bytes, env: dict[str, str]) -> tuple[float, float]:
    """Start `python ARGS`, wait for `ready` on its stderr (or its exit), return (CPU s, wall s)."""
    began = time.monotonic()
    process = await asyncio.create_subprocess_exec(sys.executable, *args, env={**os.environ, **env},
                                                   stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    assert process.stderr is not None
    try:
        async with asyncio.timeout(120):
            while True:
                line = await process.stderr.readline()
                if ready and ready in line:
                    cpu = _cpu(process.pid)
                    break
                if not line:  # exited: a whole `python -c` run, or a failed start
                    await process.wait()
                    if process.returncode != 0:
                        raise RuntimeError(f"{args} exited with {process.returncode} before it was ready")
                    cpu = _children_cpu()
                    break
        return cpu, time.monotonic() - began
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


_reaped = [0.0]


def _children_cpu() -> float:
    """CPU of the child reaped last: the growth of this process's reaped-children total."""
    usage = os.times()
    total = usage.children_user + usage.children_system
    grown, _reaped[0] = total - _reaped[0], total
    return grown


async def _case(case: str, runs: int, server: str | None, tmp: Path) -> list[tuple[float, float]]:
    agents = tmp / "agents"
    agents.mkdir(exist_ok=True)
    env = {"RINGLET_AUTH_MODE": "none"}
    results = []
    for i in range(runs):
        if case == "import":
            _children_cpu()
            results.append(await _start(["-c", "import ringlet.server.app"], b"", {}))
            continue
        async with contextlib.AsyncExitStack() as stack:
            if case == "serve":
                db = f"sqlite:///{tmp}/run-{i}.db"
            else:
                assert server is not None
                db = await stack.enter_async_context(fresh_database(server))
            command = {"serve": ["serve"], "serve-pg": ["serve"], "serve-api-pg": ["serve", "--no-worker"],
                       "worker-pg": ["worker"]}[case]
            port = ["--port", str(_free_port())] if command[0] == "serve" else []
            ready = b"ready" if command[0] == "worker" else b"Uvicorn running on"
            results.append(await _start(["-m", "ringlet", *command, *port, "--db", db, "--agents", str(agents)],
                                        ready, env))
    return results


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def startup(runs: int, cases: list[str]) -> dict[str, dict[str, float]]:
    with contextlib.ExitStack() as sync, tempfile.TemporaryDirectory() as folder:
        server = None
        if any(c.endswith("-pg") for c in cases):
            server = sync.enter_context(postgres_server())
            make_template(server)
        figures = {}
        for case in cases:
            results = await _case(case, runs, server, Path(folder))
            cpu = [c for c, _ in results]
            figures[case] = {"cpu_median_s": round(statistics.median(cpu), 3), "cpu_min_s": round(min(cpu), 3),
                             "cpu_max_s": round(max(cpu), 3),
                             "wall_median_s": round(statistics.median(w for _, w in results), 3)}
        return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cases", default=",".join(CASES))
    options = parser.parse_args()
    cases = options.cases.split(",")
    unknown = set(cases) - set(CASES)
    if unknown:
        parser.error(f"unknown case(s) {sorted(unknown)}; choose among {', '.join(CASES)}")
    for case, figures in asyncio.run(startup(options.runs, cases)).items():
        print(json.dumps({"case": case, **figures}))


if __name__ == "__main__":
    main()
