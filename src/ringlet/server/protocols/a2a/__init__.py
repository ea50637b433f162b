"""A2A (agent-to-agent protocol 1.0, the official `a2a-sdk`): every hosted agent the key may use is an A2A agent.

    GET  /a2a/{agent}/.well-known/agent-card.json   the agent's card (Bearer key; 404 for an agent it may not use)
    POST /a2a/{agent}                               JSON-RPC: SendMessage, SendStreamingMessage (SSE), GetTask,
                                                    CancelTask, ListTasks (and the 0.3 names message/send, …);
                                                    `/a2a/{agent}/` (trailing slash) is the same endpoint

The SDK speaks the protocol (`JsonRpcDispatcher`, `DefaultRequestHandlerV2`); ringlet only runs tasks. A task
IS a ringlet run: task id = run id, contextId = conversation id (an unknown contextId starts a conversation
with that id). `RingletExecutor.execute` starts the run through the one driver (`Runs.start`, as a chat
message does) and encodes the run's events as task updates; nothing else drives it. Tasks are read back
from ringlet's own records (`RunTasks`: run record, transcript, pending approvals), so `GetTask` answers in
every server process sharing the store, and the SDK's in-memory task copies are never the truth.

A pause for a human is `input-required`: the status message says what is asked in text, with one DataPart
per open request carrying ringlet's payload (`approval_required` / `question` event fields). The answer is
the next message of the same task (`asks.ANSWERS`); the run resumes and the task's stream goes on.

    routes.py     the card and JSON-RPC routes behind ringlet's auth, held among the key's streams
    caller.py     who calls which agent (the key, checked), carried through the SDK's call context
    card.py       the agent's card
    errors.py     failures as JSON-RPC errors, never the exception's text
    tasks.py      tasks read from ringlet's records (`RunTasks`), and the ids the SDK makes
    executor.py   `RingletExecutor`: a message starts a run, or answers what its task asks
    follow.py     the run's events encoded as task updates
    handler.py    the SDK's handler, cancelling a task as the native API cancels its run
    asks.py       what a task waiting for input asks
    answers.py    a message applied to what it asks
"""

from ringlet.server.protocols.a2a.routes import install

__all__ = ["install"]
