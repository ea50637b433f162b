"""How the suite spreads over pytest-xdist's processes (`-n 4 --dist load`, as the Makefile runs it).

Each test is a unit of work of its own, so the processes end together: with `--dist loadfile` a whole file
went to one process, and the suite waited at its end on the one that had drawn a file of crash tests (one
takes minutes). The modules of `ONE_PROCESS` share something costly through a module-scoped fixture (a
loaded model, a server): their tests stay together in one process, which builds it once.

The `slow` tests are handed out first and the quick ones fill the processes up at the end: a process that
draws a slow test last is not left running it alone while the others have finished.

xdist's own `--dist loadgroup` would do the grouping with a mark, but it cannot with pytest 9.2 (it renames
a test by `item._nodeid`, which pytest no longer reads), so this scheduler is xdist's `LoadScopeScheduling`
with its documented extension point, the scope of a test (`_split_scope`), as xdist's own `loadfile` and
`loadgroup` schedulers are written. pyproject.toml pins the xdist version it was written against;
tests/test_scheduling.py runs it."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

ONE_PROCESS = frozenset({
    "tests/test_assistant.py",  # the embedded model, loaded and its assistant's prefix warmed once
    "tests/test_local_models.py",  # a llama.cpp server on the embedded model
})


class OneTestAtATime(LoadScopeScheduling):
    """A unit of work per test, but one per module for the modules of `ONE_PROCESS`; units go out in the
    order the workers collected them in (`pytest_collection_modifyitems`), the modules' first."""

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        return module if module in ONE_PROCESS else nodeid


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadScopeScheduling | None:
    """`--dist load` (what `-n` alone means) schedules with `OneTestAtATime`; other modes as xdist does."""
    return OneTestAtATime(config, log) if config.getvalue("dist") == "load" else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In an xdist worker, the `slow` tests first (a stable sort: otherwise in collection order). Every
    worker collects the same way, so their collections stay identical, as xdist requires."""
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


TAKEN: Counter[str] = Counter()
"""Seconds each test took, its setup, call and teardown together (in the process that prints the summary)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("slow_after_s", "a test not marked `slow` that takes longer is named at the end of the run",
                  default="3")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "slow" not in report.keywords:
        TAKEN[report.nodeid] += report.duration


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Names the tests not marked `slow` that took longer than `slow_after_s`: mark them, if they take that
    long on a quiet machine, so that `make test-fast` stays the quick loop."""
    limit = float(config.getini("slow_after_s"))
    over = [(seconds, nodeid) for nodeid, seconds in TAKEN.most_common() if seconds > limit]
    if over:
        terminalreporter.write_sep("-", f"{len(over)} tests not marked slow took over {limit:g} s")
        for seconds, nodeid in over[:20]:
            terminalreporter.write_line(f"{seconds:7.2f}s {nodeid}")
