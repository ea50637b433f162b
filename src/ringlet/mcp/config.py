"""An MCP server's settings (`mcpServers` entries), read from config or an mcp.json file in the common shapes,
and checked: a ConfigError says what is wrong and where (`mcp.json:4:5: mcpServers.docs.tools: …`)."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ringlet.errors import ConfigError

__all__ = ["MCPServerConfig", "OAuthConfig", "SamplingConfig", "load_servers"]

_TRANSPORTS = Literal["stdio", "sse", "http", "streamable-http", "streamable_http", "streamableHttp"]


class SamplingConfig(BaseModel):
    """`sampling`: how ringlet answers the server's `sampling/createMessage` (`ringlet.mcp.sampling`)."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = True
    """Offer sampling to the server (the capability is advertised); False: every request is declined."""
    model: str | None = None
    """The model that answers (`provider:model`); None: the agent's own."""
    max_per_run: int = Field(default=10, ge=0)
    """Requests answered per run (over every call of the run); later ones are declined."""
    max_tokens: int = Field(default=4096, gt=0)
    """A ceiling on the tokens a request may ask for (`maxTokens` above it is lowered to it)."""
    approval: Literal["auto", "confirm"] = "auto"
    """`confirm`: a human approves each request, shown its prompt (a policy's `require_approval` asks too)."""


class OAuthConfig(BaseModel):
    """`oauth`: the server sits behind OAuth 2.1 (`ringlet.mcp.oauth`). Claude Code's and VS Code's names
    (`clientId`, `clientSecret`, `callbackPort`) are read too."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    client_id: str | None = Field(default=None, alias="clientId")
    """A client registered beforehand; None: ringlet registers itself (dynamic client registration)."""
    client_secret: str | None = Field(default=None, alias="clientSecret")
    scopes: list[str] | None = None
    """The scopes to ask for; None: what the server's metadata names."""
    callback_port: int | None = Field(default=None, alias="callbackPort", gt=0, lt=65536)
    """The loopback port of the redirect URI (the CLI and the library listen there); None: a free one.
    The server uses its own callback route instead."""
    client_name: str = Field(default="ringlet", alias="clientName")

    @field_validator("scopes", mode="before")
    @classmethod
    def _scope_text(cls, value: Any) -> Any:
        return value.split() if isinstance(value, str) else value


class MCPServerConfig(BaseModel):
    """One entry of `mcpServers`, plus ringlet's own options. The common shapes are read as they are: Claude
    Desktop's and Cursor's (`command`, `args`, `env`, `url`, `headers`), Claude Code's, VS Code's and Loki's
    (`type: stdio | http | sse`, `cwd`; Loki's `env` values may be booleans or numbers). `oauth` puts an HTTP
    server behind OAuth 2.1, each user connecting on their own."""

    model_config = ConfigDict(extra="forbid")
    type: _TRANSPORTS | None = None
    """The transport, as the common shape names it (`transport` is ringlet's older name for it)."""
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    oauth: OAuthConfig | None = None
    transport: _TRANSPORTS | None = None
    tools: list[str] | None = None
    """Only these tools (an allow-list)."""
    exclude_tools: list[str] = Field(default_factory=list)
    """Never these tools (a deny-list)."""
    prefix: str | None = None
    """Put before each tool name (e.g. `time_`), to keep names apart."""
    timeout_s: float = Field(default=60.0, gt=0)
    """Per call."""
    required: bool = False
    """Fail the run when the server cannot start (otherwise the agent runs without its tools)."""
    description: str = ""
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    """How the server's sampling requests are answered (the agent's model, through the gates)."""

    @field_validator("env", mode="before")
    @classmethod
    def _env_text(cls, value: Any) -> Any:
        """Loki writes `"DEBUG": true` or `"PORT": 8080`; a process environment holds text."""
        if isinstance(value, Mapping):
            return {k: (str(v).lower() if isinstance(v, bool) else str(v) if isinstance(v, int | float) else v)
                    for k, v in value.items()}
        return value

    @model_validator(mode="after")
    def _one_endpoint(self) -> MCPServerConfig:
        given = {_wire(t) for t in (self.type, self.transport) if t is not None}
        if len(given) > 1:
            raise ValueError(f"`type` ({self.type}) and `transport` ({self.transport}) disagree; give one")
        wire = next(iter(given), None)
        if wire == "stdio" and self.command is None:
            raise ValueError('type "stdio" needs a `command` (or give a `url` and type "http" or "sse")')
        if wire in ("http", "sse") and self.url is None:
            raise ValueError(f'type "{wire}" needs a `url` (or give a `command` and type "stdio")')
        if (self.command is None) == (self.url is None):
            raise ValueError("give either `command` (a stdio server) or `url` (an HTTP server), not both or none")
        if wire in ("http", "sse") and self.command is not None:
            raise ValueError(f'type "{wire}" is for a `url`; a `command` is a stdio server')
        if wire == "stdio" and self.url is not None:
            raise ValueError('type "stdio" is for a `command`; a `url` needs type "http" or "sse"')
        if self.oauth is not None and self.url is None:
            raise ValueError("`oauth` is for an HTTP server (a `url`); a stdio server gets its credentials in `env`")
        return self

    @property
    def kind(self) -> str:
        if self.command is not None:
            return "stdio"
        return "sse" if "sse" in (self.type, self.transport) else "http"


