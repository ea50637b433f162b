"""Loki agent directories in ringlet: their tool files, Loki's global tools, skills and documents, its special
variables, and the config.yaml keys of Loki that ringlet reads or knowingly ignores.

- An agent's own tools are the functions of its `tools.sh` (argc annotations, `ringlet.tools.shell`), its
  `tools.py`, or its `tools.ts`/`tools.js` (`ringlet.tools.node`); Loki offers them without listing them
  anywhere, and so does ringlet.
- `global_tools` entries name files of Loki's `functions/tools/` (`fs_cat.sh`, `get_time.py`; a name without
  a suffix finds any of .sh/.py/.ts/.js), in Loki's directory (`ringlet.models.loki.loki_dir`, or
  `RINGLET_LOKI_DIR`), or `LOKI_FUNCTIONS_DIR`. A `.py`, `.ts` or `.js` global tool is its `run` function.
- Skills are `skills/<name>/SKILL.md` (ringlet's or Loki's folder): instructions plus granted tools.
- A plain agent's `documents` are a knowledge base whose best passages join each user message
  (`AgentDocuments`); `dynamic_instructions` come from an `_instructions` function.
- `{{__os__}}`, `{{__now__}}`, `{{__tools__}}`, … in instructions get Loki's values (`special_variables`).
"""

from __future__ import annotations

import asyncio
import datetime
import importlib.util
import locale
import logging
import os
import platform
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import yaml

from ringlet.errors import ConfigError
from ringlet.hooks.plugin import Plugin, PrePromptContext
from ringlet.messages import TextPart
from ringlet.models.loki import loki_dir
from ringlet.tools.base import Tool
from ringlet.tools.function import function_tool
from ringlet.tools.node import node_tools
from ringlet.tools.shell import bash_tools, call_function, read_env_file, variable_env

__all__ = [
    "IGNORED_KEYS",
    "Skill",
    "functions_dir",
    "global_tool",
    "global_tool_path",
    "import_file",
    "installed_skills",
    "load_skill",
    "mcp_config_path",
    "own_tools",
    "skill_dirs",
    "skills_prompt",
    "special_variables",
    "tool_env",
    "warn_ignored",
]

log = logging.getLogger("ringlet.agent")

SUFFIXES = (".sh", ".py", ".ts", ".js")
IGNORED_KEYS = {
    "auto_continue": "ringlet has no todo tools; the loop goes on while the model calls tools",
    "max_auto_continues": "ringlet has no todo tools (see auto_continue)",
    "inject_todo_instructions": "ringlet has no todo tools (see auto_continue)",
    "continuation_prompt": "ringlet has no todo tools (see auto_continue)",
    "agent_session": "ringlet keeps conversations itself (server) or per run (CLI)",
    "compression_threshold": "ringlet compacts by its own `compaction:` settings",
    "compression_keep_last": "ringlet compacts by its own `compaction:` settings",
    "compression_model": "ringlet compacts by its own `compaction:` settings",
    "inject_spawn_instructions": "spawn_agent describes itself in its tool description",
    "summarization_model": "ringlet returns a sub-agent's answer whole",
    "summarization_threshold": "ringlet returns a sub-agent's answer whole",
    "escalation_timeout": "a sub-agent's questions wait like any approval (approval_timeout_s)",
    "mcp_tools": "an agent gets every tool of its MCP servers",
    "reasoning_effort": "give it in model_options (e.g. extra_body) for the providers that take it",
    "max_concurrent_jobs": "ringlet has no background jobs",
    "brief_model": "ringlet has no brief model",
    "envoy_model": "ringlet has no envoy model",
    "hooks": "ringlet's hooks are Python plugins",
    "global_hooks": "ringlet's hooks are Python plugins",
    "enabled_macros": "ringlet has no macros",
}
"""Keys of Loki's agent config.yaml that ringlet accepts and ignores, each with why (said once, as a warning)."""


def functions_dir() -> Path:
    """Loki's `functions/` directory: `LOKI_FUNCTIONS_DIR`, else the one in Loki's directory."""
    given = os.environ.get("LOKI_FUNCTIONS_DIR")
    return Path(given).expanduser() if given else loki_dir() / "functions"


