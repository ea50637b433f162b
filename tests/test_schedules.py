"""Agents' schedules (builtin-tools-and-subagents.md §4): when schedules run (pure functions), the five tools
and their errors, isolation and limits over the store, and their firing on DBOS (a wake-up workflow per slot)
judged by a controllable clock: a test moves the clock and lets the wake-ups due by then go at once."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from dbos import DBOS

from helpers import eventually
from ringlet import Agent, Gates
from ringlet._ids import at
from ringlet.agent import RunHost
from ringlet.agent.settings import RunSettings
from ringlet.context import RunContext
from ringlet.errors import ToolFailure
from ringlet.gates import ApprovalRules
from ringlet.messages import Message
from ringlet.models.base import ModelRequest
from ringlet.server import ServerSettings, create_app
from ringlet.server.catalog import Catalog
from ringlet.server.firing import schedules
from ringlet.server.firing.fires import Firing
from ringlet.server.firing.schedules import wake_id
from ringlet.server.http.auth import LOCAL, Principal
from ringlet.server.runs.runner import Runner
from ringlet.store import Store
from ringlet.store.records import Conversation
from ringlet.store.schedule_records import ConversationSchedules
from ringlet.testing import FunctionModel, ScriptedModel, call
from ringlet.tools.base import ArgumentsInvalid
from ringlet.tools.builtin.schedule_timing import after_fire, first_run, latest_run, next_run, parse_time
from ringlet.tools.builtin.schedules import SCHEDULE_TOOLS
from serving import serving

NOW = parse_time("2026-03-01T12:00:00Z")
TOOLS = {t.name: t for t in SCHEDULE_TOOLS}
HOUR = 3600.0


def t(text: str) -> float:
    return parse_time(text)


# -- when schedules run ---------------------------------------------------------------------------------------


def test_an_at_schedule_runs_once_at_its_time() -> None:
    spec = {"at": "2026-03-01T14:00:00+01:00", "timezone": "UTC"}
    assert at(first_run("at", spec, NOW)) == "2026-03-01T13:00:00.000Z"
    assert after_fire("at", spec, t("2026-03-01T13:00:00Z"), t("2026-03-01T13:00:01Z"), runs=1) is None
    with pytest.raises(ToolFailure, match="in the past") as past:
        first_run("at", {"at": "2026-03-01T11:59:59Z", "timezone": "UTC"}, NOW)
    assert past.value.code == "invalid_arguments"


def test_an_interval_keeps_its_phase_and_never_catches_up() -> None:
    spec = {"interval_minutes": 15, "timezone": "UTC"}
    assert at(first_run("interval", spec, NOW)) == "2026-03-01T12:15:00.000Z"
    started = {**spec, "at": "2026-03-01T11:00:00Z"}  # a start in the past: the next slot on its grid
    assert at(first_run("interval", started, NOW)) == "2026-03-01T12:15:00.000Z"
    assert at(first_run("interval", {**spec, "at": "2026-03-01T11:01:00Z"}, NOW)) == "2026-03-01T12:01:00.000Z"
    due = t("2026-03-01T12:15:00Z")
    two_hours_late = due + 2 * HOUR + 60  # eight slots missed: one fire, then the next slot after now
    assert at(next_run("interval", spec, due, two_hours_late)) == "2026-03-01T14:30:00.000Z"
    assert at(latest_run("interval", spec, due, two_hours_late)) == "2026-03-01T14:15:00.000Z"
    assert at(next_run("interval", spec, due, due)) == "2026-03-01T12:30:00.000Z"


def test_cron_is_read_in_its_time_zone() -> None:
    paris = {"cron": "0 9 * * *", "timezone": "Europe/Paris"}
    assert at(first_run("cron", paris, NOW)) == "2026-03-02T08:00:00.000Z"  # 09:00 CET
    assert at(first_run("cron", {**paris, "timezone": "UTC"}, NOW)) == "2026-03-02T09:00:00.000Z"
    summer = t("2026-07-01T12:00:00Z")
    assert at(first_run("cron", paris, summer)) == "2026-07-02T07:00:00.000Z"  # 09:00 CEST
    assert at(latest_run("cron", paris, t("2026-03-02T08:00:00Z"), t("2026-03-04T10:00:00Z"))) == \
        "2026-03-04T08:00:00.000Z"


def test_cron_is_safe_across_clock_changes() -> None:
    paris = {"cron": "30 2 * * *", "timezone": "Europe/Paris"}
    # 29 March 2026: 02:00 CET jumps to 03:00 CEST, so 02:30 does not exist; it runs right after the gap
    spring = first_run("cron", paris, t("2026-03-28T12:00:00Z"))
    assert at(spring) == "2026-03-29T01:30:00.000Z"  # 03:30 CEST
    assert at(next_run("cron", paris, spring, spring)) == "2026-03-30T00:30:00.000Z"  # 02:30 CEST
    # 25 October 2026: 03:00 CEST goes back to 02:00 CET, so 02:30 happens twice; it runs once
    autumn = first_run("cron", paris, t("2026-10-24T12:00:00Z"))
    assert at(autumn) == "2026-10-25T00:30:00.000Z"  # the first 02:30 (CEST)
    assert at(next_run("cron", paris, autumn, autumn)) == "2026-10-26T01:30:00.000Z"  # 02:30 CET, a day later
    halves, moment = [], t("2026-10-24T23:45:00Z")
    for _ in range(5):
        moment = next_run("cron", {"cron": "*/30 * * * *", "timezone": "Europe/Paris"}, moment, moment) or 0
        halves.append(at(moment)[11:16])
    assert halves == ["00:00", "00:30", "02:00", "02:30", "03:00"]  # each wall-clock time once, in order


def test_until_and_max_runs_end_a_schedule() -> None:
    spec = {"interval_minutes": 60, "timezone": "UTC", "until": "2026-03-01T14:30:00Z"}
    due = t("2026-03-01T13:00:00Z")
    assert at(after_fire("interval", spec, due, due, runs=1)) == "2026-03-01T14:00:00.000Z"
    assert after_fire("interval", spec, t("2026-03-01T14:00:00Z"), t("2026-03-01T14:00:00Z"), runs=2) is None
    limited = {"interval_minutes": 60, "timezone": "UTC", "max_runs": 2}
    assert after_fire("interval", limited, due, due, runs=1) is not None
    assert after_fire("interval", limited, due, due, runs=2) is None
    daily = {"cron": "0 9 * * *", "timezone": "UTC", "until": "2026-03-01T08:00:00Z"}
    with pytest.raises(ToolFailure, match=r"until: .* before the first run"):
        first_run("cron", daily, NOW)
    # a missed stretch that crosses `until` is as late as the last slot before `until`
    late = latest_run("interval", spec, due, t("2026-03-01T18:00:00Z"))
    assert at(late) == "2026-03-01T14:00:00.000Z"


def test_times_need_an_offset() -> None:
    assert parse_time("2026-03-01T13:00:00+01:00") == NOW
    with pytest.raises(ValueError, match="no UTC offset"):
        parse_time("2026-03-01T13:00:00")
    with pytest.raises(ValueError, match="not an RFC 3339"):
        parse_time("tomorrow at nine")


# -- the tools over the store ---------------------------------------------------------------------------------


async def _conversation(store: Store, realm: str = "default", org: str = "o1") -> Conversation:
    return await store.conversations.create(agent="a", realm=realm, org_id=org, user_id="u1")


def _book(store: Store, conversation: Conversation, *, org: str = "o1", clock: Callable[[], float] = lambda: NOW,
          max_active: int = 20) -> ConversationSchedules:
    return store.schedules.book(conversation.id, agent="a", realm=conversation.realm, org_id=org,
                                created_by="u1", clock=clock, max_active=max_active)


async def use(book: Any, name: str, **args: Any) -> dict[str, Any]:
    """Validate and run one tool the way the loop does; a coded failure comes back as its error body."""
    tool, ctx = TOOLS[name], RunContext(run_id="r_1", agent="a", schedules=book)
    try:
        return await tool.run(tool.validate(args), ctx)
    except ArgumentsInvalid as exc:
        return {"error": {"code": "invalid_arguments", "message": str(exc)}}
    except ToolFailure as exc:
        return {"error": {"code": exc.code, "message": exc.message}}


def _code(result: dict[str, Any]) -> str | None:
    return result.get("error", {}).get("code")


async def test_alarm_clock_and_schedule_task_create_schedules(store: Store) -> None:
    book = _book(store, await _conversation(store))
    once = await use(book, "alarm_clock", wake_at="2026-03-01T14:00:00+01:00", message="check the oven")
    assert set(once) == {"schedule_id", "next_run_at"}
    assert once["next_run_at"] == "2026-03-01T13:00:00.000Z"
    repeat = await use(book, "alarm_clock", wake_at="2026-03-01T12:30:00Z", repeat_interval_minutes=5)
    cron = await use(book, "schedule_task", kind="cron", cron="0 9 * * 1-5", timezone="Europe/Paris",
                     message="standup", max_runs=3)
    assert cron["next_run_at"] == "2026-03-02T08:00:00.000Z"
    listed = (await use(book, "list_schedules"))["schedules"]
    assert [(s["schedule_id"], s["kind"], s["message"], s["runs"], s["status"]) for s in listed] == [
        (once["schedule_id"], "at", "check the oven", 0, "active"),
        (repeat["schedule_id"], "interval", "Alarm: wake-up time reached.", 0, "active"),
        (cron["schedule_id"], "cron", "standup", 0, "active")]
    assert listed[1]["spec"] == {"at": "2026-03-01T12:30:00Z", "interval_minutes": 5, "timezone": "UTC"}
    assert listed[2]["spec"] == {"cron": "0 9 * * 1-5", "timezone": "Europe/Paris", "max_runs": 3}
    assert set(listed[0]) == {"schedule_id", "kind", "spec", "message", "next_run_at", "runs", "status"}


@pytest.mark.parametrize(("name", "args", "named"), [
    ("alarm_clock", {"wake_at": "2026-03-01T11:00:00Z"}, "wake_at: 2026-03-01T11:00:00Z is in the past"),
    ("alarm_clock", {"wake_at": "2026-03-01T14:00:00"}, "wake_at: '2026-03-01T14:00:00' has no UTC offset"),
    ("alarm_clock", {"wake_at": "2026-03-01T14:00:00Z", "repeat_interval_minutes": 0}, "repeat_interval_minutes"),
    ("alarm_clock", {"message": "no time"}, "wake_at: Field required"),
    ("schedule_task", {"kind": "cron", "cron": "every day", "message": "m"}, "cron: 'every day' is not"),
    ("schedule_task", {"kind": "cron", "cron": "0 9 * * * *", "message": "m"}, "5-field"),
    ("schedule_task", {"kind": "cron", "cron": "0 0 30 2 *", "message": "m"}, "cron: '0 0 30 2 *' never matches"),
    ("schedule_task", {"kind": "cron", "cron": "0 9 * * *", "timezone": "Mars/Olympus", "message": "m"},
     "timezone: unknown time zone 'Mars/Olympus'"),
    ("schedule_task", {"kind": "at", "message": "m"}, "at: Field required when kind is 'at'"),
    ("schedule_task", {"kind": "interval", "message": "m"}, "interval_minutes: Field required"),
    ("schedule_task", {"kind": "cron", "message": "m"}, "cron: Field required"),
    ("schedule_task", {"interval_minutes": 5, "message": "m"}, "kind: Field required"),
    ("schedule_task", {"kind": "interval", "interval_minutes": 5}, "message: Field required"),
    ("schedule_task", {"kind": "interval", "interval_minutes": 0, "message": "m"}, "interval_minutes: Input should "
     "be greater than or equal to 1"),
    ("schedule_task", {"kind": "at", "at": "2026-03-01T11:00:00Z", "message": "m"}, "at: 2026-03-01T11:00:00Z is in"),
    ("schedule_task", {"kind": "at", "at": "2026-03-01T13:00:00Z", "cron": "0 9 * * *", "message": "m"},
     "cron: not used by kind 'at'"),
    ("schedule_task", {"kind": "interval", "interval_minutes": 60, "until": "2026-03-01T12:30:00Z", "message": "m"},
     "until: 2026-03-01T12:30:00Z is before the first run at 2026-03-01T13:00:00.000Z"),
    ("schedule_task", {"kind": "at", "at": "2026-03-02T13:00:00Z", "until": "2026-03-02", "message": "m"},
     "until: '2026-03-02' has no UTC offset"),
    ("schedule_task", {"kind": "at", "at": "2026-03-02T13:00:00Z", "message": "m", "max_runs": 0}, "max_runs"),
    ("schedule_task", {"kind": "at", "at": "2026-03-02T13:00:00Z", "message": "m", "every": 2}, "every: Extra"),
])
async def test_invalid_arguments_name_the_field(store: Store, name: str, args: dict[str, Any], named: str) -> None:
    book = _book(store, await _conversation(store))
    result = await use(book, name, **args)
    assert _code(result) == "invalid_arguments", result
    assert named in result["error"]["message"]
    assert await book.list() == []  # nothing was stored


async def test_update_and_remove_a_schedule(store: Store) -> None:
    book = _book(store, await _conversation(store))
    made = await use(book, "schedule_task", kind="interval", interval_minutes=30, message="water the plants")
    sid = made["schedule_id"]
    renamed = await use(book, "update_schedule", schedule_id=sid, message="water the garden")
    assert (renamed["message"], renamed["next_run_at"]) == ("water the garden", made["next_run_at"])
    faster = await use(book, "update_schedule", schedule_id=sid, interval_minutes=10)
    assert faster["next_run_at"] == "2026-03-01T12:10:00.000Z"
    assert faster["spec"]["interval_minutes"] == 10
    to_cron = await use(book, "update_schedule", schedule_id=sid, kind="cron", cron="0 8 * * *")
    assert (to_cron["kind"], to_cron["next_run_at"]) == ("cron", "2026-03-02T08:00:00.000Z")
    assert "interval_minutes" not in to_cron["spec"]  # the old kind's timing is dropped
    assert to_cron["message"] == "water the garden"
    no_cron = await use(book, "update_schedule", schedule_id=sid, kind="at")
    assert "at: Field required when kind is 'at'" in no_cron["error"]["message"]
    assert await store.schedules.advance(sid, await _slot(book, sid), "2026-03-03T08:00:00.000Z", fired_by="w")
    spent = await use(book, "update_schedule", schedule_id=sid, max_runs=1)
    assert _code(spent) == "invalid_arguments"
    assert "max_runs: the schedule has run 1 times" in spent["error"]["message"]
    assert (await use(book, "update_schedule", schedule_id=sid, max_runs=2))["runs"] == 1
    missing = await use(book, "update_schedule", schedule_id="sch_nope", message="x")
    assert _code(missing) == "not_found"
    assert await use(book, "remove_schedule", schedule_id=sid) == {"schedule_id": sid, "removed": True}
    assert _code(await use(book, "remove_schedule", schedule_id=sid)) == "not_found"
    assert (await use(book, "list_schedules")) == {"schedules": []}


async def test_a_done_schedule_can_be_given_a_new_time(store: Store) -> None:
    book = _book(store, await _conversation(store), max_active=1)
    made = await use(book, "alarm_clock", wake_at="2026-03-01T13:00:00Z")
    assert await store.schedules.advance(made["schedule_id"], 0, None, fired_by="w")
    assert (await book.get(made["schedule_id"]) or {}).status == "done"
    other = await use(book, "alarm_clock", wake_at="2026-03-01T15:00:00Z")  # the done one does not count
    again = await use(book, "update_schedule", schedule_id=made["schedule_id"], at="2026-03-01T16:00:00Z")
    assert "already has 1 active schedules" in again["error"]["message"]  # reviving it would pass the limit
    await use(book, "remove_schedule", schedule_id=other["schedule_id"])
    revived = await use(book, "update_schedule", schedule_id=made["schedule_id"], at="2026-03-01T16:00:00Z")
    assert (revived["status"], revived["next_run_at"], revived["runs"]) == ("active", "2026-03-01T16:00:00.000Z", 1)


async def test_schedules_of_other_conversations_realms_and_orgs_are_not_found(store: Store) -> None:
    home = await _conversation(store)
    book = _book(store, home)
    sid = (await use(book, "alarm_clock", wake_at="2026-03-01T13:00:00Z"))["schedule_id"]
    other_conversation = _book(store, await _conversation(store))
    other_realm = store.schedules.book(home.id, agent="a", realm="red", org_id="o1", clock=lambda: NOW)
    other_org = _book(store, home, org="o2")
    for stranger in (other_conversation, other_realm, other_org):
        assert await use(stranger, "list_schedules") == {"schedules": []}
        assert _code(await use(stranger, "update_schedule", schedule_id=sid, message="x")) == "not_found"
        assert _code(await use(stranger, "remove_schedule", schedule_id=sid)) == "not_found"
    assert [s["message"] for s in (await use(book, "list_schedules"))["schedules"]] == [
        "Alarm: wake-up time reached."]


async def test_at_most_twenty_active_schedules_per_conversation(store: Store) -> None:
    conversation = await _conversation(store)
    book = _book(store, conversation)
    made = [await use(book, "schedule_task", kind="interval", interval_minutes=n, message=f"#{n}")
            for n in range(1, 21)]
    assert all("schedule_id" in m for m in made)
    over = await use(book, "alarm_clock", wake_at="2026-03-01T13:00:00Z")
    assert _code(over) == "invalid_arguments"
    assert "already has 20 active schedules" in over["error"]["message"]
    assert "schedule_id" in await use(_book(store, await _conversation(store)), "alarm_clock",
                                      wake_at="2026-03-01T13:00:00Z")  # the limit is per conversation
    await use(book, "remove_schedule", schedule_id=made[0]["schedule_id"])
    assert "schedule_id" in await use(book, "alarm_clock", wake_at="2026-03-01T13:00:00Z")
    assert ServerSettings().scheduler_max_per_conversation == 20


async def test_concurrent_creations_cannot_pass_the_limit(store: Store) -> None:
    book = _book(store, await _conversation(store), max_active=3)
    results = await asyncio.gather(*(use(book, "alarm_clock", wake_at="2026-03-01T13:00:00Z") for _ in range(6)))
    assert sum("schedule_id" in r for r in results) == 3
    assert await book.count_active() == 3


async def test_without_a_book_the_tools_say_why() -> None:
    for name, args in (("alarm_clock", {"wake_at": "2030-01-01T00:00:00Z"}), ("list_schedules", {}),
                       ("remove_schedule", {"schedule_id": "sch_1"})):
        result = await use(None, name, **args)
        assert _code(result) == "schedules_unavailable"
        assert "conversation stored by the server" in result["error"]["message"]


async def test_errors_reach_the_model_as_coded_results(store: Store) -> None:
    book = _book(store, await _conversation(store))
    model = ScriptedModel([[call("alarm_clock", wake_at="2026-03-01T14:00:00"),
                            call("remove_schedule", schedule_id="sch_nope"),
                            call("alarm_clock", wake_at="2026-03-01T14:00:00Z", message="tea")], "ok"])
    result = await Agent(model, tools=SCHEDULE_TOOLS).run("set an alarm",
                                                          settings=RunSettings(host=RunHost(schedules=book)))
    results = [json.loads(m.content) for m in result.new_messages() if m.role == "tool"]  # type: ignore[arg-type]
    assert results[0]["error"]["code"] == "invalid_arguments"
    assert "has no UTC offset" in results[0]["error"]["message"]
    assert results[1]["error"]["code"] == "not_found"
    assert results[2] == {"schedule_id": results[2]["schedule_id"], "next_run_at": "2026-03-01T14:00:00.000Z"}
    assert [s.message for s in await book.list()] == ["tea"]


async def _slot(book: ConversationSchedules, schedule_id: str) -> int:
    return (await book.get(schedule_id) or {}).slot


async def test_one_wake_up_claims_each_slot(store: Store) -> None:
    book = _book(store, await _conversation(store))
    made = await use(book, "schedule_task", kind="interval", interval_minutes=5, message="m", max_runs=2)
    sid = made["schedule_id"]
    claims = await asyncio.gather(*(store.schedules.advance(sid, 0, "2026-03-01T12:10:00.000Z", fired_by=f"w{n}")
                                    for n in range(4)))
    assert claims.count(True) == 1
    assert not await store.schedules.advance(sid, 0, "2026-03-01T12:15:00.000Z", fired_by="w")  # stale slot
    assert await store.schedules.advance(sid, 1, None, fired_by="w5")
    record = await book.get(sid)
    assert record is not None
    assert (record.runs, record.status, record.next_run_at, record.firing) == (2, "done", None, "w5")
    assert not await store.schedules.advance(sid, 2, None, fired_by="w6")  # done: nothing claims it


async def test_a_retimed_schedule_takes_a_new_slot(store: Store) -> None:
    """Changing a schedule's timing voids its pending wake-up (a new slot); other changes keep it."""
    book = _book(store, await _conversation(store))
    woken: list[tuple[str, int, str | None]] = []

    async def wake(schedule_id: str, slot: int, next_run_at: str | None) -> None:
        woken.append((schedule_id, slot, next_run_at))

    store.schedules.wake = wake
    sid = (await use(book, "schedule_task", kind="interval", interval_minutes=30, message="m"))["schedule_id"]
    await use(book, "update_schedule", schedule_id=sid, message="n")  # not its timing
    await use(book, "update_schedule", schedule_id=sid, interval_minutes=10)
    await use(book, "remove_schedule", schedule_id=sid)
    assert woken == [(sid, 0, "2026-03-01T12:30:00.000Z"), (sid, 1, "2026-03-01T12:10:00.000Z"), (sid, 2, None)]
    assert not await store.schedules.advance(sid, 1, None, fired_by="w")


