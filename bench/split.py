"""The split topology's cost: one `ringlet serve` against one `ringlet serve --no-worker` and two `ringlet worker`s,
on the same PostgreSQL, driving the same streamed conversations.

Starts a private PostgreSQL server (as the tests do) and a streaming mock model: a conversation's first request is
answered with a call of the `current_time` tool, the second with `server_load.py`'s stream (200 ms to the first
chunk, then 20 tokens 10 ms apart), so each conversation makes two model requests and a tool call. Each round, for
each topology in turn, on a fresh database of that server: start it (`RINGLET_ENGINE=dbos`: runs execute as DBOS
workflows in both), warm it up with a few conversations, then drive `--n` conversations at once as `server_load.py`
does (each creates a conversation, then, all released together, sends one message and reads its SSE stream to
`message_end`), and stop it. In the split topology every stream is served by the API process while a worker
executes its run: the API follows the run through its live feed (`ringlet.server.durable.feed`).

Prints, per topology, medians over `--runs` rounds of: the CPU ms per conversation of each ringlet process
(user + system, all threads, from /proc/<pid>/stat before and after the batch), their sum, PostgreSQL's (the
postmaster and its backends, live and exited), conversations/s, p50 latency and errors (totals); then the split
topology's total against `serve`'s (the target: ≤ 1.5×).

`--profile PATH` runs the split topology's API process under cProfile (`python -m cProfile -o PATH.<round> -m
ringlet serve …`; written when it stops) — that is, the process that follows runs executed elsewhere.

Run: `.venv/bin/python bench/split.py [--n 20] [--runs 3] [--profile /tmp/api.prof]`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import scale_out
import server_load
from scale_out import Bench, cpu_s, free_port, launch, pg_cpu_s, ready, stop
from server_load import FIRST_TOKEN_S, TOKEN_GAP_S, TOKENS, chunk, drive, ringlet_prepare, ringlet_send

WARM_UP = 5
DEADLINE_S = 300


class Topology:
    """`ringlet serve` (`workers` 0) or `ringlet serve --no-worker` and `workers` workers, all with DBOS."""

    def __init__(self, bench: Bench, db: str, workers: int, profile: str | None) -> None:
        self.bench, self.db, self.workers_wanted, self.profile = bench, db, workers, profile
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.processes: dict[str, Any] = {}

    def _launch(self, command: list[str], name: str, profile: str | None = None) -> Any:
        url = self.bench.server_url.rsplit("/", 1)[0] + f"/{self.db}"
        head = [sys.executable, *(["-m", "cProfile", "-o", profile] if profile else []), "-m", "ringlet"]
        process = launch([*head, *command, "--db", url, "--agents", str(self.bench.agents)],
                         self.bench.tmp / f"{self.db}-{name}.log", env={**self.bench.env, "RINGLET_ENGINE": "dbos"})
        self.processes[name] = process
        return process

    async def start(self) -> None:
        serve = ["serve", "--host", "127.0.0.1", "--port", str(self.port)]
        if self.workers_wanted == 0:
            await ready(self._launch(serve, "serve"), "Uvicorn running on")
            return
        # the API first: it migrates the fresh database alone
        await ready(self._launch([*serve, "--no-worker"], "api", self.profile), "Uvicorn running on")
        workers = [self._launch(["worker"], f"worker{i}") for i in range(self.workers_wanted)]
        await asyncio.gather(*[ready(w, "ready: executing") for w in workers])

    def cpu(self) -> dict[str, float]:
        return {name: cpu_s(p.pid) for name, p in self.processes.items()}

    def stop(self) -> None:
        stop(*reversed(self.processes.values()))


async def once(bench: Bench, workers: int, n: int, profile: str | None) -> dict[str, float]:
    """One topology, one batch of `n` streamed conversations: CPU ms per conversation per process, and more."""
    db = await bench.create_db("serve" if workers == 0 else f"split{workers}")
    topology = Topology(bench, db, workers, profile)
    try:
        await topology.start()
        await drive(WARM_UP, topology.base, ringlet_prepare, ringlet_send)
        cpu, pg = topology.cpu(), pg_cpu_s(bench.postmaster)
        async with asyncio.timeout(DEADLINE_S):  # a run that failed leaves its stream open, pinging
            result = await drive(n, topology.base, ringlet_prepare, ringlet_send)
        after, pg_after = topology.cpu(), pg_cpu_s(bench.postmaster)
    finally:
        topology.stop()
        await bench.drop_db(db)
    row = {name: (after[name] - cpu[name]) * 1000 / n for name in cpu}
    return {**row, "ringlet": sum(row.values()), "postgres": (pg_after - pg) * 1000 / n, **result}


async def bench_split(n: int, runs: int, profile: str | None) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="ringlet-split-"))
    mock_port = free_port()
    with mock_model(mock_port, tmp), scale_out.postgres_server() as url:
        bench = Bench(url, tmp, mock_port)
        config = bench.agents / "bench" / "config.yaml"
        config.write_text(config.read_text() + "tools: [current_time]\n")
        await server_load.wait_ready(f"{bench.mock}/health", scale_out.CHILDREN[0])
        rows: dict[int, list[dict[str, float]]] = {0: [], 2: []}
        for r in range(runs):
            for workers, found in rows.items():
                prof = f"{profile}.{r}" if profile and workers else None
                found.append(await once(bench, workers, n, prof))
    print(f"N={n} streamed conversations at once, {runs} rounds (medians; errors: totals); CPU ms per conversation")
    names = {0: "serve", 2: "split"}
    medians: dict[int, dict[str, float]] = {}
    for workers, found in rows.items():
        m = medians[workers] = {k: statistics.median(r[k] for r in found) for k in found[0]}
        procs = "  ".join(f"{k} {m[k]:6.1f}" for k in found[0] if k == "serve" or k.startswith(("api", "worker")))
        print(f"{names[workers]:<6} ringlet {m['ringlet']:6.1f} ({procs})  postgres {m['postgres']:6.1f}  "
              f"conv/s {m['throughput']:6.1f}  p50 {m['p50']:7.1f} ms  errors {sum(r['errors'] for r in found):.0f}")
    split, serve = medians[2], medians[0]
    both = (split["ringlet"] + split["postgres"]) / (serve["ringlet"] + serve["postgres"])
    print(f"split / serve, ringlet processes: {split['ringlet'] / serve['ringlet']:.2f}x; with PostgreSQL: {both:.2f}x")


def run_mock(port: int) -> None:
    """`server_load.py`'s streaming mock, but a conversation's first request is answered with a call of the
    `current_time` tool (its arguments in two chunks), and the request that carries its result with the text."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse, StreamingResponse
    from starlette.routing import Route

    first, token = chunk({"role": "assistant", "content": ""}, None), chunk({"content": "tok "}, None)
    usage = {"prompt_tokens": 10, "completion_tokens": TOKENS, "total_tokens": 10 + TOKENS}
    call = [chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",  # type: ignore[dict-item]
                                   "function": {"name": "current_time", "arguments": "{"}}]}, None),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]}, None),  # type: ignore[dict-item]
            chunk({}, "tool_calls")]
    last = chunk({}, "stop") + chunk(None, None, usage=usage) + b"data: [DONE]\n\n"

    async def stream(answer: bool):
        await asyncio.sleep(FIRST_TOKEN_S)
        yield first
        if not answer:
            for part in call:
                yield part
            yield chunk(None, None, usage=usage) + b"data: [DONE]\n\n"
            return
        for _ in range(TOKENS):
            await asyncio.sleep(TOKEN_GAP_S)
            yield token
        yield last

    async def completions(request: Request) -> StreamingResponse:
        messages = (await request.json())["messages"]
        return StreamingResponse(stream(messages[-1]["role"] == "tool"), media_type="text/event-stream")

    async def health(_: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"]),
                            Route("/health", health)])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", backlog=4096)


@contextlib.contextmanager
def mock_model(port: int, tmp: Path):
    """The mock model (`run_mock`), in its own process."""
    mock = launch([sys.executable, __file__, "--mock-port", str(port)], tmp / "mock.log")
    try:
        yield mock
    finally:
        scale_out.stop_all()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20, help="conversations at once (the private PostgreSQL "
                        "server's 100 connections run out near 50 with three ringlet processes)")
    parser.add_argument("--runs", type=int, default=3, help="rounds (medians)")
    parser.add_argument("--profile", default=None, help="run the split topology's API process under cProfile")
    parser.add_argument("--mock-port", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mock_port is not None:
        run_mock(args.mock_port)
        return
    asyncio.run(bench_split(args.n, args.runs, args.profile))


if __name__ == "__main__":
    main()
