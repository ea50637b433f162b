"""Runs are deterministic given their step results (issue 17, DESIGN.md §1).

With a fixed clock and id source (`LocalSteps(Seam(...))`), a recorded run — a tool round, a parallel
batch, an approval pause and its resume, a compaction — gives byte-identical events, transcript, state
and audit records twice over; so do a graph run (an llm node with a tool, parallel llm branches joined by a
reducer, a script) with its checkpoint, and a run that spawns a sub-agent, with the child's transcript.
And `ringlet.loop`, `ringlet.agent` and `ringlet.graph` read the clock and make ids only through the seam:
no module imports `time` (or `random`, `uuid`, `datetime`, `secrets`), or `ringlet._ids` for more than
the `Seam` type and the default `SYSTEM` (the loop: for types only), nor calls a clock, an id maker or a
`Message` constructor that takes its id or time from them; `WAIVERS` names the few real timers.
"""

from __future__ import annotations

import ast
import json
import re
from itertools import count
from pathlib import Path
from typing import Any

import pytest

import ringlet
from ringlet import Agent, Execution, Gates, Limits, Message, SubAgents, tool
from ringlet._ids import Seam
from ringlet.agent import RunHost
from ringlet.agent.settings import RunSettings
from ringlet.gates.approval import ApprovalRules
from ringlet.loop import LocalSteps
from ringlet.models.base import ModelRequest
from ringlet.testing import FunctionModel, Reply, ScriptedModel, call
from test_graph_support import graph_agent, make_graph

ROOT = Path(ringlet.__file__).parent
WORDS = "lorem ipsum dolor sit amet " * 12  # ~80 tokens
ULID = re.compile(r"[0-9A-HJKMNP-TV-Z]{26}")


@tool(effect="read")
async def lookup(key: str) -> str:
    """Look something up."""
    return f"value of {key}"


@tool(effect="write")
async def save(note: str) -> str:
    """Save a note (needs a human's approval)."""
    return "saved"


def fixed_seam() -> Seam:
    """A clock that advances 1 ms per reading and ids from a counter: fixed, yet every value distinct."""
    wall, mono, ids = count(), count(), count()
    return Seam(now=lambda: 1_700_000_000 + next(wall) / 1000, monotonic=lambda: next(mono) / 1000,
                new_id=lambda prefix: f"{prefix}_{next(ids):04d}")


HISTORY = [m for i in range(6) for m in (
    Message(id=f"m_u{i}", role="user", content=f"question {i}: {WORDS}", created_at="2024-01-01T00:00:00.000Z"),
    Message(id=f"m_a{i}", role="assistant", content=f"answer {i}: {WORDS}", created_at="2024-01-01T00:00:01.000Z"))]


async def recorded_run() -> str:
    """One run, paused for an approval and resumed, serialised: every event, the transcript, the state
    and the audit records."""
    model = ScriptedModel([
        "The user asked questions 0-3.",  # the compaction summary, before the first round
        call("lookup", key="a"),
        [call("lookup", key="b"), call("save", note="remember b"), call("lookup", key="c")],
        "done: a, b and c",
    ])
    audit: list[dict[str, Any]] = []
    agent = Agent(model, tools=[lookup, save], limits=Limits(max_tokens_per_turn=900),
                  execution=Execution(steps=LocalSteps(fixed_seam())),
                  gates=Gates(approvals=ApprovalRules(), audit=audit.append))
    first = agent.stream("look up a, b and c", history=HISTORY)
    events = [e async for e in first]
    paused = first.result
    assert paused is not None
    assert (paused.status, first.paused) == ("input_required", True)
    [(call_id, request)] = paused.pending_approvals.items()
    assert request.tool == "save"
    resumed = agent.resume_stream(paused.state.to_json(), {call_id: True})
    events += [e async for e in resumed]
    result = resumed.result
    assert result is not None
    assert (result.status, result.output, resumed.paused) == ("completed", "done: a, b and c", False)
    model.assert_complete()
    kinds = [e.type for e in events]
    assert {"compaction", "approval_required", "tool_result", "message_end"} <= set(kinds)
    assert kinds.count("tool_result") == 4
    return "\n".join([*(e.model_dump_json() for e in events),
                      *(json.dumps(m.model_dump(), sort_keys=True) for m in result.messages),
                      resumed.state.to_json().decode(), json.dumps(audit, sort_keys=True)])


async def test_a_recorded_run_is_byte_identical_with_a_fixed_clock_and_ids() -> None:
    once, again = await recorded_run(), await recorded_run()
    assert once == again
    assert not ULID.search(once), "an id was made outside the seam"
    assert '"ts":"2023-11-14T22:13:20.' in once  # event times are the fixed clock's


