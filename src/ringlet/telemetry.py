"""Telemetry events for subscribers, and OpenTelemetry spans when an SDK is configured.

`emit(name, measurements, meta)` costs one truth test when nobody subscribed. Spans follow the
OpenTelemetry GenAI conventions (`invoke_agent`, `chat`, `execute_tool`) and are created only when the
OpenTelemetry SDK has been imported (an application that configured tracing has imported it); otherwise
`span()` returns a shared no-op context manager and OpenTelemetry is never imported.

Event names (`loop-and-hooks.md` §3): `ringlet.agent.complete`, `ringlet.agent.loop_iteration`,
`ringlet.agent.tool_call.start`, `ringlet.agent.tool_call.stop`, `ringlet.provider.retry`.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

log = logging.getLogger("ringlet.telemetry")

Subscriber = Callable[[str, Mapping[str, Any], Mapping[str, Any]], None]
_subscribers: list[Subscriber] = []


def subscribe(fn: Subscriber) -> Callable[[], None]:
    """Call `fn(name, measurements, meta)` for every telemetry event; returns the unsubscribe function."""
    _subscribers.append(fn)
    return lambda: _subscribers.remove(fn) if fn in _subscribers else None


def active() -> bool:
    """Whether anyone listens: check before building measurements that cost something."""
    return bool(_subscribers)


def emit(name: str, measurements: Mapping[str, Any], meta: Mapping[str, Any] | None = None) -> None:
    """Send one event to every subscriber. A failing subscriber is logged and never breaks a run."""
    for fn in tuple(_subscribers):
        try:
            fn(name, measurements, meta or {})
        except Exception:
            log.exception("telemetry subscriber %r failed on %s", fn, name)


_NOOP = contextlib.nullcontext()


def tracing_enabled() -> bool:
    """True once an OpenTelemetry SDK is loaded; spans cost nothing before that."""
    return "opentelemetry.sdk.trace" in sys.modules


def span(describe: Callable[[], tuple[str, Mapping[str, Any]]],
         parent: Any = None) -> contextlib.AbstractContextManager[Any]:
    """A span under `parent` (a span or None), or a shared no-op when tracing is off; `describe()` gives
    its name and attributes and runs only when tracing is on, so hot paths build nothing otherwise.

    The span is never made "current": runs are async generators, and a context attached across a
    `yield` would leak into the consumer. Children name their parent explicitly.
    """
    if not tracing_enabled():
        return _NOOP
    return _otel_span(*describe(), parent)


@contextlib.contextmanager
def _otel_span(name: str, attributes: Mapping[str, Any], parent: Any) -> Iterator[Any]:
    from opentelemetry import trace

    tracer = trace.get_tracer("ringlet")
    context = trace.set_span_in_context(parent) if parent is not None else None
    s = tracer.start_span(name, context=context,
                          attributes={k: v for k, v in attributes.items() if v is not None})
    try:
        yield s
    except BaseException as exc:
        s.record_exception(exc)
        s.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)))
        raise
    finally:
        s.end()
