"""Agent directories: `config.yaml` (or `graph.yaml`, never both), parsed into a validated model, and
`load_agent`, which gives the agent of a directory of any kind.

The agent layer builds `config.yaml` (loop) agents itself. Other kinds are built by the layer that knows
them, handed to `load_agent` as its `kinds`: `ringlet.graph.load_agent` is this one with graph agents
among them (what the CLI and the server call), so this layer never imports the graph layer.

Field names follow Loki's where they overlap (`name`, `description`, `model`, `temperature`, `top_p`,
`instructions`, `variables`, `conversation_starters`, `mcp_servers`, `can_spawn_agents`,
`max_concurrent_agents`, `max_agent_depth`); ringlet adds `tools`, `max_iterations`, `limits`,
`model_options` and `pricing`. Every error names the file, the line and the fix; unknown keys get a
did-you-mean.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol, cast

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

from ringlet.agent.subagents import SubAgentSettings
from ringlet.errors import ConfigError
from ringlet.gates.approval import ApprovalConfig, ApprovalRules
from ringlet.hooks.plugin import Plugin, PrePromptContext
from ringlet.loop.fields import new_dict, new_list
from ringlet.loop.settings import LoopSettings
from ringlet.memory.compaction import CompactionConfig
from ringlet.memory.settings import MemoryConfig
from ringlet.tools.base import StaticToolset, Tool, Toolset
from ringlet.tools.builtin import BUILTIN_NAMES, DEFAULT_BUILTINS, SPAWN_NAMES, builtin_tool
from ringlet.tools.catalog import CatalogConfig
from ringlet.tools.function import function_tool
from ringlet.tools.web import WebFetchSettings

log = logging.getLogger("ringlet.agent")

BUILTIN_DIR = Path(__file__).parent / "builtin"
_VAR = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


class Variable(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    description: str = ""
    default: str | None = None


class PriceSpec(BaseModel):
    """USD per million tokens."""

    model_config = ConfigDict(extra="forbid")
    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cache_read: float | None = Field(default=None, ge=0)
    cache_write: float | None = Field(default=None, ge=0)


class ToolSettings(BaseModel):
    """`tools.<name>` in config.yaml: the tool's approval rules and overrides."""

    model_config = ConfigDict(extra="forbid")
    approval: ApprovalConfig | None = None
    effect: Literal["read", "write", "destructive"] | None = None
    idempotent: bool | None = None
    timeout_s: float | None = Field(default=None, ge=0)


def _known_builtin(name: str) -> str:
    if name not in BUILTIN_NAMES:
        hint = difflib.get_close_matches(name, BUILTIN_NAMES, n=1)
        raise ValueError(f"unknown built-in tool {name!r}" + (f"; did you mean {hint[0]!r}?" if hint else "")
                         + f" (built-in tools: {', '.join(BUILTIN_NAMES)})")
    return name


class WebFetchConfig(BaseModel):
    """`web_fetch:` — reach private addresses anyway (`allow_private`), or these hosts only."""

    model_config = ConfigDict(extra="forbid")
    allow_private: bool = False
    allow_hosts: list[str] = Field(default_factory=list)


class SubAgentsConfig(BaseModel):
    """`sub_agents:` — which agents `spawn_agent` may start, under which tool names, for how long."""

    model_config = ConfigDict(extra="forbid")
    allowed: list[str] | None = None
    """Agent names a child may be; default: this agent only."""
    tool_names: list[Literal["spawn_agent", "dispatch_sub_agent"]] = Field(default=["spawn_agent"], min_length=1)
    timeout_s: float = Field(default=120, gt=0)


