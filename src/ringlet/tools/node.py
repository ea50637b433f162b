"""JavaScript and TypeScript tools, the way Loki writes them: each `export function` of a `tools.js` or
`tools.ts` with a JSDoc comment is a tool (a global tool file: its `run`, named after the file).

    /**
     * Look up a host's address.                     the description: the text before the first tag
     * @param host - The host name                   a parameter's description (`{type}` too, in .js)
     */
    export async function lookup_host(host: string, family?: "ipv4" | "ipv6"): Promise<string> { … }

Types become JSON Schema: `string`, `number`, `boolean`, `T[]`/`Array<T>`, a union of string literals (an
enum); `x?:`, a default value or `| null`/`| undefined` make a parameter optional. A call runs `node` (`.js`)
or `tsx` (`.ts`: the one installed beside ringlet's node tools, on PATH, or `npx tsx`) on a small runner
that passes the arguments by name and appends the result to `$LLM_OUTPUT` (`ringlet.tools.shell`'s process
handling: timeouts, cancellation, errors).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ringlet.context import RunContext
from ringlet.errors import ConfigError
from ringlet.tools.base import Tool, schema_validator
from ringlet.tools.shell import run_tool_process

__all__ = ["JsFunction", "node_tools", "parse_js"]

RUNNER = Path(__file__).with_name("js_runner.mjs")
_EXPORT = re.compile(r"(?:/\*\*(?P<doc>(?:(?!\*/).)*)\*/\s*)?export\s+(?:async\s+)?function\s*\*?\s*"
                     r"(?P<name>[A-Za-z_$][\w$]*)\s*(?:<[^>]*>)?\s*\((?P<params>[^)]*)\)", re.S)
_PARAM = re.compile(r"^(?P<name>[A-Za-z_$][\w$]*)(?P<optional>\?)?\s*(?::\s*(?P<type>.+?))?"
                    r"\s*(?:=\s*(?P<default>.+))?$", re.S)
_TAG_PARAM = re.compile(r"@param\s+(?:\{(?P<type>[^}]*)\}\s*)?\[?(?P<name>[A-Za-z_$][\w$]*)[^\s]*\s*-?\s*(?P<d>.*)")
_SCALARS = {"string": "string", "number": "number", "boolean": "boolean", "integer": "integer"}


@dataclass(slots=True)
class JsFunction:
    """An exported function: its name, description and parameters (name → schema, required names)."""

    name: str
    description: str
    params: dict[str, dict[str, Any]] = field(default_factory=dict)
    required: list[str] = field(default_factory=list)

    def parameters(self) -> dict[str, Any]:
        return {"type": "object", "properties": self.params, "required": self.required,
                "additionalProperties": False}


def _split(params: str) -> list[str]:
    """Top-level comma-separated parts (commas inside <>, [], {}, () or quotes do not split)."""
    parts, depth, quote, current = [], 0, "", ""
    for char in params:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"`":
            quote = char
        elif char in "<[{(":
            depth += 1
        elif char in ">]})":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        current += char
    return [p.strip() for p in [*parts, current] if p.strip()]


def type_schema(text: str | None) -> tuple[dict[str, Any], bool]:
    """A TypeScript (or JSDoc) type as JSON Schema, and whether it admits null/undefined."""
    if not text:
        return {}, False
    options = [t.strip() for t in _split(text.replace("|", ","))] if "|" in text else [text.strip()]
    nullable = any(o in ("null", "undefined") for o in options)
    options = [o for o in options if o not in ("null", "undefined")]
    literals = [o[1:-1] for o in options if len(o) >= 2 and o[0] == o[-1] and o[0] in "'\"`"]
    if options and len(literals) == len(options):
        return {"type": "string", "enum": literals}, nullable
    if len(options) != 1:
        return {}, nullable
    kind = options[0]
    array = re.fullmatch(r"(?:Array<(.+)>|(.+)\[\])", kind)
    if array is not None:
        items, _ = type_schema(array.group(1) or array.group(2))
        return {"type": "array", **({"items": items} if items else {})}, nullable
    return ({"type": _SCALARS[kind.lower()]} if kind.lower() in _SCALARS else {}), nullable


def _doc(doc: str) -> tuple[str, dict[str, tuple[str | None, str]]]:
    """A JSDoc block's description (before the first tag) and its `@param`s (name → (type, description))."""
    lines = [re.sub(r"^\s*\*\s?", "", line).rstrip() for line in doc.splitlines()]
    text = "\n".join(lines).strip()
    head, _, _ = text.partition("\n@") if not text.startswith("@") else ("", "", text)
    params = {m["name"]: (m["type"], m["d"].strip()) for m in _TAG_PARAM.finditer(text)}
    return head.strip(), params


def parse_js(path: Path, *, only: str | None = None) -> list[JsFunction]:
    """The exported functions of a .js/.ts file (or only the one named `only`); ConfigError naming the file
    and function for a parameter ringlet cannot pass (destructured, rest) or a missing JSDoc description."""
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the tool file: {exc}") from None
    out = []
    for match in _EXPORT.finditer(source):
        name = match["name"]
        if (only is not None and name != only) or (only is None and name.startswith("_")):
            continue
        description, documented = _doc(match["doc"] or "")
        if not description:
            raise ConfigError(f"{path}: function {name} has no description; put a /** JSDoc */ comment above it")
        function = JsFunction(name, description)
        for part in _split(match["params"]):
            param = _PARAM.match(part)
            if param is None or part.startswith(("{", "[", "...")):
                raise ConfigError(f"{path}: function {name}: cannot pass the parameter `{part}`; write plain "
                                  "named parameters (name: type)")
            given_type, text = documented.get(param["name"], (None, ""))
            schema, nullable = type_schema(param["type"] or given_type)
            function.params[param["name"]] = {**schema, **({"description": text} if text else {})}
            if not (param["optional"] or param["default"] or nullable):
                function.required.append(param["name"])
        out.append(function)
    if only is not None and not out:
        raise ConfigError(f"{path}: a {path.suffix} global tool exports `function {only}(...)` with a JSDoc comment")
    return out


def _runtime(path: Path) -> list[str]:
    if path.suffix != ".ts":
        return ["node"]
    beside = Path(sys.prefix) / "node" / "node_modules" / ".bin" / "tsx"
    if beside.is_file():
        return [str(beside)]
    found = shutil.which("tsx")
    return [found] if found else ["npx", "--yes", "tsx"]


def node_tools(path: Path, *, env: Mapping[str, str] | None = None, cwd: Path | None = None, name: str | None = None,
               timeout_s: float = 60.0) -> list[Tool]:
    """The tools of a .js/.ts file: every exported function, or (`name` given: a global tool) its `run`
    under that name."""
    functions = parse_js(path, only="run" if name is not None else None)
    return [_tool(path.resolve(), f, name or f.name, dict(env or {}), cwd=cwd, timeout_s=timeout_s)
            for f in functions]


def _tool(path: Path, function: JsFunction, name: str, env: dict[str, str], *, cwd: Path | None,
          timeout_s: float) -> Tool:
    parameters = function.parameters()
    order = json.dumps(list(function.params))

    async def run(args: dict[str, Any], ctx: RunContext) -> str:
        argv = [*_runtime(path), str(RUNNER), str(path), function.name, json.dumps(args), order]
        return await run_tool_process(name, argv, {**os.environ, **env}, cwd)

    return Tool(name, function.description, parameters, run, validate=schema_validator(parameters),
                timeout_s=timeout_s, takes_context=False)
