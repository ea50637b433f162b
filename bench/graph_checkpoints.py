"""What a graph run's checkpoints cost per super-step in each store (issue 44: the store keeps every step's
checkpoint, `graph_checkpoint_steps`, beside the latest, in the same transaction), medians of REPEATS runs
of a chain of STEPS zero-latency `llm` nodes (FunctionModel), with a small state and with a 20 KB one:

- MemoryCheckpoints (the library's default), FileCheckpoints (the CLI's), the server's store on a SQLite file,
  and with `--pg` on a private PostgreSQL server (tests/postgres.py, Debian's binaries);
- and, to isolate the store's share from the engine's noise, `save()` alone: SAVES checkpoints of one run,
  one step after another, in each store.

To compare with a commit before the change, run this same file against that commit's sources:
`git worktree add /tmp/base <commit>` then `PYTHONPATH=/tmp/base/src .venv/bin/python bench/graph_checkpoints.py`
(the figures of both, measured one after the other on the same machine, go in the notes).

Run: `.venv/bin/python bench/graph_checkpoints.py [--pg]`
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import ringlet
from ringlet.graph import Checkpoint, FileCheckpoints, GraphAgent, MemoryCheckpoints, load_graph
from ringlet.store import Store
from ringlet.testing import FunctionModel

REPEATS = 7
TESTS = Path(__file__).resolve().parent.parent / "tests"
STEPS = 50
SAVES = 300
BIG = 20_000


def chain(directory: Path, payload: int) -> Path:
    lines = [f"name: {directory.name}", "start: n0", "settings:", "  log_state_snapshots: false",
             f"initial_state: {{blob: '{'x' * payload}'}}", "nodes:"]
    lines += [f"  n{i}: {{type: llm, prompt: p, next: n{i + 1}}}" for i in range(STEPS)]
    lines.append(f"  n{STEPS}: {{type: end, output: done}}")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "graph.yaml").write_text("\n".join(lines) + "\n")
    return directory


async def per_step_us(directory: Path, checkpoints: object) -> float:
    agent = GraphAgent(load_graph(directory), model=FunctionModel(lambda request: "ok"), checkpoints=checkpoints)

    async def run() -> None:
        result = await agent.run("go")
        assert result.output == "done", result.error

    await run()  # warm-up
    times = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        await run()
        times.append(time.perf_counter() - started)
    await agent.aclose()
    return statistics.median(times) / (STEPS + 2) * 1e6  # STEPS + the End node + the step-0 save


async def save_us(checkpoints: object, payload: int, run: str) -> float:
    """Median µs of one `save()` (REPEATS runs of SAVES steps each)."""
    times = []
    for r in range(REPEATS):
        cp = Checkpoint(f"{run}-{r}", "h", 0, {"blob": "x" * payload, "n": 0}, ["n1"], {}, 0.0, agent="bench")
        started = time.perf_counter()
        for step in range(SAVES):
            cp.step, cp.state["n"] = step, step
            await checkpoints.save(cp)  # type: ignore[attr-defined]
        times.append(time.perf_counter() - started)
    return statistics.median(times) / SAVES * 1e6


@contextlib.asynccontextmanager
async def stores(root: Path, pg: bool):
    sqlite = await Store.open(f"sqlite:///{root / 'bench.db'}")
    opened = [("store, SQLite file", sqlite)]
    server = contextlib.ExitStack()
    try:
        if pg:
            sys.path.insert(0, str(TESTS))
            from postgres import postgres_server

            url = server.enter_context(postgres_server())
            opened.append(("store, PostgreSQL", await Store.open(url)))
        yield opened
    finally:
        for _, store in opened:
            await store.close()
        server.close()


async def main() -> None:
    logging.disable(logging.WARNING)
    print(f"ringlet from {Path(ringlet.__file__).parent}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        async with stores(root, "--pg" in sys.argv) as opened:
            for label, payload in (("small state", 0), ("20 KB state", BIG)):
                directory = chain(root / f"chain{payload}", payload)
                rows = [("MemoryCheckpoints", MemoryCheckpoints()),
                        ("FileCheckpoints", FileCheckpoints(root / f"runs{payload}")),
                        *((name, s.checkpoints.decoding(Checkpoint.from_json)) for name, s in opened)]
                for name, checkpoints in rows:
                    print(f"{label:12} {name:20} {await per_step_us(directory, checkpoints):8.0f} µs per super-step")
                for name, checkpoints in rows:
                    print(f"{label:12} {name:20} {await save_us(checkpoints, payload, name[:5]):8.0f} µs per save()")


if __name__ == "__main__":
    asyncio.run(main())
