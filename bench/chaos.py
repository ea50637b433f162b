"""Chaos on the durable engine (issue 39): several API processes and workers on one PostgreSQL, kills at
random moments, and a check of every run against what its client saw.

Starts a private PostgreSQL server, an OpenAI-compatible model double (in this process) that answers each
request anew, as hosted models do: two parallel tool calls with fresh ids (`once`, not idempotent, and
`again`, idempotent; each takes 0.2 s and notes its token in an effects file), then a streamed answer whose
words differ on every request; `--apis` `ringlet serve --no-worker` and `--workers` `ringlet worker`s.
`--conversations` conversations, `--concurrency` at a time: each client creates its conversation, follows
its events (`GET …/events`, reconnecting with `Last-Event-ID` to another API process whenever a stream
breaks) and sends one message with an `Idempotency-Key` (sent again, with the same key, to another API
process when the first one dies). Meanwhile a random worker is SIGKILLed every 1–3 s (`--kill-every`) and
started again, and once (`--api-kills`) an API process is SIGKILLed mid-stream and started again.

Checked for every run, once all have ended (a run that broke a check is listed with what it broke):
    ended        its record is final (`completed`, or `failed`/`canceled` with its reason in the log)
    ids          the client saw each event id once, in order, with no gap
    settled      every tool call the client saw started has exactly one result
    transcript   the text and tool calls the client assembled (`retracted` applied) are the transcript's
    replayed     `GET …/events` from 0 replays what the client saw, event for event
    at_most_once `once` ran at most once per call the model made (a cut-off call is `interrupted`)

Run: `.venv/bin/python bench/chaos.py [--conversations 100] [--concurrency 20] [--apis 2] [--workers 3]
[--kill-every 1 3] [--api-kills 1] [--seed N]`; exits 1 when a check failed. Loopback only; every process
and the PostgreSQL server are stopped on exit. `tests/test_chaos.py` runs a small one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import signal
import sys
import tempfile
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from httpx_sse import aconnect_sse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from postgres import postgres_server  # noqa: E402
from processes import free_port, ringlet_process  # noqa: E402
from serving import serving  # noqa: E402

CONFIG = """model: openai:m
model_options: {{base_url: '{url}/v1', api_key: x}}
instructions: Use both tools, then answer.
tools:
  once: {{effect: read}}
  again: {{effect: read, idempotent: true}}
"""
TOOLS = '''
import asyncio, os

def _note(what: str) -> None:
    with open(os.environ["EFFECTS"], "a") as f:
        f.write(what + "\\n")

async def once(token: str) -> str:
    """A side effect that must not happen twice."""
    _note(f"once {token}")
    await asyncio.sleep(0.2)
    return f"once {token} done"

async def again(token: str) -> str:
    """A side effect that may happen again."""
    _note(f"again {token}")
    await asyncio.sleep(0.2)
    return f"again {token} done"
'''
WORDS = ["the", "run", "went", "well", "and", "every", "call", "came", "back", "with", "its", "result", "in", "time"]


def model_double(rng: random.Random) -> Any:
    """Each request answered anew: tool calls with fresh ids (and fresh tokens), or an answer of fresh words,
    streamed 50 ms a chunk so that kills land mid-stream."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    def chunk(delta: dict[str, Any] | None, usage: dict[str, int] | None = None) -> str:
        body = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m",
                "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": None}]}
        return f"data: {json.dumps({**body, **({'usage': usage} if usage else {})})}\n\n"

    async def completions(request: Request) -> StreamingResponse:
        messages = (await request.json())["messages"]
        if messages[-1]["role"] == "tool":
            words = [rng.choice(WORDS) for _ in range(12)]
            deltas = [{"role": "assistant", "content": ""}, *[{"content": f" {w}"} for w in words]]
        else:
            deltas = [{"role": "assistant", "content": None}]
            for i, name in enumerate(("once", "again")):
                call_id, token = f"call_{uuid.uuid4().hex[:12]}", uuid.uuid4().hex[:8]
                args = json.dumps({"token": token})
                deltas += [{"tool_calls": [{"index": i, "id": call_id, "type": "function",
                                            "function": {"name": name, "arguments": ""}}]},
                           {"tool_calls": [{"index": i, "function": {"arguments": args[:9]}}]},
                           {"tool_calls": [{"index": i, "function": {"arguments": args[9:]}}]}]

        async def stream() -> AsyncIterator[str]:
            for delta in deltas:
                yield chunk(delta)
                await asyncio.sleep(0.05)
            yield chunk(None, {"prompt_tokens": 3, "completion_tokens": 2})
            yield "data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])


