"""Compaction inside a run (`memory-and-context.md` §5): the oldest turn pairs become one `<compacted>`
note, the covered messages stay in the transcript marked `compacted_into`, and only the prompt changes."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Literal

from ringlet.errors import RunError
from ringlet.events import CompactionEvent, Event
from ringlet.loop.prompt import effective_budget
from ringlet.loop.response import ResponseBuilder
from ringlet.memory.compaction import SUMMARY_INSTRUCTIONS, is_note, kept_verbatim, note_text, render, select
from ringlet.messages import Message
from ringlet.models.base import ModelRequest, ModelSettings
from ringlet.models.tokens import estimate_message, estimate_text, prompt_tokens

if TYPE_CHECKING:
    from ringlet.loop.run import Run

log = logging.getLogger("ringlet.loop")


async def compact(run: Run, trigger: Literal["threshold", "context_window", "manual"], budget: int,
                  before: int) -> list[Event]:
    """Summarise the oldest turn pairs into one `<compacted>` note (`memory-and-context.md` §5). The
    covered messages stay in the transcript, marked `compacted_into`; only the prompt changes."""
    st, cfg, tokens = run.state, run.config.compaction, run.prompt.tokens
    assert cfg is not None
    prompt = run.prompt.transcript(st)
    previous = next((m for m in prompt if is_note(m)), None)
    over = before - int(cfg.target * budget) if trigger != "manual" else max(before - int(cfg.target * budget), 1)
    selected = select(prompt, keep_recent_turns=cfg.keep_recent_turns, over_target=over,
                      tokens=lambda m: tokens.get(m.id) or estimate_message(m))
    if not selected:
        return []
    method: Literal["summarize", "truncate"] = "summarize"
    try:
        body = await summarise(run, previous, selected)
    except Exception as exc:  # the turns are dropped instead; what must survive is kept verbatim
        log.warning("compaction summary failed for run %s: %s", st.run_id, exc)
        run.ctx.notify("warning", "compaction fell back to truncation", f"{type(exc).__name__}: {exc}",
                        source="compaction")
        method, body = "truncate", kept_verbatim(previous, selected)
    covered = [*([previous] if previous else []), *selected]
    ids, note_id = {m.id for m in covered}, run.seam.new_id("m")
    st.messages = [replace(m, metadata={**m.metadata, "compacted_into": note_id}) if m.id in ids else m
                   for m in st.messages]
    text = note_text(body)
    after = before - sum(tokens.get(m.id) or estimate_message(m) for m in covered) + estimate_text(text)
    run.add("system", text, id=note_id, metadata={"kind": "compaction", "covers": [m.id for m in covered],
                                                   "tokens_before": before, "tokens_after": after,
                                                   "method": method})
    st.has_compaction = True
    if run.config.audit is not None:
        written = run.config.audit({"audit_id": run.seam.new_id("au"), "at": run.seam.stamp(),
                                    "action": "compaction", "decision": method, "run_id": st.run_id,
                                    "conversation_id": st.conversation_id, "realm": run.ctx.realm,
                                    "org_id": run.ctx.org_id, "note_id": note_id, "covers": sorted(ids),
                                    "tokens_before": before, "tokens_after": after, "trigger": trigger})
        if inspect.isawaitable(written):
            await written
    return [*run.drain(), run.event(CompactionEvent, summary_message_id=note_id, removed_messages=len(covered),
                                    tokens_before=before, tokens_after=after, trigger=trigger, method=method)]


async def compact_now(run: Run) -> list[Event]:
    """Compact the run's transcript now (`Agent.compact`, `POST …/compact`), whatever its size."""
    run.registry = run.config.registry or await run.tool_registry()
    settings = run.settings
    budget = effective_budget(settings.max_tokens_per_turn, run.config.model.context_window,
                              settings.max_output_tokens)
    st = run.state
    return await compact(run, "manual", budget, run.prompt.estimate(st, run.prompt.transcript(st),
                                                                     run.registry.tool_tokens))


async def summarise(run: Run, previous: Message | None, selected: Sequence[Message]) -> str:
    """One model request with no tools; blank output counts as a failure."""
    model = run.config.compaction_model or run.config.model
    asked = Message(id=run.seam.new_id("m"), role="user", content=render(previous, selected),
                    created_at=run.seam.stamp())
    request = ModelRequest([asked], SUMMARY_INSTRUCTIONS, (),
                           ModelSettings(0.0, None, run.settings.max_output_tokens))
    builder, clock = ResponseBuilder(run.new_call_id), run.seam.monotonic
    started = clock()
    async for chunk in run.config.steps.stream_model(model, request):
        builder.feed(chunk)
    run.record_usage(builder, prompt_tokens(request.instructions, request.messages, 0, {}),
                     (clock() - started) * 1000)
    if not builder.content.strip():
        raise RunError("empty_summary", "the summary request returned no text")
    return builder.content
