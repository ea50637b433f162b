"""The `config.yaml` of a loop agent as a model: `AgentConfig` and the settings it nests.

Field names follow Loki's where they overlap (`name`, `description`, `model`, `temperature`, `top_p`,
`instructions`, `variables`, `conversation_starters`, `mcp_servers`, `can_spawn_agents`,
`max_concurrent_agents`, `max_agent_depth`); ringlet adds `tools`, `max_iterations`, `limits`,
`model_options` and `pricing`. Unknown keys are refused (`extra="forbid"`).
"""

from __future__ import annotations

import difflib
from typing import Annotated, Any, Literal, cast

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from ringlet.gates.approval import ApprovalConfig
from ringlet.guardrails.config import GuardrailsConfig
from ringlet.loop.fields import new_dict, new_list
from ringlet.memory.compaction import CompactionConfig
from ringlet.memory.settings import MemoryConfig
from ringlet.tools.builtin.selection import BUILTIN_NAMES
from ringlet.tools.catalog import CatalogConfig


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


class PromptCache(BaseModel):
    """`prompt_cache:`, written `true`/`false` or as a mapping: where the cache points go, and the cache key."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    points: list[Literal["tools", "system", "history"]] = Field(default=["tools", "system", "history"])
    key: str | None = Field(default=None, min_length=1, max_length=64)


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
    prompt_cache: PromptCache = Field(default_factory=PromptCache)
    """Prompt caching where the provider charges less for cached input (`ModelSettings`): `false` turns it
    off; `{points: [tools, system, history], key: …}` chooses Anthropic's cache points and OpenAI's
    `prompt_cache_key`."""
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
    guardrails: GuardrailsConfig = Field(default_factory=GuardrailsConfig)
    """Checks of what the run's texts say (`ringlet.guardrails`): `rails` (pii, prompt_injection, model,
    custom), and `stream` (how an answer is sent while output guardrails check it: sentence, hold)."""

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

    @field_validator("prompt_cache", mode="before")
    @classmethod
    def _cache_switch(cls, value: Any) -> Any:
        return {"enabled": value} if isinstance(value, bool) else value

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
