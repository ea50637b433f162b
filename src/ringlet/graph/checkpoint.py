"""Checkpoints (`graph-workflows.md` §10.4): after every super-step, the run as a JSON-ready value.

A run restarts from its latest checkpoint: the state before the step that was interrupted, so that step's
nodes may run again. Stores keep only the latest checkpoint of each run. `MemoryCheckpoints` serves the
library and tests; `FileCheckpoints` survives the process (one JSON file per run, replaced atomically);
the server's store implements the same protocol.
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

__all__ = ["RETENTION_S", "Checkpoint", "CheckpointStore", "FileCheckpoints", "MemoryCheckpoints"]

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


def _expired(checkpoint: Checkpoint, older_than_s: float, now: float) -> bool:
    return checkpoint.ended_at is not None and checkpoint.ended_at < now - older_than_s


class MemoryCheckpoints:
    """Checkpoints in this process, pickled (a snapshot later changes never reach, and several times cheaper
    to take than JSON; nothing but this process ever reads it). `clock` (epoch seconds; default the real
    clock) is what `prune` measures retention against."""

    def __init__(self, *, clock: Callable[[], float] = SYSTEM.now) -> None:
        self._runs: dict[str, bytes] = {}
        self.clock = clock

    async def save(self, checkpoint: Checkpoint) -> None:
        self._runs[checkpoint.run_id] = pickle.dumps(checkpoint, protocol=pickle.HIGHEST_PROTOCOL)

    async def load(self, run_id: str) -> Checkpoint | None:
        data = self._runs.get(run_id)
        return pickle.loads(data) if data is not None else None  # our own snapshot

    async def delete(self, run_id: str) -> None:
        self._runs.pop(run_id, None)

    async def prune(self, older_than_s: float = RETENTION_S) -> int:
        now = self.clock()
        old = [k for k, v in self._runs.items() if _expired(pickle.loads(v), older_than_s, now)]
        for k in old:
            del self._runs[k]
        return len(old)

    def __len__(self) -> int:
        return len(self._runs)


class FileCheckpoints:
    """One `<run_id>.json` per run in `directory`, written to a temporary file, flushed, then renamed.
    `clock` (epoch seconds; default the real clock) is what `prune` measures retention against."""

    def __init__(self, directory: Path | str, *, clock: Callable[[], float] = SYSTEM.now) -> None:
        self.directory = Path(directory)
        self.clock = clock

    def _path(self, run_id: str) -> Path:
        if not run_id or "/" in run_id or run_id.startswith("."):
            raise ValueError(f"not a run id: {run_id!r}")
        return self.directory / f"{run_id}.json"

    def _write(self, checkpoint: Checkpoint) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".ckpt-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(checkpoint.to_json())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._path(checkpoint.run_id))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    async def save(self, checkpoint: Checkpoint) -> None:
        await asyncio.to_thread(self._write, checkpoint)

    async def load(self, run_id: str) -> Checkpoint | None:
        path = self._path(run_id)
        try:
            return Checkpoint.from_json(await asyncio.to_thread(path.read_bytes))
        except FileNotFoundError:
            return None

    async def delete(self, run_id: str) -> None:
        self._path(run_id).unlink(missing_ok=True)

    async def prune(self, older_than_s: float = RETENTION_S) -> int:
        count, now = 0, self.clock()
        for path in self.directory.glob("*.json"):
            if _expired(Checkpoint.from_json(path.read_bytes()), older_than_s, now):
                path.unlink(missing_ok=True)
                count += 1
        return count
