"""Evaluation reports and cases captured from conversations (issue 41): the reports `ringlet eval … --json`
wrote into the server's `evals_dir` (`RINGLET_EVALS_DIR`), and a stored conversation turned into a case.

    GET  /api/v1/evals                               admin  the reports, newest first, with their summaries
    GET  /api/v1/evals/{name}                        admin  one report in full (cases, runs, transcripts)
    POST /api/v1/chat/conversations/{cid}/eval-case  chat   the conversation's last turn as a case; with
                                                            `dataset`, admin too: added to that file

Reports hold the prompts and answers of every run, so reading them takes the `admin` scope (as the audit log
does), and a key limited to some agents sees only their reports (another agent's is 404). Without an
`evals_dir` the list is empty with a `hint` saying how to set one. A report is named by its file name in
`evals_dir` and nothing else: no folder, no `..`; a `*.json` file that is not a report is left out of the list.
A case is captured from a conversation the key may see (its realm and agent, as every conversation route:
else 404) and written only by an admin key; cases added at once by this process are added one at a time.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ringlet.evals.capture import add_case, case_from_messages
from ringlet.evals.dataset import Dataset, DatasetError
from ringlet.evals.report import Report
from ringlet.server.http.auth import Principal, need
from ringlet.server.http.errors import ApiError
from ringlet.server.http.schemas import ERRORS, Body, ErrorBody, View, omittable
from ringlet.server.protocols.access import conversation_for
from ringlet.server.runs.service import runs_of
from ringlet.store.records import Conversation

router = APIRouter(prefix="/api/v1")
Admin = Annotated[Principal, Depends(need("admin"))]
Chat = Annotated[Principal, Depends(need("chat"))]
HINT = ("no evals folder is set: start the server with RINGLET_EVALS_DIR=<folder> and write reports there with "
        "`ringlet eval AGENT DATASET --json <folder>/<name>.json`")
_REPORT_NAME = re.compile(r"[^./\\\x00-\x1f][^/\\\x00-\x1f]*\.json")
_REPORT_KEYS = frozenset({"agent", "started_at", "cases"})
_DATASET_NAME = r"^[^./\\\x00-\x1f][^/\\\x00-\x1f]*\.(yaml|yml|json)$"
_writing = threading.Lock()  # cases are added in worker threads, one at a time (a file is read, then rewritten)


# -- bodies ---------------------------------------------------------------------------------------------


class EvalSummary(View):
    cases: int
    passed: int
    failed: int
    runs: int
    pass_rate: float
    """The share of runs that passed."""
    duration_s: float
    median_case_s: float
    in_tokens: int
    out_tokens: int
    cost_usd: float | None
    """None when a run's model has no price."""
    judge_cost_usd: float


class EvalReportEntry(View):
    name: str
    """The report's file name in `evals_dir`: `GET /api/v1/evals/{name}` reads it."""
    dataset: str | None
    agent: str
    model: str | None
    started_at: str
    modified_at: str
    """When the file was last written (RFC 3339 UTC)."""
    summary: EvalSummary


class EvalReportList(View):
    data: list[EvalReportEntry]
    configured: bool
    """Whether the server has an `evals_dir` (`RINGLET_EVALS_DIR`)."""
    hint: str | None = None
    """How to set one, when it has none."""


class EvalResult(View):
    name: str
    evaluator: str
    value: bool | int | float | str | None = None
    reason: str | None = None
    error: str | None = None


class EvalRun(View):
    attempt: int
    run_id: str | None
    output: Any = None
    status: str
    error: dict[str, Any] | None
    results: list[EvalResult]
    duration_s: float
    usage: dict[str, Any]
    judge_cost_usd: float | None
    events: int
    messages: list[dict[str, Any]]
    """The run's transcript, as the conversation routes return messages."""
    passed: bool


class EvalCaseResult(View):
    name: str
    inputs: Any = None
    expected_output: Any = None
    metadata: Any = None
    line: int | None = None
    runs: list[EvalRun]
    pass_rate: float
    passed: bool


class EvalReport(View):
    name: str
    dataset: str | None
    path: str | None
    """The dataset file the evaluation read, on the machine that ran it."""
    agent: str
    model: str | None
    started_at: str
    duration_s: float
    repeat: int
    concurrency: int
    cases: list[EvalCaseResult]
    summary: EvalSummary


class CaptureCase(Body):
    name: str | None = omittable(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f]+$",
                                 description="The case's name; default: from the conversation's title")
    dataset: str | None = omittable(max_length=255, pattern=_DATASET_NAME, description=(
        "A dataset file in the server's `evals_dir` (`.yaml`, `.yml` or `.json`; made when missing) to add the "
        "case to; needs the `admin` scope. Left out: the case is only returned."))


class CapturedCaseBody(BaseModel):
    """The case as a dataset file holds it (pydantic-evals' format)."""

    model_config = ConfigDict(extra="allow")

    name: str
    inputs: Any
    metadata: Any = None
    evaluators: list[Any] = Field(default_factory=list)


class CapturedCase(View):
    case: CapturedCaseBody
    dataset: str | None
    """The dataset file in `evals_dir` the case was added to (its name may have got a suffix there), or null."""
    cases: int | None
    """How many cases that dataset has now."""


# -- reports --------------------------------------------------------------------------------------------


