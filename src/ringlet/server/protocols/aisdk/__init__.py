"""The Vercel AI SDK's chat stream (`POST /ai-sdk/{agent}`): what `useChat` (its `DefaultChatTransport`)
sends and reads, as one more encoder of the run's event stream (DESIGN §1: never a second driver). A request
is the chat's `{id, messages}`; the answer is the UI message stream protocol (SSE, header
`x-vercel-ai-ui-message-stream: v1`).

    route.py    the route: a run started on the chat's new user message, or its approvals answered
    inputs.py   the request parsed and checked; new user messages; the approval responses it carries
    runs.py     the run calls (start, decide and resume, follow, cancel), in one place
    stream.py   the SSE response: the run's chunks, pings, `[DONE]`; a client that leaves cancels the run
    chunks.py   ringlet events → UI message chunks (the table of what becomes what)
"""

from ringlet.server.protocols.aisdk.route import router

__all__ = ["router"]
