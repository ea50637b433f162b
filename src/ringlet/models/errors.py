"""Mapping provider failures onto the typed `ProviderError` classes (`loop-and-hooks.md` §6)."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping

from ringlet.errors import (
    AuthError,
    BadRequestError,
    ContextWindowError,
    NetworkError,
    OverloadedError,
    ProviderError,
    ProviderTimeoutError,
    RateLimitError,
    ServerError,
)
from ringlet.models.retry import retry_after

_CONTEXT_HINTS = ("context_length", "context length", "maximum context", "too many tokens", "prompt is too long",
                  "context window", "exceeds the context")


def from_status(status: int, message: str, *, provider: str, headers: Mapping[str, str] | None = None) -> ProviderError:
    """The error class for an HTTP status (and, for 400/503, what the message says)."""
    hint = retry_after(headers)
    lower = message.lower()
    cls: type[ProviderError]
    if status == 429:
        cls = RateLimitError
    elif status == 529 or (status == 503 and "overload" in lower):
        cls = OverloadedError
    elif status in (500, 502, 503, 504) or status >= 500:
        cls = ServerError
    elif status in (401, 403):
        cls = AuthError
    elif status in (400, 413, 422) and any(h in lower for h in _CONTEXT_HINTS):
        cls = ContextWindowError
    elif status == 408:
        cls = ProviderTimeoutError
    else:
        cls = BadRequestError
    return cls(f"{provider} returned {status}: {message}", status=status, retry_after_s=hint, provider=provider)


def network(message: str, *, provider: str) -> NetworkError:
    return NetworkError(f"{provider}: {message}", provider=provider)


def timeout(message: str, *, provider: str) -> ProviderTimeoutError:
    return ProviderTimeoutError(f"{provider}: {message}", provider=provider)


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Connection-level errors of whichever HTTP stacks the SDKs use (httpx, and httpx2 for newer SDKs; and
    aiohttp, which `google-genai` switches to whenever it is installed, as the `openai` extra now does)."""
    found = importlib.util.find_spec
    return (*(importlib.import_module(m).TransportError for m in ("httpx", "httpx2") if found(m) is not None),
            *((importlib.import_module("aiohttp").ClientError,) if found("aiohttp") is not None else ()))


TRANSPORT_ERRORS = _transport_errors()