@dataclass
class Seen:
    """One client's conversation: what its stream showed, in order."""

    cid: str
    events: list[tuple[int, str, dict[str, Any]]] = field(default_factory=list)
    reconnects: int = 0
    resent: int = 0
    run_id: str | None = None


class Cluster:
    def __init__(self, db: str, agents: Path, env: dict[str, str], stack: contextlib.AsyncExitStack) -> None:
        self.db, self.agents, self.env, self.stack = db, agents, env, stack
        self.apis: list[tuple[int, Any]] = []
        self.workers: list[Any] = []
        self.kills = Counter[str]()

    async def _start(self, command: list[str], ready: bytes) -> Any:
        log = self.agents.parent / f"{command[0]}-{sum(self.kills.values())}-{len(self.workers)}.log"
        return await self.stack.enter_async_context(ringlet_process(
            [*command, "--db", self.db, "--agents", str(self.agents)], ready, self.env, log))

    async def api(self) -> tuple[int, Any]:
        port = free_port()
        return port, await self._start(["serve", "--no-worker", "--port", str(port)], b"Uvicorn running on")

    async def worker(self) -> Any:
        return await self._start(["worker"], b"ready")

    def base(self, i: int) -> str:
        return f"http://127.0.0.1:{self.apis[i % len(self.apis)][0]}"


async def chaos(*, conversations: int = 100, concurrency: int = 20, apis: int = 2, workers: int = 3,
                kill_every: tuple[float, float] = (1.0, 3.0), api_kills: int = 1, seed: int = 0,
                postgres_url: str | None = None) -> dict[str, Any]:
    """Run the chaos; a report: counts, and each run that broke a check with what it broke."""
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="ringlet-chaos-") as tmp, contextlib.ExitStack() as sync:
        server = postgres_url or sync.enter_context(postgres_server())
        name = f"chaos_{uuid.uuid4().hex[:8]}"
        admin = await asyncpg.connect(server.replace("postgresql+asyncpg://", "postgresql://"))
        await admin.execute(f"CREATE DATABASE {name}")
        await admin.close()
        db = server.rsplit("/", 1)[0] + f"/{name}"
        async with contextlib.AsyncExitStack() as stack:
            return await _chaos(stack, Path(tmp), db, rng, conversations=conversations, concurrency=concurrency,
                                apis=apis, workers=workers, kill_every=kill_every, api_kills=api_kills)


