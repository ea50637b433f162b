"""Logs for a collector: one JSON object a line (`RINGLET_LOG_FORMAT=json`), with the run's ids wherever a run
is known.

    {"time": "2026-11-29T08:00:00.123Z", "level": "WARNING", "logger": "ringlet.server", "message": "…",
     "run_id": "run_…", "conversation_id": "c_…", "realm": "default", "trace_id": "…"}

A run binds its ids (`bound`) while its loop executes, in whatever process and task executes it; any log line
written meanwhile carries them. Secrets never appear: what looks like an API key, a bearer token or a stream
token is masked in every line (`redact`), whatever logged it; and message contents are never logged by
ringlet, while libraries' loggers, some of which print their statements' parameters, log warnings and worse
only (`configure`).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import re
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

run_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("ringlet_run_id", default=None)
conversation_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("ringlet_conversation_id",
                                                                             default=None)
realm: contextvars.ContextVar[str | None] = contextvars.ContextVar("ringlet_realm", default=None)
trace_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("ringlet_trace_id", default=None)
FIELDS: dict[str, contextvars.ContextVar[Any]] = {
    "run_id": run_id, "conversation_id": conversation_id, "realm": realm, "trace_id": trace_id}
"""The context every JSON line carries when set; the server adds its `request_id`."""

_SECRETS = re.compile(
    r"(?i)(bearer\s+|authorization[\"']?\s*[:=]\s*[\"']?(?:bearer\s+)?|[?&](?:token|stream_token|key|api_key)=)[^\s\"'&,;]+"
    r"|\b(?:rk|sk|st)[-_][A-Za-z0-9_-]{8,}")
_OWN = ("ringlet",)


def redact(text: str) -> str:
    """`text` with every API key, bearer token and token query parameter masked."""
    return _SECRETS.sub(lambda m: f"{m[1]}***" if m[1] else "***", text)


@contextlib.contextmanager
def bound(run: str, conversation: str | None = None, where: str | None = None, span: Any = None) -> Iterator[None]:
    """Log lines written inside carry the run's ids (and its trace id, when `span` is a recording span)."""
    tokens = [(run_id, run_id.set(run)), (conversation_id, conversation_id.set(conversation)),
              (realm, realm.set(where))]
    context = getattr(span, "get_span_context", None)
    if context is not None:
        tokens.append((trace_id, trace_id.set(format(context().trace_id, "032x"))))
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            with contextlib.suppress(ValueError):  # an async generator closed from another context
                var.reset(token)


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, the bound ids, and the exception if any."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname, "logger": record.name, "message": redact(record.getMessage())}
        for name, var in FIELDS.items():
            value = var.get()
            if value:
                line[name] = value
        if record.exc_info:
            line["exception"] = redact(self.formatException(record.exc_info))
        return json.dumps(line, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """The usual `LEVEL: message` line, secrets masked."""

    def __init__(self) -> None:
        super().__init__("%(levelname)s:     %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def configure(form: str = "text", level: str = "INFO") -> logging.Handler:
    """Send every log line to stderr in `form` (`text` or `json`): ringlet's loggers at `level`, libraries'
    at WARNING or worse (SQLAlchemy, aiosqlite and others print statements with their parameters at INFO and
    DEBUG: a message's text, a key's hash). Replaces the root logger's handlers; returns the new one."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if form == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    numeric = logging.getLevelName(level.upper())
    root.setLevel(max(numeric, logging.WARNING))
    for name in _OWN:
        logging.getLogger(name).setLevel(numeric)
    for name in ("uvicorn", "uvicorn.error"):  # its startup lines (where it listens) are worth keeping
        logging.getLogger(name).setLevel(max(numeric, logging.INFO))
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    return handler