class AgentConfig(BaseModel):
    """The `config.yaml` of a loop agent."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    description: str = ""
    model: str | list[str] | None = None
    """`provider:model`, or a list of them: fallbacks tried in order (`FallbackModel`), the first one the
    agent's own model. `model_options` apply to each."""
    model_options: dict[str, Any] = Field(default_factory=dict)
    allowed_models: list[str] = Field(default_factory=list)
    """Models a request may switch this agent to (`overrides.model` on the server), besides its own:
    `provider:model` names or patterns (`openai:gpt-4o*`). Default: none, only the agent's own model."""
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    instructions: str | None = None
    variables: list[Variable] = Field(default_factory=new_list)
    conversation_starters: list[str] = Field(default_factory=list)
    realm: str | None = None
    """The realm new conversations with this agent belong to (server); default `"default"`."""
    tools: dict[str, ToolSettings | None] = Field(default_factory=dict)
    """Tool references (built-in names, `module:function`, functions of tools.py), written as a list or as
    a mapping to each tool's settings (`approval`, `effect`, `idempotent`, `timeout_s`)."""
    approval_defaults: dict[Literal["read", "write", "destructive"], Literal["allow", "approve", "deny"]] = \
        Field(default_factory=new_dict)
    approval_timeout_s: float = Field(default=300, gt=0)
    v1_approvals: Literal["ask", "deny"] = "ask"
    """What a run started through the OpenAI-compatible `/v1` does when a call needs a human (an approval, or
    `ask_question`): `ask` ends the response at once with an assistant message saying what is asked and where
    to decide it, and in a conversation (`X-Ringlet-Conversation-Id`) the next user message answers it;
    `deny` denies such calls at once (a question gets `no_human_available`), as the server's
    `approval_mode: deny` does for every agent."""
    memory: bool | MemoryConfig | None = None
    """Memory tools and context notes (`memory-and-context.md`): a `memory:` section, or `true` for the
    defaults; off when absent."""
    compaction: CompactionConfig = Field(default_factory=CompactionConfig)
    catalog: bool | CatalogConfig = Field(default_factory=CatalogConfig)
    """Connector tools behind four meta-tools when there are many (`memory-and-context.md` §6): a mapping
    (automatic, past `threshold`), `true` (always) or `false` (never)."""
    max_iterations: int = Field(default=10, ge=1)
    limits: dict[str, Any] = Field(default_factory=dict)
    pricing: dict[str, PriceSpec] = Field(default_factory=dict)
    mcp_servers: dict[str, Any] | str | list[str] | None = None
    """The servers themselves (`{"mcpServers": …}` or the bare mapping), an mcp.json path, or (Loki) names of
    servers defined in the MCP config (`mcp_config_path`: the agent's mcp.json, the agents folder's,
    `RINGLET_MCP_CONFIG`, Loki's functions/mcp.json)."""
    global_tools: list[str] = Field(default_factory=list)
    """Loki's global tools (`fs_cat.sh`: files of Loki's functions/tools, `ringlet.agent.loki`), or built-in
    tool names."""
    spawnable_agents: list[str] | None = None
    """Loki's name for `sub_agents.allowed`."""
    dynamic_instructions: bool = False
    """Loki's: the instructions are what `_instructions` in tools.sh (or tools.py) prints, when the agent loads."""
    documents: list[str] = Field(default_factory=list)
    """Loki's RAG documents (files, directories, globs, URLs, relative to the agent directory): the best
    passages for each user message are attached to it (`ringlet.agent.loki.AgentDocuments`)."""
    skills_enabled: bool | None = None
    """Loki's skills switch: false turns `enabled_skills` off."""
    enabled_skills: list[str] = Field(default_factory=list)
    """Loki skills (`skills/<name>/SKILL.md`, ringlet's or Loki's skills folder): their instructions join the
    agent's, the tools they grant (`enabled_tools`) its tools."""
    inject_skill_instructions: bool = True
    skill_instructions: str | None = None
    """Replaces the default heading of the skills' instructions."""
    version: str | int | float | None = None
    """The agent's own version (Loki's `version`): shown, not interpreted."""
    max_tool_result_chars: int | None = Field(default=None, ge=1)
    """Loki's name for `limits.tool_result_max_chars`."""
    can_spawn_agents: bool = False
    builtin_tools: list[Annotated[str, AfterValidator(_known_builtin)]] | None = None
    """The built-in tools (default: summary, ask_question, the schedule tools, web_fetch; spawn_agent with
    `can_spawn_agents`). A built-in named under `tools:` is added too, with its settings."""
    web_fetch: WebFetchConfig = Field(default_factory=WebFetchConfig)
    sub_agents: SubAgentsConfig = Field(default_factory=SubAgentsConfig)
    output_schema: dict[str, Any] | None = None
    """A JSON Schema (Draft 2020-12) the answer must match: the run's result is that JSON (`ringlet.output`)."""
    output_mode: Literal["tool", "native", "prompted"] = "tool"
    """How the model gives `output_schema`'s result: a final-result tool, the provider's JSON mode, or text."""
    output_retries: int = Field(default=1, ge=0)

    @field_validator("output_schema")
    @classmethod
    def _schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        from jsonschema import Draft202012Validator
        from jsonschema.exceptions import SchemaError

        if value is not None:
            try:
                Draft202012Validator.check_schema(value)
            except SchemaError as exc:
                where = "/".join(map(str, exc.absolute_path)) or "(root)"
                raise ValueError(f"not a valid JSON Schema at {where}: {exc.message}") from None
        return value

    @field_validator("model", mode="before")
    @classmethod
    def _model_list(cls, value: Any) -> Any:
        """A list of models names at least one, each a `provider:model` string."""
        if not isinstance(value, list):
            return value
        names = cast("list[Any]", value)
        if not names:
            raise ValueError("an empty list names no model; give one or more `provider:model` names, tried in "
                             "order (e.g. [openai:gpt-4o, anthropic:claude-sonnet-4-6])")
        for item in names:
            if not (isinstance(item, str) and item):
                quote = ' (quote a name that ends in ":", e.g. "local:")' if isinstance(item, dict) else ""
                raise ValueError(f"{item!r} is not a model name; a list of models holds `provider:model` names, "
                                 f"tried in order{quote}")
        return names

    @property
    def primary_model(self) -> str | None:
        """The agent's own model name: `model`, or the first of its list."""
        return self.model[0] if isinstance(self.model, list) else self.model

    @field_validator("tools", mode="before")
    @classmethod
    def _tool_list(cls, value: Any) -> Any:
        """`tools: [a, b]` is `tools: {a: {}, b: {}}`."""
        names = cast("list[Any]", value) if isinstance(value, list) else None
        if names is not None and all(isinstance(v, str) for v in names):
            return dict.fromkeys(names)
        return cast(Any, value)

    max_concurrent_agents: int = Field(default=4, ge=1)
    max_agent_depth: int = Field(default=3, ge=1)
    max_concurrent_runs: int | None = Field(default=None, ge=1)
    """At most this many runs of this agent execute at once (server with PostgreSQL, `engine: dbos`: across
    every process, by a DBOS queue of the agent's own, `ringlet-runs:<agent>`, so the server's
    `max_concurrent_runs` does not bound them; not enforced with SQLite); more wait, `status: queued`.
    Default: no limit."""


