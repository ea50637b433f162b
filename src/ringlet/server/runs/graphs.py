"""Graph runs on the server (`graph-workflows.md` §8, §10.4–10.6; `server-contract.md` §3–5).

`RunDriver` drives a graph run like a loop run: the same pump, event log, streams and leases. What differs
lives here, behind two small adapters:

- `GraphTrack` is how `RunDriver.drive` stores a graph run as it goes. The engine writes a checkpoint after
  every super-step itself; a question (an approval or input node with no one to ask) is stored as a
  `kind="question"` record before it is announced, and the run pauses on it durably (`input_required`);
  the End output becomes the assistant message.
- `GraphRuns` continues a paused run once its question is answered (`resume_stream(run_id, answers)`, in
  whichever process receives the answer), and resumes an interrupted run from its last checkpoint: by hand
  (`POST /api/v1/runs/{id}/resume`) or, with `graph_auto_resume`, when recovery finds its lease expired.

`checked_answer` checks an answer against any stored question; a graph node's question adds the node's
`default` and `validation` (`InvalidAnswer`, a 422 that leaves the question open).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol, cast

from ringlet._ids import new_id, now
from ringlet.errors import ConversationBusy, InvalidAnswer
from ringlet.events import ErrorEvent, Event, MessageEndEvent, QuestionEvent, StatusEvent
from ringlet.gates.approval import NEVER
from ringlet.graph.agent import GraphAgent, GraphResult, GraphStream
from ringlet.graph.human import check_input
from ringlet.server.http.errors import ApiError
from ringlet.server.runs.active import ActiveRun
from ringlet.server.runs.here import Here
from ringlet.store import Store
from ringlet.store.records import RunRecord
from ringlet.tools.builtin.question import check_answer
from ringlet.usage import Usage

__all__ = ["CanceledRun", "GraphRuns", "GraphTrack", "Relaunch", "checked_answer"]

if TYPE_CHECKING:
    from ringlet.server.catalog import Catalog
    from ringlet.server.http.settings import ServerSettings

log = logging.getLogger("ringlet.server")


class Relaunch(Protocol):
    """How a run that goes on is driven again in its conversation (`RunDriver.relaunch`)."""

    def __call__(self, run_id: str, cid: str, agent: str, stream: Any, *, applied: tuple[str, ...] = ()) -> None: ...


def checked_answer(question: dict[str, Any], answer: Any) -> tuple[str | list[str], bool]:
    """The answer as stored and whether it is free-form (`check_answer`). A graph node's question (it names
    its `node_id`) takes one string; an empty answer to an input node becomes its `default`, and the node's
    `validation` must pass. InvalidAnswer (a ValueError) says what would be accepted."""
    if not question.get("node_id"):
        return check_answer(question, answer)
    if not isinstance(answer, str):
        raise InvalidAnswer("answer: a graph node's question takes one string (an option label or text), not a list")
    if question["input_type"] != "text":
        return check_answer(question, answer)
    if answer == "" and question.get("default") is not None:
        answer = str(question["default"])
    if not answer.strip():
        raise InvalidAnswer("answer: this input node has no default, so it needs a non-empty string")
    problem = check_input(question.get("validation"), answer)
    if problem is not None:
        raise InvalidAnswer(f"answer: {problem}; the question stays open: answer it with text that passes "
                            f"'{question['validation']}'")
    return answer, False


def _request(run_id: str, conversation_id: str | None, asked: dict[str, Any]) -> dict[str, Any]:
    """The stored record of a node's question (the `approvals` table, `kind="question"`). `asked` has the
    fields of `ringlet.graph.Question`; the record's `tool_call_id` is the question id (a node asks no tool)."""
    qid = asked["question_id"]
    question = {"question": asked["question"], "input_type": asked["input_type"],
                "options": [{"label": o} for o in asked.get("options") or ()],
                "allow_freeform": bool(asked.get("allow_freeform")), "node_id": asked["node_id"],
                "default": asked.get("default"), "validation": asked.get("validation")}
    return {"approval_id": qid, "run_id": run_id, "conversation_id": conversation_id, "tool_call_id": qid,
            "tool": "graph_node", "connector": None, "args": {"node_id": asked["node_id"]}, "effect": "read",
            "reason": asked["question"], "requested_at": now(), "expires_at": NEVER, "timeout_s": 0,
            "status": "pending", "question": question}


