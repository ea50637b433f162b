"""The validator (`graph-workflows.md` §7 and §10): every error and warning of a parsed graph, all at once.

    report = validate(spec)
    report.raise_for_errors()   # GraphValidationError: "Graph validation failed with N error(s): …"

Each issue names its node, the file position and, where one helps, the fix.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from ringlet.agent.loki import skill_dirs
from ringlet.errors import ConfigError
from ringlet.graph import resources
from ringlet.graph.scripts import outside_message, script_path
from ringlet.graph.spec import (
    RAG_DRIVERS,
    AgentNode,
    ApprovalNode,
    EndNode,
    GraphSpec,
    InputNode,
    LlmNode,
    MapNode,
    RagNode,
    ScriptNode,
    strip_suffix,
)
from ringlet.graph.state_keys import SPECIAL, declared_keys, mentioned, template_reads
from ringlet.graph.templates import reads

__all__ = [
    "VALIDATION",
    "Checks",
    "GraphValidationError",
    "Issue",
    "Report",
    "edges",
    "validate",
    "validate_graph",
]

VALIDATION = re.compile(r"^\s*len\(input\)\s*(>=|<=|==|>|<)\s*(\d+)\s*$")
GRAPH = "graph"


@dataclass(frozen=True, slots=True)
class Issue:
    node: str
    message: str
    where: str
    fix: str = ""
    quiet: bool = False
    """Shown by `ringlet graph validate`, but logged only at debug level when the agent loads (a graph that
    routes with `_next` would otherwise warn on every run)."""

    def __str__(self) -> str:
        return f"[{self.node}] {self.message}"

    def describe(self) -> str:
        """The issue with its position and fix, as the CLI prints it."""
        return f"[{self.node}] {self.message}\n      at {self.where}" + (f": {self.fix}" if self.fix else "")


class GraphValidationError(ConfigError):
    def __init__(self, errors: list[Issue], warnings: list[Issue]) -> None:
        self.errors, self.warnings = errors, warnings
        lines = "\n  ".join(e.describe() for e in errors)
        super().__init__(f"Graph validation failed with {len(errors)} error(s):\n  {lines}")


@dataclass(slots=True)
class Report:
    errors: list[Issue] = field(default_factory=list)
    warnings: list[Issue] = field(default_factory=list)

    def raise_for_errors(self) -> None:
        if self.errors:
            raise GraphValidationError(self.errors, self.warnings)


@dataclass
class Checks:
    """What the validator may ask about the world. The defaults look at the agent directory, the installed
    providers and skills; tests and the server pass their own."""

    directory: Path
    agent_exists: Callable[[str], bool] | None = None
    model_known: Callable[[str], bool] = resources.model_known

    global_tools: Sequence[str] = ()
    """The graph's `global_tools` (`validate` sets them)."""
    _problems: dict[str, str | None] = field(default_factory=dict, repr=False)
    tools_error: str | None = None
    """Why tools.py could not be imported, if it could not."""

    @cached_property
    def tools(self) -> Collection[str]:
        try:
            return set(resources.agent_tools(self.directory, self.global_tools))
        except ConfigError as exc:
            self.tools_error = str(exc)
            return set()

    @cached_property
    def own(self) -> Collection[str]:
        """The agent's own tools: functions of tools.py, `@cmd`s of tools.sh."""
        try:
            return set(resources.own_tools(self.directory))
        except ConfigError as exc:
            self.tools_error = str(exc)
            return set()

    servers_error: str | None = None
    """Why the MCP config could not be read (file:line: what is wrong), if it could not."""

    @cached_property
    def servers(self) -> Collection[str]:
        try:
            return set(resources.mcp_servers(self.directory))
        except ConfigError as exc:
            self.servers_error = str(exc)
            return set()

    @cached_property
    def skills(self) -> Collection[str]:
        return resources.installed_skills()

    def agent(self, name: str) -> bool:
        if self.agent_exists is not None:
            return self.agent_exists(name)
        return resources.agent_directory(name, self.directory) is not None

    def agent_problem(self, name: str) -> str | None:
        """What is wrong with agent `name`'s own files, if anything: its config.yaml and tools (a loop agent),
        or its graph.yaml (a graph agent). Not asked when `agent_exists` stands in for the agents."""
        directory = resources.agent_directory(name, self.directory)
        if self.agent_exists is not None or directory is None:
            return None
        if name not in self._problems:
            self._problems[name] = self._load(directory)
        return self._problems[name]

    @staticmethod
    def _load(directory: Path) -> str | None:
        from ringlet.agent.config import load_spec, resolve_tools

        try:
            spec = load_spec(directory)
            if spec.config is not None:
                resolve_tools(spec.config, directory, name=spec.name)
            else:
                from ringlet.graph.parse import load_graph

                load_graph(directory)
        except ConfigError as exc:
            return str(exc)
        return None


