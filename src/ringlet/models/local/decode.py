"""Token-by-token decoding for the local provider, on llama.cpp's low-level API.

Why not `Llama.create_completion`: it applies a grammar to the whole vocabulary at every token (~9 ms a
token for SmolLM2's 49k tokens on these 2 cores, as much again as the model itself), offers no way to
stream while a grammar decides between text and a tool call, and its chat handlers re-render and
re-evaluate prompts per sub-request. Here:

- the prompt reuses the KV cache of the longest common prefix with the previous request (the system
  prompt and the few-shot turns stay evaluated between runs, earlier rounds within a run), and a
  snapshot of a fixed prefix (`keep` tokens: the system turn and the worked examples) is kept in memory
  and in a cache file, so another prompt in between, or a new process, does not evaluate it again
  (~1,500 tokens: 4-9 s on these cores, ~0.1 s to restore);
- the grammar is checked lazily, as llama.cpp's own `common_sampler` does: the sampled token is tested
  alone, and only when the grammar rejects it is the grammar applied to the whole vocabulary and the
  token sampled again;
- text comes out as it is decoded (whole UTF-8 characters), so callers can stream it;
- a reply never repeats itself (`RepeatGuard`): a small model that loops ("I'm sorry. I'm sorry. …",
  a string of digits) is stopped at its first verbatim copy of its own words, the copy is cut, and
  the reply ends as `length`, the finish reason of a reply that did not end its turn.
"""

from __future__ import annotations

import codecs
import ctypes
import hashlib
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np

ll: Any = llama_cpp
"""llama.cpp's C API, untyped here: its ctypes stubs reject plain ints and `byref` where the C API takes them."""

log = logging.getLogger("ringlet.models.local")
MEMORY_SNAPSHOTS = 2
DISK_SNAPSHOTS = 4
_TOKEN_DATA = np.dtype([("id", np.intc), ("logit", np.single), ("p", np.single)], align=True)
Bias = Callable[[str], dict[int, float]]
"""Given the reply decoded so far, logit boosts for some tokens."""


@dataclass(slots=True)
class Sampling:
    """How to pick each token: greedy when `temperature` is 0."""

    temperature: float = 0.0
    top_p: float = 0.95
    top_k: int = 40
    seed: int | None = None


@dataclass(slots=True)
class Decoded:
    """How a decode ended: `stop` (end of turn) or `length` (max_tokens or the context window), and counts."""

    finish_reason: str = "stop"
    prompt_tokens: int = 0
    evaluated_tokens: int = 0
    """Prompt tokens actually evaluated (the rest came from the KV cache)."""
    completion_tokens: int = 0


class Grammar:
    """A GBNF grammar as a llama.cpp sampler, checked one token at a time."""

    def __init__(self, llm: llama_cpp.Llama, gbnf: str, root: str = "root") -> None:
        self._vocab = llm._model.vocab
        self._ptr = ll.llama_sampler_init_grammar(self._vocab, gbnf.encode(), root.encode())
        if not self._ptr:
            raise ValueError(f"invalid grammar:\n{gbnf}")
        self._one = (llama_cpp.llama_token_data * 1)()
        self._one_array = llama_cpp.llama_token_data_array(data=self._one, size=1, selected=-1, sorted=False)

    def allows(self, token: int) -> bool:
        self._one[0].id, self._one[0].logit, self._one[0].p = token, 0.0, 0.0
        self._one_array.size, self._one_array.selected = 1, -1
        ll.llama_sampler_apply(self._ptr, ctypes.byref(self._one_array))
        return self._one[0].logit != -np.inf

    def mask(self, data: np.ndarray) -> None:
        """Set the logit of every token the grammar rejects to -inf (`data` is a token-data array)."""
        pointer = data.ctypes.data_as(llama_cpp.llama_token_data_p)
        array = llama_cpp.llama_token_data_array(data=pointer, size=len(data), selected=-1, sorted=False)
        ll.llama_sampler_apply(self._ptr, ctypes.byref(array))

    def accept(self, token: int) -> None:
        ll.llama_sampler_accept(self._ptr, token)

    def close(self) -> None:
        if self._ptr:
            ll.llama_sampler_free(self._ptr)
            self._ptr = None

    def __del__(self) -> None:
        self.close()


