"""AG-UI (`POST /ag-ui/{agent}`): the protocol CopilotKit and other front-ends speak, as one more encoder of
the run's event stream (DESIGN §1: never a second driver). A request is AG-UI's `RunAgentInput`; the answer
is an SSE stream of AG-UI events, one `data:` line each (the `ag_ui` package's own encoder), with `: ping`
comments while the run is busy.

    route.py         the route: a run started on the thread's new messages, or its interrupts resumed
    inputs.py        `RunAgentInput` parsed and checked; what its fields (`tools`, `context`, `state`) do
    thread.py        threads: which messages are new, as ringlet messages, and the run they start
    stream.py        the SSE stream: RUN_STARTED, the translated events, the transcript and the end
    translator.py    ringlet events → AG-UI events (the table of what becomes what)
    interrupts.py    a paused run's interrupts, and `resume` deciding or answering them
    graph_state.py   a graph run's state as STATE_SNAPSHOT / STATE_DELTA
    transcript.py    the stored transcript in AG-UI's message shapes
"""

from ringlet.server.protocols.agui.route import document, router

__all__ = ["document", "router"]
