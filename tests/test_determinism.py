"""The loop is deterministic given its step results (issue 17, DESIGN.md §1).

With a fixed clock and id source (`LocalSteps(Seam(...))`), a recorded run — a tool round, a parallel
batch, an approval pause and its resume, a compaction — gives byte-identical events, transcript, state
and audit records twice over. And the loop reads the clock and makes ids only through the seam: no module
of `ringlet.loop` imports `time` (or `random`, `uuid`, `datetime`, `secrets`) or `ringlet._ids` except
for types, nor calls a clock.
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
from ringlet import Agent, Message, tool
from ringlet._ids import Seam
from ringlet.gates.approval import ApprovalRules
from ringlet.loop import LocalSteps
from ringlet.testing import ScriptedModel, call

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
    agent = Agent(model, tools=[lookup, save], approvals=ApprovalRules(), audit=audit.append,
                  max_tokens_per_turn=900, steps=LocalSteps(fixed_seam()))
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


FORBIDDEN_MODULES = {"time", "random", "uuid", "datetime", "secrets", "ringlet._ids"}
CLOCK_CALLS = {"time", "time_ns", "perf_counter", "monotonic", "now", "utcnow", "new_id", "urandom", "ulid"}


def _type_only(tree: ast.Module) -> set[int]:
    """Ids of the statements under `if TYPE_CHECKING:`."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            inside |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return inside


def nondeterministic_uses(source: str) -> list[str]:
    """Imports of clock, randomness or id modules outside `if TYPE_CHECKING:`, and calls of a clock or an
    id maker that is not a seam's (`seam.now()` is fine; `time.time()`, `loop.time()`, `new_id(…)` are not)."""
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
"""
    assert nondeterministic_uses(source) == [
        "line 2: import time", "line 4: import ringlet._ids", "line 9: time.time()", "line 9: loop.time()",
        "line 9: new_id()", "line 9: now()"]


@pytest.mark.parametrize("path", sorted((ROOT / "loop").glob("*.py")), ids=lambda p: p.name)
def test_the_loop_takes_time_and_ids_only_from_the_seam(path: Path) -> None:
    assert nondeterministic_uses(path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("name", ["agent/__init__.py", "graph/engine.py", "graph/context.py", "graph/llm.py",
                                  "graph/nodes.py"])
def test_the_agent_and_the_graph_engine_take_time_and_ids_from_the_seam(name: str) -> None:
    """Outside the loop, `ringlet._ids` may give the default seam (`SYSTEM`) and nothing else. (Arming an
    asyncio timer reads the event loop's own clock: that is a real wait, not a value a run records.)"""
    source = (ROOT / name).read_text(encoding="utf-8")
    uses = [u for u in nondeterministic_uses(source)
            if not u.endswith(("import ringlet._ids", "asyncio.get_running_loop().time()"))]
    assert uses == []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == "ringlet._ids":
            assert {a.name for a in node.names} <= {"SYSTEM", "Seam"}
