"""Bash tools with argc annotations, the way Loki (and llm-functions) write them.

A file holds one tool (a global tool: `main()`, named after the file) or several (an agent's `tools.sh`:
one per `# @cmd` function, named after it with `-` as `_`). The comments above describe each tool:

    # @describe Read a file.              the tool's description (global tools)
    # @cmd Look up a host.                a tool of tools.sh: the function below it
    # @option --path! The file's path     an argument: `!` required, `*`/`+` a list (`+` required),
    # @option --mode[=fast|slow]          `[a|b]` choices (`=` marks the default), `=value` a default,
    # @option --count <INT>               `<INT>`/`<NUM>` a number
    # @flag --verbose                     a boolean
    # @env TOKEN! An API token            an environment variable the tool needs (checked before it runs)
    # @meta require-tools jq              programs it needs on PATH (checked before it runs)

A call runs `bash FILE` with Loki's convention: each argument as `argc_<name>` (a list as a bash array,
a flag as 1), `$LLM_OUTPUT` naming a file the tool writes its result to (stdout is the result when the file
stays empty), the `LLM_*` variables of its agent, in its own process group, killed (SIGTERM, then SIGKILL)
on timeout or cancellation. The script's usual last line, `eval "$(argc --argc-eval "$0" "$@")"`, needs no
argc program: ringlet answers it with the call (a script without that line is called all the same).

    tools = bash_tools(Path("agents/ops/tools.sh"))             # [Tool, ...], one per @cmd
    tools = bash_tools(Path("~/.config/loki/functions/tools/fs_cat.sh"))   # [Tool(name="fs_cat")]
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ringlet.context import RunContext
from ringlet.errors import ConfigError, ToolFailure
from ringlet.tools.base import Tool, schema_validator

__all__ = [
    "KILL_GRACE_S",
    "ArgcCommand",
    "ArgcParam",
    "bash_tools",
    "call_function",
    "parse_argc",
    "read_env_file",
    "run_tool_process",
    "stop_process_group",
    "variable_env",
]

KILL_GRACE_S = 5.0
MAX_STDERR = 4096
_TAG = re.compile(r"^#\s*@(describe|cmd|option|flag|arg|env|meta)\b\s*(.*)$")
_FUNCTION = re.compile(r"^\s*(?:function\s+)?([A-Za-z_][A-Za-z0-9_:.-]*)\s*\(\s*\)\s*\{?")
_PARAM = re.compile(
    r"^(?:-[A-Za-z0-9]\s+)?--?(?P<name>[A-Za-z0-9][A-Za-z0-9_-]*)(?P<mod>[!*+]?,?)"
    r"(?:\[(?P<choices>[^\]]*)\]|=(?P<default>\S+))?(?:\s+<(?P<value>[A-Za-z_-]+)>)?\s*(?P<description>.*)$")
_ENV_LINE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$")
_ENV = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?P<required>!?)(?:=(?P<default>\S*)|\[[^\]]*\])?\s*(?P<d>.*)$")


@dataclass(frozen=True, slots=True)
class ArgcParam:
    """One `@option` or `@flag`: a property of the tool's JSON Schema and an `argc_<name>` variable."""

    name: str
    kind: str  # "string", "integer", "number", "boolean", or "array"
    description: str = ""
    item: str = "string"
    """The type of a list's items (`<INT>`, `<NUM>` or text)."""
    required: bool = False
    choices: tuple[str, ...] = ()
    default: str | None = None

    @property
    def key(self) -> str:
        return self.name.replace("-", "_")

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.kind}
        if self.kind == "array":
            out["items"] = {"type": self.item, **({"enum": list(self.choices)} if self.choices else {})}
        elif self.choices:
            out["enum"] = list(self.choices)
        if self.description:
            out["description"] = self.description
        if self.default is not None and self.kind != "array":
            out["description"] = f"{self.description} (default: {self.default})".strip()
        return out


@dataclass(slots=True)
class ArgcCommand:
    """A tool of a bash file: the function that runs it, its description, arguments and needs."""

    name: str
    function: str
    description: str
    params: list[ArgcParam] = field(default_factory=list)
    env: dict[str, tuple[bool, str | None]] = field(default_factory=dict)
    """`@env NAME` → (required, default)."""
    requires: list[str] = field(default_factory=list)

    def parameters(self) -> dict[str, Any]:
        return {"type": "object", "properties": {p.key: p.schema() for p in self.params},
                "required": [p.key for p in self.params if p.required], "additionalProperties": False}


