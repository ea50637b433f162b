"""Parallel tool calls (`loop-and-hooks.md` §2, Parallelism): settle, timeouts, cap, barrier, order."""

from __future__ import annotations

import asyncio
import threading

from helpers import collect, of_type
from ringlet import Agent, Execution, RunContext, tool
from ringlet.context import Caller
from ringlet.testing import ScriptedModel, call


async def test_all_calls_settle_and_the_transcript_keeps_call_order() -> None:
    release = asyncio.Event()
    finished: list[str] = []

    @tool
    async def slow(name: str) -> str:
        """Waits for the fast one."""
        await release.wait()
        finished.append(name)
        return f"slow {name}"

    @tool
    async def fast(name: str) -> str:
        """Finishes first and lets the slow one go."""
        release.set()
        finished.append(name)
        return f"fast {name}"

    @tool
    async def broken() -> str:
        """Fails."""
        raise RuntimeError("no")

    model = ScriptedModel([[call("slow", name="a"), call("broken"), call("fast", name="b")], "ok"])
    events, result = await collect(Agent(model, tools=[slow, fast, broken]))
    assert finished == ["b", "a"]
    # tool_result events go out as calls finish; the transcript keeps call order
    assert [e.tool_call_id for e in of_type(events, "tool_result")][-1] == "call_1"
    assert [m.tool_call_id for m in result.messages if m.role == "tool"] == ["call_1", "call_2", "call_3"]
    assert [m.metadata["is_error"] for m in result.messages if m.role == "tool"] == [False, True, False]


async def test_per_call_timeout_does_not_touch_other_calls() -> None:
    @tool(timeout_s=0.05)
    async def hang() -> str:
        """Never returns."""
        await asyncio.Event().wait()
        return "never"

    @tool
    async def quick() -> str:
        """q"""
        return "done"

    model = ScriptedModel([[call("hang"), call("quick")], "ok"])
    events, _ = await collect(Agent(model, tools=[hang, quick]))
    by_id = {e.tool_call_id: e for e in of_type(events, "tool_result")}
    assert by_id["call_1"].error == {"code": "tool_timeout", "message": "tool 'hang' timed out after 0.05 s"}
    assert by_id["call_2"].result == "done"


async def test_batch_timeout_cancels_only_running_calls() -> None:
    cancelled = asyncio.Event()

    @tool(timeout_s=0)
    async def hang() -> str:
        """No per-call timeout."""
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    @tool
    async def quick() -> str:
        """q"""
        return "kept"

    agent = Agent(ScriptedModel([[call("quick"), call("hang")], "ok"]), tools=[hang, quick],
                  execution=Execution(batch_timeout_s=0.1))
    events, result = await collect(agent)
    by_id = {e.tool_call_id: e for e in of_type(events, "tool_result")}
    assert by_id["call_1"].result == "kept"
    assert by_id["call_2"].error["code"] == "tool_timeout"
    assert "batch timeout of 0.1 s" in by_id["call_2"].error["message"]
    assert cancelled.is_set()
    assert result.output == "ok"


async def test_batch_timeout_is_never_shorter_than_the_largest_call_timeout() -> None:
    @tool(timeout_s=5)
    async def slowish() -> str:
        """Takes 50 ms of work."""
        await asyncio.sleep(0.05)
        return "done"

    agent = Agent(ScriptedModel([[call("slowish"), call("slowish")], "ok"]), tools=[slowish],
                  execution=Execution(batch_timeout_s=0.01))
    events, _ = await collect(agent)
    # a 0.01 s batch timeout would cut them; the batch is stretched to the 5 s call timeout instead
    assert [e.result for e in of_type(events, "tool_result")] == ["done", "done"]


