"""The one retry layer (`loop-and-hooks.md` §6): exponential backoff with full jitter, server hints,
and never a replay of a stream the consumer has already seen.

Vendor SDK clients are built with their own retries off; every provider stream is wrapped here once
(`RetryingModel`), and nothing above retries the same error again.
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace

from ringlet import telemetry
from ringlet.errors import ProviderError
from ringlet.models.base import Chunk, Finish, Model, ModelRequest, Retrying

Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Defaults: 3 retries (4 attempts), 1 s initial delay, ×2, 30 s cap; server hints capped at 60 s."""

    max_retries: int = 3
    initial_delay_s: float = 1.0
    multiplier: float = 2.0
    max_delay_s: float = 30.0
    retry_after_cap_s: float = 60.0
    jitter: Callable[[float, float], float] = field(default=random.uniform, repr=False)
    sleep: Sleep = field(default=asyncio.sleep, repr=False)

    def delay(self, retry: int, error: ProviderError) -> float:
        """Seconds to wait before retry number `retry` (0-based)."""
        if error.retry_after_s is not None:
            return min(max(error.retry_after_s, 0.0), self.retry_after_cap_s)
        return self.jitter(0.0, min(self.max_delay_s, self.initial_delay_s * self.multiplier**retry))


def retry_after(headers: Mapping[str, str] | None, *, now: float | None = None) -> float | None:
    """The server's hint in seconds: `retry-after-ms`, or `Retry-After` as seconds or an HTTP-date."""
    if not headers:
        return None
    lower = {k.lower(): v for k, v in headers.items()}
    if (ms := lower.get("retry-after-ms")) is not None:
        try:
            return float(ms) / 1000
        except ValueError:
            pass
    value = lower.get("retry-after")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None
    return max(0.0, when - (time.time() if now is None else now))


async def stream_with_retry(start: Callable[[], AsyncIterator[Chunk]], policy: RetryPolicy,
                            provider: str) -> AsyncIterator[Chunk]:
    """Run `start()`; retry retryable errors while nothing has reached the consumer."""
    retry = 0
    while True:
        emitted = False
        stream = start()
        try:
            async for chunk in stream:
                if isinstance(chunk, Finish):
                    yield Finish(chunk.finish_reason, chunk.usage and replace(chunk.usage, attempts=retry + 1))
                    continue
                emitted = True
                yield chunk
        except ProviderError as exc:
            if emitted or not exc.retryable or retry >= policy.max_retries:
                raise
            delay = policy.delay(retry, exc)
            telemetry.emit("ringlet.provider.retry", {"attempt": retry + 1, "delay_ms": round(delay * 1000)},
                           {"error_class": type(exc).__name__, "status": exc.status, "provider": provider})
            yield Retrying(retry + 1, delay, f"{type(exc).__name__}: {exc.message}")
            await policy.sleep(delay)
            retry += 1
        else:
            return
        finally:  # close the provider's stream (and its connection) however this attempt ended
            if (close := getattr(stream, "aclose", None)) is not None:
                await close()


class RetryingModel:
    """Wraps a provider model with the retry layer."""

    def __init__(self, model: Model, policy: RetryPolicy | None = None) -> None:
        self.inner = model
        self.policy = policy or RetryPolicy()

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def context_window(self) -> int | None:
        return self.inner.context_window

    def stream(self, request: ModelRequest) -> AsyncIterator[Chunk]:
        return stream_with_retry(lambda: self.inner.stream(request), self.policy, self.name.partition(":")[0])
