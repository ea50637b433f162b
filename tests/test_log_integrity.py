"""The event log stays whole through a crash and a full disk (issue 28).

In process: a tool's `tool_call_start` is in the log before the tool runs; a run's end record and its
`message_end` are one transaction; recovery makes an interrupted run's log and transcript agree, and
writes the end of a run whose record ended before its last events were logged.

Real subprocesses: `ringlet serve` is SIGKILLed at moments under load (before the first events, mid
tool batch, as runs end), restarted, and every run is checked (`anomalies`): gap-free ids, one start
and one end, every call's start and result, the log against the run record, the transcript and a
side-effect counter, all closed at readiness. And a small tmpfs the test fills: the streams end with
`error storage_unavailable`, /readyz turns unready, and once space is freed the runs are closed and the
database is intact.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from httpx_sse import aconnect_sse

from ringlet import Agent, RunContext, tool
from ringlet.events import ContentDeltaEvent, MessageStartEvent, StatusEvent, ToolCallDeltaEvent, ToolCallStartEvent
from ringlet.events import ToolResultEvent as Result
from ringlet.messages import Message, ToolCall
from ringlet.server import ServerSettings, create_app
from ringlet.server.catalog import Catalog
from ringlet.server.durable.reconcile import HOST
from ringlet.server.runs.runner import Runner
from ringlet.store import Store
from ringlet.testing import FunctionModel, call
from serving import serving
from test_recovery import exited_pid, free_port, ringlet_serve

# -- in process ---------------------------------------------------------------------------------------------


async def test_a_tools_start_is_in_the_log_before_the_tool_runs(store: Store) -> None:
    seen: dict[str, list[str]] = {}

    @tool
    async def look(ctx: RunContext) -> str:
        """Look at the log."""
        logged = await store.events.after(ctx.conversation_id or "", 0)
        mine = [kind for _, kind, p in logged if p.get("tool_call_id") == ctx.tool_call_id]
        seen[f"{ctx.conversation_id} {ctx.tool_call_id}"] = mine
        return "looked"

    def model(request: Any) -> Any:
        return "done" if request.messages[-1].role == "tool" else call("look")

    app = create_app(ServerSettings(), store=store, agents=[Agent(FunctionModel(model), name="a", tools=[look])])
    async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as c:
        key, _ = await store.keys.create("k", scopes=["chat"])
        c.headers["Authorization"] = f"Bearer {key}"
        for _ in range(5):
            cid = (await c.post("/api/v1/chat/conversations", json={"agent": "a"})).json()["id"]
            sent = await c.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": "look"},
                                headers={"Accept": "application/json"})
            assert sent.status_code == 200, sent.text
    assert len(seen) == 5
    assert all(kinds == ["tool_call_start", "tool_call_delta"] for kinds in seen.values()), seen


async def test_a_runs_end_record_and_its_last_events_are_one_transaction(store: Store,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    ended: list[tuple[str, list[str]]] = []
    finish = store.runs.finish

    async def finish_run(run_id: str, **kwargs: Any) -> Any:
        ended.append((kwargs["status"], [kind for _, kind, _ in kwargs.get("events") or ()]))
        return await finish(run_id, **kwargs)

    monkeypatch.setattr(store.runs, "finish", finish_run)
    app = create_app(ServerSettings(), store=store, agents=[Agent(FunctionModel(lambda _: "hi"), name="a")])
    async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as c:
        key, _ = await store.keys.create("k", scopes=["chat"])
        c.headers["Authorization"] = f"Bearer {key}"
        cid = (await c.post("/api/v1/chat/conversations", json={"agent": "a"})).json()["id"]
        sent = await c.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": "hello"},
                            headers={"Accept": "application/json"})
        assert sent.status_code == 200, sent.text
    assert ended == [("completed", ["status", "message_end"])]
    kinds = [kind for _, kind, _ in await store.events.after(cid, 0)]
    assert kinds[-2:] == ["status", "message_end"]
    assert kinds.count("message_end") == 1


async def test_recovery_makes_the_log_and_the_transcript_agree(store: Store) -> None:
    """The log ran ahead of the transcript (c1, c2: the process died before saving them) and, as an older
    ringlet left it, the transcript ahead of the log (c3 and its result were never logged)."""
    cid = (await store.conversations.create(agent="a")).id
    dead = f"proc_old@{HOST}:{exited_pid()}"
    await store.runs.create("r_1", agent="a", conversation_id=cid, lease_owner=dead,
                           lease_expires_at="2999-01-01T00:00:00.000Z", incoming=[Message.user("go")])
    c3 = ToolCall(id="c3", name="bump", arguments={"n": 3}, raw_arguments='{"n": 3}')
    await store.conversations.append_messages(cid, [
        Message(id="m_a", role="assistant", run_id="r_1", tool_calls=(c3,)),
        Message(id="m_b", role="tool", run_id="r_1", tool_call_id="c3", name="bump", content="bumped 3",
                metadata={"is_tool_result": True, "is_error": False})])
    for event in (MessageStartEvent(run_id="r_1", ts="t", message_id="m_s", agent="a"),
                  StatusEvent(run_id="r_1", ts="t", state="working"),
                  ContentDeltaEvent(run_id="r_1", ts="t", message_id="m_x", delta="Bumping"),
                  ToolCallStartEvent(run_id="r_1", ts="t", tool_call_id="c1", name="bump", index=0),
                  ToolCallDeltaEvent(run_id="r_1", ts="t", tool_call_id="c1", args_delta='{"n": 1}'),
                  ToolCallStartEvent(run_id="r_1", ts="t", tool_call_id="c2", name="bump", index=1),
                  ToolCallDeltaEvent(run_id="r_1", ts="t", tool_call_id="c2", args_delta='{"n": 2}'),
                  Result(run_id="r_1", ts="t", tool_call_id="c1", name="bump", result="bumped 1")):
        await store.events.append(cid, event)
    runner = Runner(store, Catalog([]), ServerSettings())
    assert await runner.recovery.recover() == 1
    assert await runner.recovery.recover() == 0
    await runner.writer.close()
    log = await store.events.after(cid, 0)
    assert [(kind, p.get("tool_call_id")) for _, kind, p in log[8:]] == [
        ("tool_call_start", "c3"), ("tool_call_delta", "c3"), ("tool_result", "c3"), ("tool_result", "c2"),
        ("error", None), ("message_end", None)]
    assert log[10][2]["result"] == "bumped 3"
    assert log[11][2]["error"]["code"] == "interrupted"
    assert log[13][2]["message_id"] == "m_x"
    transcript = await store.conversations.load_messages(cid)
    assert [(m.role, m.tool_call_id, m.text) for m in transcript[3:]] == [
        ("assistant", None, "Bumping"), ("tool", "c1", "bumped 1"), ("tool", "c2", transcript[5].text)]
    assert [(c.id, c.arguments) for c in transcript[3].tool_calls] == [("c1", {"n": 1}), ("c2", {"n": 2})]
    assert transcript[5].metadata["interrupted"] is True
    if store.db.sqlite_file:
        assert anomalies(Path(store.db.sqlite_file), {"r_1": {"c1", "c2", "c3"}}) == Counter()


async def test_an_ended_run_whose_end_was_not_logged_gets_it(store: Store) -> None:
    """A graph run records its end, then logs it: a process that dies between leaves the run ended with
    a log that stops early. Recovery writes what is missing, once."""
    cid = (await store.conversations.create(agent="g")).id
    dead = f"proc_old@{HOST}:{exited_pid()}"
    await store.runs.create("r_g", agent="g", conversation_id=cid, kind="graph", lease_owner=dead,
                           lease_expires_at="2999-01-01T00:00:00.000Z", incoming=[Message.user("go")])
    for event in (MessageStartEvent(run_id="r_g", ts="t", message_id="m_1", agent="g"),
                  StatusEvent(run_id="r_g", ts="t", state="working"),
                  ContentDeltaEvent(run_id="r_g", ts="t", message_id="m_1", delta="Done.")):
        await store.events.append(cid, event)
    await store.runs.finish("r_g", status="completed", finish_reason="end_turn", in_tokens=3, out_tokens=4,
                           cost_usd=None, conversation_id=cid, conversation_status="idle")
    runner = Runner(store, Catalog([]), ServerSettings())
    await runner.recovery.recover()
    await runner.recovery.recover()
    await runner.writer.close()
    tail = [(kind, p.get("state") or p.get("finish_reason")) for _, kind, p in await store.events.after(cid, 3)]
    assert tail == [("status", "completed"), ("message_end", "end_turn")]
    assert (await store.events.after(cid, 4))[0][2]["usage"]["out_tokens"] == 4


# -- the soak: SIGKILL under load, restart, check every run ---------------------------------------------------

TOOLS_PY = '''
import asyncio, os
from ringlet import RunContext

async def bump(n: int, ctx: RunContext) -> str:
    """Count one side effect."""
    with open(os.environ["BUMP_FILE"], "a") as f:
        f.write(f"{ctx.run_id} {ctx.tool_call_id}\\n")
    await asyncio.sleep(float(os.environ.get("BUMP_SLEEP", "0.3")))
    return f"bumped {n}"
'''


def tool_model(delay: float = 0.005, calls: int = 2, answer_tokens: int = 20) -> Any:
    """An OpenAI-compatible streaming endpoint: a new question gets `calls` parallel `bump` calls, their
    results get a streamed answer."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    async def completions(request: Request) -> StreamingResponse:
        messages = (await request.json())["messages"]
        if messages[-1]["role"] == "tool":
            deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}] + [
                {"content": f"w{i} "} for i in range(answer_tokens)]
            finish = "stop"
        else:
            deltas = [{"role": "assistant", "content": "Bumping."}] + [
                {"tool_calls": [{"index": i, "id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                                 "function": {"name": "bump", "arguments": json.dumps({"n": i})}}]}
                for i in range(calls)]
            finish = "tool_calls"

        async def chunks() -> AsyncIterator[str]:
            for i, delta in enumerate(deltas):
                chunk = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m",
                         "choices": [{"index": 0, "delta": delta,
                                      "finish_reason": finish if i == len(deltas) - 1 else None}]}
                yield f"data: {json.dumps(chunk)}\n\n"
                await asyncio.sleep(delay)
            yield "data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])


def anomalies(db: Path, effects: dict[str, set[str]]) -> Counter[str]:
    """Every way the stored runs of `db` break the log's promises; `effects`: the calls whose side effect
    happened, by run id."""
    found: Counter[str] = Counter()
    with contextlib.closing(sqlite3.connect(db)) as conn:
        runs: list[dict[str, Any]] = [dict(zip(("id", "cid", "status", "finish_reason", "kind"), r, strict=True))
                                      for r in conn.execute(
            "SELECT id, conversation_id, status, finish_reason, kind FROM runs WHERE conversation_id IS NOT NULL")]
        for cid, in conn.execute("SELECT id FROM conversations"):
            ids = [r[0] for r in conn.execute("SELECT id FROM events WHERE conversation_id = ? ORDER BY id", (cid,))]
            found["id_gap"] += ids != list(range(1, len(ids) + 1))
        for run in runs:
            found.update(_run_anomalies(conn, run, effects.get(run["id"], set())))
    return +found


def _run_anomalies(conn: sqlite3.Connection, run: dict[str, Any], effects: set[str]) -> Counter[str]:
    found: Counter[str] = Counter()
    log = [(kind, json.loads(p)) for kind, p in conn.execute(
        "SELECT type, payload FROM events WHERE conversation_id = ? AND run_id = ? ORDER BY id",
        (run["cid"], run["id"]))]
    log = [(kind, p) for kind, p in log if "agent_path" not in p]
    kinds = [kind for kind, _ in log]
    found["not_closed"] += run["status"] in ("working", "input_required")
    found["start_count"] += kinds.count("message_start") != 1 or kinds[:1] != ["message_start"]
    found["end_count"] += kinds.count("message_end") != 1 or kinds[-1:] != ["message_end"]
    found["no_status_working"] += "status" not in kinds
    ends = [p for kind, p in log if kind == "message_end"]
    if ends and ends[-1]["finish_reason"] != run["finish_reason"]:
        found["end_vs_record"] += 1
    states = [p["state"] for kind, p in log if kind == "status" and p["state"] in ("completed", "failed", "canceled")]
    if states and states[-1] != run["status"]:
        found["status_vs_record"] += 1
    starts = Counter(p["tool_call_id"] for kind, p in log if kind == "tool_call_start")
    results = Counter(p["tool_call_id"] for kind, p in log if kind == "tool_result")
    found["start_without_result"] += sum(1 for c in starts if results[c] == 0)
    found["result_without_start"] += sum(1 for c in results if starts[c] == 0)
    found["duplicate_start_or_result"] += sum(1 for n in (*starts.values(), *results.values()) if n > 1)
    order = {p["tool_call_id"]: i for i, (kind, p) in enumerate(log) if kind == "tool_call_start"}
    found["result_before_start"] += sum(1 for i, (kind, p) in enumerate(log)
                                        if kind == "tool_result" and order.get(p["tool_call_id"], -1) > i)
    bodies = [json.loads(b) for b, in conn.execute(
        "SELECT body FROM messages WHERE conversation_id = ? AND run_id = ? ORDER BY seq", (run["cid"], run["id"]))]
    kept_calls = {c["id"] for b in bodies if b["role"] == "assistant" for c in b.get("tool_calls") or ()}
    kept_results = {b["tool_call_id"] for b in bodies if b["role"] == "tool"}
    found["transcript_calls_vs_log"] += kept_calls != set(starts)
    found["transcript_results_vs_log"] += kept_results != set(results)
    found["side_effect_not_logged"] += len(effects - set(starts))
    found["side_effect_not_in_transcript"] += len(effects - kept_calls)
    if run["status"] == "completed":
        answer = [b for b in bodies if b["role"] == "assistant" and not b.get("tool_calls")]
        found["completed_without_answer"] += not answer or not answer[-1]["content"]
    return found


def side_effects(path: Path) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        run_id, call_id = line.split()
        out.setdefault(run_id, set()).add(call_id)
    return out


async def _converse(c: httpx.AsyncClient, cid: str, seen: list[tuple[str, dict[str, Any]]]) -> None:
    with contextlib.suppress(httpx.HTTPError):
        async with aconnect_sse(c, "POST", f"/api/v1/chat/conversations/{cid}/messages",
                                json={"content": "bump twice"}) as source:
            async for event in source.aiter_sse():  # as they come: the test acts on what it has seen
                data = json.loads(event.data)
                if event.event != "ping":
                    seen.append((event.event, data))


async def soak(tmp_path: Path, moment: str, runs: int = 24) -> tuple[int, Counter[str], float]:
    """Start `runs` conversations at once on `ringlet serve`, SIGKILL it at `moment`, restart it and check
    every run; (runs checked, anomalies, seconds from readiness until every run was closed)."""
    counter = tmp_path / "effects.txt"
    async with serving(tool_model()) as model_url:
        agent = tmp_path / "agents" / "bumper"
        agent.mkdir(parents=True)
        (agent / "tools.py").write_text(TOOLS_PY)
        (agent / "config.yaml").write_text(
            f"model: openai:m\nmodel_options: {{base_url: '{model_url}/v1', api_key: x}}\n"
            "instructions: Bump.\ntools: {bump: {effect: read}}\n")
        port, db = free_port(), tmp_path / "ringlet.db"
        env = {"RINGLET_RUN_LEASE_S": "600", "BUMP_FILE": str(counter)}
        base = f"http://127.0.0.1:{port}"
        async with ringlet_serve(port, db, tmp_path / "agents", **env) as first, \
                httpx.AsyncClient(base_url=base, timeout=60) as c:
            cids = [(await c.post("/api/v1/chat/conversations", json={"agent": "bumper"})).json()["id"]
                    for _ in range(runs)]
            seen: list[tuple[str, dict[str, Any]]] = []
            talks = [asyncio.create_task(_converse(c, cid, seen)) for cid in cids]
            await until(lambda: _reached(moment, seen, counter, runs), 60, every=0.002)
            first.send_signal(signal.SIGKILL)
            await first.wait()
            await asyncio.gather(*talks)
        async with ringlet_serve(port, db, tmp_path / "agents", **env), httpx.AsyncClient(base_url=base) as c:
            ready = time.monotonic()
            await until(lambda: _ready(c), 30)
            while True:
                with contextlib.closing(sqlite3.connect(db)) as conn:
                    working = conn.execute("SELECT count(*) FROM runs WHERE status = 'working'").fetchone()[0]
                if not working or time.monotonic() - ready > 5:
                    break
                await asyncio.sleep(0.05)
            closing_s = time.monotonic() - ready
    with contextlib.closing(sqlite3.connect(db)) as conn:
        checked = conn.execute("SELECT count(*) FROM runs").fetchone()[0]
    return checked, anomalies(db, side_effects(counter)), closing_s


async def until(check: Any, seconds: float, every: float = 0.05) -> None:
    """Poll `check()` (a bool, or an awaitable of one) until it holds; TimeoutError after `seconds`."""
    async with asyncio.timeout(seconds):
        for _ in itertools.count():
            done = check()
            if await done if asyncio.iscoroutine(done) else done:
                return
            await asyncio.sleep(every)


async def _ready(c: httpx.AsyncClient) -> bool:
    return (await c.get("/readyz")).status_code == 200


async def _idle(c: httpx.AsyncClient, cids: list[str]) -> bool:
    statuses = [(await c.get(f"/api/v1/chat/conversations/{cid}")).json()["conversation"]["status"] for cid in cids]
    return all(s == "idle" for s in statuses)


def _reached(moment: str, seen: list[tuple[str, dict[str, Any]]], counter: Path, runs: int) -> bool:
    if moment == "first_events":
        return any(kind == "message_start" for kind, _ in seen)
    if moment == "mid_batch":
        return counter.exists() and len(counter.read_text().splitlines()) >= runs
    return any(kind == "status" and p["state"] == "completed" for kind, p in seen)  # "ending"


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["first_events", "mid_batch", "ending"])
async def test_sigkill_under_load_leaves_every_log_whole(tmp_path: Path, moment: str) -> None:
    checked, found, closing_s = await soak(tmp_path, moment)
    print(f"\nsoak {moment}: {checked} runs checked, anomalies {dict(found)}, closed {closing_s:.2f} s after ready")
    assert found == Counter()
    assert closing_s < 2


# -- a full disk ----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def small_filesystem(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `path` (skips the test where mounting is not allowed)."""
    path.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(path: Path) -> Path:
    """Fill the file system of `path` with one file, to the last byte."""
    filler = path / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for size in (1 << 16, 512, 1):
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * size):
                    pass
    finally:
        os.close(fd)
    return filler


