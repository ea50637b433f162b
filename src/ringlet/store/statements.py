"""The statements of a conversation's hot path, built once and executed with parameters.

Building a SQLAlchemy statement (`insert(t).values(**row)`, `update(t).where(...).values(...)`) costs
several times what executing it does on SQLite (~0.8 ms against ~0.15 ms), so the statements every
conversation runs (create it, read it, start a run, store its messages and events, end it) are built
here at import; each call passes only its values. A key of the parameters that names a column of an
`INSERT`/`UPDATE` without `values()` is that column's new value; the other keys are `b_`-prefixed.
"""

from __future__ import annotations

from sqlalchemy import Float, String, and_, bindparam, case, func, insert, select, text, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from ringlet.store.schema import conversations, events, messages, run_tapes, runs

_c, _m, _r, _e = conversations.c, messages.c, runs.c, events.c

INSERT_CONVERSATION = insert(conversations)
CONVERSATION = select(conversations).where(_c.id == bindparam("b_id"), _c.deleted_at.is_(None))
CONVERSATION_IN_REALM = CONVERSATION.where(_c.realm == bindparam("b_realm"))

CLAIM = update(conversations).where(_c.id == bindparam("b_id"), _c.status != "running", _c.status != "input_required") \
    .values(status="running", updated_at=bindparam("b_stamp"),
            title=case((_c.title == "", func.coalesce(bindparam("b_title", type_=String), "")), else_=_c.title)) \
    .returning(_c.last_event_id)
"""Claim an idle conversation for a run; an untitled one takes `b_title` (None: it stays untitled). Its last
event id: the run's events come after it."""
TITLE = update(conversations).where(_c.id == bindparam("b_id"), _c.title == "").values(title=bindparam("b_title"))

_cost = bindparam("b_cost", type_=Float)
USAGE = update(conversations).where(_c.id == bindparam("b_id")).values(
    in_tokens=_c.in_tokens + bindparam("b_in"), out_tokens=_c.out_tokens + bindparam("b_out"),
    priced=case((_cost.is_(None), False), else_=_c.priced),
    cost_usd=case((and_(_c.priced, _cost.is_not(None)), func.coalesce(_c.cost_usd, 0.0) + _cost), else_=None),
    status=func.coalesce(bindparam("b_status", type_=String), _c.status), updated_at=bindparam("b_stamp"))
"""Add a run's usage to its conversation (and set its status, unless `b_status` is None). Once any run is
unpriced (`b_cost` None) the conversation's cost stays null: unknown, never a partial sum."""

INSERT_RUN = insert(runs)
UPSERT_TAPE = {dialect: make(run_tapes).on_conflict_do_update(
    index_elements=["run_id", "segment"], set_={"body": make(run_tapes).excluded.body,
                                                "created_at": make(run_tapes).excluded.created_at})
    for dialect, make in (("sqlite", sqlite_insert), ("postgresql", postgresql_insert))}
"""Per dialect: store a run's tape segment; one stored at its pause is replaced by the same segment at its end."""
UPDATE_RUN = update(runs).where(_r.id == bindparam("b_id"))
END_RUN = UPDATE_RUN.returning(_r.agent)
"""`UPDATE_RUN` that returns the run's agent (for the metrics of its end)."""

MESSAGE_IDS = select(_m.id).where(_m.id.in_(bindparam("b_ids", expanding=True)))
INSERT_MESSAGES = insert(messages)
INSERT_NEW_MESSAGES = {"sqlite": sqlite_insert(messages).on_conflict_do_nothing(index_elements=["id"]),
                       "postgresql": postgresql_insert(messages).on_conflict_do_nothing(index_elements=["id"])}
"""Per dialect: insert messages, leaving one whose id is already stored as it is."""
TRANSCRIPT = select(_m.body).where(_m.conversation_id == bindparam("b_id")).order_by(_m.seq)

RESERVE_EVENTS = text(
    "UPDATE conversations AS c SET last_event_id = c.last_event_id + v.n "
    "FROM unnest(CAST(:b_ids AS VARCHAR[]), CAST(:b_counts AS INTEGER[]), CAST(:b_events AS TEXT[])) AS v(id, n, e) "
    "WHERE c.id = v.id RETURNING c.id, c.last_event_id, pg_notify(:b_channel, concat("
    "'{\"c\":', to_json(c.id), ',\"i\":', c.last_event_id, ',\"n\":', v.n, ',\"o\":', CAST(:b_origin AS TEXT), "
    "',\"e\":' || v.e, '}'))")
"""PostgreSQL: reserve the ids of a batch's events (`b_counts[k]` for conversation `b_ids[k]`) and queue,
for each conversation, the `EVENTS_CHANNEL` notification of its range (sent at commit, dropped on
rollback), carrying the range's events themselves when `b_events[k]` (their JSON) is not NULL."""
INSERT_EVENTS = insert(events)

EVENTS_AFTER = select(_e.id, _e.type, _e.payload).where(
    _e.conversation_id == bindparam("b_id"), _e.id > bindparam("b_after")).order_by(_e.id).limit(bindparam("b_limit"))
EVENTS_OF_RUN_AFTER = EVENTS_AFTER.where(_e.run_id == bindparam("b_run"))
EVENT_MARKS = select(_c.last_event_id, _c.pruned_event_id).where(_c.id == bindparam("b_id"))


TAKE = update(runs).where(_r.id == bindparam("b_id"), _r.status == "working", _r.lease_owner == bindparam("b_owner")) \
    .values(lease_owner=bindparam("b_owner"), lease_expires_at=bindparam("b_until"))
"""A run this process started, taken by its workflow: its lease renewed, if this process still holds it."""
TRANSCRIPT_BEFORE = select(_m.body).where(
    _m.conversation_id == bindparam("b_id"),
    _m.seq < select(_m.seq).where(_m.id == bindparam("b_before")).scalar_subquery()).order_by(_m.seq)
"""A conversation's transcript before the message `b_before`."""
SET_STATUS = update(conversations).where(_c.id == bindparam("b_id")).values(
    status=bindparam("b_status"), updated_at=bindparam("b_stamp"))


INSERT_EVENTS_PG = ("INSERT INTO events (conversation_id, id, run_id, type, payload, created_at) SELECT * FROM "
                    "unnest($1::VARCHAR[], $2::INTEGER[], $3::VARCHAR[], $4::VARCHAR[], $5::JSON[], $6::VARCHAR[])")
"""PostgreSQL, on the driver (`driven.Driven`): a batch's events, one array per column (the payloads as JSON
text), in one statement."""
