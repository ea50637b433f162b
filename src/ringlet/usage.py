"""Token usage and cost, per model request and per run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class RequestUsage:
    """What one model request used (`loop-and-hooks.md` §7)."""

    provider: str | None = None
    model: str | None = None
    in_tokens: int = 0
    out_tokens: int = 0
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    reasoning_tokens: int | None = None
    estimated: bool = False
    cost_usd: float | None = None
    latency_ms: float | None = None
    attempts: int = 1

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (written out: `dataclasses.asdict` deep-copies and is slow on the hot path)."""
        return {"provider": self.provider, "model": self.model, "in_tokens": self.in_tokens,
                "out_tokens": self.out_tokens, "cache_read_tokens": self.cache_read_tokens,
                "cache_write_tokens": self.cache_write_tokens, "reasoning_tokens": self.reasoning_tokens,
                "estimated": self.estimated, "cost_usd": self.cost_usd, "latency_ms": self.latency_ms,
                "attempts": self.attempts}


@dataclass(slots=True)
class Usage:
    """Totals over every request of a run (or a conversation). `cost_usd` is None while any price is unknown."""

    in_tokens: int = 0
    out_tokens: int = 0
    cost_usd: float | None = None
    requests: int = 0
    estimated: bool = False
    cache_read_tokens: int = 0
    """Of `in_tokens`, those read from the provider's prompt cache (priced at its cached rate)."""
    cache_write_tokens: int = 0
    """Of `in_tokens`, those written to it (Anthropic prices these above plain input)."""

    def add(self, req: RequestUsage | Usage) -> None:
        """Add one request's usage (or another total) in place."""
        first = self.requests == 0
        self.in_tokens += req.in_tokens
        self.out_tokens += req.out_tokens
        self.cache_read_tokens += req.cache_read_tokens or 0
        self.cache_write_tokens += req.cache_write_tokens or 0
        self.requests += req.requests if isinstance(req, Usage) else 1
        self.estimated = self.estimated or req.estimated
        if first:
            self.cost_usd = req.cost_usd
        elif self.cost_usd is not None and req.cost_usd is not None:
            self.cost_usd += req.cost_usd
        else:
            self.cost_usd = None

    def summary(self) -> dict[str, int | float | None]:
        """The `{in_tokens, out_tokens, cost_usd}` shape of `message_end.usage`, with `cache_read_tokens` and
        `cache_write_tokens` when the provider's prompt cache took part."""
        out: dict[str, int | float | None] = {"in_tokens": self.in_tokens, "out_tokens": self.out_tokens,
                                              "cost_usd": self.cost_usd}
        return out | self._cached()

    def as_dict(self) -> dict[str, int | float | bool | None]:
        return {"in_tokens": self.in_tokens, "out_tokens": self.out_tokens, "cost_usd": self.cost_usd,
                "requests": self.requests, "estimated": self.estimated, **self._cached()}

    def _cached(self) -> dict[str, int]:
        if not (self.cache_read_tokens or self.cache_write_tokens):
            return {}
        return {"cache_read_tokens": self.cache_read_tokens, "cache_write_tokens": self.cache_write_tokens}
