"""Agent directories: `config.yaml` (or `graph.yaml`, never both), parsed into a validated model, and
`load_agent`, which gives the agent of a directory of any kind. One module per step:

- `schema`: `AgentConfig`, the model of a loop agent's config.yaml;
- `parse`: `load_config`, which reads one config.yaml and names the file and line of every problem;
- `discovery`: `AgentSpec`, `discover` and `find` (agents on disk, by name or path);
- `tools`: the agent's own and built-in tools, with their settings and approval rules;
- `build`: `build_agent`, from a config to its `Agent`;
- `kinds`: `load_agent` for a directory of any kind, with the loaders of the kinds other layers build.

Every error names the file, the line and the fix; unknown keys get a did-you-mean.
"""

from ringlet.agent.config.build import MCPMentions, build_agent, loop_settings, render_instructions
from ringlet.agent.config.discovery import BUILTIN_DIR, AgentSpec, agents_dir, discover, find, load_spec
from ringlet.agent.config.kinds import AgentLoader, load_agent
from ringlet.agent.config.parse import load_config
from ringlet.agent.config.schema import AgentConfig, PriceSpec, SubAgentsConfig, ToolSettings, Variable, WebFetchConfig
from ringlet.agent.config.tools import approval_rules, builtin_names, builtins, file_tools, resolve_tools

__all__ = ["BUILTIN_DIR", "AgentConfig", "AgentLoader", "AgentSpec", "MCPMentions", "PriceSpec",
           "SubAgentsConfig", "ToolSettings", "Variable", "WebFetchConfig", "agents_dir", "approval_rules",
           "build_agent", "builtin_names", "builtins", "discover", "file_tools", "find", "load_agent",
           "load_config", "load_spec", "loop_settings", "render_instructions", "resolve_tools"]
