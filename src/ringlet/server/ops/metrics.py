"""Prometheus metrics of one process (`/metrics`), on the official `prometheus-client`.

Each app has its own `CollectorRegistry` (never the library's global one), so several apps in one process, as
in the tests, do not clash. What happens in this process is counted as it happens, from ringlet's telemetry
events (`ringlet.telemetry`: a run's record started or ended, a model request, a tool call, a batch of the
event log written, dead processes' runs recovered) and from the HTTP layer (`Middleware`). What is a fact of
the whole cluster (runs in flight, queue depth, pauses waiting) is read from the store and DBOS when scraped
(`ClusterCollector`, `status.read`): every process reports the same value, so alert on `max`, not `sum`.

Labels stay bounded: agent, outcome, model, tool, route template, queue. Never a conversation or run id.
`METRICS` lists every metric; the docs' reference page is generated from it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ringlet import telemetry
from ringlet.server.ops import status

log = logging.getLogger("ringlet.server")

Kind = Literal["counter", "histogram", "gauge"]


@dataclass(frozen=True, slots=True)
class MetricSpec:
    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    scraped: bool = False
    """A cluster fact, read from the store or DBOS when scraped (the same value from every process)."""


METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("ringlet_runs_started_total", "counter", "Runs started (their records created) in this process.",
               ("agent", "kind")),
    MetricSpec("ringlet_runs_ended_total", "counter", "Runs ended (their end recorded) in this process, by "
               "outcome: completed, failed or canceled.", ("agent", "outcome")),
    MetricSpec("ringlet_runs_in_flight", "gauge", "Runs working across the cluster (executing, or queued for a "
               "worker).", scraped=True),
    MetricSpec("ringlet_queue_depth", "gauge", "Runs waiting in a queue for a worker (DBOS queues; `local`: "
               "waiting for a slot in this process).", ("queue",), scraped=True),
    MetricSpec("ringlet_queue_oldest_age_seconds", "gauge", "How long the oldest run waiting in a queue has "
               "waited (0: none waits).", ("queue",), scraped=True),
    MetricSpec("ringlet_pauses_waiting", "gauge", "Approvals and questions waiting for a human.", scraped=True),
    MetricSpec("ringlet_pause_oldest_age_seconds", "gauge", "How long the oldest pause has waited (0: none "
               "waits).", scraped=True),
    MetricSpec("ringlet_model_request_seconds", "histogram", "Model requests' latency, from the request to "
               "the end of its stream.", ("model",)),
    MetricSpec("ringlet_model_tokens_total", "counter", "Tokens of model requests (`direction`: in or out; "
               "estimated where the provider reports none).", ("model", "direction")),
    MetricSpec("ringlet_model_cost_usd_total", "counter", "What model requests cost, in US dollars (requests "
               "of unknown price add nothing).", ("model",)),
    MetricSpec("ringlet_tool_call_seconds", "histogram", "Tool calls' latency.", ("tool",)),
    MetricSpec("ringlet_tool_call_errors_total", "counter", "Tool calls that ended in an error.", ("tool",)),
    MetricSpec("ringlet_open_streams", "gauge", "SSE streams open in this process."),
    MetricSpec("ringlet_http_request_seconds", "histogram", "HTTP requests' latency until the response starts "
               "(a stream's headers), by route template.", ("method", "route", "status")),
    MetricSpec("ringlet_run_recoveries_total", "counter", "Runs of dead processes recovered: handed on to a "
               "live worker (`dbos`) or closed or resumed here (`local`).", ("engine",)),
    MetricSpec("ringlet_event_log_write_seconds", "histogram", "Commits of the event log (a group commit "
               "writes a batch of events)."),
)

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_FAST = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def _spec(name: str) -> MetricSpec:
    return next(m for m in METRICS if m.name == name)


class Metrics:
    """This app's registry and instruments; `watch()` counts this process's telemetry into them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._instruments: dict[str, Any] = {}
        for spec in METRICS:
            if spec.scraped or spec.kind == "gauge":
                continue
            name = spec.name.removesuffix("_total") if spec.kind == "counter" else spec.name
            if spec.kind == "counter":
                self._instruments[spec.name] = Counter(name, spec.help, spec.labels, registry=self.registry)
            else:
                buckets = _FAST if spec.name.startswith(("ringlet_event_log", "ringlet_http")) else _LATENCY
                self._instruments[spec.name] = Histogram(name, spec.help, spec.labels, registry=self.registry,
                                                         buckets=buckets)
        self.cluster = ClusterCollector()
        self.registry.register(self.cluster)

    def get(self, name: str) -> Any:
        return self._instruments[name]

    def watching(self, state: Any) -> Coroutine[Any, Any, None]:
        """Count this process's telemetry from now on, and scrape the cluster's facts from `state` (its
        AppState), for as long as the coroutine returned runs (the app's task, cancelled as it stops)."""
        self.cluster.state, self.cluster.loop = state, asyncio.get_running_loop()
        unsubscribe = telemetry.subscribe(self.observe)

        async def held() -> None:
            try:
                await asyncio.Future()
            finally:
                unsubscribe()
                self.cluster.state = None

        return held()

    def observe(self, name: str, measured: Mapping[str, Any], meta: Mapping[str, Any]) -> None:
        """One telemetry event (`telemetry.subscribe`): what it measures, into the instruments."""
        handler = _HANDLERS.get(name)
        if handler is not None:
            handler(self, measured, meta)

    def http(self, method: str, route: str, code: int, seconds: float) -> None:
        self._instruments["ringlet_http_request_seconds"].labels(method, route, str(code)).observe(seconds)


