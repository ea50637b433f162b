"""The grammar protocol of the local provider: how a small in-process model sees tools and answers.

The prompt is rendered with the model's own chat template (read from the GGUF). The system turn is the
agent's instructions plus a short listing of the tools; a few worked turns follow for the tools offered
(`examples.py`), then the conversation. A call is written as one line,

    <tool_call>{"name": "calculate", "arguments": {"expression": "17 * 23"}}</tool_call>

and a tool's result comes back as a user turn `<tool_response>…</tool_response>` (chat templates of
small models have no tool role, and some insist that user and assistant turns alternate).

Every reply is decoded under a GBNF grammar. `grammar()` lets the model choose in the one decoding pass
between a plain answer (which may not be blank) and exactly one well-formed call of an offered tool
(`routing="direct"`); once the router has chosen (`route.py`), the reply is an answer
(`grammar(())`) or the rest of the chosen call (`call_grammar()`: the call's frame is already written).
A call has the tool's required arguments and its optional string arguments, in the types its JSON
Schema gives (strings non-empty, on one line, bounded in length, and for the built-in tools in the
characters they accept: `examples.CHARSETS`). Other optional arguments keep their defaults: small
models fill them badly.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ringlet.messages import Message, ToolDefinition
from ringlet.models.base import Chunk, TextDelta, ToolCallArgsDelta, ToolCallStart

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
RESULT_OPEN, RESULT_CLOSE = "<tool_response>", "</tool_response>"
MAX_STRING = 300
"""The longest string argument the grammar allows, in characters."""
MAX_RESULT_CHARS = 2_000
"""A tool result is cut to this many characters in the prompt: a small model reads little, and slowly."""
CHATML = ("{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

TOOLS_PROMPT = """You can call these tools:
{listing}
To call a tool, reply with only <tool_call>{{"name": "<tool>", "arguments": {{...}}}}</tool_call>.
After <tool_response>, answer the user with the result. Answer directly when no tool is needed."""


def _lit(text: str) -> str:
    """A GBNF string literal for `text` (JSON's escapes are GBNF's)."""
    return json.dumps(text)


ANY_CHAR = r'[^"\\\x00-\x1f]'
"""A character of a string argument: anything on one line but a quote or a backslash (no escapes)."""


def _string_rest(max_chars: int = MAX_STRING, chars: str = ANY_CHAR) -> str:
    """The rest of a JSON string after its opening quote: 1 to `max_chars` of `chars` (a GBNF character
    class; an empty argument is a call the model did not mean)."""
    return f'{chars}{{1,{max_chars}}} "\\""'


def _string(max_chars: int = MAX_STRING, chars: str = ANY_CHAR) -> str:
    return f'"\\"" {_string_rest(max_chars, chars)}'


_GENERIC = {
    "json-value": 'json-string | json-number | "true" | "false" | "null" | json-array | json-object',
    "json-string": _string(),
    "json-number": '"-"? [0-9]{1,15} ("." [0-9]{1,10})?',
    "json-array": '"[" (json-value (", " json-value){0,20})? "]"',
    "json-object": '"{" (json-string ": " json-value (", " json-string ": " json-value){0,20})? "}"',
}


def _limit(schema: dict[str, Any]) -> int:
    return min(int(schema.get("maxLength", MAX_STRING)), MAX_STRING)


def _value(schema: dict[str, Any], chars: str | None = None) -> str:
    """The GBNF expression for a JSON value of `schema` (a small subset; anything else is any JSON value);
    `chars`, a GBNF character class, narrows a string's characters."""
    if "enum" in schema:
        return "(" + " | ".join(_lit(json.dumps(v)) for v in schema["enum"]) + ")"
    kind = schema.get("type")
    if kind == "string":
        return _string(_limit(schema), chars or ANY_CHAR)
    if kind == "integer":
        return '"-"? [0-9]{1,15}'
    if kind == "number":
        return "json-number"
    if kind == "boolean":
        return '("true" | "false")'
    return "json-value"


