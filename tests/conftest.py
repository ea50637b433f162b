"""Shared fixtures. Tests reach only loopback: any other connection attempt fails loudly."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from browser import browser
from embedding import local_embeddings, torch_on_one_thread
from postgres import fresh_database, make_template, postgres_server
from ringlet.store import Store
from scheduling import (
    pytest_addoption,
    pytest_collection_modifyitems,
    pytest_runtest_logreport,
    pytest_terminal_summary,
    pytest_xdist_make_scheduler,
)

# the session's Chromium (browser.py), for the web UI's tests; the embedding model (embedding.py); the order
# xdist hands tests out in and what a run reports of its tests' times (scheduling.py)
__all__ = ["browser", "local_embeddings", "pytest_addoption", "pytest_collection_modifyitems",
           "pytest_runtest_logreport", "pytest_terminal_summary", "pytest_xdist_make_scheduler",
           "torch_on_one_thread"]
_real_connect = socket.socket.connect


def _loopback_only(self: socket.socket, address: object) -> object:
    host = address[0] if isinstance(address, tuple) else None
    if host is not None and self.family in (socket.AF_INET, socket.AF_INET6):
        try:
            allowed = ipaddress.ip_address(host).is_loopback
        except ValueError:
            allowed = host == "localhost"
        if not allowed:
            raise RuntimeError(f"tests may only reach loopback, not {address!r}")
    return _real_connect(self, address)


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket.socket, "connect", _loopback_only)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A private PostgreSQL server for the whole session of this process, with its template database made
    (see postgres.py). The URL is of its `postgres` database."""
    with postgres_server() as url:
        make_template(url)
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """A migrated store on each engine; on PostgreSQL, in a fresh database of its own (postgres.py)."""
    if request.param == "sqlite":
        s = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'ringlet.db'}")
        yield s
        await s.close()
        return
    async with fresh_database(request.getfixturevalue("postgres_url")) as url:
        s = await Store.open(url)
        yield s
        await s.close()