def _param(tag: str, text: str, where: str) -> ArgcParam:
    match = _PARAM.match(text.strip())
    if match is None:
        raise ConfigError(f"{where}: cannot read `# @{tag} {text.strip()}`; write e.g. `# @option --name! What it "
                          "is` (`!` required, `*` a list, `[a|b]` choices, `=x` a default)")
    mod, choices, default = match["mod"], match["choices"], match["default"]
    options: tuple[str, ...] = ()
    if choices is not None:
        if choices.startswith("?") or "`" in choices:  # choices from a function: not checked here
            choices = ""
        if choices.startswith("="):
            choices = choices[1:]
            default = choices.split("|")[0]
        options = tuple(c for c in choices.split("|") if c)
    typed = {"INT": "integer", "NUM": "number"}.get((match["value"] or "").upper(), "string")
    kind = "boolean" if tag == "flag" else "array" if "*" in mod or "+" in mod else typed
    if default is not None and default.startswith("`"):
        default = None  # a default computed by a function: the script computes it
    return ArgcParam(match["name"], kind, match["description"].strip(), typed, "!" in mod or "+" in mod, options,
                     default)


def _annotate(command: ArgcCommand, kind: str, text: str, where: str) -> None:
    """Add one `@option`, `@flag`, `@env` or `@meta require-tools` line to `command`."""
    if kind in ("option", "flag"):
        command.params.append(_param(kind, text, where))
    elif kind == "env":
        env = _ENV.match(text)
        if env is not None:
            command.env[env["name"]] = (bool(env["required"]), env["default"])
    elif kind == "meta" and text.startswith("require-tools"):
        command.requires += [t for t in re.split(r"[,\s]+", text.removeprefix("require-tools")) if t]


