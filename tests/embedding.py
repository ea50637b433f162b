"""The shipped sentence-transformers model (all-MiniLM-L6-v2) for the tests that run it, with PyTorch on one
thread: in a suite whose processes already keep both cores busy, PyTorch's second thread spins and waits more
than it computes (the catalog's 120 labelled queries over 1,000 tools: 27.9 s of CPU on two threads, 12.1 s
on one, the same ranking). The model loads once per test process, on first use."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def torch_on_one_thread() -> Iterator[None]:
    """PyTorch's intra-op work on one thread for the session of this process (set back afterwards)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def local_embeddings(torch_on_one_thread: None) -> object:
    """One shipped-model embedder (`LocalEmbeddings()`) for the whole session of this process."""
    from ringlet.memory.embeddings import LocalEmbeddings

    return LocalEmbeddings()
