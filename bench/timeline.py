"""Where the time of one conversation goes, N at once: a timeline from the request to the answer's end.

Starts a streaming mock model (like `server_load.py`'s: 200 ms to the first chunk, then 20 tokens 10 ms apart,
but it also notes when each request arrives, by the prompt's text), `ringlet serve` on a SQLite file and, with
`--postgres`, one on a private PostgreSQL server (runs are DBOS workflows). For each store it runs `--runs`
rounds of N conversations sent together (each created first, then all released at once, as
`server_load.py` does), and prints the median over every conversation of the milliseconds from the message's
POST to:

- `headers`: the response's headers (the run is stored and started: enqueued, on PostgreSQL);
- `first event`: the first SSE event (`run_start`);
- `model request`: the model's request arriving at the mock (the run was taken, its history read, its model
  step begun);
- `first token`: the first `content_delta` (the mock sends its first chunk 200 ms after the request);
- `end`: `message_end` (the mock's last chunk goes out ~410 ms after the request).

Run: `.venv/bin/python bench/timeline.py [--postgres] [--n 10] [--runs 3]`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))  # server_load
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from server_load import (
    FIRST_TOKEN_S,
    TOKEN_GAP_S,
    TOKENS,
    chunk,
    free_port,
    ringlet_prepare,
    sse_events,
    start,
    stop,
    wait_ready,
)

STAGES = ("headers", "first event", "model request", "first token", "end")


def run_mock(port: int) -> None:
    """The mock model; `GET /arrivals` answers when each prompt's request arrived (epoch seconds)."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    arrivals: dict[str, float] = {}
    first, token = chunk({"role": "assistant", "content": ""}, None), chunk({"content": "tok "}, None)
    usage = {"prompt_tokens": 10, "completion_tokens": TOKENS, "total_tokens": 10 + TOKENS}
    last = chunk({}, "stop") + chunk(None, None, usage=usage) + b"data: [DONE]\n\n"

    async def stream():
        await asyncio.sleep(FIRST_TOKEN_S)
        yield first
        for _ in range(TOKENS):
            await asyncio.sleep(TOKEN_GAP_S)
            yield token
        yield last

    async def completions(request: Request) -> StreamingResponse:
        at = time.time()
        body = await request.json()
        prompt = next((m["content"] for m in reversed(body["messages"]) if m["role"] == "user"), "")
        arrivals[prompt if isinstance(prompt, str) else json.dumps(prompt)] = at
        return StreamingResponse(stream(), media_type="text/event-stream")

    async def arrived(_: Request) -> JSONResponse:
        return JSONResponse(arrivals)

    app = Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"]),
                            Route("/arrivals", arrived)])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", backlog=4096)


async def conversation(client: httpx.AsyncClient, base: str, cid: str, prompt: str,
                       go: asyncio.Event) -> dict[str, float]:
    """Wait for `go`, send `prompt`, and note (epoch seconds) when each stage was seen."""
    await go.wait()
    seen = {"sent": time.time()}
    url = f"{base}/api/v1/chat/conversations/{cid}/messages"
    async with client.stream("POST", url, json={"content": prompt}, headers={"Accept": "text/event-stream"}) as r:
        seen["headers"] = time.time()
        async for event, _data in sse_events(r):
            seen.setdefault("first event", time.time())
            if event == "content_delta":
                seen.setdefault("first token", time.time())
            if event == "message_end":
                seen["end"] = time.time()
                break
    return seen


async def round_of(n: int, base: str, mock: str, tag: str) -> list[dict[str, float]]:
    """N conversations released together; each one's stages in ms after its POST."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    clients = [httpx.AsyncClient(limits=limits, timeout=120) for _ in range(n)]
    try:
        cids = [await ringlet_prepare(c, base) for c in clients]
        go = asyncio.Event()
        prompts = [f"hello {tag} {i}" for i in range(n)]
        tasks = [asyncio.create_task(conversation(c, base, cid, p, go))
                 for c, cid, p in zip(clients, cids, prompts, strict=True)]
        await asyncio.sleep(0)
        go.set()
        seen = await asyncio.gather(*tasks)
    finally:
        for c in clients:
            await c.aclose()
    async with httpx.AsyncClient() as client:
        arrivals = (await client.get(f"{mock}/arrivals")).json()
    out = []
    for prompt, s in zip(prompts, seen, strict=True):
        s["model request"] = arrivals.get(prompt, float("nan"))
        out.append({k: (s[k] - s["sent"]) * 1000 for k in STAGES if k in s})
    return out


async def bench(n: int, runs: int, postgres: str | None) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="ringlet-timeline-"))
    mock_port = free_port()
    mock = f"http://127.0.0.1:{mock_port}"
    (tmp / "agents" / "bench").mkdir(parents=True)
    (tmp / "agents" / "bench" / "config.yaml").write_text(
        "description: timeline agent\nmodel: openai:mock\n"
        f'model_options: {{base_url: "{mock}/v1", api_key: "not-needed"}}\ninstructions: Answer briefly.\n')
    targets = {"SQLite": f"sqlite:///{tmp}/ringlet.db", **({"PostgreSQL": postgres} if postgres else {})}
    mock_process = start([sys.executable, __file__, "--mock-port", str(mock_port)], tmp / "mock.log")
    servers, bases = {}, {}
    try:
        for name, url in targets.items():
            port = free_port()
            servers[name] = start([sys.executable, "-m", "ringlet", "serve", "--host", "127.0.0.1", "--port",
                                   str(port), "--db", url, "--agents", str(tmp / "agents"), "--auth", "none"],
                                  tmp / f"ringlet-{name}.log")
            bases[name] = f"http://127.0.0.1:{port}"
        await wait_ready(f"{mock}/arrivals", mock_process)
        for name in targets:
            await wait_ready(f"{bases[name]}/readyz", servers[name])
            await round_of(3, bases[name], mock, f"warm {name}")
        print(f"N={n}, {runs} round(s) each; median over every conversation, ms after the message's POST")
        print(f"{'store':<11}" + "".join(f"{stage:>15}" for stage in STAGES))
        for name in targets:
            rows = [row for r in range(runs) for row in await round_of(n, bases[name], mock, f"{name} {r}")]
            print(f"{name:<11}" + "".join(f"{statistics.median(row[s] for row in rows if s in row):>15.1f}"
                                          for s in STAGES))
    finally:
        for server in servers.values():
            stop(server)
        stop(mock_process)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=10, help="conversations at once")
    parser.add_argument("--runs", type=int, default=3, help="rounds per store")
    parser.add_argument("--postgres", action="store_true", help="beside SQLite, a store on a private PostgreSQL")
    parser.add_argument("--mock-port", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mock_port is not None:
        run_mock(args.mock_port)
        return
    with contextlib.ExitStack() as stack:
        db = None
        if args.postgres:
            from postgres import postgres_server

            db = stack.enter_context(postgres_server()).replace("postgresql+asyncpg://", "postgresql://")
        asyncio.run(bench(args.n, args.runs, db))


if __name__ == "__main__":
    main()