def cache_dir() -> Path | None:
    """Where prefix snapshots are kept: `RINGLET_CACHE_DIR` (empty: nowhere), else the user's cache."""
    configured = os.environ.get("RINGLET_CACHE_DIR")
    if configured is not None:
        return Path(configured).expanduser() / "kv" if configured else None
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "ringlet" / "kv"


class Snapshots:
    """KV snapshots of prompt prefixes for sequence 0 of one model's context: a few in memory, more on
    disk (keyed by the model file and the prefix's tokens)."""

    def __init__(self, llm: llama_cpp.Llama) -> None:
        self.llm = llm
        path = Path(llm.model_path)
        stat = path.stat()
        self._model_id = f"{path.resolve()}:{stat.st_size}:{int(stat.st_mtime)}"
        self._memory: OrderedDict[tuple[int, ...], bytes] = OrderedDict()

    def _file(self, prefix: list[int]) -> Path | None:
        folder = cache_dir()
        if folder is None:
            return None
        digest = hashlib.sha256(self._model_id.encode() + np.asarray(prefix, dtype=np.int32).tobytes())
        return folder / f"{digest.hexdigest()[:32]}.kv"

    def save(self, prefix: list[int]) -> None:
        """Keep the state of sequence 0, which holds exactly `prefix`."""
        ctx = self.llm._ctx.ctx
        size = ll.llama_state_seq_get_size(ctx, 0)
        buffer = (ctypes.c_uint8 * size)()
        if ll.llama_state_seq_get_data(ctx, buffer, size, 0) != size:
            return
        self._memory[tuple(prefix)] = bytes(buffer)
        while len(self._memory) > MEMORY_SNAPSHOTS:
            self._memory.popitem(last=False)
        file = self._file(prefix)
        if file is None or file.exists():
            return
        try:
            file.parent.mkdir(parents=True, exist_ok=True)
            partial = file.with_suffix(f".{os.getpid()}.tmp")
            tokens = (llama_cpp.llama_token * len(prefix))(*prefix)
            if ll.llama_state_seq_save_file(ctx, str(partial).encode(), 0, tokens, len(prefix)):
                partial.replace(file)
            for old in sorted(file.parent.glob("*.kv"), key=lambda p: p.stat().st_mtime)[:-DISK_SNAPSHOTS]:
                old.unlink(missing_ok=True)
        except OSError as exc:  # a read-only or full disk: only the in-memory snapshot is kept
            log.debug("cannot keep a prefix snapshot in %s: %s", file.parent, exc)

    def restore(self, prefix: list[int]) -> bool:
        """Put the snapshot of `prefix` into sequence 0 (cleared first); False when there is none."""
        llm, ctx = self.llm, self.llm._ctx.ctx
        data = self._memory.get(tuple(prefix))
        file = self._file(prefix) if data is None else None
        if data is None and (file is None or not file.is_file()):
            return False
        ll.llama_memory_seq_rm(llm._ctx.memory, 0, -1, -1)
        if data is not None:
            self._memory.move_to_end(tuple(prefix))
            buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
            ok = ll.llama_state_seq_set_data(ctx, buffer, len(data), 0) > 0
        else:
            assert file is not None
            tokens = (llama_cpp.llama_token * len(prefix))()
            count = ctypes.c_size_t(0)
            ok = ll.llama_state_seq_load_file(ctx, str(file).encode(), 0, tokens, len(prefix),
                                                     ctypes.byref(count)) > 0
            ok = ok and list(tokens[:count.value]) == prefix
            if ok:
                os.utime(file)
        if not ok:
            ll.llama_memory_seq_rm(llm._ctx.memory, 0, -1, -1)
            llm.n_tokens = 0
            return False
        llm.input_ids[:len(prefix)] = prefix
        llm.n_tokens = len(prefix)
        if data is None:
            self.save(prefix)  # and in memory from now on
        return True


