"""Choosing between answering and calling a tool, for a small local model: the noisy channel.

Asked directly ("answer, or which tool?"), SmolLM2-135M chooses barely better than chance (12 of 25
bench prompts routed right). Asked the other way round it does well (24 of 25, and 19 of 20 prompts it
was not tuned on): each route (answering, or one tool) has a short context, a line saying what the
route is for and a few example requests, and the route whose context makes the user's message most
likely wins, `argmax_r log P(message | context_r) + prior_r`. A model copies what it has just seen well,
and that is what this asks of it.

Each route's context stays evaluated in its own sequence of a second llama.cpp context on the same
weights, so a message costs one batched evaluation of its tokens in every route (~20 tokens each).
"""

from __future__ import annotations

from typing import Any

import llama_cpp
import numpy as np
from llama_cpp import _internals

ll: Any = llama_cpp
"""llama.cpp's C API, untyped here (its ctypes stubs reject plain ints where the C API takes them)."""

MAX_MESSAGE_TOKENS = 96
"""Only the end of a longer message is scored."""
SEQ_CELLS = 512
"""KV cells per route: its context and the message."""


def _log_softmax(rows: np.ndarray) -> np.ndarray:
    rows = rows.astype(np.float64)
    top = rows.max(axis=-1, keepdims=True)
    return rows - top - np.log(np.exp(rows - top).sum(axis=-1, keepdims=True))


class Router:
    """Scores a message under each route's context; not thread-safe (the caller holds the model's lock)."""

    def __init__(self, llm: llama_cpp.Llama, contexts: dict[str, str]) -> None:
        self.llm = llm
        self.routes = list(contexts)
        self.n_vocab = llm.n_vocab()
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = SEQ_CELLS * len(self.routes)
        params.n_batch = params.n_ubatch = SEQ_CELLS
        params.n_seq_max = len(self.routes)
        params.kv_unified = False
        params.n_threads = params.n_threads_batch = llm.context_params.n_threads
        self._ctx = _internals.LlamaContext(model=llm._model, params=params, verbose=False)
        self._batch = _internals.LlamaBatch(n_tokens=SEQ_CELLS, embd=0, n_seq_max=len(self.routes), verbose=False)
        self._lengths: list[int] = []
        self._first: list[np.ndarray] = []
        """Per route, the log-probabilities of the token after its context."""
        for seq, route in enumerate(self.routes):
            tokens = self._tokenize(contexts[route])[:SEQ_CELLS - MAX_MESSAGE_TOKENS]
            self._decode([(seq, tokens, 0)], last_only=True)
            self._lengths.append(len(tokens))
            self._first.append(_log_softmax(self._row(-1)))

    def _tokenize(self, text: str) -> list[int]:
        return self.llm.tokenize(text.encode(), add_bos=False, special=False)

    def _row(self, index: int) -> np.ndarray:
        pointer = ll.llama_get_logits_ith(self._ctx.ctx, index)
        return np.ctypeslib.as_array(pointer, shape=(self.n_vocab,)).copy()

    def _decode(self, parts: list[tuple[int, list[int], int]], *, last_only: bool) -> None:
        """Evaluate each `(seq, tokens, first position)` in one batch; logits for every token unless
        `last_only` (then for the last token of the batch)."""
        b = self._batch.batch
        b.n_tokens = 0
        for seq, tokens, start in parts:
            for i, token in enumerate(tokens):
                j = b.n_tokens
                b.token[j], b.pos[j], b.n_seq_id[j] = token, start + i, 1
                b.seq_id[j][0] = seq
                b.logits[j] = not last_only
                b.n_tokens += 1
        b.logits[b.n_tokens - 1] = True
        self._ctx.decode(self._batch)

    def scores(self, message: str) -> dict[str, float]:
        """`log P(message | context)` for every route."""
        tokens = self._tokenize(message.strip() + "\n")[-MAX_MESSAGE_TOKENS:]
        per_seq = min(len(tokens), SEQ_CELLS // len(self.routes))  # one batch holds every route's copy
        tokens = tokens[-per_seq:]
        for seq, length in enumerate(self._lengths):
            ll.llama_memory_seq_rm(self._ctx.memory, seq, length, -1)
        self._decode([(seq, tokens, self._lengths[seq]) for seq in range(len(self.routes))], last_only=False)
        out = {}
        n = len(tokens)
        for seq, route in enumerate(self.routes):
            rows = np.stack([self._row(seq * n + i) for i in range(n - 1)]) if n > 1 else np.empty((0, self.n_vocab))
            total = self._first[seq][tokens[0]]
            if n > 1:
                total += _log_softmax(rows)[np.arange(n - 1), tokens[1:]].sum()
            out[route] = float(total)
        return out

    def choose(self, message: str, prior: dict[str, float] | None = None) -> str:
        scores = self.scores(message)
        return max(self.routes, key=lambda r: scores[r] + (prior or {}).get(r, 0.0))

    def close(self) -> None:
        self._batch.close()
        self._ctx.close()