GRAPH = """
name: g
global_tools: [calculate]
reducers: {trail: append}
start: a
nodes:
  a:
    type: llm
    prompt: "Work on {{initial_prompt}}"
    tools: [calculate]
    state_updates: {said: "{{output}}"}
    next: [b, c]
  b: {type: llm, prompt: "Branch b after {{said}}", state_updates: {trail: "{{output}}"}, next: d}
  c: {type: llm, prompt: "Branch c after {{said}}", state_updates: {trail: "{{output}}"}, next: d}
  d: {type: script, script: tally.py, next: z}
  z: {type: end, output: "{{said}} / {{count}}"}
"""
TALLY = "import json, os\nprint(json.dumps({'count': len(json.loads(os.environ['GRAPH_STATE'])['trail'])}))\n"


def graph_model() -> FunctionModel:
    """Answers by the node's prompt (the parallel branches may ask in either order)."""

    def answer(request: ModelRequest) -> Any:
        text = request.messages[-1].text if request.messages[-1].role != "tool" else "result"
        if text.startswith("Work on"):
            return Reply("Computing.", [call("calculate", expression="6*7")])
        if text == "result":
            return "It is 42."
        return f"seen by {text.split()[1]}"

    return FunctionModel(answer)


async def recorded_graph_run(tmp_path: Path) -> str:
    """A graph run with a fixed seam: its events, its result and its stored checkpoint."""
    directory = make_graph(tmp_path, GRAPH, files={"tally.py": TALLY})
    agent = graph_agent(directory, model=graph_model(), steps=LocalSteps(fixed_seam()))
    stream = agent.stream("the sum")
    events = [e async for e in stream]
    result = stream.result
    assert result is not None
    assert (result.status, result.output) == ("completed", "Computing.\nIt is 42. / 2")
    assert sorted(result.state["trail"]) == ["seen by b", "seen by c"]
    kinds = [e.type for e in events]
    assert {"tool_result", "node_start", "node_end", "message_end"} <= set(kinds)
    stored = await agent.runtime.checkpoints.load(result.run_id)
    assert stored is not None
    await agent.aclose()
    recorded = "\n".join([*(e.model_dump_json() for e in events), json.dumps(result.to_dict(), sort_keys=True),
                          stored.to_json()])
    return recorded.replace(str(directory.resolve()), "<the graph's directory>")  # an input, kept with the run


async def test_a_graph_run_is_byte_identical_with_a_fixed_clock_and_ids(tmp_path: Path) -> None:
    once, again = await recorded_graph_run(tmp_path / "1"), await recorded_graph_run(tmp_path / "2")
    assert once == again
    assert not ULID.search(once), "an id was made outside the seam"
    assert '"ts":"2023-11-14T22:13:20.' in once
    elapsed = json.loads(once.splitlines()[-1])["elapsed_active_s"]
    assert elapsed > 0
    assert abs(elapsed * 1000 - round(elapsed * 1000)) < 1e-6  # whole ms: the active clock reads the seam


class Children:
    """A child host that keeps each sub-agent's transcript and state as the server would."""

    def __init__(self) -> None:
        self.kept: list[str] = []

    async def opened(self, ctx: Any, agent: str, realm: str, conversation_id: str) -> None:
        self.kept.append(f"opened {agent} {realm} {conversation_id} for {ctx.run_id}")

    async def closed(self, conversation_id: str, stream: Any) -> None:
        result = stream.result
        self.kept += [conversation_id, *(json.dumps(m.model_dump(), sort_keys=True) for m in result.messages),
                      result.state.to_json().decode()]


async def recorded_spawn() -> str:
    """A run whose model spawns a sub-agent that calls a tool: every event (the child's nested ones too),
    the parent's transcript and state, and the child's transcript and state as its host keeps them."""
    steps = LocalSteps(fixed_seam())
    child = Agent(ScriptedModel([call("lookup", key="capital"), "Paris."]), name="researcher", tools=[lookup],
                  execution=Execution(steps=steps))
    parent = Agent(ScriptedModel([call("spawn_agent", {"task": "Find the capital", "agent": "researcher",
                                                       "input": {"country": "France"}}), "It is Paris."]),
                   name="lead", tools=[SubAgents([child])], execution=Execution(steps=steps))
    host = Children()
    stream = parent.stream("capital of France?", settings=RunSettings(host=RunHost(child_host=host)))
    events = [e async for e in stream]
    result = stream.result
    assert result is not None
    assert (result.status, result.output) == ("completed", "It is Paris.")
    nested = [e.type for e in events if getattr(e, "agent_path", None) == ("lead", "researcher")]
    assert nested.count("tool_result") == 1
    assert len(host.kept) > 3
    return "\n".join([*(e.model_dump_json() for e in events),
                      *(json.dumps(m.model_dump(), sort_keys=True) for m in result.messages),
                      result.state.to_json().decode(), *host.kept])


