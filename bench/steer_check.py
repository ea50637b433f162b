"""What a durable run pays per round to be steerable: the round-boundary check of `ringlet.server.durable.steers`
against receiving from DBOS at every boundary (`DBOS.recv(topic, timeout_seconds=0)`, the obvious way).

In a DBOS workflow of K rounds, each round does one of:

- `flag`: ringlet's check: `inbox.pending` (an attribute, set when the feed hears a steer), and `take` only
  when it is set (never, here: nobody steers);
- `recv`: one `DBOS.recv_async("steer", timeout_seconds=0)` (a query for a message, the recorded sleep of its
  timeout, and the recorded result: what a poll at every boundary costs);
- `taken`: a steer sent before each round and taken there, all included: the driver's `DBOS.send` of the
  steer and of a go-ahead the workflow waits for, and the inbox's two receives (the one that returns it, and
  the one that finds none left).

Per-round cost = (workflow of K rounds - empty workflow) / K, median of `--runs`; DBOS's system database on
PostgreSQL (a private server, as the tests start) and on SQLite, one subprocess each (DBOS launches once per
process). Run: `.venv/bin/python bench/steer_check.py [--rounds 200] [--runs 5]`. Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FLAG_X = 100
"""The `flag` workflow runs this many times more rounds (its rounds cost next to nothing: the empty workflow's
own variation would hide them)."""
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "src"))


async def child(url: str, k: int, runs: int) -> None:
    """Print JSON: per run, seconds for an empty workflow and for K rounds of each kind."""
    from dbos import DBOS, SetWorkflowID

    from ringlet.loop.steering import Steer
    from ringlet.messages import Message
    from ringlet.server.durable.steers import TOPIC, DurableInbox

    @DBOS.workflow(name="bench.empty")
    async def empty() -> int:
        return 0

    @DBOS.workflow(name="bench.flag")
    async def flag(k: int) -> int:
        inbox, taken = DurableInbox(), 0
        for i in range(k):
            if inbox.pending:
                taken += len(await inbox.take(i))
        return taken

    @DBOS.workflow(name="bench.recv")
    async def recv(k: int) -> int:
        taken = 0
        for _ in range(k):
            taken += await DBOS.recv_async(TOPIC, timeout_seconds=0) is not None
        return taken

    @DBOS.workflow(name="bench.taken")
    async def taken(k: int) -> int:
        inbox, got = DurableInbox(), 0
        for i in range(k):
            await DBOS.recv_async("go", timeout_seconds=60)  # the driver sent a steer, then this
            inbox.heard = True  # as the feed sets it
            got += len(await inbox.take(i))
        return got

    async def timed(work: Any) -> float:
        started = time.perf_counter()
        await work
        return time.perf_counter() - started

    steer = Steer("st_1", Message.user("only the errors")).to_json()

    async def steered(k: int, n: int) -> float:
        wid = f"taken-{n}"
        started = time.perf_counter()
        with SetWorkflowID(wid):
            handle = await DBOS.start_workflow_async(taken, k)
        for _ in range(k):
            await DBOS.send_async(wid, steer, topic=TOPIC)
            await DBOS.send_async(wid, 1, topic="go")
        assert await handle.get_result() == k
        return time.perf_counter() - started

    DBOS(config={"name": "ringlet-bench-steer", "system_database_url": url, "log_level": "WARNING"})
    DBOS.launch()
    try:
        await empty()  # warm-up
        await flag(5)
        await recv(5)
        await steered(5, -1)
        out = [{"empty": await timed(empty()), "flag": (await timed(flag(k * FLAG_X))) / FLAG_X,
                "recv": await timed(recv(k)), "taken": await steered(k, n)} for n in range(runs)]
        print(json.dumps(out))
    finally:
        DBOS.destroy()


def measure(url: str, k: int, runs: int) -> dict[str, float]:
    done = subprocess.run([sys.executable, __file__, "--child", url, str(k), str(runs)], capture_output=True,
                          text=True, check=True)
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    cost = {kind: statistics.median((r[kind] - r["empty"]) / k for r in rows) for kind in ("recv", "taken")}
    cost["flag"] = statistics.median((r["flag"] * FLAG_X - r["empty"]) / (k * FLAG_X) for r in rows)
    return cost


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        asyncio.run(child(args.child[0], int(args.child[1]), int(args.child[2])))
        return
    from postgres import postgres_server  # pyright: ignore[reportMissingImports]  (tests/, on sys.path)

    results: dict[str, dict[str, float]] = {}
    with postgres_server() as url, tempfile.TemporaryDirectory() as tmp:
        pg = url.replace("postgresql+asyncpg://", "postgresql://")
        results["PostgreSQL"] = measure(pg, args.rounds, args.runs)
        results["SQLite"] = measure(f"sqlite:///{Path(tmp) / 'dbos.sqlite'}", args.rounds, args.runs)
    print(f"per round, {args.rounds} rounds, median of {args.runs} runs (workflow minus an empty one)")
    print(f"{'system database':<16} {'flag (ringlet)':>16} {'recv every round':>18} {'steer taken':>13}")
    for db, r in results.items():
        print(f"{db:<16} {r['flag'] * 1e6:>13.2f} µs {r['recv'] * 1e3:>15.3f} ms {r['taken'] * 1e3:>10.3f} ms")


if __name__ == "__main__":
    main()
