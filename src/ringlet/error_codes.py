"""Every error code ringlet reports, with what it means: the reference the docs' error-code page is made from.

A code appears in an HTTP error body (`{"error": {"code", "message", ...}}`), in a run's `error` event and
`result.error`, or in a tool's error result (`{"error": {"code", ...}}`, which the model reads). The keys of
`CODES` are where a code is reported; a code may be reported in more than one place.
`tests/test_docs.py` fails when the code reports a code this table does not describe.
"""

from __future__ import annotations

HTTP: dict[str, str] = {
    "access_required": "The agent's catalog tool needs access the caller has not been granted; request it "
                       "with `request_connector_access` (403).",
    "agent_not_found": "No agent of that name, or one the key may not use (404).",
    "approval_already_decided": "The approval was decided already; the first decision stands (409).",
    "approval_expired": "The approval passed its deadline and counts as denied (409).",
    "approval_not_found": "No pending approval with that id in this conversation, or one the key may not see (404).",
    "checkpoint_ended": "A graph run's fork at its last checkpoint: the run ended there, nothing is left to run "
                        "(409).",
    "checkpoint_not_found": "No checkpoint at that step of the run (404).",
    "compaction_disabled": "The agent's compaction is off, so the conversation cannot be compacted (409).",
    "conflict": "The request conflicts with the resource's state (409).",
    "conversation_empty": "The conversation has no message to act on (409).",
    "conversation_not_found": "No conversation with that id, or one the key may not see (404).",
    "evals_dir_not_set": "The server has no `RINGLET_EVALS_DIR`, so no report or dataset is there (409).",
    "forbidden": "The key lacks the scope, or asks for something the agent's configuration does not allow "
                 "(a model outside `allowed_models`) (403).",
    "graph_agent": "The operation is for loop agents, and this is a graph agent (409).",
    "graph_changed": "The graph.yaml changed since the run: a fork needs `\"force\": true` (409).",
    "idempotency_key_reused": "The `Idempotency-Key` was used before with another request (409).",
    "input_required": "The run waits for a human; answer its approvals or questions first (409).",
    "internal_error": "The server failed to handle the request; quote its `request_id` (500).",
    "interrupt_not_found": "AG-UI `resume` names an interrupt the thread does not have (404).",
    "interrupt_not_pending": "AG-UI `resume` names an interrupt that is no longer open (409).",
    "invalid_dataset": "The eval dataset file cannot take the case (its format, or it is not a dataset) (409).",
    "invalid_request": "The body is not valid JSON, or the request is malformed (400).",
    "message_not_found": "No message with that id in the conversation (404).",
    "method_not_allowed": "The route does not take that HTTP method (405).",
    "model_not_found": "No agent (the `/v1` model) of that name the key may use (404).",
    "no_history": "The store keeps only a run's latest checkpoint, so no earlier one can be forked (409).",
    "not_a_graph_run": "Checkpoints and forks from a checkpoint are for graph runs; fork a loop run's "
                       "conversation at a message instead (409).",
    "not_found": "No such route or resource (404).",
    "not_replayable": "The run cannot be replayed: still working, a graph run, or recorded before replays "
                      "were kept (409).",
    "payload_too_large": "The body is over `RINGLET_MAX_BODY_BYTES` (413).",
    "policy_denied": "A direct tool call the policy refused; `policy_id`, `audit_id` and `messages` say why (403).",
    "question_already_answered": "The question was answered already (409).",
    "question_not_found": "No pending question with that id (404).",
    "question_pending": "The run waits for an answer to a question; answer it first (409).",
    "rate_limited": "The key is over one of its limits; retry after `Retry-After` seconds (429).",
    "realm_forbidden": "The key may not act in the realm the request would run in (403).",
    "replayed": "A signed webhook request seen before: each signature is accepted once (409).",
    "report_not_found": "No eval report of that name in `RINGLET_EVALS_DIR` (404).",
    "request_in_progress": "A request with the same `Idempotency-Key` is still being handled (409).",
    "run_in_progress": "The conversation has a working run (409).",
    "run_not_active": "The run is not working, so it cannot be cancelled or followed (409).",
    "run_not_found": "No run with that id, or one the key may not see (404).",
    "run_not_resumable": "The run cannot be resumed (it is not an interrupted graph run) (409).",
    "server_error": "`/v1`: a failure that is not the model provider's (500).",
    "tool_not_found": "A direct tool call names a tool the agent does not have; `closest` suggests one (404).",
    "trigger_not_found": "No trigger with that id, or one the key may not see (404).",
    "unauthorized": "No key, or a key that is unknown, revoked or expired (401); on an open stream, the key was "
                    "revoked or expired meanwhile.",
    "unavailable": "The server is not ready, or a part it needs is down; retry later (503).",
    "upstream_error": "`/v1`: the model provider failed after ringlet's retries; `code` says how (502).",
    "validation_error": "A field of the request is invalid; `details.errors` names each one (422).",
}
"""Codes of HTTP error responses (the status in brackets)."""

