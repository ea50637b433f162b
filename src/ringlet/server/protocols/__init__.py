"""The protocols a client speaks, each one more encoder of the same runs (DESIGN §1: never a second driver):
the native API with its SSE stream (`chat`, `approvals`, `audit`, `tool_calls`; `evals`: evaluation reports
and cases captured from conversations), and one package for each of the others, a module per concept:

    openai/     the OpenAI-compatible `/v1`: routes, request and response models, continuations of client
                tool calls, where a completion's events come from (runs), the chunk encoder
    agui/       AG-UI: the route, its input, threads, the SSE stream, the translator of events, interrupts and
                `resume`, a graph run's state, the transcript
    a2a/        A2A: routes behind auth, the caller, the card, errors, tasks read from ringlet's records, the
                executor, following a run as task updates, cancelling, what a paused task asks and the answers

What a key may reach is `access`. How ringlet's events read where the protocols say the same thing is
`events`: whose an event is (a sub-agent's, a graph node's), the answer's text as it streams, how a run ends
(finish reason, usage, error, pause), and a stored approval or question as the event that asked it."""