def _run_started(m: Metrics, _: Mapping[str, Any], meta: Mapping[str, Any]) -> None:
    m.get("ringlet_runs_started_total").labels(meta.get("agent", ""), meta.get("kind", "loop")).inc()


def _run_ended(m: Metrics, _: Mapping[str, Any], meta: Mapping[str, Any]) -> None:
    m.get("ringlet_runs_ended_total").labels(meta.get("agent", ""), meta.get("outcome", "")).inc()


def _model_request(m: Metrics, measured: Mapping[str, Any], meta: Mapping[str, Any]) -> None:
    model = meta.get("model") or ""
    m.get("ringlet_model_request_seconds").labels(model).observe((measured.get("latency_ms") or 0) / 1000)
    tokens = m.get("ringlet_model_tokens_total")
    tokens.labels(model, "in").inc(measured.get("in_tokens") or 0)
    tokens.labels(model, "out").inc(measured.get("out_tokens") or 0)
    if measured.get("cost_usd"):
        m.get("ringlet_model_cost_usd_total").labels(model).inc(measured["cost_usd"])


def _tool_call(m: Metrics, measured: Mapping[str, Any], meta: Mapping[str, Any]) -> None:
    tool = meta.get("tool_name") or ""
    m.get("ringlet_tool_call_seconds").labels(tool).observe((measured.get("duration_us") or 0) / 1e6)
    if not meta.get("success", True):
        m.get("ringlet_tool_call_errors_total").labels(tool).inc()


def _recovered(m: Metrics, measured: Mapping[str, Any], meta: Mapping[str, Any]) -> None:
    m.get("ringlet_run_recoveries_total").labels(meta.get("engine", "")).inc(measured.get("runs") or 0)


def _events_written(m: Metrics, measured: Mapping[str, Any], _: Mapping[str, Any]) -> None:
    m.get("ringlet_event_log_write_seconds").observe(measured.get("seconds") or 0.0)


_HANDLERS: dict[str, Callable[[Metrics, Mapping[str, Any], Mapping[str, Any]], None]] = {
    "ringlet.run.start": _run_started,
    "ringlet.run.end": _run_ended,
    "ringlet.model.request": _model_request,
    "ringlet.agent.tool_call.stop": _tool_call,
    "ringlet.run.recovered": _recovered,
    "ringlet.events.write": _events_written,
}


class ClusterCollector(Collector):
    """The gauges read when scraped: the cluster's facts (`status.read`) and this process's open streams.
    A scrape on the app's event loop (`/metrics`) reads them first (`refresh`); one from another thread
    (the metrics port's server) asks the loop to, and waits up to `TIMEOUT_S`."""

    TIMEOUT_S = 10.0

    def __init__(self) -> None:
        self.state: Any = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.latest: status.ClusterStatus | None = None
        self._lock = threading.Lock()

    async def refresh(self) -> None:
        state = self.state
        if state is None:
            self.latest = None
            return
        try:
            self.latest = await status.read(state.store, queues=await queues_of(state))
        except Exception as exc:  # a scrape that cannot reach the store still reports this process's counts
            log.warning("metrics: could not read the cluster's status: %s", exc)
            self.latest = None

    def collect(self) -> Iterator[Metric]:
        loop = self.loop
        if loop is not None and self.state is not None and not _on(loop):
            with self._lock:
                try:
                    asyncio.run_coroutine_threadsafe(self.refresh(), loop).result(self.TIMEOUT_S)
                except Exception as exc:
                    log.warning("metrics: the cluster's status was not read in time: %s", exc)
        from ringlet.server.http import sse

        yield GaugeMetricFamily("ringlet_open_streams", _spec("ringlet_open_streams").help, sse.open_streams())
        latest = self.latest
        if latest is None:
            return
        for name, value in (("ringlet_runs_in_flight", latest.runs_in_flight),
                            ("ringlet_pauses_waiting", latest.pauses_waiting),
                            ("ringlet_pause_oldest_age_seconds", latest.oldest_pause_s or 0.0)):
            yield GaugeMetricFamily(name, _spec(name).help, value)
        depth = GaugeMetricFamily("ringlet_queue_depth", _spec("ringlet_queue_depth").help, labels=["queue"])
        age = GaugeMetricFamily("ringlet_queue_oldest_age_seconds", _spec("ringlet_queue_oldest_age_seconds").help,
                                labels=["queue"])
        for queue in latest.queues:
            depth.add_metric([queue.name], queue.depth)
            age.add_metric([queue.name], queue.oldest_s or 0.0)
        yield depth
        yield age


def _on(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


async def queues_of(state: Any) -> list[status.QueueDepth]:
    """The queues this process can see: DBOS's when runs are on the engine, else its own waiting runs."""
    return await state.runner.here.executor.queues()