class _Run:
    """One validation: the spec, the checks and the report being filled."""

    def __init__(self, spec: GraphSpec, checks: Checks) -> None:
        self.spec, self.checks, self.report = spec, checks, Report()

    def error(self, node: str, message: str, *loc: str | int, fix: str = "") -> None:
        self.report.errors.append(Issue(node, message, self._where(node, loc), fix))

    def warn(self, node: str, message: str, *loc: str | int, fix: str = "", quiet: bool = False) -> None:
        self.report.warnings.append(Issue(node, message, self._where(node, loc), fix, quiet))

    def _where(self, node: str, loc: tuple[str | int, ...]) -> str:
        source = self.spec.source
        return source.at(*loc) if node == GRAPH else source.at("nodes", node, *loc)


def _templates(run: _Run) -> None:
    """`{{key}}` that nothing can have put in the state (`state_keys`), each reported at its line and column.

    Without script nodes every key is known before the run. A strict field that reads a key the graph never
    writes, next to one it does (`{{nam}}`, `name`), is a typo: an error, with "Did you mean". Any other
    unknown key is a warning that says what will happen (the node fails, or the text renders empty): the
    graph is valid in Loki, whose validator does not look at templates, and it must stay valid here
    (§10), e.g. when the node sits on a path not taken. A script's stdout may hold any key, so with scripts
    only keys their files never mention are reported, as warnings."""
    spec = run.spec
    known = declared_keys(spec)
    scripts = any(isinstance(n, ScriptNode) for n in spec.nodes.values())
    variables = {v.name for v in spec.variables}
    found = list(template_reads(spec))
    printed = mentioned(spec, {r.key for r in found} - known) if scripts else set()  # taken as written
    said: set[tuple[str, tuple[str | int, ...], str]] = set()
    for r in found:
        if (r.key in known or r.key == r.scoped or (r.specials and r.key in SPECIAL) or r.key in printed
                or (r.node, r.loc, r.key) in said):
            continue
        said.add((r.node, r.loc, r.key))
        usable = known | printed | {r.scoped or ""} | (SPECIAL if r.specials else set())
        close = difflib.get_close_matches(r.key, sorted(usable - {""}), n=1, cutoff=0.6)
        if r.key in variables:
            message = f"{r.template} reads '{r.key}', a variable; variables are not in the graph's state"
            fix = f"scripts read it as LLM_AGENT_VAR_{r.key.upper()}; a script can copy it into the state"
        else:
            message = f"{r.template} reads '{r.key}', which nothing in the graph writes" + (
                f". Did you mean '{close[0]}'?" if close else "")
            fix = (f"write {{{{{close[0]}}}}}" if close else
                   f"set '{r.key}' in initial_state or a node's state_updates")
        fix += "; a script that prints it should name it in its source" if scripts else ""
        fix += (f" (as it is, the node fails: {r.template} is strict here)" if r.strict else
                f" (as it is, {r.template} renders as empty text)")
        where = _template_at(spec.source, ("nodes", r.node, *r.loc), r.template)
        issue = Issue(r.node, message, where, fix)
        typo = r.strict and not scripts and bool(close) and r.key not in variables
        (run.report.errors if typo else run.report.warnings).append(issue)


def _template_at(source: Any, loc: tuple[str | int, ...], template: str) -> str:
    """`path:line:column` of `template` in the value at `loc` (of the value, when the text is not found)."""
    start = source.positions.get((*loc, "=")) or source.positions.get(loc)
    if start is None or not source.text:
        return source.at(*loc)
    lines = source.text.splitlines(keepends=True)
    offset = sum(len(line) for line in lines[:start[0] - 1]) + start[1] - 1
    found = source.text.find(template, offset)
    if found < 0:
        return source.at(*loc, "=")
    line = source.text.count("\n", 0, found) + 1
    return f"{source.path}:{line}:{found - source.text.rfind(chr(10), 0, found)}"


