"""Forking a graph run (issue 44): a new run that starts at a stored checkpoint of another, its state edited
or not. The fork runs the checkpoint's frontier next, so the nodes before it are not run again (their side
effects stay the original's); the original run and its checkpoints are not touched.

    result = await agent.fork(run_id, step=2, state_patch={"city": "Oslo"})   # GraphAgent.fork

A `state_patch` replaces top-level state keys (it is what the state should hold there, not a write folded
in). It must fit the graph's state: each key one the graph declares (`initial_state`, `state_updates`,
`output_schema` properties, a map's keys; `state_keys.declared_keys`) or the checkpoint holds (a script's);
a key with a reducer holds what that reducer folds later writes into (`append`/`extend` an array, `concat`
a string, `sum`/`max`/`min` a number, `merge` an object); a key an `output_schema` declares validates
against that property's schema; a key `initial_state` gives a typed value (a number, a boolean, an array,
an object) keeps that type unless a node's `state_updates` writes it (those write strings). Any misfit
raises `StatePatchError`, naming each key and the fix.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ringlet.errors import ConfigError
from ringlet.graph.checkpoint import Checkpoint
from ringlet.graph.reducers import json_type
from ringlet.graph.spec import GraphSpec
from ringlet.graph.state_keys import declared_keys

__all__ = ["ForkError", "ForkFrom", "StatePatchError", "check_patch", "fork_source", "forked"]

_HOLDS = {"append": ("array", "[]"), "extend": ("array", "[]"), "concat": ("string", '""'),
          "sum": ("number", "0"), "max": ("number", "0"), "min": ("number", "0"), "merge": ("object", "{}")}
"""What a key with each reducer must hold (its JSON type), and an example of it."""


@dataclass(frozen=True, slots=True)
class ForkFrom:
    """Where a forked run starts: run `run_id`'s checkpoint after `step` super-steps, its state with
    `state_patch` written over it. `force`: even when graph.yaml changed since that checkpoint."""

    run_id: str
    step: int
    state_patch: Mapping[str, Any] = field(default_factory=dict)
    force: bool = False

    @classmethod
    def of(cls, value: ForkFrom | Mapping[str, Any]) -> ForkFrom:
        """A ForkFrom, or one from its `to_dict()` form (a durable run's spec carries it as JSON)."""
        if isinstance(value, ForkFrom):
            return value
        return cls(str(value["run_id"]), int(value["step"]), dict(value.get("state_patch") or {}),
                   bool(value.get("force", False)))

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "step": self.step, "state_patch": dict(self.state_patch),
                "force": self.force}


class ForkError(ConfigError):
    """A fork that cannot start. `code`: `checkpoint_not_found` (no such run here, or no checkpoint kept at that
    step), `checkpoint_ended` (the step is the run's end: nothing is left to run), `graph_changed` (graph.yaml
    changed since the checkpoint; pass `force`), `no_history` (the checkpoint store keeps only the latest)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


class StatePatchError(ForkError):
    """A `state_patch` that does not fit the graph's state: `problems` is `[(key, what is wrong and the fix)]`."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        super().__init__("invalid_state_patch", "state_patch does not fit the graph's state: " +
                         "; ".join(f"{key}: {problem}" for key, problem in problems))
        self.problems = problems


def _property_schemas(spec: GraphSpec) -> dict[str, list[tuple[str, Any]]]:
    """Per state key, the `output_schema` property schemas that declare it (node id, schema)."""
    found: dict[str, list[tuple[str, Any]]] = {}
    for node_id, node in spec.nodes.items():
        schema = getattr(node, "output_schema", None)
        properties = schema.get("properties") if isinstance(schema, dict) else None
        for key, prop in (properties or {}).items():
            if isinstance(prop, dict):
                found.setdefault(key, []).append((node_id, prop))
    return found


def _reducer_problem(reducer: str, value: Any) -> str | None:
    wanted, example = _HOLDS.get(reducer, (None, ""))
    got = json_type(value)
    if wanted is None or got == wanted:
        return None
    return (f"has reducer '{reducer}', which folds later writes into {'an' if wanted[0] in 'aeiou' else 'a'} "
            f"{wanted}: give {'an' if wanted[0] in 'aeiou' else 'a'} {wanted} (e.g. {example}), not {got}")


