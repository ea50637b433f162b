"""A dataset evaluated on DBOS: each run of a case is a workflow, so a killed `ringlet eval --durable` run
again goes on where it stopped (issue 41).

    report = await evaluate_durably(dataset, "weather", lambda: Agent("openai:gpt-4o-mini", name="weather",
                                                                      tools=[get_weather]),
                                    database_url="sqlite:///evals.sqlite")   # or postgresql://…

Each (case, attempt) is one DBOS workflow that runs the case on the agent and judges it; its result is the
run's record (`CaseRun` as JSON). Its id is derived from a digest of what decides the results — ringlet's
version, the agent as named (`agent_ref`) and the model it runs on, the dataset (`Dataset.to_dict()`, so the
cases chosen), the judge's model and `repeat` — with the case's index and the attempt. The workflows go
through a DBOS queue of that evaluation (`concurrency` at once in this process), and this process is a DBOS
executor of that evaluation only (its id is the digest too): on launch DBOS hands back the runs a killed
process left unfinished, and enqueueing a run whose workflow already ended returns its recorded result
without running it again. So the same evaluation run again runs only what had not finished: a run killed
midway runs again from its start (a case is not resumed step by step); any change to the dataset, the
agent (its name, `agent_version`: the CLI passes a digest of the agent's folder), its model, the judge or
`repeat` is another evaluation, run in full. Once every run has its result and the report is made, the
evaluation's workflows are deleted: the same command run after a finished evaluation measures again.

DBOS is launched for the call and destroyed at its end: it runs once per process, so this fails with a
ConfigError where DBOS runs already (a server, or your own program).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dbos import DBOS, DBOSConfig, SetWorkflowID
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from ringlet import __version__
from ringlet._ids import now
from ringlet.durable import log_through_logging
from ringlet.errors import ConfigError
from ringlet.evals.report import CaseReport, CaseRun, Report
from ringlet.evals.runner import Progress, judge_run, run_case

if TYPE_CHECKING:
    from ringlet.evals.dataset import Dataset

__all__ = ["evaluate_durably", "evaluation_key"]

APP = "ringlet-evals"
"""DBOS's application name for evaluations: their queues and workflows are apart from a server's."""
POLL_S = 0.1
"""How often the queue looks for a run to start, and a wait for a run's result looks for it."""

_EVALUATIONS: dict[str, _Evaluation] = {}
"""The evaluations running in this process, by key: what their workflows run on."""


@dataclass(slots=True)
class _Evaluation:
    dataset: Dataset
    agent: Any
    model: str | None
    judge: Any
    running: set[asyncio.Task[Any]] = field(default_factory=set)

    async def run(self, index: int, attempt: int) -> dict[str, Any]:
        task = asyncio.current_task()
        if task is not None:
            self.running.add(task)
        try:
            case = self.dataset.cases[index]
            run, ctx = await run_case(self.agent, case, attempt, model=self.model)
            if ctx is not None:
                await judge_run(run, ctx, [*self.dataset.evaluators, *case.evaluators], judge=self.judge)
            return run.model_dump(mode="json")
        finally:
            if task is not None:
                self.running.discard(task)


@DBOS.workflow(name="ringlet.eval_case")
async def _case_workflow(key: str, index: int, attempt: int) -> dict[str, Any]:
    """One run of one case, judged: its `CaseRun` as JSON."""
    evaluation = _EVALUATIONS.get(key)
    if evaluation is None:  # only its own process executes an evaluation's queue
        raise ConfigError(f"evaluation {key} does not run in this process")
    return await evaluation.run(index, attempt)


def evaluation_key(dataset: Dataset, agent_ref: str, *, model: str | None, judge_model: str | None,
                   repeat: int, agent_version: str | None = None) -> str:
    """The digest of what decides an evaluation's results: its workflows' ids, queue and executor derive
    from it."""
    data = {"ringlet": __version__, "agent": agent_ref, "agent_version": agent_version, "model": model,
            "judge_model": judge_model, "repeat": repeat, "dataset": dataset.to_dict()}
    text = json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


