"""Prefixed ULIDs and RFC 3339 timestamps: the run's only sources of identity and time.

Hand-written rather than taken from a ULID package: `python-ulid` costs ~100 ms of import
(importlib.metadata) and ~9 µs per id here, and ids are made on the loop's hot path.
"""

from __future__ import annotations

import os
import time

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_PAIRS = [a + b for a in _CROCKFORD for b in _CROCKFORD]  # 10 bits -> 2 characters
_time_cache: tuple[int, str] = (-1, "")
_clock_cache: tuple[int, str] = (-1, "")


def _time_part(ms: int) -> str:
    """The 10-character time prefix, recomputed only when the millisecond changes."""
    global _time_cache
    if _time_cache[0] != ms:
        chars, rest = [], ms
        for _ in range(10):
            rest, r = divmod(rest, 32)
            chars.append(_CROCKFORD[r])
        _time_cache = (ms, "".join(reversed(chars)))
    return _time_cache[1]


def ulid() -> str:
    """A ULID: 48 bits of milliseconds and 80 random bits, in Crockford base32 (26 characters)."""
    r = int.from_bytes(os.urandom(10))
    p = _PAIRS
    return (_time_part(time.time_ns() // 1_000_000) + p[r >> 70] + p[(r >> 60) & 1023] + p[(r >> 50) & 1023]
            + p[(r >> 40) & 1023] + p[(r >> 30) & 1023] + p[(r >> 20) & 1023] + p[(r >> 10) & 1023]
            + p[r & 1023])


def new_id(prefix: str) -> str:
    """A new id such as ``r_01J…``: the prefix, an underscore and a ULID."""
    return f"{prefix}_{ulid()}"


def now() -> str:
    """The current time as RFC 3339 UTC with milliseconds."""
    global _clock_cache
    t = time.time()
    second = int(t)
    if _clock_cache[0] != second:
        _clock_cache = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
    return f"{_clock_cache[1]}.{int((t - second) * 1000):03d}Z"


def at(t: float) -> str:
    """An epoch time (seconds) as RFC 3339 UTC with milliseconds, like `now()`."""
    second = int(t)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)) + f".{int((t - second) * 1000):03d}Z"
