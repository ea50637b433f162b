"""Runs: their records, the leases that say which process holds a working run, and the pauses of runs that
wait for people (`gates.md` §4.6).

A working run belongs to the process that holds its lease (`lease_owner` until `lease_expires_at`); one
whose lease expired, or whose holder is known dead, is claimed by one process (a compare-and-set). A paused
run (`input_required`) holds no lease: any process may take it to resume it, once. A run's start, pause and
end each write everything they change in one transaction (the conversation's claim and status, the
transcript, the approval records, the closing events).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from sqlalchemy import and_, bindparam, case, func, or_, select, text, update

from ringlet import telemetry
from ringlet._ids import now
from ringlet.errors import ConversationBusy, KeyBusy
from ringlet.messages import Message
from ringlet.store import statements as hot
from ringlet.store.approval_records import add_in
from ringlet.store.conversation_records import insert_new, newest_first, title_of, transcript_in, usage_params
from ringlet.store.engine import Db, HotConn
from ringlet.store.event_records import Batch, append_in
from ringlet.store.records import Claim, Json, RunRecord
from ringlet.store.request_records import claim_in
from ringlet.store.schema import approvals, conversations, runs
from ringlet.store.tape_records import add_tape


async def admit(conn: HotConn, key: str, limit: int) -> None:
    """On PostgreSQL, in the transaction that stores a new run of `key`: `KeyBusy` when the key has `limit`
    working runs (paused ones wait for people and do not count). A transaction-scoped advisory lock on the
    key makes the count and the insert one step for every process that shares the database; it is held
    until the commit, so a second admission of the same key waits for the first to be stored. (On SQLite
    one process serves a database: its in-memory cap, `limits.Cap`, holds alone.)"""
    if conn.dialect.name != "postgresql":
        return
    await conn.execute(_KEY_LOCK, {"b_key": f"ringlet.key-runs:{key}"})
    working = (await conn.execute(_KEY_RUNS, {"b_key": key})).scalar_one()
    if working >= limit:
        raise KeyBusy(key, working, limit)


_KEY_LOCK = text("SELECT pg_advisory_xact_lock(hashtextextended(:b_key, 0))")
_KEY_RUNS = select(func.count()).select_from(runs).where(runs.c.key_id == bindparam("b_key"),
                                                         runs.c.status == "working")


async def _created(db: Db, run: Json, claiming: Json | None, incoming: Sequence[Message], *,
                   claim: Claim | None, key_limit: int) -> int:
    """`Runs.create`'s transaction."""
    last = 0
    async with db.hot() as conn:
        if run["key_id"] is not None and key_limit:
            await admit(conn, run["key_id"], key_limit)
        if claim is not None:
            await claim_in(conn, claim)
        if claiming is not None:
            claimed = (await conn.execute(hot.CLAIM, claiming)).first()
            if claimed is None:  # working, or paused
                raise ConversationBusy(f"conversation {claiming['b_id']} already has a working run")
            last = claimed[0]
        await conn.execute(hot.INSERT_RUN, run)
        if claiming is not None:
            await insert_new(conn, claiming["b_id"], incoming)
    return last


