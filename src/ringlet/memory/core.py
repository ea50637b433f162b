"""`Memory`: the knowledge store of an agent, scoped to the run's realm (`memory-and-context.md` §1–§4).

    memory = Memory("sqlite+aiosqlite:///memory.db", embeddings="local")
    agent = Agent(model, memory=memory)            # memory tools, <memory> and <graph_context> notes

Search is hybrid: keyword search always, vector search when an embedding provider is configured, fused by
reciprocal rank (k = 60). A provider that fails degrades to keywords with a warning notification.
"""

from __future__ import annotations

import asyncio
import html
import logging
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ringlet.context import RunContext
from ringlet.errors import ConfigError
from ringlet.memory.settings import MemoryConfig
from ringlet.models.tokens import estimate_text
from ringlet.store import Store
from ringlet.store.memory_records import MemoryNode, MemoryRecords, Scope
from ringlet.store.memory_search import terms

if TYPE_CHECKING:
    from ringlet.memory.embeddings import Embedder

log = logging.getLogger("ringlet.memory")

RRF_K = 60
CHUNK, OVERLAP, MAX_CHUNKS = 512, 50, 32
_WORD = re.compile(r"\w+")
MAX_ENTITY_WORDS = 6


def scope_of(ctx: RunContext) -> Scope:
    """The run's realm: every memory read and write is filtered by it (tools never choose it)."""
    return Scope(ctx.org_id or "default", ctx.realm)


def chunks(text: str) -> list[str]:
    """512-character chunks with 50 characters of overlap, at most 32."""
    if len(text) <= CHUNK:
        return [text]
    out, start = [], 0
    while start < len(text) and len(out) < MAX_CHUNKS:
        out.append(text[start:start + CHUNK])
        start += CHUNK - OVERLAP
    return out


async def _nothing() -> Any:
    return []


def _scan(matrix: np.ndarray, vector: np.ndarray, pool: int) -> tuple[np.ndarray, list[int]]:
    """Cosine similarity of every row (the rows are unit vectors) and the `pool` best rows, best first."""
    sims = matrix @ vector
    top = np.argpartition(-sims, pool)[:pool] if len(sims) > pool else np.arange(len(sims))
    return sims, top[np.argsort(-sims[top])].tolist()


def escape(text: str) -> str:
    """Stored text inside a note: `<`, `>` and `&` escaped, so it cannot close or open a tag."""
    return html.escape(text, quote=False)


@dataclass(slots=True)
class Hit:
    id: str
    score: float
    similarity: float | None


