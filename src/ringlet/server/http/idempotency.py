"""`Idempotency-Key` (`server-contract.md` §2), shared by every route that accepts one.

A route that starts a run stores the key with the run, in one transaction (`claim_of`, then
`Runs.create(claim=…)`): a retry after the process that took the first request died finds both or neither,
so it follows the run the first one started, or starts it. Other routes claim the key around their work
(`idempotent`)."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Header

from ringlet.server.http.errors import ApiError
from ringlet.store.records import Claim
from ringlet.store.request_records import Requests

IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key", max_length=200)]


def claim_of(caller: str, key: str | None, route: str, body: bytes, response: dict[str, Any]) -> Claim | None:
    """The claim of a request sent with `key` (None without one), its `response` the one to give its retries."""
    return Claim(caller, key, route, hashlib.sha256(body).hexdigest(), response) if key else None


async def earlier(requests: Requests, claim: Claim | None) -> dict[str, Any] | None:
    """The recorded response of the same request sent before (None: it was not); 409 when its key was used
    for another request."""
    if claim is None:
        return None
    prior = await requests.recall(claim.principal, claim.key)
    if prior is None:
        return None
    if (prior.body_hash, prior.route) != (claim.body_hash, claim.route):
        raise ApiError(409, "idempotency_key_reused", "this Idempotency-Key was used with a different request; "
                       "use a new key for a new request")
    return prior.response


@asynccontextmanager
async def idempotent(requests: Requests, caller: str, key: str | None, route: str, body: bytes,
                     response: dict[str, Any]) -> AsyncIterator[dict[str, Any] | None]:
    """Claim `key` for this request around its work, before the work starts (so a concurrent retry finds
    the claim). Yields None when the work should run (a failure releases the claim), or the recorded
    `response` of the same earlier request. The key used for another request is 409."""
    claim = claim_of(caller, key, route, body, response)
    if claim is None:
        yield None
        return
    if await requests.remember(claim.principal, claim.key, claim.route, claim.body_hash, response) is not None:
        yield await earlier(requests, claim)
        return
    try:
        yield None
    except BaseException:  # the work never happened: the key must not point at it
        await requests.forget(caller, claim.key)
        raise