def global_tool_path(entry: str) -> Path:
    """The file of a `global_tools` entry (`fs_cat.sh`, or `fs_cat` for whichever of .sh/.py exists).
    Raises ConfigError naming where it looked."""
    folder = functions_dir() / "tools"
    suffix = Path(entry).suffix
    candidates = [folder / entry] if suffix else [folder / f"{entry}{s}" for s in SUFFIXES]
    found = next((p for p in candidates if p.is_file()), None)
    if found is None:
        raise ConfigError(f"global tool '{entry}' not found: looked for {', '.join(map(str, candidates))} "
                          "(Loki's functions/tools; set RINGLET_LOKI_DIR to Loki's config directory, or "
                          "LOKI_FUNCTIONS_DIR to its functions directory)")
    return found


def global_tool(entry: str, env: Mapping[str, str] | None = None) -> Tool:
    """The tool of a `global_tools` entry: a bash tool with argc annotations, or a Python file's `run`."""
    path = global_tool_path(entry)
    if path.suffix == ".py":
        return function_tool(_python_function(path, "run"), name=path.stem)
    environment = {**(env or {}), **_root_env(path.parent.parent)}
    if path.suffix in (".ts", ".js"):
        return node_tools(path, env=environment, name=path.stem)[0]
    return bash_tools(path, env=environment)[0]


def _python_function(path: Path, name: str) -> Any:
    function = getattr(import_file(path), name, None)
    if not callable(function):
        raise ConfigError(f"{path}: a Python global tool defines `def {name}(...)` with a docstring")
    return function


def import_file(path: Path) -> Any:
    """A Python file as a module (imported once per process; an error names the file)."""
    name = f"ringlet_agent_tools_{abs(hash(path.resolve()))}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{path}: cannot be loaded as a module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise ConfigError(f"{path}: failed to import: {type(exc).__name__}: {exc}") from exc
    return module


def _root_env(root: Path) -> dict[str, str]:
    return {"LLM_ROOT_DIR": str(root), "LLM_PROMPT_UTILS_FILE": str(root / "utils" / "prompt-utils.sh")}


def tool_env(directory: Path, name: str, variables: Mapping[str, str] | None = None) -> dict[str, str]:
    """What Loki gives an agent's tools: its `.env`, `LLM_AGENT_NAME`, `LLM_AGENT_ROOT_DIR`, its variables
    as `LLM_AGENT_VAR_<NAME>`, `AUTO_CONFIRM`."""
    env = read_env_file(directory / ".env")
    env |= {variable_env(k): v for k, v in (variables or {}).items()}
    return env | {"LLM_AGENT_NAME": name, "LLM_AGENT_ROOT_DIR": str(directory),
                  "LLM_AGENT_CACHE_DIR": str(loki_dir() / "cache" / name), "AUTO_CONFIRM": "true",
                  **_root_env(functions_dir())}


def own_tools(directory: Path, name: str, variables: Mapping[str, str] | None = None) -> dict[str, Tool]:
    """The agent's own tools by name: the `@cmd` functions of its tools.sh, else (with no tools.py either,
    which `ringlet.agent.config` reads as Python tools) the exported functions of its tools.ts or tools.js,
    as Loki takes the first of these files it finds."""
    env = tool_env(directory, name, variables)
    if (directory / "tools.sh").is_file():
        return {t.name: t for t in bash_tools(directory / "tools.sh", env=env)}
    script = next((directory / f for f in ("tools.ts", "tools.js") if (directory / f).is_file()), None)
    if script is None or (directory / "tools.py").is_file():
        return {}
    return {t.name: t for t in node_tools(script, env=env)}


