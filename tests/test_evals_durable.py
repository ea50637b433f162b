"""`ringlet.evals.durable` (issue 41, item 6): a dataset evaluated on DBOS, each run of a case a workflow.
It judges as the plain runner does; the same evaluation again runs nothing again; and a real subprocess
SIGKILLed midway, run again, goes on where it stopped: the cases that had finished are not run again, the
one killed runs again to the end (on SQLite and on PostgreSQL)."""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dbos import DBOS

from evals_worker import agent, answer, dataset
from ringlet.errors import ConfigError
from ringlet.evals import Case, Dataset, Report
from ringlet.evals.durable import evaluate_durably, evaluation_key
from ringlet.testing import FunctionModel

WORKER = Path(__file__).parent / "evals_worker.py"


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """DBOS's system database: a SQLite file, or the session's PostgreSQL (each test's evaluations are its
    own there: the agent's name, part of their key, is the test's folder)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'dbos.sqlite'}"
    return request.getfixturevalue("postgres_url")


def mixed() -> Dataset:
    """Cases that pass, one whose answer is wrong, one whose run cannot start (an unknown model)."""
    data = dataset(3)
    data.cases += [Case("bad", "case bad", expected_output="done bad"),
                   Case("odd", {"prompt": "case odd", "model": "nosuch:model"}, expected_output="done odd")]
    return data


def verdicts(report: Report) -> dict[str, Any]:
    return {c.name: [(r.attempt, r.passed, r.status, r.output, [(x.name, x.value) for x in r.results])
                     for r in c.runs] for c in report.cases}


async def test_a_durable_evaluation_judges_as_the_plain_one(tmp_path: Path) -> None:
    plain = await mixed().evaluate(agent(FunctionModel(answer), tmp_path / "plain"), concurrency=2, repeat=2)
    told: list[tuple[str, bool]] = []
    durable = await evaluate_durably(mixed(), str(tmp_path), lambda: agent(FunctionModel(answer), tmp_path / "calls"),
                                     database_url=f"sqlite:///{tmp_path / 'dbos.sqlite'}", concurrency=2, repeat=2,
                                     progress=lambda name, run: told.append((name, run.passed)))
    assert verdicts(durable) == verdicts(plain)
    assert {c.name: c.passed for c in durable.cases} == {"c1": True, "c2": True, "c3": True, "bad": False,
                                                         "odd": False}
    assert durable.cases[-1].runs[0].error is not None
    assert durable.cases[-1].runs[0].error["code"] == "ConfigError"  # the run raised: a failed run, not an error
    assert sorted(told) == sorted((c.name, c.passed) for c in plain.cases for _ in range(2))
    assert (durable.agent, durable.model, durable.repeat, durable.concurrency, durable.dataset) == \
        (plain.agent, plain.model, plain.repeat, 2, plain.dataset)


async def test_a_finished_evaluation_leaves_no_records_and_runs_again_in_full(tmp_path: Path,
                                                                            database_url: str) -> None:
    """What a finished evaluation recorded is deleted: the same command measures again (a killed one goes
    on: `test_a_killed_evaluation_goes_on_where_it_stopped`)."""
    model, calls = FunctionModel(answer), tmp_path / "calls"

    async def evaluate(progress: Callable[[str, Any], None] | None = None) -> Report:
        return await evaluate_durably(mixed(), str(tmp_path), lambda: agent(model, calls), database_url=database_url,
                                      repeat=2, progress=progress)

    first = await evaluate()
    requests = len(model.requests)
    assert requests == 3 * 2 * 2 + 2 * 2  # two requests per passing or wrong run; `odd` never reached the model
    assert await workflows(database_url) == 0
    told: list[str] = []
    again = await evaluate(lambda name, run: told.append(name))
    assert len(model.requests) == 2 * requests
    assert verdicts(again) == verdicts(first)
    assert Counter(told) == {"c1": 2, "c2": 2, "c3": 2, "bad": 2, "odd": 2}
    assert await workflows(database_url) == 0


async def workflows(database_url: str) -> int:
    """How many evaluation workflows DBOS's database holds."""
    from sqlalchemy import create_engine, text

    url = database_url.replace("+asyncpg", "")
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1) if url.startswith("postgresql")
                           else url)
    try:
        with engine.connect() as conn:
            schema = "dbos." if url.startswith("postgresql") else ""
            return int(conn.execute(text(f"SELECT count(*) FROM {schema}workflow_status WHERE name = "
                                         "'ringlet.eval_case'")).scalar_one())
    finally:
        engine.dispose()


