"""Scheduling tools (`builtin-tools-and-subagents.md` §4): `alarm_clock`, `schedule_task`, `list_schedules`,
`update_schedule`, `remove_schedule`.

A schedule belongs to one conversation (and its org and realm). The tools reach storage only through
`RunContext.schedules`, a `ScheduleBook` bound to the run's conversation; the server gives every stored
conversation's run one, and a library caller passes one to `Agent.stream(schedules=...)`. The server wakes
a schedule when it is due (a durable wake-up per slot, `ringlet.server.firing.schedules`) and posts
`[scheduled] <message>` into the conversation.

When a schedule runs is computed by `schedule_timing` (pure functions of the schedule and a clock reading),
which the server's wake-ups share.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, Protocol

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import PydanticCustomError

from ringlet._ids import at as rfc3339
from ringlet.context import RunContext
from ringlet.errors import ToolFailure
from ringlet.tools.base import ArgumentsInvalid, Tool
from ringlet.tools.builtin.schedule_timing import (
    EXAMPLE_TIME,
    check_cron,
    cron_after,
    first_run,
    interval_s,
    invalid,
    parse_time,
    zone,
)
from ringlet.tools.function import format_validation_error

__all__ = ["SCHEDULE_TOOLS", "ScheduleBook", "ScheduleRecord"]

Kind = Literal["at", "interval", "cron"]
DEFAULT_ALARM = "Alarm: wake-up time reached."
MAX_PER_CONVERSATION = 20
TIMEOUT_S = 30.0
TIMING = ("kind", "at", "interval_minutes", "cron", "timezone")
"""The fields that decide when a schedule runs; changing one computes its next run again."""
VIEW = ("schedule_id", "kind", "spec", "message", "next_run_at", "runs", "status")
_PACE_SLOTS = 24
"""How many of a cron schedule's next slots its pace is judged on."""


class ScheduleRecord(Protocol):
    """A stored schedule, as the tools read it (`ringlet.store.records.Schedule` is one)."""

    schedule_id: str
    kind: str
    spec: dict[str, Any]
    message: str
    next_run_at: str | None
    runs: int
    status: str


class ScheduleBook(Protocol):
    """The schedules of one conversation, as the tools see them: every read and write is limited to the
    book's (org, realm, conversation); a schedule of any other is simply not there."""

    timezone: str
    """The default time zone of new schedules (the agent's, else UTC)."""
    max_active: int
    """At most this many active schedules per conversation (`scheduler_max_per_conversation`)."""
    min_interval_s: float
    """A repeating schedule may fire no more often than every this many seconds (0: any; the server's
    `min_schedule_interval_s`). A book without it allows any."""

    def now(self) -> float:
        """The clock (epoch seconds) that decides what is in the past."""
        ...

    async def create(self, kind: str, spec: dict[str, Any], message: str, next_run_at: str) -> ScheduleRecord | None:
        """Store a new active schedule; None when the conversation already has `max_active` active ones
        (ToolFailure for another limit it names)."""
        ...

    async def get(self, schedule_id: str) -> ScheduleRecord | None: ...

    async def list(self) -> Sequence[ScheduleRecord]: ...

    async def update(self, schedule_id: str, changes: Mapping[str, Any]) -> ScheduleRecord | None: ...

    async def remove(self, schedule_id: str) -> bool: ...

    async def count_active(self) -> int: ...


def _pydantic_check(check: Any) -> Any:
    """A validator that reports `check`'s ValueError as the field's error, without pydantic's prefix."""

    def run(value: str) -> str:
        try:
            check(value)
        except ValueError as exc:
            raise PydanticCustomError("invalid_value", "{reason}", {"reason": str(exc)}) from None
        return value

    return AfterValidator(run)


# -- arguments -----------------------------------------------------------------------------------------------

Rfc3339 = Annotated[str, _pydantic_check(parse_time)]
Zone = Annotated[str, _pydantic_check(zone)]
Cron = Annotated[str, _pydantic_check(check_cron)]
Minutes = Annotated[int, Field(ge=1)]


