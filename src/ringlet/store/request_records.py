"""Idempotent requests (`server-contract.md` §2): the first answer to a request sent with an
`Idempotency-Key`, per key and principal, kept 24 hours (and one-use stream tokens, pruned with them)."""

from __future__ import annotations

from sqlalchemy import delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from ringlet._ids import now
from ringlet.errors import RingletError
from ringlet.store.engine import Db, HotConn
from ringlet.store.records import Claim, Json, KeptRequest
from ringlet.store.schema import idempotency, stream_tokens


class Requests:
    """The `idempotency_keys` table."""

    def __init__(self, db: Db) -> None:
        self.db = db

    async def remember(self, principal: str, key: str, route: str, body_hash: str,
                       response: Json) -> KeptRequest | None:
        """Record the response of an idempotent request. None when it was recorded, or the earlier record when
        the key was used before."""
        try:
            async with self.db.begin() as conn:
                await claim_in(conn, Claim(principal, key, route, body_hash, response))
        except KeyTaken:
            return await self.recall(principal, key)
        return None

    async def update(self, principal: str, key: str, response: Json) -> None:
        async with self.db.begin() as conn:
            await conn.execute(update(idempotency).where(idempotency.c.principal == principal,
                                                         idempotency.c.key == key).values(response=response))

    async def forget(self, principal: str, key: str) -> None:
        async with self.db.begin() as conn:
            await conn.execute(delete(idempotency).where(idempotency.c.principal == principal,
                                                         idempotency.c.key == key))

    async def recall(self, principal: str, key: str) -> KeptRequest | None:
        async with self.db.connect() as conn:
            found = (await conn.execute(select(idempotency).where(
                idempotency.c.principal == principal, idempotency.c.key == key))).mappings().first()
        return KeptRequest(found["route"], found["body_hash"], found["response"], found["created_at"]) \
            if found else None

    async def prune(self, before: str) -> None:
        """Forget the requests older than `before`, and expired stream tokens."""
        async with self.db.begin() as conn:
            await conn.execute(delete(idempotency).where(idempotency.c.created_at < before))
            await conn.execute(delete(stream_tokens).where(stream_tokens.c.expires_at < now()))


class KeyTaken(RingletError):
    """The `Idempotency-Key` was stored already (by the same request sent earlier, or at the same time)."""


INSERT_REQUEST = insert(idempotency)


async def claim_in(conn: HotConn, claim: Claim) -> None:
    """Store an idempotent request's key in the transaction of `conn` (`KeyTaken` when it is stored already:
    the transaction is then rolled back)."""
    try:
        await conn.execute(INSERT_REQUEST, {
            "principal": claim.principal, "key": claim.key, "route": claim.route, "body_hash": claim.body_hash,
            "response": claim.response, "created_at": now()})
    except IntegrityError:
        raise KeyTaken(claim.key) from None
