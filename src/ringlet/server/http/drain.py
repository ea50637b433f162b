"""A stopping process's drain (SIGTERM): it turns not-ready, refuses new requests, and lets what is in progress
finish within `drain_s` (`ServerSettings.drain_s`, `RINGLET_DRAIN_S`).

While an API process drains, `/readyz` answers 503 `draining` (a load balancer stops sending it requests), and
every request but the probes gets 503 `unavailable` with `Retry-After` (one already on its way goes to another
process when retried); its event streams are ended (`sse.close_all`: their clients reconnect to another process
with `Last-Event-ID` and miss nothing). A process that executes runs takes no more from the queue and waits
for the runs it executes (`Engine.drain`); those still executing at the deadline go on in another worker.
"""

from __future__ import annotations

import time

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from ringlet.server.http.errors import error_body

PROBES = frozenset({"/livez", "/healthz", "/readyz", "/metrics"})
"""What a draining process still answers: its orchestrator's probes (and its metrics)."""
RETRY_AFTER_S = 1


class Drain:
    """Whether this process drains, and until when (a monotonic deadline)."""

    def __init__(self) -> None:
        self.deadline: float | None = None

    @property
    def draining(self) -> bool:
        return self.deadline is not None

    def start(self, seconds: float) -> None:
        """Begin draining (once: a second signal keeps the first deadline)."""
        if self.deadline is None:
            self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        """Seconds left until the deadline (0 when past it, or when not draining)."""
        return 0.0 if self.deadline is None else max(0.0, self.deadline - time.monotonic())


class DrainMiddleware:
    """Refuse every request but the probes with 503 `unavailable` and `Retry-After` while the process drains."""

    def __init__(self, app: ASGIApp, drain: Drain) -> None:
        self.app, self.drain = app, drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.drain.draining or scope["path"] in PROBES:
            await self.app(scope, receive, send)
            return
        openai = scope["path"].startswith("/v1/")
        body = error_body(503, "unavailable", "this server is stopping; send the request again (another server "
                          f"takes it), after {RETRY_AFTER_S} s", openai=openai)
        headers = {"Retry-After": str(RETRY_AFTER_S), "Connection": "close"}
        if openai:
            headers["x-should-retry"] = "true"  # official OpenAI clients retry it
        await JSONResponse(body, 503, headers=headers)(scope, receive, send)
