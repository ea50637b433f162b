"""Shared fixtures. Tests reach only loopback: any other connection attempt fails loudly."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from postgres import postgres_server
from ringlet.store import Store
from ringlet.store.schema import metadata

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
    """A private PostgreSQL server for the whole session (see postgres.py)."""
    with postgres_server() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """A migrated store on each engine; PostgreSQL tables are emptied first."""
    if request.param == "sqlite":
        s = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'ringlet.db'}")
    else:
        s = await Store.open(request.getfixturevalue("postgres_url"))
        async with s.engine.begin() as conn:
            for table in reversed(metadata.sorted_tables):
                if table.name != "ringlet_schema":
                    await conn.execute(table.delete())
    yield s
    await s.close()
