"""`ringlet eval AGENT DATASET` (run a dataset, report, compare with a baseline) and `ringlet eval capture
CONVERSATION_ID --to DATASET` (a stored conversation as a case).

Exit codes: 0 every case passed and nothing regressed against `--baseline`; 1 a case failed or regressed;
2 a usage, agent or dataset error (the dataset's file:line).
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from typer.core import TyperGroup

from ringlet.errors import ConfigError

if TYPE_CHECKING:
    from ringlet.evals import Comparison, Report

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


class _EvalGroup(TyperGroup):
    """`ringlet eval AGENT DATASET` runs a dataset (the hidden `run` command); `ringlet eval capture …`."""

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args.insert(0, "run")
        return super().resolve_command(ctx, args)


eval_app = typer.Typer(cls=_EvalGroup, no_args_is_help=True, help=(
    "Evaluate an agent on a dataset: `ringlet eval AGENT DATASET` (see `ringlet eval run --help`), or make a "
    "case of a stored conversation: `ringlet eval capture CONVERSATION_ID --to DATASET`."))


@eval_app.command("run")
def run(  # noqa: PLR0917 - Typer maps parameters to arguments and options
        agent: Annotated[str, typer.Argument(help="Agent name, or a path to its directory.")],
        dataset: Annotated[Path, typer.Argument(help="A dataset file (.yaml, .yml or .json; pydantic-evals' "
                                                     "format).")],
        concurrency: Annotated[int, typer.Option(help="Cases run at once.", min=1)] = 4,
        repeat: Annotated[int, typer.Option(help="Run each case this many times; its pass rate is reported.",
                                            min=1)] = 1,
        json_file: Annotated[Path | None, typer.Option("--json", help="Write the full report here.")] = None,
        junit: Annotated[Path | None, typer.Option(help="Write JUnit XML here (one testcase per case).")] = None,
        baseline: Annotated[Path | None, typer.Option(help="An earlier --json report: show what got better and "
                                                            "worse; a regression exits 1.")] = None,
        model: Annotated[str | None, typer.Option("--model", "-m", help="Run on this model instead of the "
                                                  "agent's (one its allowed_models allows).")] = None,
        judge_model: Annotated[str | None, typer.Option(help="The model of LLMJudge evaluators that name none "
                                                        "(default: the agent's model).")] = None,
        case: Annotated[list[str] | None, typer.Option(help="Run only this case (repeatable).")] = None,
        durable: Annotated[bool, typer.Option(help="Run each case as a DBOS workflow: run the same command "
                                                   "again after a crash and it goes on where it stopped.")] = False,
        db: Annotated[str | None, typer.Option(help="--durable's DBOS database: sqlite:///FILE or postgresql://… "
                                                    "(default: evals.sqlite in RINGLET_DATA_DIR).")] = None,
        var: Annotated[list[str] | None, typer.Option("--var", help="A template variable, name=value.")] = None,
        policy: Annotated[list[str] | None, typer.Option("--policy", help="A Rego policy file or folder.")] = None,
) -> None:
    """Run every case of DATASET on AGENT and judge it (the default: `ringlet eval AGENT DATASET`).

    Prints a table; exits 1 when a case fails or regressed against --baseline, 2 on a usage or dataset error."""
    from ringlet.cli.common import fail, load
    from ringlet.cli.common import variables as _variables
    from ringlet.evals import Dataset, Report, compare
    from ringlet.evals.dataset import cases_named

    try:
        data = Dataset.from_file(dataset)
        chosen = cases_named(data, case or [])
        before = Report.from_file(baseline) if baseline is not None else None
    except ConfigError as exc:
        raise fail(str(exc), "fix the dataset (pydantic-evals' format: cases with name, inputs, "
                   "expected_output, evaluators)") from None
    variables = _variables(var)
    if model is not None:
        _check_model(agent, model, load(agent, None, variables))

    def build() -> Any:
        return load(agent, model, variables, policy)

    try:
        report = asyncio.run(_evaluate(data, chosen, build, agent=agent, concurrency=concurrency, repeat=repeat,
                                       judge_model=judge_model, durable=durable, db=db))
    except ConfigError as exc:
        raise fail(str(exc), "see `ringlet eval run --help`") from None
    if model is not None:
        report.model = model
    _table(report)
    comparison = compare(report, before) if before is not None else None
    if comparison is not None:
        _changes(comparison, baseline)
    if json_file is not None:
        report.write_json(json_file)
    if junit is not None:
        report.write_junit(junit)
    if not report.passed or (comparison is not None and comparison.regressions):
        raise typer.Exit(1)


async def _evaluate(data: Any, chosen: list[Any], build: Any, *, agent: str, concurrency: int, repeat: int,
                    judge_model: str | None, durable: bool, db: str | None) -> Report:
    from ringlet.evals.runner import evaluate

    total = len(chosen) * repeat
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[last]}"), console=err, transient=True) as bar:
        task = bar.add_task(f"eval {agent}", total=total, last="")

        def progress(name: str, run: Any) -> None:
            bar.update(task, advance=1, last=f"{'✓' if run.passed else '✗'} {name}")

        if durable:  # the agent is built (and closed) by the evaluation, in its DBOS process
            from ringlet.evals.durable import evaluate_durably

            data.cases = chosen
            return await evaluate_durably(data, agent, build, database_url=db or _default_db(),
                                          concurrency=concurrency, repeat=repeat, judge_model=judge_model,
                                          progress=progress, agent_version=_agent_version(agent))
        instance = build()
        try:
            return await evaluate(data, instance, concurrency=concurrency, repeat=repeat, judge_model=judge_model,
                                  progress=progress, cases=chosen)
        finally:
            await instance.aclose()


def _agent_version(agent: str) -> str:
    """A digest of the agent's folder (its config, tools, prompts): a durable evaluation of an edited agent is
    another evaluation."""
    import hashlib

    from ringlet.agent.config import find

    digest = hashlib.sha256()
    directory = find(agent).directory
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(str(path.relative_to(directory)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _default_db() -> str:
    data = Path(os.environ.get("RINGLET_DATA_DIR", "~/.local/share/ringlet")).expanduser()
    data.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{data / 'evals.sqlite'}"


def _check_model(agent: str, model: str, instance: Any) -> None:
    """`--model` must be the agent's own model or one its config's `allowed_models` allows (as on the server)."""
    import fnmatch

    from ringlet.agent.config import find
    from ringlet.cli.common import fail

    try:
        spec = find(agent)
    except ConfigError as exc:
        raise fail(str(exc), "`ringlet agents` lists agents") from None
    if spec.config is None:
        raise fail(f"{spec.name} is a graph agent: its nodes name their models, so --model does not apply",
                   "run it without --model")
    own = spec.config.model
    own_names = set(own) if isinstance(own, list) else {own} if own else set()
    if (default := getattr(getattr(instance, "model", None), "name", None)) is not None:
        own_names.add(default)
    allowed = spec.config.allowed_models
    if model not in own_names and not any(fnmatch.fnmatchcase(model, p) for p in allowed):
        raise fail(f"agent {spec.name!r} may not run on {model!r}; it may use {sorted(own_names | set(allowed))}",
                   f"add it to allowed_models in {spec.directory / 'config.yaml'}")


def _table(report: Report) -> None:
    table = Table("case", "result", "evaluators", "duration", "tokens", "cost", title=_title(report))
    for case in report.cases:
        rates = case.assertion_rates()
        held = sum(1 for v in rates.values() if v == 1.0)
        verdict = "[green]pass[/]" if case.passed else "[red]FAIL[/]"
        if report.repeat > 1:
            verdict += f" {case.pass_rate:.0%}"
        scores = " ".join(f"{k}={v:.2f}" for k, v in case.scores().items())
        shown = f"{held}/{len(rates)}" + (f" {scores}" if scores else "")
        cost = case.cost_usd
        table.add_row(escape(case.name), verdict, escape(shown), f"{case.duration_s:.2f} s", f"{case.tokens:.0f}",
                      "-" if cost is None else f"${cost:.4f}")
    out.print(table)
    for case in report.failed:
        out.print(f"[red]✗ {escape(case.name)}[/]" + (f" [dim](line {case.line})[/]" if case.line else ""))
        for run in case.runs:
            for why in run.reasons:
                prefix = f"run {run.attempt}: " if report.repeat > 1 else ""
                out.print(f"    {escape(prefix + why)}")
    s = report.summary()
    cost = "" if s["cost_usd"] is None else f", ${s['cost_usd']:.4f}"
    out.print(f"{s['passed']}/{s['cases']} cases passed ({s['pass_rate']:.0%} of {s['runs']} runs) in "
              f"{s['duration_s']:.1f} s, {s['in_tokens'] + s['out_tokens']} tokens{cost}")


def _title(report: Report) -> str:
    return f"{report.agent} on {report.dataset or report.path or 'dataset'}" + (
        f" ({report.model})" if report.model else "")


def _changes(comparison: Comparison, baseline: Path | None) -> None:
    if not comparison.changes:
        out.print(f"no change against {baseline}")
        return
    table = Table("case", "what", "before", "after", "", title=f"against {baseline}")
    for change in comparison.changes:
        verdict = "[red]REGRESSION[/]" if change.regression else "[green]better[/]" if change.better else \
            "[yellow]worse[/]" if change.before is not None and change.after is not None else change.what
        table.add_row(escape(change.case), escape(change.what), _figure(change.what, change.before),
                      _figure(change.what, change.after), verdict)
    out.print(table)
    out.print(f"{len(comparison.regressions)} regression(s), {len(comparison.improvements)} improvement(s)")


def _figure(what: str, value: float | None) -> str:
    if value is None:
        return "-"
    if what == "cost_usd":
        return f"${value:.4f}"
    if what == "duration_s":
        return f"{value:.2f} s"
    return f"{value:.0%}" if 0 <= value <= 1 else f"{value:.2f}"


@eval_app.command("capture")
def capture(conversation_id: Annotated[str, typer.Argument(help="A stored conversation's id.")],
            to: Annotated[Path, typer.Option("--to", help="The dataset file to add the case to (made if "
                                                          "missing).")],
            name: Annotated[str | None, typer.Option(help="The case's name (default: from the conversation).")]
            = None,
            db: Annotated[str | None, typer.Option(help="Database URL (default: RINGLET_DB_URL or the SQLite "
                                                        "file).")] = None) -> None:
    """Add a stored conversation's last turn to a dataset as a case.

    Its prompt and history are the case's inputs, each tool it called a ToolCalled evaluator (edit them),
    and its answer is kept in the case's metadata."""
    from ringlet.cli.common import fail
    from ringlet.evals.capture import add_case, case_from_messages

    try:
        found = asyncio.run(_stored(conversation_id, db))
    except ConfigError as exc:
        raise fail(str(exc), "check --db (or RINGLET_DB_URL)") from None
    if found is None:
        raise fail(f"no conversation {conversation_id!r} in the store", "`GET /api/v1/conversations` lists them; "
                   "pass --db for another database", 1)
    conversation, messages = found
    title = name or _slug(conversation.title or "") or conversation.id
    try:
        case = case_from_messages(messages, name=title, conversation_id=conversation.id, agent=conversation.agent)
        dataset = add_case(to, case)
    except (ValueError, ConfigError) as exc:
        raise fail(str(exc), "pick a conversation with a user message, and a .yaml or .json dataset file") from None
    calls = sum(1 for e in case.evaluators if type(e).__name__ == "ToolCalled")
    err.print(f"added case {escape(case.name)} to {escape(str(to))} ({len(dataset.cases)} cases); it checks "
              f"{calls} tool call(s) — edit its evaluators there")


async def _stored(conversation_id: str, db: str | None) -> tuple[Any, list[Any]] | None:
    from ringlet.store import Store

    store = await Store.open(db)
    try:
        conversation = await store.conversations.get(conversation_id)
        if conversation is None:
            return None
        return conversation, await store.conversations.load_messages(conversation_id)
    finally:
        await store.close()


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60]