RUN: dict[str, str] = {
    "answer_retracted": "`/v1` stream: the worker writing the answer stopped and it is written anew; send the "
                        "request again.",
    "cancelled": "The run was cancelled.",
    "context_budget_exceeded": "The prompt does not fit the token budget even after compaction.",
    "context_window": "The prompt does not fit the model's context window.",
    "cost_limit_exceeded": "The run reached `max_cost_usd_per_run`.",
    "guardrail_blocked": "A guardrail blocked a text of the run (the user's message, the answer, a tool call or "
                         "its result); the `guardrail` event before it says which and why, and the text it "
                         "blocked was not sent.",
    "empty_frontier": "A graph run ran out of nodes to run before reaching an End node.",
    "empty_summary": "Compaction's summary request returned no text.",
    "error": "A failure with no more specific code.",
    "graph_config": "The graph agent cannot run as configured (its graph.yaml, or a resource it names).",
    "graph_failed": "The graph run failed.",
    "input_invalid": "An `input` node's answer does not fit its schema.",
    "internal_error": "An unexpected failure inside ringlet.",
    "interrupted": "The process executing the run died; its partial answer is kept.",
    "max_iterations": "The run reached `max_iterations` with `on_max_iterations: error`.",
    "max_loop_iterations": "A graph node was visited more often than its loop limit allows.",
    "mcp_server_unavailable": "A `required: true` MCP server could not be started.",
    "multiple_ends": "A graph super-step reached more than one End node.",
    "no_human": "A graph's `approval` or `input` node needs a human, and there is no one to ask.",
    "no_route": "A graph node's routing matched no edge.",
    "node_failed": "A graph node failed.",
    "output_validation_failed": "The model's result did not fit the output type after `output_retries` tries.",
    "plugin_error": "A hook failed with `strict_plugins` on.",
    "reducer_error": "A graph state reducer got a value it cannot fold (or is unknown).",
    "repeated_tool_error": "The same tool errors repeated `max_repeated_tool_errors` rounds in a row.",
    "replay_unavailable": "The event log no longer holds the events after `Last-Event-ID`; the stream goes on live.",
    "storage_unavailable": "The server could not store the run's events.",
    "stream_interrupted": "The model's stream broke off after output had been sent (a stream is never replayed).",
    "timeout": "A graph run passed its time limit.",
    "workflow_error": "A durable evaluation's workflow failed.",
    "auth_error": "The model provider refused the credentials (401/403).",
    "bad_request_error": "The model provider refused the request (another 4xx).",
    "context_window_error": "The model provider says the prompt does not fit its context window.",
    "network_error": "The model provider could not be reached (reset, refused, DNS), after retries.",
    "overloaded_error": "The model provider is overloaded (529, or 503 saying so), after retries.",
    "provider_error": "The model provider failed in another way.",
    "provider_timeout_error": "The request to the model provider timed out, after retries.",
    "rate_limit_error": "The model provider rate-limited the request (429), after retries.",
    "server_error": "The model provider failed (500/502/503/504), after retries.",
}
"""Codes of a run's `error` event and `result.error` (a provider failure's code ends in `_error`)."""

