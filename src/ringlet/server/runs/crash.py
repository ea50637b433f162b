"""A test hook, and nothing else: crash tests kill a real process at an exact moment with it.

`RINGLET_TEST_CRASH_AT=<point>` in a process's environment makes that process SIGKILL itself the first
time it reaches `crash_point(<point>)`: no cleanup, no `finally`, as a machine that dies there. Unset
(always, outside tests) a point costs one comparison. The points:

- `after_record`: a run started on the engine is stored (`working`, its workflow's input with it) and its
  workflow is not enqueued yet (`starter.Starter.start`); recovery enqueues it (`engine.Engine.requeue`).
"""

from __future__ import annotations

import logging
import os
import signal

log = logging.getLogger("ringlet.server")


def crash_point(name: str) -> None:
    """SIGKILL this process here when a test asked for it (`RINGLET_TEST_CRASH_AT=name`); else nothing. The
    environment is read here, not at import: the tests fork their processes from one that imported ringlet."""
    if name == os.environ.get("RINGLET_TEST_CRASH_AT"):
        log.warning("test hook RINGLET_TEST_CRASH_AT=%s: this process kills itself now", name)
        os.kill(os.getpid(), signal.SIGKILL)
