"""Loop overhead on a zero-latency ScriptedModel (issue #2's figures).

Prints medians of REPEATS repetitions:
- microseconds per round of a 10-round run (one trivial tool call per round, then a text answer), beside the
  floor: a hand-written loop over plain dicts doing the same work;
- a first run: build an agent and run one tool round and the answer;
- agent construction time (one @tool tool; two plain typed functions, the same two for every agent, as
  when an agent is built per request); bytes retained per agent;
- wall time of 200 concurrent 3-round runs on one event loop (their model yields to the event loop once per
  request, as a real one does, so the runs overlap);
- wall time of one round with 8 parallel tool calls that each sleep 50 ms;
- `python -c "import ringlet"` time, `from ringlet import Agent, tool`, and that plus the first Agent, beside
  the floor of importing asyncio and pydantic (ringlet's bytecode is written first).

Run: `.venv/bin/python bench/loop_overhead.py`
"""

from __future__ import annotations

import asyncio
import gc
import json
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

from ringlet import Agent, Limits, tool
from ringlet.testing import ScriptedModel, call

REPEATS = 7


@tool(effect="read")
async def ping(n: int) -> str:
    """Return a pong."""
    return "pong"


@tool(effect="read")
async def nap(i: int) -> str:
    """Sleep 50 ms."""
    await asyncio.sleep(0.05)
    return "rested"


def get_weather(city: str, unit: str = "celsius") -> str:
    """The current weather in a city.

    Args:
        city: The city's name.
        unit: "celsius" or "fahrenheit".
    """
    return "sunny"


def convert(amount: float, currency: str, to: str = "EUR") -> float:
    """Convert money between currencies.

    Args:
        amount: How much.
        currency: The ISO code it is in.
        to: The ISO code wanted.
    """
    return amount


def script(rounds: int) -> list:
    return [*(call("ping", n=i) for i in range(rounds)), "done"]


def agent_for(rounds: int, **kw) -> Agent:
    return Agent(ScriptedModel(script(rounds)), tools=[ping], limits=Limits(max_iterations=rounds + 1), **kw)


async def per_round_us() -> float:
    runs = 200
    agents = [agent_for(10) for _ in range(runs)]
    for _ in range(5):  # warm-up
        await agent_for(10).run("go")
    started = time.perf_counter()
    for a in agents:
        await a.run("go")
    elapsed = time.perf_counter() - started
    return elapsed / runs / 11 * 1e6  # 10 tool rounds + the answering round


async def bare_round_us() -> float:
    """The floor, measured side by side: a hand-written loop over plain dicts, same script and tool."""

    async def model(i: int, rounds: int):
        if i < rounds:
            yield {"type": "call", "name": "ping", "args": json.dumps({"n": i})}
        else:
            yield {"type": "text", "text": "done"}

    async def ping_fn(n: int) -> str:
        return "pong"

    async def bare(rounds: int) -> None:
        messages = [{"role": "user", "content": "go"}]
        for i in range(rounds + 1):
            calls, text = [], ""
            async for chunk in model(i, rounds):
                if chunk["type"] == "call":
                    calls.append(chunk)
                else:
                    text += chunk["text"]
            messages.append({"role": "assistant", "content": text, "calls": calls})
            for c in calls:
                messages.append({"role": "tool", "content": await ping_fn(**json.loads(c["args"]))})  # noqa: PERF401

    runs = 200
    started = time.perf_counter()
    for _ in range(runs):
        await bare(10)
    return (time.perf_counter() - started) / runs / 11 * 1e6


async def first_run_us() -> float:
    """Build an agent and run it: one tool round, then the answer (a new agent each time, as per request)."""
    runs = 2_000

    async def once() -> None:
        await Agent(ScriptedModel(script(1)), tools=[ping]).run("go")

    for _ in range(20):  # warm-up
        await once()
    started = time.perf_counter()
    for _ in range(runs):
        await once()
    return (time.perf_counter() - started) / runs * 1e6


def construction_us() -> float:
    model = ScriptedModel([])
    n = 20_000
    started = time.perf_counter()
    for _ in range(n):
        Agent(model, tools=[ping])
    return (time.perf_counter() - started) / n * 1e6


