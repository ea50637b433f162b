"""The model round (`loop-and-hooks.md` §1): build the prompt, stream one request, classify the response.

`model_round(run, step)` yields the events of the round, then its next step: tool calls → `RunTools`, an
answer → `End` (or another round, if a hook asks), a blank → `CallModel` again (or the fixed answer).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from typing import Any

from ringlet import telemetry
from ringlet.errors import ContextWindowError, ProviderError, RunError
from ringlet.events import (
    ContentDeltaEvent,
    Event,
    FinishReason,
    NotificationEvent,
    ToolCallDeltaEvent,
    ToolCallStartEvent,
)
from ringlet.hooks.plugin import PrePromptContext, ResponseCompleteContext, ResponseUpdateContext
from ringlet.loop.compact import compact
from ringlet.loop.next_step import CallModel, End, RunTools, Step, final_end, next_round
from ringlet.loop.prompt import effective_budget
from ringlet.loop.response import ResponseBuilder
from ringlet.loop.run import EMPTY_ANSWER_SENTENCE, STEP_LIMIT_SENTENCE, Run
from ringlet.loop.typed_output import text_output
from ringlet.messages import Message
from ringlet.models.base import ModelRequest
from ringlet.models.tokens import breakdown, prompt_tokens
from ringlet.usage import RequestUsage

log = logging.getLogger("ringlet.loop")

FINAL_NOTES = {
    "max_iterations": "The tool budget for this run is spent: no more tools can be called. Answer the user "
                      "now with what you have, and say what is missing.",
    "repeated_error": "Tool calls keep failing with the same error, so tools are switched off. Explain the "
                      "failure to the user and what they could do about it.",
}


async def model_round(run: Run, step: CallModel) -> AsyncGenerator[Event | Step, None]:
    """Build the prompt, stream one request, then classify the response."""
    events, request, prompt_size = await prepare(run, step)
    for ev in events:
        yield ev
    if request is None:
        yield End("cancelled", "canceled")
        return
    message_id = run.state.response_id if run.last_message_id is None else run.seam.new_id("m")
    builder = ResponseBuilder(run.new_call_id)
    hooks, model, clock = run.config.hooks, run.config.model, run.seam.monotonic
    updates = hooks.has("response_update")
    run.state.requests += 1
    started = clock()
    chunks = run.config.steps.stream_model(model, request)
    if run.guard is not None and (gate := run.guard.output(message_id)) is not None:
        chunks = gate.checked(chunks)  # the answer's text is sent once the output guardrails pass it
    try:
        with telemetry.span(lambda: (f"chat {model.name}", {"gen_ai.operation.name": "chat",
                                                               "gen_ai.request.model": model.name}), run.span):
            async for chunk in chunks:
                out = builder.feed(chunk)
                if out is None:
                    continue
                yield chunk_event(run, out, message_id)
                if updates:
                    partial = Message(id=message_id, role="assistant", content=builder.content,
                                      metadata={"is_complete": False}, created_at=run.seam.stamp())
                    await hooks.fire("response_update", ResponseUpdateContext(run.ctx, message=partial))
                    for ev in run.drain():
                        yield ev
    except ProviderError as exc:
        events, next_step = await stream_failed(run, exc, step, builder, message_id=message_id,
                                              prompt_size=prompt_size)
    else:
        usage = run.record_usage(builder, prompt_size, (clock() - started) * 1000)
        events, next_step = await classify(run, step, builder, message_id, usage)
    finally:  # a cancelled run closes the provider's stream (and its connection) at once
        if (close := getattr(chunks, "aclose", None)) is not None:
            await close()
    for ev in events:
        yield ev
    yield next_step


async def prepare(run: Run, step: CallModel) -> tuple[list[Event], ModelRequest | None, int]:
    """The next request: duration filter, compaction, context notes, pre_prompt hooks, budget and cost
    checks. Returns the events to emit, the request (None if a plugin cancelled the run) and its tokens."""
    st, hooks, parts, settings, events = run.state, run.config.hooks, run.prompt, run.settings, []
    tools = () if step.final else run.registry.definitions
    tool_tokens = 0 if step.final else run.registry.tool_tokens
    budget = effective_budget(settings.max_tokens_per_turn, run.config.model.context_window,
                              settings.max_output_tokens)
    prompt = parts.transcript(st)
    total = parts.estimate(st, prompt, tool_tokens)
    compaction = run.config.compaction
    if compaction is not None and not step.final and total > compaction.threshold * budget:
        events = await compact(run, "threshold", budget, total)
        prompt = parts.transcript(st)
        total = parts.estimate(st, prompt, tool_tokens)
    if parts.notes:  # the context notes of this run, after the instructions, before the transcript
        prompt = [*parts.notes, *prompt]
    instructions = parts.instructions
    if hooks.has("pre_prompt"):
        tokens = breakdown(instructions, prompt, tool_tokens, cache=parts.tokens)
        pre = PrePromptContext(run.ctx, messages=prompt, instructions=instructions, round=st.requests + 1,
                               token_breakdown=tokens, tools=tools, budget=budget)
        await hooks.fire("pre_prompt", pre)
        if pre.cancel_reason is not None:
            run.ctx.notify("info", "run cancelled by a plugin", pre.cancel_reason, source=pre.source)
            return [*events, *run.drain()], None, 0
        events = [*events, *run.drain()]
        prompt, instructions = [*pre.examples, *pre.messages], pre.instructions
        total = prompt_tokens(instructions, prompt, tool_tokens, parts.tokens)
    if total > budget:
        raise RunError("context_budget_exceeded", f"the prompt needs about {total} tokens, more than "
                       f"the budget of {budget}", details={"tokens": total, "budget": budget})
    limit = settings.max_cost_usd_per_run
    if limit is not None and (st.usage.cost_usd or 0.0) >= limit:
        raise RunError("cost_limit_exceeded", f"this run has cost ${st.usage.cost_usd:.4f}, reaching the "
                       f"limit of ${limit}", details={"cost_usd": st.usage.cost_usd, "limit": limit})
    output = run.config.output
    if step.final:  # the note joins the instructions: a trailing system message confuses small models
        note = FINAL_NOTES[step.final]
        if output is not None and output.mode == "tool":  # no tools now: the result comes as text
            note = f"{note}\n\n{output.hint()}"
        instructions = f"{instructions}\n\n{note}" if instructions else note
    native = output.format if output is not None and output.mode == "native" else None
    return events, ModelRequest(prompt, instructions, tools, parts.settings, native), total


def chunk_event(run: Run, out: tuple[str, Any], message_id: str) -> Event:
    kind, payload = out
    if kind == "text":
        return run.event(ContentDeltaEvent, message_id=message_id, delta=payload)
    if kind == "retry":
        return run.event(NotificationEvent, level="warning", title="model request failed",
                         message=f"{payload.reason}; retrying in {payload.delay_s:.1f} s "
                                 f"(attempt {payload.attempt + 1})", source=run.config.model.name)
    if kind == "switch":
        return run.event(NotificationEvent, level="warning", title="model fallback",
                         message=f"{payload.reason}; {payload.model} answers now", source=payload.model)
    if kind == "call_start":
        call_id, name, index = payload
        route = run.registry.routes.get(name)
        return run.event(ToolCallStartEvent, tool_call_id=call_id, name=name, index=index,
                         connector=route[1].connector if route else None)
    return run.event(ToolCallDeltaEvent, tool_call_id=payload[0], args_delta=payload[1])


async def stream_failed(run: Run, exc: ProviderError, step: CallModel, builder: ResponseBuilder, *,
                        message_id: str, prompt_size: int) -> tuple[list[Event], Step]:
    """A failed request: never replayed once output was sent; the final request falls back; a prompt too
    long for the model is compacted once and sent again."""
    if builder.emitted:
        run.add("assistant", builder.content, id=message_id,
                metadata={"interrupted": True, "model": builder.model or run.config.model.name})
        raise RunError("stream_interrupted", f"the model's stream broke after output was sent: "
                       f"{exc.message}", details={"provider": exc.provider, "status": exc.status}) from exc
    if step.final:
        return fallback_answer(run, message_id, step.final)
    if isinstance(exc, ContextWindowError):
        if run.config.compaction is not None and not run.window_compacted:
            run.window_compacted = True
            window = run.config.model.context_window or prompt_size
            events = await compact(run, "context_window", min(window, prompt_size), prompt_size)
            if events:
                return events, CallModel(step.final)
        raise RunError("context_window", exc.message, details={"status": exc.status}) from exc
    raise exc


async def classify(run: Run, step: CallModel, builder: ResponseBuilder, message_id: str,
                   usage: RequestUsage) -> tuple[list[Event], Step]:
    """Tool calls → run them; text → answer; blank → retry in place (or give up)."""
    st, text, calls = run.state, builder.content, builder.tool_calls()
    meta: dict[str, Any] = {"model": builder.model or run.config.model.name,
                            "finish_reason": builder.finish_reason, "usage": usage.as_dict()}
    if step.final:
        return await final_answer(run, step.final, text, message_id, meta)
    if not calls and not text.strip():
        st.blank_finish_reasons.append(builder.finish_reason)
        attempts = len(st.blank_finish_reasons)
        if attempts >= run.settings.max_blank_stops:
            return empty_answer(run, message_id, meta)
        if run.settings.blank_stop_nudge:
            run.add("user", run.settings.blank_stop_nudge, metadata={"duration": 1})
        return [], CallModel()
    if st.blank_finish_reasons:
        meta["blank_stop_retries"] = len(st.blank_finish_reasons)
        st.blank_finish_reasons = []
    message = run.add("assistant", text, id=message_id, tool_calls=tuple(calls), metadata=meta)
    if usage.estimated:  # the same count the next prompt would make of this message
        run.prompt.tokens[message.id] = usage.out_tokens
    if calls:
        return [], RunTools(message)
    return await (text_answer(run, message) if run.config.output is None else text_output(run, message))


async def final_answer(run: Run, final: str, text: str, message_id: str,
                       meta: dict[str, Any]) -> tuple[list[Event], Step]:
    """The answer of the tool-less final request (a blank one falls back)."""
    if not text.strip():
        return fallback_answer(run, message_id, final)
    message = run.add("assistant", text, id=message_id, metadata=meta)
    if run.config.output is not None:  # the result as text, or the run fails: no more tries
        return await text_output(run, message, final=True)
    return [], final_end(final, run.state, run.settings)


async def text_answer(run: Run, message: Message) -> tuple[list[Event], Step]:
    """response_complete may ask for another round (`self`) or hand over to a human."""
    hooks, st = run.config.hooks, run.state
    ended: FinishReason = "length" if message.metadata.get("finish_reason") == "length" else "end_turn"
    if not hooks.has("response_complete"):  # an answer cut at the model's token cap ends `length`
        return [], End(ended, "completed")
    done = ResponseCompleteContext(run.ctx, message=message)
    await hooks.fire("response_complete", done)
    events = run.drain()
    if done.actions.next_round == "human":
        return events, End("end_turn", "input_required")
    if done.actions.next_round == "self":
        if done.actions.new_user_message:
            run.add("user", done.actions.new_user_message)
        st.iteration += 1
        return events, next_round(st, run.settings)
    return events, End(ended, "completed")


def fallback_answer(run: Run, message_id: str, final: str) -> tuple[list[Event], Step]:
    """The final request failed or was blank: answer with the last assistant text, or a fixed sentence."""
    previous = next((m.text for m in reversed(run.state.messages) if m.role == "assistant" and m.text.strip()),
                    None)
    text = previous or STEP_LIMIT_SENTENCE
    run.add("assistant", text, id=message_id, metadata={"fallback": True})
    return ([run.event(ContentDeltaEvent, message_id=message_id, delta=text)],
            final_end(final, run.state, run.settings))


def empty_answer(run: Run, message_id: str, meta: dict[str, Any]) -> tuple[list[Event], Step]:
    """The model stayed blank `max_blank_stops` times in a row. Saying nothing is model behaviour, not a
    failure: the run completes with a fixed answer and finish_reason `empty_response`; the message's
    `metadata.empty_response` says what happened."""
    st = run.state
    provider, model = run.provider_model
    details = {"iteration": st.iteration, "attempts": len(st.blank_finish_reasons), "provider": provider,
               "model": model, "finish_reasons": st.blank_finish_reasons}
    st.blank_finish_reasons = []
    log.warning("run %s: the model returned %d blank responses in a row", st.run_id, details["attempts"])
    run.add("assistant", EMPTY_ANSWER_SENTENCE, id=message_id,
            metadata={**meta, "fallback": True, "empty_response": details})
    return ([run.event(ContentDeltaEvent, message_id=message_id, delta=EMPTY_ANSWER_SENTENCE)],
            End("empty_response", "completed"))