def test_what_decides_the_results_keys_the_evaluation() -> None:
    base = {"model": "test:function", "judge_model": None, "repeat": 1}
    key = evaluation_key(dataset(3), "worker", **base)
    assert evaluation_key(dataset(3), "worker", **base) == key
    other = dataset(3)
    other.cases[0].expected_output = "something else"
    assert len({key, evaluation_key(other, "worker", **base), evaluation_key(dataset(2), "worker", **base),
                evaluation_key(dataset(3), "worker", **base, agent_version="edited"),
                evaluation_key(dataset(3), "other", **base),
                evaluation_key(dataset(3), "worker", **{**base, "model": "openai:gpt-4o"}),
                evaluation_key(dataset(3), "worker", **{**base, "judge_model": "openai:gpt-4o"}),
                evaluation_key(dataset(3), "worker", **{**base, "repeat": 2})}) == 8


async def test_a_durable_evaluation_needs_a_database_file(tmp_path: Path) -> None:
    def load() -> Any:
        raise AssertionError("not loaded")

    for url in ("sqlite://", "sqlite:///:memory:", "mysql://h/db", "not a url"):
        with pytest.raises(ConfigError, match="DBOS database"):
            await evaluate_durably(dataset(1), "worker", load, database_url=url)


async def test_a_cancelled_evaluation_goes_on_where_it_stopped(tmp_path: Path) -> None:
    """Cancelled (Ctrl-C), the runs going are left pending, not failed: the next call runs them again."""
    calls, url = tmp_path / "calls", f"sqlite:///{tmp_path / 'dbos.sqlite'}"
    first = asyncio.create_task(evaluate_durably(dataset(4), "worker", lambda: agent(FunctionModel(answer), calls, 2),
                                                 database_url=url, concurrency=1))
    deadline = time.monotonic() + 60
    while len(lines(calls)) < 2:  # the second case's tool runs (and never returns)
        assert not first.done()
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    done, held = lines(calls)
    report = await evaluate_durably(dataset(4), "worker", lambda: agent(FunctionModel(answer), calls),
                                    database_url=url, concurrency=1)
    assert report.passed
    assert Counter(lines(calls)) == {**{f"c{i}": 1 for i in range(1, 5)}, held: 2}
    assert lines(calls)[:2] == [done, held]


async def test_it_refuses_a_process_where_dbos_runs_already(tmp_path: Path) -> None:
    DBOS(config={"name": "someone-else", "system_database_url": f"sqlite:///{tmp_path / 'theirs.sqlite'}"})
    try:
        with pytest.raises(ConfigError, match="DBOS runs in this process already"):
            await evaluate_durably(dataset(1), "worker", lambda: agent(FunctionModel(answer), tmp_path / "calls"),
                                   database_url=f"sqlite:///{tmp_path / 'dbos.sqlite'}")
    finally:
        DBOS.destroy()
    assert not (tmp_path / "calls").exists()


# -- a real process killed midway ------------------------------------------------------------------------------


async def worker(database_url: str, agent_ref: str, folder: Path, hold_at: int | None = None
                 ) -> asyncio.subprocess.Process:
    args = [database_url, agent_ref, str(folder / "calls"), str(folder / "report.json")]
    with (folder / "worker.log").open("ab") as log:
        return await asyncio.create_subprocess_exec(sys.executable, str(WORKER), *args,
                                                    *([str(hold_at)] if hold_at else []), stderr=log)


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.slow
async def test_a_killed_evaluation_goes_on_where_it_stopped(tmp_path: Path, database_url: str) -> None:
    calls = tmp_path / "calls"
    first = await worker(database_url, str(tmp_path), tmp_path, hold_at=4)
    try:
        deadline = time.monotonic() + 60
        while len(lines(calls)) < 4:  # the fourth case's tool runs (and never returns): three cases finished
            assert first.returncode is None, (tmp_path / "worker.log").read_text()
            assert time.monotonic() < deadline, "the worker did not reach its fourth case"
            await asyncio.sleep(0.05)
    finally:
        first.kill()
        await first.wait()
    *finished, killed = lines(calls)
    assert len(finished) == 3
    assert not (tmp_path / "report.json").exists()

    again = await worker(database_url, str(tmp_path), tmp_path)
    async with asyncio.timeout(120):
        assert await again.wait() == 0, (tmp_path / "worker.log").read_text()
    ran = Counter(lines(calls))
    assert set(ran) == {f"c{i}" for i in range(1, 9)}
    assert all(ran[name] == 1 for name in finished)  # finished before the kill: not run again
    assert ran[killed] == 2  # killed midway: run again, to the end
    assert sum(ran.values()) == 9
    report = Report.from_file(tmp_path / "report.json")
    assert [(c.name, len(c.runs), c.passed) for c in report.cases] == [(f"c{i}", 1, True) for i in range(1, 9)]
