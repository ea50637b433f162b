"""`ringlet models`: each provider, whether it is usable here and, if not, what would make it usable.

Usable means the extra is installed, a key is set where one is needed, and, for a provider served by a
local server (Ollama, or `OPENAI_BASE_URL` without a key), that the server answers a quick GET.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import httpx
from rich import box
from rich.console import Console
from rich.table import Table

from ringlet.models.providers import PROVIDERS, Provider, default_model, has_key, installed

PROBE_TIMEOUT_S = 1.0


@dataclass(frozen=True, slots=True)
class Status:
    provider: Provider
    problems: tuple[str, ...]
    """Short reasons it is not usable (none: usable)."""
    hints: tuple[str, ...]
    """What to do about each problem, in full."""


def ollama_host() -> str:
    """Where `ollama:` models are served (`OLLAMA_HOST`, default 127.0.0.1:11434), as a base URL."""
    host = os.environ.get("OLLAMA_HOST", "http://127.0.0.1:11434")
    return (host if "://" in host else f"http://{host}").rstrip("/")


def answers(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether an HTTP server answers a GET of `url` (any status below 500) within `timeout_s`."""
    try:
        return httpx.get(url, timeout=timeout_s).status_code < 500
    except httpx.HTTPError:
        return False


def _server(p: Provider) -> tuple[str, str] | None:
    """(base URL, path to probe) when the provider's models are served locally, without a key; else None."""
    if p.name == "ollama":
        return ollama_host(), "/api/tags"
    base = os.environ.get("OPENAI_BASE_URL")
    if p.name == "openai" and base and not os.environ.get("OPENAI_API_KEY"):
        return base.rstrip("/"), "/models"
    return None


def status(p: Provider) -> Status:
    problems: list[str] = []
    hints: list[str] = []
    if not installed(p):
        problems.append("extra missing")
        hints.append(f"pip install 'ringlet[{p.extra}]'")
    if not has_key(p):
        problems.append("no key")
        hints.append(f"set {' or '.join(p.key_env)}"
                     + (" (the base URL of an OpenAI-compatible server)" if p.name == "openai" else ""))
    elif installed(p) and (server := _server(p)) is not None and not answers(server[0] + server[1]):
        problems.append("no server")
        hints.append(f"nothing answers at {server[0]}: start the server, or set "
                     + ("OLLAMA_HOST" if p.name == "ollama" else "OPENAI_BASE_URL") + " to where it runs")
    return Status(p, tuple(problems), tuple(hints))


def print_models(out: Console) -> None:
    """The table, then one unbroken line of hints per provider that is not usable, then the default."""
    statuses = [status(p) for p in PROVIDERS.values()]
    rows = [(s.provider.name, "no" if s.problems else "yes", ", ".join(s.problems), s.provider.example)
            for s in statuses]
    table = Table("provider", "usable", "why not", "example", box=box.SIMPLE_HEAD)
    for i, column in enumerate(table.columns):  # on a narrow terminal only the example is cut short
        column.no_wrap = True
        if i < 3:
            column.min_width = max(len(str(column.header)), *(len(row[i]) for row in rows))
    for row in rows:
        table.add_row(*row)
    out.print(table)
    for s in statuses:
        if s.hints:  # soft_wrap: the console never breaks a hint inside
            out.print(f"{s.provider.name}: {'; '.join(s.hints)}", soft_wrap=True, markup=False, highlight=False)
    out.print(f"default model: {default_model()}", soft_wrap=True, markup=False)