# -- firing -----------------------------------------------------------------------------------------------------


def woke(request: ModelRequest) -> str:
    return "woke: " + request.messages[-1].text


async def _transcript(store: Store, cid: str) -> list[tuple[str, str]]:
    return [(m.role, m.text) for m in await store.conversations.load_messages(cid)]


async def advance(firing: Firing, to: float) -> None:
    """Move the firing's clock to `to`, and let every wake-up due by then go now instead of at its real time."""
    firing.clock = lambda: to
    for schedule in await firing.runs.records.schedules.list(status="active"):
        if parse_time(schedule.next_run_at) <= to:
            workflow_id = wake_id(schedule.schedule_id, schedule.slot)
            await eventually(lambda w=workflow_id: _exists(w))  # enqueued by the claim before it, maybe just now
            await DBOS.set_workflow_delay_async(workflow_id, delay_seconds=0)


async def _exists(workflow_id: str) -> bool:
    return await DBOS.get_workflow_status_async(workflow_id) is not None


async def idle(store: Store, cid: str) -> bool:
    """The conversation has no run and its last message is the assistant's."""
    conversation = await store.conversations.get(cid)
    messages = await store.conversations.load_messages(cid)
    return conversation is not None and conversation.status == "idle" and bool(messages) and \
        messages[-1].role == "assistant"


