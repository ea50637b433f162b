"""Graph engine overhead (graph-workflows.md §4), medians of REPEATS repetitions:

- per super-step of a chain of zero-latency `llm` nodes (ScriptedModel), next to the same number of bare
  `Agent.run` calls measured in the same run: the difference is what the engine adds per step;
- per super-step of a chain of no-op `script` nodes (`echo '{}'`), next to spawning the same process
  directly with asyncio: the difference is the engine's (and the protocol's) share;
- the wall time of a diamond: one zero-latency llm node fanning out to 8 parallel llm branches that each
  take 100 ms (a model that sleeps), joined by the End node. Target: at most 120 ms.

Run: `.venv/bin/python bench/graph.py`
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import tempfile
import time
from pathlib import Path

from ringlet import Agent, Limits
from ringlet.agent.settings import RunSettings
from ringlet.graph import GraphAgent, load_graph
from ringlet.testing import FunctionModel

REPEATS = 7
LLM_STEPS = 100
SCRIPT_STEPS = 30
BRANCHES = 8


def chain(directory: Path, node: str, steps: int) -> Path:
    lines = [f"name: {directory.name}", "start: n0", "settings:", "  log_state_snapshots: false", "nodes:"]
    lines += [f"  n{i}: {{{node}, next: n{i + 1}}}" for i in range(steps)]
    lines.append(f"  n{steps}: {{type: end, output: done}}")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "graph.yaml").write_text("\n".join(lines) + "\n")
    (directory / "noop.sh").write_text("echo '{}'\n")
    return directory


def diamond(directory: Path) -> Path:
    branches = [f"b{i}" for i in range(BRANCHES)]
    lines = [f"name: {directory.name}", "start: fan", "nodes:",
             f"  fan: {{type: llm, prompt: fan, next: [{', '.join(branches)}]}}"]
    lines += [f"  {b}: {{type: llm, prompt: 'slow {b}', state_updates: {{out_{b}: '{{{{output}}}}'}}, next: join}}"
              for b in branches]
    lines.append("  join: {type: end, output: done}")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "graph.yaml").write_text("\n".join(lines) + "\n")
    return directory


async def timed(*factories, repeats: int = REPEATS) -> list[float]:
    """Median seconds of each factory's coroutine; the factories take turns in every repetition, so that the
    machine's noise falls on all of them alike."""
    for factory in factories:  # warm-up
        await factory()
    times: list[list[float]] = [[] for _ in factories]
    for _ in range(repeats):
        for i, factory in enumerate(factories):
            started = time.perf_counter()
            await factory()
            times[i].append(time.perf_counter() - started)
    return [statistics.median(t) for t in times]


async def llm_chain(root: Path) -> tuple[float, float, float]:
    directory = chain(root / "llm_chain", "type: llm, prompt: p", LLM_STEPS)
    spec = load_graph(directory)
    started = time.perf_counter()
    agent = GraphAgent(spec, model=FunctionModel(lambda request: "ok"))
    for node_id, node in spec.nodes.items():
        if node.type == "llm":
            agent.runtime.node_agent(node_id, node)
    load_ms = (time.perf_counter() - started) * 1000
    bare_agent = Agent(FunctionModel(lambda request: "ok"),
                       limits=Limits(max_blank_stops=1, terminal_tool=None, compaction=False))

    async def graph_run() -> None:
        result = await agent.run("go")
        assert result.output == "done", result.error

    async def bare_runs() -> None:
        for _ in range(LLM_STEPS):
            await bare_agent.run("p", settings=RunSettings(instructions="x"))

    graph, bare = await timed(graph_run, bare_runs)
    return graph / (LLM_STEPS + 1) * 1e6, bare / LLM_STEPS * 1e6, load_ms


async def script_chain(root: Path) -> tuple[float, float]:
    directory = chain(root / "script_chain", "type: script, script: noop.sh", SCRIPT_STEPS)
    agent = GraphAgent(load_graph(directory))

    async def graph_run() -> None:
        result = await agent.run("go")
        assert result.output == "done", result.error

    async def bare_spawns() -> None:
        for _ in range(SCRIPT_STEPS):
            process = await asyncio.create_subprocess_exec(
                "bash", str(directory / "noop.sh"), stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True)
            await process.communicate()

    graph, bare = await timed(graph_run, bare_spawns, repeats=5)
    return graph / (SCRIPT_STEPS + 1) * 1e3, bare / SCRIPT_STEPS * 1e3


async def fan_out(root: Path) -> float:
    spec = load_graph(diamond(root / "diamond"))

    async def answer(request) -> str:
        text = request.messages[-1].text
        if text.startswith("slow"):
            await asyncio.sleep(0.1)
        return "ok"

    agent = GraphAgent(spec, model=FunctionModel(answer))

    async def run() -> None:
        result = await agent.run("go")
        assert result.status == "completed", result.error

    (wall,) = await timed(run)
    return wall


async def main() -> None:
    logging.disable(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        per_step, bare, load_ms = await llm_chain(root)
        print(f"llm chain ({LLM_STEPS} zero-latency nodes): {per_step:.0f} µs per super-step; a bare Agent.run "
              f"takes {bare:.0f} µs, so the engine adds {per_step - bare:.0f} µs per step (loading the graph and "
              f"building its {LLM_STEPS} node agents: {load_ms:.0f} ms, once)")
        per_step, bare = await script_chain(root)
        print(f"script chain ({SCRIPT_STEPS} no-op bash scripts): {per_step:.1f} ms per super-step; spawning the "
              f"process directly takes {bare:.1f} ms, so the engine and protocol add {per_step - bare:.1f} ms")
        wall = await fan_out(root)
        print(f"diamond fan-out ({BRANCHES} parallel llm branches of 100 ms each): {wall * 1000:.1f} ms wall "
              f"(target ≤ 120 ms)")


if __name__ == "__main__":
    asyncio.run(main())
