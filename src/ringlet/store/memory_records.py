"""Memory rows (`memory-and-context.md` §1–§2): nodes, edges, labels, tags and entity names, by realm.

Every method takes the caller's `Scope` (org and realm) and every statement filters by it, so a row of
another realm is indistinguishable from a missing one. Keyword search is SQLite FTS5 (BM25) or PostgreSQL
full-text search; vector search is brute force over the realm's normalised float32 vectors, kept in a
per-process cache that follows the realm's version counter (new rows are appended; an update or delete
reloads).
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import bindparam, column, delete, func, insert, literal_column, or_, select, table, text, update

from ringlet._ids import new_id, now
from ringlet.store.engine import Conn, Db
from ringlet.store.schema import memory_edges, memory_nodes, memory_terms, memory_versions

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

N, E, T, V = memory_nodes.c, memory_edges.c, memory_terms.c, memory_versions.c
_FTS = table("memory_fts", column("rowid"))  # SQLite's FTS5 index (created by `create_search_index`)

# The reads a turn's context notes make, built once (bound parameters): SQLAlchemy then only looks up their
# compiled form, instead of building each statement again per call.
_IN_SCOPE = (bindparam("org_id"), bindparam("realm"))
_NODES = select(memory_nodes).where(N.id.in_(bindparam("ids", expanding=True)))
_EDGES = (select(memory_edges).where(E.org_id == _IN_SCOPE[0], E.realm == _IN_SCOPE[1],
                                     or_(E.src.in_(bindparam("ids", expanding=True)),
                                         E.dst.in_(bindparam("ids", expanding=True))))
          .order_by(E.created_at, E.id))
_VERSION = select(V.version, V.rebuild).where(V.org_id == _IN_SCOPE[0], V.realm == _IN_SCOPE[1])
_RANKED = (select(_FTS.c.rowid, literal_column("rank").label("score")).select_from(_FTS)
           .where(text("memory_fts MATCH :match")).order_by(literal_column("rank")).limit(bindparam("over"))
           .subquery())
"""The best `over` matches of the whole FTS5 index (its fast `ORDER BY rank` path), of every realm."""
_FTS_HITS = (select(N.id, _RANKED.c.score).join(_RANKED, N.seq == _RANKED.c.rowid)
             .where(N.org_id == _IN_SCOPE[0], N.realm == _IN_SCOPE[1]).order_by(_RANKED.c.score)
             .limit(bindparam("limit")))
_FTS_MATCHES = select(func.count()).select_from(_RANKED)


class Scope(NamedTuple):
    org_id: str
    realm: str

    @property
    def key(self) -> str:
        """A word that stands for this (org, realm) in the keyword index, so a search is filtered inside
        the index rather than after it."""
        return "s" + hashlib.sha256(f"{self.org_id}\x00{self.realm}".encode()).hexdigest()[:24]


if TYPE_CHECKING:  # numpy (~20 MiB) is loaded when memory's vectors are first used, not with the store
    import numpy as np


def _empty() -> np.ndarray:
    import numpy as np

    return np.zeros((0, 0), np.float32)


def _f32(vector: Any) -> bytes:
    """An embedding as stored: float32 bytes."""
    import numpy as np

    return np.asarray(vector, np.float32).tobytes()


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


def node_dict(row: Any) -> dict[str, Any]:
    r = dict(row)
    return {"id": r["id"], "labels": list(r["labels"]), "type": (r["labels"] or ["Memory"])[0], "title": r["title"],
            "content": r["content"], "properties": dict(r["properties"]), "tags": list(r["tags"]),
            "name": r["name"], "status": r["status"], "priority": r["priority"], "assigned_to": r["assigned_to"],
            "created_at": r["created_at"], "updated_at": r["updated_at"], "embedded": r["embedding"] is not None}


def terms(text_: str) -> list[str]:
    """The distinct words of a query, for an OR keyword search (at most 32)."""
    seen: dict[str, None] = {}
    for word in _TOKEN.findall(text_.lower()):
        if len(word) > 1:
            seen.setdefault(word, None)
    words = [w for w in seen if w not in STOPWORDS] or list(seen)
    return words[:MAX_TERMS]


class MemoryRecords:
    """The memory tables of one store."""

    def __init__(self, db: Db) -> None:
        self.db = db
        self.sqlite = db.engine.dialect.name == "sqlite"
        self._vectors: dict[Scope, _Vectors] = {}
        self._common: dict[str, tuple[float, int]] = {}

    # -- nodes ---------------------------------------------------------------------------------------------

    async def put_node(self, scope: Scope, *, labels: Sequence[str], title: str, content: str,
                       properties: dict[str, Any] | None = None, tags: Sequence[str] = (),
                       embedding: np.ndarray | None = None, id: str | None = None, status: str | None = None,
                       priority: str | None = None, assigned_to: str | None = None) -> dict[str, Any]:
        """Insert a node (or, given the `id` of a node of this realm, replace it: bulk import)."""
        async with self.db.begin() as conn:
            node = await self._put(conn, scope, labels=labels, title=title, content=content,
                                   properties=properties or {}, tags=tags, embedding=embedding, id=id,
                                   status=status, priority=priority, assigned_to=assigned_to)
            await self._bump(conn, scope, rebuild=node.pop("_replaced"))
        return node

    async def _put(self, conn: Conn, scope: Scope, *, labels: Sequence[str], title: str, content: str,
                   properties: dict[str, Any], tags: Sequence[str], embedding: np.ndarray | None,
                   id: str | None, status: str | None, priority: str | None,
                   assigned_to: str | None) -> dict[str, Any]:
        stamp, replaced = now(), False
        name = _name(properties)
        values = {"labels": list(labels), "title": title, "content": content, "properties": properties,
                  "tags": list(tags), "name": name, "status": status, "priority": priority,
                  "assigned_to": assigned_to, "updated_at": stamp,
                  "embedding": None if embedding is None else _f32(embedding)}
        seq = None
        if id is not None:
            found = (await conn.execute(select(N.seq, N.org_id, N.realm, N.created_at).where(N.id == id))).first()
            if found is not None and (found.org_id, found.realm) != scope:
                raise KeyError(id)  # the id is taken in another realm: the caller sees a conflict, not the row
            if found is not None:
                seq, replaced = found.seq, True
                await conn.execute(update(memory_nodes).where(N.seq == seq).values(**values))
                await conn.execute(delete(memory_terms).where(T.seq == seq))
                stamp = found.created_at
        if seq is None:
            id = id or new_id("n")
            inserted = await conn.execute(insert(memory_nodes).values(
                id=id, org_id=scope.org_id, realm=scope.realm, scope_key=scope.key, created_at=stamp, **values))
            seq = inserted.inserted_primary_key[0]  # type: ignore[index]
        rows = [{"seq": seq, "kind": k, "value": v, "org_id": scope.org_id, "realm": scope.realm}
                for k, v in _terms(labels, tags, properties)]
        if rows:
            await conn.execute(insert(memory_terms), rows)
        return {"id": id, "title": title, "embedded": embedding is not None, "_replaced": replaced}

    async def get_node(self, scope: Scope, node_id: str) -> dict[str, Any] | None:
        return (await self.get_nodes(scope, [node_id])).get(node_id)

    async def get_nodes(self, scope: Scope, ids: Collection[str]) -> dict[str, dict[str, Any]]:
        """The nodes of this realm among `ids` (others' are dropped here, in the storage layer: the query
        goes by the unique id index alone, which the planner would not pick next to the scope's)."""
        if not ids:
            return {}
        async with self.db.connect() as conn:
            rows = (await conn.execute(_NODES, {"ids": list(ids)})).mappings()
            return {r["id"]: node_dict(r) for r in rows if (r["org_id"], r["realm"]) == scope}

    async def update_node(self, scope: Scope, node_id: str, **changes: Any) -> bool:
        async with self.db.begin() as conn:
            result = await conn.execute(update(memory_nodes).where(
                N.id == node_id, N.org_id == scope.org_id, N.realm == scope.realm)
                .values(**changes, updated_at=now()))
            if result.rowcount:
                await self._bump(conn, scope, rebuild=True)
        return result.rowcount > 0

    async def delete_node(self, scope: Scope, node_id: str) -> bool:
        """Remove a node and its edges."""
        async with self.db.begin() as conn:
            seq = (await conn.execute(select(N.seq).where(
                N.id == node_id, N.org_id == scope.org_id, N.realm == scope.realm))).scalar()
            if seq is None:
                return False
            await conn.execute(delete(memory_terms).where(T.seq == seq))
            await conn.execute(delete(memory_edges).where(
                E.org_id == scope.org_id, E.realm == scope.realm, or_(E.src == node_id, E.dst == node_id)))
            await conn.execute(delete(memory_nodes).where(N.seq == seq))
            await self._bump(conn, scope, rebuild=True)
        return True

    async def find(self, scope: Scope, *, labels: Collection[str] = (), tags: Collection[str] = (),
                   since: str | None = None, status: Collection[str] = (), priority: Collection[str] = (),
                   assigned_to: str | None = None, limit: int = 10) -> list[dict[str, Any]]:
        """Nodes newest first: any of `labels`, all of `tags`, filtered in the query before the limit."""
        query = select(memory_nodes).where(N.org_id == scope.org_id, N.realm == scope.realm)
        if labels:
            query = query.where(self._has(scope, "label", labels))
        for tag in tags:
            query = query.where(self._has(scope, "tag", [tag]))
        if since is not None:
            query = query.where(N.created_at >= since)
        if status:
            query = query.where(N.status.in_(list(status)))
        if priority:
            query = query.where(N.priority.in_(list(priority)))
        if assigned_to is not None:
            query = query.where(N.assigned_to == assigned_to)
        async with self.db.connect() as conn:
            rows = (await conn.execute(query.order_by(N.created_at.desc(), N.seq.desc()).limit(limit))).mappings()
            return [node_dict(r) for r in rows]

    async def count(self, scope: Scope, *, labels: Collection[str] = ()) -> list[dict[str, Any]]:
        """`status`, `priority` of every node with one of `labels` (for task statistics)."""
        query = select(N.status, N.priority).where(N.org_id == scope.org_id, N.realm == scope.realm,
                                                   self._has(scope, "label", labels))
        async with self.db.connect() as conn:
            return [dict(r) for r in (await conn.execute(query)).mappings()]

    @staticmethod
    def _has(scope: Scope, kind: str, values: Collection[str]) -> Any:
        return select(T.seq).where(T.seq == N.seq, T.kind == kind, T.value.in_(list(values)),
                                   T.org_id == scope.org_id, T.realm == scope.realm).exists()

    # -- edges ---------------------------------------------------------------------------------------------

    async def link(self, scope: Scope, src: str, dst: str, relation: str, *, strength: float = 1.0,
                   metadata: dict[str, Any] | None = None) -> tuple[str, bool]:
        """Add the edge, or update the one with the same (from, to, relation); (edge id, created)."""
        async with self.db.begin() as conn:
            edge_id, created = await self._link(conn, scope, src, dst, relation, strength=strength,
                                                metadata=metadata or {})
            await self._bump(conn, scope, rebuild=False)
        return edge_id, created

    async def _link(self, conn: Conn, scope: Scope, src: str, dst: str, relation: str, *,
                    strength: float, metadata: dict[str, Any], edge_id: str | None = None) -> tuple[str, bool]:
        found = (await conn.execute(select(E.id).where(E.org_id == scope.org_id, E.realm == scope.realm,
                                                       E.src == src, E.dst == dst, E.relation == relation))).scalar()
        if found is not None:
            await conn.execute(update(memory_edges).where(E.id == found).values(strength=strength, metadata=metadata))
            return found, False
        edge_id = edge_id or new_id("e")
        await conn.execute(insert(memory_edges).values(id=edge_id, org_id=scope.org_id, realm=scope.realm, src=src,
                                                       dst=dst, relation=relation, strength=strength,
                                                       metadata=metadata, created_at=now()))
        return edge_id, True

    async def edges(self, scope: Scope, node_ids: Collection[str], *, relation: str | None = None
                    ) -> list[dict[str, Any]]:
        """Edges touching any of `node_ids` (either direction)."""
        if not node_ids:
            return []
        query = _EDGES if relation is None else _EDGES.where(E.relation == relation)
        params = {"org_id": scope.org_id, "realm": scope.realm, "ids": list(node_ids)}
        async with self.db.connect() as conn:
            return [dict(r) for r in (await conn.execute(query, params)).mappings()]

    async def unlink(self, scope: Scope, src: str, relation: str, keep: Collection[str] = ()) -> None:
        """Remove `src`'s edges of `relation`, except those to `keep`."""
        async with self.db.begin() as conn:
            await conn.execute(delete(memory_edges).where(E.org_id == scope.org_id, E.realm == scope.realm,
                                                          E.src == src, E.relation == relation,
                                                          E.dst.not_in(list(keep))))
            await self._bump(conn, scope, rebuild=False)

    # -- bulk import ---------------------------------------------------------------------------------------

    async def import_items(self, scope: Scope, nodes: Sequence[dict[str, Any]],
                           edges: Iterable[dict[str, Any]]) -> tuple[int, int]:
        """Upsert nodes and edges by id, all in one transaction (all or nothing). New nodes go in as one
        batch; nodes that exist (in this realm) are replaced one by one."""
        e = 0
        async with self.db.begin() as conn:
            ids = [n["id"] for n in nodes]
            existing = set()
            for start in range(0, len(ids), 500):
                existing |= {r[0] for r in await conn.execute(select(N.id).where(N.id.in_(ids[start:start + 500])))}
            for node in (n for n in nodes if n["id"] in existing):
                await self._put(conn, scope, labels=node["labels"], title=node["title"], content=node["content"],
                                properties=node["properties"], tags=node["tags"], embedding=node.get("embedding"),
                                id=node["id"], status=None, priority=None, assigned_to=None)
            await self._insert_many(conn, scope, [n for n in nodes if n["id"] not in existing])
            for edge in edges:
                await self._link(conn, scope, edge["from"], edge["to"], edge["relation"], strength=edge["strength"],
                                 metadata=edge["metadata"], edge_id=edge.get("id"))
                e += 1
            await self._bump(conn, scope, rebuild=True)
        return len(nodes), e

    async def _insert_many(self, conn: Conn, scope: Scope, nodes: Sequence[dict[str, Any]]) -> None:
        if not nodes:
            return
        stamp = now()
        rows = []
        for n in nodes:
            props = n["properties"]
            name = _name(props)
            vector = n.get("embedding")
            rows.append({"id": n["id"], "org_id": scope.org_id, "realm": scope.realm, "scope_key": scope.key,
                         "labels": list(n["labels"]), "title": n["title"], "content": n["content"],
                         "properties": props, "tags": list(n["tags"]), "name": name, "status": None,
                         "priority": None, "assigned_to": None, "created_at": stamp, "updated_at": stamp,
                         "embedding": None if vector is None else _f32(vector)})
        await conn.execute(insert(memory_nodes), rows)
        seqs: dict[str, int] = {}
        ids = [n["id"] for n in nodes]
        for start in range(0, len(ids), 500):
            chunk = select(N.id, N.seq).where(N.id.in_(ids[start:start + 500]))
            seqs |= {r.id: r.seq for r in await conn.execute(chunk)}
        terms_rows = [{"seq": seqs[n["id"]], "kind": k, "value": v, "org_id": scope.org_id, "realm": scope.realm}
                      for n in nodes for k, v in _terms(n["labels"], n["tags"], n["properties"])]
        if terms_rows:
            await conn.execute(insert(memory_terms), terms_rows)

    # -- search --------------------------------------------------------------------------------------------

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
                stmt = stmt.where(self._has(scope, "label", labels))
            rows = (await conn.execute(stmt.limit(limit))).all()
        return [(r[0], float(r[1])) for r in rows]

    async def _fts(self, conn: Conn, scope: Scope, words: Sequence[str], labels: Collection[str],
                   limit: int) -> list[tuple[str, float]]:
        """FTS5: rank the whole index (FTS5's fast `ORDER BY rank` path), keep this realm's rows; when other
        realms crowd the top out, rank again with the realm's token in the match (exact, slower)."""
        ored = " OR ".join(f'"{w}"' for w in words)
        over = limit * 4
        stmt = _FTS_HITS.where(self._has(scope, "label", labels)) if labels else _FTS_HITS
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
        async with self.db.connect() as conn:
            return (await conn.execute(_VERSION, {"org_id": scope.org_id, "realm": scope.realm})).scalar() or 0

    async def _bump(self, conn: Conn, scope: Scope, *, rebuild: bool) -> None:
        v = memory_versions.c
        changed = await conn.execute(update(memory_versions).where(v.org_id == scope.org_id, v.realm == scope.realm)
                                     .values(version=v.version + 1, rebuild=v.rebuild + int(rebuild)))
        if changed.rowcount == 0:
            await conn.execute(insert(memory_versions).values(org_id=scope.org_id, realm=scope.realm, version=1,
                                                              rebuild=1))


def _name(properties: dict[str, Any]) -> str | None:
    name = properties.get("name")
    return name if isinstance(name, str) else None


def _terms(labels: Sequence[str], tags: Sequence[str], properties: dict[str, Any]) -> list[tuple[str, str]]:
    """A node's lookup terms: its labels, its tags, and its entity name and aliases (lower-cased)."""
    given = properties.get("aliases")
    aliases: list[Any] = given if isinstance(given, list) else []
    names = dict.fromkeys(a.strip().lower() for a in [_name(properties) or "", *aliases]
                          if isinstance(a, str) and a.strip())
    return ([("label", v) for v in dict.fromkeys(labels)] + [("tag", v) for v in dict.fromkeys(tags)]
            + [("alias", v) for v in names])


def create_search_index(connection: Any) -> None:
    """The keyword index (migration v6): FTS5 kept in step by triggers, or a generated tsvector column."""
    if connection.dialect.name == "sqlite":
        for statement in (
            "CREATE VIRTUAL TABLE IF NOT EXISTS memory_fts USING fts5(scope_key, title, content, "
            "content='memory_nodes', content_rowid='seq', tokenize='porter unicode61')",
            "CREATE TRIGGER IF NOT EXISTS memory_nodes_ai AFTER INSERT ON memory_nodes BEGIN "
            "INSERT INTO memory_fts(rowid, scope_key, title, content) VALUES (new.seq, new.scope_key, new.title, "
            "new.content); END",
            "CREATE TRIGGER IF NOT EXISTS memory_nodes_ad AFTER DELETE ON memory_nodes BEGIN "
            "INSERT INTO memory_fts(memory_fts, rowid, scope_key, title, content) VALUES ('delete', old.seq, "
            "old.scope_key, old.title, old.content); END",
            "CREATE TRIGGER IF NOT EXISTS memory_nodes_au AFTER UPDATE OF title, content ON memory_nodes BEGIN "
            "INSERT INTO memory_fts(memory_fts, rowid, scope_key, title, content) VALUES ('delete', old.seq, "
            "old.scope_key, old.title, old.content); INSERT INTO memory_fts(rowid, scope_key, title, content) "
            "VALUES (new.seq, new.scope_key, new.title, new.content); END",
        ):
            connection.execute(text(statement))
        return
    connection.execute(text(
        "ALTER TABLE memory_nodes ADD COLUMN IF NOT EXISTS fts tsvector GENERATED ALWAYS AS "
        "(to_tsvector('english', coalesce(title, '') || ' ' || coalesce(content, ''))) STORED"))
    connection.execute(text("CREATE INDEX IF NOT EXISTS ix_memory_nodes_fts ON memory_nodes USING gin (fts)"))


__all__ = ["MemoryRecords", "Scope", "create_search_index", "node_dict", "terms"]