class _Arguments(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AlarmArguments(_Arguments):
    wake_at: Rfc3339
    message: Annotated[str, Field(min_length=1)] = DEFAULT_ALARM
    repeat_interval_minutes: Minutes | None = None


class TaskFields(_Arguments):
    """The fields of `schedule_task`, all optional (as `update_schedule` takes them)."""

    kind: Kind | None = None
    at: Rfc3339 | None = None
    interval_minutes: Minutes | None = None
    cron: Cron | None = None
    timezone: Zone | None = None
    message: Annotated[str, Field(min_length=1)] | None = None
    until: Rfc3339 | None = None
    max_runs: Minutes | None = None


class UpdateArguments(TaskFields):
    schedule_id: str


class ScheduleId(_Arguments):
    schedule_id: str


_REQUIRED: dict[str, str] = {"at": "at", "interval": "interval_minutes", "cron": "cron"}
_ALLOWED: dict[str, tuple[str, ...]] = {"at": ("at",), "interval": ("interval_minutes", "at"), "cron": ("cron",)}


def _kind_errors(fields: Mapping[str, Any]) -> list[str]:
    """What the kind requires and forbids: `at` needs `at`, `interval` needs `interval_minutes` (and may
    start at `at`), `cron` needs `cron`; a field of another kind is an error rather than ignored."""
    kind, errors = fields.get("kind"), []
    if kind is None:
        return ["kind: Field required (at, interval or cron)"]
    if fields.get("message") is None:
        errors.append("message: Field required (the text the agent is woken with)")
    if fields.get(_REQUIRED[kind]) is None:
        errors.append(f"{_REQUIRED[kind]}: Field required when kind is {kind!r}")
    owner = {"at": "at", "interval_minutes": "interval", "cron": "cron"}
    errors.extend(f"{name}: not used by kind {kind!r}; drop it or set kind to {owner[name]!r}"
                  for name in owner if fields.get(name) is not None and name not in _ALLOWED[kind])
    return errors


def _parsed(model: type[_Arguments], args: dict[str, Any]) -> Any:
    try:
        return model.model_validate(args)
    except ValidationError as exc:
        raise ArgumentsInvalid(format_validation_error(exc)) from None


def _validate_task(args: dict[str, Any]) -> dict[str, Any]:
    fields = _parsed(TaskFields, args).model_dump(exclude_none=True)
    errors = _kind_errors(fields)
    if errors:
        raise ArgumentsInvalid(errors)
    return fields


def _validator(model: type[_Arguments]) -> Any:
    return lambda args: _parsed(model, args).model_dump(exclude_none=True)


# -- the tools -------------------------------------------------------------------------------------------------


def _book(ctx: RunContext) -> ScheduleBook:
    book = ctx.schedules
    if book is None:
        raise ToolFailure("schedules_unavailable", "schedules need a conversation stored by the server (or a "
                          "schedule book given to Agent.stream(schedules=...)); this run has none")
    return book


def _spec(fields: Mapping[str, Any], book: ScheduleBook) -> dict[str, Any]:
    """The stored spec: the timing fields of the kind plus time zone, `until` and `max_runs`."""
    spec = {k: fields[k] for k in _ALLOWED[fields["kind"]] if fields.get(k) is not None}
    spec["timezone"] = fields.get("timezone") or book.timezone
    spec.update({k: fields[k] for k in ("until", "max_runs") if fields.get(k) is not None})
    return spec


def _view(record: ScheduleRecord) -> dict[str, Any]:
    return {k: getattr(record, k) for k in VIEW}


def _over_limit(book: ScheduleBook) -> ToolFailure:
    return invalid(f"this conversation already has {book.max_active} active schedules, the most it may have; "
                    "remove one with remove_schedule first")


def _check_pace(kind: str, spec: Mapping[str, Any], book: ScheduleBook) -> None:
    """A repeating schedule fires no more often than the book allows (`min_interval_s`)."""
    least = float(getattr(book, "min_interval_s", 0.0) or 0.0)
    if not least or kind == "at":
        return
    if kind == "interval":
        gap = interval_s(spec)
    else:  # the shortest gap among the next slots
        slots = [cron_after(spec["cron"], spec["timezone"], book.now())]
        for _ in range(_PACE_SLOTS):
            slots.append(cron_after(spec["cron"], spec["timezone"], slots[-1]))
        gap = min(b - a for a, b in itertools.pairwise(slots))
    if gap < least:
        raise invalid(f"this schedule would fire every {gap / 60:g} minutes; the server allows at most one fire "
                       f"every {least / 60:g} minutes per schedule (setting min_schedule_interval_s)")


async def _create(book: ScheduleBook, kind: str, spec: dict[str, Any], message: str) -> dict[str, Any]:
    _check_pace(kind, spec, book)
    first = first_run(kind, spec, book.now())
    made = await book.create(kind, spec, message, rfc3339(first))
    if made is None:
        raise _over_limit(book)
    return {"schedule_id": made.schedule_id, "next_run_at": made.next_run_at}


async def alarm_clock(args: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
    """Wake the agent at `wake_at`, once or every `repeat_interval_minutes` from then."""
    book = _book(ctx)
    if parse_time(args["wake_at"]) <= book.now():
        raise invalid(f"wake_at: {args['wake_at']} is in the past (it is now {rfc3339(book.now())}); give a "
                       "future time with its offset")
    repeat = args.get("repeat_interval_minutes")
    fields = {"kind": "interval" if repeat else "at", "at": args["wake_at"], "interval_minutes": repeat}
    return await _create(book, fields["kind"], _spec(fields, book), args["message"])


async def schedule_task(args: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
    """Schedule a message to the agent: once (`at`), every `interval_minutes`, or on a cron expression."""
    book = _book(ctx)
    return await _create(book, args["kind"], _spec(args, book), args["message"])


async def list_schedules(args: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
    """This conversation's schedules, active and done."""
    return {"schedules": [_view(r) for r in await _book(ctx).list()]}


async def _found(book: ScheduleBook, schedule_id: str) -> ScheduleRecord:
    record = await book.get(schedule_id)
    if record is None:
        raise ToolFailure("not_found", f"no schedule {schedule_id!r} in this conversation; list_schedules shows "
                          "the ones there are")
    return record


def _merged(current: ScheduleRecord, changes: Mapping[str, Any]) -> dict[str, Any]:
    """The schedule's fields after `changes`; a new kind drops the timing fields of the old one."""
    base = {"kind": current.kind, "message": current.message, **current.spec}
    if changes.get("kind", base["kind"]) != base["kind"]:
        base = {k: v for k, v in base.items() if k not in ("at", "interval_minutes", "cron")}
    return {**base, **changes}


async def _timing(book: ScheduleBook, current: ScheduleRecord, fields: dict[str, Any],
                  spec: dict[str, Any]) -> dict[str, Any]:
    """The timing changes of an update: a new first run when the timing changed (or a done schedule got
    new bounds), else the current next run, checked against the new `until` and `max_runs`."""
    old, new = {"kind": current.kind, **current.spec}, {"kind": fields["kind"], **spec}
    retimed = any(new.get(k) != old.get(k) for k in TIMING)
    bounds = any(spec.get(k) != old.get(k) for k in ("until", "max_runs"))
    if spec.get("max_runs") is not None and current.runs >= spec["max_runs"]:
        raise invalid(f"max_runs: the schedule has run {current.runs} times already; give more than that "
                       "or remove the schedule")
    if not (retimed or (bounds and current.status == "done")):
        if current.status == "active" and spec.get("until") and current.next_run_at and \
                parse_time(spec["until"]) < parse_time(current.next_run_at):
            raise invalid(f"until: {spec['until']} is before the next run at {current.next_run_at}")
        return {}
    _check_pace(fields["kind"], spec, book)
    first = first_run(fields["kind"], spec, book.now())
    if current.status != "active" and await book.count_active() >= book.max_active:
        raise _over_limit(book)
    return {"kind": fields["kind"], "next_run_at": rfc3339(first), "status": "active"}


async def update_schedule(args: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
    """Change a schedule's timing, message or bounds; its run count is kept."""
    book = _book(ctx)
    schedule_id = args["schedule_id"]
    current = await _found(book, schedule_id)
    fields = _merged(current, {k: v for k, v in args.items() if k != "schedule_id"})
    errors = _kind_errors(fields)
    if errors:
        raise invalid("; ".join(errors))
    spec = _spec(fields, book)
    changes = {"spec": spec, "message": fields["message"], **await _timing(book, current, fields, spec)}
    updated = await book.update(schedule_id, changes)
    if updated is None:  # removed meanwhile
        await _found(book, schedule_id)
    assert updated is not None
    return _view(updated)


async def remove_schedule(args: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
    """Delete a schedule; it never fires again."""
    if not await _book(ctx).remove(args["schedule_id"]):
        raise ToolFailure("not_found", f"no schedule {args['schedule_id']!r} in this conversation; "
                          "list_schedules shows the ones there are")
    return {"schedule_id": args["schedule_id"], "removed": True}


# -- definitions ---------------------------------------------------------------------------------------------

_TIME = {"type": "string", "format": "date-time",
         "description": f"RFC 3339 with its UTC offset, e.g. {EXAMPLE_TIME}; a time without an offset is refused."}
_MINUTES = {"type": "integer", "minimum": 1}
_TASK_PROPERTIES: dict[str, Any] = {
    "kind": {"type": "string", "enum": ["at", "interval", "cron"],
             "description": "at: once; interval: every interval_minutes; cron: on a cron expression."},
    "at": {**_TIME, "description": "kind at: when (RFC 3339 with offset). kind interval: the first run "
                                   "(default: one interval from now)."},
    "interval_minutes": {**_MINUTES, "description": "kind interval: minutes between runs (at least 1)."},
    "cron": {"type": "string", "description": "kind cron: a 5-field expression (minute hour day month weekday), "
                                              "read in `timezone`, e.g. '0 9 * * 1-5'."},
    "timezone": {"type": "string", "description": "IANA time zone for cron (default: the agent's, else UTC)."},
    "message": {"type": "string", "description": "The message the agent is woken with."},
    "until": {**_TIME, "description": "No run after this time (RFC 3339 with offset)."},
    "max_runs": {**_MINUTES, "description": "Stop after this many runs."},
}


def _object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def _tool(name: str, run: Any, validate: Any, description: str, parameters: dict[str, Any]) -> Tool:
    return Tool(name=name, description=description, parameters=parameters, run=run, validate=validate,
                effect="write", approval="auto", timeout_s=TIMEOUT_S)


def schedule_tools() -> list[Tool]:
    """The five scheduling tools (write, approval auto, 30 s)."""
    schedule_id = {"schedule_id": {"type": "string", "description": "The id schedule_task or alarm_clock gave."}}
    return [
        _tool("alarm_clock", alarm_clock, _validator(AlarmArguments),
              "Wake yourself up later: at `wake_at` you receive `[scheduled] <message>` in this conversation, "
              "once or every repeat_interval_minutes.",
              _object({"wake_at": {**_TIME, "description": "When to wake up (RFC 3339 with offset)."},
                       "message": {"type": "string", "default": DEFAULT_ALARM},
                       "repeat_interval_minutes": {**_MINUTES, "description": "Repeat every N minutes (>= 1)."}},
                      ["wake_at"])),
        _tool("schedule_task", schedule_task, _validate_task,
              "Schedule a message to yourself in this conversation: once, on an interval or on a cron expression.",
              _object(_TASK_PROPERTIES, ["kind", "message"])),
        _tool("list_schedules", list_schedules, _validator(_Arguments),
              "List this conversation's schedules with their next run, run count and status.", _object({}, [])),
        _tool("update_schedule", update_schedule, _validator(UpdateArguments),
              "Change a schedule: give its id and the schedule_task fields to change.",
              _object({**schedule_id, **_TASK_PROPERTIES}, ["schedule_id"])),
        _tool("remove_schedule", remove_schedule, _validator(ScheduleId), "Delete a schedule.",
              _object(schedule_id, ["schedule_id"])),
    ]


SCHEDULE_TOOLS: list[Tool] = schedule_tools()
