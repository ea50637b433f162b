"""Transient conversations (a `/v1` run's without a conversation, on the engine): born deleted, and purged
by the sweep when the API process that followed their run died before it purged them."""

from __future__ import annotations

from ringlet._ids import at
from ringlet.messages import Message
from ringlet.store import Store


async def test_a_transient_conversation_left_idle_is_found_and_purged(store: Store) -> None:
    left = await store.conversations.create(agent="a", transient=True)
    busy = await store.conversations.create(agent="a", transient=True)
    kept = await store.conversations.create(agent="a")
    await store.conversations.append_messages(left.id, [Message.user("hi")])
    await store.conversations.set_status(busy.id, "running")
    future = at(4_000_000_000)
    assert await store.conversations.transient_leftovers(future) == [left.id]  # not the busy one, not a normal one
    assert await store.conversations.transient_leftovers(at(0)) == []  # too young
    assert await store.conversations.get(left.id) is None  # born deleted: no route shows it
    await store.conversations.purge(left.id)
    assert await store.conversations.transient_leftovers(future) == []
    assert await store.conversations.load_messages(left.id) == []
    assert (await store.conversations.get(kept.id)).id == kept.id
