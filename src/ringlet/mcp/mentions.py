"""`@server:uri` mentions: a user message that names an MCP server's resource gets the resource's text.

    "Summarise @everything:demo://resource/static/document/architecture.md"

The one place this happens is the prompt: before each model request (a `pre_prompt` hook, `MCPMentions` in
`ringlet.agent.config`, added to every agent with `mcp_servers`), each user message's mentions are read once
per run and their text is attached after the message's own text, in a `<resource>` block. The stored
transcript keeps the message as the user wrote it. A mention of an unknown server is left alone; a
resource that cannot be read is attached as the reason, so the model can say so.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from ringlet.errors import RingletError
from ringlet.messages import Message, TextPart

MENTION = re.compile(r"(?<![\w@])@([A-Za-z0-9_-]+):([A-Za-z][A-Za-z0-9+.-]*:[^\s<>\"'`]+)")
MAX_CHARS = 20_000
"""At most this much of one resource is attached."""


def mentions(text: str, servers: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The `(server, uri)` pairs `text` mentions, in order, once each, for known servers (trailing
    punctuation is not part of a URI)."""
    out: list[tuple[str, str]] = []
    for server, raw in MENTION.findall(text):
        uri = raw.rstrip(".,;:!?)]}")
        if server in servers and (server, uri) not in out:
            out.append((server, uri))
    return out


async def expand(messages: Sequence[Message], servers: Mapping[str, Any], cache: dict[str, str]) -> list[Message]:
    """`messages` with each user message's mentioned resources attached. `cache` (JSON: the run's plugin
    data) keeps what was read, by `server:uri`, so each resource is read once per run."""
    out = []
    for message in messages:
        found = mentions(message.text, servers) if message.role == "user" else []
        if not found:
            out.append(message)
            continue
        blocks = []
        for server, uri in found:
            key = f"{server}:{uri}"
            if key not in cache:
                cache[key] = await _read(servers[server], uri)
            blocks.append(f'<resource server="{server}" uri="{uri}">\n{cache[key]}\n</resource>')
        attached = "\n\n".join(blocks)
        content: Any = f"{message.content}\n\n{attached}" if isinstance(message.content, str) else \
            (*message.content, TextPart(text=f"\n\n{attached}"))
        out.append(replace(message, content=content))
    return out


async def _read(toolset: Any, uri: str) -> str:
    try:
        text = await toolset.read_resource(uri)
    except RingletError as exc:
        return f"(could not read this resource: {exc})"
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS] + f"\n… ({len(text) - MAX_CHARS} more characters)"
