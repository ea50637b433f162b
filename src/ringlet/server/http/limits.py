"""Per-key limits (`server-contract.md` §2, 429): a request rate, and caps on open streams and active runs.

    limits = Limits.of(settings)              # one per server; the Runner holds it
    limits.admit("k_1")                       # a request of key k_1: a token from its bucket, or 429
    slot = limits.streams.hold("k_1")         # an open SSE stream, or 429; slot.release() when it ends
    limits.runs.hold("k_1", run_id)           # an active run, or 429; limits.runs.release(run_id)
    await limits.runs.acquire("k_1", run_id)  # a run the server starts for k_1 (a fire, a schedule, a resumed
                                              # pause): it waits its turn among k_1's active runs

Every refusal is an `ApiError` 429 `rate_limited` with `Retry-After` in whole seconds, naming the limit
and its setting. A setting of 0 turns its limit off. Keys are `Principal.key_id`: an API key's id, `local`
in development mode (`auth_mode: none`), `trigger:<id>` / `schedule:<id>` for runs the server starts.

Scope: the rate and the open streams are this process's (each keeps its own buckets and counts, so N
replicas allow N times the rate). The active runs are counted here first (the order in which this process's
runs of a key wait), then, on PostgreSQL, in the database as each run is stored (`store.run_records.admit`),
so the cap holds across every process that shares it: a run refused there is the same 429 (`refusal`), and a
run that waits its turn waits again (`freed`) until a run of its key ends or pauses in any process (each
process says so on the engine's feed: `heard`).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections import Counter, deque
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field

from ringlet.server.http.errors import ApiError
from ringlet.server.http.settings import ServerSettings

__all__ = ["BUSY_RETRY_S", "Cap", "Limits", "RequestRate", "Slot", "TokenBucket", "hold_stream", "rate_limited"]

BUSY_RETRY_S = 5
"""`Retry-After` when a cap is full: when a stream closes or a run ends is not known in advance."""


def rate_limited(message: str, retry_after_s: float, limit: str) -> ApiError:
    """The 429: `Retry-After` is whole seconds, at least 1."""
    seconds = max(1, math.ceil(retry_after_s))
    return ApiError(429, "rate_limited", message, headers={"Retry-After": str(seconds)},
                    details={"limit": limit, "retry_after_s": seconds})


class TokenBucket:
    """`rate` tokens a second, holding at most `burst`; it starts full. `take()` is 0.0 when it took a
    token, else the seconds until one is due (nothing is taken then)."""

    __slots__ = ("burst", "clock", "rate", "stamp", "tokens")

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self.clock = rate, max(burst, 1.0), clock
        self.tokens, self.stamp = self.burst, clock()

    def take(self) -> float:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate


@dataclass(eq=False)
class RequestRate:
    """One token bucket per key: `per_minute` requests a minute, `burst` at once (0: no limit). A bucket
    that has filled up again is the same as a new one, so full buckets are dropped when many are kept."""

    per_minute: float
    burst: int
    clock: Callable[[], float] = time.monotonic
    buckets: dict[str, TokenBucket] = field(default_factory=dict)
    PRUNE_AT = 10_000

    def admit(self, key: str) -> None:
        if self.per_minute <= 0:
            return
        bucket = self.buckets.get(key)
        if bucket is None:
            if len(self.buckets) >= self.PRUNE_AT:
                self._prune()
            bucket = self.buckets[key] = TokenBucket(self.per_minute / 60, self.burst, self.clock)
        wait = bucket.take()
        if wait:
            raise rate_limited(f"too many requests: key {key} may send {self.per_minute:g} requests a minute, "
                               f"{self.burst} at once (server settings rate_limit_per_minute and "
                               "rate_limit_burst); retry after Retry-After seconds", wait, "rate_limit_per_minute")

    def _prune(self) -> None:
        for key, bucket in list(self.buckets.items()):
            if bucket.tokens + (self.clock() - bucket.stamp) * bucket.rate >= bucket.burst:
                del self.buckets[key]


@dataclass(eq=False)
class Slot:
    """One held place in a `Cap`; releasing it again does nothing."""

    cap: Cap
    holder: object

    def release(self) -> None:
        self.cap.release(self.holder)


@dataclass(eq=False)
class Cap:
    """At most `limit` things held at once per key (0: no limit), each by a holder released once."""

    limit: int
    what: str
    """What is held, for the message: "open event streams", "active runs"."""
    setting: str
    advice: str
    counts: Counter[str] = field(default_factory=Counter)
    holders: dict[object, str] = field(default_factory=dict)
    waiting: dict[str, deque[asyncio.Future[None]]] = field(default_factory=dict)
    """Per key, who waits in `acquire` for a place, first come first served."""
    elsewhere: dict[str, list[asyncio.Future[None]]] = field(default_factory=dict)
    """Per key, who waits in `freed` for a place counted across processes."""
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    def full(self, key: str, holder: object = None) -> bool:
        """Whether `key` holds `limit` places (`holder` holding one already is never refused)."""
        return bool(self.limit) and self.counts[key] >= self.limit and holder not in self.holders

    def busy(self, key: str, holder: object = None) -> bool:
        """Whether a place for `key` must be waited for: the key holds `limit`, or others wait for one
        already (they go first). `holder` holding one already never waits."""
        return self.full(key, holder) or (bool(self.waiting.get(key)) and holder not in self.holders)

    def hold(self, key: str, holder: object = None) -> Slot:
        """Hold a place for `key` (under `holder`, else a new one), or 429 when the key must wait (`busy`)."""
        if self.busy(key, holder):
            raise self.refusal(key, self.counts[key])
        return self._take(key, holder)

    def refusal(self, key: str, held: int) -> ApiError:
        """The 429 for `key` holding `held` places (here, or counted across processes)."""
        return rate_limited(f"key {key} already has {held} {self.what}, the most one key may have (server "
                            f"setting {self.setting}); {self.advice}", BUSY_RETRY_S, self.setting)

    async def freed(self, key: str, timeout_s: float) -> None:
        """Wait until a place of `key` is given back here or in another process (`heard`), or `timeout_s`
        passes (a notice lost with a dropped connection): then the caller counts again."""
        turn = asyncio.get_running_loop().create_future()
        self.elsewhere.setdefault(key, []).append(turn)
        try:
            async with asyncio.timeout(timeout_s):
                await turn
        except TimeoutError:
            pass
        finally:
            waiting = self.elsewhere.get(key, [])
            if turn in waiting:
                waiting.remove(turn)
            if not waiting:
                self.elsewhere.pop(key, None)

    def heard(self, key: str) -> None:
        """A run of `key` ended or paused (in any process): who waits in `freed` counts again."""
        for turn in self.elsewhere.pop(key, []):
            if not turn.done():
                turn.set_result(None)

    async def acquire(self, key: str, holder: object = None) -> Slot:
        """Hold a place for `key`, waiting for one (in the order asked) while the key holds `limit`."""
        while self.busy(key, holder):
            turn = asyncio.get_running_loop().create_future()
            queue = self.waiting.setdefault(key, deque())
            queue.append(turn)
            try:
                await turn
            finally:
                if turn in queue:
                    queue.remove(turn)
                if not queue:
                    self.waiting.pop(key, None)
                task = asyncio.current_task()
                if turn.done() and not turn.cancelled() and task is not None and task.cancelling():
                    self._wake(key)  # woken, but leaving: the next in line takes the place
            if not self.full(key, holder):
                break
        return self._take(key, holder)

    def _take(self, key: str, holder: object) -> Slot:
        holder = (self, next(self._ids)) if holder is None else holder
        if holder not in self.holders:
            self.holders[holder] = key
            self.counts[key] += 1
        return Slot(self, holder)

    def release(self, holder: object) -> None:
        key = self.holders.pop(holder, None)
        if key is None:
            return
        self.counts[key] -= 1
        if self.counts[key] <= 0:
            del self.counts[key]
        self._wake(key)
        self.heard(key)

    def _wake(self, key: str) -> None:
        """The first still waiting for a place of `key` goes on (it takes the place)."""
        for turn in self.waiting.get(key, ()):
            if not turn.done():
                turn.set_result(None)
                return

    def held(self, key: str) -> int:
        return self.counts[key]


@dataclass(eq=False)
class Limits:
    """The server's per-key limits (see the module docstring)."""

    rate: RequestRate
    streams: Cap
    runs: Cap

    @classmethod
    def of(cls, settings: ServerSettings, clock: Callable[[], float] = time.monotonic) -> Limits:
        return cls(RequestRate(settings.limit("rate_limit_per_minute"), int(settings.limit("rate_limit_burst")),
                               clock),
                   Cap(int(settings.limit("max_streams_per_key")), "open event streams", "max_streams_per_key",
                       "close one of them first"),
                   Cap(int(settings.limit("max_runs_per_key")), "active runs", "max_runs_per_key",
                       "wait for one to end (or cancel one) and send again"))

    def admit(self, key: str) -> None:
        """A request of `key`: 429 past its rate. The request's streams are then counted as the key's."""
        self.rate.admit(key)
        _requester.set((self, key))


_requester: ContextVar[tuple[Limits, str] | None] = ContextVar("ringlet_requester", default=None)
"""The limits and key of the request being handled, set when it is authenticated (`Limits.admit`)."""


def hold_stream() -> Slot | None:
    """A place among the open streams of the current request's key, or 429 when it has the most it may;
    None outside an authenticated request (nothing to count it against)."""
    found = _requester.get()
    return None if found is None else found[0].streams.hold(found[1])