class Runs:
    """The `runs` table."""

    def __init__(self, db: Db, origin: str) -> None:
        self.db, self.origin = db, origin

    async def create(self, run_id: str, *, agent: str, conversation_id: str | None = None,
                     parent_run_id: str | None = None, kind: str = "loop", lease_owner: str | None = None,
                     lease_expires_at: str | None = None, incoming: Sequence[Message] = (),
                     realm: str | None = None, key_id: str | None = None, claim: Claim | None = None,
                     state: Json | None = None, key_limit: int = 0) -> int:
        """Record a new `working` run. With `conversation_id` and `incoming` (the run's input), in the same
        transaction: claim the conversation (`ConversationBusy` when it already has a working run, in any
        process) and store the input. With `claim`, its `Idempotency-Key` too (`KeyTaken` when it is stored
        already): the key is never stored without the run it names. `state`: on the engine, its workflow's
        input (`starter.kept`). `key_limit` (PostgreSQL): `KeyBusy` when `key_id` has that many working runs
        already, in any process (`admit`). Returns the conversation's last event id as it claimed it (the run's
        events come after it; 0 when it claimed none), read in the same transaction."""
        run = {"id": run_id, "agent": agent, "conversation_id": conversation_id, "parent_run_id": parent_run_id,
               "kind": kind, "status": "working", "lease_owner": lease_owner, "lease_expires_at": lease_expires_at,
               "started_at": now(), "realm": realm, "key_id": key_id, "state": state}
        first_user = next((m.text for m in incoming if m.role == "user" and m.text.strip()), None)
        claiming = None if conversation_id is None or not incoming else {
            "b_id": conversation_id, "b_stamp": now(), "b_title": title_of(first_user) if first_user else None}
        last = await _created(self.db, run, claiming, incoming, claim=claim, key_limit=key_limit)
        if telemetry.active():
            telemetry.emit("ringlet.run.start", {}, {"agent": agent, "kind": kind})
        return last

    async def finish(self, run_id: str, *, status: str, finish_reason: str | None, in_tokens: int, out_tokens: int,
                     cost_usd: float | None, state: Json | None = None, conversation_id: str | None = None,
                     new: Sequence[Message] = (), conversation_status: str | None = None, add_usage: bool = True,
                     events: Batch | None = None, tape: Json | None = None) -> list[int]:
        """Record how a run ended. With `conversation_id`, in the same transaction: store the run's last
        messages, add its usage to the conversation (unless not `add_usage`) and set the conversation's status.
        With `events` (its closing events, `message_end` last), append them too and return their ids: the
        record never says the run ended without its end in the log. Without `events` the run keeps its lease
        owner until `end_logged()`: if that process dies first, `unlogged_ends()` finds the run. `tape`: the
        run's recording since it started or resumed (`ringlet.replay`), kept with its end."""
        ended: Json = {"lease_owner": None, "lease_expires_at": None} if events is not None else {}
        observed = telemetry.active()
        end = {"status": status, "finish_reason": finish_reason, "in_tokens": in_tokens, "out_tokens": out_tokens,
               "cost_usd": cost_usd, "state": state, "ended_at": now(), **ended}
        usage = usage_params(conversation_id, in_tokens, out_tokens, cost_usd, conversation_status) \
            if conversation_id is not None and add_usage else None
        async with self.db.hot() as conn:
            row = await conn.execute(hot.END_RUN if observed else hot.UPDATE_RUN, {"b_id": run_id, **end})
            agent = row.scalar() if observed else None
            if tape is not None:
                await add_tape(conn, run_id, tape)
            if conversation_id is not None:
                await insert_new(conn, conversation_id, new)
                if usage is not None:
                    await conn.execute(hot.USAGE, usage)
                elif conversation_status is not None:
                    await conn.execute(hot.SET_STATUS, {"b_id": conversation_id, "b_status": conversation_status,
                                                        "b_stamp": now()})
            ids = await append_in(conn, events, now(), self.origin) if events else []
        if observed and status in ("completed", "failed", "canceled"):
            telemetry.emit("ringlet.run.end", {}, {"agent": agent or "", "outcome": status})
        return ids

    async def end_logged(self, run_id: str) -> None:
        """The end of a run recorded without its events (`finish`) is now in the log."""
        async with self.db.begin() as conn:
            await conn.execute(update(runs).where(runs.c.id == run_id, runs.c.ended_at.is_not(None))
                               .values(lease_owner=None, lease_expires_at=None))

    async def unlogged_ends(self) -> list[RunRecord]:
        """Ended runs of conversations whose end may be missing from the log: recorded by a process that had
        not written their last events yet (`finish` without `events`)."""
        r = runs.c
        return await self._select(r.ended_at.is_not(None), r.lease_owner.is_not(None), r.conversation_id.is_not(None),
                                  r.kind.in_(["loop", "graph"]), r.status.in_(["completed", "failed", "canceled"]))

    async def log_end(self, run_id: str, owner: str, events: Batch) -> list[int] | None:
        """Append the missing last events of an ended run still marked with `owner` (compare-and-set: one
        process writes them) and clear the mark, in one transaction; their ids, or None when taken."""
        async with self.db.begin() as conn:
            taken = await conn.execute(update(runs).where(runs.c.id == run_id, runs.c.lease_owner == owner,
                                                          runs.c.ended_at.is_not(None))
                                       .values(lease_owner=None, lease_expires_at=None))
            if taken.rowcount == 0:
                return None
            return await append_in(conn, events, now(), self.origin) if events else []

    async def state(self, run_id: str) -> Json | None:
        """The run's stored state: its continuation while paused, its final state once ended."""
        async with self.db.connect() as conn:
            return (await conn.execute(select(runs.c.state).where(runs.c.id == run_id))).scalar()

    async def key(self, run_id: str) -> str | None:
        """The API key that caused the run (its runs count against that key's limit)."""
        async with self.db.connect() as conn:
            return (await conn.execute(select(runs.c.key_id).where(runs.c.id == run_id))).scalar()

    async def get(self, run_id: str) -> RunRecord | None:
        found = await self._select(runs.c.id == run_id)
        return found[0] if found else None

    async def list(self, *, realms: Collection[str] | None = None, agents: Collection[str] | None = None,
                   agent: str | None = None, status: str | None = None, conversation_id: str | None = None,
                   include_sub_agents: bool = False, after: tuple[str, str] | None = None,
                   limit: int = 50) -> list[RunRecord]:
        """Runs newest first, without their state; each in its realm (its conversation's, for a run that has
        one). Only runs in a realm, and not those of deleted conversations (`GET /api/v1/runs/{id}` finds
        neither); `realms`/`agents` None: any. `after` is the (started_at, id) of the previous page's last."""
        r, c = runs.c, conversations.c
        realm = func.coalesce(c.realm, r.realm)
        kept = or_(r.conversation_id.is_(None), and_(c.id.is_not(None), c.deleted_at.is_(None)))
        query = (select(*(col for col in r if col.name not in ("realm", "state")), realm.label("realm"))
                 .select_from(runs.outerjoin(conversations, c.id == r.conversation_id))
                 .where(realm.is_not(None), kept))
        for column, allowed in ((realm, realms), (r.agent, agents)):
            if allowed is not None:
                query = query.where(column.in_(list(allowed)))
        for column, value in ((r.agent, agent), (r.status, status), (r.conversation_id, conversation_id)):
            if value is not None:
                query = query.where(column == value)
        if not include_sub_agents:
            query = query.where(r.parent_run_id.is_(None))
        query = newest_first(query, r.started_at, r.id, after, limit)
        async with self.db.connect() as conn:
            return [RunRecord.of(row) for row in (await conn.execute(query)).mappings()]

    async def _select(self, *where: Any) -> list[RunRecord]:
        async with self.db.connect() as conn:
            return [RunRecord.of(row) for row in (await conn.execute(select(runs).where(*where))).mappings()]

    # -- leases: a working run belongs to the process that holds its lease ------------------------------

    async def renew_leases(self, owner: str, until: str) -> None:
        """Extend the leases of `owner`'s working runs to `until` (never shortening one: a lease taken after
        `until` was computed stays as it is)."""
        r = runs.c
        async with self.db.begin() as conn:
            await conn.execute(update(runs).where(r.lease_owner == owner, r.status == "working")
                               .values(lease_expires_at=case((r.lease_expires_at < until, until),
                                                             else_=r.lease_expires_at)))

    async def expired(self, at: str) -> list[RunRecord]:
        """Runs still `working` whose lease expired before `at`: their process died."""
        return await self._select(runs.c.status == "working", runs.c.lease_expires_at < at)

    async def claim(self, run_id: str, owner: str, until: str, *, expired_before: str,
                    held_by: str | None = None) -> bool:
        """Take over a working run's lease (one process wins): one that expired before `expired_before`, or one
        still held by `held_by` (a process known to be dead)."""
        r = runs.c
        taken = r.lease_expires_at < expired_before if held_by is None else \
            or_(r.lease_expires_at < expired_before, r.lease_owner == held_by)
        async with self.db.begin() as conn:
            result = await conn.execute(update(runs).where(r.id == run_id, r.status == "working", taken)
                                        .values(lease_owner=owner, lease_expires_at=until))
        return result.rowcount > 0

    async def take(self, run_id: str, owner: str, until: str, *, conversation_id: str,
                   before: str | None) -> list[Message] | None:
        """A run this process started, taken by its workflow (`claim(…, expired_before="", held_by=owner)`),
        with the conversation's transcript before the message id `before` (none: no history), in one
        transaction; None when the run was not claimed (the transcript is not read then)."""
        lease = {"b_id": run_id, "b_owner": owner, "b_until": until}
        async with self.db.hot() as conn:
            if (await conn.execute(hot.TAKE, lease)).rowcount == 0:
                return None
            return [] if before is None else await transcript_in(conn, conversation_id, before=before)

    async def working(self) -> list[RunRecord]:
        """Every run still `working`, with its lease owner."""
        return await self._select(runs.c.status == "working")

    # -- runs paused for people -------------------------------------------------------------------------

    async def pause(self, run_id: str, *, state: Json, requests: Sequence[Json], conversation_id: str | None,
                    new: Sequence[Message] = (), in_tokens: int = 0, out_tokens: int = 0,
                    cost_usd: float | None = None, agent: str | None = None, realm: str | None = None,
                    tape: Json | None = None) -> None:
        """Record a run paused for people, in one transaction: its continuation (`state`), its new approval
        records, its new messages; the run becomes `input_required` with no lease (any process may resume
        it), and so does its conversation."""
        async with self.db.begin() as conn:
            await conn.execute(update(runs).where(runs.c.id == run_id).values(
                status="input_required", state=state, lease_owner=None, lease_expires_at=None,
                in_tokens=in_tokens, out_tokens=out_tokens, cost_usd=cost_usd))
            await add_in(conn, run_id, requests, agent, realm)
            if tape is not None:
                await add_tape(conn, run_id, tape)
            if conversation_id is not None:
                await insert_new(conn, conversation_id, new)
                await conn.execute(update(conversations).where(conversations.c.id == conversation_id)
                                   .values(status="input_required", updated_at=now()))

    async def paused_of(self, conversation_id: str) -> str | None:
        """The conversation's paused run, if it has one."""
        async with self.db.connect() as conn:
            return (await conn.execute(select(runs.c.id).where(
                runs.c.conversation_id == conversation_id, runs.c.status == "input_required",
                runs.c.ended_at.is_(None)))).scalar()

    async def take_paused(self, run_id: str, owner: str, until: str) -> RunRecord | None:
        """Take a paused run's lease to resume it (compare-and-set: one process wins); its record, or None."""
        async with self.db.begin() as conn:
            taken = await conn.execute(update(runs).where(runs.c.id == run_id, runs.c.status == "input_required",
                                                          runs.c.ended_at.is_(None))
                                       .values(status="working", lease_owner=owner, lease_expires_at=until))
            if taken.rowcount == 0:
                return None
            return RunRecord.of((await conn.execute(select(runs).where(runs.c.id == run_id))).mappings().one())

    async def retake(self, run_id: str, owner: str, until: str) -> RunRecord | None:
        """Take a durable run that an execution of its workflow had taken to resume (`take_paused`) before it
        died, in the step that takes it: still `working`, its stored state still the pause's (only its
        workflow takes it, one execution at a time, so nobody else holds it)."""
        async with self.db.begin() as conn:
            taken = await conn.execute(update(runs).where(runs.c.id == run_id, runs.c.status == "working",
                                                          runs.c.ended_at.is_(None))
                                       .values(lease_owner=owner, lease_expires_at=until))
            if taken.rowcount == 0:
                return None
            return RunRecord.of((await conn.execute(select(runs).where(runs.c.id == run_id))).mappings().one())

    async def pause_again(self, run_id: str) -> None:
        """Give back a run taken to resume that had nothing to resume with (its conversation stayed
        `input_required` meanwhile, so no message could start another run)."""
        async with self.db.begin() as conn:
            await conn.execute(update(runs).where(runs.c.id == run_id).values(
                status="input_required", lease_owner=None, lease_expires_at=None))

    async def decided_paused(self, before: str) -> list[str]:
        """Paused runs with a decision (or answer) made before `before` among their approvals."""
        r, a = runs.c, approvals.c
        query = select(r.id).distinct().join(approvals, a.run_id == r.id).where(
            r.status == "input_required", r.ended_at.is_(None), a.status != "pending", a.decided_at < before)
        async with self.db.connect() as conn:
            return list((await conn.execute(query)).scalars())

    async def paused(self) -> list[str]:
        """Every paused run's id."""
        async with self.db.connect() as conn:
            return [row[0] for row in await conn.execute(select(runs.c.id).where(
                runs.c.status == "input_required", runs.c.ended_at.is_(None)))]
