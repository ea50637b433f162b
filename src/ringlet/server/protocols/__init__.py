"""The protocols a client speaks, each one more encoder of the same runs (DESIGN §1: never a second driver):
the native API with its SSE stream (`chat`, `approvals`, `audit`, `tool_calls`), the OpenAI-compatible
`/v1` (`compat`), AG-UI (`agui`) and A2A (`a2a`). What a key may reach is `access`; how ringlet's events
read in each protocol where they say the same thing is `events`."""