@dataclass(frozen=True, slots=True)
class AgentSpec:
    """An agent found on disk: its name, kind, directory and (for loop agents) its config."""

    name: str
    kind: Literal["loop", "graph"]
    directory: Path
    config: AgentConfig | None
    builtin: bool = False

    @property
    def description(self) -> str:
        """The config's description, or a graph's (`description:` of graph.yaml; "" when it cannot be read:
        listing agents never fails on one, `ringlet graph validate` says what is wrong)."""
        if self.config is not None:
            return self.config.description
        try:
            data = yaml.safe_load((self.directory / "graph.yaml").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            return ""
        return str(cast("dict[str, Any]", data).get("description") or "") if isinstance(data, dict) else ""


def agents_dir() -> Path:
    return Path(os.environ.get("RINGLET_AGENTS_DIR", "~/.config/ringlet/agents")).expanduser()


def _kind(directory: Path) -> Literal["loop", "graph"]:
    has_config, has_graph = (directory / "config.yaml").is_file(), (directory / "graph.yaml").is_file()
    if has_config and has_graph:
        raise ConfigError(f"{directory}: has both config.yaml and graph.yaml; an agent is one or the other, "
                          "so remove one of them")
    if not (has_config or has_graph):
        raise ConfigError(f"Agent '{directory.name}' has neither a config.yaml nor a graph.yaml at '{directory}'")
    return "loop" if has_config else "graph"


def load_spec(directory: Path, *, builtin: bool = False) -> AgentSpec:
    kind = _kind(directory)
    config = load_config(directory / "config.yaml") if kind == "loop" else None
    name = (config.name if config and config.name else None) or directory.name
    return AgentSpec(name, kind, directory, config, builtin)


def discover(root: Path | None = None) -> dict[str, AgentSpec]:
    """Every agent by name: the built-in ones, then those of `root` (default `RINGLET_AGENTS_DIR`), which
    win on a clash. A broken agent directory is reported (logged) and left out of the list."""
    found: dict[str, AgentSpec] = {}
    for folder, builtin in ((BUILTIN_DIR, True), (root or agents_dir(), False)):
        if not folder.is_dir():
            continue
        for directory in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
            try:
                spec = load_spec(directory, builtin=builtin)
            except ConfigError as exc:
                log.warning("skipping agent: %s", exc)
                continue
            found[spec.name] = spec
    return found


def find(ref: str) -> AgentSpec:
    """An agent by name, or by the path of its directory or its config.yaml."""
    path = Path(ref).expanduser()
    if path.is_file() and path.name in ("config.yaml", "graph.yaml"):
        return load_spec(path.parent)
    if path.is_dir():
        return load_spec(path)
    agents = discover()
    if ref in agents:
        return agents[ref]
    from ringlet.models.loki import loki_dir

    lokis = loki_dir() / "agents" / ref  # a sub-agent a Loki agent names, where Loki keeps its agents
    if (lokis / "config.yaml").is_file() or (lokis / "graph.yaml").is_file():
        return load_spec(lokis)
    hint = difflib.get_close_matches(ref, agents, n=1)
    suggestion = f"did you mean {hint[0]!r}? " if hint else ""
    raise ConfigError(f"no agent named {ref!r}; {suggestion}known agents: {', '.join(sorted(agents)) or '(none)'} "
                      f"(agents live in {agents_dir()} or are given as a directory path)")


# -- parsing with line numbers ---------------------------------------------------------------------------


def _node_at(node: yaml.Node, loc: tuple[Any, ...]) -> tuple[yaml.Node, yaml.Node | None]:
    """The YAML node for a pydantic error location, and the key node of its last step."""
    key_node = None
    for step in loc:
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if k.value == str(step)), None)
            if match is None:
                break
            key_node, node = match
        elif isinstance(node, yaml.SequenceNode) and isinstance(step, int) and step < len(node.value):
            node, key_node = node.value[step], None
        else:
            break
    return node, key_node