def dynamic_instructions(directory: Path, name: str, variables: Mapping[str, str] | None = None) -> str:
    """Loki's `dynamic_instructions: true`: the agent's instructions are what the `_instructions` function of
    its tools.sh (or tools.py) gives, run when the agent loads."""
    if (directory / "tools.sh").is_file() and "_instructions" in (directory / "tools.sh").read_text("utf-8"):
        return call_function(directory / "tools.sh", "_instructions", tool_env(directory, name, variables))
    if (directory / "tools.py").is_file():
        function = getattr(import_file(directory / "tools.py"), "_instructions", None)
        if callable(function):
            return str(function())
    raise ConfigError(f"{directory / 'config.yaml'}: dynamic_instructions needs an `_instructions` function in "
                      "tools.sh or tools.py")


def special_variables(tools: Iterable[Tool] = ()) -> dict[str, str]:
    """Loki's special variables and their values now: `__os__`, `__os_family__`, `__arch__`, `__shell__`,
    `__locale__`, `__now__` (local time, RFC 3339 to the second), `__cwd__`, `__tools__` (a numbered list of
    the tools, `N. name: first line of its description`)."""
    now = datetime.datetime.now().astimezone().replace(microsecond=0)
    shell = os.environ.get("LOKI_SHELL") or Path(os.environ.get("SHELL") or "sh").name
    lang = locale.getlocale()[0] or os.environ.get("LANG", "en_US").split(".")[0]
    listed = [f"{i}. {t.name}: {(t.description or '').strip().splitlines()[0] if t.description else ''}"
              for i, t in enumerate(tools, 1)]
    return {"__os__": sys.platform if sys.platform != "darwin" else "macos",
            "__os_family__": "windows" if os.name == "nt" else "unix", "__arch__": platform.machine(),
            "__os_distro__": platform.platform(), "__shell__": shell, "__locale__": lang.replace("_", "-"),
            "__now__": now.isoformat(), "__cwd__": os.getcwd(), "__tools__": "\n".join(listed)}


def mcp_config_path(directory: Path) -> Path | None:
    """The MCP config (`mcp.json`, `mcpServers` shape) that names in `mcp_servers` come from: the agent
    directory's, the agents folder's, `RINGLET_MCP_CONFIG`, ~/.config/ringlet/mcp.json, then Loki's
    functions/mcp.json."""
    candidates = [directory / "mcp.json", directory.parent / "mcp.json"]
    if os.environ.get("RINGLET_MCP_CONFIG"):
        candidates.append(Path(os.environ["RINGLET_MCP_CONFIG"]).expanduser())
    candidates += [Path("~/.config/ringlet/mcp.json").expanduser(), functions_dir() / "mcp.json"]
    found = next((p for p in candidates if p.is_file()), None)
    return found.absolute() if found is not None else None  # a relative RINGLET_LOKI_DIR is the cwd's


@dataclass(frozen=True, slots=True)
class Skill:
    """A Loki skill: `skills/<name>/SKILL.md`, YAML front matter (`description`, `enabled_tools`) over the
    instructions it brings."""

    name: str
    description: str
    instructions: str
    tools: tuple[str, ...]
    path: Path


def skill_dirs() -> list[Path]:
    """Where skills are installed: `RINGLET_SKILLS_DIR` (default ~/.config/ringlet/skills), then Loki's
    (`LOKI_SKILLS_DIR`, default the skills folder of Loki's directory)."""
    ours = Path(os.environ.get("RINGLET_SKILLS_DIR", "~/.config/ringlet/skills")).expanduser()
    lokis = os.environ.get("LOKI_SKILLS_DIR")
    return [ours, Path(lokis).expanduser() if lokis else loki_dir() / "skills"]


def installed_skills() -> dict[str, Path]:
    """Installed skills by name (the first directory that has it wins): folders holding a SKILL.md."""
    found: dict[str, Path] = {}
    for root in reversed(skill_dirs()):
        if root.is_dir():
            found |= {p.name: p / "SKILL.md" for p in root.iterdir() if (p / "SKILL.md").is_file()}
    return found


