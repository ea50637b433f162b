"""Reading `graph.yaml`: YAML with the line and column of every key, unknown keys (all reported together,
with a did-you-mean), the load errors of `graph-workflows.md` §2–§3 and §10, then the models of `spec`.

Every error is `Failed to load graph.yaml for agent '<n>': <path>:<line>:<column>: <cause>`; several are
listed one per line under that header.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ValidationError

from ringlet.errors import ConfigError
from ringlet.graph.spec import (
    NODE_MODELS,
    NODE_TYPES,
    SUPPORTED_VERSIONS,
    GraphSettings,
    GraphSpec,
    Source,
    VariableSpec,
    node_fields,
    required_fields,
)

__all__ = ["GraphLoadError", "agent_kind", "load_graph", "parse_graph"]

Loc = tuple[str | int, ...]
TOP_FIELDS = [f for f in GraphSpec.model_fields]
SETTINGS_FIELDS = list(GraphSettings.model_fields)
VARIABLE_FIELDS = list(VariableSpec.model_fields)
SIMILARITY = 0.6


class GraphLoader(yaml.SafeLoader):
    """YAML 1.2 booleans: only true/false are booleans, so `options: [yes, no]` stays two strings (as for Loki,
    whose YAML parser follows 1.2)."""


GraphLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
GraphLoader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                  list("tTfF"))


class GraphLoadError(ConfigError):
    """graph.yaml cannot be loaded; `problems` are the located causes (`path:line:column: cause`)."""

    def __init__(self, agent: str, problems: list[str]) -> None:
        self.agent, self.problems = agent, problems
        head = f"Failed to load graph.yaml for agent '{agent}':"
        super().__init__(f"{head} {problems[0]}" if len(problems) == 1 else "\n  ".join([head, *problems]))


def agent_kind(directory: Path) -> Literal["loop", "graph"]:
    """Whether an agent directory holds a loop agent (config.yaml) or a graph agent (graph.yaml)."""
    name = directory.name
    has_config, has_graph = (directory / "config.yaml").is_file(), (directory / "graph.yaml").is_file()
    if has_config and has_graph:
        raise ConfigError(f"Agent '{name}' has both config.yaml and graph.yaml. Keep exactly one.")
    if not (has_config or has_graph):
        raise ConfigError(f"Agent '{name}' has neither a config.yaml nor a graph.yaml at '{directory}'")
    return "loop" if has_config else "graph"


def load_graph(path: Path, *, agent: str | None = None) -> GraphSpec:
    """Parse `path` (a graph.yaml, or the agent directory holding one). `agent` defaults to the directory name."""
    path = path / "graph.yaml" if path.is_dir() else path
    agent = agent or path.parent.name
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise GraphLoadError(agent, [f"{path}: cannot read: {exc.strerror or exc}"]) from None
    return parse_graph(text, path, agent=agent)


def parse_graph(text: str, path: Path, *, agent: str) -> GraphSpec:
    """Parse graph.yaml text; raises GraphLoadError with every problem found."""
    try:
        root = yaml.compose(text, Loader=GraphLoader)
        data = yaml.load(text, Loader=GraphLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise GraphLoadError(agent, [f"{where}: invalid YAML: {getattr(exc, 'problem', exc)}"]) from None
    source = Source(path, _positions(root), text)
    if not isinstance(data, dict):
        raise GraphLoadError(agent, [f"{path}:1:1: graph.yaml must be a mapping with name, start and nodes"])
    unknown = unknown_keys(data, source)
    if unknown:
        raise GraphLoadError(agent, unknown)
    spec, problems = _build(data, source)
    if problems or spec is None:
        raise GraphLoadError(agent, problems)
    spec._source = source
    return spec


# -- positions ----------------------------------------------------------------------------------------------


def _positions(root: yaml.Node | None) -> dict[Loc, tuple[int, int]]:
    """The 1-based (line, column) of every key (and sequence item) by its path from the root."""
    out: dict[Loc, tuple[int, int]] = {}

    def walk(node: yaml.Node, loc: Loc) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                here = (*loc, _scalar(key))
                out[here] = (key.start_mark.line + 1, key.start_mark.column + 1)
                out[(*here, "=")] = (value.start_mark.line + 1, value.start_mark.column + 1)
                walk(value, here)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                out[(*loc, i)] = (item.start_mark.line + 1, item.start_mark.column + 1)
                walk(item, (*loc, i))

    if root is not None:
        out[()] = (root.start_mark.line + 1, root.start_mark.column + 1)
        walk(root, ())
    return out


def _scalar(key: yaml.Node) -> str:
    return str(key.value) if isinstance(key, yaml.ScalarNode) else "?"


# -- unknown keys (§10.1) -------------------------------------------------------------------------------------


def _suggest(key: str, allowed: list[str]) -> str:
    hint = difflib.get_close_matches(key, allowed, n=1, cutoff=SIMILARITY)
    return f" Did you mean '{hint[0]}'?" if hint else f" Remove it; allowed keys: {', '.join(allowed)}"


def _unknown(mapping: Any, allowed: list[str], loc: Loc, where: str, source: Source) -> list[str]:
    if not isinstance(mapping, dict):
        return []
    return [f"{source.at(*loc, str(key))}: unknown key '{key}' {where}.{_suggest(str(key), allowed)}"
            for key in mapping if str(key) not in allowed]


def _node_unknown(node_id: str, node: dict[str, Any], source: Source) -> list[str]:
    node_type = node.get("type")
    if node_type not in NODE_MODELS:
        return []  # reported as an unknown type
    allowed = node_fields(node_type)
    out = []
    for raw_key in node:
        key = str(raw_key)
        if key in allowed:
            continue
        where = f"{source.at('nodes', node_id, key)}: unknown key '{key}' in node '{node_id}' ({node_type})."
        owners = [t for t in NODE_TYPES if key in node_fields(t)]
        if owners:
            out.append(f"{where} '{key}' is not a field of {node_type} nodes (it belongs to "
                       f"{', '.join(owners)} nodes); remove it")
        else:
            out.append(where + _suggest(key, allowed))
    return out


def unknown_keys(data: dict[str, Any], source: Source) -> list[str]:
    """Every unknown key of every fixed-schema mapping, in file order. Free-form mappings (initial_state,
    state_updates, routes, reducers, output_schema) are not checked."""
    out = _unknown(data, TOP_FIELDS, (), "at the top level", source)
    out += _unknown(data.get("settings"), SETTINGS_FIELDS, ("settings",), "in settings", source)
    variables = data.get("variables")
    if isinstance(variables, list):
        for i, v in enumerate(variables):
            out += _unknown(v, VARIABLE_FIELDS, ("variables", i), f"in variables[{i}]", source)
    nodes = data.get("nodes")
    if isinstance(nodes, dict):
        for node_id, node in nodes.items():
            if isinstance(node, dict):
                out += _node_unknown(str(node_id), node, source)
    return sorted(out, key=lambda p: _line_col(p, source))


def _line_col(problem: str, source: Source) -> tuple[int, int]:
    rest = problem.removeprefix(f"{source.path}:").split(":", 2)
    try:
        return int(rest[0]), int(rest[1])
    except (ValueError, IndexError):
        return 0, 0


# -- the models ------------------------------------------------------------------------------------------------


def _pydantic(exc: ValidationError, loc: Loc, source: Source, what: str) -> list[str]:
    out = []
    for e in exc.errors():
        full = (*loc, *(str(p) if not isinstance(p, int) else p for p in e["loc"]))
        field = ".".join(map(str, e["loc"])) or what
        out.append(f"{source.at(*full)}: {what}: '{field}': {e['msg'].removeprefix('Value error, ')}"
                   f"{_choice_hint(e)}")
    return out


def _choice_hint(error: Any) -> str:
    """" Did you mean 'append'?" for a misspelled choice (a reducer, a mode…), else ""."""
    if error["type"] != "literal_error" or not isinstance(error.get("input"), str):
        return ""
    choices = re.findall(r"'([^']*)'", str((error.get("ctx") or {}).get("expected", "")))
    hint = difflib.get_close_matches(error["input"], choices, n=1, cutoff=SIMILARITY)
    return f". Did you mean '{hint[0]}'?" if hint else ""


def _top_level(data: dict[str, Any], source: Source) -> list[str]:
    """The load errors of §2 that do not depend on the nodes."""
    out = []
    version = data.get("version", "1.0")
    if str(version) not in SUPPORTED_VERSIONS:
        out.append(f"{source.at('version', '=')}: Unsupported graph schema version '{version}'. "
                   f"Supported versions: {', '.join(SUPPORTED_VERSIONS)}")
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        out.append(f"{source.at('name', '=')}: Graph must have a non-empty 'name' field")
    out.extend(f"{source.at()}: graph.yaml is missing required field '{key}' (required: name, start, nodes)"
               for key in ("start", "nodes") if key not in data)
    nodes = data.get("nodes")
    if "nodes" in data and not nodes:
        out.append(f"{source.at('nodes')}: Graph '{name}' has no nodes defined")
    elif nodes is not None and not isinstance(nodes, dict):
        out.append(f"{source.at('nodes', '=')}: 'nodes' must be a mapping of node id to node")
    return out


def _node_shape(node_id: str, raw: Any, source: Source) -> str | None:
    """Why a node cannot be validated as its type: not a mapping, no or an unknown type, a mismatched id, or
    a missing required field. None when it can."""
    where = source.at("nodes", node_id)
    node_type = raw.get("type") if isinstance(raw, dict) else None
    if not isinstance(raw, dict):
        problem = f"{where}: node '{node_id}' must be a mapping with a 'type'"
    elif node_type is None:
        problem = f"{where}: node '{node_id}' is missing required field 'type' (one of: {', '.join(NODE_TYPES)})"
    elif node_type not in NODE_MODELS:
        hint = difflib.get_close_matches(str(node_type), NODE_TYPES, n=1, cutoff=SIMILARITY)
        problem = (f"{source.at('nodes', node_id, 'type', '=')}: node '{node_id}' has unknown type '{node_type}'. "
                   f"Valid types: {', '.join(NODE_TYPES)}" + (f". Did you mean '{hint[0]}'?" if hint else ""))
    elif "id" in raw and str(raw["id"]) != node_id:
        problem = (f"{source.at('nodes', node_id, 'id', '=')}: Node ID mismatch: key '{node_id}' does not match "
                   f"node.id '{raw['id']}'")
    else:
        required = required_fields(node_type)
        missing = [f for f in required if f not in raw]
        problem = None if not missing else (
            f"{where}: {node_type} node '{node_id}' is missing required field{'s' if len(missing) > 1 else ''} "
            f"{', '.join(repr(m) for m in missing)} ({node_type} nodes require: {', '.join(required)})")
    return problem


def _node(node_id: str, raw: Any, source: Source) -> tuple[BaseModel | None, list[str]]:
    """One node: its shape (type, id, required fields), then its model."""
    problem = _node_shape(node_id, raw, source)
    if problem is not None:
        return None, [problem]
    node_type = raw["type"]
    try:
        node = NODE_MODELS[node_type].model_validate({**raw, "id": node_id})
    except ValidationError as exc:
        return None, _pydantic(exc, ("nodes", node_id), source, f"node '{node_id}' ({node_type})")
    return node, _schema_problems(node, node_id, source)


def _schema_problems(node: BaseModel, node_id: str, source: Source) -> list[str]:
    """§10.2: `output_schema` must itself be a valid JSON Schema (Draft 2020-12)."""
    schema = getattr(node, "output_schema", None)
    if schema is None:
        return []
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        path = "/".join(map(str, exc.absolute_path)) or "(root)"
        return [f"{source.at('nodes', node_id, 'output_schema', '=')}: node '{node_id}': output_schema is not a "
                f"valid JSON Schema (Draft 2020-12) at {path}: {exc.message}"]
    return []


def _build(data: dict[str, Any], source: Source) -> tuple[GraphSpec | None, list[str]]:
    problems = _top_level(data, source)
    nodes: dict[str, BaseModel] = {}
    raw_nodes = data.get("nodes")
    if isinstance(raw_nodes, dict):
        for key, raw in raw_nodes.items():
            node, found = _node(str(key), raw, source)
            problems += found
            if node is not None:
                nodes[str(key)] = node
    if problems:
        return None, problems
    try:
        spec = GraphSpec.model_validate({**data, "version": str(data.get("version", "1.0")), "nodes": nodes})
    except ValidationError as exc:
        return None, _pydantic(exc, (), source, "graph")
    start = spec.start
    if start not in spec.nodes:
        return None, [f"{source.at('start', '=')}: Start node '{start}' not found in graph '{spec.name}'. "
                      f"Available nodes: {', '.join(spec.nodes)}"]
    return spec, []
