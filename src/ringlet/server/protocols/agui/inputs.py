"""AG-UI's `RunAgentInput`, parsed and checked as strictly as the OpenAPI document says (`documented_input`).

**Input fields.** `tools`: the front-end's own tools, offered to a loop agent's model beside the agent's
tools. A call of one is not run on the server: its TOOL_CALL_START/ARGS/END are sent and the run finishes
(RUN_FINISHED) once the server's own calls of that round are done; the client runs it and sends the next
`RunAgentInput` with a `tool` message (`toolCallId`, `content`, or `error`) after the history, and the run
goes on from there (as `/v1` does with `tool_calls`). A graph agent takes none (422). `context`: for a
loop agent each entry joins the run's instructions (`extra_instructions`, as `/v1` system messages do);
a graph agent ignores it. `state`: for a graph agent, its entries whose key is a declared graph variable
are the run's `variables`; anything else in it is ignored. `forwardedProps` is ignored.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from ringlet.server.catalog import Hosted
from ringlet.server.http.errors import ApiError
from ringlet.tools.base import NAME_PATTERN, client_tool

if TYPE_CHECKING:  # imported where used: `ag_ui` is loaded by a process's first AG-UI request, not at its start
    from ag_ui.core import RunAgentInput

THREAD_ID = re.compile(r"[A-Za-z0-9_.:-]{1,40}")


def documented_input() -> dict[str, Any]:
    """`RunAgentInput`'s JSON Schema from the package, inlined (an operation cannot add components) and made
    as strict as its validation: a union's discriminator (`role`, `type`) is required in each member (the
    package leaves it optional since it has a default, yet validation needs it), `threadId` has ringlet's
    pattern, and a tool's name and parameters what `check_input` takes."""
    from ag_ui.core import RunAgentInput

    schema = RunAgentInput.model_json_schema(by_alias=True)
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, list):
            return [inline(n) for n in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            return inline(defs[node["$ref"].rsplit("/", 1)[1]])
        out = {k: inline(v) for k, v in node.items() if k != "discriminator"}
        tag = (node.get("discriminator") or {}).get("propertyName")
        for member in out.get("oneOf", ()) if tag else ():
            member["required"] = list(dict.fromkeys([*member.get("required", []), tag]))
        return out

    documented = inline(schema)
    documented["properties"]["threadId"] |= {"pattern": f"^{THREAD_ID.pattern}$"}
    tool = documented["properties"]["tools"]["anyOf"][0]["items"]["properties"]
    tool["name"] |= {"pattern": NAME_PATTERN.pattern}
    tool["parameters"] = {"anyOf": [{"type": "object", "properties": {"type": {"const": "object"}}},
                                    {"type": "null"}], "default": None,
                          "description": "The JSON Schema of the tool's arguments (an object)"}
    return documented


def parsed(raw: bytes) -> RunAgentInput:
    """The body as AG-UI's model; 400 when it is not JSON, 422 naming the first invalid field (the error shape
    of every native route, `errors.install`)."""
    from ag_ui.core import RunAgentInput

    try:
        return RunAgentInput.model_validate_json(raw)
    except ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            raise ApiError(400, "invalid_request", "the body is not JSON") from None
        errors = [{"loc": ".".join(["body", *(str(p) for p in e["loc"])]), "msg": e["msg"]} for e in exc.errors()]
        raise ApiError(422, "validation_error", f"{errors[0]['loc']}: {errors[0]['msg']}",
                       details={"errors": errors}) from None


def check_input(body: RunAgentInput) -> None:
    if not THREAD_ID.fullmatch(body.thread_id):
        raise ApiError(422, "validation_error", "body.threadId: 1-40 characters of letters, digits and _.:-",
                       details={"errors": [{"loc": "body.threadId", "msg": "not a thread id ringlet can store"}]})
    for i, t in enumerate(body.tools or ()):
        problem = None if NAME_PATTERN.match(t.name) else "the name must be 1-64 letters, digits, _ or -"
        if problem is None and t.parameters is not None and (
                not isinstance(t.parameters, dict) or t.parameters.get("type", "object") != "object"):
            problem = "parameters must be a JSON Schema of an object"
        if problem is not None:
            raise ApiError(422, "validation_error", f"body.tools.{i}: {problem}",
                           details={"errors": [{"loc": f"body.tools.{i}", "msg": problem}]})


def overrides(hosted: Hosted, body: RunAgentInput) -> dict[str, Any]:
    """`context` as instructions for a loop agent, and its client-side `tools` (deferred: a call of one ends
    the run and goes to the client, whose result comes back as a tool message); `state` entries that are
    declared graph variables."""
    if hosted.kind == "graph":
        if body.tools:
            raise ApiError(422, "validation_error", "body.tools: a graph agent takes no client-side tools",
                           details={"errors": [{"loc": "body.tools", "msg": "must be empty for a graph agent"}]})
        declared = {v.name for v in getattr(getattr(hosted.agent(), "spec", None), "variables", ())}
        state = body.state if isinstance(body.state, dict) else {}
        variables = {k: v for k, v in state.items() if k in declared}
        return {"variables": variables} if variables else {}
    found: dict[str, Any] = {}
    if body.context:
        notes = "\n".join(f"- {c.description}: {c.value}" for c in body.context)
        found["extra_instructions"] = f"Context from the client:\n{notes}"
    if body.tools:
        found["extra_tools"] = [client_tool(t.name, t.description, t.parameters or {"type": "object",
                                                                                   "properties": {}})
                                for t in body.tools]
    return found