def load_skill(name: str) -> Skill:
    """An installed skill; ConfigError naming where it was looked for, or what is wrong with its SKILL.md."""
    path = installed_skills().get(name)
    if path is None:
        raise ConfigError(f"skill '{name}' is not installed (looked in {', '.join(map(str, skill_dirs()))})")
    text = path.read_text(encoding="utf-8")
    meta: Any = {}
    if text.startswith("---"):
        head, sep, body = text[3:].partition("\n---")
        if sep:
            try:
                meta = yaml.safe_load(head) or {}
            except yaml.YAMLError as exc:
                raise ConfigError(f"{path}: the front matter is not YAML: {exc}") from None
            text = body.partition("\n")[2]
    if not isinstance(meta, dict):
        raise ConfigError(f"{path}: the front matter must be a mapping (description:, enabled_tools:)")
    front = cast("dict[str, Any]", meta)
    tools: Any = front.get("enabled_tools") or []
    if isinstance(tools, str):
        tools = [t.strip() for t in tools.split(",") if t.strip()]
    return Skill(name, str(front.get("description") or ""), text.strip(), tuple(str(t) for t in tools), path)


def skills_prompt(skills: Iterable[Skill], header: str | None = None) -> str:
    """The instructions that bring skills in: `header` (a config's `skill_instructions`) or the default one,
    then each skill's name, description and instructions."""
    parts = [header or "## Skills\nFollow these skills where they apply."]
    for skill in skills:
        title = f"### Skill: {skill.name}" + (f" — {skill.description}" if skill.description else "")
        parts.append(f"{title}\n{skill.instructions}")
    return "\n\n".join(parts)


@dataclass(slots=True)
class _Sources:
    """A loop agent's `documents`, built with the default chunking and keyword search."""

    documents: list[str]
    embedding_model: str | None = None
    chunk_size: int | None = None
    chunk_overlap: int | None = None
    fully_specified: bool = True


class AgentDocuments(Plugin):
    """Loki's `documents` of a plain agent: a knowledge base (`ringlet.memory.documents`, built on the first
    request and rebuilt when the files change) whose best passages for each user message are attached to
    it in the prompt, in a `<context>` block with their sources. The stored transcript keeps the message
    as written; each message is looked up once per run."""

    name = "loki_documents"

    def __init__(self, agent: str, directory: Path, documents: list[str], *, top_k: int = 5) -> None:
        self.agent, self.directory, self.documents, self.top_k = agent, directory, documents, top_k
        self._built: asyncio.Task[Any] | None = None

    async def _base(self) -> Any:
        """The built knowledge base. The build is one task for the agent's lifetime: a hook timeout during
        a long first build leaves it running for the next request."""
        if self._built is None:
            self._built = asyncio.get_running_loop().create_task(self._build())
        return await asyncio.shield(self._built)

    async def _build(self) -> Any:
        from ringlet.memory import Memory
        from ringlet.memory.documents import KnowledgeBase

        kb = KnowledgeBase(self.agent, "documents", _Sources(self.documents), self.directory, Memory())
        await kb.ensure_built()
        return kb

    async def pre_prompt(self, ctx: PrePromptContext) -> None:
        found: dict[str, Any] = ctx.plugin_data.setdefault(self.name, {})
        index = next((i for i in range(len(ctx.messages) - 1, -1, -1) if ctx.messages[i].role == "user"), None)
        if index is None or not ctx.messages[index].text.strip():
            return
        message = ctx.messages[index]
        if message.id not in found:
            found[message.id] = await (await self._base()).query(message.text, self.top_k)
        hit = found[message.id]
        if not hit["context"]:
            return
        block = (f'<context sources="{", ".join(hit["sources"])}">\n{hit["context"]}\n</context>\n'
                 "Answer from this context where it applies.")
        content: Any = f"{message.content}\n\n{block}" if isinstance(message.content, str) else \
            (*message.content, TextPart(text=f"\n\n{block}"))
        ctx.messages[index] = replace(message, content=content)


_WARNED: set[tuple[Path, str]] = set()


def warn_ignored(keys: Iterable[str], path: Path) -> None:
    """One warning per file and key in a process (a config is read again by `ringlet agents`, validation, …)."""
    for key in keys:
        if (path, key) in _WARNED:
            continue
        _WARNED.add((path, key))
        log.warning("%s: Loki's '%s' is accepted and ignored: %s", path, key, IGNORED_KEYS[key])
