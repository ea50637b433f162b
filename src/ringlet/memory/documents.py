"""Knowledge bases of documents (a graph's `rag` nodes, a Loki agent's `documents`), kept in ringlet's store
through `Memory` (keyword search, plus vectors when an `embedding_model` is named).

Each has its own realm (`graph-kb:<agent>/<node>`; a loop agent's node is `documents`). It is built when
the agent loads or first runs, and rebuilt when the content hash of its documents (or its build settings)
changes. Documents are read as Loki reads them: files, directories (recursively), globs, URLs, `loader:path`.
"""

from __future__ import annotations

import asyncio
import glob
import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ringlet.errors import ConfigError

if TYPE_CHECKING:
    from ringlet.store.memory_records import MemoryNode

__all__ = ["DEFAULT_CHUNK", "DEFAULT_OVERLAP", "KnowledgeBase", "load_documents", "local_matches", "missing",
           "split"]

log = logging.getLogger("ringlet.graph")

DEFAULT_CHUNK, DEFAULT_OVERLAP = 1500, 150
LOADERS = ("text", "file")
KB_LABEL, CHUNK_LABEL = "KnowledgeBase", "Chunk"


def split(text: str, size: int, overlap: int) -> list[str]:
    """Chunks of `size` characters that overlap by `overlap`."""
    if len(text) <= size:
        return [text] if text.strip() else []
    step, out, start = max(1, size - overlap), [], 0
    while True:
        out.append(text[start:start + size])
        if start + size >= len(text):
            return out
        start += step


async def _fetch(url: str) -> str:
    """A URL's readable text, through web_fetch's checks (public addresses only, size and time limits)."""
    from ringlet.errors import ToolFailure
    from ringlet.tools.builtin.web import fetch

    try:
        return str((await fetch(url))["content"])
    except ToolFailure as exc:
        raise ConfigError(f"rag document {url}: cannot fetch: {exc.message}") from None


def _files(path: Path) -> list[Path]:
    """A file itself, or every file under a directory (recursively, hidden ones left out), sorted."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        return []
    return sorted(p for p in path.rglob("*") if p.is_file()
                  and not any(part.startswith(".") for part in p.relative_to(path).parts))


def _readable(path: Path) -> str | None:
    """A document's text; None for a binary file (one with NUL bytes), which is left out with a warning."""
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        log.warning("rag document %s: left out, it is not text", path)
        return None
    return data.decode("utf-8", errors="replace")


def _pattern(entry: str) -> str:
    """The path or glob of an entry, without its `loader:` prefix (checked)."""
    loader, sep, rest = entry.partition(":")
    if sep and len(loader) > 1:  # not a Windows drive letter
        if loader not in LOADERS:
            raise ConfigError(f"rag document {entry!r}: unknown loader '{loader}' (supported: {', '.join(LOADERS)})")
        return rest
    return entry


def missing(entry: str, directory: Path) -> str | None:
    """Why a local entry names nothing, if it does not: a path that does not exist is an error (the validator
    reports it); a glob or a directory that holds no file is only empty (`local_matches` warns)."""
    if entry.startswith(("http://", "https://")):
        return None
    pattern = _pattern(entry)
    if glob.has_magic(pattern) or (directory / pattern).exists():
        return None
    return f"rag document '{entry}' does not exist: no file or directory {directory / pattern}"


def local_matches(entry: str, directory: Path) -> list[Path]:
    """The files a document entry names, as Loki reads it: a file, a directory (every file under it,
    recursively), a glob (`**` recursive), or `loader:` before any of these; relative to the agent directory.
    A path that does not exist is an error."""
    problem = missing(entry, directory)
    if problem is not None:
        raise ConfigError(problem)
    found: dict[Path, None] = {}
    for match in sorted(glob.glob(str(directory / _pattern(entry)), recursive=True)):
        found |= dict.fromkeys(_files(Path(match)))
    return list(found)


def _local(entry: str, directory: Path) -> list[tuple[str, str]]:
    out, matches = [], local_matches(entry, directory)
    if not matches:
        log.warning("rag document '%s' names no file under %s; it adds nothing to the knowledge base", entry,
                    directory)
    for path in matches:
        text = _readable(path)
        if text is not None:
            source = str(path.relative_to(directory)) if path.is_relative_to(directory) else str(path)
            out.append((source, text))
    return out