def _total(prior: dict[str, Any], segment: Usage) -> dict[str, Any]:
    """A run's usage: what earlier segments (before a pause or a restart) recorded, plus this one's."""
    if prior["in_tokens"] == prior["out_tokens"] == 0 and prior["cost_usd"] is None:
        cost = segment.cost_usd
    elif segment.requests == 0:
        cost = prior["cost_usd"]
    else:
        cost = None if prior["cost_usd"] is None or segment.cost_usd is None else prior["cost_usd"] + segment.cost_usd
    return {"in_tokens": prior["in_tokens"] + segment.in_tokens, "out_tokens": prior["out_tokens"] + segment.out_tokens,
            "cost_usd": cost}


class CanceledRun:
    """The end of a paused graph run whose question was cancelled (its conversation was cancelled or
    deleted): `status: canceled`, then `message_end {finish_reason: cancelled}`."""

    def __init__(self, run_id: str, message_id: str) -> None:
        self.run_id, self.message_id = run_id, message_id
        self.result = GraphResult(run_id=run_id, output="", finish_reason="cancelled", status="canceled",
                                  usage=Usage(), messages=[], error=None, state={})

    async def __aiter__(self) -> AsyncIterator[Event]:
        yield StatusEvent(run_id=self.run_id, ts=now(), state="canceled")
        yield MessageEndEvent(run_id=self.run_id, ts=now(), message_id=self.message_id, finish_reason="cancelled",
                              usage=Usage().summary())


class GraphTrack:
    """`RunDriver.drive`'s view of a graph run (a loop run's is `tracks.LoopTrack`). Nothing is stored mid-run
    but the engine's checkpoints and questions; the end stores the End output as the assistant message."""

    start = 0
    """Messages of the run already stored (its prompt is stored when it starts)."""

    def __init__(self, store: Store, here: Here, run: ActiveRun, stream: GraphStream | CanceledRun) -> None:
        self.store, self.here, self.run, self.stream = store, here, run, stream
        self.message_id: str | None = None

    def stored(self) -> int:
        return 0

    async def save(self, saved: int) -> int:
        return saved

    async def durable(self, item: Event, saved: int) -> bool:
        """Store what an event announces before it is told: a question, or the pause on it (True)."""
        if getattr(item, "agent_path", None) is not None:  # an agent node's child stores what it must
            return False
        if item.type == "message_start":
            self.message_id = item.message_id  # type: ignore[union-attr]
        elif isinstance(item, QuestionEvent) and isinstance(self.stream, GraphStream):
            node = self.stream.agent.spec.nodes.get(item.node_id or "")
            asked = {"question_id": item.question_id, "node_id": item.node_id, "question": item.question,
                     "input_type": item.input_type, "options": [o.label for o in item.options],
                     "allow_freeform": item.allow_freeform, "default": item.default,
                     "validation": getattr(node, "validation", None)}
            record = _request(self.run.run_id, self.run.conversation_id, asked)
            await self.store.approvals.add(self.run.run_id, [record], agent=self.run.agent, realm=self._realm())
        elif isinstance(item, StatusEvent) and item.state == "input_required":
            result = self.stream.result
            if result is not None and result.pending_question is not None:
                await self._pause(result.pending_question.to_dict())
                return True
        return False

    async def _pause(self, asked: dict[str, Any]) -> None:
        """Store the pause: the run and its conversation become `input_required`, with no lease."""
        run = self.run
        await self.store.runs.pause(
            run.run_id, state={"kind": "graph", "awaiting": {asked["question_id"]: asked["node_id"]}},
            requests=[_request(run.run_id, run.conversation_id, asked)], conversation_id=run.conversation_id,
            agent=run.agent, realm=self._realm(), **await self._usage())

    def _realm(self) -> str:
        caller = self.stream.env.caller if isinstance(self.stream, GraphStream) else {}
        return caller.get("realm") or "default"

    def _segment(self) -> Usage:
        result = self.stream.result
        if result is not None:
            return result.usage
        return self.stream.env.usage if isinstance(self.stream, GraphStream) else Usage()

    async def _usage(self) -> dict[str, Any]:
        row = await self.store.runs.get(self.run.run_id)
        return _total(row.usage.summary() if row else {"in_tokens": 0, "out_tokens": 0, "cost_usd": None},
                      self._segment())

    async def record_end(self, saved: int) -> None:
        result = self.stream.result
        if result is None:
            await self._close("failed", "error")
            return
        await self._close(result.status, result.finish_reason, [m for m in result.messages if m.role == "assistant"])

    async def _close(self, status: str, finish_reason: str | None, new: list[Any] | None = None) -> None:
        """Store how the run ended, its usage, its answer, and the conversation's return to `idle`."""
        run = self.run
        try:
            await self.store.runs.finish(run.run_id, status=status, finish_reason=finish_reason, **await self._usage(),
                                        conversation_id=run.conversation_id, new=new or [], conversation_status="idle")
        except Exception:
            log.exception("could not record the end of graph run %s", run.run_id)

    async def abandoned(self, saved: int) -> list[Event]:
        """The stream stopped without `message_end`. At shutdown the run stays `working` and its lease
        lapses: the next start (or another process) resumes it or closes it as interrupted. Cancelled, it
        ends `canceled`, its checkpoint too (it never resumes). Otherwise it failed (and may be resumed)."""
        run, stream = self.run, self.stream
        if self.here.closing or not isinstance(stream, GraphStream):
            log.warning("graph run %s stopped with the server; it resumes from its checkpoint later", run.run_id)
            return []
        checkpoints = stream.agent.runtime.checkpoints
        cp = await checkpoints.load(run.run_id)
        message_id = self.message_id or (cp.run.get("message_id") if cp else None) or new_id("m")
        usage = self._segment().summary()
        if run.cancel_requested:
            if cp is not None:
                cp.status, cp.ended_at = "canceled", time.time()
                await checkpoints.save(cp)
            await self._close("canceled", "cancelled")
            return [StatusEvent(run_id=run.run_id, ts=now(), state="canceled"),
                    MessageEndEvent(run_id=run.run_id, ts=now(), message_id=message_id, finish_reason="cancelled",
                                    usage=usage)]
        await self._close("failed", "error")
        return [ErrorEvent(run_id=run.run_id, ts=now(), code="internal_error", message="the run stopped unexpectedly"),
                MessageEndEvent(run_id=run.run_id, ts=now(), message_id=message_id, finish_reason="error", usage=usage)]

    def paused(self) -> None:
        """Graph questions have no deadline: nothing to schedule."""