def _compose(text: str) -> yaml.Node | None:
    """The YAML node tree of `text` (`yaml.compose` with the safe loader), for the lines of errors."""
    loader = yaml.SafeLoader(text)
    try:
        return loader.get_single_node()
    finally:
        cast(Any, loader).dispose()  # (its stub leaves the return type out)


def load_config(path: Path) -> AgentConfig:
    """Parse and validate one config.yaml; a ConfigError lists every problem with file:line."""
    try:
        text = path.read_text(encoding="utf-8")
        root = _compose(text)
        data: Any = yaml.safe_load(text)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise ConfigError(f"{where}: invalid YAML: {getattr(exc, 'problem', exc)}") from None
    if data is None:
        return AgentConfig()
    if not isinstance(data, dict) or root is None:
        raise ConfigError(f"{path}:1: the file must be a mapping of settings (key: value)")
    from ringlet.agent.loki import IGNORED_KEYS, warn_ignored

    given = cast("dict[str, Any]", data)
    warn_ignored([k for k in given if k in IGNORED_KEYS], path)
    given = {k: v for k, v in given.items() if k not in IGNORED_KEYS}
    try:
        return AgentConfig.model_validate(given)
    except ValidationError as exc:
        problems = [_describe(path, root, e) for e in exc.errors()]
        raise ConfigError("invalid agent config:\n  " + "\n  ".join(problems)) from None


def _describe(path: Path, root: yaml.Node, error: Any) -> str:
    loc = tuple(p for p in error["loc"] if not (isinstance(p, str) and "[" in p))  # without union tags
    node, key_node = _node_at(root, loc)
    mark = (key_node or node).start_mark
    where = f"{path}:{mark.line + 1}:{mark.column + 1}"
    field = ".".join(map(str, loc))
    if error["type"] == "extra_forbidden":
        known = AgentConfig.model_fields if len(loc) == 1 else {}
        hint = difflib.get_close_matches(str(loc[-1]), known, n=1)
        fix = f"; did you mean {hint[0]!r}?" if hint else f"; known keys: {', '.join(known)}" if known else ""
        return f"{where}: unknown key {field!r}{fix}"
    return f"{where}: {field}: {error['msg'].removeprefix('Value error, ')}"


# -- from config to Agent arguments -----------------------------------------------------------------------


