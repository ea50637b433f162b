"""CPU per streamed request of the `openai:` adapter: ringlet's own aiohttp client against the `openai` SDK.

Starts the OpenAI-compatible mock model of `server_load.py` in a subprocess (its first chunk at once, then
20 tokens `--gap-ms` apart, usage in the last chunk, `[DONE]`), then, in this process, sends `--n`
sequential streamed requests through (a) `ringlet.models.openai.OpenAIModel.stream` and (b) the adapter as
it was on the SDK before issue 20 (`src/ringlet/models/openai.py` of commit `--baseline`, read with `git show`;
or `--baseline-file` to load an `openai.py` by path), each consumed to its `Finish`. One model instance per
side, made before the runs and warmed up, as the server holds one per agent. Each run measures both sides
back to back (their order alternates), so the machine's drift hits both.

Prints per run and as medians over `--runs`: CPU ms per request (`time.process_time` deltas: this process
only, the mock's CPU is not counted) and wall ms per request, and the ratio SDK / ringlet.

Run: `.venv/bin/python bench/openai_client.py [--n 200] [--runs 5] [--gap-ms 1] [--loop uvloop|asyncio]
[--baseline 7b4a36d | --baseline-file OLD/src/ringlet/models/openai.py] [--profile /tmp/openai_client.prof]`.
Loopback only; the mock is stopped on exit.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import server_load  # bench/ is on the path: it is this script's directory
from ringlet.messages import Message
from ringlet.models.base import Finish, ModelRequest, TextDelta

REQUEST = ModelRequest([Message.user("hello")], "Answer briefly.")


def mock(port: int, gap_ms: float) -> None:
    server_load.FIRST_TOKEN_S, server_load.TOKEN_GAP_S = 0.0, gap_ms / 1000
    server_load.run_mock(port)


def start_mock(port: int, gap_ms: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, __file__, "--mock-port", str(port), "--gap-ms", str(gap_ms)])


def baseline(path: str | None, rev: str) -> Callable[..., Any]:
    """`OpenAIModel` of the old `openai.py`: the file at `path`, else the one of commit `rev` (`git show`)."""
    if path is None:
        source = subprocess.run(["git", "show", f"{rev}:src/ringlet/models/openai.py"], check=True,
                                capture_output=True, text=True, cwd=server_load.ROOT).stdout
        with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as file:
            file.write(source)
        path = file.name
    spec = importlib.util.spec_from_file_location("ringlet_openai_baseline", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.OpenAIModel


async def one(model: Any) -> bool:
    texts, finish = 0, None
    async for chunk in model.stream(REQUEST):
        if isinstance(chunk, TextDelta):
            texts += 1
        elif isinstance(chunk, Finish):
            finish = chunk
    return texts == server_load.TOKENS and finish is not None and finish.usage is not None


async def batch(model: Any, n: int) -> tuple[float, float, int]:
    """CPU ms and wall ms per request over n sequential requests, and the count of wrong answers."""
    bad = 0
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(n):
        bad += not await one(model)
    return (time.process_time() - cpu) * 1000 / n, (time.perf_counter() - wall) * 1000 / n, bad


async def bench(args: argparse.Namespace) -> None:
    from ringlet.models.openai import OpenAIModel

    port = server_load.free_port()
    base = f"http://127.0.0.1:{port}"
    process = start_mock(port, args.gap_ms)
    try:
        await server_load.wait_ready(f"{base}/health", process)
        old = baseline(args.baseline_file, args.baseline)
        sides = {"ringlet aiohttp": OpenAIModel("mock", base_url=f"{base}/v1", api_key="not-needed"),
                 "openai SDK": old("mock", base_url=f"{base}/v1", api_key="not-needed")}
        for model in sides.values():  # warm-up: connections, caches, lazy imports
            for _ in range(10):
                assert await one(model), f"{model!r} did not stream the mock's answer"
        print(f"{args.n} sequential streamed requests per run ({server_load.TOKENS} tokens, {args.gap_ms} ms apart),"
              f" {args.runs} runs, loop {args.loop}; ms per request")
        print(f"{'run':>4} " + " ".join(f"{name + ' cpu':>18} {name + ' wall':>18}" for name in sides))
        rows: dict[str, list[tuple[float, float, int]]] = {name: [] for name in sides}
        for run in range(args.runs):
            order = list(sides) if run % 2 == 0 else list(reversed(sides))
            profiler = None
            for name in order:
                if args.profile and name == "ringlet aiohttp" and run == 0:
                    import cProfile

                    profiler = cProfile.Profile()
                    profiler.enable()
                rows[name].append(await batch(sides[name], args.n))
                if profiler is not None:
                    profiler.disable()
                    profiler.dump_stats(args.profile)
                    profiler = None
            print(f"{run + 1:>4} " + " ".join(f"{rows[k][-1][0]:>18.3f} {rows[k][-1][1]:>18.3f}" for k in sides))
        medians = {k: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v),
                       sum(r[2] for r in v)) for k, v in rows.items()}
        print("median " + " ".join(f"{m[0]:>16.3f} {m[1]:>18.3f}" for m in medians.values()))
        (new_cpu, new_wall, new_bad), (old_cpu, old_wall, old_bad) = medians.values()
        print(f"CPU per request: ringlet aiohttp {new_cpu:.3f} ms, openai SDK {old_cpu:.3f} ms "
              f"(SDK / ringlet = {old_cpu / new_cpu:.2f}x); wall {new_wall:.2f} vs {old_wall:.2f} ms; "
              f"wrong answers {new_bad} / {old_bad}")
    finally:
        process.terminate()
        process.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200, help="sequential requests per run and side")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--gap-ms", type=float, default=1.0, help="the mock's pause between tokens")
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop",
                        help="uvloop is what `ringlet serve` (uvicorn) runs on when installed")
    parser.add_argument("--baseline", default="7b4a36d", help="the commit whose openai.py (the SDK's) to compare with")
    parser.add_argument("--baseline-file", default=None, help="an old ringlet/models/openai.py to compare with")
    parser.add_argument("--profile", default=None, help="cProfile ringlet's side of the first run into this file")
    parser.add_argument("--mock-port", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mock_port is not None:
        mock(args.mock_port, args.gap_ms)
        return
    loop_factory = None
    if args.loop == "uvloop":
        import uvloop

        loop_factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(bench(args))


if __name__ == "__main__":
    main()