class GraphRuns:
    """What `Runner` does with graph runs beyond driving them: continue paused ones, resume interrupted ones."""

    def __init__(self, store: Store, catalog: Catalog, settings: ServerSettings, here: Here,
                 relaunch: Relaunch) -> None:
        self.store, self.catalog, self.settings, self.here, self.relaunch = store, catalog, settings, here, relaunch

    async def continuation(self, row: RunRecord) -> GraphStream | CanceledRun | None:
        """How a graph run paused on a question goes on (`row` is its taken run row): resumed from its
        checkpoint with the answer, or ended when the question was cancelled; None while it is unanswered."""
        taken = await self.answers(row)
        return None if taken is None else await self.continued(row, taken)

    async def answers(self, row: RunRecord) -> dict[str, Any] | None:
        """What the paused graph run `row` goes on with (JSON): `{"answers": {question id: answer}}`, or
        `{"cancelled": true}` when its question was cancelled or expired; None while it is unanswered."""
        run_id, awaiting = row.id, cast(dict[str, Any], (row.state or {}).get("awaiting") or {})
        records = [r for r in await self.store.approvals.list(run_id=run_id, kind="question")
                   if r.approval_id in awaiting]
        answers = {r.approval_id: (r.answer or {}).get("answer", "") for r in records
                   if r.status == "answered"}
        if answers:
            return {"answers": answers}
        if any(r.status in ("cancelled", "expired") for r in records):
            return {"cancelled": True}
        return None

    async def continued(self, row: RunRecord, taken: dict[str, Any], *, paused: GraphStream | None = None,
                        steps: Any = None) -> GraphStream | CanceledRun:
        """The stream that goes on with the paused graph run `row` as `taken` (`answers`) says: from its
        stored checkpoint, or (a durable run: `steps`) from the checkpoint its `paused` stream left."""
        run_id, agent = row.id, self._agent(row.agent)
        if "answers" in taken:
            if paused is not None and paused.result is not None and paused.result.checkpoint is not None:
                return agent.continue_stream(paused.result.checkpoint, taken["answers"], steps=steps)
            return agent.resume_stream(run_id, answers=taken["answers"])
        checkpoints = agent.runtime.checkpoints
        cp = await checkpoints.load(run_id)
        if cp is not None:
            cp.status, cp.ended_at = "canceled", time.time()
            await checkpoints.save(cp)
        return CanceledRun(run_id, (cp.run.get("message_id") if cp else None) or new_id("m"))

    def _agent(self, name: str) -> GraphAgent:
        agent = self.catalog.get(name).agent()
        if not isinstance(agent, GraphAgent):
            raise ApiError(409, "run_not_resumable", f"agent {name!r} is not a graph agent (any more): its runs "
                           "do not resume from checkpoints")
        return agent

    async def _resumable(self, agent_name: str, run_id: str, *, force: bool) -> tuple[GraphAgent, str | None]:
        """The graph agent to resume `run_id` with, and what stops it from resuming (None: nothing)."""
        agent = self._agent(agent_name)
        cp = await agent.runtime.checkpoints.load(run_id)
        if cp is None:
            return agent, "it has no checkpoint (it never saved one, or ended more than 72 h ago)"
        if cp.status != "working":
            return agent, f"its checkpoint says it is {cp.status}; only a run interrupted while working resumes"
        if cp.graph_hash != agent.runtime.graph_hash and not force:
            return agent, ("graph changed since checkpoint: graph.yaml was edited after the run started; pass "
                           '{"force": true} to resume it with the new graph')
        return agent, None

    async def replayable(self, agent_name: str, run_id: str) -> bool:
        """Whether a durable graph run whose worker died goes on (executed again from its recorded steps):
        with `graph_auto_resume`, when its graph is unchanged since its checkpoint. Otherwise it is closed
        as interrupted (`POST /api/v1/runs/{id}/resume` can still resume it)."""
        if not self.settings.graph_auto_resume:
            return False
        try:
            agent = self._agent(agent_name)
        except ApiError as exc:
            log.warning("graph run %s cannot go on (%s); closing it as interrupted", run_id, exc.message)
            return False
        cp = await agent.runtime.checkpoints.load(run_id)
        if cp is not None and cp.graph_hash != agent.runtime.graph_hash:
            log.warning("graph run %s cannot go on (its graph changed); closing it as interrupted", run_id)
            return False
        log.warning("graph run %s lost its worker; it goes on from its recorded steps", run_id)
        return True

    async def restart(self, row: RunRecord) -> bool:
        """With `graph_auto_resume`, resume a graph run whose process died (recovery has claimed its lease)
        from its last checkpoint. False when it is not such a run or cannot resume: it is then closed."""
        if row.kind != "graph" or not self.settings.graph_auto_resume:
            return False
        run_id, cid = row.id, row.conversation_id
        try:
            agent, problem = await self._resumable(row.agent, run_id, force=False)
        except ApiError as exc:  # its agent is gone or broken
            log.warning("graph run %s cannot resume (%s); closing it as interrupted", run_id, exc.message)
            return False
        if cid is None or cid in self.here.active or problem is not None:
            log.warning("graph run %s cannot resume (%s); closing it as interrupted", run_id,
                        problem or "its conversation is busy")
            return False
        self.relaunch(run_id, cid, row.agent, agent.resume_stream(run_id))
        log.warning("graph run %s was interrupted; resuming it from its last checkpoint", run_id)
        return True

    async def resume_interrupted(self, record: RunRecord, *, force: bool = False) -> dict[str, Any]:
        """`POST /api/v1/runs/{id}/resume`: resume an interrupted graph run (`record` is its API record) from
        its last checkpoint; its interrupted step runs again. 409 when it is not a graph run, or not
        interrupted (working, paused, ended), or its graph changed (unless `force`)."""
        run_id, cid, status = record.id, record.conversation_id, record.status
        if record.kind != "graph":
            raise ApiError(409, "run_not_resumable", f"run {run_id} is a loop run; only graph runs resume from a "
                           "checkpoint (a loop run paused for a human resumes when its approvals are decided)")
        if status == "input_required":
            raise ApiError(409, "question_pending", f"run {run_id} is waiting for an answer; answer its question "
                           f"(POST /api/v1/chat/conversations/{cid}/questions/{{question_id}}) to resume it")
        if status not in ("working", "failed") or cid is None:
            raise ApiError(409, "run_not_resumable", f"run {run_id} ended ({status}); send a new message to "
                           "start another run")
        agent, problem = await self._resumable(record.agent, run_id, force=force)
        if problem is not None:
            raise ApiError(409, "run_not_resumable", f"run {run_id} cannot resume: {problem}")
        await self._take(run_id, cid, status)
        self.relaunch(run_id, cid, record.agent, agent.resume_stream(run_id, force=force))
        return {"run_id": run_id, "conversation_id": cid, "status": "working"}

    async def _take(self, run_id: str, cid: str, status: str) -> None:
        """Take the run's lease: a `working` run's once it expired, a run closed as interrupted by reopening it."""
        here = self.here
        busy = ApiError(409, "run_in_progress", f"run {run_id} is still working in a live process (its lease has "
                        "not expired); wait for it, or cancel it")
        if status == "working":
            alive = any(r.run_id == run_id for r in here.active.values())
            if alive or not await self.store.runs.claim(run_id, here.owner, here.lease_until(),
                                                        expired_before=now()):
                raise busy
            return
        try:
            reopened = await self.store.checkpoints.reopen_run(run_id, here.owner, here.lease_until())
        except ConversationBusy:
            raise ApiError(409, "run_in_progress", f"conversation {cid} has another active run; wait for it (or "
                           f"cancel it), then resume run {run_id} again") from None
        if reopened is None:
            raise busy
