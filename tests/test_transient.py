"""Transient conversations (a `/v1` run's without a conversation, on the engine): born deleted, and purged
by the sweep when the API process that followed their run died before it purged them."""

from __future__ import annotations

from ringlet._ids import at
from ringlet.messages import Message
from ringlet.store import Store


async def test_a_transient_conversation_left_idle_is_found_and_purged(store: Store) -> None:
    left = await store.create_conversation(agent="a", transient=True)
    busy = await store.create_conversation(agent="a", transient=True)
    kept = await store.create_conversation(agent="a")
    await store.append_messages(left["id"], [Message.user("hi")])
    await store.set_status(busy["id"], "running")
    future = at(4_000_000_000)
    assert await store.transient_leftovers(future) == [left["id"]]  # not the busy one, not a normal one
    assert await store.transient_leftovers(at(0)) == []  # too young
    assert await store.get_conversation(left["id"]) is None  # born deleted: no route shows it
    await store.purge_conversation(left["id"])
    assert await store.transient_leftovers(future) == []
    assert await store.load_messages(left["id"]) == []
    assert (await store.get_conversation(kept["id"]))["id"] == kept["id"]
