"""Where MCP OAuth tokens are kept: per user, in that user's realm, per server, encrypted at rest.

    vault = FileVault(Path("~/.ringlet/mcp-tokens").expanduser())   # or MemoryVault(), or the server's store
    tokens = UserTokens(vault, Sealer(key), realm="default", user="ana", server="files")
    # `tokens` is the SDK's `TokenStorage` for ana's connection to `files` (`ringlet.mcp.oauth`)

Each (realm, user, server) has one sealed record: the tokens and the client registration, as JSON encrypted
with Fernet (AES-128-CBC + HMAC-SHA256, `cryptography`) under a key from the settings. Records are filed
under a hash of their owner, so a vault's listing names no one. A record that does not open (another key,
tampered with, another owner's record) is no record: the user connects again. Nothing here logs a token.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Protocol

from ringlet.errors import ConfigError

__all__ = ["FileVault", "MemoryVault", "Sealer", "TokenVault", "UserTokens", "new_key"]

log = logging.getLogger("ringlet.mcp")


class TokenVault(Protocol):
    """Sealed records by name (the names are hashes, the records ciphertext)."""

    async def read(self, name: str) -> bytes | None: ...

    async def write(self, name: str, blob: bytes) -> None: ...

    async def delete(self, name: str) -> None: ...


class MemoryVault:
    """Records in memory (a library run; a test)."""

    def __init__(self) -> None:
        self.records: dict[str, bytes] = {}

    async def read(self, name: str) -> bytes | None:
        return self.records.get(name)

    async def write(self, name: str, blob: bytes) -> None:
        self.records[name] = blob

    async def delete(self, name: str) -> None:
        self.records.pop(name, None)


class FileVault:
    """Records as files in a folder only their owner may read (mode 0700, files 0600): the CLI's."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def _path(self, name: str) -> Path:
        return self.folder / f"{name}.sealed"

    async def read(self, name: str) -> bytes | None:
        try:
            return await asyncio.to_thread(self._path(name).read_bytes)
        except FileNotFoundError:
            return None

    async def write(self, name: str, blob: bytes) -> None:
        await asyncio.to_thread(self._write, name, blob)

    def _write(self, name: str, blob: bytes) -> None:
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        temporary = self.folder / f".{name}.{os.getpid()}"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(blob)
        temporary.replace(self._path(name))  # whole or not at all

    async def delete(self, name: str) -> None:
        await asyncio.to_thread(self._path(name).unlink, missing_ok=True)


def new_key() -> str:
    """A new key for `Sealer` (what `RINGLET_MCP_TOKEN_KEY` holds)."""
    from cryptography.fernet import Fernet

    return Fernet.generate_key().decode()


class Sealer:
    """Encrypts and decrypts records with the settings' key; several keys (comma-separated) rotate: the first
    seals, any opens."""

    def __init__(self, keys: str) -> None:
        from cryptography.fernet import Fernet, MultiFernet

        try:
            self._fernet = MultiFernet([Fernet(k.strip().encode()) for k in keys.split(",") if k.strip()])
        except (ValueError, TypeError):
            raise ConfigError("the MCP token key (RINGLET_MCP_TOKEN_KEY) is not a Fernet key: 32 url-safe "
                              "base64-encoded bytes; make one with `python -c \"from ringlet.mcp.tokens import "
                              "new_key; print(new_key())\"`") from None

    def seal(self, record: dict[str, Any], owner: str) -> bytes:
        return self._fernet.encrypt(json.dumps({"owner": owner, **record}).encode())

    def open(self, blob: bytes, owner: str) -> dict[str, Any] | None:
        """The record, or None when it does not open with these keys or belongs to someone else."""
        from cryptography.fernet import InvalidToken

        try:
            record = json.loads(self._fernet.decrypt(blob))
        except (InvalidToken, ValueError):
            log.warning("an MCP token record does not open with the configured key; the user connects again")
            return None
        return record if isinstance(record, dict) and record.get("owner") == owner else None


class UserTokens:
    """The SDK's `TokenStorage` for one user's connection to one server, sealed in a vault."""

    def __init__(self, vault: TokenVault, sealer: Sealer, *, realm: str, user: str | None, server: str) -> None:
        self.vault, self.sealer = vault, sealer
        self.owner = json.dumps([realm, user, server])
        self.name = hashlib.sha256(self.owner.encode()).hexdigest()

    async def _record(self) -> dict[str, Any]:
        blob = await self.vault.read(self.name)
        return (self.sealer.open(blob, self.owner) or {}) if blob is not None else {}

    async def _update(self, **fields: Any) -> None:
        record = await self._record()
        record.pop("owner", None)
        await self.vault.write(self.name, self.sealer.seal({**record, **fields}, self.owner))

    async def get_tokens(self) -> Any:
        from mcp.shared.auth import OAuthToken

        tokens = (await self._record()).get("tokens")
        return OAuthToken.model_validate(tokens) if tokens else None

    async def set_tokens(self, tokens: Any) -> None:
        await self._update(tokens=tokens.model_dump(mode="json", exclude_none=True))

    async def get_client_info(self) -> Any:
        from mcp.shared.auth import OAuthClientInformationFull

        client = (await self._record()).get("client")
        return OAuthClientInformationFull.model_validate(client) if client else None

    async def set_client_info(self, client_info: Any) -> None:
        await self._update(client=client_info.model_dump(mode="json", exclude_none=True))

    async def forget(self) -> None:
        """Disconnect: the record goes."""
        await self.vault.delete(self.name)
