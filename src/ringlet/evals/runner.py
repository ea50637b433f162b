"""The runner: each case's run on the agent, judged by its evaluators, into a `Report`.

A case runs through the agent's own `stream()` (the same loop the CLI and the server drive), so every
event is seen: evaluators read the run's events and transcript, not only its output. Runs go
`concurrency` at a time; `repeat` runs each case that many times. A run that raises is a failed run (its
evaluators are not asked); an evaluator that raises fails its assertion, never the evaluation.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ringlet._ids import now
from ringlet.agent.contract import RunSettings
from ringlet.context import Caller
from ringlet.errors import ConfigError
from ringlet.evals.evaluators import EvaluationReason, EvaluatorContext
from ringlet.evals.judge import LLMJudge
from ringlet.evals.report import CaseReport, CaseRun, Report, Result

if TYPE_CHECKING:
    from pathlib import Path

    from ringlet.evals.case import Case
    from ringlet.evals.evaluators import Evaluator


class Cases(Protocol):
    """What the runner reads of a dataset (`dataset.Dataset`)."""

    cases: list[Case]
    evaluators: list[Evaluator]
    name: str | None
    path: Path | None

__all__ = ["Progress", "evaluate", "judge_run", "run_case"]

Progress = Callable[[str, CaseRun], None]
"""Told of each run as it is judged: (case name, the run)."""


async def evaluate(dataset: Cases, agent: Any, *, concurrency: int = 4, repeat: int = 1, model: Any = None,
                   judge_model: Any = None, progress: Progress | None = None,
                   cases: Sequence[Case] | None = None) -> Report:
    """Run and judge every case of `dataset` (or `cases`) on `agent`."""
    if concurrency < 1 or repeat < 1:
        raise ConfigError("concurrency and repeat are at least 1")
    chosen = list(dataset.cases if cases is None else cases)
    if agent.kind == "graph" and (model is not None or any(c.option("model") for c in chosen)):
        raise ConfigError(f"{getattr(agent, 'name', 'the agent')} is a graph agent: its nodes name their models, "
                          "so a dataset's or --model's model does not apply")
    judge = judge_model if judge_model is not None else model if model is not None else _model_of(agent)
    gate, started, clock = asyncio.Semaphore(concurrency), now(), time.perf_counter()
    reports = [CaseReport(name=c.name, inputs=c.inputs, expected_output=c.expected_output, metadata=c.metadata,
                          line=c.line) for c in chosen]

    async def one(index: int, attempt: int) -> None:
        async with gate:
            case = chosen[index]
            run, ctx = await run_case(agent, case, attempt, model=model)
            if ctx is not None:
                await judge_run(run, ctx, [*dataset.evaluators, *case.evaluators], judge=judge)
            reports[index].runs.append(run)
            if progress is not None:
                progress(case.name, run)

    await asyncio.gather(*(one(i, a) for a in range(1, repeat + 1) for i in range(len(chosen))))
    for report in reports:
        report.runs.sort(key=lambda r: r.attempt)
    return Report(dataset=dataset.name, path=str(dataset.path) if dataset.path else None,
                  agent=str(getattr(agent, "name", type(agent).__name__)),
                  model=_name(model) or _name(_model_of(agent)),
                  started_at=started, duration_s=time.perf_counter() - clock, repeat=repeat,
                  concurrency=concurrency, cases=reports)


async def run_case(agent: Any, case: Case, attempt: int = 1, *,
                   model: Any = None) -> tuple[CaseRun, EvaluatorContext | None]:
    """Run one case on `agent`: the run's record, and what its evaluators see (None: it could not run)."""
    options: dict[str, Any] = {"caller": Caller(channel="eval")}
    if history := case.history:
        options["history"] = history
    if (deps := case.option("deps")) is not None:
        options["deps"] = deps
    if (chosen := case.option("model") or model) is not None:
        options["settings"] = RunSettings(model=chosen)
    events: list[Any] = []
    clock = time.perf_counter()
    try:
        stream = agent.stream(case.prompt, **options)
        events = [event async for event in stream]
        result = stream.result
    except Exception as exc:  # the agent could not run it: a failed run, the evaluation goes on
        return CaseRun(attempt=attempt, status="failed", duration_s=time.perf_counter() - clock, events=len(events),
                       error={"code": type(exc).__name__, "message": str(exc) or type(exc).__name__}), None
    duration = time.perf_counter() - clock
    messages = result.new_messages()
    run = CaseRun(attempt=attempt, run_id=result.run_id, output=_jsonable(result.output), status=result.status,
                  error=result.error, duration_s=duration, usage=result.usage.as_dict(), events=len(events),
                  messages=[m.model_dump() for m in messages])
    return run, EvaluatorContext(
        name=case.name, inputs=case.inputs, metadata=case.metadata, expected_output=case.expected_output,
        output=result.output, duration=duration, events=events, messages=messages,
        usage=run.usage, status=result.status, error=result.error)


async def judge_run(run: CaseRun, ctx: EvaluatorContext, evaluators: Sequence[Any], *, judge: Any = None) -> None:
    """Ask every evaluator about `run` (`ctx`: what they see); its results (names made unique), the judge's cost."""
    seen: dict[str, int] = {}
    for given in evaluators:
        evaluator = dataclasses.replace(given, judge=judge) if isinstance(given, LLMJudge) and given.model is None \
            else given
        for result in await _ask(evaluator, ctx):
            seen[result.name] = seen.get(result.name, 0) + 1
            if seen[result.name] > 1:
                result.name = f"{result.name}_{seen[result.name]}"
            run.results.append(result)
    if ctx.spent:
        costs = [u.cost_usd for u in ctx.spent]
        run.judge_cost_usd = None if None in costs else sum(c for c in costs if c is not None)


async def _ask(evaluator: Any, ctx: EvaluatorContext) -> list[Result]:
    kind = type(evaluator).__name__
    label = getattr(evaluator, "label", None) or getattr(evaluator, "evaluation_name", None) or kind
    try:
        value = evaluator.evaluate(ctx)
        if inspect.isawaitable(value):
            value = await value
    except Exception as exc:
        return [Result(name=label, evaluator=kind, error=f"{type(exc).__name__}: {exc}")]
    if isinstance(value, Mapping):
        return [_result(str(name), kind, v) for name, v in value.items()]
    return [_result(label, kind, value)]


def _result(name: str, kind: str, value: Any) -> Result:
    reason = None
    if isinstance(value, EvaluationReason) or (hasattr(value, "value") and hasattr(value, "reason")):
        value, reason = value.value, value.reason
    if not isinstance(value, bool | int | float | str):
        return Result(name=name, evaluator=kind, error=f"returned {type(value).__name__}; an evaluator returns a "
                      "bool, a number, a text, an EvaluationReason or a dict of them")
    return Result(name=name, evaluator=kind, value=value, reason=reason)


def _jsonable(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def _model_of(agent: Any) -> Any:
    return getattr(agent, "model", None)


def _name(model: Any) -> str | None:
    if model is None or isinstance(model, str):
        return model
    return getattr(model, "name", None) or type(model).__name__
