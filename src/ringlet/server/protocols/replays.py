"""`POST /api/v1/runs/{run_id}/replay`: run a stored loop run again on its recording, without calling the
model or any tool, and say whether its events come out byte for byte as stored, or where they first differ
(`ringlet.replay`; the CLI's `ringlet replay RUN_ID`)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from pydantic import Field

from ringlet.server.http.auth import Principal, need
from ringlet.server.http.errors import ApiError
from ringlet.server.http.schemas import ERRORS, ErrorBody, View
from ringlet.server.protocols.access import visible_run
from ringlet.server.runs.replays import NotReplayable, replay_stored
from ringlet.server.runs.service import runs_of

router = APIRouter(prefix="/api/v1")
Admin = Annotated[Principal, Depends(need("admin"))]


class DivergenceView(View):
    kind: str = Field(description="request | tool_call | seam | pause | event | length")
    message: str
    index: int | None = Field(None, description="The model request's or event's 0-based index, where one applies")
    expected: Any = Field(None, description="What the recording has there")
    actual: Any = Field(None, description="What the replay produced there")


class ReplayView(View):
    same: bool = Field(description="The replay's events are the stored events byte for byte, and it asked "
                                   "for nothing the recording does not hold")
    events: int = Field(description="Events the replay produced")
    recorded_events: int = Field(description="Events stored for the run")
    divergence: DivergenceView | None = Field(description="The first difference; null when `same`")
    divergences: list[DivergenceView]


@router.post("/runs/{run_id}/replay", response_model=ReplayView, responses={
    **ERRORS, 409: {"model": ErrorBody, "description": "Still running, a graph run, or not recorded"}})
async def replay(run_id: str, request: Request, principal: Admin) -> dict[str, Any]:
    """Replay a finished (or paused) loop run from its recording, with the agent as configured now: nothing is
    called, run or stored. The report names the first divergence (another model request, a call the run did
    not make, a different event)."""
    runs = runs_of(request)
    await visible_run(runs, run_id, principal)  # 404 for a run this key may not see, as for an unknown one
    try:
        report = await replay_stored(runs.records, runs.catalog, run_id)
    except NotReplayable as exc:
        raise ApiError(exc.status, "run_not_found" if exc.status == 404 else "not_replayable", str(exc)) from None
    return report.as_dict()