async def _runs(store: Store, schedule_id: str) -> int:
    schedule = await store.schedules.get(schedule_id)
    return schedule.runs if schedule is not None else -1


@asynccontextmanager
async def firing_for(runner: Runner, now: float = NOW) -> AsyncIterator[Firing]:
    """A server's firing without HTTP (DBOS for firing, its clock at `now`) over `runner`, closed with it."""
    firing = Firing(runner.runs, runner.store, clock=lambda: now)
    schedules.watch(firing)
    await firing.open(schedules.restore)
    try:
        await firing.up()  # (DBOS at once, though no schedule exists yet: the tests read its workflows)
        yield firing
    finally:
        await firing.stop()
        await runner.close()
        await firing.close()


def _runner(store: Store, model: Any, **agent: Any) -> Runner:
    return Runner(store, Catalog.of([Agent(model, name="a", **agent)]), ServerSettings())


async def test_the_agent_wakes_in_its_conversation(store: Store) -> None:
    """Through a real server: the model sets an alarm; at its time its wake-up posts `[scheduled] …` into
    the same conversation and the agent runs again."""
    import time

    wake = time.time() + HOUR  # the tool checks the past against the real clock; the firing's clock is ours
    model = ScriptedModel([call("alarm_clock", wake_at=at(wake), message="check the oven"), "Alarm set.",
                           "Oven checked."])
    app = create_app(ServerSettings(), store=store, agents=[Agent(model, name="cook", tools=SCHEDULE_TOOLS)])
    async with serving(app) as url:
        key, _ = await store.keys.create("u", scopes=["chat"], user_id="ann", org_id="acme")
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}) as client:
            cid = (await client.post("/api/v1/chat/conversations", json={"agent": "cook"})).json()["id"]
            outcome = await client.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": "remind me"},
                                        headers={"Accept": "application/json"})
            assert outcome.json()["message"]["content"] == "Alarm set."
            [schedule] = await store.schedules.list()
            firing: Firing = app.state.ringlet.firing
            await advance(firing, wake - 1)  # not yet: its wake-up stays delayed
            status = await DBOS.get_workflow_status_async(wake_id(schedule.schedule_id, 0))
            assert status is not None
            assert status.status == "DELAYED"
            await advance(firing, wake + 1)
            await eventually(lambda: idle_after(store, cid, "Oven checked."))
            messages = (await client.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"]
    scheduled = messages[-2]
    assert (scheduled["role"], scheduled["content"]) == ("user", "[scheduled] check the oven")
    [schedule] = await store.schedules.list()
    assert scheduled["metadata"] | {"is_persisted": True} == {
        "source": "schedule", "schedule_id": schedule.schedule_id, "fire_count": 1, "is_persisted": True}
    assert (messages[-1]["role"], messages[-1]["content"]) == ("assistant", "Oven checked.")
    assert model.requests[-1].messages[-1].text == "[scheduled] check the oven"
    assert (schedule.status, schedule.runs, schedule.created_by, schedule.org_id) == (
        "done", 1, "ann", "acme")  # an alarm fires once: no wake-up after it
    model.assert_complete()


async def idle_after(store: Store, cid: str, last: str) -> bool:
    """The conversation is idle and its last message is the assistant's `last`."""
    messages = await store.conversations.load_messages(cid)
    return await idle(store, cid) and messages[-1].text == last


async def test_a_fire_waits_for_the_active_run(store: Store) -> None:
    entered, release = asyncio.Event(), asyncio.Event()

    async def answer(request: ModelRequest) -> str:
        if request.messages[-1].text == "hold":
            entered.set()
            await release.wait()
            return "held"
        return woke(request)

    async with firing_for(_runner(store, FunctionModel(answer))) as firing:
        conversation = await _conversation(store)
        book = _book(store, conversation)
        made = await use(book, "alarm_clock", wake_at="2026-03-01T12:05:00Z", message="ping")
        holding = await firing.runs.start(conversation, Message.user("hold"), principal=LOCAL)
        await entered.wait()
        await advance(firing, t("2026-03-01T12:05:01Z"))
        await eventually(lambda: _claimed(store, made["schedule_id"]))  # claimed; it waits for its turn
        release.set()
        await holding.done.wait()
        await eventually(lambda: idle_after(store, conversation.id, "woke: [scheduled] ping"))
        assert await _transcript(store, conversation.id) == [
            ("user", "hold"), ("assistant", "held"), ("user", "[scheduled] ping"),
            ("assistant", "woke: [scheduled] ping")]
        assert (await book.get(made["schedule_id"]) or {}).runs == 1
        release.set()


async def _claimed(store: Store, schedule_id: str) -> bool:
    return await _runs(store, schedule_id) >= 1


async def test_fires_missed_during_a_restart(store: Store) -> None:
    """Schedules set through one server; a new server over the same store catches up on a controllable
    clock: a fire missed by less than the grace runs once, one missed by more is skipped, and an interval
    missed many times fires once."""
    import time

    start = time.time()
    soon, earlier = at(start + 2 * HOUR), at(start + HOUR)
    model = ScriptedModel([[call("alarm_clock", wake_at=soon, message="A"),
                            call("alarm_clock", wake_at=earlier, message="B"),
                            call("schedule_task", kind="interval", interval_minutes=1, message="C")], "set"])
    first = create_app(ServerSettings(min_schedule_interval_s=0),  # a schedule every minute, as the key may
                       store=store, agents=[Agent(model, name="a", tools=SCHEDULE_TOOLS)])
    async with serving(first) as url:
        key, _ = await store.keys.create("u", scopes=["chat"])
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}) as client:
            cid = (await client.post("/api/v1/chat/conversations", json={"agent": "a"})).json()["id"]
            await client.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": "set them"},
                              headers={"Accept": "application/json"})
    ids = {s.message: s.schedule_id for s in await store.schedules.list()}
    assert set(ids) == {"A", "B", "C"}
    second = create_app(ServerSettings(), store=store,
                        agents=[Agent(FunctionModel(woke), name="a", tools=SCHEDULE_TOOLS)])
    async with serving(second) as url, httpx.AsyncClient(base_url=url) as client:
        assert (await client.get("/readyz")).status_code == 200
        firing: Firing = second.state.ringlet.firing
        clock = parse_time(soon) + 100  # A is 100 s late; B 3 700 s; C missed ~119 times
        await advance(firing, clock)

        async def settled() -> bool:
            records = {s.message: s for s in await store.schedules.list()}
            return records["B"].status == "done" and records["A"].status == "done" and \
                records["C"].runs == 1 and len([m for m in await _transcript(store, cid)
                                                   if m[1].startswith("woke: [scheduled]")]) == 2 and \
                await idle(store, cid)

        await eventually(settled)
        transcript = await _transcript(store, cid)
    scheduled = [text for role, text in transcript if text.startswith("[scheduled]")]
    assert sorted(scheduled) == ["[scheduled] A", "[scheduled] C"]
    records = {s.message: s for s in await store.schedules.list()}
    assert (records["A"].runs, records["A"].status) == (1, "done")
    assert (records["B"].runs, records["B"].status) == (0, "done")
    assert (records["C"].runs, records["C"].status) == (1, "active")
    assert parse_time(records["C"].next_run_at) > clock
    assert parse_time(records["C"].next_run_at) - clock <= 60


