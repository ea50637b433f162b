"""Prices in USD per million tokens, to fill `cost_usd` (`loop-and-hooks.md` §7).

A model without a price gives `cost_usd: None`, never 0. Names match by longest prefix, so
`openai:gpt-4o-2024-08-06` takes the `openai:gpt-4o` price. Override or extend with
`Pricing({...})` or the `pricing:` key of an agent's config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ringlet.usage import RequestUsage


@dataclass(frozen=True, slots=True)
class Price:
    input: float
    output: float
    cache_read: float | None = None
    cache_write: float | None = None


DEFAULT_PRICES: dict[str, Price] = {
    "openai:gpt-4o-mini": Price(0.15, 0.60, 0.075),
    "openai:gpt-4o": Price(2.50, 10.00, 1.25),
    "openai:gpt-4.1-nano": Price(0.10, 0.40, 0.025),
    "openai:gpt-4.1-mini": Price(0.40, 1.60, 0.10),
    "openai:gpt-4.1": Price(2.00, 8.00, 0.50),
    "openai:o4-mini": Price(1.10, 4.40, 0.275),
    "openai:o3": Price(2.00, 8.00, 0.50),
    "anthropic:claude-opus-4": Price(15.00, 75.00, 1.50, 18.75),
    "anthropic:claude-sonnet-4": Price(3.00, 15.00, 0.30, 3.75),
    "anthropic:claude-3-7-sonnet": Price(3.00, 15.00, 0.30, 3.75),
    "anthropic:claude-3-5-haiku": Price(0.80, 4.00, 0.08, 1.00),
    "anthropic:claude-haiku-4": Price(1.00, 5.00, 0.10, 1.25),
    "gemini:gemini-2.5-pro": Price(1.25, 10.00, 0.31),
    "gemini:gemini-2.5-flash": Price(0.30, 2.50, 0.075),
    "gemini:gemini-2.0-flash": Price(0.10, 0.40, 0.025),
    "local:": Price(0.0, 0.0),  # in-process models cost nothing per token
}


class Pricing:
    """A price table; `cost(usage)` is None when the model has no price."""

    def __init__(self, overrides: Mapping[str, Price | Mapping[str, float]] | None = None,
                 *, base: Mapping[str, Price] = DEFAULT_PRICES) -> None:
        table = dict(base)
        for name, price in (overrides or {}).items():
            table[name] = price if isinstance(price, Price) else Price(**price)
        self._by_length = sorted(table.items(), key=lambda kv: -len(kv[0]))
        self._memo: dict[tuple[str, str], Price | None] = {}

    def price(self, provider: str, model: str) -> Price | None:
        key = (provider, model)
        if key not in self._memo:
            name = f"{provider}:{model}"
            self._memo[key] = next((p for prefix, p in self._by_length if name.startswith(prefix)), None)
        return self._memo[key]

    def cost(self, usage: RequestUsage) -> float | None:
        price = self.price(usage.provider or "", usage.model or "")
        if price is None:
            return None
        read, written = usage.cache_read_tokens or 0, usage.cache_write_tokens or 0
        total = (usage.in_tokens - read - written) * price.input + usage.out_tokens * price.output
        total += read * (price.cache_read if price.cache_read is not None else price.input)
        total += written * (price.cache_write if price.cache_write is not None else price.input)
        return total / 1_000_000


DEFAULT_PRICING = Pricing()
