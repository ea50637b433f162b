"""MCP OAuth tokens kept in the store, shared by every process of a server (`ringlet.mcp.tokens.TokenVault`).

A row is one sealed record: named by a hash of its owner (realm, user, server), its body Fernet ciphertext
made by `ringlet.mcp.tokens.Sealer` before it gets here. This table never sees a token in the clear, and
names no one.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from ringlet._ids import now
from ringlet.store.engine import Db
from ringlet.store.schema import mcp_tokens

__all__ = ["StoredTokens"]

_UPSERT = {dialect: make(mcp_tokens).on_conflict_do_update(
    index_elements=["name"], set_={"sealed": make(mcp_tokens).excluded.sealed,
                                   "updated_at": make(mcp_tokens).excluded.updated_at})
    for dialect, make in (("sqlite", sqlite_insert), ("postgresql", postgresql_insert))}


class StoredTokens:
    """The `mcp_tokens` table: sealed records by name (a `TokenVault`)."""

    def __init__(self, db: Db) -> None:
        self.db = db

    async def read(self, name: str) -> bytes | None:
        async with self.db.connect() as conn:
            found: Any = (await conn.execute(select(mcp_tokens.c.sealed).where(mcp_tokens.c.name == name))).scalar()
        return bytes(found) if found is not None else None

    async def write(self, name: str, blob: bytes) -> None:
        async with self.db.begin() as conn:
            await conn.execute(_UPSERT[conn.dialect.name], {"name": name, "sealed": blob, "updated_at": now()})

    async def delete(self, name: str) -> None:
        async with self.db.begin() as conn:
            await conn.execute(delete(mcp_tokens).where(mcp_tokens.c.name == name))