async def _chaos(stack: contextlib.AsyncExitStack, tmp: Path, db: str, rng: random.Random, *, conversations: int,
                 concurrency: int, apis: int, workers: int, kill_every: tuple[float, float],
                 api_kills: int) -> dict[str, Any]:
    url = await stack.enter_async_context(serving(model_double(rng)))
    agent = tmp / "agents" / "chaos"
    agent.mkdir(parents=True)
    (agent / "config.yaml").write_text(CONFIG.format(url=url))
    (agent / "tools.py").write_text(TOOLS)
    effects = tmp / "effects.txt"
    effects.touch()
    env = {"RINGLET_AUTH_MODE": "none", "RINGLET_HEARTBEAT_S": "0.2", "RINGLET_WORKER_TIMEOUT_S": "3",
           "EFFECTS": str(effects)}
    c = Cluster(db, tmp / "agents", env, stack)
    c.apis = [await c.api() for _ in range(apis)]
    c.workers = [await c.worker() for _ in range(workers)]
    client = await stack.enter_async_context(httpx.AsyncClient(timeout=httpx.Timeout(30, read=60)))
    done = asyncio.Event()
    killer = asyncio.create_task(_kill(c, rng, kill_every, api_kills, done))
    limit = asyncio.Semaphore(concurrency)

    async def one(i: int) -> Seen:
        async with limit:
            return await _converse(c, client, i)

    try:
        seen = await asyncio.gather(*[one(i) for i in range(conversations)])
    finally:
        done.set()
        await killer
    return await _check(c, client, seen, effects)


async def _kill(c: Cluster, rng: random.Random, every: tuple[float, float], api_kills: int,
                done: asyncio.Event) -> None:
    """SIGKILL a random worker every `every` seconds (and start another); `api_kills` times, an API process."""
    rounds = 0
    while not done.is_set():
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(rng.uniform(*every)):
                await done.wait()
        if done.is_set():
            return
        rounds += 1
        if api_kills and rounds % 3 == 2:
            api_kills -= 1
            i = rng.randrange(len(c.apis))
            c.apis[i][1].send_signal(signal.SIGKILL)
            await c.apis[i][1].wait()
            c.kills["api"] += 1
            c.apis[i] = await c.api()
            continue
        i = rng.randrange(len(c.workers))
        c.workers[i].send_signal(signal.SIGKILL)
        await c.workers[i].wait()
        c.kills["worker"] += 1
        c.workers[i] = await c.worker()


async def _converse(c: Cluster, client: httpx.AsyncClient, i: int) -> Seen:
    """Create a conversation, follow it, send one message (again, with its key, if its API process dies),
    until the run's own `message_end`."""
    for attempt in range(20):  # an API process may be down for a moment
        try:
            cid = (await client.post(c.base(i + attempt) + "/api/v1/chat/conversations",
                                     json={"agent": "chaos"})).json()["id"]
            break
        except httpx.HTTPError:
            await asyncio.sleep(0.2)
    seen = Seen(cid)
    key = f"k-{uuid.uuid4().hex}"

    async def send() -> None:
        for attempt in range(20):
            try:
                sent = await client.post(c.base(i + attempt) + f"/api/v1/chat/conversations/{cid}/messages",
                                         json={"content": "Do both"}, headers={"Idempotency-Key": key,
                                                                              "Accept": "application/json"})
                if sent.status_code < 500:
                    seen.run_id = sent.json().get("run_id") or seen.run_id
                    return
            except httpx.HTTPError:
                pass
            seen.resent += 1
            await asyncio.sleep(0.2)

    sending = asyncio.create_task(send())
    last = 0
    for attempt in range(200):
        try:
            async with aconnect_sse(client, "GET", c.base(i + attempt) + f"/api/v1/chat/conversations/{cid}/events",
                                    headers={"Last-Event-ID": str(last)}) as source:
                async for event in source.aiter_sse():
                    if event.event == "ping" or not event.id:
                        continue
                    data = json.loads(event.data)
                    seen.events.append((int(event.id), event.event, data))
                    last = int(event.id)
                    if event.event == "message_end" and "agent_path" not in data:
                        await sending
                        return seen
        except (httpx.HTTPError, json.JSONDecodeError):
            seen.reconnects += 1
            await asyncio.sleep(0.1)
    sending.cancel()
    return seen


