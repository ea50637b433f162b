"""Loki's configuration directory, and model names in Loki's form.

Loki names a model `client:model`. A client is one of Loki's client types (`openai`, `claude`, `gemini`,
`ollama`, …), or an entry of the `clients:` list of Loki's `config.yaml` (its `name`, else its `type`):

    clients:
      - type: openai-compatible
        name: office
        api_base: http://gpu-box:8000/v1
        api_key: '{{OFFICE_KEY}}'        # read from that environment variable

so `office:qwen3` is an OpenAI-compatible model at that address. ringlet finds Loki's directory the way
Loki does (`LOKI_CONFIG_DIR`, else `$XDG_CONFIG_HOME/loki`, else `~/.config/loki`), or at `RINGLET_LOKI_DIR`.
"""

from __future__ import annotations

import os
import re
from functools import cache
from pathlib import Path
from typing import Any

from ringlet.errors import ConfigError

__all__ = ["ALIASES", "client", "clients", "loki_dir"]

ALIASES = {"claude": "anthropic"}
"""Loki's client types that ringlet's providers serve under another name."""
_TYPES = {"openai": "openai", "openai-compatible": "openai", "claude": "anthropic", "gemini": "gemini",
          "ollama": "ollama"}
_SECRET = re.compile(r"^\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}$")


def loki_dir() -> Path:
    """Loki's configuration directory: `RINGLET_LOKI_DIR`, `LOKI_CONFIG_DIR`, `$XDG_CONFIG_HOME/loki`, or
    `~/.config/loki` (it need not exist)."""
    for variable in ("RINGLET_LOKI_DIR", "LOKI_CONFIG_DIR"):
        if os.environ.get(variable):
            return Path(os.environ[variable]).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or "~/.config"
    return Path(base).expanduser() / "loki"


def _config_file() -> Path:
    given = os.environ.get("LOKI_CONFIG_FILE")
    return Path(given).expanduser() if given else loki_dir() / "config.yaml"


def clients() -> dict[str, dict[str, Any]]:
    """The `clients:` of Loki's config.yaml by name (empty when there is none)."""
    return _clients(_config_file())


@cache
def _read(path: Path, mtime: float) -> dict[str, dict[str, Any]]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read Loki's config: {exc}") from None
    out = {}
    for i, entry in enumerate(data.get("clients") or [] if isinstance(data, dict) else []):
        if not isinstance(entry, dict) or not isinstance(entry.get("type"), str):
            raise ConfigError(f"{path}: clients[{i}] needs a `type` (openai, openai-compatible, claude, gemini, …)")
        out[str(entry.get("name") or entry["type"])] = entry
    return out


def _clients(path: Path) -> dict[str, dict[str, Any]]:
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return {}
    return _read(path, mtime)


def _secret(value: Any) -> str | None:
    """An `api_key`: literal, or `{{NAME}}` read from the environment."""
    if not isinstance(value, str):
        return None
    match = _SECRET.match(value)
    return os.environ.get(match.group(1)) if match else value


def client(name: str) -> tuple[str, dict[str, Any]] | None:
    """The ringlet provider and its options for Loki client `name` of the config's `clients:`, or None."""
    entry = clients().get(name)
    if entry is None:
        return None
    provider = _TYPES.get(entry["type"])
    if provider is None:
        raise ConfigError(f"Loki client '{name}' is of type '{entry['type']}', which ringlet does not serve "
                          f"(served: {', '.join(_TYPES)})")
    options: dict[str, Any] = {}
    if entry.get("api_base"):
        options["base_url"] = str(entry["api_base"])
    key = _secret(entry.get("api_key"))
    if key:
        options["api_key"] = key
    return provider, options
