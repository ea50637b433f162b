"""`current_time` (`builtin-tools-and-subagents.md` §1): the date and time, in any IANA time zone."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ringlet.tools.function import tool


@tool(effect="read", timeout_s=5)
def current_time(timezone: str = "UTC") -> str:
    """The current date and time.

    Args:
        timezone: An IANA time zone such as "Europe/Paris"; UTC by default.
    """
    try:
        zone = ZoneInfo(timezone) if timezone.upper() != "UTC" else UTC
    except (ZoneInfoNotFoundError, ValueError):
        return f'unknown time zone "{timezone}"; use an IANA name such as "Europe/Paris"'
    return datetime.now(zone).strftime("%A %Y-%m-%d %H:%M:%S %Z")
