"""API keys (`server-contract.md` §1): `rk_` + 32 random bytes in base62, stored only as SHA-256 hashes."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Sequence
from typing import Literal

from sqlalchemy import delete, insert, select, update

from ringlet._ids import at, new_id, now
from ringlet.errors import ConfigError
from ringlet.store.engine import Db
from ringlet.store.records import ApiKey
from ringlet.store.schema import api_keys, stream_tokens

Scope = Literal["chat", "approve", "trigger", "admin", "metrics"]
SCOPES: tuple[Scope, ...] = ("chat", "approve", "trigger", "admin", "metrics")
_BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def _base62(data: bytes) -> str:
    n, out = int.from_bytes(data), []
    while n:
        n, r = divmod(n, 62)
        out.append(_BASE62[r])
    return "".join(reversed(out)) or "0"


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class Keys:
    """Create, verify, list and revoke API keys."""

    def __init__(self, db: Db) -> None:
        self.db = db

    async def create(self, name: str, *, scopes: Sequence[str] = ("chat",), user_id: str = "local",
                     org_id: str = "default", roles: Sequence[str] = (), realms: Sequence[str] | str = "*",
                     agents: Sequence[str] | str = "*", expires_in_days: float | None = None
                     ) -> tuple[str, ApiKey]:
        """A new key and its record. The key itself is returned this once and never stored."""
        unknown = sorted(set(scopes) - set(SCOPES))
        if unknown:
            raise ConfigError(f"unknown scope {unknown[0]!r}; scopes are {', '.join(SCOPES)}")
        key = "rk_" + _base62(secrets.token_bytes(32))
        expires = at(time.time() + expires_in_days * 86400) if expires_in_days else None
        row = {"id": new_id("key"), "name": name, "hash": _digest(key), "prefix": key[:10], "user_id": user_id,
               "org_id": org_id, "roles": list(roles), "scopes": list(scopes),
               "realms": realms if isinstance(realms, str) else list(realms),
               "agents": agents if isinstance(agents, str) else list(agents),
               "created_at": now(), "expires_at": expires, "revoked_at": None}
        async with self.db.begin() as conn:
            await conn.execute(insert(api_keys).values(**row))
        return key, ApiKey.of(row)

    async def verify(self, key: str) -> ApiKey | None:
        """The record of a valid key; None for an unknown, revoked or expired one."""
        digest = _digest(key)
        async with self.db.connect() as conn:
            row = (await conn.execute(select(api_keys).where(api_keys.c.hash == digest))).mappings().first()
        if row is None or not hmac.compare_digest(row["hash"], digest) or row["revoked_at"] is not None:
            return None
        if row["expires_at"] is not None and row["expires_at"] <= now():
            return None
        return ApiKey.of(row)

    async def list(self) -> list[ApiKey]:
        async with self.db.connect() as conn:
            rows = (await conn.execute(select(api_keys).order_by(api_keys.c.created_at))).mappings()
            return [ApiKey.of(r) for r in rows]

    async def revoke(self, key_id: str) -> bool:
        async with self.db.begin() as conn:
            result = await conn.execute(update(api_keys).where(api_keys.c.id == key_id,
                                                               api_keys.c.revoked_at.is_(None)).values(revoked_at=now()))
        return result.rowcount > 0

    async def get(self, key_id: str) -> ApiKey | None:
        """A key's record while it is valid (not revoked, not expired)."""
        async with self.db.connect() as conn:
            row = (await conn.execute(select(api_keys).where(api_keys.c.id == key_id))).mappings().first()
        if row is None or row["revoked_at"] is not None or (row["expires_at"] and row["expires_at"] <= now()):
            return None
        return ApiKey.of(row)

    async def create_stream_token(self, key_id: str, ttl_s: int = 60) -> str:
        """A one-use token standing for `key_id`, for browser EventSource streams (which cannot send headers)."""
        token = "st_" + _base62(secrets.token_bytes(24))
        expires = at(time.time() + ttl_s)
        async with self.db.begin() as conn:
            await conn.execute(insert(stream_tokens).values(hash=_digest(token), key_id=key_id, expires_at=expires))
        return token

    async def redeem_stream_token(self, token: str) -> str | None:
        """The key id a stream token stands for, once: the token is deleted as it is redeemed."""
        async with self.db.begin() as conn:
            row = (await conn.execute(delete(stream_tokens).where(stream_tokens.c.hash == _digest(token))
                                      .returning(stream_tokens.c.key_id, stream_tokens.c.expires_at))).first()
        if row is None or row[1] <= now():
            return None
        return row[0]