def offered_arguments(tool: ToolDefinition) -> tuple[list[str], list[str]]:
    """The required arguments of a tool, and the optional ones the grammar offers (strings)."""
    props: dict[str, Any] = tool.parameters.get("properties") or {}
    required = [p for p in tool.parameters.get("required") or () if p in props]
    optional = [p for p, s in props.items() if p not in required and s.get("type") == "string"]
    return required, optional


Charsets = Mapping[str, Mapping[str, str]]
"""Per tool and argument, a GBNF character class the argument's string is written in."""


def arguments(tool: ToolDefinition, charsets: Charsets | None = None) -> tuple[str, str]:
    """A call's arguments as the text every call starts with (written into the prompt when the router
    chose the tool, so the model never spells the JSON's frame) and the GBNF for the rest."""
    props: dict[str, Any] = tool.parameters.get("properties") or {}
    required, optional = offered_arguments(tool)
    chars = (charsets or {}).get(tool.name, {})

    def pair(name: str) -> str:
        return f"{_lit(json.dumps(name) + ': ')} {_value(props[name], chars.get(name))}"

    tail = "".join(f' (", " {pair(p)})?' for p in optional) + ' "}"'
    if required:
        first, schema = required[0], props[required[0]]
        rest = "".join(f' ", " {pair(p)}' for p in required[1:]) + tail
        if schema.get("type") == "string" and "enum" not in schema:
            return f'{{{json.dumps(first)}: "', f"{_string_rest(_limit(schema), chars.get(first) or ANY_CHAR)}{rest}"
        return f"{{{json.dumps(first)}: ", f"{_value(schema, chars.get(first))}{rest}"
    if optional:
        return "{", "(" + " | ".join(pair(p) for p in optional) + ')? "}"'
    return "{}", ""


def _arguments(tool: ToolDefinition, charsets: Charsets | None) -> str:
    prefix, rest = arguments(tool, charsets)
    return f"{_lit(prefix)} {rest}"


def _rules(rules: dict[str, str]) -> str:
    if any("json-" in rule for rule in rules.values()):
        rules |= _GENERIC
    return "\n".join(f"{name} ::= {rule}" for name, rule in rules.items())


ANSWER_RULE = r"[^<\x00-\x20] [^\x00]*"
"""A reply that is not a call: it starts with a visible character, so it is never blank."""


def grammar(tools: Sequence[ToolDefinition], charsets: Charsets | None = None) -> str:
    """GBNF for one reply: a non-blank answer, or (when tools are offered) one call of one of them."""
    rules = {"root": "answer | call" if tools else "answer", "answer": ANSWER_RULE}
    if tools:
        calls = []
        for i, tool in enumerate(tools):
            head = _lit(f'{json.dumps(tool.name)}, "arguments": ')
            rules[f"call-{i}"] = f"{head} {_arguments(tool, charsets)}"
            calls.append(f"call-{i}")
        rules["call"] = f'{_lit(CALL_OPEN + """{"name": """)} ({" | ".join(calls)}) {_lit("}" + CALL_CLOSE)}'
    return _rules(rules)


def call_grammar(tool: ToolDefinition, charsets: Charsets | None = None) -> str:
    """GBNF for the rest of a call of `tool` once `call_head(tool.name)` and `arguments(tool)[0]` are
    written."""
    return _rules({"root": f'{arguments(tool, charsets)[1]} {_lit("}" + CALL_CLOSE)}'})


def call_head(name: str) -> str:
    """A call's text up to its arguments."""
    return f'{CALL_OPEN}{{"name": {json.dumps(name)}, "arguments": '


# -- the prompt -------------------------------------------------------------------------------------------


def _describe(tool: ToolDefinition) -> str:
    """A tool as one line, then one line for each argument the grammar offers."""
    required, optional = offered_arguments(tool)
    props: dict[str, Any] = tool.parameters.get("properties") or {}
    lines = [f"- {tool.name}: {tool.description.strip().splitlines()[0] if tool.description.strip() else ''}"]
    for p in [*required, *optional]:
        about = str(props[p].get("description") or "").strip().splitlines()
        lines.append(f'  "{p}"{"" if p in required else " (optional)"}: {props[p].get("type", "value")}'
                     + (f" — {about[0][:160]}" if about else ""))
    return "\n".join(lines)


