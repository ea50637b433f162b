"""Every transaction of one durable library turn: a `DurableAgent` run inside your own DBOS workflow.

The turn is the one `../shared/bench/durable/durable_bench.py` measures beside PydanticAI's `DBOSAgent` and
OpenAI Agents' `DBOSRunner`: a model request that calls one tool (`add`), the tool call, a second model request
that answers in text, all inside one `@DBOS.workflow()`, with an in-process fake model (no network). It starts a
private PostgreSQL server that logs every statement with its session and transaction id (`bench/commits.py`'s
log and parser), launches DBOS in this process on it, warms up, runs `--turns` turns and prints the turn's own
transactions in order (DBOS's timers, which run meanwhile, listed apart), each with the step it records, then
checks the count against `pg_stat_database` over the same span.

DBOS's connection pool checks each connection out with a round trip of its own (SQLAlchemy's
`pool_pre_ping`, `;`), which PostgreSQL counts as a transaction: `--no-pre-ping` runs with
`db_engine_kwargs={"pool_pre_ping": False}` in DBOS's config, as `ringlet serve` does.

Run: `.venv/bin/python bench/library_commits.py [--turns 1] [--no-pre-ping]`
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # commits
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from commits import Transaction, between, log_statements, mark, read_log, stats, timer, transactions, what

STEP = re.compile(r"\$3 = '([^']*)'")


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def steps_named(log: Path) -> dict[tuple[str, int], str]:
    """The step each `insert operation_outputs` records (its `function_name`), by session and local id."""
    named: dict[tuple[str, int], str] = {}
    last: tuple[str, int] | None = None
    for raw in log.read_text(errors="replace").splitlines():
        parts = raw.split("|", 4)
        if len(parts) < 5 or "/" not in parts[2]:
            continue
        key = (parts[1], int(parts[2].split("/")[1]))
        if "INSERT INTO dbos.operation_outputs" in parts[4]:
            last = key
        elif last == key and "DETAIL:  parameters:" in parts[4] and (m := STEP.search(parts[4])):
            named[key], last = m.group(1), None
    return named


def why(t: Transaction, named: dict[tuple[str, int], str]) -> str:
    sig = what(t)
    if (t.session, t.lxid) in named:
        return f"step {named[t.session, t.lxid]!r} recorded"
    if sig.startswith("insert dbos.workflow_status"):
        return "the workflow starts"
    if sig.startswith("with"):
        return "the workflow ends (its output)"
    if "operation_outputs" in sig:
        return "before a step: is it recorded already? (read-only)"
    if sig == ";":
        return "pool pre-ping before the next one"
    return ""


async def turns(url: str, n: int, *, pre_ping: bool) -> int:
    """Launch DBOS at `url`, warm up, run `n` turns; pg_stat_database's commits + rollbacks over it all."""
    from dbos import DBOS

    from ringlet import Agent
    from ringlet.durable import DurableAgent, log_through_logging
    from ringlet.testing import FunctionModel, Reply, call

    def decide(request: Any) -> Any:
        if request.messages and request.messages[-1].role == "tool":
            return "The sum is 5."
        return Reply(calls=[call("add", a=2, b=3)])

    agent = DurableAgent(Agent(FunctionModel(decide), name="bench", tools=[add]))

    @DBOS.workflow()
    async def turn(prompt: str) -> str:
        return (await agent.run(prompt)).output

    config: dict[str, Any] = {"name": "bench-ringlet", "system_database_url": url, "log_level": "WARNING"}
    if not pre_ping:
        config["db_engine_kwargs"] = {"pool_pre_ping": False}
    await mark(url, "life-begin")
    life = await stats(url)
    log_through_logging()
    DBOS(config=config)  # type: ignore[arg-type]
    DBOS.launch()
    try:
        for i in range(5):  # warm-up: pools, prepared statements
            await turn(f"What is 2 + 3? (warm-up {i})")
        await mark(url, "turn-begin")
        for i in range(n):
            if "5" not in await turn(f"What is 2 + 3? ({i})"):
                raise RuntimeError("the turn did not answer")
        await mark(url, "turn-end")
    finally:
        DBOS.destroy(workflow_completion_timeout_sec=0)
    await asyncio.sleep(1.5)  # an exiting backend reports its statistics at once
    return await stats(url) - life


def timers_of(txs: list[Transaction], listens: set[str]) -> dict[tuple[str, int], str]:
    """The timer each transaction belongs to, if any; a pre-ping belongs to what its session does next."""
    out: dict[tuple[str, int], str] = {}
    for t in sorted(txs, key=lambda t: (t.session, -t.lxid)):
        name = timer(t, listens)
        if what(t) == ";":
            name = out.get((t.session, t.lxid + 1))
        if name is not None:
            out[t.session, t.lxid] = name
    return out


def report(log: Path, n: int, life: int) -> None:
    every = read_log(log)
    lines = between(every, "turn-begin", "turn-end")
    listens = {session for _ts, session, _v, _a, sql in every if sql.upper().startswith("LISTEN")}
    txs = transactions(lines)
    named = steps_named(log)
    timed = timers_of(txs, listens)
    own = [t for t in txs if (t.session, t.lxid) not in timed]
    timers = Counter(timed.values())
    print(f"the turn's own transactions, per turn: {len(own) / n:.1f}")
    last = own[-(len(own) // n):] if n else []
    for i, t in enumerate(last, 1):
        print(f"{i:>3}  {t.ended:<8} {what(t)[:70]:<70} {why(t, named)}")
    print(f"\nDBOS's timers meanwhile (not the turn's): {sum(timers.values())}")
    for name, count in timers.most_common():
        print(f"  {count:>3}  {name}")
    logged = transactions(between(every, "life-begin", None, bench=True))
    starts = len(transactions(between(every, "life-begin", None, bench=True), whole=True)) - len(logged)
    print(f"\ncheck: over DBOS's life here (launch, warm-up, turns, destroy; the bench's own transactions too) the "
          f"log shows {len(logged)} transactions (and {starts} local ids before a session's first statement: "
          f"connections' starts), pg_stat_database counts {life} commits + rollbacks")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=1, help="turns one after another")
    parser.add_argument("--no-pre-ping", action="store_true", help="DBOS's pool without pool_pre_ping")
    args = parser.parse_args()
    from postgres import postgres_server

    with postgres_server() as url:
        db = url.replace("postgresql+asyncpg://", "postgresql://")

        log = asyncio.run(log_statements(db, durations=False))
        life = asyncio.run(turns(db, args.turns, pre_ping=not args.no_pre_ping))
        report(log, args.turns, life)


if __name__ == "__main__":
    main()
