"""`make run` until the CLI lands: a scripted agent that calls a tool, streamed to the terminal."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from ringlet import Agent, tool
from ringlet.models import TextDelta
from ringlet.testing import Chunks, ScriptedModel, call


@tool(effect="read")
def utc_time() -> str:
    """The current UTC time."""
    return datetime.now(UTC).strftime("%H:%M:%S UTC")


async def main() -> None:
    answer = Chunks([TextDelta("The time "), TextDelta("is in the tool result above.")])
    model = ScriptedModel([call("utc_time"), answer])
    agent = Agent(model, instructions="Answer briefly.", tools=[utc_time], name="demo")
    async for event in agent.stream("What time is it?"):
        match event.type:
            case "content_delta":
                print(event.delta, end="", flush=True)
            case "tool_call_start":
                print(f"→ {event.name}(", end="")
            case "tool_call_delta":
                print(event.args_delta, end="")
            case "tool_result":
                print(f") = {event.result or event.error}  [{event.duration_ms:.1f} ms]")
            case "message_end":
                usage = event.usage
                print(f"\n[{event.finish_reason}; tokens in {usage['in_tokens']}, out {usage['out_tokens']}]")


if __name__ == "__main__":
    asyncio.run(main())
