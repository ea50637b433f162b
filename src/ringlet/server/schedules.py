"""The firing loop of agents' schedules (`builtin-tools-and-subagents.md` §4, `alarm_clock` / `schedule_task`).

`ScheduleFirer.tick()` reads the due schedules at `clock()` and claims each fire with a compare-and-set on
its `next_run_at` (`Schedules.claim`), so one process wins each fire however many poll. A won fire posts
`[scheduled] <message>` (`metadata.source = "schedule"`, `schedule_id`, `fire_count`) into the schedule's
conversation as its creator, on the `schedule` channel; a conversation with an active run gets it when
that run ends. The rules for late fires:

- a fire is as late as the last slot it missed; no later than `misfire_grace_s`, it runs once, else it is
  skipped and logged (a fire missed while the server was down: `catch_up()` at startup);
- the next run is the first slot after now, so a late interval or cron schedule never fires several times;
- `max_runs` and `until` end a schedule (status `done`); an `at` schedule is done once it fired or was skipped;
- a schedule whose previous fire has not finished yet skips the fire (no two fires of one schedule at once);
- a deleted conversation's schedules are removed instead of fired.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from ringlet._ids import at
from ringlet.messages import Message
from ringlet.server.auth import Principal
from ringlet.server.errors import ApiError
from ringlet.server.runs import Runner
from ringlet.server.triggers import Poller
from ringlet.tools.schedules import after_fire, latest_run, parse_time

log = logging.getLogger("ringlet.server")
BUSY = ("running", "input_required")
"""Conversation statuses of a run that `Runner.start` cannot wait for in this process."""


def principal_of(schedule: dict[str, Any]) -> Principal:
    """Who a fire runs as: the schedule's creator, in its org, limited to its realm and agent."""
    sid = schedule["schedule_id"]
    return Principal(key_id=f"schedule:{sid}", user_id=schedule["created_by"] or f"schedule:{sid}",
                     org_id=schedule["org_id"] or "default", roles=(), scopes=frozenset({"chat"}),
                     realms=frozenset({schedule["realm"]}), agents=frozenset({schedule["agent"]}))


def prompt_of(schedule: dict[str, Any], fire_count: int) -> Message:
    """The message a fire posts: the schedule's text marked as coming from the schedule."""
    return Message.user(f"[scheduled] {schedule['message']}", source="schedule",
                        schedule_id=schedule["schedule_id"], fire_count=fire_count)


class ScheduleFirer(Poller):
    """Fires due agent schedules; `clock` is the time it fires by (tests pass a controllable one)."""

    what = "schedule firer"

    def __init__(self, runner: Runner, clock: Callable[[], float] = time.time) -> None:
        self.runner = runner
        self.clock = clock
        self.firing: set[str] = set()
        """Schedules whose fire is queued or running in this process."""

    async def tick(self) -> list[asyncio.Task[None]]:
        """Claim and start the fires due at `clock()`; returns their tasks (each ends when its run has)."""
        current, started = self.clock(), []
        for schedule in await self.runner.store.schedules.due(at(current)):
            task = await self._claim(schedule, current)
            if task is not None:
                started.append(task)
        return started

    async def _claim(self, schedule: dict[str, Any], current: float) -> asyncio.Task[None] | None:
        """Move the schedule past this fire; the fire's task when this process won it and it runs."""
        store, sid = self.runner.store, schedule["schedule_id"]
        if await store.get_conversation(schedule["conversation_id"]) is None:
            removed = await store.schedules.remove_conversation(schedule["conversation_id"])
            log.info("conversation %s is gone: removed its %d schedule(s)", schedule["conversation_id"], removed)
            return None
        kind, spec, due = schedule["kind"], schedule["spec"], parse_time(schedule["next_run_at"])
        late = current - latest_run(kind, spec, due, current)
        grace = self.runner.settings.misfire_grace_s
        run = late <= grace and sid not in self.firing
        runs = schedule["runs"] + (1 if run else 0)
        upcoming = after_fire(kind, spec, due, current, runs)
        if not await store.schedules.claim(sid, schedule["next_run_at"], at(upcoming) if upcoming is not None
                                           else None, fired=run):
            return None  # another process claimed this fire, or the schedule changed meanwhile
        if not run:
            log.warning("schedule %s: skipped the fire due at %s (%s)", sid, schedule["next_run_at"],
                        f"{late:.0f} s late, over the {grace:.0f} s grace" if late > grace
                        else "its previous fire has not finished")
            return None
        self.firing.add(sid)
        return self.runner.spawn(self._fire(schedule, runs))

    async def _fire(self, schedule: dict[str, Any], fire_count: int) -> None:
        """Post the fire's message (waiting for the conversation's active run, if any) and wait for its run."""
        try:
            run = await self._start(schedule, fire_count)
            if run is not None:
                await run.done.wait()
        except Exception:
            log.exception("schedule %s failed to fire", schedule["schedule_id"])
        finally:
            self.firing.discard(schedule["schedule_id"])

    async def _start(self, schedule: dict[str, Any], fire_count: int) -> Any:
        """Start the fire's run. A run of this process is waited for by `Runner.start`; a run paused for a
        human, or held by another process, is polled for every `cron_poll_s` without trying to start (a
        start attempt would stand in the way of the paused run's resumption)."""
        store, cid = self.runner.store, schedule["conversation_id"]
        prompt = prompt_of(schedule, fire_count)
        while not self.runner.closing:
            conversation = await store.get_conversation(cid)
            if conversation is None:
                await store.schedules.remove_conversation(cid)
                return None
            if cid in self.runner.active or conversation["status"] not in BUSY:
                try:
                    return await self.runner.start(conversation, prompt, principal=principal_of(schedule),
                                                   channel="schedule", wait_turn=True)
                except ApiError as exc:
                    if exc.code == "unavailable" and self.runner.closing:
                        return None  # the server is stopping
                    if exc.code != "run_in_progress":
                        raise
            await asyncio.sleep(self.runner.settings.cron_poll_s)
        return None