class Memory:
    """An agent's memory: a store (a `Store`, or a database URL opened on first use), an optional embedding
    provider, and the settings of `MemoryConfig`."""

    def __init__(self, store: Store | str | None = None, *, embeddings: Embedder | str | dict[str, Any] | None = None,
                 config: MemoryConfig | None = None, **options: Any) -> None:
        self.config = config or MemoryConfig(**options)
        if embeddings is None:
            embeddings = self.config.embeddings
        if isinstance(embeddings, str | dict):
            from ringlet.memory.embeddings import resolve_embedder

            embeddings = resolve_embedder(embeddings)
        self.embedder: Embedder | None = embeddings
        self._store = store if isinstance(store, Store) else None
        self._url = store if isinstance(store, str) else None
        self._own = False
        self._opening: asyncio.Lock | None = None
        self._names: dict[Scope, tuple[int, dict[str, list[str]]]] = {}

    def attach(self, store: Store) -> None:
        """Use this store (the server's), unless the memory was given its own."""
        if self._url is None and (self._store is None or self._own):
            self._store, self._own = store, False

    async def records(self) -> MemoryRecords:
        if self._store is None:
            self._opening = self._opening or asyncio.Lock()
            async with self._opening:
                if self._store is None:
                    self._store, self._own = await Store.open(self._url), True
        return self._store.memory

    async def close(self) -> None:
        """Close a store this memory opened itself."""
        if self._own and self._store is not None:
            await self._store.close()
            self._store, self._own = None, False

    # -- embeddings ----------------------------------------------------------------------------------------

    async def embed(self, texts: Sequence[str], ctx: RunContext | None = None) -> np.ndarray | None:
        """Vectors for `texts`, or None without a provider or when it fails (a warning, never an error)."""
        if self.embedder is None or not texts:
            return None
        from ringlet.memory.embeddings import EmbeddingError

        try:
            return await self.embedder.embed(list(texts))
        except EmbeddingError as exc:
            log.warning("embedding provider %s failed, using keyword search: %s", self.embedder.name, exc)
            if ctx is not None:
                ctx.notify("warning", "embeddings unavailable", f"{exc}; searching by keywords only",
                           source="memory")
            return None

    # -- search (discover) ---------------------------------------------------------------------------------

    async def search(self, scope: Scope, query: str, *, types: Collection[str] = (), limit: int = 10,
                     min_similarity: float = 0.0, ctx: RunContext | None = None) -> tuple[list[Hit], str]:
        """Hybrid search: per chunk, keyword and vector rankings fused by reciprocal rank; results whose best
        similarity is below `min_similarity` dropped. Returns the hits and the method used."""
        records = await self.records()
        search = records.search
        pieces = chunks(query)
        pool = limit * (5 if types else 3)
        ids, matrix = await search.vectors(scope) if self.embedder is not None else ([], None)
        vectors = await self.embed(pieces, ctx) if ids else None
        fused: dict[str, float] = {}
        best = None  # every node's best similarity over the chunks, by matrix row
        keyword_used = False
        use_vectors = vectors is not None and matrix is not None and matrix.size > 0
        for i, piece in enumerate(pieces):
            # the keyword query (the store's thread) and the vector scan (numpy, off the event loop) overlap
            keyword = search.keyword(scope, piece, labels=types, limit=pool) if terms(piece) else _nothing()
            scan = asyncio.to_thread(_scan, matrix, vectors[i], pool) if matrix is not None and vectors is not None \
                and use_vectors else _nothing()
            ranked, scanned = await asyncio.gather(keyword, scan)
            keyword_used |= bool(ranked)
            for rank, (node_id, _) in enumerate(ranked):
                fused[node_id] = fused.get(node_id, 0.0) + 1 / (RRF_K + rank + 1)
            if not scanned:
                continue
            sims, top = scanned
            best = sims if best is None else np.maximum(best, sims)
            for rank, j in enumerate(top):
                fused[ids[j]] = fused.get(ids[j], 0.0) + 1 / (RRF_K + rank + 1)
        vector_used = best is not None
        similarity: dict[str, float] = {}
        if best is not None:
            row = await search.rows(scope)
            similarity = {n: float(best[row[n]]) for n in fused if n in row}
        if vector_used and types:  # vector candidates are not filtered by the query: filter them here
            allowed = {n for n, node in (await records.get_nodes(scope, list(fused))).items()
                       if set(node.labels) & set(types)}
            fused = {n: s for n, s in fused.items() if n in allowed}
        hits = [Hit(n, s, similarity.get(n) if vector_used else None) for n, s in fused.items()]
        if vector_used and min_similarity > 0:
            hits = [h for h in hits if h.similarity is not None and h.similarity >= min_similarity]
        hits.sort(key=lambda h: -h.score)
        method = "hybrid" if vector_used and keyword_used else "vector" if vector_used else "keyword"
        return hits[:limit], method

    async def neighbours(self, scope: Scope, node_ids: Sequence[str], depth: int) -> dict[str, list[dict[str, Any]]]:
        """For each node, the nodes up to `depth` hops away: `{id, type, title, relation, direction}`."""
        records = await self.records()
        out: dict[str, list[dict[str, Any]]] = {n: [] for n in node_ids}
        for start in node_ids:
            seen, frontier = {start}, [start]
            for _ in range(depth):
                edges = await records.edges(scope, frontier)
                nxt = []
                for e in edges:
                    for here, there, direction in ((e.src, e.dst, "out"), (e.dst, e.src, "in")):
                        if here in frontier and there not in seen:
                            seen.add(there)
                            nxt.append(there)
                            out[start].append({"id": there, "relation": e.relation, "direction": direction})
                frontier = nxt
                if not frontier:
                    break
            nodes = await records.get_nodes(scope, [r["id"] for r in out[start]])
            out[start] = [{**r, "type": nodes[r["id"]].type, "title": nodes[r["id"]].title}
                          for r in out[start] if r["id"] in nodes]
        return out

    # -- entities ------------------------------------------------------------------------------------------

    async def entities_in(self, scope: Scope, text: str, limit: int) -> list[str]:
        """Ids of graph entities whose name or alias appears in `text` (case-insensitive, whole words)."""
        search = (await self.records()).search
        version = await search.version(scope)
        cached = self._names.get(scope)
        if cached is None or cached[0] != version:
            names = {" ".join(_WORD.findall(k)): v for k, v in (await search.entity_names(scope)).items()}
            cached = self._names[scope] = (version, names)
        names = cached[1]
        if not names:
            return []
        words = [w.lower() for w in _WORD.findall(text)]
        found: dict[str, None] = {}
        for i in range(len(words)):
            for j in range(min(len(words), i + MAX_ENTITY_WORDS), i, -1):  # the longest name first
                for node_id in names.get(" ".join(words[i:j]), ()):
                    found.setdefault(node_id, None)
            if len(found) >= limit:
                break
        return list(found)[:limit]

    # -- context notes (§4) --------------------------------------------------------------------------------

    async def memory_note(self, scope: Scope, message: str, ctx: RunContext | None = None) -> str | None:
        """`<memory>`: the top recalled memories for the message, one line each, within the token cap."""
        top_k = self.config.recall_top_k
        if top_k == 0 or not message.strip():
            return None
        hits, _ = await self.search(scope, message, limit=top_k, ctx=ctx,
                                         min_similarity=self.config.recall_min_similarity)
        if not hits:
            return None
        nodes = await (await self.records()).get_nodes(scope, [h.id for h in hits])
        lines, budget = [], self.config.max_note_tokens
        for h in hits:
            node = nodes.get(h.id)
            if node is None:
                continue
            kind = node.properties.get("kind") or node.type
            text = " ".join(node.content.split())
            line = f"- {node.created_at[:10]} [{escape(str(kind))}]: {escape(text[:300])}"
            budget -= estimate_text(line)
            if budget < 0:
                break
            lines.append(line)
        return "<memory>\n" + "\n".join(lines) + "\n</memory>" if lines else None

    async def graph_note(self, scope: Scope, message: str) -> str | None:
        """`<graph_context realm="…">`: the 1-hop edges of the entities named in the message."""
        graph = self.config.graph
        entity_ids = await self.entities_in(scope, message, graph.max_entities)
        if not entity_ids:
            return None
        records = await self.records()
        edges = await records.edges(scope, entity_ids)
        nodes = await records.get_nodes(scope, {*entity_ids, *(e.src for e in edges), *(e.dst for e in edges)})
        lines, budget = [], self.config.max_note_tokens

        def label(node: MemoryNode) -> str:
            return escape(node.name or node.title)

        for e in edges:
            if len(lines) >= graph.max_edges:
                break
            src, dst = nodes.get(e.src), nodes.get(e.dst)
            if src is None or dst is None:
                continue
            if e.src in entity_ids:
                line = f"{escape(src.type)}: {label(src)} → {escape(e.relation)}: {label(dst)}"
            else:
                line = f"{escape(dst.type)}: {label(dst)} ← {escape(e.relation)}: {label(src)}"
            budget -= estimate_text(line)
            if budget < 0:
                break
            lines.append(line)
        if not lines:
            lines = [f"{escape(nodes[i].type)}: {label(nodes[i])}" for i in entity_ids if i in nodes]
        return f'<graph_context realm="{escape(scope.realm)}">\n' + "\n".join(lines) + "\n</graph_context>"

    async def notes(self, ctx: RunContext, message: str) -> list[tuple[str, str]]:
        """The context notes for a run's incoming message, looked up side by side, each within
        `lookup_timeout_s`; a lookup that fails or times out is left out with a warning notification."""
        scope = scope_of(ctx)

        async def bounded(kind: str, lookup: Callable[[], Any]) -> tuple[str, str | None]:
            try:
                async with asyncio.timeout(self.config.lookup_timeout_s):
                    return kind, await lookup()
            except Exception as exc:
                reason = "timed out" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"
                log.warning("context lookup %s failed for run %s: %s", kind, ctx.run_id, reason)
                ctx.notify("warning", f"{kind} note left out", reason, source="memory")
                return kind, None

        found = await asyncio.gather(bounded("memory", lambda: self.memory_note(scope, message, ctx)),
                                     bounded("graph_context", lambda: self.graph_note(scope, message)))
        return [(kind, note) for kind, note in found if note]


def memory_of(value: Memory | MemoryConfig | bool | dict[str, Any] | None) -> Memory | None:
    """`Agent(memory=…)`: a Memory, a config (a Memory on the default store), True (the defaults) or None."""
    if value is None or value is False:
        return None
    if isinstance(value, Memory):
        return value
    if value is True:
        return Memory()
    if isinstance(value, MemoryConfig):
        return Memory(config=value)
    if isinstance(value, dict):
        return Memory(config=MemoryConfig.model_validate(value))
    raise ConfigError(f"memory must be a Memory, a MemoryConfig, a dict or True, got {value!r}")
