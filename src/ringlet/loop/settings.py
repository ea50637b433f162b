"""The loop's limits and defaults (`loop-and-hooks.md` §8), validated once at agent construction."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ringlet.errors import ConfigError


class LoopSettings(BaseModel):
    """Every knob of the loop. Unknown keys and bad values are errors that name the key."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    max_iterations: int = Field(default=10, ge=1)
    on_max_iterations: Literal["answer", "error"] = "answer"
    max_blank_stops: int = Field(default=3, ge=1)
    blank_stop_nudge: str | None = None
    max_repeated_tool_errors: int = Field(default=3, ge=1)
    terminal_tool: str | None = "summary"
    max_tokens_per_turn: int = Field(default=32_000, ge=1)
    max_output_tokens: int | None = Field(default=None, ge=1)
    max_cost_usd_per_run: float | None = Field(default=None, gt=0)
    parallel_tools: bool = True
    max_tool_concurrency: int = Field(default=8, ge=1)
    batch_timeout_s: float = Field(default=120.0, gt=0)
    tool_result_max_chars: int = Field(default=32_000, ge=1)
    hook_timeout_s: float = Field(default=5.0, gt=0)
    strict_plugins: bool = False
    question_timeout_s: float | None = Field(default=None, gt=0)
    """How long an `ask_question` waits for its answer; None: as long as it takes."""
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    prompt_cache: bool = True
    """Mark cache points where the provider takes them (`ModelSettings`); False: none."""
    cache_points: tuple[Literal["tools", "system", "history"], ...] = ("tools", "system", "history")
    cache_key: str | None = None

    @classmethod
    def build(cls, **values: object) -> LoopSettings:
        """Validate `values`; a ConfigError names each bad key and what it must be."""
        if not values:
            return DEFAULT_SETTINGS
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise ConfigError(f"invalid agent settings: {problems}") from None


DEFAULT_SETTINGS = LoopSettings.model_construct()  # the defaults are valid: no schema is built at import