def edges(node: Any) -> Iterator[tuple[str, str]]:
    """A node's declared edges: (field, target) for next, routes, on_other, fallback and branch."""
    for target in node.targets:
        yield "next", target
    if isinstance(node, ApprovalNode):
        for option, target in node.routes.items():
            yield f"routes.{option}", target
        yield "on_other", node.on_other
    fallback = getattr(node, "fallback", None)
    if fallback:
        yield "fallback", fallback
    if isinstance(node, MapNode):
        yield "branch", node.branch


def validate(spec: GraphSpec, checks: Checks | None = None) -> Report:
    """Every error and warning of §7 (and §10) for `spec`."""
    run = _Run(spec, checks or Checks(spec.directory))
    run.checks.global_tools = run.checks.global_tools or spec.global_tools
    for check in (_references, _cycles, _ends, _reachability, _files_and_agents, _approvals, _rags, _llms,
                  _skills, _concurrency, _inputs, _map_branches, _fan_outs, _templates, _name):
        check(run)
    return run.report


# -- graph structure -----------------------------------------------------------------------------------------


def _references(run: _Run) -> None:
    nodes = run.spec.nodes
    for node_id, node in nodes.items():
        for name, target in edges(node):
            if target not in nodes:
                fld = name.split(".")[0]
                run.error(node_id, f"References non-existent node '{target}' in '{fld}'", *name.split("."), "=",
                          fix=f"use one of: {', '.join(nodes)}")


def _cycles(run: _Run) -> None:
    nodes = run.spec.nodes
    seen: set[frozenset[str]] = set()
    state: dict[str, int] = {}  # 1 on the stack, 2 done

    def visit(node_id: str, path: list[str]) -> None:
        state[node_id] = 1
        path.append(node_id)
        for _, target in edges(nodes[node_id]):
            if target not in nodes:
                continue
            if state.get(target) == 1:
                cycle = [*path[path.index(target):], target]
                if frozenset(cycle) not in seen:
                    seen.add(frozenset(cycle))
                    run.error(cycle[0], f"Cycle detected: {' -> '.join(cycle)}",
                              fix="loops must route with a script's _next, not with declared edges")
            elif target not in state:
                visit(target, path)
        path.pop()
        state[node_id] = 2

    for node_id in [run.spec.start, *nodes]:
        if node_id in nodes and node_id not in state:
            visit(node_id, [])


def _reachable(spec: GraphSpec) -> list[str]:
    order, todo = [], [spec.start]
    while todo:
        node_id = todo.pop(0)
        if node_id in order or node_id not in spec.nodes:
            continue
        order.append(node_id)
        todo += [t for _, t in edges(spec.nodes[node_id])]
    return order


def _ends(run: _Run) -> None:
    spec = run.spec
    if not any(isinstance(n, EndNode) for n in spec.nodes.values()):
        run.error(GRAPH, "Graph has no end nodes; execution would never terminate", "nodes",
                  fix="add a node with type: end and route to it")
        return
    if not any(isinstance(spec.nodes[n], EndNode) for n in _reachable(spec)):
        run.warn(GRAPH, f"No end node is reachable from start '{spec.start}' over the declared edges", "start",
                 fix="route a path to an end node (targets named by _next are not analysed)")
    for node_id, node in spec.nodes.items():
        if isinstance(node, EndNode) and node.output is None:
            run.warn(node_id, "End node has no 'output'; the run's result will be \"\"",
                     fix="add output: \"{{some_key}}\"")


def _reachability(run: _Run) -> None:
    """Nodes no declared edge reaches. When a reachable script routes with `_next` (its file says so), they
    are likely its targets: one quiet warning names them all."""
    spec = run.spec
    reachable = _reachable(spec)
    lost = [node_id for node_id in spec.nodes if node_id not in reachable]
    if lost and any(_routes_itself(spec, spec.nodes[n]) for n in reachable):
        run.warn(GRAPH, f"{len(lost)} node(s) are reached only if a script routes to them with _next: "
                        f"{', '.join(lost)}", "nodes", quiet=True,
                 fix="fine when the scripts name them in _next; otherwise route to them or remove them")
        return
    for node_id in lost:
        run.warn(node_id, f"Node '{node_id}' is unreachable from start '{spec.start}'",
                 fix="route to it, or remove it (targets named by _next are not analysed)")


def _routes_itself(spec: GraphSpec, node: Any) -> bool:
    """Whether a script node's file mentions `_next` (so it may route anywhere)."""
    if not isinstance(node, ScriptNode) or script_path(spec.directory, node.script) is None:
        return False
    try:
        return "_next" in (spec.directory / node.script).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False


