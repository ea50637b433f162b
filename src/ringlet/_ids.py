"""Prefixed ULIDs and RFC 3339 timestamps: the run's only sources of identity and time.

`Seam` bundles them for a run: the loop, the agent and the graph engine take every clock reading and id
from the seam their step executor carries, never from this module, so a test or a durable engine can
pass fixed ones (`LocalSteps(Seam(now=..., new_id=...))`). `SYSTEM` is the real one, and the only default.

Hand-written rather than taken from a ULID package: `python-ulid` costs ~100 ms of import
(importlib.metadata) and ~9 µs per id here, and ids are made on the loop's hot path.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_PAIRS = [a + b for a in _CROCKFORD for b in _CROCKFORD]  # 10 bits -> 2 characters
_time_cache: tuple[int, str] = (-1, "")
_clock_cache: tuple[int, str] = (-1, "")
_stamp_cache: tuple[int, str] = (-1, "")


def _time_part(ms: int) -> str:
    """The 10-character time prefix (48 bits of milliseconds), recomputed only when the millisecond changes."""
    global _time_cache
    cached = _time_cache  # read once: another thread may replace it meanwhile
    if cached[0] != ms:
        p = _PAIRS
        cached = _time_cache = (ms, p[ms >> 40] + p[(ms >> 30) & 1023] + p[(ms >> 20) & 1023]
                                + p[(ms >> 10) & 1023] + p[ms & 1023])
    return cached[1]


def _random_block() -> Callable[[], bytes]:
    """Gives 10 random bytes at a time from one `os.urandom` read of 256 draws: one system call per 256 ids
    (a list iterator's `__next__` is atomic, so threads never get the same bytes)."""
    block = os.urandom(2560)
    return iter([block[i:i + 10] for i in range(0, 2560, 10)]).__next__


_draw = _random_block()


def _new_block() -> None:
    global _draw
    _draw = _random_block()


os.register_at_fork(after_in_child=_new_block)  # a forked child must not reuse its parent's bytes


def _random80() -> int:
    try:
        return int.from_bytes(_draw())
    except StopIteration:
        _new_block()
        return int.from_bytes(_draw())


def ulid() -> str:
    """A ULID: 48 bits of milliseconds and 80 random bits, in Crockford base32 (26 characters)."""
    r = _random80()
    p = _PAIRS
    return (_time_part(time.time_ns() // 1_000_000) + p[r >> 70] + p[(r >> 60) & 1023] + p[(r >> 50) & 1023]
            + p[(r >> 40) & 1023] + p[(r >> 30) & 1023] + p[(r >> 20) & 1023] + p[(r >> 10) & 1023]
            + p[r & 1023])


def derived_id(prefix: str, seed: str) -> str:
    """An id of the usual shape derived from `seed` (the same seed, the same id): what a retried fire
    starts, or the conversation a client's own name stands for in one realm."""
    bits = int.from_bytes(hashlib.blake2b(f"{prefix}:{seed}".encode(), digest_size=17).digest())
    return f"{prefix}_" + "".join(_CROCKFORD[(bits >> (5 * i)) & 31] for i in range(26))


def new_id(prefix: str) -> str:
    """A new id such as ``r_01J…``: the prefix, an underscore and a ULID."""
    return f"{prefix}_{ulid()}"


@dataclass(frozen=True, slots=True)
class Seam:
    """Everything nondeterministic a run reads: the wall clock, a monotonic clock and new ids. A durable
    engine records them (or passes fixed ones) so that a replayed run computes the same events."""

    now: Callable[[], float] = time.time
    """Wall-clock epoch seconds: event `ts`, message `created_at`, approval deadlines."""
    monotonic: Callable[[], float] = time.perf_counter
    """Monotonic seconds: latencies, durations, the batch deadline."""
    new_id: Callable[[str], str] = new_id
    """A new id with the given prefix (`r`, `m`, `ap`, `q`, `au`)."""

    def stamp(self, t: float | None = None) -> str:
        """`t` (by default the current time) as RFC 3339 UTC with milliseconds."""
        global _clock_cache, _stamp_cache
        if t is None:
            t = self.now()
        ms = int(t * 1000)
        cached = _stamp_cache  # read once: another thread may replace it meanwhile
        if cached[0] == ms:  # a run stamps several events within one millisecond
            return cached[1]
        second, clock = ms // 1000, _clock_cache
        if clock[0] != second:
            clock = _clock_cache = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
        cached = _stamp_cache = (ms, f"{clock[1]}.{ms - second * 1000:03d}Z")
        return cached[1]


SYSTEM = Seam()
"""The real clocks and ULIDs: the default seam of every run."""
now = SYSTEM.stamp
"""`now()`: the current time as RFC 3339 UTC with milliseconds."""
at = SYSTEM.stamp
"""`at(t)`: an epoch time (seconds) as RFC 3339 UTC with milliseconds, like `now()`."""


def replayable(run_id: str) -> Seam:
    """The seam of a durable run: real clocks, and ids derived from `run_id` and a counter, so a run that
    is executed again from its recorded steps (on another worker, after a crash) makes the same ids in
    the same order: its messages, calls and approvals keep theirs. Each id keeps the run's ULID time part
    (ids still sort by when their run started) and 80 bits of BLAKE2b over the run id and the counter."""
    head = run_id.partition("_")[2][:10] or _time_part(time.time_ns() // 1_000_000)
    made = iter(range(1 << 62))

    def derived(prefix: str) -> str:
        r = int.from_bytes(hashlib.blake2b(f"{run_id}:{next(made)}".encode(), digest_size=10).digest())
        p = _PAIRS
        return (f"{prefix}_{head}{p[r >> 70]}{p[(r >> 60) & 1023]}{p[(r >> 50) & 1023]}{p[(r >> 40) & 1023]}"
                f"{p[(r >> 30) & 1023]}{p[(r >> 20) & 1023]}{p[(r >> 10) & 1023]}{p[r & 1023]}")

    return Seam(new_id=derived)