@router.get("/evals", response_model=EvalReportList, responses=ERRORS)
async def list_reports(request: Request, principal: Admin) -> dict[str, Any]:
    """The evaluation reports in `evals_dir` (`ringlet eval … --json`), newest first, with their summaries.
    A `*.json` file that is not a report is left out; without an `evals_dir` the list is empty, with a hint."""
    folder = runs_of(request).settings.evals_dir
    if folder is None:
        return {"data": [], "configured": False, "hint": HINT}
    entries = await asyncio.to_thread(_entries, folder)
    return {"data": [e for e in entries if principal.may_use(e["agent"])], "configured": True, "hint": None}


@router.get("/evals/{name}", response_model=EvalReport, responses={
    404: {"model": ErrorBody, "description": "No such report in `evals_dir` (`report_not_found`)"}})
async def get_report(name: str, request: Request, principal: Admin) -> dict[str, Any]:
    """One report in full: every case with its runs, each run's evaluator results and transcript, and the
    derived fields (`passed`, `pass_rate`, `summary`)."""
    folder = runs_of(request).settings.evals_dir
    path = _report_path(folder, name)
    report = await asyncio.to_thread(_read, path) if path is not None else None
    if report is None or not principal.may_use(report.agent):
        raise ApiError(404, "report_not_found", f"no report {name!r} in the evals folder" if folder is not None
                       else f"no report {name!r}: {HINT}")
    return {"name": name, **json.loads(report.to_json())}


def _report_path(folder: Path | None, name: str) -> Path | None:
    """The file of report `name` in `folder`, when `name` is a file name there (no folder, no `..`)."""
    if folder is None or not _REPORT_NAME.fullmatch(name):
        return None
    path = folder / name
    try:
        inside = path.resolve().parent == folder.resolve()
    except OSError:
        return None
    return path if inside and path.is_file() else None


def _read(path: Path) -> Report | None:
    """The report in `path`; None for a file that is not one. Every field of a report has a default, so any
    JSON object would read as an empty one: a report is an object with the keys `ringlet eval` writes."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not data.keys() >= _REPORT_KEYS:
        return None
    try:
        return Report.model_validate(data)
    except ValidationError:
        return None


def _entries(folder: Path) -> list[dict[str, Any]]:
    entries = []
    for path in folder.glob("*.json") if folder.is_dir() else ():
        if _report_path(folder, path.name) is None or (report := _read(path)) is None:
            continue
        modified = datetime.fromtimestamp(path.stat().st_mtime, UTC).isoformat(timespec="milliseconds")
        entries.append({"name": path.name, "dataset": report.dataset, "agent": report.agent, "model": report.model,
                        "started_at": report.started_at, "modified_at": modified.replace("+00:00", "Z"),
                        "summary": report.summary()})
    return sorted(entries, key=lambda e: (e["started_at"] or e["modified_at"], e["name"]), reverse=True)


# -- capture --------------------------------------------------------------------------------------------


@router.post("/chat/conversations/{cid}/eval-case", response_model=CapturedCase, responses={
    **ERRORS, 409: {"model": ErrorBody, "description": (
        "The conversation has no user message or a run in progress (`run_in_progress`), the server has no "
        "`evals_dir`, or the dataset file there cannot be read")}})
async def capture_case(cid: str, request: Request, principal: Chat, body: CaptureCase | None = None) -> dict[str, Any]:
    """The conversation's last user turn as an eval case: its prompt (and the turns before it as history),
    a `ToolCalled` evaluator for each tool call it made (name and arguments) and `NoError`; its answer in
    `metadata.captured_output`. With `dataset`, the case is added to that file in `evals_dir`."""
    body = body or CaptureCase()
    conversation = await conversation_for(request, cid, principal)
    runs = runs_of(request)
    target = _dataset_path(runs.settings.evals_dir, body.dataset, principal) if body.dataset else None
    if cid in runs.active or conversation.status != "idle":
        raise ApiError(409, "run_in_progress", f"conversation {cid} has a run in progress; capture it once the run "
                       "has ended")
    messages = await runs.records.conversations.load_messages(cid)
    try:
        case = case_from_messages(messages, name=body.name or _default_name(conversation), conversation_id=cid,
                                  agent=conversation.agent)
    except ValueError as exc:
        raise ApiError(409, "conversation_empty", f"conversation {cid}: {exc}") from None
    count = None
    if target is not None:
        try:
            count = await asyncio.to_thread(_add, target, case)
        except DatasetError as exc:
            raise ApiError(409, "invalid_dataset", f"{exc}; fix or move the file, or name another dataset",
                           details={"dataset": body.dataset}) from None
    return {"case": Dataset(cases=[case]).to_dict()["cases"][0], "dataset": body.dataset if target else None,
            "cases": count}


def _dataset_path(folder: Path | None, name: str, principal: Principal) -> Path:
    principal.check_scope("admin")
    if folder is None:
        raise ApiError(409, "evals_dir_not_set", f"cannot write the dataset {name!r}: {HINT}")
    path = folder / name
    if path.resolve().parent != folder.resolve():  # a symlink out of the folder
        raise ApiError(409, "invalid_dataset", f"the dataset {name!r} is not a file in the evals folder; name "
                       "another one")
    return path


def _add(path: Path, case: Any) -> int:
    with _writing:
        path.parent.mkdir(parents=True, exist_ok=True)
        return len(add_case(path, case).cases)


def _default_name(conversation: Conversation) -> str:
    """The conversation's title as a case name (`what-is-the-weather-in-paris`), else its id."""
    slug = re.sub(r"[^a-z0-9]+", "-", conversation.title.lower()).strip("-")[:60].rstrip("-")
    return slug or conversation.id