async def load_documents(entries: list[str], directory: Path) -> list[tuple[str, str]]:
    """(source, text) for each document: files and globs, `loader:path` with the `text` loader, and URLs
    (their readable text, as web_fetch gives it)."""
    out: list[tuple[str, str]] = []
    for entry in entries:
        if entry.startswith(("http://", "https://")):
            out.append((entry, await _fetch(entry)))
        else:
            out += await asyncio.to_thread(_local, entry, directory)
    return out


class Sources(Protocol):
    """What a knowledge base is built from (a graph's `RagNode`, a loop agent's `documents`)."""

    documents: list[str]
    embedding_model: str | None
    chunk_size: int | None
    chunk_overlap: int | None

    @property
    def fully_specified(self) -> bool: ...


@dataclass
class KnowledgeBase:
    """One knowledge base in a `Memory` (its store and embedding provider)."""

    agent: str
    node_id: str
    node: Sources
    directory: Path
    memory: Any
    """A `ringlet.memory.Memory`."""

    @property
    def scope(self) -> Any:
        from ringlet.store.memory_records import Scope

        return Scope("graph-kb", f"{self.agent}/{self.node_id}")

    def digest(self, documents: list[tuple[str, str]]) -> str:
        node = self.node
        settings = [node.embedding_model, node.chunk_size, node.chunk_overlap]
        h = hashlib.sha256(json.dumps(settings).encode())
        for source, text in documents:
            h.update(source.encode() + b"\0" + text.encode() + b"\0")
        return h.hexdigest()

    async def _meta(self) -> MemoryNode | None:
        records = await self.memory.records()
        found = await records.find(self.scope, labels=[KB_LABEL], limit=1)
        return found[0] if found else None

    async def ensure_built(self, confirm: Callable[[str], bool] | None = None) -> bool:
        """Build (or rebuild) when missing or stale; True when it built. An unbuilt base whose node does not
        say how to build it needs `confirm` (a terminal) to build with defaults."""
        documents = await load_documents(self.node.documents, self.directory)
        if not documents:
            log.warning("the knowledge base of rag node '%s' (agent '%s') has no documents: retrieval will "
                        "return nothing", self.node_id, self.agent)
        digest = self.digest(documents)
        meta = await self._meta()
        if meta is not None and meta.properties.get("hash") == digest:
            return False
        if meta is None and not self.node.fully_specified:
            question = (f"Build the knowledge base of rag node '{self.node_id}' with default settings "
                        f"(chunk_size {DEFAULT_CHUNK}, chunk_overlap {DEFAULT_OVERLAP})?")
            if confirm is None or not confirm(question):
                raise ConfigError(f"Agent '{self.agent}' requires RAG for rag node '{self.node_id}', but its "
                                  "knowledge base is not built and the node does not fully specify how to build it")
        await self._build(documents, digest, meta)
        return True

    async def _build(self, documents: list[tuple[str, str]], digest: str, meta: MemoryNode | None) -> None:
        records, scope = await self.memory.records(), self.scope
        for old in await records.find(scope, labels=[CHUNK_LABEL], limit=1_000_000):
            await records.delete_node(scope, old.id)
        size = self.node.chunk_size or DEFAULT_CHUNK
        overlap = self.node.chunk_overlap if self.node.chunk_overlap is not None else DEFAULT_OVERLAP
        pieces = [(source, chunk) for source, text in documents for chunk in split(text, size, overlap)]
        vectors = await self.memory.embed([c for _, c in pieces])
        for i, (source, chunk) in enumerate(pieces):
            await records.put_node(scope, labels=[CHUNK_LABEL], title=f"{source} #{i}", content=chunk,
                                   properties={"source": source},
                                   embedding=None if vectors is None else vectors[i])
        await records.put_node(scope, labels=[KB_LABEL], title=self.node_id, content="",
                               id=meta.id if meta else None, properties={"hash": digest, "chunks": len(pieces)})

    async def query(self, text: str, top_k: int) -> dict[str, Any]:
        """`{context, sources}`: the best chunks' text, and their documents in rank order."""
        hits, _ = await self.memory.search(self.scope, text, types=[CHUNK_LABEL], limit=top_k)
        records = await self.memory.records()
        nodes = await records.get_nodes(self.scope, [h.id for h in hits])
        chosen = [nodes[h.id] for h in hits if h.id in nodes]
        sources = list(dict.fromkeys(n.properties.get("source", "") for n in chosen))
        return {"context": "\n\n".join(n.content for n in chosen), "sources": sources}
