"""Memory held per in-flight run (issue #24: ≤ 8 KiB): N runs of one agent, each suspended inside its model
request (the model waits on an event, as a real one waits on the network), measured with tracemalloc.

Prints the median over several runs of (memory while all N are suspended − memory before) / N, and with
`--top K` the K source lines that hold the most of it.

Run: `.venv/bin/python bench/inflight_memory.py [--runs 5] [--n 500] [--top 0]`
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import tracemalloc

from ringlet import Agent, tool
from ringlet.models.base import Finish, ModelRequest, TextDelta


@tool(effect="read")
def ping(n: int) -> str:
    """Answer pong."""
    return f"pong {n}"


class WaitingModel:
    """Answers "done" once `release` is set; counts the requests waiting."""

    name = "bench:waiting"
    context_window = None

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.waiting = 0
        self.all_waiting = asyncio.Event()
        self.expected = 0

    async def stream(self, request: ModelRequest):
        self.waiting += 1
        if self.waiting == self.expected:
            self.all_waiting.set()
        await self.release.wait()
        yield TextDelta("done")
        yield Finish("stop")


async def consume(agent: Agent) -> None:
    """A caller reading the run's events as they come (the server's and the CLI's way)."""
    async for _ in agent.stream("hello"):
        pass


async def held_per_run(n: int, top: int, *, streamed: bool) -> float:
    model = WaitingModel()
    agent = Agent(model, tools=[ping])  # type: ignore[arg-type]
    model.expected = n
    gc.collect()
    tracemalloc.start(25 if top else 1)
    before = tracemalloc.take_snapshot() if top else None
    base = tracemalloc.get_traced_memory()[0]
    tasks = [asyncio.ensure_future(consume(agent) if streamed else agent.run("hello")) for _ in range(n)]
    await model.all_waiting.wait()
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - base
    if top and before is not None:
        stats = tracemalloc.take_snapshot().compare_to(before, "lineno")
        for stat in stats[:top]:
            print(f"    {stat.size_diff / n:8.0f} B/run  {stat.traceback}")
    tracemalloc.stop()
    model.release.set()
    await asyncio.gather(*tasks)
    return held / n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--top", type=int, default=0)
    args = parser.parse_args()
    for streamed in (False, True):
        values = [asyncio.run(held_per_run(args.n, args.top if i == 0 else 0, streamed=streamed))
                  for i in range(args.runs)]
        how = "agent.stream(), events read" if streamed else "agent.run()"
        print(f"memory held per in-flight run ({how}; model suspended in its request), {args.n} runs, "
              f"median of {args.runs}: {statistics.median(values) / 1024:.1f} KiB  (target ≤ 8 KiB)")


if __name__ == "__main__":
    main()
