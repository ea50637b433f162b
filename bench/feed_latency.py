"""Latency of the cross-process live feed (`ringlet.server.durable.feed`): a run in process B, a stream in process A.

A real second OS process (this script with `--writer`) appends events to the shared PostgreSQL store one
at a time, as a run's driver does, each stamped with `time.time()` in its payload just before the append;
this process's `Feed` delivers them into a `Hub` subscriber. Per event it measures the publish time in
the hub minus the stamp (what a stream in A waits beyond what B's own stream waits: B stores each event
before publishing it too), and minus the moment B's append returned (the feed's own share: notification,
read, publish). Prints p50/p99 of each over `--events` events, the median over `--runs` runs.
Target: p99 ≤ 50 ms on loopback.

Run: `.venv/bin/python bench/feed_latency.py [--url postgresql://…] [--events 500] [--runs 3] [--gap-ms 2]`
(without `--url` it starts a private PostgreSQL server, as the tests do).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from ringlet.server.durable.feed import Feed  # noqa: E402
from ringlet.server.runs.active import Hub, Published  # noqa: E402
from ringlet.store import Store  # noqa: E402


class _TimedHub(Hub):
    def __init__(self) -> None:
        super().__init__(maxsize=100_000)
        self.at: dict[int, float] = {}

    def publish(self, conversation_id: str, item: Published) -> None:
        self.at.setdefault(item.id, time.time())
        super().publish(conversation_id, item)


async def writer(url: str, cid: str, events: int, gap_s: float) -> None:
    """Process B: append `events` events one at a time; print when each append returned."""
    store = await Store.open(url)
    done: list[float] = []
    for n in range(events):
        await store.events.append_batch([(cid, "content_delta", {"run_id": "r_bench", "message_id": "m_1",
                                                           "delta": f"token {n} ", "sent": time.time()})])
        done.append(time.time())
        if gap_s:
            await asyncio.sleep(gap_s)
    await store.close()
    print(json.dumps(done))


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


async def one_run(url: str, events: int, gap_ms: float) -> tuple[float, float, float, float]:
    store = await Store.open(url)
    hub = _TimedHub()
    feed = Feed(store, hub)
    await feed.start()
    cid = (await store.conversations.create(agent="bench"))["id"]
    try:
        with hub.subscribe(cid) as subscriber:
            child = await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--writer", "--url", url, "--cid", cid, "--events", str(events),
                "--gap-ms", str(gap_ms), stdout=subprocess.PIPE)
            got: list[Published] = []
            async with asyncio.timeout(60 + events * (gap_ms / 1000 + 0.05)):
                while len(got) < events:
                    got.append(await subscriber.queue.get())
            out, _ = await child.communicate()
    finally:
        await feed.close()
        await store.close()
    assert [item.id for item in got] == list(range(1, events + 1)), "out of order, a gap or a duplicate"
    appended = json.loads(out)
    from_stamp = [(hub.at[item.id] - json.loads(item.data)["sent"]) * 1000 for item in got]
    from_commit = [(hub.at[item.id] - appended[item.id - 1]) * 1000 for item in got]
    return (percentile(from_stamp, 50), percentile(from_stamp, 99), percentile(from_commit, 50),
            percentile(from_commit, 99))


async def main(args: argparse.Namespace) -> None:
    with ExitStack() as stack:
        url = args.url
        if url is None:
            from postgres import postgres_server

            url = stack.enter_context(postgres_server())
        await (await Store.open(url)).close()  # migrate once, before the runs
        results = []
        for run in range(args.runs):
            result = await one_run(url, args.events, args.gap_ms)
            results.append(result)
            print(f"run {run + 1}: publish - stamp p50 {result[0]:.2f} ms, p99 {result[1]:.2f} ms; "
                  f"publish - append returned p50 {result[2]:.2f} ms, p99 {result[3]:.2f} ms")
        median = [statistics.median(r[i] for r in results) for i in range(4)]
        print(f"median of {args.runs} runs, {args.events} events, {args.gap_ms} ms between appends:")
        print(f"  added latency (publish in A - stamp in B):       p50 {median[0]:.2f} ms   p99 {median[1]:.2f} ms"
              f"   (target p99 <= 50 ms)")
        print(f"  feed's share (publish in A - B's append returned): p50 {median[2]:.2f} ms   p99 {median[3]:.2f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a PostgreSQL URL (default: start a private server)")
    parser.add_argument("--events", type=int, default=500)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--gap-ms", type=float, default=2.0, help="pause between B's appends")
    parser.add_argument("--writer", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cid", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.writer:
        asyncio.run(writer(args.url, args.cid, args.events, args.gap_ms / 1000))
    else:
        asyncio.run(main(args))
