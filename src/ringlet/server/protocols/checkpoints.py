"""A graph run's checkpoints and forking it from one (issue 44; `graph-workflows.md` §10.4):

    GET  /api/v1/runs/{id}/checkpoints          every super-step's checkpoint, oldest first
    GET  /api/v1/runs/{id}/checkpoints/{step}   one of them, with its state
    POST /api/v1/runs/{id}/fork                 {checkpoint, state_patch?, force?, title?} → a new run

A fork is a new run of the same graph agent in a new conversation of the same realm (its
`forked_from_conversation_id` is the original's), started like a message: the same gates, limits and
engine (a durable run on DBOS too: the fork travels in the run's overrides). It starts at the chosen
checkpoint, so the nodes before it are not run again; the original run and its checkpoints are not
touched, and may still be running (its checkpoints so far can be forked). The new conversation holds the
original prompt as its user message and the fork's answer; follow its events on
`GET /api/v1/chat/conversations/{conversation_id}/events`.

Access is the run's: a run the key may not see (another realm, an agent outside the key's) is 404 like an
unknown id, and starting the fork checks the key's agents and realms as a new message does.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from ringlet.errors import ConfigError
from ringlet.graph.agent import GraphAgent
from ringlet.graph.checkpoint import Checkpoint
from ringlet.graph.fork import ForkError, ForkFrom, StatePatchError
from ringlet.messages import Message
from ringlet.server.http.auth import Principal, need
from ringlet.server.http.errors import ApiError
from ringlet.server.http.schemas import ERRORS, ErrorBody
from ringlet.server.protocols import checkpoints_schemas as s
from ringlet.server.protocols.access import visible_run
from ringlet.server.runs.service import Runs, runs_of
from ringlet.store.records import RunRecord

router = APIRouter(prefix="/api/v1")
Chat = Annotated[Principal, Depends(need("chat"))]
_FORK_ERRORS: dict[int | str, dict[str, Any]] = {
    **ERRORS, 409: {"model": ErrorBody, "description": "Not a graph run, the checkpoint is the run's end, or "
                                                         "graph.yaml changed since it (pass `force`)"}}
_STATUS = {"checkpoint_not_found": 404, "checkpoint_ended": 409, "graph_changed": 409, "no_history": 409}


async def _graph_run(runs: Runs, run_id: str, principal: Principal) -> RunRecord:
    record = await visible_run(runs, run_id, principal)
    if record.kind != "graph":
        raise ApiError(409, "not_a_graph_run", f"run {run_id} is a {record.kind} run; only graph runs keep "
                       "checkpoints (a conversation forks at a message: POST …/chat/conversations/{id}/fork)")
    return record


def _graph_agent(runs: Runs, name: str) -> GraphAgent | None:
    """The graph agent the server hosts under `name` now, or None (gone, or no longer a graph)."""
    try:
        agent = runs.catalog.get(name).agent()
    except (ApiError, ConfigError, LookupError):
        return None
    return agent if isinstance(agent, GraphAgent) else None


def _summary(cp: Checkpoint) -> dict[str, Any]:
    return {"step": cp.step, "status": cp.status, "frontier": cp.frontier, "saved_at": cp.updated_at}


def _changed(agent: GraphAgent | None, cp: Checkpoint | None) -> bool:
    return cp is not None and (agent is None or cp.graph_hash != agent.runtime.graph_hash)


@router.get("/runs/{run_id}/checkpoints", response_model=s.CheckpointList, responses=_FORK_ERRORS)
async def list_checkpoints(run_id: str, request: Request, principal: Chat) -> dict[str, Any]:
    """Every checkpoint kept of a graph run, one per super-step, oldest first: what a fork starts from.
    Kept while the run's latest checkpoint is (72 h after it ended)."""
    runs = runs_of(request)
    record = await _graph_run(runs, run_id, principal)
    history = await runs.records.checkpoints.decoding(Checkpoint.from_json).history(run_id)
    agent = _graph_agent(runs, record.agent)
    return {"run_id": run_id, "agent": record.agent, "graph_changed": _changed(agent, history[-1] if history else None),
            "data": [_summary(cp) for cp in history]}


@router.get("/runs/{run_id}/checkpoints/{step}", response_model=s.CheckpointDetail, responses=_FORK_ERRORS)
async def get_checkpoint(run_id: str, step: int, request: Request, principal: Chat) -> dict[str, Any]:
    """One checkpoint of a graph run, with the state a fork from it starts with (before its patch)."""
    runs = runs_of(request)
    record = await _graph_run(runs, run_id, principal)
    cp = await runs.records.checkpoints.decoding(Checkpoint.from_json).load_step(run_id, step)
    if cp is None:
        raise ApiError(404, "checkpoint_not_found", f"run {run_id} has no checkpoint at step {step}; GET "
                       f"/api/v1/runs/{run_id}/checkpoints lists those it has")
    agent = _graph_agent(runs, record.agent)
    reducers = dict(agent.spec.reducers) if agent is not None else {}
    return {**_summary(cp), "run_id": run_id, "graph_changed": _changed(agent, cp), "state": cp.state,
            "visit_counts": cp.visit_counts, "reducers": reducers}


@router.post("/runs/{run_id}/fork", status_code=201, response_model=s.ForkedRun, responses=_FORK_ERRORS)
async def fork_run(run_id: str, body: s.ForkRun, request: Request, principal: Chat) -> dict[str, Any]:
    """Start a new run of the graph at one of this run's checkpoints, its state patched or not, in a new
    conversation. 422 when the patch does not fit the graph's state (each key named, with the fix)."""
    runs = runs_of(request)
    record = await _graph_run(runs, run_id, principal)
    source = await runs.records.conversations.get(record.conversation_id) if record.conversation_id else None
    if source is None:
        raise ApiError(404, "run_not_found", f"no run {run_id!r}")
    principal.check_agent(record.agent)  # before anything is created, as a new message does
    principal.check_realm(source.realm)
    agent = _graph_agent(runs, record.agent)
    if agent is None:
        raise ApiError(409, "not_a_graph_run", f"agent {record.agent!r} is not a graph agent (any more): its runs "
                       "cannot be forked")
    fork = ForkFrom(run_id, body.checkpoint, body.state_patch or {}, body.force)
    try:
        start = await agent.check_fork(fork)
    except StatePatchError as exc:
        raise ApiError(422, "validation_error", exc.message, details={"errors": [
            {"loc": ["body", "state_patch", key], "msg": problem} for key, problem in exc.problems]}) from None
    except ForkError as exc:
        raise ApiError(_STATUS.get(exc.code, 409), exc.code, exc.message) from None
    title = body.title or f"{source.title or record.agent} (fork of step {body.checkpoint})"
    conversation = await runs.records.conversations.create(agent=record.agent, title=title[:200], realm=source.realm,
                                                           org_id=principal.org_id, user_id=principal.user_id)
    await runs.records.checkpoints.record_fork_origin(conversation.id, source.id, run_id)
    prompt = Message.user(str(start.run.get("prompt", "")), source="fork")
    run = await runs.fork(conversation, prompt, principal=principal, overrides={"fork": fork.to_dict()})
    made = await runs.records.conversations.get(conversation.id)
    return {"run_id": run.run_id, "conversation_id": conversation.id, "conversation": made or conversation,
            "status": "working", "forked_from": {"run_id": run_id, "conversation_id": source.id,
                                                  "step": body.checkpoint}}