def render_instructions(config: AgentConfig, values: dict[str, str] | None = None,
                        tools: Sequence[Tool] = ()) -> str | None:
    """`{{variable}}` in the instructions, from `values` or the variables' defaults; Loki's special
    variables (`{{__os__}}`, `{{__now__}}`, `{{__tools__}}` listing `tools`, …) get their values. The
    instructions of the agent's skills follow (their special variables filled, other text as written)."""
    skills = _skills(config) if config.inject_skill_instructions else []
    if config.instructions is None and not skills:
        return None
    known: dict[str, str | None] = {v.name: v.default for v in config.variables} | (values or {})
    text = config.instructions or ""
    special: dict[str, str] = {}
    if "{{__" in text or skills:
        from ringlet.agent.loki import special_variables

        special = special_variables(tools)
        known = {**special, **known}

    def sub(match: re.Match[str]) -> str:
        name = match.group(1)
        if known.get(name) is None:
            raise ConfigError(f"instructions use {{{{{name}}}}} but no value was given; add a default to "
                              f"variables or pass it at run time")
        return str(known[name])

    text = _VAR.sub(sub, text)
    if skills:
        from ringlet.agent.loki import skills_prompt

        block = _VAR.sub(lambda m: special.get(m.group(1), m.group(0)),
                         skills_prompt(skills, config.skill_instructions))
        text = f"{text}\n\n{block}" if text else block
    return text


def file_tools(module: Any) -> dict[str, Tool]:
    """The tools a tools.py defines: its `@tool`s and the public functions defined in it (not imported)."""
    out: dict[str, Tool] = {}
    members = cast("dict[str, Any]", vars(module))
    for name, value in members.items():
        if name.startswith("_"):
            continue
        if isinstance(value, Tool):
            out[name] = value
        elif callable(value) and getattr(value, "__module__", None) == module.__name__ and not isinstance(value, type):
            out[name] = function_tool(value)
    return out


def resolve_tools(config: AgentConfig, directory: Path, *, name: str = "",
                  variables: Mapping[str, str] | None = None) -> dict[str, Tool]:
    """The agent's own tools: those named under `tools:` (`module:function`, functions of the directory's
    tools.py; built-in names there are settings of built-in tools, `builtins`), or every function of tools.py
    when there is no `tools:` (as Loki offers them); the `@cmd` functions of tools.sh; the `global_tools`
    (`ringlet.agent.loki`). `tools.<name>` settings apply to each."""
    from ringlet.agent import loki

    local = _tools_module(directory) if (directory / "tools.py").is_file() else None
    out: dict[str, Tool] = {}
    if local is not None and "tools" not in config.model_fields_set:
        out |= {ref: _configured(tool, _settings(config, ref)) for ref, tool in file_tools(local).items()}
    own = loki.own_tools(directory, name or directory.name, variables)
    granted = [e for skill in _skills(config) for e in skill.tools if Path(e).stem not in own]
    for entry in [*config.global_tools, *granted]:
        if Path(entry).stem not in BUILTIN_NAMES and Path(entry).stem not in own:
            own[Path(entry).stem] = loki.global_tool(entry, loki.tool_env(directory, name or directory.name,
                                                                          variables))
    out |= {ref: _configured(tool, _settings(config, ref)) for ref, tool in own.items()}
    for ref in config.tools:
        if ref in out:
            continue
        if ref in BUILTIN_NAMES:
            continue
        module_name, sep, attr = ref.partition(":")
        if sep:
            try:
                target = getattr(importlib.import_module(module_name), attr)
            except (ImportError, AttributeError) as exc:
                raise ConfigError(f"{directory / 'config.yaml'}: tool {ref!r} cannot be imported: {exc}") from None
        elif local is not None and hasattr(local, ref):
            target = getattr(local, ref)
        else:
            options = sorted(BUILTIN_NAMES) + sorted(n for n in dir(local or object()) if not n.startswith("_"))
            hint = difflib.get_close_matches(ref, options, n=1)
            raise ConfigError(f"{directory / 'config.yaml'}: unknown tool {ref!r}"
                              f"{f'; did you mean {hint[0]!r}?' if hint else ''} (use a built-in name, "
                              "module:function, or a function in the agent directory's tools.py)")
        out[ref] = _configured(target if isinstance(target, Tool) else function_tool(target), _settings(config, ref))
    return out


