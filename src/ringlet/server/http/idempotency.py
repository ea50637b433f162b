"""`Idempotency-Key` (`server-contract.md` §2), shared by every route that accepts one."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Header

from ringlet.server.http.errors import ApiError
from ringlet.store import Store

IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key", max_length=200)]


@asynccontextmanager
async def idempotent(store: Store, caller: str, key: str | None, route: str, body: bytes,
                     response: dict[str, Any]) -> AsyncIterator[dict[str, Any] | None]:
    """Claim `key` for this request around its work, before the work starts (so a concurrent retry finds
    the claim). Yields None when the work should run (a failure releases the claim), or the recorded
    `response` of the same earlier request. The key used for another request is 409."""
    if not key:
        yield None
        return
    digest = hashlib.sha256(body).hexdigest()
    prior = await store.requests.remember(caller, key, route, digest, response)
    if prior is not None:
        if (prior.body_hash, prior.route) != (digest, route):
            raise ApiError(409, "idempotency_key_reused", "this Idempotency-Key was used with a different request; "
                           "use a new key for a new request")
        yield prior.response
        return
    try:
        yield None
    except BaseException:  # the work never happened: the key must not point at it
        await store.requests.forget(caller, key)
        raise