async def test_a_wake_up_executed_again_fires_once(store: Store) -> None:
    """A wake-up's claim and its run's start, executed again (as when the process executing them died before
    they were recorded), fire once; a wake-up for a slot already claimed fires nothing."""
    async with firing_for(_runner(store, FunctionModel(woke)), now=t("2026-03-01T12:05:00Z")) as firing:
        conversation = await _conversation(store)
        sid = (await use(_book(store, conversation), "alarm_clock", wake_at="2026-03-01T12:05:00Z",
                         message="once"))["schedule_id"]
        first = await schedules.claim(firing, sid, 0, "wake-a")
        again = await schedules.claim(firing, sid, 0, "wake-a")
        assert first is not None
        assert again == first
        assert await schedules.claim(firing, sid, 0, "wake-b") is None  # its slot is taken
        assert await firing.start(first) == "started"
        assert await firing.start(first) == "started"  # its run exists: no second one
        await eventually(lambda: idle(store, conversation.id))
    assert [text for _, text in await _transcript(store, conversation.id)] == [
        "[scheduled] once", "woke: [scheduled] once"]
    assert (await store.schedules.get(sid) or {}).runs == 1


@pytest.mark.slow
async def test_an_interval_never_overlaps_and_max_runs_ends_it(store: Store) -> None:
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow(request: ModelRequest) -> str:
        entered.set()
        await release.wait()
        return "done"

    async with firing_for(_runner(store, FunctionModel(slow))) as firing:
        conversation = await _conversation(store)
        book = _book(store, conversation)
        sid = (await use(book, "schedule_task", kind="interval", interval_minutes=1, message="tick",
                         max_runs=2))["schedule_id"]
        await advance(firing, t("2026-03-01T12:01:00Z"))
        await entered.wait()  # the first fire's run is working
        await advance(firing, t("2026-03-01T12:02:00Z"))

        async def skipped() -> bool:
            return (await book.get(sid) or {}).next_run_at == "2026-03-01T12:03:00.000Z"

        await eventually(skipped)  # its previous fire has not finished: skipped, not queued
        assert (await book.get(sid) or {}).runs == 1
        release.set()
        await eventually(lambda: idle(store, conversation.id))
        await advance(firing, t("2026-03-01T12:03:00Z"))

        async def ended() -> bool:
            return (await book.get(sid) or {}).status == "done" and await idle(store, conversation.id) \
                and len(await store.conversations.load_messages(conversation.id)) == 4

        await eventually(ended)
        record = await book.get(sid)
        assert record is not None
        assert (record.runs, record.status, record.next_run_at) == (2, "done", None)
        assert [text for role, text in await _transcript(store, conversation.id) if role == "user"] == [
            "[scheduled] tick", "[scheduled] tick"]
        assert [m.metadata.get("fire_count") for m in await store.conversations.load_messages(conversation.id)
                if m.role == "user"] == [1, 2]