def _wire(transport: str) -> str:
    return "stdio" if transport == "stdio" else "sse" if transport == "sse" else "http"


def load_servers(value: Mapping[str, Any] | str | None, *, base: Path) -> dict[str, MCPServerConfig]:
    """`mcp_servers` from config: `{"mcpServers": {…}}`, the bare mapping, or the path of an mcp.json file.
    A ConfigError says what is wrong and where: `mcp.json:4:5: mcpServers.docs.tools: …` for a file."""
    if value is None:
        return {}
    source, text = "mcp_servers", ""
    if isinstance(value, str):
        path = (base / value).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
            value = json.loads(text)
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{exc.lineno}:{exc.colno}: not JSON: {exc.msg}") from None
        except ValueError as exc:
            raise ConfigError(f"{path}: not JSON: {exc}") from None
        source = str(path)
    if not isinstance(value, Mapping):
        raise ConfigError(f"{source}: expected a mapping of server names to settings")
    servers = value.get("mcpServers", value)
    if not isinstance(servers, Mapping):
        raise ConfigError(f"{_at(source, text, ('mcpServers',))}: mcpServers must map server names to settings")
    out = {}
    for name, settings in servers.items():
        try:
            out[name] = MCPServerConfig.model_validate(settings)
        except ValidationError as exc:
            first = exc.errors()[0]["loc"][:1]
            where = _at(source, text, ("mcpServers", name, *first) if "mcpServers" in value else (name, *first))
            raise ConfigError(f"{where}: {'; '.join(_problem(name, e) for e in exc.errors())}") from None
    return out


def _problem(name: str, error: Any) -> str:
    """One pydantic error of a server's settings, said plainly: `mcpServers.x.colour: unknown key …`."""
    at = ".".join(["mcpServers", name, *map(str, error["loc"])])
    if error["type"] == "extra_forbidden":
        close = difflib.get_close_matches(str(error["loc"][-1]), MCPServerConfig.model_fields, n=1, cutoff=0.6)
        hint = f"did you mean '{close[0]}'? " if close else ""
        return f"{at}: unknown key; {hint}(accepted: {', '.join(MCPServerConfig.model_fields)})"
    return f"{at}: {error['msg'].removeprefix('Value error, ')}"


def _at(source: str, text: str, keys: Sequence[Any]) -> str:
    """`file:line:column` of the innermost of `keys` (nested JSON object keys) in a file's text, as near as
    a scan finds it; `source` alone when there is no text."""
    if not text:
        return source
    position, found = 0, None
    for key in keys:
        match = re.compile(rf'"{re.escape(str(key))}"\s*:').search(text, position)
        if match is None:
            break
        position, found = match.end(), match.start()
    if found is None:
        return source
    line = text.count("\n", 0, found) + 1
    return f"{source}:{line}:{found - text.rfind(chr(10), 0, found)}"
