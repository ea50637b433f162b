"""Fallback models: when a provider keeps failing, the next model answers instead.

`FallbackModel(primary, *others)` tries its models in order. It moves on only on failures the retry layer
did not cure (server errors, overload, rate limits past their cap, timeouts, network errors) and on a
prompt too long for a model, to the first later model with a larger known context window. It never moves
on once a model's output reached the consumer, and it says when it switches with a `ModelSwitch` chunk.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from ringlet.errors import (
    ContextWindowError,
    NetworkError,
    OverloadedError,
    ProviderError,
    ProviderTimeoutError,
    RateLimitError,
    ServerError,
)
from ringlet.models.base import Chunk, Model, ModelRequest, ModelSwitch, TextDelta, ToolCallStart

FALLBACK_ERRORS: tuple[type[ProviderError], ...] = (
    ServerError, OverloadedError, RateLimitError, ProviderTimeoutError, NetworkError)
"""The failures that move a request on to the next model (besides a context window that is too small)."""


class FallbackModel:
    """Tries `primary`, then each of `others`, on provider failures retrying did not cure. Its `name` and
    `context_window` are the primary's, so pricing, metadata and logs keep working."""

    def __init__(self, primary: Model, *others: Model) -> None:
        self.models: tuple[Model, ...] = (primary, *others)

    @property
    def name(self) -> str:
        return self.models[0].name

    @property
    def context_window(self) -> int | None:
        return self.models[0].context_window

    def __repr__(self) -> str:
        return f"FallbackModel({', '.join(m.name for m in self.models)})"

    async def stream(self, request: ModelRequest) -> AsyncIterator[Chunk]:
        """The first model's stream; on a failure before any output, a `ModelSwitch` and the next one's."""
        index = 0
        while True:
            model, emitted = self.models[index], False
            stream = model.stream(request)
            try:
                async for chunk in stream:
                    emitted = emitted or _is_output(chunk)
                    yield chunk
            except ProviderError as exc:
                following = None if emitted else self.next_model(index, exc)
                if following is None:
                    raise
                yield ModelSwitch(self.models[following].name,
                                  f"{model.name} failed with {type(exc).__name__}: {exc.message}")
                index = following
            else:
                return
            finally:  # close the failed model's stream (and its connection) before the next one starts
                if (close := getattr(stream, "aclose", None)) is not None:
                    await close()

    def next_model(self, index: int, exc: ProviderError) -> int | None:
        """The index of the model to try after model `index` failed with `exc`, or None to raise it."""
        if isinstance(exc, ContextWindowError):
            window = self.models[index].context_window
            if window is None:
                return None
            return next((i for i in range(index + 1, len(self.models))
                         if (w := self.models[i].context_window) is not None and w > window), None)
        if isinstance(exc, FALLBACK_ERRORS) and index + 1 < len(self.models):
            return index + 1
        return None


def _is_output(chunk: Chunk) -> bool:
    """Whether the consumer has seen output once this chunk passed: text, or the start of a tool call."""
    return (isinstance(chunk, TextDelta) and bool(chunk.text)) or isinstance(chunk, ToolCallStart)
