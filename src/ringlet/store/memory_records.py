"""Memory rows (`memory-and-context.md` §1–§2): nodes, edges, labels, tags and entity names, by realm.

Every method takes the caller's `Scope` (org and realm) and every statement filters by it, so a row of
another realm is indistinguishable from a missing one. `MemoryRecords` writes nodes and edges (each write
bumps the realm's version counter, which search caches follow) and reads them by id or by filter, as
`MemoryNode` and `MemoryEdge` records; ranking them (keyword and vector search) is `records.search`
(`ringlet.store.memory_search`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import RowMapping, bindparam, delete, insert, or_, select, text, update

from ringlet._ids import new_id, now
from ringlet.store.engine import Conn, Db
from ringlet.store.memory_search import MemorySearch, Scope, has_term
from ringlet.store.records import Json
from ringlet.store.schema import memory_edges, memory_nodes, memory_terms, memory_versions

if TYPE_CHECKING:  # numpy (~20 MiB) is loaded when memory's vectors are first used, not with the store
    import numpy as np

N, E, T = memory_nodes.c, memory_edges.c, memory_terms.c

# The reads a turn's context notes make, built once (bound parameters): SQLAlchemy then only looks up their
# compiled form, instead of building each statement again per call.
_NODES = select(memory_nodes).where(N.id.in_(bindparam("ids", expanding=True)))
_EDGES = (select(memory_edges).where(E.org_id == bindparam("org_id"), E.realm == bindparam("realm"),
                                     or_(E.src.in_(bindparam("ids", expanding=True)),
                                         E.dst.in_(bindparam("ids", expanding=True))))
          .order_by(E.created_at, E.id))

ImportItem = Json
"""A node or an edge of a graph import, as `ringlet.memory.graph_import` validated it."""


@dataclass(frozen=True, slots=True)
class MemoryNode:
    """A node of a realm's memory: a memory, a task, a graph entity, a document chunk. `type` is its first
    label; `name` its entity name (`properties.name`); `embedded` whether it has a vector."""

    id: str
    labels: tuple[str, ...]
    type: str
    title: str
    content: str
    properties: Json
    tags: tuple[str, ...]
    name: str | None
    status: str | None
    priority: str | None
    assigned_to: str | None
    created_at: str
    updated_at: str
    embedded: bool

    @classmethod
    def of(cls, r: RowMapping) -> MemoryNode:
        """A `memory_nodes` row, as `result.mappings()` gives it (a `Row`'s attribute access costs ~3× as
        much, and this is on the path of every turn's context notes)."""
        labels = tuple(r["labels"])
        return cls(r["id"], labels, labels[0] if labels else "Memory", r["title"], r["content"], r["properties"],
                   tuple(r["tags"]), r["name"], r["status"], r["priority"], r["assigned_to"], r["created_at"],
                   r["updated_at"], r["embedding"] is not None)

    def as_json(self) -> Json:
        """The node as the memory tools show it."""
        return {"id": self.id, "labels": list(self.labels), "type": self.type, "title": self.title,
                "content": self.content, "properties": dict(self.properties), "tags": list(self.tags),
                "name": self.name, "status": self.status, "priority": self.priority,
                "assigned_to": self.assigned_to, "created_at": self.created_at, "updated_at": self.updated_at,
                "embedded": self.embedded}


@dataclass(frozen=True, slots=True)
class MemoryEdge:
    """A directed, named relation between two nodes of a realm (one per (src, dst, relation))."""

    id: str
    src: str
    dst: str
    relation: str
    strength: float
    metadata: Json
    created_at: str

    @classmethod
    def of(cls, r: RowMapping) -> MemoryEdge:
        """A `memory_edges` row, as `result.mappings()` gives it."""
        return cls(r["id"], r["src"], r["dst"], r["relation"], r["strength"], r["metadata"], r["created_at"])


def _f32(vector: Any) -> bytes:
    """An embedding as stored: float32 bytes."""
    import numpy as np

    return np.asarray(vector, np.float32).tobytes()


class MemoryRecords:
    """The memory tables of one store: nodes and edges written and read; `search` ranks them."""

    def __init__(self, db: Db) -> None:
        self.db = db
        self.search = MemorySearch(db)

    # -- nodes ---------------------------------------------------------------------------------------------

    async def put_node(self, scope: Scope, *, labels: Sequence[str], title: str, content: str,
                       properties: Json | None = None, tags: Sequence[str] = (),
                       embedding: np.ndarray | None = None, id: str | None = None, status: str | None = None,
                       priority: str | None = None, assigned_to: str | None = None) -> MemoryNode:
        """Insert a node (or, given the `id` of a node of this realm, replace it: bulk import); the node as
        written."""
        async with self.db.begin() as conn:
            node, replaced = await self._put(conn, scope, labels=labels, title=title, content=content,
                                             properties=properties or {}, tags=tags, embedding=embedding, id=id,
                                             status=status, priority=priority, assigned_to=assigned_to)
            await self._bump(conn, scope, rebuild=replaced)
        return node

    async def _put(self, conn: Conn, scope: Scope, *, labels: Sequence[str], title: str, content: str,
                   properties: Json, tags: Sequence[str], embedding: np.ndarray | None,
                   id: str | None, status: str | None, priority: str | None,
                   assigned_to: str | None) -> tuple[MemoryNode, bool]:
        """The node as written, and whether it replaced one."""
        stamp = created = now()
        replaced = False
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
                created = found.created_at
        node_id = id or new_id("n")
        if seq is None:
            inserted = await conn.execute(insert(memory_nodes).values(
                id=node_id, org_id=scope.org_id, realm=scope.realm, scope_key=scope.key, created_at=created,
                **values))
            seq = inserted.inserted_primary_key[0]  # type: ignore[index]
        rows = [{"seq": seq, "kind": k, "value": v, "org_id": scope.org_id, "realm": scope.realm}
                for k, v in _terms(labels, tags, properties)]
        if rows:
            await conn.execute(insert(memory_terms), rows)
        node = MemoryNode(node_id, tuple(labels), labels[0] if labels else "Memory", title, content, properties,
                          tuple(tags), name, status, priority, assigned_to, created, stamp, embedding is not None)
        return node, replaced

    async def get_node(self, scope: Scope, node_id: str) -> MemoryNode | None:
        return (await self.get_nodes(scope, [node_id])).get(node_id)

    async def get_nodes(self, scope: Scope, ids: Collection[str]) -> dict[str, MemoryNode]:
        """The nodes of this realm among `ids` (others' are dropped here, in the storage layer: the query
        goes by the unique id index alone, which the planner would not pick next to the scope's)."""
        if not ids:
            return {}
        async with self.db.connect() as conn:
            rows = (await conn.execute(_NODES, {"ids": list(ids)})).mappings()
            return {r["id"]: MemoryNode.of(r) for r in rows if (r["org_id"], r["realm"]) == scope}

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
                   assigned_to: str | None = None, limit: int = 10) -> list[MemoryNode]:
        """Nodes newest first: any of `labels`, all of `tags`, filtered in the query before the limit."""
        query = select(memory_nodes).where(N.org_id == scope.org_id, N.realm == scope.realm)
        if labels:
            query = query.where(has_term(scope, "label", labels))
        for tag in tags:
            query = query.where(has_term(scope, "tag", [tag]))
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
            return [MemoryNode.of(r) for r in rows]

    async def count(self, scope: Scope, *, labels: Collection[str] = ()) -> list[tuple[str | None, str | None]]:
        """(`status`, `priority`) of every node with one of `labels` (for task statistics)."""
        query = select(N.status, N.priority).where(N.org_id == scope.org_id, N.realm == scope.realm,
                                                   has_term(scope, "label", labels))
        async with self.db.connect() as conn:
            return [(status, priority) for status, priority in await conn.execute(query)]

    # -- edges ---------------------------------------------------------------------------------------------

    async def link(self, scope: Scope, src: str, dst: str, relation: str, *, strength: float = 1.0,
                   metadata: Json | None = None) -> tuple[str, bool]:
        """Add the edge, or update the one with the same (from, to, relation); (edge id, created)."""
        async with self.db.begin() as conn:
            edge_id, created = await self._link(conn, scope, src, dst, relation, strength=strength,
                                                metadata=metadata or {})
            await self._bump(conn, scope, rebuild=False)
        return edge_id, created

    async def _link(self, conn: Conn, scope: Scope, src: str, dst: str, relation: str, *,
                    strength: float, metadata: Json, edge_id: str | None = None) -> tuple[str, bool]:
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
                    ) -> list[MemoryEdge]:
        """Edges touching any of `node_ids` (either direction), oldest first."""
        if not node_ids:
            return []
        query = _EDGES if relation is None else _EDGES.where(E.relation == relation)
        params = {"org_id": scope.org_id, "realm": scope.realm, "ids": list(node_ids)}
        async with self.db.connect() as conn:
            return [MemoryEdge.of(r) for r in (await conn.execute(query, params)).mappings()]

    async def unlink(self, scope: Scope, src: str, relation: str, keep: Collection[str] = ()) -> None:
        """Remove `src`'s edges of `relation`, except those to `keep`."""
        async with self.db.begin() as conn:
            await conn.execute(delete(memory_edges).where(E.org_id == scope.org_id, E.realm == scope.realm,
                                                          E.src == src, E.relation == relation,
                                                          E.dst.not_in(list(keep))))
            await self._bump(conn, scope, rebuild=False)

    # -- bulk import ---------------------------------------------------------------------------------------

    async def import_items(self, scope: Scope, nodes: Sequence[ImportItem],
                           edges: Iterable[ImportItem]) -> tuple[int, int]:
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

    async def _insert_many(self, conn: Conn, scope: Scope, nodes: Sequence[ImportItem]) -> None:
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

    async def _bump(self, conn: Conn, scope: Scope, *, rebuild: bool) -> None:
        v = memory_versions.c
        changed = await conn.execute(update(memory_versions).where(v.org_id == scope.org_id, v.realm == scope.realm)
                                     .values(version=v.version + 1, rebuild=v.rebuild + int(rebuild)))
        if changed.rowcount == 0:
            await conn.execute(insert(memory_versions).values(org_id=scope.org_id, realm=scope.realm, version=1,
                                                              rebuild=1))


def _name(properties: Json) -> str | None:
    name = properties.get("name")
    return name if isinstance(name, str) else None


def _terms(labels: Sequence[str], tags: Sequence[str], properties: Json) -> list[tuple[str, str]]:
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


__all__ = ["ImportItem", "MemoryEdge", "MemoryNode", "MemoryRecords", "Scope", "create_search_index"]