# -- per node type ---------------------------------------------------------------------------------------------


def _files_and_agents(run: _Run) -> None:
    for node_id, node in run.spec.nodes.items():
        if isinstance(node, ScriptNode):
            _script(run, node_id, node)
        if isinstance(node, AgentNode) and not run.checks.agent(node.agent):
            run.error(node_id, f"Agent '{node.agent}' not found", "agent", "=",
                      fix="name an agent directory next to this one, or a discovered agent (`ringlet agents`)")
        elif isinstance(node, AgentNode) and (problem := run.checks.agent_problem(node.agent)) is not None:
            run.error(node_id, f"Agent '{node.agent}' cannot be loaded: {problem}", "agent", "=",
                      fix="fix the sub-agent's files")


def _script(run: _Run, node_id: str, node: ScriptNode) -> None:
    """The script must lie inside the agent directory (after `..` and symlinks) and exist there."""
    directory = run.spec.directory
    if script_path(directory, node.script) is None:
        name = Path(node.script).name
        run.error(node_id, outside_message(directory, node.script), "script", "=",
                  fix=f"move the script into the agent directory (e.g. scripts/{name}) and write its path "
                      "relative to it; a symlink must point inside it too")
    elif not (directory / node.script).is_file():
        run.error(node_id, f"Script file not found: '{node.script}'", "script", "=",
                  fix=f"create it under {directory}, or fix the path (relative to the agent directory)")


def _approvals(run: _Run) -> None:
    for node_id, node in run.spec.nodes.items():
        if not isinstance(node, ApprovalNode):
            continue
        for option in node.options:
            if option not in node.routes:
                run.error(node_id, f"Approval option '{option}' has no route defined", "routes",
                          fix=f"add routes.{option}: <node id>")
        for route in node.routes:
            if route not in node.options:
                run.warn(node_id, f"Route '{route}' matches no option", "routes", route,
                         fix=f"options are: {', '.join(node.options)}")


def _rags(run: _Run) -> None:
    for node_id, node in run.spec.nodes.items():
        if not isinstance(node, RagNode):
            continue
        if not node.documents:
            run.error(node_id, "rag node has no documents", "documents",
                      fix="list files, globs, URLs or loader:path entries (relative to the agent directory)")
        for i, entry in enumerate(node.documents):
            _document(run, node_id, i, entry)
        if node.driver is not None and node.driver not in RAG_DRIVERS:
            run.error(node_id, f"Unsupported rag driver '{node.driver}' (supported: {', '.join(RAG_DRIVERS)})",
                      "driver", "=")
        if node.extractor_prompt is not None and "__CHUNK__" not in node.extractor_prompt:
            run.error(node_id, "extractor_prompt must contain __CHUNK__", "extractor_prompt", "=",
                      fix="put __CHUNK__ where the chunk's text goes")
        if not node.state_updates:
            run.warn(node_id, "rag node has no state_updates; its {{output}} is lost", fix="add state_updates")


def _document(run: _Run, node_id: str, i: int, entry: str) -> None:
    """A local document entry must name something: an error when its path does not exist, a warning when
    its glob or directory holds no file."""
    from ringlet.memory.documents import local_matches, missing

    try:
        problem = missing(entry, run.spec.directory)
    except ConfigError as exc:
        run.error(node_id, str(exc), "documents", i, fix="write a path, a glob, a URL, or text:PATH")
        return
    if problem is not None:
        run.error(node_id, problem, "documents", i,
                  fix="create it, or fix the path (relative to the agent directory)")
    elif not entry.startswith(("http://", "https://")) and not local_matches(entry, run.spec.directory):
        run.warn(node_id, f"rag document '{entry}' names no file; the knowledge base gets nothing from it",
                 "documents", i, fix="put documents there, or fix the glob")