def system_prompt(instructions: str | None, tools: Sequence[ToolDefinition]) -> str:
    parts = [instructions.strip()] if instructions and instructions.strip() else []
    if tools:
        parts.append(TOOLS_PROMPT.format(listing="\n".join(_describe(t) for t in tools)))
    return "\n\n".join(parts)


def call_text(name: str, arguments: dict[str, Any] | str) -> str:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return f"{call_head(name)}{args}}}{CALL_CLOSE}"


def readable(text: str) -> str:
    """A tool result as a small model reads it best: a JSON object as `key: value` lines (strings
    unquoted, their newlines real), anything else as it is."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if not isinstance(value, dict):
        return text
    return "\n".join(f"{k}: {v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}"
                     for k, v in value.items())


def result_text(text: str) -> str:
    text = readable(text)
    if len(text) > MAX_RESULT_CHARS:
        text = text[:MAX_RESULT_CHARS] + " …"
    return f"{RESULT_OPEN}{text}{RESULT_CLOSE}"


def turns(messages: Sequence[Message]) -> list[dict[str, str]]:
    """The transcript as plain chat turns: calls as call lines, results as user turns, errors as notes;
    consecutive turns of one role are merged (templates that want alternation accept them)."""
    out: list[dict[str, str]] = []
    for m in messages:
        if m.role == "assistant":
            content = m.text.strip()
            if m.tool_calls:
                c = m.tool_calls[0]  # one call a reply is all the grammar makes; the rest wait their turn
                content = call_text(c.name, c.raw_arguments or c.arguments)
            role = "assistant"
        elif m.role == "tool":
            role, content = "user", result_text(m.text)
        elif m.role == "system":
            role, content = "system", m.text
        else:
            role, content = "user", (f"[error] {m.text}" if m.role == "error" else m.text)
        if out and out[-1]["role"] == role:
            out[-1]["content"] += "\n" + content
        else:
            out.append({"role": role, "content": content})
    return out


# -- reading the reply as it streams ----------------------------------------------------------------------

_CALL_HEAD = re.compile(r'^<tool_call>\{"name": "([^"]+)", "arguments": ')
_CALL_TAIL = "}" + CALL_CLOSE


@dataclass(slots=True)
class ReplyReader:
    """Turns the decoded text of a grammar reply into stream chunks: text deltas for an answer, or a
    call's start and then its arguments as they are decoded."""

    text: list[str] = field(default_factory=list)
    mode: str = ""
    """"" until the first character, then "text" or "call"."""
    name: str | None = None
    sent: int = 0
    """Characters of the call's arguments already emitted."""

    def start_call(self, name: str, arguments: str) -> Iterator[Chunk]:
        """The call's head and the start of its `arguments` were written into the prompt (the router
        chose the tool): what is decoded next is the rest of the arguments."""
        self.mode, self.name = "call", name
        yield ToolCallStart(0, name, None)
        if arguments:
            yield ToolCallArgsDelta(0, arguments)

    def feed(self, piece: str) -> Iterator[Chunk]:
        self.text.append(piece)
        if not self.mode:
            self.mode = "call" if piece.startswith("<") else "text"
        if self.mode == "text":
            yield TextDelta(piece)
            return
        yield from self._call(final=False)

    def _call(self, *, final: bool) -> Iterator[Chunk]:
        whole = "".join(self.text)
        if self.name is None:
            match = _CALL_HEAD.match(whole)
            if match is None:
                return
            name = self.name = match.group(1) or ""
            self.text = [whole[match.end():]]
            whole = self.text[0]
            yield ToolCallStart(0, name, None)
        end = len(whole) - len(_CALL_TAIL) if final and whole.endswith(_CALL_TAIL) else \
            len(whole) if final else len(whole) - len(_CALL_TAIL)
        if end > self.sent:
            yield ToolCallArgsDelta(0, whole[self.sent:end])
            self.sent = end

    def close(self) -> Iterator[Chunk]:
        """The rest of a call once decoding ended (a call cut short keeps what it has)."""
        if self.mode == "call":
            yield from self._call(final=True)

    @property
    def is_call(self) -> bool:
        return self.name is not None