TOOL: dict[str, str] = {
    "aborted": "A plugin's `pre_execute` aborted the call.",
    "access_required": "A catalog tool the agent has no access to; `request_connector_access` asks for it.",
    "agent_not_allowed": "`spawn_agent` named an agent this agent may not spawn.",
    "approval_denied": "A human, a deny pattern or the effect default denied the call; `note` says why.",
    "approval_timeout": "No decision came within the approval's `timeout_s`.",
    "blocked_address": "`web_fetch` refused a local or private address.",
    "cancelled": "The run or the call was cancelled.",
    "forbidden": "The MCP server's `run_<agent>` tool: the API key may not use that agent.",
    "input_required": "The MCP server's `run_<agent>` tool: the agent paused for approvals, which MCP cannot give.",
    "invalid_arguments": "The arguments do not fit the tool's schema; `errors` says where.",
    "invalid_output": "The tool returned something that cannot be sent to the model.",
    "max_depth_exceeded": "A sub-agent would be deeper than `max_agent_depth`.",
    "no_human_available": "The call needs a human and none can be asked (`v1_approvals: deny`, no terminal).",
    "not_found": "What the tool was asked for does not exist (a schedule, a memory).",
    "not_recorded": "A replay met a call the recording has no result for.",
    "not_run": "A forked conversation's call that had no result when it was forked.",
    "policy_denied": "The policy denied the call; `policy_id`, `messages` and `audit_id` say why.",
    "question_timeout": "No one answered `ask_question` within `question_timeout_s`.",
    "realm_forbidden": "The call would act in a realm the caller may not use.",
    "retry": "The tool raised `ModelRetry`: its message tells the model what to change.",
    "schedules_unavailable": "Schedules need a conversation stored by the server.",
    "skipped": "The run ended (its terminal tool was called) before this call of the batch ran.",
    "sub_agent_failed": "A sub-agent could not start or failed; the message says why.",
    "sub_agent_timeout": "A sub-agent passed its `timeout_s`.",
    "superseded": "The worker stopped before the call ran; the model's answer is requested again.",
    "tool_error": "The tool raised an exception, or the call was interrupted by a restart and not retried.",
    "tool_failed": "A command-line tool exited with a non-zero code.",
    "tool_timeout": "The call passed its `timeout_s`.",
    "tool_unavailable": "The tool needs a program or environment variable that is missing.",
    "unavailable": "The MCP server's `run_<agent>` tool: the agent cannot start.",
    "unknown_tool": "The model called a tool the agent does not have.",
    "unsupported_content_type": "`web_fetch` got something that is not text, HTML, JSON or XML.",
}
"""Codes of a tool's error result, which the model reads (and `tool_result` events carry)."""

FORK: dict[str, str] = {
    "checkpoint_ended": "The checkpoint is the run's end: nothing is left to run.",
    "checkpoint_not_found": "No such run here, or no checkpoint at that step.",
    "graph_changed": "graph.yaml was edited since the run; pass `force=True`.",
    "invalid_fork": "The fork's options do not go together.",
    "message_not_found": "No message with that id or index in the transcript.",
    "no_history": "The checkpoint store keeps only each run's latest checkpoint.",
    "not_a_tool_call": "A tool-result fork at a message that made no tool call.",
    "not_a_user_message": "An edit of a message that is not the user's.",
    "tool_call_not_found": "No tool call with that id at the message.",
}
"""Codes of `ringlet.agent.forks.ForkError` and `ringlet.graph.ForkError`."""

CODES: dict[str, dict[str, str]] = {"HTTP responses": HTTP, "Runs": RUN, "Tool results": TOOL, "Forks": FORK}
"""Every code, by where it is reported."""