def assembled(events: list[tuple[int, str, dict[str, Any]]]) -> tuple[str, list[str], Counter[str]]:
    """What a client assembles from a run's own events: its text and tool calls (`retracted` applied), and
    the results each started call got."""
    texts: dict[str, str] = {}
    calls: list[str] = []
    results: Counter[str] = Counter()
    for _, kind, data in events:
        if "agent_path" in data:
            continue
        if kind == "content_delta":
            texts[data["message_id"]] = texts.get(data["message_id"], "") + data["delta"]
        elif kind == "tool_call_start":
            calls.append(data["tool_call_id"])
            results[data["tool_call_id"]] += 0
        elif kind == "tool_result":
            results[data["tool_call_id"]] += 1
        elif kind == "retracted":
            texts.pop(data.get("message_id") or "", None)
            calls = [x for x in calls if x not in data.get("tool_call_ids", ())]
    return "".join(texts.values()), calls, results


async def _check(c: Cluster, client: httpx.AsyncClient, seen: list[Seen], effects: Path) -> dict[str, Any]:
    broken: dict[str, list[str]] = {}
    statuses: Counter[str | None] = Counter()
    noted = await asyncio.to_thread(effects.read_text)
    onces = Counter(line.split()[1] for line in noted.splitlines() if line.startswith("once "))
    for s in seen:
        problems = []
        ids = [i for i, _, _ in s.events]
        if not ids or ids != list(range(ids[0], ids[0] + len(ids))):
            problems.append("ids")
        run = (await client.get(c.base(0) + f"/api/v1/chat/conversations/{s.cid}")).json()
        record = (await client.get(c.base(0) + f"/api/v1/runs/{s.events[-1][2]['run_id']}")).json() \
            if s.events else {}
        if record.get("status") not in ("completed", "failed", "canceled"):
            problems.append(f"ended ({record.get('status')})")
        text, calls, results = assembled(s.events)
        if any(n != 1 for n in results.values()):
            problems.append("settled")
        messages = run.get("messages", [])
        kept_calls = [x["id"] for m in messages for x in m.get("tool_calls") or []]
        kept_text = "".join(m.get("content") or "" for m in messages if m["role"] == "assistant")
        if (text, calls) != (kept_text, kept_calls):
            problems.append("transcript")
        replay: list[tuple[int, str, dict[str, Any]]] = []
        async with aconnect_sse(client, "GET", c.base(0) + f"/api/v1/chat/conversations/{s.cid}/events",
                                headers={"Last-Event-ID": "0"}) as source:
            async for event in source.aiter_sse():
                if event.event == "ping" or not event.id:
                    continue
                replay.append((int(event.id), event.event, json.loads(event.data)))
                if event.event == "message_end" and "agent_path" not in replay[-1][2]:
                    break
        if [(i, k) for i, k, _ in replay] != [(i, k) for i, k, _ in s.events]:
            problems.append("replayed")
        statuses[record.get("status")] += 1
        if problems:
            broken[s.run_id or s.cid] = problems
    twice = sorted(token for token, n in onces.items() if n > 1)
    return {"conversations": len(seen), "completed": statuses["completed"],
            "kills": dict(c.kills), "reconnects": sum(s.reconnects for s in seen),
            "resent": sum(s.resent for s in seen), "retracted": sum(k == "retracted" for s in seen
                                                                    for _, k, _ in s.events),
            "once_twice": twice, "broken": broken}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--apis", type=int, default=2)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--kill-every", type=float, nargs=2, default=(1.0, 3.0))
    parser.add_argument("--api-kills", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    report = asyncio.run(chaos(conversations=args.conversations, concurrency=args.concurrency, apis=args.apis,
                               workers=args.workers, kill_every=tuple(args.kill_every), api_kills=args.api_kills,
                               seed=args.seed))
    for name in ("conversations", "completed", "kills", "reconnects", "resent", "retracted", "once_twice"):
        print(f"{name:>14}  {report[name]}")
    print(f"{'broken':>14}  {len(report['broken'])}")
    for run, problems in report["broken"].items():
        print(f"    {run}: {', '.join(problems)}")
    sys.exit(1 if report["broken"] or report["once_twice"] else 0)


if __name__ == "__main__":
    main()