def _llms(run: _Run) -> None:
    spec, checks = run.spec, run.checks
    provided = list(dict.fromkeys([*spec.tool_names, *checks.own]))
    offered = [*provided, *(f"mcp:{s}" for s in spec.mcp_servers)]
    used = {name for node in spec.nodes.values() if isinstance(node, LlmNode) for name in node.tools}
    for i, entry in enumerate(spec.global_tools):  # the ones llm nodes use are reported there
        if strip_suffix(entry) not in checks.tools and strip_suffix(entry) not in used:
            problem = resources.global_tool_problem(entry)
            run.error(GRAPH, problem or f"global tool '{entry}' cannot be loaded", "global_tools", i,
                      fix="name a built-in tool, a function of tools.py or tools.sh, or a file of Loki's "
                          "functions/tools")
    for i, server in enumerate(spec.mcp_servers):
        if server in checks.servers:
            continue
        if checks.servers_error is not None:  # said once, not as "not defined" for each server
            run.error(GRAPH, f"the MCP config cannot be read: {checks.servers_error}", "mcp_servers",
                      fix="correct the MCP config")
            break
        path = resources.mcp_config_path(spec.directory)
        run.error(GRAPH, f"MCP server '{server}' is not defined in the MCP config "
                         f"({path or 'none found'})", "mcp_servers", i,
                  fix="define it under mcpServers in mcp.json (agent directory, agents folder, "
                      "RINGLET_MCP_CONFIG, or Loki's functions/mcp.json)")
    if spec.model is not None and not checks.model_known(spec.model):
        run.error(GRAPH, f"Unknown model '{spec.model}': no installed provider handles it", "model", "=",
                  fix="write provider:model with an installed provider (`ringlet models`)")
    for node_id, node in spec.nodes.items():
        if not isinstance(node, LlmNode):
            continue
        for i, name in enumerate(node.tools):
            _llm_tool(run, node_id, i, name, provided=provided, offered=offered)
        if node.model is not None and not checks.model_known(node.model):
            run.error(node_id, f"Unknown model '{node.model}': no installed provider handles it", "model", "=",
                      fix="write provider:model with an installed provider (`ringlet models`)")


def _llm_tool(run: _Run, node_id: str, i: int, name: str, *, provided: list[str], offered: list[str]) -> None:
    spec = run.spec
    if name.startswith("mcp:"):
        if name[4:] not in spec.mcp_servers:
            run.error(node_id, f"llm node references unknown MCP server '{name[4:]}' ({name})", "tools", i,
                      fix=f"add it to the graph's mcp_servers (declared: {', '.join(spec.mcp_servers) or 'none'})")
        return
    if name not in provided:
        run.error(node_id, f"llm node references unknown tool '{name}'. Agent '{spec.directory.name}' provides: "
                  f"{', '.join(offered) or '(nothing)'}", "tools", i,
                  fix="add it to global_tools, or define it in tools.py or tools.sh")
    elif name not in run.checks.tools:
        entry = next((e for e in spec.global_tools if strip_suffix(e) == name), name)
        run.error(node_id, f"Tool '{name}' is neither a built-in tool, a function of tools.py or tools.sh, nor a "
                  "file of Loki's functions/tools", "tools", i,
                  fix=run.checks.tools_error or resources.global_tool_problem(entry) or
                  f"define {name}() in {spec.directory / 'tools.py'}")


def _skills(run: _Run) -> None:
    spec = run.spec
    graph_skills = spec.enabled_skills
    holders: list[tuple[str, list[str] | None]] = [(GRAPH, graph_skills)]
    holders += [(i, n.enabled_skills) for i, n in spec.nodes.items() if isinstance(n, LlmNode)]
    reported: set[str] = set()  # a bad or missing skill is said once per graph, where it is first named
    for holder, names in holders:
        for name in names or ():
            if name in reported:
                continue
            if len(name) > 64 or not resources.SKILL_NAME.match(name):
                reported.add(name)
                run.error(holder, f"Invalid skill name '{name}'", "enabled_skills",
                          fix="lowercase letters, digits and hyphens, at most 64 characters")
            elif name not in run.checks.skills:
                reported.add(name)
                run.error(holder, f"Skill '{name}' is not installed", "enabled_skills",
                          fix=f"install it in one of {', '.join(map(str, skill_dirs()))} (<name>/SKILL.md)")
            elif holder != GRAPH and graph_skills is not None and name not in graph_skills:
                run.error(holder, f"Skill '{name}' is not among the graph's enabled_skills", "enabled_skills",
                          fix="a node's enabled_skills must be a subset of the graph's")


def _concurrency(run: _Run) -> None:
    if run.spec.settings.max_concurrency == 0:
        run.error(GRAPH, "settings.max_concurrency must be at least 1, got 0", "settings", "max_concurrency")
    for node_id, node in run.spec.nodes.items():
        if isinstance(node, MapNode) and node.max_concurrency == 0:
            run.error(node_id, "max_concurrency must be at least 1, got 0", "max_concurrency")


