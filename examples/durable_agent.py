"""A ringlet agent inside your own DBOS workflow: each model request and tool call is a step of it.

    .venv/bin/python examples/durable_agent.py "Log a 12.50 taxi ride, then tell me the total."

It answers on stdout as the answer streams. Kill it mid-run (SIGKILL, a power cut) and run the same
command again: DBOS recovers the unfinished workflow, the model responses and tool calls it had finished
come back from its record (`log_expense` does not log twice), and the run goes on where it stopped.

The model is the first one with a key in the environment (OPENAI_API_KEY, ANTHROPIC_API_KEY, …), else the
embedded local one. DBOS keeps its record in SQLite here (`DBOS_DATABASE_URL`, default
`sqlite:///durable_agent.sqlite`); a PostgreSQL URL works the same way, across machines.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
from pathlib import Path

from dbos import DBOS, SetWorkflowID

from ringlet import Agent
from ringlet.durable import DurableAgent
from ringlet.models.providers import default_model

LEDGER = Path(os.environ.get("EXPENSES_FILE", "expenses.csv"))


def log_expense(amount: float, note: str) -> str:
    """Log one expense in the ledger (a side effect: it must happen once)."""
    with LEDGER.open("a") as ledger:
        ledger.write(f"{amount:.2f},{note}\n")
    return f"logged {amount:.2f} ({note})"


def total() -> str:
    """The total of the ledger."""
    lines = LEDGER.read_text().splitlines() if LEDGER.exists() else []
    return f"{sum(float(line.split(',', 1)[0]) for line in lines):.2f}"


agent = DurableAgent(Agent(default_model(), name="bookkeeper", tools=[log_expense, total],
                           instructions="You keep the user's expense ledger with your tools."))


@DBOS.workflow()
async def ask(question: str) -> str:
    result = await agent.run(question, stream_key="events")  # every event also goes to the workflow's stream
    return result.output


async def main(question: str) -> None:
    DBOS(config={"name": "durable-agent", "log_level": "WARNING",
                 "system_database_url": os.environ.get("DBOS_DATABASE_URL", "sqlite:///durable_agent.sqlite")})
    DBOS.launch()  # recovers the workflows this program left unfinished
    workflow_id = "ask-" + hashlib.sha256(question.encode()).hexdigest()[:16]  # the same question: the same run
    with SetWorkflowID(workflow_id):
        handle = await DBOS.start_workflow_async(ask, question)  # an unfinished one is not started twice
    async for event in DBOS.read_stream_async(handle.workflow_id, "events"):
        if event["type"] == "content_delta" and "agent_path" not in event:
            print(event["delta"], end="", flush=True)
    print()
    print(f"[{workflow_id}] {await handle.get_result()!r}", file=sys.stderr)
    DBOS.destroy()


if __name__ == "__main__":
    asyncio.run(main(" ".join(sys.argv[1:]) or "Log a 12.50 taxi ride, then tell me the total."))