def _skills(config: AgentConfig) -> list[Any]:
    """The agent's Loki skills (`ringlet.agent.loki.Skill`), loaded (a missing one is a ConfigError)."""
    if config.skills_enabled is False or not config.enabled_skills:
        return []
    from ringlet.agent.loki import load_skill

    return [load_skill(name) for name in config.enabled_skills]


def builtin_names(config: AgentConfig) -> list[str]:
    """The built-in tools an agent gets: its `builtin_tools:` (or the default set), the sub-agent tools
    with `can_spawn_agents`, and the built-ins it names under `tools:`."""
    names = list(DEFAULT_BUILTINS if config.builtin_tools is None else config.builtin_tools)
    if config.can_spawn_agents:
        names += config.sub_agents.tool_names
    names += [ref for ref in config.tools if ref in BUILTIN_NAMES]
    names += [Path(entry).stem for entry in config.global_tools if Path(entry).stem in BUILTIN_NAMES]
    return list(dict.fromkeys(names))


def builtins(config: AgentConfig) -> list[Tool]:
    """The built-in tools of `builtin_names` that are tools of their own (not `summary`, which the loop
    handles, nor the sub-agent tools, which `build_agent` adds), each with its `tools.<name>` settings."""
    web = WebFetchSettings(config.web_fetch.allow_private, frozenset(config.web_fetch.allow_hosts))
    return [_configured(builtin_tool(n, web_fetch=web), _settings(config, n)) for n in builtin_names(config)
            if n != "summary" and n not in SPAWN_NAMES]


def _settings(config: AgentConfig, ref: str) -> ToolSettings | None:
    return config.tools.get(ref)


def _configured(tool: Tool, settings: ToolSettings | None) -> Tool:
    """The tool with its `effect`, `idempotent` and `timeout_s` overrides."""
    if settings is None:
        return tool
    changes = {k: v for k in ("effect", "idempotent", "timeout_s") if (v := getattr(settings, k)) is not None}
    return dataclasses.replace(tool, **changes) if changes else tool


def _catalogued(config: AgentConfig, pinned: list[Tool], own: list[Tool], servers: list[Toolset]) -> list[Any]:
    """Built-in tools stay pinned; the agent's own tools (connector `tools`) and each MCP server (a connector
    by its name) go behind the catalog, which lists them directly while they are few."""
    catalog = config.catalog if isinstance(config.catalog, CatalogConfig) else \
        CatalogConfig(mode="on" if config.catalog else "off")
    if catalog.mode == "off":
        return [*pinned, *own, *servers]
    from ringlet.tools.catalog import Catalog

    connectors: dict[str, Toolset] = {"tools": StaticToolset(own)} if own else {}
    connectors |= {getattr(s, "name", f"server{i}"): s for i, s in enumerate(servers)}
    embedder = None
    memory = config.memory if isinstance(config.memory, MemoryConfig) else None
    if memory is not None and memory.embeddings is not None:
        from ringlet.memory.embeddings import resolve_embedder

        embedder = resolve_embedder(memory.embeddings)
    return [*pinned, Catalog(connectors, config=catalog, embedder=embedder)] if connectors else pinned


def approval_rules(config: AgentConfig, own: dict[str, Tool], path: Path) -> ApprovalRules:
    """The approval gate of a config agent: `tools.<name>.approval`, `approval_defaults`,
    `approval_timeout_s` (an invalid pattern is a load error naming the tool, field, index and pattern)."""
    per_tool: dict[str, ApprovalConfig] = {}
    for ref, settings in config.tools.items():
        if settings is not None and settings.approval is not None:
            per_tool[own[ref].name if ref in own else ref] = settings.approval
    return ApprovalRules(per_tool, defaults=config.approval_defaults, timeout_s=config.approval_timeout_s,
                         source=str(path))


def _tools_module(directory: Path) -> Any:
    from ringlet.agent.loki import import_file

    return import_file(directory / "tools.py")


