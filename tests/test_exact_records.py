"""Records that are exact under re-execution and crashes (issue 39): an `Idempotency-Key` is stored with the
run it names or not at all; an audit record appended again by a step executed again is kept once; of the
processes handing on a dead worker's runs, one says so."""

from __future__ import annotations

import pytest

from ringlet.errors import ConversationBusy
from ringlet.messages import Message
from ringlet.store import Store
from ringlet.store.records import Claim
from ringlet.store.request_records import KeyTaken


def claim(key: str = "k1") -> Claim:
    return Claim("key_1", key, "messages:c", "digest", {"run_id": "r_1"})


async def test_a_key_is_stored_with_its_run(store: Store) -> None:
    conversation = await store.conversations.create(agent="a")
    await store.runs.create("r_1", agent="a", conversation_id=conversation.id, incoming=[Message.user("hi")],
                            claim=claim())
    kept = await store.requests.recall("key_1", "k1")
    assert kept is not None
    assert kept.response == {"run_id": "r_1"}
    assert await store.runs.get("r_1") is not None


async def test_a_key_is_never_stored_without_its_run(store: Store) -> None:
    conversation = await store.conversations.create(agent="a")
    await store.runs.create("r_1", agent="a", conversation_id=conversation.id, incoming=[Message.user("hi")])
    with pytest.raises(ConversationBusy):  # the run cannot start: its key is not kept either
        await store.runs.create("r_2", agent="a", conversation_id=conversation.id, incoming=[Message.user("again")],
                                claim=claim())
    assert await store.requests.recall("key_1", "k1") is None
    assert await store.runs.get("r_2") is None


async def test_a_key_taken_already_starts_nothing(store: Store) -> None:
    first, second = await store.conversations.create(agent="a"), await store.conversations.create(agent="a")
    await store.runs.create("r_1", agent="a", conversation_id=first.id, incoming=[Message.user("hi")], claim=claim())
    with pytest.raises(KeyTaken):
        await store.runs.create("r_2", agent="a", conversation_id=second.id, incoming=[Message.user("hi")],
                                claim=claim())
    assert await store.runs.get("r_2") is None
    assert (await store.conversations.get(second.id)).status == "idle"  # type: ignore[union-attr]
    assert await store.conversations.load_messages(second.id) == []


async def test_an_audit_record_appended_again_is_kept_once(store: Store) -> None:
    record = {"audit_id": "au_1", "at": "2026-11-28T00:00:00Z", "run_id": "r_1", "action": "approval.decide",
              "tool": "charge", "decision": "approved"}
    await store.audit.append(record)
    await store.audit.append(record)  # a durable step executed again after its worker died
    assert [e.record["audit_id"] for e in await store.audit.list(run_id="r_1")] == ["au_1"]


async def test_one_process_forgets_a_dead_worker(store: Store) -> None:
    from sqlalchemy import insert

    from ringlet.store.schema import workers
    from ringlet.store.worker_records import Workers

    async with store.db.begin() as conn:
        await conn.execute(insert(workers).values(id="w@h:1", role="worker", started_at="t", seen_at=0.0))
    records = Workers(store.db)
    assert [await records.forget("w@h:1"), await records.forget("w@h:1")] == [True, False]  # it says so once


async def test_a_run_stored_reads_where_its_events_begin_in_the_same_transaction(store: Store) -> None:
    """`runs.create` returns the conversation's last event id as it claimed it (`Engine.dispatch` follows the run
    from there, with no read of its own); 0 for a run with no conversation."""
    conversation = await store.conversations.create(agent="a")
    await store.events.append_batch([(conversation.id, "status", {"run_id": "r_0", "state": "x"})] * 3)
    assert await store.runs.create("r_1", agent="a", conversation_id=conversation.id,
                                   incoming=[Message.user("hi")]) == 3
    assert await store.runs.create("r_2", agent="a") == 0