def parse_argc(path: Path) -> list[ArgcCommand]:
    """The tools of a bash file: one per `# @cmd` function, else the whole file (`main`) named after it.
    Raises ConfigError naming the file and line of an annotation it cannot read or a tool with no
    description."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the tool file: {exc}") from None
    top = ArgcCommand(_tool_name(path.stem), "main", "")
    commands: list[ArgcCommand] = []
    current, pending = top, None
    for number, line in enumerate(lines, 1):
        tag = _TAG.match(line.strip())
        if tag is not None:
            kind, text = tag.group(1), tag.group(2).strip()
            if kind == "describe":
                top.description = text
            elif kind == "cmd":
                pending = current = ArgcCommand("", "", text)
            else:
                _annotate(current, kind, text, f"{path}:{number}")
            continue
        function = _FUNCTION.match(line)
        if function is not None and pending is not None:
            pending.function, pending.name = function.group(1), _tool_name(function.group(1))
            if not pending.function.startswith("_"):
                commands.append(pending)
            pending, current = None, top
    for tool in commands or [top]:
        if commands:  # a tool of tools.sh also needs what the file as a whole declares
            tool.env, tool.requires = {**top.env, **tool.env}, [*top.requires, *tool.requires]
        if not tool.description:
            what = f"function {tool.function}" if commands else "the file"
            raise ConfigError(f"{path}: {what} has no description; add `# @describe What it does` (a tool file) "
                              "or `# @cmd What it does` above the function (tools.sh)")
    return commands or [top]


def _tool_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def bash_tools(path: Path, *, env: Mapping[str, str] | None = None, cwd: Path | None = None,
               timeout_s: float = 60.0) -> list[Tool]:
    """The tools of a bash file with argc annotations (see the module). `env` is added to each call's
    environment (the agent's `.env`, `LLM_AGENT_*`); `cwd` is its working directory (None: the process's)."""
    return [_tool(path, command, dict(env or {}), cwd, timeout_s) for command in parse_argc(path)]


def _tool(path: Path, command: ArgcCommand, env: dict[str, str], cwd: Path | None, timeout_s: float) -> Tool:
    parameters = command.parameters()

    async def run(args: dict[str, Any], ctx: RunContext) -> str:
        return await _call(path, command, args, env, cwd)

    return Tool(command.name, command.description, parameters, run, validate=schema_validator(parameters),
                timeout_s=timeout_s, takes_context=False)


def _quoted(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else ""
    return shlex.quote(value if isinstance(value, str) else str(value))


def _assignments(command: ArgcCommand, args: Mapping[str, Any]) -> tuple[str, dict[str, str]]:
    """The bash that sets each `argc_<name>` (lists as arrays) and the scalar ones as environment variables."""
    code, scalars = [], {}
    for p in command.params:
        value = args.get(p.key, p.default)
        if value is None or value is False:
            continue
        name = f"argc_{p.key}"
        if p.kind == "array":
            items = value if isinstance(value, list) else [value]
            code.append(f"{name}=({' '.join(_quoted(v) for v in items)})")
        else:
            code.append(f"{name}={_quoted(value)}")
            scalars[name] = "1" if value is True else str(value)
    return "\n".join(code), scalars


def _check_needs(command: ArgcCommand, env: Mapping[str, str]) -> None:
    missing = [name for name, (required, default) in command.env.items()
               if required and default is None and not env.get(name)]
    if missing:
        raise ToolFailure("tool_unavailable", f"Tool '{command.name}' needs the environment variable(s) "
                          f"{', '.join(missing)}; set them in the agent's .env or the environment")
    absent = [program for program in command.requires if shutil.which(program, path=env.get("PATH")) is None]
    if absent:
        raise ToolFailure("tool_unavailable", f"Tool '{command.name}' needs {', '.join(absent)} on PATH")


_RUNNER = """argc() { printf '__ringlet_argc=1\\n%s\\n' "$RINGLET_ARGC_EVAL"; }
source "$0"
[ -n "${__ringlet_argc:-}" ] || eval "$RINGLET_ARGC_EVAL"
"""


async def _call(path: Path, command: ArgcCommand, args: Mapping[str, Any], extra: Mapping[str, str],
                cwd: Path | None) -> str:
    """Run the tool; its timeout (the Tool's) cancels this, which kills the tool's process group."""
    code, scalars = _assignments(command, args)
    env = {**os.environ, **extra}
    for name, (_, default) in command.env.items():
        if default is not None and not env.get(name):
            env[name] = default
    _check_needs(command, env)
    env |= scalars | {"RINGLET_ARGC_EVAL": f"{code}\n{command.function}"}
    return await run_tool_process(command.name, ["bash", "-c", _RUNNER, str(path)], env, cwd)


def call_function(path: Path, function: str, env: Mapping[str, str], *, timeout_s: float = 30.0) -> str:
    """Run one function of a bash file now (blocking) with no arguments, the way tools run: its `$LLM_OUTPUT`
    file, else its stdout. ConfigError naming the file and function when it fails or takes too long."""
    fd, output = tempfile.mkstemp(prefix="ringlet-tool-", suffix=".out")
    os.close(fd)
    try:
        done = subprocess.run(["bash", "-c", _RUNNER, str(path)], check=False, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=timeout_s, start_new_session=True,
                              env={**os.environ, **env, "LLM_OUTPUT": output, "RINGLET_ARGC_EVAL": function})
        written = Path(output).read_text(encoding="utf-8", errors="replace")
    except subprocess.TimeoutExpired:
        raise ConfigError(f"{path}: {function} did not finish in {timeout_s:g}s") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(output)
    if done.returncode != 0:
        raise ConfigError(f"{path}: {function} exited with code {done.returncode}: {done.stderr[-MAX_STDERR:]}")
    return written.strip() or done.stdout.strip()


async def run_tool_process(name: str, argv: list[str], env: dict[str, str], cwd: Path | None) -> str:
    """Run a tool's process the Loki way: `$LLM_OUTPUT` names a file for its result (stdout counts when the
    file stays empty; nothing at all is "DONE"), a non-zero exit is `tool_failed` with the ends of stderr and
    stdout, and cancelling (the tool's timeout, the run's end) kills its process group."""
    fd, output = tempfile.mkstemp(prefix="ringlet-tool-", suffix=".out")
    os.close(fd)
    env = {**env, "LLM_OUTPUT": output, "LLM_TOOL_NAME": name}
    try:
        process = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, cwd=cwd, env=env, start_new_session=True)
        try:
            stdout, stderr = await process.communicate()
        except BaseException:  # cancelled: the tool's processes go with it
            await asyncio.shield(stop_process_group(process))
            raise
        written = await asyncio.to_thread(Path(output).read_text, encoding="utf-8", errors="replace")
    finally:
        with contextlib.suppress(OSError):
            os.unlink(output)
    out = stdout.decode("utf-8", errors="replace")
    if process.returncode != 0:
        raise ToolFailure("tool_failed", f"Tool call '{name}' exited with code {process.returncode}",
                          stderr=stderr[-MAX_STDERR:].decode("utf-8", errors="replace"), stdout=out[-MAX_STDERR:])
    return (written.strip() or out.strip()) or "DONE"


def read_env_file(path: Path) -> dict[str, str]:
    """`KEY=value` lines of a `.env` file (`export` prefixes, quotes and comments allowed)."""
    if not path.is_file():
        return {}
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _ENV_LINE.match(line)
        if match is None:
            continue
        value = match.group(2)
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        elif " #" in value:
            value = value.split(" #", 1)[0].rstrip()
        out[match.group(1)] = value
    return out


def variable_env(name: str) -> str:
    return "LLM_AGENT_VAR_" + re.sub(r"[^A-Za-z0-9_]", "_", name).upper()


async def stop_process_group(process: asyncio.subprocess.Process) -> None:
    """SIGTERM to a process's group; SIGKILL if it is still there after the grace period."""
    if process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), KILL_GRACE_S)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