async def test_a_run_with_a_sub_agent_is_byte_identical_with_a_fixed_clock_and_ids() -> None:
    once, again = await recorded_spawn(), await recorded_spawn()
    assert once == again
    assert not ULID.search(once), "an id was made outside the seam"
    assert '"child_conversation_id":"c_' in once  # made by the parent run's seam


FORBIDDEN_MODULES = {"time", "random", "uuid", "datetime", "secrets", "ringlet._ids"}
CLOCK_CALLS = {"time", "time_ns", "perf_counter", "monotonic", "now", "utcnow", "new_id", "urandom", "ulid"}
MESSAGE_MAKERS = {"user", "system", "assistant", "tool"}
"""`Message.user(…)` and its siblings take their id and time from `ringlet._ids`, as `Message(…)` without a
`created_at` takes its time."""
MODULES = sorted(p.relative_to(ROOT).as_posix() for package in ("loop", "agent", "graph")
                 for p in (ROOT / package).rglob("*.py"))

WAIVERS: dict[str, dict[str, str]] = {
    "agent/stream.py": {
        "SYSTEM.new_id()": "a steer is made by its sender, outside the run (`stream.steer`): it is the run's "
                           "input, on the replay tape with the boundary that took it",
        "Message.user()": "a steer's message, made by its sender outside the run (its input, on the tape)"},
    "agent/forks.py": {
        "SYSTEM.new_id()": "a fork's copied, edited or replacing messages are made before any run of the fork, "
                           "outside every run; they are its input, stored as such, and a replay reads them",
        "Message() without created_at": "an edited user message is the fork's input, made outside any run",
        "Message.tool()": "a replaced or not-run result in the fork's transcript, made outside any run"},
    "agent/loki.py": {
        "import datetime": "Loki's {{__now__}} is local time with its offset, which the seam does not give",
        "datetime.datetime.now()": "{{__now__}} is read when an agent's instructions are rendered at load, "
                                   "outside any run; nothing replays it"},
    "agent/remote.py": {
        "SYSTEM.new_id()": "a remote A2A task is never replayed (a durable parent records the call's result, not "
                           "the child's events): its stream's ids are the system's",
        "Message.assistant()": "the remote answer kept in the child's state, never replayed either"},
    "agent/subagents.py": {
        "loop.time()": "a child's time limit is a real asyncio timer, stopped and re-armed around a human's wait "
                       "on the event loop's own clock; it records no value"},
    "graph/context.py": {
        "asyncio.get_running_loop().time()": "re-arms a super-step's asyncio timer after a human's wait, on the "
                                             "event loop's own clock; it records no value"},
    "loop/tools.py": {
        "asyncio.get_running_loop().time()": "a call's deadline is an asyncio timer armed only if the call "
                                             "suspends (asyncio.timeout reads the same clock); it records no value",
        "import ringlet._ids": "for SYSTEM only (the next waiver)",
        "SYSTEM.now()": "the telemetry event's start time, read only while a subscriber listens (a server's "
                        "metrics): never part of the run, and a replay, with none, must read the seam alike"},
}
"""What truly cannot take the seam, by module: real timers, which must read the clock they run on, and a
remote agent's stream, which no run replays."""
def _type_only(tree: ast.Module) -> set[int]:
    """Ids of the statements under `if TYPE_CHECKING:`."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            inside |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return inside


def nondeterministic_uses(source: str) -> list[str]:
    """Imports of clock, randomness or id modules outside `if TYPE_CHECKING:`; calls of a clock or an id
    maker that is not a seam's (`seam.now()` is fine; `time.time()`, `loop.time()`, `new_id(…)` are not); and
    messages made with the default id or time (`Message.user(…)`, `Message(…)` without `created_at`)."""
    tree = ast.parse(source)
    type_only, found = _type_only(tree), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in type_only:
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [f"line {node.lineno}: import {n}" for n in names
                      if n in FORBIDDEN_MODULES or n.split(".")[0] in FORBIDDEN_MODULES - {"ringlet._ids"}]
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in CLOCK_CALLS:
                found.append(f"line {node.lineno}: {func.id}()")
            elif (isinstance(func, ast.Name) and func.id == "Message"
                  and not any(k.arg in ("created_at", None) for k in node.keywords)):  # None: a **mapping
                found.append(f"line {node.lineno}: Message() without created_at")
            elif (isinstance(func, ast.Attribute) and func.attr in MESSAGE_MAKERS
                  and ast.unparse(func.value) == "Message"):
                found.append(f"line {node.lineno}: Message.{func.attr}()")
            elif (isinstance(func, ast.Attribute) and func.attr in CLOCK_CALLS
                  and not ast.unparse(func.value).endswith("seam")):
                found.append(f"line {node.lineno}: {ast.unparse(func)}()")
    return found


def test_the_checker_sees_clock_and_id_uses() -> None:
    source = """
