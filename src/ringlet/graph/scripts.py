"""The script protocol (`graph-workflows.md` §6): run a `script` node's file, read one JSON object back.

    result = await run_script(ScriptCall("scripts/fetch.sh", agent_dir, state, timeout_s=30, ...))
    result.data    # the object's keys (without `_next`), merged into state by the caller
    result.next    # the `_next` route, if the script gave one

The runtime follows the extension (`.sh` bash, `.py` python3, `.ts` npx tsx). Stdin is empty; the state
arrives as compact JSON in `GRAPH_STATE`, or in a file named by `GRAPH_STATE_FILE` past 32 KiB. A script
runs in its own process group, which is killed (SIGTERM, then SIGKILL 5 s later) on timeout or when the
run is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ringlet.errors import RunError
from ringlet.tools.shell import read_env_file, stop_process_group, variable_env

__all__ = ["STATE_ENV_LIMIT", "ScriptCall", "ScriptError", "ScriptResult", "outside_message", "read_env_file",
           "run_script", "script_path"]

log = logging.getLogger("ringlet.graph")

STATE_ENV_LIMIT = 32 * 1024
STDERR_TAIL = 4 * 1024
EXTENSIONS = (".sh", ".py", ".ts")


class ScriptError(RunError):
    """A script failed; the message is the protocol's (§6). Goes to the node's fallback, if any."""

    def __init__(self, message: str) -> None:
        super().__init__("script_failed", message)


@dataclass(slots=True)
class ScriptCall:
    """One run of a script node's file."""

    script: str
    """The path as written in graph.yaml, relative to the agent directory."""
    agent_dir: Path
    state: Mapping[str, Any]
    timeout_s: float
    cwd: Path | None = None
    """The working directory: the caller's (CLI) or the agent directory (server); None is the process's."""
    variables: Mapping[str, str] = field(default_factory=dict)
    run_id: str = ""
    node_id: str = ""
    data_dir: Path | None = None
    python: str = "python3"


@dataclass(slots=True)
class ScriptResult:
    data: dict[str, Any]
    next: str | None
    stderr: str = ""


def script_path(agent_dir: Path, script: str) -> Path | None:
    """Where `script` (as written in graph.yaml) lies once `..` and symlinks are resolved, when that is
    inside the agent directory; None when it escapes it (`../x.sh`, `/abs/x.sh`, a link pointing out)."""
    root = agent_dir.resolve()
    path = (root / script).resolve()
    return path if path.is_relative_to(root) else None


def outside_message(agent_dir: Path, script: str) -> str:
    """Why a script that escapes the agent directory is refused (the validator's and the engine's message)."""
    return (f"Script '{script}' resolves outside the agent directory {agent_dir.resolve()} (to "
            f"{(agent_dir.resolve() / script).resolve()}); scripts must lie inside it")


def command(call: ScriptCall) -> list[str]:
    """The argv that runs the script. A script that resolves outside the agent directory is refused here,
    whatever the validator said (`validate_before_run: false` skips it)."""
    if script_path(call.agent_dir, call.script) is None:
        raise ScriptError(outside_message(call.agent_dir, call.script))
    path = str(call.agent_dir / call.script)
    suffix = Path(call.script).suffix
    if suffix == ".sh":
        return ["bash", path]
    if suffix == ".py":
        return [call.python, path]
    if suffix == ".ts":
        return ["npx", "tsx", path]
    raise ScriptError(f"Unsupported script extension '{suffix}' (supported: {', '.join(EXTENSIONS)})")


def environment(call: ScriptCall, state_json: str, state_file: str | None) -> dict[str, str]:
    """The process's environment, the agent's .env, then the protocol's variables (which win)."""
    env = {k: v for k, v in os.environ.items() if k not in ("GRAPH_STATE", "GRAPH_STATE_FILE")}
    env.update(read_env_file(call.agent_dir / ".env"))
    env.update({variable_env(k): v for k, v in call.variables.items()})
    if call.data_dir is not None:
        env["LLM_AGENT_DATA_DIR"] = str(call.data_dir)
    env |= {"RINGLET_AGENT_DIR": str(call.agent_dir), "RINGLET_RUN_ID": call.run_id,
            "RINGLET_NODE_ID": call.node_id, "AUTO_CONFIRM": "true", "CLICOLOR_FORCE": "1", "FORCE_COLOR": "1"}
    if state_file is None:
        env["GRAPH_STATE"] = state_json
    else:
        env["GRAPH_STATE_FILE"] = state_file
    return env


async def _communicate(call: ScriptCall, argv: list[str], env: dict[str, str]) -> tuple[int, bytes, bytes]:
    process = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        cwd=call.cwd, env=env, start_new_session=True)
    try:
        async with asyncio.timeout(call.timeout_s):
            stdout, stderr = await process.communicate()
    except TimeoutError:
        await stop_process_group(process)
        raise ScriptError(f"Script '{call.script}' timed out after {call.timeout_s:g}s") from None
    except BaseException:  # cancelled (the run's timeout, an abort): the script goes with it
        await asyncio.shield(stop_process_group(process))
        raise
    assert process.returncode is not None
    return process.returncode, stdout, stderr


def parse_output(call: ScriptCall, stdout: bytes) -> tuple[dict[str, Any], str | None]:
    text = stdout.decode("utf-8", errors="replace").strip()
    if not text:
        raise ScriptError(f"Script '{call.script}' produced no output (scripts must emit a single JSON object "
                          "on stdout)")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ScriptError(f"Script output must be valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ScriptError("Script output must be a JSON object, not array or primitive")
    route = data.pop("_next", None)
    if route is not None and not isinstance(route, str):
        log.warning("script %s: ignoring a non-string _next (%s)", call.script, type(route).__name__)
        route = None
    return data, route


async def run_script(call: ScriptCall) -> ScriptResult:
    """Run the script; raise ScriptError with the protocol's message on any failure."""
    argv = command(call)
    state_json = json.dumps(call.state, ensure_ascii=False, separators=(",", ":"))
    state_file = None
    if len(state_json.encode()) > STATE_ENV_LIMIT:
        fd, state_file = tempfile.mkstemp(prefix="graph-state-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(state_json)
    try:
        code, stdout, stderr = await _communicate(call, argv, environment(call, state_json, state_file))
    finally:
        if state_file is not None:
            with contextlib.suppress(OSError):
                os.unlink(state_file)
    err = stderr.decode("utf-8", errors="replace")
    if code != 0:
        tail = stderr[-STDERR_TAIL:].decode("utf-8", errors="replace")
        raise ScriptError(f"Script '{call.script}' failed with exit code {code}:\n{tail}")
    data, route = parse_output(call, stdout)
    if err:
        log.debug("script %s stderr:\n%s", call.script, err)
    return ScriptResult(data, route, err)
