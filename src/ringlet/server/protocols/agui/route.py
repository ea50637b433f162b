"""The AG-UI route, `POST /ag-ui/{agent}`: a `RunAgentInput` starts a run on the thread's new messages, or
with `resume` decides or answers its interrupts, and is answered with the run's AG-UI event stream.

The `ag_ui` package (~0.1 s of CPU to import and build its models) is loaded by the first AG-UI request or
the first OpenAPI document (`document`), not when a process starts."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.encoders import jsonable_encoder
from fastapi.openapi.models import RequestBody

from ringlet.server.http.auth import Principal, need
from ringlet.server.http.limits import hold_stream
from ringlet.server.http.schemas import ERRORS, SSE_EVENT, ErrorBody
from ringlet.server.protocols.access import named_conversation
from ringlet.server.protocols.agui.inputs import check_input, documented_input, parsed
from ringlet.server.runs.service import runs_of

router = APIRouter(prefix="/ag-ui")
Chat = Annotated[Principal, Depends(need("chat"))]
_STREAM = {"content": {"text/event-stream": {"schema": SSE_EVENT}},
           "description": "The run's AG-UI events (https://docs.ag-ui.com), each one `data:` line of its JSON, no "
                          "event name; `: ping` comments keep the stream open."}
_RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERRORS, 200: _STREAM,
    400: {"model": ErrorBody, "description": "The thread belongs to another agent"},
    409: {"model": ErrorBody, "description": "A run is active, the thread waits on interrupts, or an "
                                               "interrupt was decided already"}}


def document(doc: dict[str, Any]) -> None:
    """Give the AG-UI operations of the OpenAPI document `doc` their request body, `RunAgentInput`
    (`documented_input`), which FastAPI cannot infer from a handler that parses its own body; encoded as
    FastAPI encodes the document (no null fields), as if it had been the routes' `openapi_extra`."""
    body = jsonable_encoder(RequestBody.model_validate(
        {"required": True, "content": {"application/json": {"schema": documented_input()}}}),
        by_alias=True, exclude_none=True)
    for path in (f"{router.prefix}/{{agent}}", f"{router.prefix}/{{agent}}/"):
        if "post" in doc["paths"].get(path, {}):
            doc["paths"][path]["post"]["requestBody"] = body


@router.post("/{agent}/", responses=_RESPONSES)  # with a client's trailing slash: answered,
@router.post("/{agent}", responses=_RESPONSES)  # not redirected (a POST is not followed)
async def run_agent(agent: str, request: Request, principal: Chat) -> Any:
    """Run `agent` on the thread's new user messages, or resume its interrupts; stream AG-UI events."""
    from ringlet.server.protocols.agui.interrupts import resume
    from ringlet.server.protocols.agui.stream import authorized, frames, synced
    from ringlet.server.protocols.agui.thread import start

    runs = runs_of(request)
    hosted = runs.catalog.get(agent)  # 404 agent_not_found
    principal.check_agent(agent)
    body = parsed(await request.body())
    check_input(body)
    conversation = await named_conversation(runs, principal, hosted, body.thread_id)
    assert conversation is not None
    slot = hold_stream()  # 429 over the key's streams, before a run starts or resumes
    try:
        if body.resume:
            run_id, after = await resume(runs, principal, conversation, body.resume)
        else:
            run_id, after = await start(runs, principal, conversation, hosted, body), 0
    except BaseException:
        if slot is not None:
            slot.release()
        raise
    if run_id is None:  # nothing new to run: the thread as it stands (a client reconnecting)
        return authorized(request, principal, synced(runs, conversation.id, body.thread_id, body.run_id),
                          slot)
    events = frames(runs, conversation.id, body.thread_id, run_id, body.run_id, after,
                    graph=hosted.kind == "graph")
    return authorized(request, principal, events, slot)
