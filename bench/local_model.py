"""The embedded local model (SmolLM2-135M through llama.cpp) and ringlet's share of a run's wall time.

Prints medians of REPEATS runs:
- generation speed in tokens per second (llama.cpp's own token counts, 128-token completions);
- for an agent run with one tool round (a tool call, then the tool-less final answer): the wall time,
  the time spent inside the model's stream, and the share spent outside it (ringlet's overhead).

Run: `.venv/bin/python bench/local_model.py`
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import AsyncIterator
from typing import Any

from ringlet import Agent, Limits
from ringlet.models import ModelRequest
from ringlet.models.base import Chunk
from ringlet.models.local.model import LocalModel, _load, model_path
from ringlet.tools.builtin import calculate

REPEATS = 5


def tokens_per_second() -> float:
    llm = _load(model_path(None), 4096, "chatml-function-calling").llm
    messages: Any = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]
    started = time.perf_counter()
    response: Any = llm.create_chat_completion(messages=messages, max_tokens=128, temperature=0.7)
    elapsed = time.perf_counter() - started
    return response["usage"]["completion_tokens"] / elapsed


class Timed:
    """Wraps a model and adds up the wall time its streams take."""

    def __init__(self, inner: LocalModel) -> None:
        self.inner = inner
        self.seconds = 0.0

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def context_window(self) -> int:
        return self.inner.context_window

    async def stream(self, request: ModelRequest) -> AsyncIterator[Chunk]:
        started = time.perf_counter()
        try:
            async for chunk in self.inner.stream(request):
                yield chunk
        finally:
            self.seconds += time.perf_counter() - started


async def overhead() -> tuple[float, float, float]:
    model = Timed(LocalModel())
    agent = Agent(model, tools=[calculate], limits=Limits(max_iterations=1, terminal_tool=None),
                  instructions="Use the calculate tool for arithmetic.")
    started = time.perf_counter()
    await agent.run("What is 17 * 23?")
    total = time.perf_counter() - started
    return total, model.seconds, (total - model.seconds) / total


def main() -> None:
    tokens_per_second()  # load the model once, outside the measurement
    speeds = [tokens_per_second() for _ in range(REPEATS)]
    runs = [asyncio.run(overhead()) for _ in range(REPEATS)]
    total, inside, share = (statistics.median(r[i] for r in runs) for i in range(3))
    print(f"embedded model {model_path(None).name}, median of {REPEATS}")
    print(f"  generation speed                      {statistics.median(speeds):8.1f} tokens/s")
    print(f"  agent run with one tool round         {total * 1000:8.1f} ms wall")
    print(f"    of which inside the model           {inside * 1000:8.1f} ms")
    print(f"    ringlet's share (outside the model) {share * 100:8.2f} %  ({(total - inside) * 1000:.1f} ms)")


if __name__ == "__main__":
    main()
