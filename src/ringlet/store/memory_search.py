"""Memory search (`memory-and-context.md` §2): the read side that ranks and looks up a realm's nodes.

Keyword search is SQLite FTS5 (BM25, the index `memory_records.create_search_index` makes) or PostgreSQL
full-text search; vector search is brute force over the realm's normalised float32 vectors, kept in a
per-process cache that follows the realm's version counter, which every write of `MemoryRecords` bumps
(new rows are appended; an update or delete reloads). Entity names and the version itself are read here too.
Every method takes the caller's `Scope` and filters by it.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import bindparam, column, func, literal_column, select, table, text

from ringlet.store.engine import Conn, Db
from ringlet.store.schema import memory_nodes, memory_terms, memory_versions

if TYPE_CHECKING:  # numpy (~20 MiB) is loaded when memory's vectors are first used, not with the store
    import numpy as np

class Scope(NamedTuple):
    org_id: str
    realm: str

    @property
    def key(self) -> str:
        """A word that stands for this (org, realm) in the keyword index, so a search is filtered inside
        the index rather than after it."""
        return "s" + hashlib.sha256(f"{self.org_id}\x00{self.realm}".encode()).hexdigest()[:24]


_TOKEN = re.compile(r"\w+", re.UNICODE)
MAX_TERMS = 32
COMMON_DOCS = 1000
"""A query word found in this many memories is too common to rank by (see `keyword`)."""
COMMON_TTL_S = 60.0
RANKED_TERMS = 8
"""At most this many words (the rarest) rank a keyword query."""
STOPWORDS = frozenset({
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "can", "do", "does", "for", "from", "had", "has",
    "have", "how", "i", "if", "in", "into", "is", "it", "its", "me", "my", "no", "not", "of", "on", "or", "our",
    "so", "that", "the", "their", "them", "then", "there", "these", "they", "this", "to", "was", "we", "were",
    "what", "when", "where", "which", "who", "why", "will", "with", "would", "you", "your"
})
"""Words too common to rank by: left out of keyword queries (a query of only these keeps them)."""

N, T, V = memory_nodes.c, memory_terms.c, memory_versions.c
_FTS = table("memory_fts", column("rowid"))  # SQLite's FTS5 index (created by `create_search_index`)

# The reads a turn's context notes make, built once (bound parameters): SQLAlchemy then only looks up their
# compiled form, instead of building each statement again per call.
_IN_SCOPE = (bindparam("org_id"), bindparam("realm"))
_VERSION = select(V.version, V.rebuild).where(V.org_id == _IN_SCOPE[0], V.realm == _IN_SCOPE[1])
_RANKED = (select(_FTS.c.rowid, literal_column("rank").label("score")).select_from(_FTS)
           .where(text("memory_fts MATCH :match")).order_by(literal_column("rank")).limit(bindparam("over"))
           .subquery())
"""The best `over` matches of the whole FTS5 index (its fast `ORDER BY rank` path), of every realm."""
_FTS_HITS = (select(N.id, _RANKED.c.score).join(_RANKED, N.seq == _RANKED.c.rowid)
             .where(N.org_id == _IN_SCOPE[0], N.realm == _IN_SCOPE[1]).order_by(_RANKED.c.score)
             .limit(bindparam("limit")))
_FTS_MATCHES = select(func.count()).select_from(_RANKED)


def terms(text_: str) -> list[str]:
    """The distinct words of a query, for an OR keyword search (at most 32)."""
    seen: dict[str, None] = {}
    for word in _TOKEN.findall(text_.lower()):
        if len(word) > 1:
            seen.setdefault(word, None)
    words = [w for w in seen if w not in STOPWORDS] or list(seen)
    return words[:MAX_TERMS]


def has_term(scope: Scope, kind: str, values: Collection[str]) -> Any:
    """A condition on `memory_nodes`: the node has a term of `kind` (label, tag, alias) among `values`."""
    return select(T.seq).where(T.seq == N.seq, T.kind == kind, T.value.in_(list(values)),
                               T.org_id == scope.org_id, T.realm == scope.realm).exists()


def _empty() -> np.ndarray:
    import numpy as np

    return np.zeros((0, 0), np.float32)


@dataclass(eq=False)
class _Vectors:
    version: int = -1
    rebuild: int = -1
    last_seq: int = 0
    ids: list[str] = field(default_factory=list)
    matrix: np.ndarray = field(default_factory=_empty)
    """The first len(ids) rows of `buffer`, which has room to grow."""
    buffer: np.ndarray = field(default_factory=_empty)
    rows: dict[str, int] | None = None


class MemorySearch:
    """Keyword and vector search over the memory tables of one store, with their per-process caches."""

    def __init__(self, db: Db) -> None:
        self.db = db
        self.sqlite = db.engine.dialect.name == "sqlite"
        self._vectors: dict[Scope, _Vectors] = {}
        self._common: dict[str, tuple[float, int]] = {}

    async def keyword(self, scope: Scope, query: str, *, labels: Collection[str] = (), limit: int = 10
                      ) -> list[tuple[str, float]]:
        """(node id, score) by keyword relevance, best first: FTS5 BM25 or PostgreSQL ts_rank. The rarest
        words of the query rank it; words found in very many memories are left out (like stopwords: they
        barely move a BM25 score, and ranking their long posting lists is most of the cost), unless every
        word is such a word."""
        words = terms(query)
        if not words:
            return []
        async with self.db.connect() as conn:
            if len(words) > 1:
                counts = await self._counts(conn, words)
                rare = sorted((w for w in words if counts[w] < COMMON_DOCS), key=counts.__getitem__)
                words = rare[:RANKED_TERMS] or sorted(words, key=counts.__getitem__)[:3]
            if self.sqlite:
                return await self._fts(conn, scope, words, labels, limit)
            tsquery = func.to_tsquery("english", " | ".join(words))
            rank = func.ts_rank(literal_column("memory_nodes.fts"), tsquery)
            stmt = (select(N.id, rank.label("score")).select_from(memory_nodes)
                    .where(literal_column("memory_nodes.fts").op("@@")(tsquery), N.org_id == scope.org_id,
                           N.realm == scope.realm).order_by(rank.desc()))
            if labels:
                stmt = stmt.where(has_term(scope, "label", labels))
            rows = (await conn.execute(stmt.limit(limit))).all()
        return [(r[0], float(r[1])) for r in rows]

    async def _fts(self, conn: Conn, scope: Scope, words: Sequence[str], labels: Collection[str],
                   limit: int) -> list[tuple[str, float]]:
        """FTS5: rank the whole index (FTS5's fast `ORDER BY rank` path), keep this realm's rows; when other
        realms crowd the top out, rank again with the realm's token in the match (exact, slower)."""
        ored = " OR ".join(f'"{w}"' for w in words)
        over = limit * 4
        stmt = _FTS_HITS.where(has_term(scope, "label", labels)) if labels else _FTS_HITS
        for match in (f"{{title content}}: ({ored})", f'scope_key: "{scope.key}" AND {{title content}}: ({ored})'):
            params = {"match": match, "over": over, "limit": limit, "org_id": scope.org_id, "realm": scope.realm}
            rows = (await conn.execute(stmt, params)).all()
            if len(rows) >= limit or ((await conn.execute(_FTS_MATCHES, params)).scalar() or 0) < over:
                break  # enough rows, or the realm-blind ranking already held every match
        return [(r[0], -float(r[1])) for r in rows]

    async def _counts(self, conn: Conn, words: Sequence[str]) -> dict[str, int]:
        """In how many memories each word is, counting up to `COMMON_DOCS` (a bounded cost), all in one
        statement; each count is kept for a minute (common words stay common)."""
        clock = time.monotonic()
        unknown = [w for w in words if clock - self._common.get(w, (-COMMON_TTL_S, 0))[0] >= COMMON_TTL_S]
        if unknown:
            counts = []
            for i, w in enumerate(unknown):
                if self.sqlite:
                    inner = select(_FTS.c.rowid).select_from(_FTS).where(text(f"memory_fts MATCH :m{i}"))
                else:
                    inner = select(N.seq).where(literal_column("memory_nodes.fts").op("@@")(
                        func.to_tsquery("english", w)))
                counts.append(select(func.count()).select_from(inner.limit(COMMON_DOCS).subquery())
                              .scalar_subquery())
            params = {f"m{i}": f'{{title content}}: "{w}"' for i, w in enumerate(unknown)} if self.sqlite else {}
            row = (await conn.execute(select(*counts), params)).one()
            if len(self._common) > 50_000:
                self._common.clear()
            for w, n in zip(unknown, row, strict=True):
                self._common[w] = (clock, n)
        return {w: self._common[w][1] for w in words}

    async def vectors(self, scope: Scope) -> tuple[list[str], np.ndarray]:
        """The realm's node ids and their embeddings (rows of a matrix), from the cache when current."""
        import numpy as np

        cache = self._vectors.setdefault(scope, _Vectors())
        async with self.db.connect() as conn:
            mark = (await conn.execute(_VERSION, {"org_id": scope.org_id, "realm": scope.realm})).first()
            version, rebuild = mark if mark is not None else (0, 0)
            if version == cache.version:
                return cache.ids, cache.matrix
            fresh = rebuild != cache.rebuild
            after = 0 if fresh else cache.last_seq
            rows = (await conn.execute(select(N.seq, N.id, N.embedding).where(
                N.org_id == scope.org_id, N.realm == scope.realm, N.embedding.is_not(None), N.seq > after)
                .order_by(N.seq))).all()
        if rows:
            added = np.frombuffer(b"".join(r.embedding for r in rows), np.float32).reshape(len(rows), -1)
            if fresh or cache.matrix.size == 0:
                cache.ids, cache.buffer = [r.id for r in rows], added.copy()
            else:
                used = len(cache.ids)
                if used + len(rows) > len(cache.buffer):  # grow by half: appends stay amortised O(new rows)
                    size = max(used + len(rows), len(cache.buffer) * 3 // 2)
                    grown = np.empty((size, added.shape[1]), np.float32)
                    grown[:used] = cache.buffer[:used]
                    cache.buffer = grown
                cache.buffer[used:used + len(rows)] = added
                cache.ids = [*cache.ids, *(r.id for r in rows)]
            cache.matrix = cache.buffer[:len(cache.ids)]
            cache.last_seq = rows[-1].seq
        elif fresh:
            cache.ids, cache.matrix, cache.last_seq = [], np.zeros((0, 0), np.float32), 0
            cache.buffer = cache.matrix
        cache.version, cache.rebuild, cache.rows = version, rebuild, None
        return cache.ids, cache.matrix

    async def rows(self, scope: Scope) -> dict[str, int]:
        """Node id → its row in the `vectors()` matrix (as last loaded)."""
        cache = self._vectors.setdefault(scope, _Vectors())
        if cache.rows is None:
            cache.rows = {node_id: i for i, node_id in enumerate(cache.ids)}
        return cache.rows

    async def entity_names(self, scope: Scope) -> dict[str, list[str]]:
        """Lower-cased entity name or alias → the ids of the nodes that carry it."""
        async with self.db.connect() as conn:
            rows = (await conn.execute(select(T.value, N.id).join(memory_nodes, N.seq == T.seq).where(
                T.org_id == scope.org_id, T.realm == scope.realm, T.kind == "alias"))).all()
        out: dict[str, list[str]] = {}
        for value, node_id in rows:
            out.setdefault(value, []).append(node_id)
        return out

    async def version(self, scope: Scope) -> int:
        """The realm's write counter (bumped by every write): a cache of the realm is current while it holds."""
        async with self.db.connect() as conn:
            return (await conn.execute(_VERSION, {"org_id": scope.org_id, "realm": scope.realm})).scalar() or 0


__all__ = ["MemorySearch", "has_term", "terms"]
