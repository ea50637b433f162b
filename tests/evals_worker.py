"""A durable evaluation in a process of its own, for the crash test of tests/test_evals_durable.py:

    python tests/evals_worker.py DATABASE_URL AGENT_REF CALLS_FILE REPORT_FILE [HOLD_AT]

It evaluates `dataset()` (eight cases, one at a time) on `agent()`, named AGENT_REF: each case's run calls
the tool `work` once, which appends the case's name to CALLS_FILE; the HOLD_AT-th call written there never
returns (the test kills the process then). The report goes to REPORT_FILE as JSON.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from ringlet import Agent, tool
from ringlet.evals import Case, Dataset, EqualsExpected, ToolCalled
from ringlet.evals.durable import evaluate_durably
from ringlet.testing import FunctionModel, call


def dataset(n: int = 8) -> Dataset:
    """Cases c1…cN: the agent calls `work` for the case, then answers `done cK`."""
    return Dataset([Case(f"c{i}", f"case c{i}", expected_output=f"done c{i}") for i in range(1, n + 1)],
                   [ToolCalled("work"), EqualsExpected()], name="worker")


def answer(request: Any) -> Any:
    """Calls `work` for the case named in the prompt; once it returned, answers `done <case>` (and `wrong`
    for a case named `bad`, so that one fails)."""
    case = [m for m in request.messages if m.role == "user"][-1].text.removeprefix("case ")
    if request.messages[-1].role != "tool":
        return call("work", case=case)
    return "wrong" if case == "bad" else f"done {case}"


def agent(model: Any, calls: Path, hold_at: int | None = None) -> Agent:
    def note(case: str) -> int:
        with calls.open("a") as out:
            out.write(case + "\n")
        return len(calls.read_text().splitlines())

    @tool
    async def work(case: str) -> str:
        """Works on a case."""
        if note(case) == hold_at:
            await asyncio.Event().wait()  # the test kills the process here
        return f"worked on {case}"

    return Agent(model, name="worker", tools=[work])


async def main(database_url: str, agent_ref: str, calls: Path, report: Path, hold_at: int | None) -> None:
    result = await evaluate_durably(dataset(), agent_ref, lambda: agent(FunctionModel(answer), calls, hold_at),
                                    database_url=database_url, concurrency=1)
    result.write_json(report)


if __name__ == "__main__":
    db, ref, calls_file, report_file, *hold = sys.argv[1:]
    asyncio.run(main(db, ref, Path(calls_file), Path(report_file), int(hold[0]) if hold else None))
