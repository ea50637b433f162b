"""`ringlet.durable` (issue 19): an Agent inside the user's own DBOS workflow, its model requests and tool calls
steps of it. The docs' example program (examples/durable_agent.py) runs as a real subprocess against a scripted
OpenAI-compatible model, is SIGKILLed mid-run, and run again: DBOS recovers the workflow and the tool that had
finished is not run again."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from dbos import DBOS

from postgres import fresh_database
from ringlet import Agent
from ringlet.durable import DurableAgent, log_through_logging
from ringlet.errors import NotDurable
from ringlet.testing import FunctionModel, Reply, ScriptedModel, call
from serving import serving

EXAMPLE = Path(__file__).parent.parent / "examples" / "durable_agent.py"


class Bookkeeper:
    """A scripted model: it logs the expense, then (held on the first try, until the test has killed the
    program) answers with the total."""

    def __init__(self) -> None:
        self.requests: list[list[dict[str, Any]]] = []
        self.answering = asyncio.Event()
        self.hold = True

    def app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import StreamingResponse
        from starlette.routing import Route

        async def completions(request: Request) -> StreamingResponse:
            messages = (await request.json())["messages"]
            self.requests.append(messages)
            if messages[-1]["role"] == "tool":
                deltas = [{"role": "assistant", "content": "Logged; "}, {"content": "the total is 12.50."}]
            else:
                deltas = [{"role": "assistant", "content": None}, {"tool_calls": [{
                    "index": 0, "id": "call_log", "type": "function",
                    "function": {"name": "log_expense", "arguments": json.dumps({"amount": 12.5, "note": "taxi"})}}]}]

            async def chunks() -> AsyncIterator[str]:
                for i, delta in enumerate(deltas):
                    if i == 1 and messages[-1]["role"] == "tool" and self.hold:
                        self.answering.set()  # the program is killed while this answer streams
                        await asyncio.Event().wait()
                    yield _chunk({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
                yield _chunk({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}})
                yield "data: [DONE]\n\n"

            return StreamingResponse(chunks(), media_type="text/event-stream")

        return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])


def _chunk(body: dict[str, Any]) -> str:
    return f"data: {json.dumps({'id': 'x', 'object': 'chat.completion.chunk', 'created': 0, 'model': 'm', **body})}\n\n"


async def example(tmp_path: Path, model_url: str) -> asyncio.subprocess.Process:
    env = {**os.environ, "OPENAI_API_KEY": "x", "OPENAI_BASE_URL": f"{model_url}/v1",
           "EXPENSES_FILE": str(tmp_path / "expenses.csv"),
           "DBOS_DATABASE_URL": f"sqlite:///{tmp_path / 'dbos.sqlite'}"}
    return await asyncio.create_subprocess_exec(sys.executable, str(EXAMPLE), "Log a 12.50 taxi ride.", cwd=tmp_path,
                                                env=env, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)


@pytest.mark.slow
async def test_the_readme_example_goes_on_after_a_crash_without_logging_twice(tmp_path: Path) -> None:
    model = Bookkeeper()
    async with serving(model.app()) as url:
        first = await example(tmp_path, url)
        try:
            async with asyncio.timeout(60):
                await model.answering.wait()  # the expense is logged; the answer is streaming
        finally:
            first.kill()
            await first.communicate()
        assert (tmp_path / "expenses.csv").read_text() == "12.50,taxi\n"
        model.hold = False
        again = await example(tmp_path, url)
        async with asyncio.timeout(60):
            out, err = await again.communicate()
        assert again.returncode == 0, err.decode()
    assert out.decode().strip() == "Logged; the total is 12.50."
    assert (tmp_path / "expenses.csv").read_text() == "12.50,taxi\n"  # the finished tool call was not run again
    # the first response was recorded: only the answer interrupted by the kill was requested again
    assert [m[-1]["role"] for m in model.requests] == ["user", "tool", "tool"]


async def test_a_durable_agent_outside_a_workflow_fails_loudly() -> None:
    agent = DurableAgent(Agent(ScriptedModel(["hi"])))
    with pytest.raises(NotDurable, match="inside a DBOS workflow"):
        await agent.run("hello")


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def _adds(request: Any) -> Any:
    if request.messages and request.messages[-1].role == "tool":
        return "The sum is 5."
    return Reply(calls=[call("add", a=2, b=3)])


ADDER = DurableAgent(Agent(FunctionModel(_adds), name="adder", tools=[add]))


@DBOS.workflow(name="ringlet.test.library_turn")
async def library_turn(prompt: str) -> str:
    return (await ADDER.run(prompt)).output


@pytest.mark.slow
async def test_a_library_turn_records_its_four_steps_and_outlives_dropped_connections(postgres_url: str) -> None:
    """The turn of docs/operations/durable-cost.md ("A durable library turn"): model, tool start, tool, model
    are its only records (each costs DBOS the same two transactions), and on the DBOS configuration the page
    advises on PostgreSQL (no pre-ping before each use of a pooled connection) a turn still runs after every
    connection of DBOS's was dropped (a server restart, a failover): DBOS retries on a new one."""
    async with fresh_database(postgres_url) as url:
        dsn = url.replace("postgresql+asyncpg://", "postgresql://")
        log_through_logging()
        DBOS(config={"name": "ringlet-test-library", "system_database_url": dsn, "log_level": "WARNING",
                     "db_engine_kwargs": {"pool_pre_ping": False}})
        DBOS.launch()
        try:
            first = await DBOS.start_workflow_async(library_turn, "What is 2 + 3?")
            assert await first.get_result() == "The sum is 5."
            steps = await DBOS.list_workflow_steps_async(first.workflow_id)
            assert [s["function_name"] for s in steps] == ["model test:function", "start add", "tool add",
                                                           "model test:function"]
            admin = await asyncpg.connect(dsn)
            try:
                dropped = await admin.fetchval("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                               "WHERE datname = current_database() AND pid <> pg_backend_pid()")
            finally:
                await admin.close()
            assert dropped > 0
            second = await DBOS.start_workflow_async(library_turn, "And 2 + 3 again?")
            async with asyncio.timeout(60):
                assert await second.get_result() == "The sum is 5."
            assert len(await DBOS.list_workflow_steps_async(second.workflow_id)) == 4
        finally:
            DBOS.destroy(workflow_completion_timeout_sec=0)