class RepeatGuard:
    """Holds back the last `span` characters of a reply and ends it when they copy an earlier part of
    the reply: the copy, from where it began, is dropped (it was never streamed), so what was sent says
    each thing once. Checked after every piece, so a copy is noticed when it first reaches `span`
    characters, while all of it is still held back."""

    def __init__(self, span: int = 32) -> None:
        self.span = span
        self.text = ""
        self.sent = 0
        self.repeated = False

    def feed(self, piece: str) -> str:
        """Take a decoded piece; return what may be sent now ("" once a repetition was found)."""
        self.text += piece
        text, n = self.text, len(self.text)
        earlier = text.rfind(text[-self.span:], 0, n - 1) if n > self.span else -1
        if earlier < 0:
            return self._take(n - self.span)
        start = n - self.span  # text[start:] copies text[earlier:]; both may begin sooner
        while earlier > 0 and text[earlier - 1] == text[start - 1]:
            start, earlier = start - 1, earlier - 1
        self.repeated = True
        return self._take(start)

    def flush(self) -> str:
        """What is left to send once the reply ended (nothing after a repetition)."""
        return "" if self.repeated else self._take(len(self.text))

    def _take(self, end: int) -> str:
        end = max(end, self.sent)
        out, self.sent = self.text[self.sent:end], end
        return out


