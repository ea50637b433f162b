"""Messages: frozen, typed parts linked by tool-call id, with one (de)serialiser and a schema version.

A `Message` is what a transcript holds (`loop-and-hooks.md` §4). Its `metadata` dict is the one mutable
part: hooks annotate it (`user_message_received`, `tool_executed`) and the store marks it persisted.

These are frozen, slotted dataclasses: the loop makes two or more per round, and a validated pydantic
model costs several times as much to build (and to collect). Pydantic validates and serialises them at
the edges (`load_messages`, `dump_messages`, `Message.validate`), where untrusted data comes in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter

from ringlet._ids import new_id, now

SCHEMA_VERSION = 1

Role = Literal["system", "user", "assistant", "tool", "error"]
Source = Literal["chat", "webhook", "cron", "schedule", "sub_agent", "api", "direct"]
Effect = Literal["read", "write", "destructive"]

@dataclass(frozen=True, slots=True, kw_only=True)
class TextPart:
    type: Literal["text"] = "text"
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ImagePart:
    """An image by URL or base64 `data`."""

    type: Literal["image"] = "image"
    url: str | None = None
    data: str | None = None
    media_type: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AudioPart:
    type: Literal["audio"] = "audio"
    url: str | None = None
    data: str | None = None
    media_type: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class FilePart:
    type: Literal["file"] = "file"
    url: str | None = None
    data: str | None = None
    media_type: str | None = None
    filename: str | None = None


Part = Annotated[TextPart | ImagePart | AudioPart | FilePart, Field(discriminator="type")]


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCall:
    """A call the model asked for. `raw_arguments` is the JSON text exactly as the model produced it."""

    id: str
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    raw_arguments: str = "{}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolDefinition:
    """What a model is told about a tool: its name, description and JSON Schema of parameters."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """One transcript entry. Construct with `Message.user("hi")` and friends."""

    id: str
    role: Role
    content: str | tuple[Part, ...] = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    conversation_id: str | None = None
    run_id: str | None = None
    created_at: str = field(default_factory=now)
    metadata: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    @property
    def text(self) -> str:
        """The message's text: the string content, or its text parts joined."""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content if isinstance(p, TextPart))

    @property
    def duration(self) -> int | None:
        """How many model requests may still see this message (`loop-and-hooks.md` §4.3); None means all."""
        return self.metadata.get("duration")

    @property
    def is_error(self) -> bool:
        return bool(self.metadata.get("is_error"))

    @classmethod
    def validate(cls, data: Any) -> Message:
        """A Message from untrusted data (a dict or a Message), validated; raises pydantic's ValidationError."""
        return _adapter(Message).validate_python(migrate(data) if isinstance(data, dict) else data)

    def model_dump(self, *, mode: Literal["json", "python"] = "json") -> dict[str, Any]:
        """This message as a dict (JSON-ready by default)."""
        return _adapter(Message).dump_python(self, mode=mode)

    @classmethod
    def user(cls, content: str | Sequence[Part], **metadata: Any) -> Message:
        return cls(id=new_id("m"), role="user", content=_content(content), metadata=metadata)

    @classmethod
    def system(cls, content: str, **metadata: Any) -> Message:
        return cls(id=new_id("m"), role="system", content=content, metadata=metadata)

    @classmethod
    def assistant(cls, content: str = "", tool_calls: Iterable[ToolCall] = (), **metadata: Any) -> Message:
        return cls(id=new_id("m"), role="assistant", content=content, tool_calls=tuple(tool_calls),
                   metadata=metadata)

    @classmethod
    def tool(cls, tool_call_id: str, name: str, content: str, *, is_error: bool = False,
             **metadata: Any) -> Message:
        return cls(id=new_id("m"), role="tool", content=content, tool_call_id=tool_call_id, name=name,
                   metadata={"is_tool_result": True, "is_error": is_error, **metadata})


def _content(content: str | Sequence[Part]) -> str | tuple[Part, ...]:
    return content if isinstance(content, str) else tuple(content)


@cache
def _adapter(tp: Any) -> TypeAdapter[Any]:
    return TypeAdapter(tp)


_MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}
"""`version -> function` upgrading a stored message dict from that version to the next."""


def dump_messages(messages: Sequence[Message]) -> bytes:
    """Serialise messages to JSON bytes (the one serialiser)."""
    return _adapter(list[Message]).dump_json(list(messages))


def load_messages(data: str | bytes | list[dict[str, Any]]) -> list[Message]:
    """Parse messages from JSON or dicts, migrating older schema versions on read."""
    raw = _adapter(list[dict[str, Any]]).validate_json(data) if isinstance(data, str | bytes) else data
    return _adapter(list[Message]).validate_python([migrate(m) for m in raw])


def migrate(raw: dict[str, Any]) -> dict[str, Any]:
    """Bring one stored message dict up to `SCHEMA_VERSION`."""
    version = int(raw.get("schema_version", 1))
    if version > SCHEMA_VERSION:
        raise ValueError(f"message {raw.get('id')!r} has schema_version {version}, newer than this "
                         f"ringlet understands ({SCHEMA_VERSION}); upgrade ringlet")
    while version < SCHEMA_VERSION:
        raw = _MIGRATIONS[version](raw)
        version += 1
        raw["schema_version"] = version
    return raw
