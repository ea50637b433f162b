"""MCP OAuth connections waiting for their users (`server/protocols/connections.py`), so the authorization
server's redirect may come back to any process of a server, not only the one whose run waits.

A row is named by the SHA-256 of the flow's OAuth state (the state itself is not stored); the authorization
URL and the callback's answer (code or error) are sealed by the caller before they get here. The process that
records the answer tells the waiting one with `NOTIFY` on `CHANNEL` (PostgreSQL), the payload the row's name.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import delete, insert, select, text, update

from ringlet._ids import now
from ringlet.store.engine import Db
from ringlet.store.schema import mcp_connections

__all__ = ["CHANNEL", "PendingConnections", "StoredConnection"]

CHANNEL = "ringlet_mcp_connected"
_c = mcp_connections.c


@dataclass(frozen=True)
class StoredConnection:
    name: str
    realm: str
    user: str | None
    server: str
    sealed: bytes


class PendingConnections:
    """The `mcp_connections` table."""

    def __init__(self, db: Db) -> None:
        self.db = db

    async def add(self, connection: StoredConnection, expires_at: str) -> None:
        async with self.db.begin() as conn:
            await conn.execute(insert(mcp_connections).values(
                name=connection.name, realm=connection.realm, user_id=connection.user, server=connection.server,
                sealed=connection.sealed, expires_at=expires_at))

    async def answer(self, name: str, sealed: bytes) -> bool:
        """Record the callback's answer for the connection `name` waits on, once, and tell the processes:
        False when none waits (never did, expired, or answered already)."""
        async with self.db.begin() as conn:
            done = await conn.execute(update(mcp_connections).where(
                _c.name == name, _c.answer.is_(None), _c.expires_at > now()).values(answer=sealed))
            if done.rowcount != 1:
                return False
            if conn.dialect.name == "postgresql":
                await conn.execute(text("SELECT pg_notify(:channel, :name)"), {"channel": CHANNEL, "name": name})
        return True

    async def answered(self, name: str) -> bytes | None:
        async with self.db.connect() as conn:
            found = (await conn.execute(select(_c.answer).where(_c.name == name))).scalar()
        return bytes(found) if found is not None else None

    async def remove(self, name: str) -> None:
        async with self.db.begin() as conn:
            await conn.execute(delete(mcp_connections).where(_c.name == name))

    async def waiting_for(self, user: str | None) -> list[StoredConnection]:
        """The user's connections that wait for them (not answered, not expired), in any realm."""
        async with self.db.connect() as conn:
            rows = (await conn.execute(select(mcp_connections).where(
                _c.user_id == user, _c.answer.is_(None), _c.expires_at > now())
                .order_by(_c.expires_at))).mappings().all()
        return [StoredConnection(r["name"], r["realm"], r["user_id"], r["server"], bytes(r["sealed"])) for r in rows]