async def evaluate_durably(dataset: Dataset, agent_ref: str, load: Callable[[], Any], *, database_url: str,
                           concurrency: int = 4, repeat: int = 1, model: str | None = None,
                           judge_model: str | None = None, progress: Progress | None = None,
                           agent_version: str | None = None) -> Report:
    """Run and judge every case of `dataset` (`repeat` times each, `concurrency` at once) as DBOS workflows
    in the system database `database_url` (`sqlite:///FILE` or `postgresql://…`), on the agent `load()`
    builds (`agent_ref` names it: a name or a folder, as given to `ringlet eval`; `agent_version`, what it
    is: any change to it is another evaluation); the report, as `Dataset.evaluate` makes it. Runs that
    finished in an earlier call of the same evaluation that did not finish are not run again (`progress`
    is told of them too)."""
    if concurrency < 1 or repeat < 1:
        raise ConfigError("concurrency and repeat are at least 1")
    url = _system_database(database_url)
    _no_dbos_yet()
    agent = load()
    try:
        if agent.kind == "graph" and (model is not None or any(c.option("model") for c in dataset.cases)):
            raise ConfigError(f"{getattr(agent, 'name', 'the agent')} is a graph agent: its nodes name their "
                              "models, so a dataset's or --model's model does not apply")
        own_model = _name(getattr(agent, "model", None))
        key = evaluation_key(dataset, agent_ref, model=model or own_model, judge_model=judge_model, repeat=repeat,
                             agent_version=agent_version)
        judge = judge_model if judge_model is not None else model if model is not None else \
            getattr(agent, "model", None)
        started, clock = now(), time.perf_counter()
        reports = [CaseReport(name=c.name, inputs=c.inputs, expected_output=c.expected_output, metadata=c.metadata,
                              line=c.line) for c in dataset.cases]
        async with _dbos(url, key, concurrency, _Evaluation(dataset, agent, model, judge)) as queue:

            async def one(index: int, attempt: int) -> None:
                run = await _run(queue, key, index, attempt)
                reports[index].runs.append(run)
                if progress is not None:
                    progress(dataset.cases[index].name, run)

            await asyncio.gather(*(one(i, a) for a in range(1, repeat + 1) for i in range(len(dataset.cases))))
            await DBOS.delete_workflows_async([_workflow_id(key, i, a) for a in range(1, repeat + 1)
                                               for i in range(len(dataset.cases))])  # done: its records go
    finally:
        close = getattr(agent, "aclose", None)
        if close is not None:
            await close()
    for report in reports:
        report.runs.sort(key=lambda r: r.attempt)
    return Report(dataset=dataset.name, path=str(dataset.path) if dataset.path else None,
                  agent=str(getattr(agent, "name", type(agent).__name__)), model=model or own_model,
                  started_at=started, duration_s=time.perf_counter() - clock, repeat=repeat,
                  concurrency=concurrency, cases=reports)


async def _run(queue: str, key: str, index: int, attempt: int) -> CaseRun:
    """The run's record: enqueued under its own id (a run recorded already is not run again)."""
    with SetWorkflowID(_workflow_id(key, index, attempt)):
        handle = await DBOS.enqueue_workflow_async(queue, _case_workflow, key, index, attempt)
    try:
        return CaseRun.model_validate(await handle.get_result(polling_interval_sec=POLL_S))
    except Exception as exc:  # the workflow itself failed (not the agent's run, which is a failed CaseRun)
        return CaseRun(attempt=attempt, status="failed",
                       error={"code": "workflow_error", "message": f"{type(exc).__name__}: {exc}"})


def _workflow_id(key: str, index: int, attempt: int) -> str:
    return f"ringlet-eval-{key}-{index}-{attempt}"


@contextlib.asynccontextmanager
async def _dbos(url: str, key: str, concurrency: int, evaluation: _Evaluation) -> AsyncIterator[str]:
    """DBOS launched in this event loop as the executor of evaluation `key`, listening to its queue only
    (yielded: the queue's name); destroyed at the end, the runs still going cancelled first (left pending,
    for the next call)."""
    _no_dbos_yet()
    queue = f"ringlet-eval-{key}"
    config: DBOSConfig = {"name": APP, "system_database_url": url, "executor_id": queue,
                          "application_version": f"{APP}-{__version__}", "log_level": "WARNING"}
    if url.startswith("sqlite"):  # no LISTEN/NOTIFY: waits poll this often
        config["notification_listener_polling_interval_sec"] = POLL_S
    loop = asyncio.get_running_loop()
    _EVALUATIONS[key] = evaluation  # before the launch: the runs it hands back start at once
    try:
        log_through_logging()
        DBOS(config=config)
        DBOS.listen_queues([queue])
        DBOS.launch()  # hands back this evaluation's runs a killed process left unfinished
        await DBOS.register_queue_async(queue, worker_concurrency=concurrency, polling_interval_sec=POLL_S,
                                        on_conflict="always_update")
        yield queue
    finally:
        for task in list(evaluation.running):  # (an error or a cancellation): they stay pending in DBOS
            task.cancel()
        await asyncio.gather(*evaluation.running, return_exceptions=True)
        DBOS.destroy(workflow_completion_timeout_sec=0)
        loop.set_default_executor(ThreadPoolExecutor())  # DBOS made its (now stopped) pool this loop's
        del _EVALUATIONS[key]


def _no_dbos_yet() -> None:
    from dbos import _dbos as dbos_module

    if dbos_module._dbos_global_instance is not None:  # (DBOS has no public "is it set up?")
        raise ConfigError("DBOS runs in this process already (it runs once per process): evaluate durably in a "
                          "process of its own, e.g. `ringlet eval --durable`")


def _system_database(url: str) -> str:
    """DBOS's system database URL: `sqlite:///FILE` (its folder made) or `postgresql://…` (an async driver
    named, as in a store's URL, is dropped: DBOS uses its own)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigError(f"DBOS database {url!r} is not a URL; use sqlite:///FILE or postgresql://USER@HOST/DB") \
            from None
    backend = parsed.get_backend_name()
    backend = "postgresql" if backend == "postgres" else backend
    if backend not in ("sqlite", "postgresql"):
        raise ConfigError(f"DBOS database {url!r}: DBOS keeps its records in SQLite or PostgreSQL; use "
                          "sqlite:///FILE or postgresql://USER@HOST/DB")
    parsed = parsed.set(drivername=backend)
    if backend == "sqlite":
        if not parsed.database or parsed.database == ":memory:":
            raise ConfigError(f"DBOS database {url!r}: a durable evaluation needs a file, sqlite:///FILE")
        path = Path(parsed.database).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        parsed = parsed.set(database=str(path))
    return parsed.render_as_string(hide_password=False)


def _name(model: Any) -> str | None:
    if model is None or isinstance(model, str):
        return model
    return getattr(model, "name", None) or type(model).__name__
