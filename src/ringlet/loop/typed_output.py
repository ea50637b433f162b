"""Typed output in the loop (`ringlet.output`): the final-result tool, an answer given as text, and the
retries a result that does not validate gets (`output_retries`) before the run fails with
`output_validation_failed`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from typing import Any

from ringlet.errors import RunError
from ringlet.events import ContentDeltaEvent, Event
from ringlet.loop.next_step import CallModel, End, Step
from ringlet.loop.run import Run
from ringlet.loop.terminal import BUILT_IN
from ringlet.loop.tools import Outcome, error_outcome
from ringlet.messages import Message, ToolCall
from ringlet.output import Output, OutputInvalid


def output_call(run: Run, calls: Sequence[ToolCall]) -> ToolCall | None:
    """The batch's call to the final-result tool, if it has one."""
    output = run.config.output
    if output is None or output.mode != "tool":
        return None
    route = run.registry.routes.get(output.name)
    if route is None or route[0] is not BUILT_IN:
        return None
    return next((c for c in calls if c.name == output.name), None)


async def check_call(run: Run, call: ToolCall) -> OutputInvalid | None:
    """Validate the call's result (the output validators too): None when it holds (the run's output is
    set), else the problem to tell the model."""
    output = run.config.output
    assert output is not None
    try:
        value = await output.checked(output.from_arguments(dict(call.arguments)), run.ctx)
    except OutputInvalid as exc:
        return exc
    keep(run, output, value)
    return None


def invalid_call(run: Run, call: ToolCall, problem: OutputInvalid) -> Outcome:
    output = run.config.output
    assert output is not None
    return error_outcome(call, "invalid_output", output.retry_text(problem.message))


async def call_answer(run: Run, call: ToolCall, calls: Sequence[ToolCall]) -> AsyncGenerator[Event | Step, None]:
    """The result is valid: the batch's other calls are skipped, its JSON is the answer, the run ends."""
    output = run.config.output
    assert output is not None
    for c in calls:
        outcome = (Outcome(c, '{"success":true}', params=dict(call.arguments)) if c.id == call.id else
                   error_outcome(c, "skipped", f"run ended by {call.name}"))
        yield run.settled(await run.tools.finish(outcome))
    run.append_results(calls)
    text = output.dump(run.output_value)
    message_id = run.seam.new_id("m")
    yield run.event(ContentDeltaEvent, message_id=message_id, delta=text)
    run.add("assistant", text, id=message_id, metadata={"output": call.name})
    yield End("end_turn", "completed")


async def text_output(run: Run, message: Message, *, final: bool = False) -> tuple[list[Event], Step]:
    """An answer given as text: its JSON is the result (native and prompted modes, and tool mode's
    tool-less final request); tool mode otherwise asks for the tool."""
    output = run.config.output
    assert output is not None
    if output.mode == "tool" and not final:
        return retry(run, OutputInvalid(f"Plain text is not accepted as the answer: call `{output.name}` with the "
                                        "result."))
    try:
        value = await output.checked(output.from_text(message.text), run.ctx)
    except OutputInvalid as exc:
        return retry(run, exc, final=final)
    keep(run, output, value)
    return [], End("end_turn", "completed")


def retry(run: Run, problem: OutputInvalid, *, final: bool = False, told: bool = False) -> tuple[list[Event], Step]:
    """Another try with the problem told to the model (`told`: a tool result already says it), or, once
    `output_retries` are spent, the run fails with `output_validation_failed`."""
    output, st = run.config.output, run.state
    assert output is not None
    st.output_retries += 1
    if final or st.output_retries > output.retries:
        return [], End("error", "failed", RunError(
            "output_validation_failed", f"the model's result did not validate after {st.output_retries} "
            f"tries: {problem.message}", details={"problem": problem.message, "errors": problem.errors,
                                                  "tries": st.output_retries}))
    if not told:
        run.add("user", output.retry_text(problem.message), metadata={"output_retry": True})
    return [], CallModel()


def keep(run: Run, output: Output, value: Any) -> None:
    run.output_value = value
    run.state.output = output.jsonable(value)