async def test_a_deleted_conversations_schedules_stop(store: Store) -> None:
    async with firing_for(_runner(store, FunctionModel(woke))) as firing:
        conversation = await _conversation(store)
        await use(_book(store, conversation), "schedule_task", kind="interval", interval_minutes=1, message="m")
        await store.conversations.delete(conversation.id)
        await advance(firing, t("2026-03-01T12:01:00Z"))

        async def removed() -> bool:
            return await store.schedules.list() == []

        await eventually(removed)
        assert await store.conversations.load_messages(conversation.id) == []


async def test_a_woken_run_can_manage_its_own_schedules(store: Store) -> None:
    """The run a fire starts gets the conversation's book (same org, realm and creator): it lists and
    removes the schedule that woke it, and its next wake-up is cancelled."""
    conversation = await _conversation(store)
    sid = (await use(_book(store, conversation), "schedule_task", kind="interval", interval_minutes=1,
                     message="poll"))["schedule_id"]
    # one call per response: in one batch the two would run in parallel, and the list could come after the removal
    model = ScriptedModel([call("list_schedules"), call("remove_schedule", schedule_id=sid), "stopped"])
    async with firing_for(_runner(store, model, tools=SCHEDULE_TOOLS)) as firing:
        await advance(firing, t("2026-03-01T12:01:00Z"))
        await eventually(lambda: idle(store, conversation.id))
        status = await DBOS.get_workflow_status_async(wake_id(sid, 1))
        assert status is not None
        assert status.status == "CANCELLED"  # the wake-up its fire had enqueued
    transcript = await store.conversations.load_messages(conversation.id)
    tool_results = [json.loads(m.text) for m in transcript if m.role == "tool"]
    assert [s["schedule_id"] for s in tool_results[0]["schedules"]] == [sid]
    assert tool_results[1] == {"schedule_id": sid, "removed": True}
    assert await store.schedules.list() == []