def loop_settings(config: AgentConfig, path: Path) -> dict[str, Any]:
    """The loop settings of a config: `max_iterations`, `temperature`, `top_p` and the `limits` block."""
    settings = {"max_iterations": config.max_iterations, **config.limits}
    if config.max_tool_result_chars is not None:
        settings.setdefault("tool_result_max_chars", config.max_tool_result_chars)
    for key in ("temperature", "top_p"):
        if getattr(config, key) is not None:
            settings[key] = getattr(config, key)
    unknown = set(config.limits) - set(LoopSettings.model_fields)
    if unknown:
        key = sorted(unknown)[0]
        hint = difflib.get_close_matches(key, LoopSettings.model_fields, n=1)
        raise ConfigError(f"{path}: unknown limit {key!r}" + (f"; did you mean {hint[0]!r}?" if hint else ""))
    return settings


def build_agent(spec: AgentSpec, *, model: Any = None, variables: dict[str, str] | None = None,
                children: Callable[[str], Any] | None = None) -> Any:
    """The `Agent` of an agent directory; `model` (a Model or `provider:model`) overrides the config's.
    `children` builds the agents its `spawn_agent` may start, by name (default: loop agents found by
    `find`, this one itself; `load_agent` passes one that builds every registered kind)."""
    from ringlet.agent import Agent
    from ringlet.agent.settings import Execution, Gates, Limits, ModelSettings, grouped
    from ringlet.models.pricing import Pricing
    from ringlet.models.providers import default_model, resolve_model

    if spec.kind == "graph" or spec.config is None:
        raise ConfigError(f"{spec.directory}: {spec.name!r} is a graph agent (graph.yaml); load it with "
                          "load_agent, not build_agent")
    config, path = spec.config, spec.directory / "config.yaml"
    values = {v.name: v.default for v in config.variables if v.default is not None} | (variables or {})
    if config.dynamic_instructions:
        from ringlet.agent.loki import dynamic_instructions

        config = config.model_copy(update={"instructions": dynamic_instructions(spec.directory, spec.name,
                                                                                values)})
    chosen = model or config.model or default_model()
    options = config.model_options if isinstance(chosen, str | list) and chosen == config.model else {}
    try:
        instance = resolve_model(cast("str | list[str]", chosen), **options) if isinstance(chosen, str | list) \
            else chosen
    except TypeError as exc:  # an option the provider does not take
        raise ConfigError(f"{path}: model_options for {chosen!r}: {exc}") from None
    prices = {name: p.model_dump(exclude_none=True) for name, p in config.pricing.items()}
    own = resolve_tools(config, spec.directory, name=spec.name, variables=values)
    servers: list[Toolset] = []
    if config.mcp_servers:
        from ringlet.mcp.client import MCPToolset
        from ringlet.mcp.config import load_servers

        servers = [MCPToolset(name, c) for name, c in _servers(config, spec.directory, load_servers).items()]
    names = builtin_names(config)
    settings = loop_settings(config, path)
    if "summary" not in names:
        settings.setdefault("terminal_tool", None)
    limits, execution, sampling = grouped(settings)
    plugins: list[Plugin] = []
    if servers:  # `@server:uri` mentions in user messages get the resource's text
        plugins.append(MCPMentions(servers))
    if config.documents:
        from ringlet.agent.loki import AgentDocuments
        from ringlet.memory.documents import missing

        problems = [p for entry in config.documents if (p := missing(entry, spec.directory)) is not None]
        if problems:
            raise ConfigError(f"{path}: documents: {'; '.join(problems)}")

        plugins.append(AgentDocuments(spec.name, spec.directory, config.documents))
    if plugins:
        execution["plugins"] = [*execution.get("plugins", ()), *plugins]
    memory = [MemoryConfig() if config.memory is True else config.memory] if config.memory else []
    pinned = builtins(config)
    agent = Agent(instance, name=spec.name, instructions=render_instructions(config, variables,
                                                                           [*pinned, *own.values()]),
                  tools=[*_catalogued(config, pinned, list(own.values()), servers), *memory],
                  output_type=_output(config), model_settings=ModelSettings(**sampling),
                  limits=Limits(**limits, pricing=Pricing(prices) if prices else None, compaction=config.compaction,
                                output_retries=config.output_retries),
                  execution=Execution(**execution) if execution else None,
                  gates=Gates(approvals=approval_rules(config, own, path), realm=config.realm))
    spawn = [n for n in names if n in SPAWN_NAMES]
    if spawn:
        agent.enable_sub_agents(_children(agent, spec, children), SubAgentSettings(
            allowed=tuple(config.spawnable_agents or config.sub_agents.allowed or (spec.name,)),
            max_agent_depth=config.max_agent_depth,
            max_concurrent_agents=config.max_concurrent_agents, timeout_s=config.sub_agents.timeout_s), spawn)
    setattr(agent, "v1_approvals", config.v1_approvals)  # noqa: B010  read by the server's `/v1`
    return agent