async def test_concurrency_is_capped() -> None:
    running = peak = 0

    @tool
    async def work() -> str:
        """w"""
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        for _ in range(5):
            await asyncio.sleep(0)  # yield to the other calls
        running -= 1
        return "ok"

    batch = [call("work") for _ in range(6)]
    await Agent(ScriptedModel([batch, "ok"]), tools=[work], execution=Execution(max_tool_concurrency=2)).run("x")
    assert peak == 2
    peak = 0
    await Agent(ScriptedModel([batch, "ok"]), tools=[work]).run("x")
    assert peak == 6


async def test_parallel_tools_false_runs_one_at_a_time() -> None:
    running = peak = 0

    @tool
    async def work() -> str:
        """w"""
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0)
        running -= 1
        return "ok"

    await Agent(ScriptedModel([[call("work")] * 3, "ok"]), tools=[work],
                execution=Execution(parallel_tools=False)).run("x")
    assert peak == 1


async def test_sequential_tool_is_a_barrier() -> None:
    log: list[str] = []

    @tool
    async def step(name: str) -> str:
        """s"""
        log.append(f"start {name}")
        for _ in range(3):
            await asyncio.sleep(0)
        log.append(f"end {name}")
        return name

    @tool(sequential=True)
    async def barrier() -> str:
        """b"""
        log.append("start barrier")
        await asyncio.sleep(0)
        log.append("end barrier")
        return "b"

    model = ScriptedModel([[call("step", name="a"), call("step", name="b"), call("barrier"),
                            call("step", name="c"), call("step", name="d")], "ok"])
    await Agent(model, tools=[step, barrier]).run("x")
    assert log.index("start barrier") > max(log.index("end a"), log.index("end b"))
    assert log.index("end barrier") < min(log.index("start c"), log.index("start d"))
    # the calls around the barrier still overlap
    assert log.index("start b") < log.index("end a")
    assert log.index("start d") < log.index("end c")


async def test_sync_tools_run_in_a_worker_thread() -> None:
    threads: list[str] = []

    @tool
    def where() -> str:
        """w"""
        threads.append(threading.current_thread().name)
        return "here"

    await Agent(ScriptedModel([call("where"), "ok"]), tools=[where]).run("x")
    assert len(threads) == 1
    assert threads[0] != threading.main_thread().name


async def test_a_timed_out_thread_result_is_discarded_and_the_call_is_flagged() -> None:
    gate = threading.Event()
    seen_cancel: list[bool] = []

    @tool(timeout_s=0.05)
    def blocking(ctx: RunContext) -> str:
        """b"""
        gate.wait(5)
        seen_cancel.append(ctx.cancelled.is_set())
        return "late"

    events, result = await collect(Agent(ScriptedModel([call("blocking"), "ok"]), tools=[blocking]))
    assert of_type(events, "tool_result")[0].error["code"] == "tool_timeout"
    gate.set()
    await asyncio.to_thread(lambda: None)  # let the worker finish
    for _ in range(100):
        if seen_cancel:
            break
        await asyncio.to_thread(lambda: None)
    assert seen_cancel == [True]
    assert "late" not in [m.text for m in result.messages]


async def test_tools_get_the_run_context() -> None:
    seen = {}

    @tool
    async def who(ctx: RunContext, x: int) -> str:
        """w"""
        seen.update(run_id=ctx.run_id, call=ctx.tool_call_id, deps=ctx.deps, realm=ctx.realm)
        ctx.notify("info", "working", "half way", (1, 2))
        return str(x)

    assert "ctx" not in who.parameters["properties"]
    events, result = await collect(Agent(ScriptedModel([call("who", x=3, id="c9"), "ok"]), tools=[who]),
                                   deps={"db": 1}, caller=Caller(realm="prod"))
    assert seen == {"run_id": result.run_id, "call": "c9", "deps": {"db": 1}, "realm": "prod"}
    note = of_type(events, "notification")[0]
    assert (note.level, note.title, note.message, note.source) == ("info", "working", "half way", "who")
    assert (note.progress.current, note.progress.total) == (1, 2)
