"""Server settings: `ringlet serve` flags and `RINGLET_*` environment variables."""

from __future__ import annotations

import ipaddress
import logging
import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ringlet.errors import ConfigError

KEY_LIMITS: dict[str, int] = {"rate_limit_per_minute": 1200, "rate_limit_burst": 300, "max_streams_per_key": 200,
                              "max_runs_per_key": 50, "max_schedules_per_key": 100, "min_schedule_interval_s": 300}
"""The per-key limits' defaults with API keys (development mode has none unless set)."""


class RateLimit(BaseModel):
    """`limit` requests in any `period` seconds (a DBOS queue's `limiter`)."""

    model_config = ConfigDict(extra="forbid")

    limit: int = Field(ge=1)
    period: float = Field(gt=0)


_RATE = re.compile(r"\s*([A-Za-z0-9_.-]+)\s*=\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*([smh])\s*")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0}


def parse_rate_limits(raw: str) -> dict[str, RateLimit]:
    """`openai=10/1s,anthropic=50/60s` → each provider's limit (ConfigError naming the setting and the fix)."""
    limits: dict[str, RateLimit] = {}
    for item in (i for i in raw.split(",") if i.strip()):
        match = _RATE.fullmatch(item)
        if match is None or int(match[2]) < 1 or (match[3] is not None and float(match[3]) <= 0):
            raise ConfigError(f"RINGLET_PROVIDER_RATE_LIMITS: cannot read {item.strip()!r}; write "
                              "<provider>=<requests>/<period> with at least 1 request and a period in s, m or h, "
                              "comma-separated, e.g. openai=10/1s,anthropic=50/60s")
        if match[1] in limits:
            raise ConfigError(f"RINGLET_PROVIDER_RATE_LIMITS: provider {match[1]!r} is given twice; give each "
                              "provider one limit")
        limits[match[1]] = RateLimit(limit=int(match[2]), period=float(match[3] or 1) * _UNIT_S[match[4]])
    return limits


class ServerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    """The address to listen on (`--host`); `0.0.0.0` for every interface, which needs API keys."""
    port: int = Field(default=8000, ge=0, le=65535)
    """The port to listen on (`--port`)."""
    public_url: str | None = Field(default=None, pattern=r"^https?://[^\s/?#]+(/[^\s?#]*)?$")
    """The address clients reach this server at (`https://agents.example.com`, behind a proxy), used where the
    server names itself (the A2A agent card's endpoint). Default: the address the request arrived on, never
    the request's own `Host` header (which a client chooses)."""
    db_url: str | None = None
    """The store: `sqlite:///FILE` or `postgresql://user@host/db` (`--db`). Default: the SQLite file
    `~/.local/share/ringlet/ringlet.db`."""
    agents_dir: Path | None = None
    """The folder of agent directories to serve beside the built-in ones (`--agents`). Default
    `~/.config/ringlet/agents`."""
    evals_dir: Path | None = None
    """The folder of evaluation reports (`ringlet eval AGENT DATASET --json DIR/NAME.json`): `GET /api/v1/evals`
    and the web UI's Evals page list them, and `POST …/eval-case` with a `dataset` adds a case to a dataset
    file there (`RINGLET_EVALS_DIR`). Unset: no report is listed and no case is written."""
    auth_mode: Literal["key", "none"] = "key"
    """`key`: every request needs an API key (`ringlet keys create`). `none`: development mode, no keys,
    allowed only on a loopback address (`--auth none`, what `make run` uses)."""
    max_body_bytes: int = Field(default=1 << 20, ge=1024)
    """The largest request body accepted; a larger one is 413 `payload_too_large`."""
    events_retention_hours: float = Field(default=72, gt=0)
    """How long the event log (`GET …/events` replay) and, with the engine, DBOS's records of ended runs are
    kept."""
    events_commit_s: float | None = Field(default=None, ge=0, le=1)
    """Group commit of an answer's tokens: a token waits until this long after the previous commit began, so
    the tokens that come meanwhile share one commit (any other event is written at once, with them). Default:
    0.05 on PostgreSQL, where each commit is a round trip and a WAL flush; 0 on SQLite."""
    ping_interval_s: float = Field(default=15.0, gt=0)
    """How often an open SSE stream sends a `ping` event, so proxies keep it open."""
    run_lease_s: float = Field(default=30.0, gt=0)
    """A working run's lease; a run whose lease expires (its process died) is closed as interrupted."""
    continuation_ttl_s: float = Field(default=3600, gt=0)
    """How long a `/v1` run stopped on the client's own tool calls waits for their results before its
    transcript is dropped."""
    approval_mode: Literal["wait", "deny"] = "wait"
    """`wait`: a call that needs a human pauses its run until someone decides. `deny`: such calls are denied
    at once, for every agent."""
    misfire_grace_s: float = Field(default=300, ge=0)
    """A cron trigger's or schedule's fire later than this (its process busy, or no server running) is
    skipped and logged instead of run."""
    cron_refresh_s: float = Field(default=1.0, gt=0)
    """How often each process re-reads the cron triggers' schedules (DBOS's scheduler): a trigger created,
    changed or deleted in any process starts, changes or stops firing within this long."""
    fire_poll_s: float | None = Field(default=None, gt=0)
    """How often a process looks for fires to execute (cron slots, schedules' wake-ups, webhook fires); each
    look is a few queries. Default: on PostgreSQL, 10 s: a fire starts when it is enqueued (a trigger on
    DBOS's table notifies every process), and the look is the safety net for a notification lost with its
    connection. On SQLite (and with DBOS's tables in a database of their own), 1 s: a fire waits half of it
    on average before it starts its run."""
    scheduler_max_per_conversation: int = Field(default=20, ge=1)
    """At most this many active agent schedules (`alarm_clock`, `schedule_task`) per conversation."""
    sweep_interval_s: float = Field(default=60.0, gt=0)
    """How often each process deletes what is past `events_retention_hours` (events, run recordings and,
    with the engine, DBOS's records)."""
    graph_auto_resume: bool = True
    """At startup (and whenever a lease expires), resume interrupted graph runs from their checkpoints
    instead of closing them as interrupted (`POST /api/v1/runs/{id}/resume` resumes them by hand)."""
    model_dirs: list[str] = Field(default_factory=list)
    """Folders a `local:<path>.gguf` model named in a request's `overrides.model` may come from (the agent's
    `allowed_models` must allow it too); none: no `local:` path is accepted from a request."""
    auth_recheck_s: float = Field(default=5.0, gt=0)
    """An open event stream re-checks its key this often and closes once the key is revoked or expired."""
    policy_paths: list[str] = Field(default_factory=list)
    """Rego files or folders of `*.rego` files (`--policy`); none: every call is allowed."""
    policy_timezone: str = "UTC"
    """The time zone of the policies' `input.env` (`time_of_day`, `weekday`)."""
    policy_eval_timeout_ms: float = Field(default=250, gt=0)
    """The longest one policy evaluation may take; a slower one denies the call (the gate fails closed)."""
    policy_redact_keys: str = r"(?i)pass|secret|token|key|authorization"
    """A regular expression: arguments whose key matches it are stored as `"***"` in the audit log."""
    rate_limit_per_minute: float | None = Field(default=None, ge=0)
    """Requests a minute per API key, refilled continuously (a token bucket); past it, 429 `rate_limited`
    with `Retry-After`. 0: no limit. Default: 1,200 with API keys; none in development mode (`auth_mode:
    none`, loopback only), where a value set here applies to principal `local`. Counted in this process."""
    rate_limit_burst: int | None = Field(default=None, ge=1)
    """Requests a key may send at once before `rate_limit_per_minute` paces it (the bucket's size).
    Default: 300."""
    max_streams_per_key: int | None = Field(default=None, ge=0)
    """Open SSE streams per key (`…/messages`, `…/events`, streamed `/v1/chat/completions`); a further one
    gets 429 `rate_limited` until one closes. 0: no limit. Default: 200 with API keys, none in development
    mode. Counted in this process."""
    max_runs_per_key: int | None = Field(default=None, ge=0)
    """Active runs per key (a run paused for a human does not count); a further message gets 429
    `rate_limited` until one ends. Every run a key causes counts: a webhook fire counts against the key
    that fired it, a cron fire and a schedule's against the key that made the trigger or schedule, a
    resumed pause against the key that started the run; those wait their turn instead of being refused.
    0: no limit. Default: 50 with API keys, none in development mode. Counted across every process on
    PostgreSQL (the key's working runs in the database, as each run is stored); in this process on SQLite."""
    max_schedules_per_key: int | None = Field(default=None, ge=0)
    """Active agent schedules (`alarm_clock`, `schedule_task`) made under one key, across its conversations;
    a further one is a tool error naming this setting. 0: no limit. Default: 100 with API keys, none in
    development mode."""
    min_schedule_interval_s: float | None = Field(default=None, ge=0)
    """A repeating schedule made under a key fires at most once in this many seconds (an interval or cron
    schedule firing more often is a tool error). 0: no limit. Default: 300 with API keys, none in
    development mode."""

    engine: Literal["auto", "dbos", "local"] = "auto"
    """How runs execute. `dbos`: each run is a DBOS workflow, so any process on any machine sharing the
    PostgreSQL database executes it and a dead one's runs go on elsewhere (needs PostgreSQL). `local`: in
    the process that started it. `auto`: `dbos` on PostgreSQL, `local` on SQLite."""
    engine_url: str | None = None
    """DBOS's system database (`postgresql://…`); default: the store's database (its `dbos` schema)."""
    worker: bool = True
    """Whether this process executes runs (`ringlet serve --no-worker`: it only serves the API)."""
    worker_concurrency: int = Field(default=100, ge=1)
    """Runs one process executes at once (`engine: dbos`); more wait in the queue for a free worker."""
    queue_poll_s: float = Field(default=5.0, gt=0)
    """How often a worker looks for queued runs it was not told of (`engine: dbos`). A run starts when it is
    enqueued: the process that enqueues it takes it, or tells the others to (`NOTIFY`); this look is the
    safety net for a notification lost with its connection. Each look is a few queries."""
    heartbeat_s: float = Field(default=1.0, gt=0)
    """How often a process records that it lives (`engine: dbos`)."""
    worker_timeout_s: float = Field(default=5.0, gt=0)
    """A process silent this long is dead: a live one hands its runs on (`engine: dbos`)."""
    drain_s: float = Field(default=30.0, ge=0)
    """How long a stopping process (SIGTERM) drains: it answers `/readyz` 503 `draining` and refuses new
    requests with 503 and `Retry-After` (a load balancer sends them elsewhere), ends its event streams (their
    clients reconnect elsewhere with `Last-Event-ID`) and takes no more runs from the queue; the requests and
    runs in progress have this long to finish. Past it, the runs still executing go on in another worker
    (`engine: dbos`). Give the orchestrator's grace period (Kubernetes' `terminationGracePeriodSeconds`) a few
    seconds more."""
    max_concurrent_runs: int | None = Field(default=None, ge=0)
    """Runs executing at once across every process (`engine: dbos`: the run queue's global concurrency;
    set the same value in every process); more wait, `status: queued`. 0 or unset: no limit. Runs of an
    agent with its own `max_concurrent_runs` (config.yaml) are bounded by that instead."""
    provider_rate_limits: dict[str, RateLimit] = Field(default_factory=dict)
    """Model requests per period for each provider, across every process (`engine: dbos`, a DBOS queue
    with a rate limiter per provider): `openai=10/1s,anthropic=50/60s` (periods in s, m or h). A request
    over the limit waits for its turn. Default: none."""

    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    """Serve `/metrics` (Prometheus) on this port too, without a key, from prometheus-client's own server: what
    `ringlet worker` (no HTTP API) is scraped on (`--metrics-port`). Unset: only the API's `/metrics`, which
    needs a key with the `metrics` scope."""
    metrics_host: str = "127.0.0.1"
    """The address `metrics_port` listens on; set `0.0.0.0` where the scraper reaches it from another machine
    (a pod's IP), and no further."""
    log_format: Literal["text", "json"] = "text"
    """`json`: one JSON object a line (level, logger, message, time, and the run, conversation, realm and trace
    ids where known), for a log collector (`RINGLET_LOG_FORMAT`). Secrets and message contents never appear."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """The level of ringlet's own loggers; libraries' loggers (SQLAlchemy, DBOS, HTTP clients) log warnings
    and worse whatever this is, since some print statements' parameters."""

    @field_validator("log_level", mode="before")
    @classmethod
    def _level(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @field_validator("provider_rate_limits", mode="before")
    @classmethod
    def _rate_limits(cls, value: Any) -> Any:
        return parse_rate_limits(value) if isinstance(value, str) else value

    def durable(self, dialect: str) -> bool:
        """Whether runs are DBOS workflows with a store of `dialect` (ConfigError when that cannot be)."""
        postgres = dialect == "postgresql"
        if self.engine == "dbos" and not postgres:
            raise ConfigError("engine 'dbos' needs a PostgreSQL store (RINGLET_DB_URL=postgresql://…); with "
                              "SQLite use engine 'local' (one process executes every run)")
        durable = self.engine == "dbos" or (self.engine == "auto" and postgres)
        if not durable and self.provider_rate_limits:
            logging.getLogger("ringlet.server").warning(
                "RINGLET_PROVIDER_RATE_LIMITS is enforced with engine 'dbos' (PostgreSQL) only; with engine 'local' "
                "model requests are not paced (concurrency limits hold in process)")
        return durable

    def limit(self, name: str) -> int | float:
        """A per-key limit's effective value: the one set, else the default for the auth mode."""
        value = getattr(self, name)
        if value is not None:
            return value
        return KEY_LIMITS[name] if self.auth_mode == "key" or name == "rate_limit_burst" else 0

    @classmethod
    def from_env(cls, **given: object) -> ServerSettings:
        """Flags (`given`) win over the environment, where each setting is `RINGLET_<NAME>`
        (`RINGLET_AUTH_MODE`, `RINGLET_DB_URL`, `RINGLET_AGENTS_DIR`, `RINGLET_RUN_LEASE_S`, …)."""
        values = {k: v for k, v in given.items() if v is not None}
        for key, spec in cls.model_fields.items():
            var = f"RINGLET_{key.upper()}"
            if key not in values and os.environ.get(var):
                raw = os.environ[var]  # a list setting is comma-separated
                values[key] = [v.strip() for v in raw.split(",") if v.strip()] if spec.annotation == list[str] \
                    else raw
        return cls.model_validate(values)

    def check(self) -> None:
        """`auth_mode: none` only on a loopback address: anything else refuses to start."""
        if self.auth_mode == "none" and not is_loopback(self.host):
            raise ConfigError(f"auth mode 'none' is allowed only on a loopback address, not {self.host!r}; "
                              "bind to 127.0.0.1 or create an API key with `ringlet keys create`")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
