"""What an evaluation costs per case beyond the agent's runs (issue #41 target: ringlet ≤ 2× the floor).

A dataset of N cases (default 200) on a tool-using agent whose model has no latency (a `FunctionModel`:
the first request of a run calls the `lookup` tool, the second answers with text; two model requests per
case). Typical evaluators: the dataset's `NoError` and `ToolCalled: lookup`, and per case `EqualsExpected`
(even cases) or `Contains` (odd ones). Three ways, side by side in one process, interleaved in every round
(their order rotating) so that drift hits all of them alike:

- floor: a hand-written loop over `agent.run(prompt)` under an asyncio semaphore, checking each
  expected output by hand;
- ringlet: `Dataset.evaluate(agent, concurrency=N)` (each run through the agent's stream, judged, reported);
- pydantic-evals: its `Dataset.evaluate(task, max_concurrency=N, progress=False)`, the task being
  `(await agent.run(prompt)).output`, with its `EqualsExpected`/`Contains` (it has no NoError/ToolCalled).

Each way runs the whole dataset once per round, after one warm-up round; wall time (`perf_counter`) and
process CPU time (`process_time`) are divided by the number of cases. Prints the medians over the rounds
and ringlet's ratio to the floor and to pydantic-evals. Every way's results are checked (all cases pass).

Run: `.venv/bin/python bench/evals.py [--cases 200] [--runs 5] [--concurrency 1,8]`
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import re
import statistics
import sys
import time
from collections.abc import Awaitable, Callable

from pydantic_evals import Case as PECase
from pydantic_evals import Dataset as PEDataset
from pydantic_evals.evaluators import Contains as PEContains
from pydantic_evals.evaluators import EqualsExpected as PEEqualsExpected

from ringlet import Agent, tool
from ringlet.evals import Case, Contains, Dataset, EqualsExpected, NoError, ToolCalled
from ringlet.models.base import ModelRequest
from ringlet.testing import FunctionModel, Reply, Script, call

WAYS = ("floor", "ringlet", "pydantic-evals")
ITEM = re.compile(r"item (\d+)")


@tool(effect="read")
async def lookup(item: int) -> str:
    """The code of an item."""
    return f"code-{item * 7}"


def answer(request: ModelRequest) -> Script:
    """The first request calls `lookup` for the prompt's item; the second (after the tool result) answers."""
    last = request.messages[-1]
    if last.role == "tool":
        item = ITEM.search(next(m.text for m in request.messages if m.role == "user"))
        assert item is not None
        return Reply(f"Item {item[1]} has code {last.text}.")
    found = ITEM.search(last.text)
    assert found is not None
    return call("lookup", item=int(found[1]))


def prompt(i: int) -> str:
    return f"What is the code of item {i}?"


def expected(i: int) -> str:
    return f"Item {i} has code code-{i * 7}." if i % 2 == 0 else f"code-{i * 7}"


def ringlet_dataset(n: int) -> Dataset:
    cases = [Case(name=f"case-{i}", inputs=prompt(i), expected_output=expected(i) if i % 2 == 0 else None,
                  evaluators=[EqualsExpected()] if i % 2 == 0 else [Contains(expected(i))]) for i in range(n)]
    return Dataset(cases=cases, evaluators=[NoError(), ToolCalled("lookup")], name="bench")


def pe_dataset(n: int) -> PEDataset[str, str, None]:
    cases: list[PECase[str, str, None]] = [
        PECase(name=f"case-{i}", inputs=prompt(i), expected_output=expected(i) if i % 2 == 0 else None,
               evaluators=[PEEqualsExpected()] if i % 2 == 0 else [PEContains(expected(i))]) for i in range(n)]
    return PEDataset(name="bench", cases=cases)


async def floor(agent: Agent, n: int, concurrency: int) -> None:
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> bool:
        async with gate:
            output = (await agent.run(prompt(i))).output
        return output == expected(i) if i % 2 == 0 else expected(i) in output

    passed = await asyncio.gather(*(one(i) for i in range(n)))
    assert all(passed), "floor: a case failed"


async def with_ringlet(agent: Agent, dataset: Dataset, concurrency: int) -> None:
    report = await dataset.evaluate(agent, concurrency=concurrency)
    assert report.passed, [c.name for c in report.failed]


async def with_pydantic_evals(agent: Agent, dataset: PEDataset[str, str, None], concurrency: int) -> None:
    async def task(text: str) -> str:
        return (await agent.run(text)).output

    report = await dataset.evaluate(task, max_concurrency=concurrency, progress=False)
    assert not report.failures, report.failures[:1]
    assert all(a.value is True for c in report.cases for a in c.assertions.values()), "pydantic-evals: failed"
    assert len(report.cases) == len(dataset.cases)


async def timed(model: FunctionModel, run: Callable[[], Awaitable[None]]) -> tuple[float, float]:
    """Wall and CPU seconds of one whole-dataset run (the model's request log emptied, garbage collected, first)."""
    model.requests.clear()
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    await run()
    return time.perf_counter() - wall, time.process_time() - cpu


async def measure(n: int, runs: int, levels: list[int]) -> dict[tuple[str, int], list[tuple[float, float]]]:
    model = FunctionModel(answer)
    agent = Agent(model, tools=[lookup])
    ours, theirs = ringlet_dataset(n), pe_dataset(n)
    ways: dict[str, Callable[[int], Awaitable[None]]] = {
        "floor": lambda c: floor(agent, n, c),
        "ringlet": lambda c: with_ringlet(agent, ours, c),
        "pydantic-evals": lambda c: with_pydantic_evals(agent, theirs, c),
    }
    for level in levels:  # warm-up: every way once at every level
        for way in WAYS:
            await timed(model, lambda w=way, c=level: ways[w](c))
    seen: dict[tuple[str, int], list[tuple[float, float]]] = {(w, c): [] for w in WAYS for c in levels}
    for r in range(runs):
        for level in levels:
            for k in range(len(WAYS)):
                way = WAYS[(r + k) % len(WAYS)]  # rotate the order from round to round
                seen[way, level].append(await timed(model, lambda w=way, c=level: ways[w](c)))
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=str(__doc__).splitlines()[0])
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--concurrency", default="1,8", help="comma-separated levels (default 1,8)")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    seen = asyncio.run(measure(args.cases, args.runs, levels))

    def median_ms(way: str, level: int, which: int) -> float:
        return statistics.median(s[which] for s in seen[way, level]) / args.cases * 1e3

    print(f"eval overhead: {args.cases} cases (1 tool call + an answer each, zero-latency model), medians of "
          f"{args.runs} runs (Python {sys.version.split()[0]})")
    print(f"  {'way':<16} {'conc':>4} {'wall ms/case':>13} {'CPU ms/case':>12}   {'ringlet ÷ this (wall, CPU)':<26}")
    for level in levels:
        for way in WAYS:
            wall, cpu = median_ms(way, level, 0), median_ms(way, level, 1)
            ratio = "" if way == "ringlet" else (f"{median_ms('ringlet', level, 0) / wall:5.2f}×, "
                                                 f"{median_ms('ringlet', level, 1) / cpu:5.2f}×")
            goal = "  (target ≤ 2×)" if way == "floor" else ""
            print(f"  {way:<16} {level:>4} {wall:13.3f} {cpu:12.3f}   {ratio}{goal}".rstrip())


if __name__ == "__main__":
    main()