async def test_a_resumed_run_has_its_book_and_a_fire_waits_for_a_paused_run(store: Store) -> None:
    """A run paused for an approval resumes with the conversation's book (the approved `alarm_clock` is
    stored as its creator's); a fire due meanwhile waits until the resumed run has ended."""
    import time

    wake = at(time.time() + HOUR)

    def answer(request: ModelRequest) -> Any:
        last = request.messages[-1]
        if last.role == "tool":
            return "alarm set"
        return call("alarm_clock", wake_at=wake, message="later") if last.text == "set" else woke(request)

    agent = Agent(FunctionModel(answer), name="a", tools=SCHEDULE_TOOLS,
                  gates=Gates(approvals=ApprovalRules({"alarm_clock": {"mode": "confirm", "timeout_s": 600}})))
    ann = Principal(key_id="k", user_id="ann", org_id="acme", roles=(), scopes=frozenset({"chat"}), realms=None,
                    agents=None)
    async with firing_for(Runner(store, Catalog.of([agent]), ServerSettings())) as firing:
        runs = firing.runs
        conversation = await store.conversations.create(agent="a", org_id="acme", user_id="ann")
        early = store.schedules.book(conversation.id, agent="a", org_id="acme", created_by="ann",
                                     clock=lambda: NOW)
        ping = (await use(early, "alarm_clock", wake_at="2026-03-01T12:05:00Z", message="ping"))["schedule_id"]
        paused = await runs.start(conversation, Message.user("set"), principal=ann)
        await paused.done.wait()
        assert (await store.conversations.get(conversation.id) or {}).status == "input_required"
        await advance(firing, t("2026-03-01T12:05:01Z"))
        await eventually(lambda: _claimed(store, ping))  # claimed; it waits until the paused run has ended
        [approval] = await store.approvals.list(run_id=paused.run_id)
        await runs.decide(approval, approved=True, note=None, decided_by="ann")
        await eventually(lambda: idle_after(store, conversation.id, "woke: [scheduled] ping"))
    texts = [text for role, text in await _transcript(store, conversation.id) if role != "tool"]
    assert texts[-3:] == ["alarm set", "[scheduled] ping", "woke: [scheduled] ping"]
    later = [s for s in await store.schedules.list() if s.message == "later"]
    assert [(s.created_by, s.org_id, s.conversation_id) for s in later] == [
        ("ann", "acme", conversation.id)]