def _servers(config: AgentConfig, directory: Path, load: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """The agent's MCP servers: given in config.yaml, or (a list) named from the MCP config."""
    if not isinstance(config.mcp_servers, list):
        return load(config.mcp_servers, base=directory)
    from ringlet.agent.loki import mcp_config_path

    path = mcp_config_path(directory)
    defined = load(str(path), base=directory) if path is not None else {}
    missing = [n for n in config.mcp_servers if n not in defined]
    if missing:
        raise ConfigError(f"{directory / 'config.yaml'}: mcp_servers: {', '.join(missing)} not defined in "
                          f"{path or 'any MCP config'} (mcpServers of mcp.json in the agent directory, the agents "
                          "folder, RINGLET_MCP_CONFIG, or Loki's functions/mcp.json)")
    return {n: defined[n] for n in config.mcp_servers}


class MCPMentions(Plugin):
    """`@server:uri` in a user message attaches that MCP resource's text to it in the prompt
    (`ringlet.mcp.mentions`); each resource is read once per run."""

    name = "mcp_mentions"

    def __init__(self, servers: Sequence[Any]) -> None:
        self.servers = {s.name: s for s in servers}

    async def pre_prompt(self, ctx: PrePromptContext) -> None:
        from ringlet.mcp.mentions import expand

        ctx.messages[:] = await expand(ctx.messages, self.servers, ctx.plugin_data.setdefault(self.name, {}))


def _output(config: AgentConfig) -> Any:
    """`output_schema:` in its `output_mode`, or None (the answer is text)."""
    from ringlet.output import JsonSchema, NativeOutput, PromptedOutput, ToolOutput

    if config.output_schema is None:
        return None
    mode = {"tool": ToolOutput, "native": NativeOutput, "prompted": PromptedOutput}[config.output_mode]
    return mode(JsonSchema(config.output_schema))  # type: ignore[arg-type]


def _children(agent: Any, spec: AgentSpec, children: Callable[[str], Any] | None) -> Callable[[str], Any]:
    """Builds each child agent once: this agent itself by its own name, others by `children` or `find`."""
    built: dict[str, Any] = {spec.name: agent}

    def resolve(name: str) -> Any:
        if name not in built:
            built[name] = children(name) if children is not None else build_agent(find(name))
        return built[name]

    return resolve


# -- any kind of agent directory ---------------------------------------------------------------------------


class AgentLoader(Protocol):
    """Builds the agent of an `AgentSpec` of one kind: `model` overrides the model its file names,
    `variables` are its variables' values, `options` are the kind's own (a graph's `checkpoints`, …)."""

    def __call__(self, spec: AgentSpec, /, *, model: Any = None, variables: Mapping[str, str] | None = None,
                 **options: Any) -> Any: ...


def load_agent(spec: AgentSpec | Path | str, *, model: Any = None, variables: Mapping[str, str] | None = None,
               kinds: Mapping[str, AgentLoader] | None = None, **options: Any) -> Any:
    """The agent of a directory: an `Agent` for config.yaml (`build_agent`; `options` do not apply, and its
    sub-agents are loaded here with the same `kinds`, so they may be of any of them), else what the loader of
    its kind in `kinds` builds. `spec` is an `AgentSpec`, a directory, or its config.yaml/graph.yaml."""
    if not isinstance(spec, AgentSpec):
        path = Path(spec)
        spec = load_spec(path.parent if path.is_file() else path)
    if spec.kind == "loop":
        return build_agent(spec, model=model, variables=dict(variables or {}),
                           children=lambda name: load_agent(find(name), kinds=kinds))
    loader = (kinds or {}).get(spec.kind)
    if loader is None:
        raise ConfigError(f"{spec.directory}: {spec.name!r} is a {spec.kind} agent and nothing here loads "
                          f"{spec.kind} agents; load it with ringlet.graph.load_agent")
    return loader(spec, model=model, variables=variables, **options)
