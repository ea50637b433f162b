"""The OpenAI-compatible API (`/v1`, `server-contract.md` §7): the agent loop runs on the server and the
client sees a chat completion (or its chunks). Client-supplied tools are deferred tools: when the model
calls one, the run's other calls run, the run stops, and the calls go back to the client as `tool_calls`.
A continuation keeps the full transcript (server-side calls included) under the returned call ids until
the client sends the results.

    routes.py          GET /v1/models, POST /v1/chat/completions: the request read into a run
    models.py          the request and response bodies (pydantic), as the OpenAPI document shows them
    continuations.py   transcripts of runs stopped on client tool calls, and the call ids that name them
    runs.py            where a completion's events come from: a stored conversation's run, or one without
    encoder.py         the run's events as a chat completion, its chunks, or an OpenAI-shaped error

The package is `openai` for the API it speaks (the client library `openai` is another, top-level package;
absolute imports keep them apart), not `v1`, which the native API's `/api/v1` shares.
"""

from ringlet.server.protocols.openai.routes import router

__all__ = ["router"]
