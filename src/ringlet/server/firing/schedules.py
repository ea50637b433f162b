"""Agents' schedules firing (`builtin-tools-and-subagents.md` §4, `alarm_clock` / `schedule_task`), on DBOS.

A schedule is woken by a chain of delayed workflows on the fires queue (`firing.py`), one per wake-up slot:
wake-up `wake_id(schedule, slot)` is enqueued to start at the schedule's `next_run_at`, by whatever changed
the schedule's timing (`Schedules.wake`: created or retimed; a wake-up made void is cancelled) or by the
wake-up before it. A wake-up claims its slot with a compare-and-set on the schedule's `slot`
(`Schedules.advance`) and enqueues the next one in the same step, so one fires each slot however many
processes there are and however often it is executed again, and one made stale by a change fires nothing.
A fire that runs posts `[scheduled] <message>` (`metadata.source = "schedule"`, `schedule_id`,
`fire_count`) into the schedule's conversation as its creator, on the `schedule` channel, once that
conversation is free (`firing.deliver`). The rules for late fires:

- a fire is as late as the last slot it missed; no later than `misfire_grace_s`, it runs once, else it is
  skipped and logged (a wake-up that came due while no server ran executes when one starts);
- the next run is the first slot after now, so a late interval or cron schedule never fires several times;
- `max_runs` and `until` end a schedule (status `done`); an `at` schedule is done once it fired or was skipped;
- a schedule whose previous fire has not finished (it waits for its turn, or its run works or waits for a
  human) skips the fire: no two fires of one schedule at once;
- a deleted conversation's schedules are removed instead of fired.
"""

from __future__ import annotations

import functools
import logging

from dbos import DBOS

from ringlet._ids import at
from ringlet.server.firing.fires import ACTIVE, CLAIM, Firing, Plan, current, deliver, fire_run_id
from ringlet.store.records import Schedule
from ringlet.tools.builtin.schedule_timing import after_fire, latest_run, parse_time

log = logging.getLogger("ringlet.server")


def wake_id(schedule_id: str, slot: int) -> str:
    """The workflow id of a schedule's wake-up number `slot`."""
    return f"ringlet-wake-{schedule_id}-{slot}"


@DBOS.workflow(name="ringlet.schedule")
async def woken(schedule_id: str, slot: int) -> str:
    """A schedule's wake-up: claim its slot, then fire when it runs."""
    firing = await current()
    with firing.tracked():
        workflow_id = DBOS.workflow_id
        assert workflow_id is not None
        plan = await DBOS.run_step_async(CLAIM, claim, firing, schedule_id, slot, workflow_id)
        return "skipped" if plan is None else await deliver(firing, plan)


async def claim(firing: Firing, schedule_id: str, slot: int, workflow_id: str) -> Plan | None:
    """Claim wake-up `slot` of the schedule and enqueue the next one (a step): the fire's plan when it runs,
    None when it is skipped or stale."""
    store = firing.runs.records
    schedule = await store.schedules.get(schedule_id)
    if schedule is None:
        return None  # removed
    mine = schedule.firing == workflow_id  # claimed by an execution of this wake-up that died
    if mine or schedule.status != "active" or schedule.slot != slot:
        if schedule.status == "active" and schedule.slot == slot + 1:  # that execution may have died
            await _next(firing, schedule)  # before enqueueing the next wake-up
        return _plan(schedule, workflow_id, schedule.runs) if mine else None
    cid = schedule.conversation_id
    if await store.conversations.get(cid) is None:
        removed = await store.schedules.remove_conversation(cid)
        log.info("conversation %s is gone: removed its %d schedule(s)", cid, removed)
        return None
    assert schedule.next_run_at is not None, "an active schedule has its next run"
    kind, spec, due, clock = schedule.kind, schedule.spec, parse_time(schedule.next_run_at), firing.clock()
    late = clock - latest_run(kind, spec, due, clock)
    grace = firing.runs.settings.misfire_grace_s
    busy = schedule.firing is not None and await firing.running(schedule.firing)
    runs = schedule.runs + (1 if late <= grace and not busy else 0)
    upcoming = after_fire(kind, spec, due, clock, runs)
    fired = runs > schedule.runs
    if not await store.schedules.advance(schedule_id, slot, None if upcoming is None else at(upcoming),
                                         fired_by=workflow_id if fired else None):
        return None  # changed meanwhile: its new wake-up decides
    if upcoming is not None:
        await firing.enqueue(wake_id(schedule_id, slot + 1), woken, schedule_id, slot + 1, at=upcoming)
    if not fired:
        log.warning("schedule %s: skipped the fire due at %s (%s)", schedule_id, schedule.next_run_at,
                    f"{late:.0f} s late, over the {grace:.0f} s grace" if late > grace
                    else "its previous fire has not finished")
        return None
    return _plan(schedule, workflow_id, runs)


async def _next(firing: Firing, schedule: Schedule) -> None:
    """Enqueue the schedule's pending wake-up (nothing when it is enqueued already)."""
    sid, slot = schedule.schedule_id, schedule.slot
    if schedule.next_run_at is not None:
        await firing.enqueue(wake_id(sid, slot), woken, sid, slot, at=parse_time(schedule.next_run_at))


def _plan(schedule: Schedule, workflow_id: str, fire_count: int) -> Plan:
    """The fire's message, from the schedule, as its creator (in its org, limited to its realm and agent); its
    run counts against the key the schedule was made under."""
    sid = schedule.schedule_id
    return Plan(workflow_id=workflow_id, run_id=fire_run_id(workflow_id), conversation_id=schedule.conversation_id,
                text=f"[scheduled] {schedule.message}", channel="schedule",
                metadata={"source": "schedule", "schedule_id": sid, "fire_count": fire_count},
                principal={"key_id": schedule.created_by_key or f"schedule:{sid}",
                           "user_id": schedule.created_by or f"schedule:{sid}",
                           "org_id": schedule.org_id or "default", "realm": schedule.realm,
                           "agent": schedule.agent})


async def rescheduled(firing: Firing, schedule_id: str, slot: int, next_run_at: str | None) -> None:
    """A schedule's timing changed (`Schedules.wake`): its void wake-up is cancelled, its new one enqueued
    (DBOS launched for it first, if need be: `Firing.up`; with DBOS down, no wake-up is pending to cancel)."""
    if next_run_at is None and not firing.launched:
        return
    await firing.up()
    if slot > 0:
        await firing.cancel(wake_id(schedule_id, slot - 1))
    if next_run_at is not None:
        await firing.enqueue(wake_id(schedule_id, slot), woken, schedule_id, slot, at=parse_time(next_run_at))


def watch(firing: Firing) -> None:
    """From now on, changes of schedules wake them (`rescheduled`)."""
    firing.runs.records.schedules.wake = functools.partial(rescheduled, firing)


async def restore(firing: Firing) -> None:
    """Once DBOS fires here (`Firing.open`): every active schedule has its wake-up (one made by an older
    ringlet, or lost with a process that died between storing and enqueueing it; one whose wake-up failed
    without claiming its slot gets a new slot). A wake-up that came due while no server ran executes now, and
    is judged by the misfire grace."""
    store = firing.runs.records
    for schedule in await store.schedules.list(status="active"):
        status = await DBOS.get_workflow_status_async(wake_id(schedule.schedule_id, schedule.slot))
        if status is not None and status.status not in ACTIVE:
            log.warning("schedule %s: its wake-up ended without firing (%s); waking it again",
                        schedule.schedule_id, status.status)
            await store.schedules.update(schedule.schedule_id, {"next_run_at": schedule.next_run_at})
        else:
            await _next(firing, schedule)
