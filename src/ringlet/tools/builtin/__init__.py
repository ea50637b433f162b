"""The built-in tools, one module each: `clock` (current_time), `calculate` (with `units`), `question`
(ask_question), `schedules` (alarm_clock, schedule_task, list_schedules, update_schedule, remove_schedule;
when they run: `schedule_timing`) and `web` (web_fetch). `selection` names them all: what an agent's
`builtin_tools:` selects from.

`calculate` and `current_time` are importable from here, as a config.yaml names them
(`tools: ['ringlet.tools.builtin:calculate']`). This package imports no more than those two, so the modules
the loop needs (`question`) come without every tool.
"""

from ringlet.tools.builtin.calculate import calculate
from ringlet.tools.builtin.clock import current_time

__all__ = ["calculate", "current_time"]