class Decoder:
    """Decodes from one loaded model. Not thread-safe: the caller holds the model's lock."""

    def __init__(self, llm: llama_cpp.Llama) -> None:
        self.llm = llm
        self.snapshots = Snapshots(llm)
        self.n_vocab = llm.n_vocab()
        self._vocab = llm._model.vocab
        self._pieces: dict[int, bytes] = {}
        self._data = np.zeros(self.n_vocab, dtype=_TOKEN_DATA)
        self._data["id"] = np.arange(self.n_vocab, dtype=np.intc)
        self._buffer = ctypes.create_string_buffer(64)

    def tokenize(self, text: str) -> list[int]:
        return self.llm.tokenize(text.encode(), add_bos=False, special=True)

    def piece(self, token: int) -> bytes:
        if token not in self._pieces:
            n = ll.llama_token_to_piece(self._vocab, token, self._buffer, len(self._buffer), 0, False)
            self._pieces[token] = self._buffer.raw[:max(n, 0)]
        return self._pieces[token]

    def prime(self, tokens: list[int], keep: int = 0) -> int:
        """Evaluate `tokens`, reusing the KV cache of the longest prefix shared with what is evaluated now,
        or the snapshot of their first `keep` tokens (made now if there is none). Returns how many tokens
        were evaluated."""
        llm = self.llm
        if len(tokens) >= llm.n_ctx():
            raise ValueError(f"the prompt ({len(tokens)} tokens) does not fit the context window ({llm.n_ctx()})")
        keep = min(keep, len(tokens) - 1)  # evaluate at least one token: its logits come next
        cached = llm.input_ids[:llm.n_tokens]
        same = 0
        limit = min(len(cached), len(tokens) - 1)
        while same < limit and cached[same] == tokens[same]:
            same += 1
        if same < keep and self.snapshots.restore(tokens[:keep]):
            same = keep
        elif not llm._ctx.kv_cache_seq_rm(-1, same, -1):
            llm.reset()
            same = 0
        llm.n_tokens = same
        evaluated = 0
        if same < keep:  # the fixed prefix first, to keep a snapshot of it
            llm.eval(tokens[same:keep])
            self.snapshots.save(tokens[:keep])
            evaluated, same = keep - same, keep
        llm.eval(tokens[same:])
        return evaluated + len(tokens) - same

    def _logits(self) -> np.ndarray:
        pointer = ll.llama_get_logits_ith(self.llm._ctx.ctx, -1)
        return np.ctypeslib.as_array(pointer, shape=(self.n_vocab,))

    def _pick(self, logits: np.ndarray, sampling: Sampling, rng: np.random.Generator) -> int:
        if sampling.temperature <= 0:
            return int(np.argmax(logits))
        k = min(sampling.top_k or self.n_vocab, self.n_vocab)
        top = np.argpartition(logits, -k)[-k:] if k < self.n_vocab else np.arange(self.n_vocab)
        top = top[np.isfinite(logits[top])]
        scaled = logits[top] / sampling.temperature
        probs = np.exp(scaled - scaled.max())
        probs /= probs.sum()
        order = np.argsort(-probs)
        keep = order[:max(1, int(np.searchsorted(np.cumsum(probs[order]), sampling.top_p) + 1))]
        chosen = rng.choice(keep, p=probs[keep] / probs[keep].sum())
        return int(top[chosen])

    def _next(self, grammar: Grammar | None, sampling: Sampling, rng: np.random.Generator,
              boosts: dict[int, float] | None = None) -> int:
        logits = self._logits()
        if boosts:
            logits = logits.copy()
            for token, boost in boosts.items():
                logits[token] += boost
        token = self._pick(logits, sampling, rng)
        if grammar is None or grammar.allows(token):
            return token
        self._data["logit"] = logits  # the grammar rejected it: mask the vocabulary and pick again
        grammar.mask(self._data)
        token = self._pick(self._data["logit"], sampling, rng)
        if not np.isfinite(self._data["logit"][token]):
            raise RuntimeError("the grammar allows no token here")
        return token

    def decode(self, tokens: list[int], *, max_tokens: int, grammar: Grammar | None = None,
               sampling: Sampling | None = None, stop: threading.Event | None = None,
               result: Decoded | None = None, bias: Bias | None = None, keep: int = 0,
               guard: RepeatGuard | None = None) -> Iterator[str]:
        """Evaluate the prompt `tokens`, then yield the reply's text as it is decoded, up to the end of
        the turn (not included) or `max_tokens`. `result` (if given) is filled in as it goes; `bias`
        (if given) adjusts the logits at each step from the text so far; the first `keep` tokens are a
        prefix worth a snapshot; `guard` (if given) holds back the reply's last characters and ends it
        (`length`) without its repetition once it starts repeating itself."""
        pieces = self._decode(tokens, max_tokens=max_tokens, grammar=grammar, sampling=sampling, stop=stop,
                              result=result, bias=bias, keep=keep)
        if guard is None:
            yield from pieces
            return
        for piece in pieces:
            if out := guard.feed(piece):
                yield out
            if guard.repeated:
                pieces.close()
                if result is not None:
                    result.finish_reason = "length"
                return
        if out := guard.flush():
            yield out

    def _decode(self, tokens: list[int], *, max_tokens: int, grammar: Grammar | None, sampling: Sampling | None,
                stop: threading.Event | None, result: Decoded | None, bias: Bias | None,
                keep: int) -> Generator[str, None, None]:
        sampling = sampling or Sampling()
        result = result if result is not None else Decoded()
        result.prompt_tokens = len(tokens)
        result.evaluated_tokens = self.prime(tokens, keep)
        rng = np.random.default_rng(sampling.seed)
        text = codecs.getincrementaldecoder("utf-8")(errors="replace")
        n_ctx = self.llm.n_ctx()
        result.finish_reason = "length"
        so_far: list[str] = []
        for _ in range(max_tokens):
            if stop is not None and stop.is_set():
                return
            token = self._next(grammar, sampling, rng, bias("".join(so_far)) if bias else None)
            if ll.llama_vocab_is_eog(self._vocab, token):
                result.finish_reason = "stop"
                break
            if grammar is not None:
                grammar.accept(token)
            result.completion_tokens += 1
            if piece := text.decode(self.piece(token)):
                so_far.append(piece)
                yield piece
            if self.llm.n_tokens + 1 >= n_ctx:
                break
            self.llm.eval([token])
        if tail := text.decode(b"", final=True):
            yield tail


class CopyBias:
    """Favours copying from `source` while writing a string argument: once the string written so far
    ends with at least `min_match` characters found in `source`, the token that continues that span
    gets `boost` added to its logit. Small models often know to copy (a URL, an expression, a place)
    and then drift after a few characters (`http` becomes `https://www.…`); the model still chooses."""

    def __init__(self, decoder: Decoder, source: str, prefix: str = "", *, min_match: int = 4,
                 boost: float = 6.0) -> None:
        self.decoder, self.source, self.prefix = decoder, source, prefix
        self.min_match, self.boost = min_match, boost

    def __call__(self, text: str) -> dict[int, float]:
        written = self.prefix + text
        if written.count('"') % 2 == 0:
            return {}  # not inside a string (the grammar allows no escaped quotes)
        value = written[written.rfind('"') + 1:]
        for start in range(len(value) - self.min_match + 1):
            at = self.source.rfind(value[start:])
            if at >= 0:
                rest = self.source[at + len(value) - start:][:24]
                tokens = self.decoder.tokenize(rest) if rest else []
                return {tokens[0]: self.boost} if tokens else {}
        return {}
