"""When a schedule runs (`builtin-tools-and-subagents.md` §4): pure functions of the schedule and a clock
reading, so the scheduling tools, the server's wake-ups (`ringlet.server.firing.schedules`) and the tests
share them:

    first_run(kind, spec, now)              the first run of a new (or changed) schedule
    next_run(kind, spec, due, now)          the first slot strictly after `now`: a late schedule never
                                            fires several times to catch up
    latest_run(kind, spec, due, now)        the most recent slot at or before `now`: how late a fire is
    after_fire(kind, spec, due, now, runs)  `next_run` ended by `until` and `max_runs` (None: done)

Times are RFC 3339 with an offset, never guessed. Cron expressions are read as wall-clock times in the
schedule's time zone: a local time that occurs twice (the autumn change) fires once, at its first
occurrence, and one that does not exist (the spring change) fires at the same distance after the gap.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ringlet._ids import at as rfc3339
from ringlet.errors import ToolFailure

__all__ = ["EXAMPLE_TIME", "after_fire", "check_cron", "cron_after", "cron_before", "first_run", "interval_s",
           "invalid", "latest_run", "next_run", "parse_time", "zone"]

_CRON_STEPS = 2_000  # candidates skipped at most around a clock change (every minute of a repeated hour)
EXAMPLE_TIME = "2026-05-01T09:00:00+02:00"
"""How an RFC 3339 time is written, for error messages and tool descriptions."""


def parse_time(value: str) -> float:
    """Epoch seconds of an RFC 3339 date-time with an offset; ValueError (saying the fix) otherwise."""
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        raise ValueError(f"{value!r} is not an RFC 3339 date-time; write it like {EXAMPLE_TIME}") from None
    if moment.tzinfo is None:
        raise ValueError(f"{value!r} has no UTC offset; add one (Z or +02:00, e.g. {EXAMPLE_TIME}): times are "
                         "never guessed")
    return moment.timestamp()


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {name!r}; use an IANA name such as 'UTC' or 'Europe/Paris'") from None


def _croniter() -> Any:
    try:
        from croniter import croniter
    except ImportError:  # pragma: no cover - croniter comes with the server extra
        raise ToolFailure("tool_error", "cron schedules need the croniter package: pip install 'ringlet[server]'")\
            from None
    return croniter


def check_cron(expression: str) -> None:
    if len(expression.split()) != 5 or not _croniter().is_valid(expression):
        raise ValueError(f"{expression!r} is not a standard 5-field cron expression (minute hour day month "
                         "weekday), e.g. '0 9 * * 1-5'")


def cron_after(expression: str, timezone: str, after: float) -> float:
    """The first time strictly after `after` at which the wall-clock cron expression fires in `timezone`."""
    tz = zone(timezone)
    wall = datetime.fromtimestamp(after, tz).replace(tzinfo=None, fold=0)
    slots = _croniter()(expression, wall)
    for _ in range(_CRON_STEPS):
        instant = slots.get_next(datetime).replace(tzinfo=tz).timestamp()
        if instant > after:
            return instant
    raise ValueError(f"cron {expression!r} does not fire after {rfc3339(after)}")  # pragma: no cover


def cron_before(expression: str, timezone: str, until: float) -> float:
    """The last time at or before `until` at which the cron expression fired in `timezone`."""
    tz = zone(timezone)
    wall = datetime.fromtimestamp(until, tz).replace(tzinfo=None, fold=0) + timedelta(microseconds=1)
    slots = _croniter()(expression, wall)
    for _ in range(_CRON_STEPS):
        instant = slots.get_prev(datetime).replace(tzinfo=tz).timestamp()
        if instant <= until:
            return instant
    raise ValueError(f"cron {expression!r} never fired before {rfc3339(until)}")  # pragma: no cover


# -- when a schedule runs (pure) ----------------------------------------------------------------------------


def invalid(message: str) -> ToolFailure:
    """An `invalid_arguments` failure the model reads (a time in the past, a cron that never fires, …)."""
    return ToolFailure("invalid_arguments", message, errors=[message])


def interval_s(spec: Mapping[str, Any]) -> float:
    """An interval schedule's step, in seconds."""
    return float(spec["interval_minutes"]) * 60.0


def next_run(kind: str, spec: Mapping[str, Any], due: float, now: float) -> float | None:
    """The schedule's first slot strictly after `now`, given that `due` was a slot; None for `at`."""
    if kind == "at":
        return None
    if kind == "interval":
        step = interval_s(spec)
        return due + (math.floor((now - due) / step) + 1) * step if now >= due else due
    return cron_after(spec["cron"], spec["timezone"], max(now, due))


def latest_run(kind: str, spec: Mapping[str, Any], due: float, now: float) -> float:
    """The most recent slot in [`due`, `now`] (and not after `until`): a missed fire is as late as the
    last slot it missed, so `now - latest_run(...)` is what the misfire grace is compared with."""
    horizon = min(now, parse_time(spec["until"])) if spec.get("until") else now
    if kind == "at" or horizon <= due:
        return due
    if kind == "interval":
        step = interval_s(spec)
        return due + math.floor((horizon - due) / step) * step
    return max(due, cron_before(spec["cron"], spec["timezone"], horizon))


def after_fire(kind: str, spec: Mapping[str, Any], due: float, now: float, runs: int) -> float | None:
    """The next run after a fire (or a skipped fire) at `now`; None when the schedule is done: an `at`
    schedule, `runs` reached `max_runs`, or the next slot is after `until`."""
    max_runs = spec.get("max_runs")
    if max_runs is not None and runs >= max_runs:
        return None
    upcoming = next_run(kind, spec, due, now)
    if upcoming is not None and spec.get("until") and upcoming > parse_time(spec["until"]):
        return None
    return upcoming


def first_run(kind: str, spec: Mapping[str, Any], now: float) -> float:
    """The first run of a new or changed schedule; `invalid_arguments` for a time in the past, a cron
    expression that never fires, or an `until` before the first run."""
    if kind == "at":
        first = parse_time(spec["at"])
        if first <= now:
            raise invalid(f"at: {spec['at']} is in the past (it is now {rfc3339(now)}); give a future time")
    elif kind == "interval":
        start = parse_time(spec["at"]) if spec.get("at") else now + interval_s(spec)
        first = start if start > now else next_run(kind, spec, start, now) or start
    else:
        try:
            first = cron_after(spec["cron"], spec["timezone"], now)
        except ValueError:
            raise invalid(f"cron: {spec['cron']!r} never matches a date; check the day and month fields") from None
    if spec.get("until") and parse_time(spec["until"]) < first:
        raise invalid(f"until: {spec['until']} is before the first run at {rfc3339(first)}; give a later "
                       "until or an earlier start")
    return first