def _inputs(run: _Run) -> None:
    for node_id, node in run.spec.nodes.items():
        if isinstance(node, InputNode) and node.validation is not None and not VALIDATION.match(node.validation):
            run.error(node_id, f"Invalid validation expression '{node.validation}'", "validation", "=",
                      fix="write len(input) OP N, with OP one of > >= < <= ==")


def _map_branches(run: _Run) -> None:
    nodes = run.spec.nodes
    for node_id, node in nodes.items():
        if not isinstance(node, MapNode) or node.branch not in nodes:
            continue
        branch = nodes[node.branch]
        if isinstance(branch, ApprovalNode | InputNode | EndNode | MapNode):
            run.error(node_id, f"Map branch '{node.branch}' is a {branch.type} node; a branch cannot be an "
                      "approval, input, end or map node", "branch", "=")
        if branch.next is not None:
            run.error(node.branch, f"Map branch '{node.branch}' of map '{node_id}' must not have 'next'", "next",
                      fix="remove next: the map collects the branch's result")
        updates = set(getattr(branch, "state_updates", None) or {})
        if updates and updates != {node.output_key}:
            run.error(node.branch, f"Map branch '{node.branch}' state_updates must write exactly "
                      f"'{node.output_key}' (the map's output_key), got: {', '.join(sorted(updates))}",
                      "state_updates")


# -- fan-out -------------------------------------------------------------------------------------------------------


def _writes(node: Any) -> set[str]:
    keys = set(getattr(node, "state_updates", None) or {})
    schema = getattr(node, "output_schema", None)
    if isinstance(schema, dict) and isinstance(schema.get("properties"), dict):
        keys |= set(schema["properties"])
    return keys


SCOPED = {"llm": "output", "agent": "output", "rag": "output", "approval": "choice", "input": "input"}


def _reads(node: Any) -> set[str]:
    out: set[str] = set()
    for name in ("prompt", "instructions", "question", "query", "over", "output", "default"):
        value = getattr(node, name, None)
        if isinstance(value, str):
            out |= reads(value)
    scoped = SCOPED.get(node.type)
    for template in (getattr(node, "state_updates", None) or {}).values():
        out |= reads(template) - {scoped}
    return out


def _fan_outs(run: _Run) -> None:
    nodes, reducers = run.spec.nodes, run.spec.reducers
    for node_id, node in nodes.items():
        siblings = [t for t in dict.fromkeys(node.targets) if t in nodes]
        if len(siblings) < 2:
            continue
        for target in siblings:
            branch = nodes[target]
            if isinstance(branch, ApprovalNode | InputNode):
                run.error(node_id, f"Parallel branch '{target}' is an {branch.type} node; approval and input "
                          "nodes cannot be targets of a next list", "next")
            if isinstance(branch, ScriptNode) and not branch.state_updates:
                run.error(node_id, f"Parallel branch '{target}' is a script without state_updates", "next",
                          fix=f"declare the keys {target} writes in its state_updates")
        _sibling_conflicts(run, node_id, siblings, reducers)


def _sibling_conflicts(run: _Run, node_id: str, siblings: list[str], reducers: dict[str, Any]) -> None:
    nodes = run.spec.nodes
    writes = {s: _writes(nodes[s]) for s in siblings}
    for i, a in enumerate(siblings):
        for b in siblings[i + 1:]:
            for key in sorted((writes[a] & writes[b]) - set(reducers)):
                run.error(node_id, f"Parallel branches '{a}' and '{b}' both write '{key}' with no reducer declared",
                          "next", fix=f"add reducers.{key} (e.g. append), or write different keys")
    for reader in siblings:
        for writer in siblings:
            if reader == writer:
                continue
            for key in sorted(_reads(nodes[reader]) & writes[writer]):
                run.error(node_id, f"Parallel branch '{reader}' reads '{key}', which its sibling '{writer}' "
                          "writes", "next", fix="siblings see only the state from before the fan-out; read it "
                                                "after they join")


def _name(run: _Run) -> None:
    directory = run.spec.directory.name
    if run.spec.name != directory:
        run.warn(GRAPH, f"Graph name '{run.spec.name}' does not match its agent directory '{directory}'", "name",
                 fix="the directory name is the agent's identity; rename one to match")


validate_graph = validate
"""`validate`, under the name the package exports (`ringlet.graph.validate` is this module)."""