def _initial_problem(spec: GraphSpec, key: str, value: Any) -> str | None:
    """A key `initial_state` gives a typed value (not a string, not null) keeps that JSON type, unless a node's
    `state_updates` writes it (they write strings)."""
    initial = spec.initial_state.get(key)
    if initial is None or isinstance(initial, str) or json_type(value) == json_type(initial):
        return None
    if any(key in (getattr(node, "state_updates", None) or {}) for node in spec.nodes.values()):
        return None
    wanted = json_type(initial)
    return (f"initial_state gives it {'an' if wanted[0] in 'aeiou' else 'a'} {wanted} ({initial!r}) and no "
            f"state_updates writes it: give {'an' if wanted[0] in 'aeiou' else 'a'} {wanted}, not {json_type(value)}")


def check_patch(spec: GraphSpec, state: Mapping[str, Any], patch: Mapping[str, Any]) -> list[tuple[str, str]]:
    """What is wrong with `patch` for this graph and this checkpoint's `state`: `[(key, problem)]`, empty when
    it fits (the module's docstring says what fits)."""
    from jsonschema import Draft202012Validator  # only when a fork is checked: `import ringlet.graph` stays cheap
    from jsonschema.exceptions import best_match

    known = declared_keys(spec) | set(state)
    schemas = _property_schemas(spec)
    problems: list[tuple[str, str]] = []
    for key, value in patch.items():
        if key not in known:
            problems.append((key, f"is not a key of this graph's state (known: {', '.join(sorted(known))}); "
                                  "declare it in initial_state to add it, or correct the name"))
            continue
        reducer = spec.reducers.get(key)
        if reducer is not None and (problem := _reducer_problem(reducer, value)) is not None:
            problems.append((key, problem))
            continue
        if (problem := _initial_problem(spec, key, value)) is not None:
            problems.append((key, problem))
            continue
        for node_id, schema in schemas.get(key, ()):
            error = best_match(Draft202012Validator(schema).iter_errors(value))
            if error is not None:
                problems.append((key, f"does not match the output_schema of node '{node_id}': {error.message}"))
                break
    return problems


async def fork_source(store: Any, fork: ForkFrom, *, spec: GraphSpec, agent: str, graph_hash: str) -> Checkpoint:
    """The checkpoint `fork` starts from, checked (ForkError) and its patch too (StatePatchError)."""
    load_step = getattr(store, "load_step", None)
    if load_step is None:
        raise ForkError("no_history", f"this checkpoint store ({type(store).__name__}) keeps only each run's latest "
                                      "checkpoint; forking needs one that keeps every step (MemoryCheckpoints, "
                                      "FileCheckpoints, the server's store)")
    cp = await load_step(fork.run_id, fork.step)
    if cp is None or (cp.agent and cp.agent != agent):
        kept = [c.step for c in await store.history(fork.run_id) if not c.agent or c.agent == agent]
        have = f"its checkpoints are steps {', '.join(map(str, kept))}" if kept else \
            "it has none here (it never ran with this agent, or ended more than 72 h ago)"
        raise ForkError("checkpoint_not_found", f"run {fork.run_id!r} has no checkpoint at step {fork.step}; {have}")
    if not cp.frontier:
        raise ForkError("checkpoint_ended", f"step {fork.step} is the end of run {fork.run_id!r} ({cp.status}): "
                                            "nothing is left to run from it; fork from an earlier step")
    if cp.graph_hash != graph_hash and not fork.force:
        raise ForkError("graph_changed", f"graph changed since checkpoint: graph.yaml was edited after run "
                                         f"{fork.run_id!r} saved step {fork.step}; pass force to fork it with the "
                                         "new graph")
    problems = check_patch(spec, cp.state, fork.state_patch)
    if problems:
        raise StatePatchError(problems)
    return cp


def forked(source: Checkpoint, patch: Mapping[str, Any], *, run_id: str, graph_hash: str, agent: str,
           run: dict[str, Any]) -> Checkpoint:
    """The new run's first checkpoint: `source`'s step, frontier and visit counts, its state with `patch`
    written over it; no question pending, nothing ended, no node statistics yet."""
    state = copy.deepcopy(source.state)
    state.update(copy.deepcopy(dict(patch)))
    return Checkpoint(run_id=run_id, graph_hash=graph_hash, step=source.step, state=state,
                      frontier=list(source.frontier), visit_counts=dict(source.visit_counts),
                      elapsed_active_s=source.elapsed_active_s, agent=agent, run=run)
