"""Per-run values of a graph run: the active-time clock, the run environment nodes share, and one node's call.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from ringlet._ids import SYSTEM, Seam
from ringlet.errors import RunError
from ringlet.events import BaseEvent, Event, QuestionEvent, QuestionOption, StatusEvent
from ringlet.graph.human import NeedsAnswer, Question, question_id
from ringlet.graph.runtime import Runtime
from ringlet.usage import Usage

__all__ = ["ActiveClock", "NodeCall", "RunEnv"]


class ActiveClock:
    """Active wall-clock time of a run (§8): time spent waiting for a human does not count. `step()` bounds
    a super-step by what is left; a human wait suspends that bound and restores it afterwards. It reads
    `seam.monotonic` (the runtime's seam)."""

    def __init__(self, limit: float | None, elapsed: float = 0.0, seam: Seam = SYSTEM) -> None:
        self.limit, self.base, self.seam = limit, elapsed, seam
        self.started = seam.monotonic()
        self.paused = 0.0
        self.waiting = 0
        self.wait_started = 0.0
        self._timeout: asyncio.Timeout | None = None
        self.timed_out = False
        """Whether the last step ended because the run's time was up."""

    def elapsed(self) -> float:
        t = self.seam.monotonic()
        return self.base + (t - self.started) - self.paused - (t - self.wait_started if self.waiting else 0.0)

    def remaining(self) -> float | None:
        return None if self.limit is None else self.limit - self.elapsed()

    def expired(self) -> bool:
        left = self.remaining()
        return left is not None and left <= 0

    @asynccontextmanager
    async def step(self) -> AsyncIterator[None]:
        left = self.remaining()
        if left is None:
            yield
            return
        self.timed_out = False
        async with asyncio.timeout(max(left, 0.0)) as timeout:
            self._timeout = timeout
            try:
                yield
            finally:
                self._timeout = None
                self.timed_out = timeout.expired()

    @asynccontextmanager
    async def human(self) -> AsyncIterator[None]:
        if self.waiting == 0:
            self.wait_started = self.seam.monotonic()
            if self._timeout is not None:
                self._timeout.reschedule(None)
        self.waiting += 1
        try:
            yield
        finally:
            self.waiting -= 1
            if self.waiting == 0:
                self.paused += self.seam.monotonic() - self.wait_started
                left = self.remaining()
                if self._timeout is not None and left is not None:
                    self._timeout.reschedule(asyncio.get_running_loop().time() + max(left, 0.0))


@dataclass(eq=False)
class RunEnv:
    """What every node of one run shares."""

    runtime: Runtime
    run_id: str
    emit: Callable[[Event], None]
    variables: dict[str, str]
    clock: ActiveClock
    usage: Usage = field(default_factory=Usage)
    answers: dict[str, str] = field(default_factory=dict)
    answerer: Callable[[Question], Awaitable[str]] | None = None
    tool_approver: Any = None
    """The approver of tool calls inside llm nodes (one with `wait`)."""
    approver: Any = None
    """The approver as given: passed on to agent-node children."""
    depth: int = 0
    """This run's agent depth: 0 at the root; a child graph's run is its parent's + 1."""
    stats: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per node: runs, total microseconds, failures (kept in the checkpoint)."""
    caller: dict[str, Any] = field(default_factory=dict)
    """realm, user_id, org_id, roles, conversation_id, channel of the run's caller."""
    steps: Any = None
    """A durable run's step executor (`ringlet.loop.StepExecutor`): each node call of a super-step, and each
    checkpoint, is one of its steps. None: they run directly."""

    def event(self, cls: type[BaseEvent], **fields: Any) -> Any:
        return cls(run_id=self.run_id, ts=self.runtime.seam.stamp(), **fields)

    async def ask(self, question: Question, kind: str) -> str:
        """The answer to `question`: given on resume, or from the approver (the wait is not active time);
        with neither, the run pauses (or fails, when so configured)."""
        if question.question_id in self.answers:
            return self.answers[question.question_id]
        self.emit(self.event(QuestionEvent, question_id=question.question_id, node_id=question.node_id,
                             question=question.question, input_type=question.input_type,
                             options=tuple(QuestionOption(o) for o in question.options),
                             allow_freeform=question.allow_freeform, default=question.default))
        if self.answerer is None:
            if self.runtime.options.on_question == "fail":
                raise RunError("no_human", f"{kind} node '{question.node_id}' needs a human answer, but there is "
                                           "no terminal or server to ask")
            raise NeedsAnswer(question)
        self.emit(self.event(StatusEvent, state="input_required"))
        async with self.clock.human():
            answer = await self.answerer(question)
        self.emit(self.event(StatusEvent, state="working"))
        return answer


@dataclass(eq=False)
class NodeCall:
    """One execution of one node: its own copy of the pre-step state (a fork, for map items)."""

    env: RunEnv
    node_id: str
    node: Any
    state: dict[str, Any]
    step: int
    visit: int
    item_index: int | None = None
    in_map: bool = False

    @property
    def spec(self) -> Any:
        return self.env.runtime.spec

    def question_id(self) -> str:
        return question_id(self.env.run_id, self.step, self.node_id, self.item_index)