@pytest.mark.slow
async def test_a_full_disk_ends_the_streams_and_readiness_comes_back_with_the_space(tmp_path: Path) -> None:
    with small_filesystem(tmp_path / "small", "24m") as small:
        async with serving(tool_model(delay=0.02, calls=1, answer_tokens=2000)) as model_url:
            agent = tmp_path / "agents" / "bumper"
            agent.mkdir(parents=True)
            (agent / "tools.py").write_text(TOOLS_PY)
            (agent / "config.yaml").write_text(
                f"model: openai:m\nmodel_options: {{base_url: '{model_url}/v1', api_key: x}}\n"
                "instructions: Bump.\ntools: {bump: {effect: read}}\n")
            port, db = free_port(), small / "ringlet.db"
            env = {"RINGLET_RUN_LEASE_S": "0.9", "BUMP_FILE": str(tmp_path / "effects.txt"), "BUMP_SLEEP": "0"}
            async with ringlet_serve(port, db, tmp_path / "agents", **env) as server, \
                    httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as c:
                cids = [(await c.post("/api/v1/chat/conversations", json={"agent": "bumper"})).json()["id"]
                        for _ in range(4)]
                seen: dict[str, list[tuple[str, dict[str, Any]]]] = {cid: [] for cid in cids}
                talks = [asyncio.create_task(_converse(c, cid, seen[cid])) for cid in cids]
                try:
                    await until(lambda: all(sum(k == "content_delta" for k, _ in s) > 20 for s in seen.values()), 30)
                except TimeoutError:
                    pytest.fail(f"the answers did not stream: {[[k for k, _ in s][-4:] for s in seen.values()]}")
                filler = await asyncio.to_thread(fill, small)
                async with asyncio.timeout(20):  # every stream ends, with the error
                    await asyncio.gather(*talks)
                for cid in cids:
                    kinds = [kind for kind, _ in seen[cid]]
                    assert kinds[-2:] == ["error", "message_end"], (cid, kinds[-5:])
                    error = seen[cid][-2][1]
                    assert (error["code"], error["retryable"]) == ("storage_unavailable", True)
                ready = await c.get("/readyz")
                assert (ready.status_code, ready.json()) == (503, {"status": "storage unavailable"})
                busy = await c.post(f"/api/v1/chat/conversations/{cids[0]}/messages", json={"content": "x"})
                assert busy.status_code in (409, 503)  # its run is not closed yet, or nothing can be stored
                filler.unlink()
                await until(lambda: _ready(c), 20)  # space is back: so is readiness, and the runs are closed
                await until(lambda: _idle(c, cids), 20)
                async with c.stream("POST", f"/api/v1/chat/conversations/{cids[0]}/messages",
                                    json={"content": "again"}) as again:
                    assert again.status_code == 200  # a new run starts
                server.send_signal(signal.SIGTERM)
                await server.wait()
            with contextlib.closing(sqlite3.connect(db)) as conn:
                assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
                for cid in cids:
                    run_id = seen[cid][0][1]["run_id"]
                    status, = conn.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()
                    assert status == "failed"
                    log = [(k, json.loads(p)) for k, p in conn.execute(
                        "SELECT type, payload FROM events WHERE run_id = ? ORDER BY id", (run_id,))]
                    assert [k for k, _ in log].count("message_end") == 1
                    assert [(k, p.get("code")) for k, p in log[-2:]] == [("error", "storage_unavailable"),
                                                                        ("message_end", None)]
            found = anomalies(db, {})
            found.pop("side_effect_not_logged", None)
            assert found == Counter(), found
    assert not await asyncio.to_thread(os.path.ismount, tmp_path / "small")
