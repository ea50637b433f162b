"""The exact public API, snapshotted (inline-snapshot): any change to a public name or to the signature of
`Agent`, `tool`, `Plugin`, `RunResult`, the settings objects or `ringlet.testing` is a visible diff here.
After a deliberate change: `pytest tests/test_public_api.py --inline-snapshot=fix`, and review the diff."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from inline_snapshot import snapshot

import ringlet
from ringlet import testing
from ringlet.agent import AgentStream


def signature(obj: Any) -> str:
    return str(inspect.signature(obj))


def methods(cls: type) -> dict[str, str]:
    """The public methods of `cls` defined by ringlet, with their signatures."""
    return {name: signature(member) for name, member in sorted(vars(cls).items())
            if not name.startswith("_") and inspect.isfunction(member)}


def fields(cls: type) -> dict[str, str]:
    return {f.name: str(f.type) for f in dataclasses.fields(cls)}


def test_public_names() -> None:
    assert sorted(ringlet.__all__) == snapshot(['ActionResult', 'Agent', 'AgentStream', 'AuthError', 'BadRequestError', "Caller", 'ConfigError', 'ContextWindowError', 'Event', 'Execution', 'FallbackModel', 'Gates', 'Limits', 'LoopSettings', 'Message', 'Model', 'ModelRequest', 'ModelRetry', 'ModelSettings', 'NetworkError', 'OverloadedError', 'Plugin', 'PluginOrderError', 'PostExecuteContext', 'PreExecuteContext', 'PreExecuteResult', 'PrePromptContext', 'ProviderError', 'ProviderTimeoutError', 'RateLimitError', 'RequestUsage', 'ResponseCompleteContext', 'RingletError', 'RunContext', 'RunError', 'RunHost', 'RunResult', "RunSettings", 'RunState', "RunStream", "Runnable", 'ServerError', 'SubAgents', 'TokenBreakdown', 'Tool', 'ToolCall', 'ToolDefinition', 'ToolDefinitionError', 'ToolExecutedContext', 'Toolset', 'Usage', '__version__', 'action', 'events', 'tool'])
    assert sorted(testing.__all__) == snapshot(['Chunks', 'FunctionModel', 'Reply', 'ScriptedCall', 'ScriptedModel', 'call'])


def test_agent() -> None:
    assert signature(ringlet.Agent.__init__) == snapshot("(self, model: 'Model | str | Sequence[Model | str]', *, name: 'str' = 'agent', instructions: 'str | None' = None, tools: 'Iterable[ToolLike]' = (), output_type: 'OutputSpec[OutputT] | None' = None, deps_type: 'type[DepsT] | None' = None, model_settings: 'ModelSettings | None' = None, limits: 'Limits | None' = None, execution: 'Execution | None' = None, gates: 'Gates | None' = None) -> 'None'")
    assert methods(ringlet.Agent) == snapshot({'aclose': "(self) -> 'None'", 'add_tools': "(self, tools: 'Iterable[ToolLike]') -> 'None'", 'compact': "(self, history: 'Sequence[Message]', *, realm: 'str' = 'default', conversation_id: 'str | None' = None) -> 'tuple[list[Message], Event | None]'", 'context': "(self, history: 'Sequence[Message]', *, realm: 'str' = 'default') -> 'dict[str, Any]'", 'enable_sub_agents': "(self, resolve: 'Callable[[str], Spawnable]', settings: 'SubAgentSettings', names: 'Sequence[str]' = ('spawn_agent',)) -> 'None'", 'output_validator': "(self, fn: 'OutputValidator') -> 'OutputValidator'", 'resume': "(self, state: 'RunState | str | bytes', decisions: 'Mapping[str, ApprovalDecision | bool] | None' = None, **options: 'Unpack[ResumeOptions]') -> 'RunResult[OutputT]'", 'resume_stream': "(self, state: 'RunState | str | bytes', decisions: 'Mapping[str, ApprovalDecision | bool] | None' = None, *, deps: 'DepsT | None' = None, approver: 'Approver | None' = None, decided_by: 'str' = 'user', host: 'RunHost | None' = None) -> 'AgentStream[OutputT]'", 'resume_sync': "(self, state: 'RunState | str | bytes', decisions: 'Mapping[str, ApprovalDecision | bool] | None' = None, **options: 'Unpack[ResumeOptions]') -> 'RunResult[OutputT]'", 'run': "(self, prompt: 'Prompt', **options: 'Unpack[RunOptions]') -> 'RunResult[OutputT]'", 'run_sync': "(self, prompt: 'Prompt', **options: 'Unpack[RunOptions]') -> 'RunResult[OutputT]'", 'stream': "(self, prompt: 'Prompt', *, history: 'Sequence[Message]' = (), caller: 'Caller | None' = None, settings: 'RunSettings | None' = None, deps: 'DepsT | None' = None) -> 'AgentStream[OutputT]'", 'use_gates': "(self, gates: 'Iterable[Gate]', *, audit: 'Callable[[dict[str, Any]], Any] | None' = None) -> 'None'", 'wait_background': "(self, timeout_s: 'float' = 30.0) -> 'None'", "with_config": "(self, **changes: 'Any') -> 'Self'"})
    assert methods(AgentStream) == snapshot({'aclose': "(self) -> 'None'", 'steer': "(self, text: 'str | Message', *, steer_id: 'str | None' = None) -> 'SteerQueuedEvent'", 'stream_output': "(self) -> 'AsyncGenerator[OutputT, None]'"})


def test_results_and_settings() -> None:
    assert fields(ringlet.RunResult) == snapshot({'run_id': 'str', 'output': 'OutputT | None', 'finish_reason': 'FinishReason | None', 'status': 'RunStatus', 'usage': 'Usage', 'messages': 'list[Message]', 'error': 'dict[str, Any] | None', 'state': 'RunState', 'pending_approvals': 'dict[str, ApprovalRequest]'})
    assert {cls.__name__: fields(cls) for cls in (ringlet.Limits, ringlet.ModelSettings, ringlet.Execution,
                                                  ringlet.Gates, ringlet.SubAgents, ringlet.RunHost,
                                                  ringlet.RunSettings, ringlet.Caller)} == snapshot({'Limits': {'max_iterations': 'int', 'on_max_iterations': "Literal['answer', 'error']", 'max_tokens_per_turn': 'int', 'max_cost_usd_per_run': 'float | None', 'pricing': 'Pricing | None', 'max_blank_stops': 'int', 'blank_stop_nudge': 'str | None', 'max_repeated_tool_errors': 'int', 'terminal_tool': 'str | None', 'question_timeout_s': 'float | None', 'output_retries': 'int', 'compaction': 'CompactionConfig | bool'}, 'ModelSettings': {'temperature': 'float | None', 'top_p': 'float | None', 'max_tokens': 'int | None', "prompt_cache": "bool", "cache_points": "tuple[CachePoint, ...]", "cache_key": "str | None"}, 'Execution': {'plugins': 'Sequence[Plugin]', 'hook_timeout_s': 'float', 'strict_plugins': 'bool', 'parallel_tools': 'bool', 'max_tool_concurrency': 'int', 'batch_timeout_s': 'float', 'tool_result_max_chars': 'int', 'steps': 'StepExecutor | None', 'on_iteration': 'Callable[[dict[str, Any]], Any] | None'}, 'Gates': {'policies': 'Sequence[Gate]', 'approvals': 'ApprovalRules | None', 'approver': 'Approver | None', 'audit': 'Callable[[dict[str, Any]], Any] | None', 'realm': 'str | None', "guardrails": "Guardrails | None"}, 'SubAgents': {'agents': 'Sequence[Spawnable] | Callable[[str], Spawnable]', 'allowed': 'tuple[str, ...] | None', 'max_agent_depth': 'int', 'max_concurrent_agents': 'int', 'timeout_s': 'float', 'tool_names': 'tuple[str, ...]'}, 'RunHost': {'schedules': 'Any', 'humans': 'bool', 'lineage': 'Lineage | None', 'child_approver': 'Approver | None', 'realms': 'frozenset[str] | None', 'child_host': 'Any', 'steps': 'StepExecutor | None'}, "RunSettings": {
    "output_type": "Any",
    "model": "Model | str | None",
    "instructions": "str | None",
    "tools": "Sequence[Any]",
    "model_settings": "ModelSettings | None",
    "limits": "Any",
    "plugin_data": "dict[str, Any] | None",
    "approver": "Approver | None",
    "host": "Any",
}, "Caller": {
    "conversation_id": "str | None",
    "realm": "str",
    "user_id": "str | None",
    "org_id": "str | None",
    "roles": "tuple[str, ...]",
    "channel": "Channel",
    "request_id": "str | None",
    "run_id": "str | None",
}})


def test_tool_and_plugin() -> None:
    assert signature(ringlet.tool) == snapshot("(fn: 'Callable[..., Any] | None' = None, /, *, name: 'str | None' = None, description: 'str | None' = None, timeout_s: 'float' = 30.0, sequential: 'bool' = False, effect: 'Effect' = 'write', max_chars: 'int | None' = None, idempotent: 'bool' = False, durable: 'bool' = False) -> 'Tool | Callable[[Callable[..., Any]], Tool]'")
    assert methods(ringlet.Plugin) == snapshot({'post_execute': "(self, ctx: 'PostExecuteContext') -> 'None'", 'pre_execute': "(self, ctx: 'PreExecuteContext') -> 'PreExecuteResult | None'", 'pre_prompt': "(self, ctx: 'PrePromptContext') -> 'None'", 'response_complete': "(self, ctx: 'ResponseCompleteContext') -> 'None'", 'response_update': "(self, ctx: 'ResponseUpdateContext') -> 'None'", 'status_changed': "(self, ctx: 'StatusContext') -> 'None'", 'tool_executed': "(self, ctx: 'ToolExecutedContext') -> 'None'", 'user_message_received': "(self, ctx: 'UserMessageContext') -> 'None'"})


def test_testing() -> None:
    assert {name: signature(getattr(testing, name)) for name in sorted(testing.__all__)} == snapshot({'Chunks': "(items: 'Sequence[Chunk | BaseException]') -> None", 'FunctionModel': "(fn: 'ModelFunction', *, name: 'str' = 'test:function', context_window: 'int | None' = None) -> 'None'", 'Reply': "(text: 'str' = '', calls: 'Sequence[ScriptedCall]' = (), finish_reason: 'str | None' = 'stop', usage: 'RequestUsage | None' = None) -> None", 'ScriptedCall': "(name: 'str', args: 'dict[str, Any]' = <factory>, id: 'str | None' = None, raw: 'str | None' = None) -> None", 'ScriptedModel': "(script: 'Iterable[Script]', *, name: 'str' = 'test:scripted', context_window: 'int | None' = None) -> 'None'", 'call': "(name: 'str', args: 'dict[str, Any] | None' = None, /, *, id: 'str | None' = None, raw: 'str | None' = None, **kwargs: 'Any') -> 'ScriptedCall'"})
