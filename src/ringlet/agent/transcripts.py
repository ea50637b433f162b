"""What an agent does with a transcript outside a run: say where the tokens of its next request would go
(`Agent.context`), and compact it now (`Agent.compact`, `POST …/compact`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from ringlet.context import RunContext
from ringlet.errors import ConfigError
from ringlet.events import CompactionEvent, Event
from ringlet.loop import LoopConfig, Run, RunState
from ringlet.loop.compact import compact_now
from ringlet.loop.prompt import effective_budget, visible_messages, without_compacted
from ringlet.messages import Message
from ringlet.models.tokens import breakdown


async def prompt_context(config: LoopConfig, history: Sequence[Message], realm: str) -> dict[str, Any]:
    """The TokenBreakdown fields of the next request after `history`, plus `context_window` and `budget`."""
    ctx = RunContext(run_id=config.steps.seam.new_id("r"), agent=config.name, realm=realm)
    run = Run(config, RunState(run_id=ctx.run_id, agent=config.name), ctx, config.settings)
    registry = config.registry or await run.tool_registry()
    prompt = visible_messages(history, {}, 0)
    if any(m.metadata.get("kind") == "compaction" for m in prompt):  # what a compaction left in the prompt
        prompt = without_compacted(prompt)
    window, settings = config.model.context_window, config.settings
    return {**asdict(breakdown(config.instructions, prompt, registry.tool_tokens)), "context_window": window,
            "budget": effective_budget(settings.max_tokens_per_turn, window, settings.max_output_tokens)}


async def compact_transcript(config: LoopConfig, history: Sequence[Message], realm: str,
                             conversation_id: str | None) -> tuple[list[Message], Event | None]:
    """The messages to store after compacting `history` (the note, and the covered messages marked
    `compacted_into`) and the `compaction` event; `([], None)` when nothing can be compacted."""
    if config.compaction is None:
        raise ConfigError(f"compaction is off for agent {config.name!r}")
    ctx = RunContext(run_id=config.steps.seam.new_id("r"), agent=config.name, conversation_id=conversation_id,
                     realm=realm)
    state = RunState(run_id=ctx.run_id, agent=config.name, conversation_id=conversation_id, usage=ctx.usage)
    for m in history:
        state.append(m)
    events = await compact_now(Run(config, state, ctx, config.settings))
    event = next((e for e in events if isinstance(e, CompactionEvent)), None)
    if event is None:
        return [], None
    note_id = event.summary_message_id
    return [m for m in state.messages if m.id == note_id or m.metadata.get("compacted_into") == note_id], event