import time
from typing import TYPE_CHECKING
from ringlet._ids import new_id, now
if TYPE_CHECKING:
    from ringlet._ids import Seam
    import datetime
def f(loop, seam, run):
    return time.time(), loop.time(), new_id("m"), seam.now(), run.seam.new_id("m"), now()
def g(seam, fields):
    return (Message.user("hi"), Message(id="m", role="user"), Message(id="m", role="user", created_at="t"),
            Message(id="m", role="user", **fields), Message.validate({}))
"""
    assert nondeterministic_uses(source) == [
        "line 2: import time", "line 4: import ringlet._ids", "line 9: time.time()", "line 9: loop.time()",
        "line 9: new_id()", "line 9: now()", "line 11: Message.user()", "line 11: Message() without created_at"]


def _uses(source: str) -> set[str]:
    return {u.split(": ", 1)[1] for u in nondeterministic_uses(source)}


@pytest.mark.parametrize("name", MODULES)
def test_runs_take_time_and_ids_only_from_the_seam(name: str) -> None:
    """Every module of `ringlet.loop`, `ringlet.agent` and `ringlet.graph`. Outside the loop, `ringlet._ids`
    may give the `Seam` type and the default seam (`SYSTEM`) and nothing else; the loop takes it for types
    only. A waiver (or follow-up) that no longer matches anything fails too."""
    source = (ROOT / name).read_text(encoding="utf-8")
    allowed = WAIVERS.get(name, {})
    uses = [u for u in nondeterministic_uses(source) if u.split(": ", 1)[1] not in allowed]
    if not name.startswith("loop/"):
        uses = [u for u in uses if not u.endswith("import ringlet._ids")]
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and node.module == "ringlet._ids":
                assert {a.name for a in node.names} <= {"SYSTEM", "Seam"}, f"line {node.lineno}"
            elif isinstance(node, ast.Import):
                assert "ringlet._ids" not in {a.name for a in node.names}, f"line {node.lineno}"
    assert uses == []
    assert set(allowed) <= _uses(source), "a waiver no longer needed: remove it"


def test_every_module_of_the_three_packages_is_checked() -> None:
    assert {"agent/subagents.py", "graph/checkpoint.py", "graph/agent.py", "loop/run.py"} <= set(MODULES)
    assert set(WAIVERS) <= set(MODULES)


async def test_checkpoint_stores_prune_by_the_clock_they_are_given(tmp_path: Path) -> None:
    from ringlet.graph.checkpoint import RETENTION_S, Checkpoint, FileCheckpoints, MemoryCheckpoints

    now = 1_700_000_000.0
    ended = [Checkpoint(f"r_{n}", "h", 1, {}, [], {}, 0.0, status="completed", ended_at=now - age)
             for n, age in (("old", RETENTION_S + 1), ("recent", RETENTION_S - 1))]
    for store in (MemoryCheckpoints(clock=lambda: now), FileCheckpoints(tmp_path, clock=lambda: now)):
        for cp in ended:
            await store.save(cp)
        assert await store.prune() == 1
        assert (await store.load("r_old"), (await store.load("r_recent")) == ended[1]) == (None, True)


def test_ulids_are_unique_across_threads_and_a_fork() -> None:
    """The random part comes from a pool of `os.urandom` bytes: threads never share a draw, and a forked
    child draws afresh instead of repeating its parent's next ids."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    from ringlet._ids import ulid

    with ThreadPoolExecutor(4) as pool:
        drawn = [i for ids in pool.map(lambda _: [ulid() for _ in range(2_000)], range(8)) for i in ids]
    assert len(set(drawn)) == len(drawn) == 16_000
    assert all(len(i) == 26 for i in drawn)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        os.write(write, " ".join(ulid()[10:] for _ in range(3)).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 1000).decode().split()
    os.close(read)
    parent = [ulid()[10:] for _ in range(3)]
    assert len(child) == 3
    assert not set(child) & set(parent)


def test_stamps_are_exact_per_millisecond_across_threads() -> None:
    """Stamps are cached per millisecond (the cache is shared): every thread still gets its own time's stamp,
    cut at the millisecond."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    def expected(ms: int) -> str:
        return f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(ms // 1000))}.{ms % 1000:03d}Z"

    def stamps(base: int) -> list[tuple[str, str]]:
        times = [base + i * 7 for i in range(5_000)]  # crosses seconds, and other threads' milliseconds
        return [(Seam().stamp(ms / 1000), expected(ms)) for ms in times]

    with ThreadPoolExecutor(4) as pool:
        pairs = [p for chunk in pool.map(stamps, [1_700_000_000_000 + k for k in range(4)]) for p in chunk]
    assert len(pairs) == 20_000
    assert [got for got, _ in pairs] == [want for _, want in pairs]
