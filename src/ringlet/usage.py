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

    def add(self, req: RequestUsage | Usage) -> None:
        """Add one request's usage (or another total) in place."""
        first = self.requests == 0
        self.in_tokens += req.in_tokens
        self.out_tokens += req.out_tokens
        self.requests += req.requests if isinstance(req, Usage) else 1
        self.estimated = self.estimated or req.estimated
        if first:
            self.cost_usd = req.cost_usd
        elif self.cost_usd is not None and req.cost_usd is not None:
            self.cost_usd += req.cost_usd
        else:
            self.cost_usd = None

    def summary(self) -> dict[str, int | float | None]:
        """The `{in_tokens, out_tokens, cost_usd}` shape of `message_end.usage`."""
        return {"in_tokens": self.in_tokens, "out_tokens": self.out_tokens, "cost_usd": self.cost_usd}

    def as_dict(self) -> dict[str, int | float | bool | None]:
        return {"in_tokens": self.in_tokens, "out_tokens": self.out_tokens, "cost_usd": self.cost_usd,
                "requests": self.requests, "estimated": self.estimated}
