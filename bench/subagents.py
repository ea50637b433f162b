"""Sub-agent figures (issue #8), on zero-latency models unless said otherwise.

Prints medians of REPEATS repetitions:
- a direct run of the child agent (one model request, a text answer);
- a parent whose tool awaits `child.run()` itself, and the same parent calling `spawn_agent` instead;
  the difference is what the sub-agent machinery costs per call (slots, a new conversation, the child's
  events forwarded and tagged into the parent's stream, its usage added);
- a fan-out: one parent round of 16 `spawn_agent` calls, each child making one 200 ms model call, with
  `max_concurrent_agents` 4 (ideal: 4 waves of 200 ms = 800 ms).

Run: `.venv/bin/python bench/subagents.py`
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from ringlet import Agent, Limits, SubAgents, tool
from ringlet.models.base import ModelRequest
from ringlet.testing import FunctionModel, ScriptedModel, call

REPEATS = 7
CALLS = 200


def child() -> Agent:
    return Agent(FunctionModel(lambda r: "child answer"), name="child")


def parent(calls: list[Any], **options: Any) -> Agent:
    return Agent(ScriptedModel([*calls, "done"] * CALLS), name="parent", limits=Limits(max_iterations=50), **options)


async def per_call(make: Any) -> float:
    """Microseconds per run of `make()`'s agent, over CALLS runs."""
    agent = make()
    started = time.perf_counter()
    for _ in range(CALLS):
        await agent.run("go")
    return (time.perf_counter() - started) / CALLS * 1e6


async def fan_out() -> float:
    async def slow(request: ModelRequest) -> str:
        await asyncio.sleep(0.2)
        return "slow answer"

    worker = Agent(FunctionModel(slow), name="worker")
    lead = Agent(ScriptedModel([[call("spawn_agent", {"task": str(i), "agent": "worker"}) for i in range(16)],
                                "all done"]), name="lead", tools=[SubAgents([worker], max_concurrent_agents=4)])
    started = time.perf_counter()
    result = await lead.run("fan out")
    assert result.output == "all done", result.output
    return (time.perf_counter() - started) * 1000


async def main() -> None:
    the_child = child()

    @tool(effect="read")
    async def ask_child(task: str) -> str:
        """Run the child directly."""
        return (await the_child.run(task)).output

    figures: dict[str, list[float]] = {"direct": [], "tool": [], "spawn": [], "fan": []}
    for _ in range(REPEATS):
        figures["direct"].append(await per_call(child))
        figures["tool"].append(await per_call(lambda: parent([call("ask_child", {"task": "x"})], tools=[ask_child])))
        figures["spawn"].append(await per_call(lambda: parent([call("spawn_agent", {"task": "x", "agent": "child"})],
                                                              tools=[SubAgents([the_child])])))
        figures["fan"].append(await fan_out())
    med = {k: statistics.median(v) for k, v in figures.items()}
    print(f"direct child run:                         {med['direct']:8.0f} µs")
    print(f"parent + tool awaiting child.run():       {med['tool']:8.0f} µs")
    print(f"parent + spawn_agent:                     {med['spawn']:8.0f} µs")
    print(f"sub-agent overhead per call (spawn - tool): {med['spawn'] - med['tool']:6.0f} µs")
    print(f"fan-out of 16 × 200 ms children, concurrency 4: {med['fan']:6.0f} ms (ideal 800 ms)")


if __name__ == "__main__":
    asyncio.run(main())