def construction_functions_us() -> float:
    """An agent whose tools are two plain functions (not `@tool`): the same two for every agent."""
    model = ScriptedModel([])
    Agent(model, tools=[get_weather, convert])  # the first agent pays for whatever is built once per function
    n, started = 0, time.perf_counter()
    while n < 20_000 and time.perf_counter() - started < 0.5:  # a time box: slow builds get fewer agents
        for _ in range(100):
            Agent(model, tools=[get_weather, convert])
        n += 100
    return (time.perf_counter() - started) / n * 1e6


def bytes_per_agent() -> float:
    model = ScriptedModel([])
    n = 2_000
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    keep = [Agent(model, tools=[ping]) for _ in range(n)]
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del keep
    return (after - before) / n


class YieldingModel(ScriptedModel):
    """A scripted model that suspends once per request (zero latency, but the runs interleave)."""

    def stream(self, request):
        chunks = super().stream(request)

        async def play():
            await asyncio.sleep(0)
            async for chunk in chunks:
                yield chunk

        return play()


async def concurrent_ms() -> float:
    agents = [Agent(YieldingModel(script(2)), tools=[ping], limits=Limits(max_iterations=3)) for _ in range(200)]
    started = time.perf_counter()
    await asyncio.gather(*(a.run("go") for a in agents))
    return (time.perf_counter() - started) * 1000


async def parallel_ms() -> float:
    agent = Agent(ScriptedModel([[call("nap", i=i) for i in range(8)], "done"]), tools=[nap])
    stream = agent.stream("go")
    started = end = time.perf_counter()
    async for event in stream:
        if event.type == "tool_result":
            end = time.perf_counter()
    return (end - started) * 1000


def compiled() -> None:
    """Write ringlet's bytecode first: with PYTHONDONTWRITEBYTECODE set (as on these machines), an edited module
    would otherwise be compiled again on every import and the figure would measure the compiler."""
    import ringlet

    subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(ringlet.__file__).parent)], check=True,
                   capture_output=True)


def import_ms(statement: str = "import ringlet") -> float:
    code = f"import time; t = time.perf_counter(); {statement}; print(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout) * 1000


def import_agent_ms() -> float:
    return import_ms("from ringlet import Agent, tool")


def first_agent_ms() -> float:
    return import_ms("from ringlet import Agent; from ringlet.testing import ScriptedModel; Agent(ScriptedModel([]))")


def import_floor_ms() -> float:
    """What ringlet's import cannot go below while its settings are pydantic models and its loop is asyncio."""
    return import_ms("import asyncio; from pydantic import BaseModel, Field, TypeAdapter")


def median(fn, *, is_async: bool = False) -> float:
    values = [asyncio.run(fn()) if is_async else fn() for _ in range(REPEATS)]
    return statistics.median(values)


def main() -> None:
    compiled()
    rows = [
        ("per round (10-round run, trivial tool)", median(per_round_us, is_async=True), "µs", 100),
        ("  the floor: bare loop over plain dicts", median(bare_round_us, is_async=True), "µs", None),
        ("first run: build an agent, one tool round", median(first_run_us, is_async=True), "µs", None),
        ("agent construction", median(construction_us), "µs", 10),
        ("agent construction, two plain-function tools", median(construction_functions_us), "µs", 15),
        ("bytes retained per agent", median(bytes_per_agent), "B", None),
        ("200 concurrent 3-round runs", median(concurrent_ms, is_async=True), "ms", 100),
        ("one round, 8 parallel 50 ms tools", median(parallel_ms, is_async=True), "ms", 60),
        ("import ringlet", median(import_ms), "ms", 150),
        ("from ringlet import Agent, tool (first use)", median(import_agent_ms), "ms", None),
        ("  import ringlet + the first Agent", median(first_agent_ms), "ms", None),
        ("  the floor: import asyncio, pydantic", median(import_floor_ms), "ms", None),
    ]
    print(f"ringlet loop overhead, median of {REPEATS} (Python {sys.version.split()[0]})")
    for name, value, unit, target in rows:
        goal = f"(target ≤ {target} {unit})" if target else ""
        print(f"  {name:<46} {value:10.1f} {unit:<3} {goal}")


if __name__ == "__main__":
    main()
