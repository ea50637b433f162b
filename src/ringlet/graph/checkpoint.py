"""Checkpoints (`graph-workflows.md` §10.4): after every super-step, the run as a JSON-ready value.

A run restarts from its latest checkpoint: the state before the step that was interrupted, so that step's
nodes may run again. `MemoryCheckpoints` serves the library and tests; `FileCheckpoints` survives the
process (one JSON file per run, replaced atomically); the server's store implements the same protocol.
Each of them also keeps every step's checkpoint (`CheckpointHistory`), what a fork starts from
(`ringlet.graph.fork`): a step saved again replaces its own, but a run's end never replaces a step saved
with work left, so a failed run's last step can still be forked.
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, Protocol

from ringlet._ids import SYSTEM

__all__ = ["RETENTION_S", "Checkpoint", "CheckpointHistory", "CheckpointStore", "FileCheckpoints",
           "MemoryCheckpoints"]

RETENTION_S = 72 * 3600
Status = Literal["working", "input_required", "completed", "failed", "canceled"]


@dataclass(slots=True)
class Checkpoint:
    """Everything needed to continue a graph run in any process."""

    run_id: str
    graph_hash: str
    step: int
    """Super-steps completed."""
    state: dict[str, Any]
    frontier: list[str]
    """The nodes of the next step (empty once the run ended)."""
    visit_counts: dict[str, int]
    elapsed_active_s: float
    pending_question: dict[str, Any] | None = None
    node_stats: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per node: `runs`, `us` (total microseconds), `failures`."""
    agent: str = ""
    status: Status = "working"
    output: str | None = None
    error: dict[str, Any] | None = None
    run: dict[str, Any] = field(default_factory=dict)
    """The run's caller: prompt, variables, conversation, realm, user, org, roles, channel, answers."""
    updated_at: float = 0.0
    ended_at: float | None = None

    def to_json(self) -> str:
        data = {f.name: getattr(self, f.name) for f in fields(self)}  # not asdict(): it deep-copies every value
        return json.dumps(data, ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> Checkpoint:
        return cls(**json.loads(text))


class CheckpointStore(Protocol):
    """Where checkpoints live. `save` replaces the run's previous checkpoint atomically."""

    async def save(self, checkpoint: Checkpoint) -> None: ...

    async def load(self, run_id: str) -> Checkpoint | None: ...

    async def delete(self, run_id: str) -> None: ...

    async def prune(self, older_than_s: float = RETENTION_S) -> int:
        """Forget checkpoints of runs that ended more than `older_than_s` ago; returns how many."""
        ...


class CheckpointHistory(Protocol):
    """A store that keeps every step's checkpoint of a run, not only the latest (what a fork needs)."""

    async def history(self, run_id: str) -> list[Checkpoint]:
        """Every checkpoint kept of the run, one per super-step, oldest first."""
        ...

    async def load_step(self, run_id: str, step: int) -> Checkpoint | None:
        """The run's checkpoint after `step` super-steps, or None when none is kept."""
        ...


def _keeps(checkpoint: Checkpoint, earlier: Callable[[], bool]) -> bool:
    """Whether `checkpoint` is kept as its step's (`earlier()`: one is kept already): a run's end never
    replaces a step saved with work left."""
    return checkpoint.status in ("working", "input_required") or not earlier()


def _expired(checkpoint: Checkpoint, older_than_s: float, now: float) -> bool:
    return checkpoint.ended_at is not None and checkpoint.ended_at < now - older_than_s


class MemoryCheckpoints:
    """Checkpoints in this process, pickled (a snapshot later changes never reach, and several times cheaper
    to take than JSON; nothing but this process ever reads it). `clock` (epoch seconds; default the real
    clock) is what `prune` measures retention against."""

    def __init__(self, *, clock: Callable[[], float] = SYSTEM.now) -> None:
        self._runs: dict[str, bytes] = {}
        self._steps: dict[str, dict[int, bytes]] = {}
        self.clock = clock

    async def save(self, checkpoint: Checkpoint) -> None:
        data = pickle.dumps(checkpoint, protocol=pickle.HIGHEST_PROTOCOL)
        self._runs[checkpoint.run_id] = data
        steps = self._steps.setdefault(checkpoint.run_id, {})
        if _keeps(checkpoint, lambda: checkpoint.step in steps):
            steps[checkpoint.step] = data

    async def load(self, run_id: str) -> Checkpoint | None:
        data = self._runs.get(run_id)
        return pickle.loads(data) if data is not None else None  # our own snapshot

    async def history(self, run_id: str) -> list[Checkpoint]:
        steps = self._steps.get(run_id, {})
        return [pickle.loads(steps[k]) for k in sorted(steps)]

    async def load_step(self, run_id: str, step: int) -> Checkpoint | None:
        data = self._steps.get(run_id, {}).get(step)
        return pickle.loads(data) if data is not None else None

    async def delete(self, run_id: str) -> None:
        self._runs.pop(run_id, None)
        self._steps.pop(run_id, None)

    async def prune(self, older_than_s: float = RETENTION_S) -> int:
        now = self.clock()
        old = [k for k, v in self._runs.items() if _expired(pickle.loads(v), older_than_s, now)]
        for k in old:
            del self._runs[k]
            self._steps.pop(k, None)
        return len(old)

    def __len__(self) -> int:
        return len(self._runs)


class FileCheckpoints:
    """One `<run_id>.json` per run in `directory`, written to a temporary file, flushed, then renamed; every
    step's checkpoint is appended to `<run_id>.steps.jsonl` too (one line per save: the last kept line of a
    step is its checkpoint). `clock` (epoch seconds; default the real clock) is what `prune` measures
    retention against."""

    def __init__(self, directory: Path | str, *, clock: Callable[[], float] = SYSTEM.now) -> None:
        self.directory = Path(directory)
        self.clock = clock

    def _path(self, run_id: str) -> Path:
        if not run_id or "/" in run_id or run_id.startswith("."):
            raise ValueError(f"not a run id: {run_id!r}")
        return self.directory / f"{run_id}.json"

    def _steps_path(self, run_id: str) -> Path:
        return self._path(run_id).with_suffix(".steps.jsonl")

    def _write(self, checkpoint: Checkpoint) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        text = checkpoint.to_json()
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".ckpt-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._path(checkpoint.run_id))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        if _keeps(checkpoint, lambda: checkpoint.step in self._read_steps(checkpoint.run_id)):
            with self._steps_path(checkpoint.run_id).open("a", encoding="utf-8") as f:
                f.write(text + "\n")  # the latest file above is what a restart needs: this one is not fsynced

    def _read_steps(self, run_id: str) -> dict[int, Checkpoint]:
        steps: dict[int, Checkpoint] = {}
        try:
            lines = self._steps_path(run_id).read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return steps
        for line in lines:
            try:
                cp = Checkpoint.from_json(line)
            except ValueError:  # a line cut short by a crash
                continue
            steps[cp.step] = cp
        return steps

    async def save(self, checkpoint: Checkpoint) -> None:
        await asyncio.to_thread(self._write, checkpoint)

    async def load(self, run_id: str) -> Checkpoint | None:
        path = self._path(run_id)
        try:
            return Checkpoint.from_json(await asyncio.to_thread(path.read_bytes))
        except FileNotFoundError:
            return None

    async def history(self, run_id: str) -> list[Checkpoint]:
        steps = await asyncio.to_thread(self._read_steps, run_id)
        return [steps[k] for k in sorted(steps)]

    async def load_step(self, run_id: str, step: int) -> Checkpoint | None:
        return (await asyncio.to_thread(self._read_steps, run_id)).get(step)

    async def delete(self, run_id: str) -> None:
        self._path(run_id).unlink(missing_ok=True)
        self._steps_path(run_id).unlink(missing_ok=True)

    async def prune(self, older_than_s: float = RETENTION_S) -> int:
        count, now = 0, self.clock()
        for path in self.directory.glob("*.json"):
            cp = Checkpoint.from_json(path.read_bytes())
            if _expired(cp, older_than_s, now):
                path.unlink(missing_ok=True)
                self._steps_path(cp.run_id).unlink(missing_ok=True)
                count += 1
        return count
