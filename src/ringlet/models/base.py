"""The `Model` protocol and the stream chunks every provider adapter produces."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from ringlet.messages import Message, ToolDefinition
from ringlet.output import ResponseFormat
from ringlet.usage import RequestUsage


@dataclass(slots=True)
class TextDelta:
    """A piece of assistant text, as the provider produced it."""

    text: str


@dataclass(slots=True)
class ToolCallStart:
    """The start of tool call number `index` in this response. `id` may be None; the loop assigns one."""

    index: int
    name: str
    id: str | None = None


@dataclass(slots=True)
class ToolCallArgsDelta:
    """More of the raw JSON arguments of tool call `index`."""

    index: int
    delta: str


@dataclass(slots=True)
class Finish:
    """The end of a response: the provider's finish reason and its usage, when it reported them."""

    finish_reason: str | None = None
    usage: RequestUsage | None = None


@dataclass(slots=True)
class Retrying:
    """The retry layer is about to wait `delay_s` and try again (attempt `attempt`); nothing was emitted."""

    attempt: int
    delay_s: float
    reason: str


@dataclass(slots=True)
class ModelSwitch:
    """A fallback model (`FallbackModel`) answers from here on: `model` is its name, `reason` says which model
    failed and how; nothing was emitted by the failed one."""

    model: str
    reason: str


Chunk = TextDelta | ToolCallStart | ToolCallArgsDelta | Finish | Retrying | ModelSwitch


CachePoint = Literal["tools", "system", "history"]
"""Where a prompt-caching provider may cache the prompt up to: the tool list, the system prompt, the
transcript so far (its last turn: each request reads what the one before it wrote)."""
CACHE_POINTS: tuple[CachePoint, ...] = ("tools", "system", "history")


@dataclass(frozen=True, slots=True)
class ModelSettings:
    """How the model samples (`Agent(model_settings=...)`, per run too); None leaves the provider's default.
    `max_tokens` caps each response (it counts against the prompt budget).

    Prompt caching (on by default where a provider charges less for cached input): `prompt_cache=False`
    turns it off; `cache_points` chooses where Anthropic's `cache_control` marks go (at most these three);
    `cache_key` is OpenAI's `prompt_cache_key` (default: one derived from the instructions and tools, sent
    to OpenAI's own endpoint only; a key you set is sent to any OpenAI-compatible server)."""

    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    prompt_cache: bool = True
    cache_points: tuple[CachePoint, ...] = CACHE_POINTS
    cache_key: str | None = None


@dataclass(slots=True)
class ModelRequest:
    """Everything one model request sends: instructions, the filtered transcript and the tools offered."""

    messages: Sequence[Message]
    instructions: str | None = None
    tools: Sequence[ToolDefinition] = ()
    settings: ModelSettings = field(default_factory=ModelSettings)
    output: ResponseFormat | None = None
    """Native structured output: the answer's text must be JSON matching `output.schema`."""


def merge_turns(turns: Iterable[tuple[str, list[Any]]], key: str) -> list[dict[str, Any]]:
    """Consecutive turns of one role as one turn (`{"role": r, key: items}`), for APIs that want roles to
    alternate (Anthropic, Gemini): several tool results after one call become one user turn."""
    out: list[dict[str, Any]] = []
    for role, items in turns:
        if out and out[-1]["role"] == role:
            out[-1][key].extend(items)
        else:
            out.append({"role": role, key: list(items)})
    return out


@runtime_checkable
class Model(Protocol):
    """A chat model. `stream()` yields chunks and ends with `Finish`; failures raise `ProviderError`s."""

    @property
    def name(self) -> str:
        """`provider:model`, as written in config and on the command line."""
        ...

    @property
    def context_window(self) -> int | None:
        """The model's context window in tokens, when known."""
        ...

    def stream(self, request: ModelRequest) -> AsyncIterator[Chunk]: ...
