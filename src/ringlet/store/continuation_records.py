"""`/v1` continuations (`server-contract.md` §7): the transcript of a run stopped on client tool calls, kept
until the client sends the results or `continuation_ttl_s` passes. Stored, so whichever API process gets
the results continues the run; taking one deletes it in the same statement, so only one request does.
"""

from __future__ import annotations

from sqlalchemy import delete, insert, select

from ringlet._ids import now
from ringlet.store.engine import Db
from ringlet.store.records import Json
from ringlet.store.schema import continuations


class Continuations:
    """The `continuations` table: `/v1` runs stopped on client tool calls."""

    def __init__(self, db: Db) -> None:
        self.db = db

    async def keep(self, run_id: str, *, key_id: str, agent: str, messages: list[Json],
                   expires_at: str) -> None:
        """Keep a run's transcript (messages as JSON) for `key_id` and `agent` until `expires_at`; expired
        ones go at the same time."""
        async with self.db.begin() as conn:
            await conn.execute(delete(continuations).where(continuations.c.expires_at <= now()))
            await conn.execute(delete(continuations).where(continuations.c.run_id == run_id))
            await conn.execute(insert(continuations).values(run_id=run_id, key_id=key_id, agent=agent,
                                                            messages=messages, expires_at=expires_at))

    async def take(self, run_id: str, *, key_id: str, agent: str) -> list[Json] | None:
        """The run's transcript, removed, when it is kept for this key and agent and has not expired; else
        None (another request took it first, or it never was, or it expired)."""
        c = continuations.c
        mine = (c.run_id == run_id, c.key_id == key_id, c.agent == agent, c.expires_at > now())
        async with self.db.begin() as conn:
            messages = (await conn.execute(select(c.messages).where(*mine))).scalar()
            if messages is None or (await conn.execute(delete(continuations).where(*mine))).rowcount != 1:
                return None
        return messages
