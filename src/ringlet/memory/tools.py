"""The memory tools (`memory-and-context.md` §3): `store`, `recall`, `discover`, `link`, `task`, `tasks`,
`remember`. Each runs in the calling run's realm, which no argument can change; unknown ids (including
ids of other realms) are `not_found`, bad arguments `invalid_arguments`."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ringlet.context import RunContext
from ringlet.errors import ToolFailure
from ringlet.memory.core import Memory, scope_of
from ringlet.store.memory_records import MemoryNode, MemoryRecords, Scope
from ringlet.tools.base import ArgumentsInvalid, StaticToolset, Tool
from ringlet.tools.function import _clean_schema, format_validation_error

log = logging.getLogger("ringlet.memory")

Label = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
RESERVED = frozenset({"id", "realm", "embedding", "created_at", "updated_at"})
STATUSES = ("pending", "active", "completed", "blocked")
Status = Literal["pending", "active", "completed", "blocked", "done"]
Priority = Literal["low", "medium", "high", "critical"]


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class StoreArgs(_Args):
    content: str = Field(min_length=1, description="The text to remember.")
    type: str = Field(default="Memory", description="The node's type (its label).")
    labels: list[Label] | None = Field(default=None, description="Labels; when given, they replace `type`.")
    title: str | None = Field(default=None, description="Default: the first 100 characters of content.")
    tags: list[str] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict, description="Merged into the node's properties.")


class RecallArgs(_Args):
    id: str | None = Field(default=None, description="One node by id.")
    type: list[str] = Field(default_factory=list, description="Nodes of any of these types.")
    tags: list[str] = Field(default_factory=list, description="Nodes carrying all of these tags.")
    since: str | None = Field(default=None, description="RFC 3339: nodes created at or after.")
    limit: int = Field(default=10, ge=1, le=100)


class DiscoverArgs(_Args):
    query: str = Field(min_length=1, description="What to look for, in words.")
    type: list[str] = Field(default_factory=list)
    limit: int = Field(default=10, ge=1, le=50)
    min_similarity: float = Field(default=0.0, ge=0, le=1)
    depth: int = Field(default=1, ge=1, le=3, description="Hops of related nodes to attach.")


class LinkArgs(_Args):
    source: str = Field(alias="from", description="The id of the node the edge leaves.")
    target: str = Field(alias="to", description="The id of the node the edge reaches.")
    relation: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="e.g. depends_on (stored upper-cased).")
    strength: float = Field(default=1.0, ge=0, le=1)
    metadata: dict[str, Any] = Field(default_factory=dict)


class TaskArgs(_Args):
    id: str | None = Field(default=None, description="The task to update; none creates one.")
    title: str | None = None
    description: str | None = None
    status: Status | None = None
    priority: Priority | None = None
    depends_on: list[str] | None = Field(default=None, description="Ids of tasks this one waits for.")
    assign: str | None = None
    complete: bool = False
    delete: bool = False


class TasksArgs(_Args):
    status: list[str] = Field(default_factory=list)
    priority: list[str] = Field(default_factory=list)
    assigned_to: str | None = None
    unblocked_only: bool = False
    limit: int = Field(default=20, ge=1, le=100)


class RememberArgs(_Args):
    kind: str = Field(min_length=1, description="e.g. user_preference, decision, incident_root, fact.")
    text: str = Field(min_length=1, max_length=2000)


def _tool(name: str, description: str, args: type[_Args], run: Callable[[Any, RunContext], Awaitable[Any]],
          effect: Literal["read", "write"]) -> Tool:
    validator = args.__pydantic_validator__

    def validate(raw: dict[str, Any]) -> dict[str, Any]:
        try:
            return validator.validate_python(raw).model_dump(by_alias=True)
        except ValidationError as exc:
            raise ArgumentsInvalid(format_validation_error(exc)) from None

    async def call(raw: dict[str, Any], ctx: RunContext) -> Any:
        return await run(args.model_validate(raw), ctx)

    return Tool(name=name, description=description, run=call, validate=validate, effect=effect, approval="auto",
                parameters=_clean_schema(args.model_json_schema(by_alias=True)), timeout_s=30)


def memory_toolset(memory: Memory) -> StaticToolset:
    """The memory tools `memory.config.tools` enables, bound to `memory`."""
    impl = _Tools(memory)
    table = {
        "store": ("Store a memory or a graph node in this realm's knowledge store.", StoreArgs, impl.store, "write"),
        "recall": ("Get nodes by id, type, tags or date, newest first.", RecallArgs, impl.recall, "read"),
        "discover": ("Search the knowledge store by meaning and keywords; attaches related nodes.", DiscoverArgs,
                     impl.discover, "read"),
        "link": ("Connect two nodes with a named relation (updates an existing one).", LinkArgs, impl.link,
                 "write"),
        "task": ("Create, update, advance, complete or delete a task.", TaskArgs, impl.task, "write"),
        "tasks": ("List tasks with filters and statistics.", TasksArgs, impl.tasks, "read"),
        "remember": ("Remember one fact, preference or decision for later conversations.", RememberArgs,
                     impl.remember, "write"),
    }
    return StaticToolset([_tool(name, *table[name]) for name in memory.config.tool_names])  # type: ignore[arg-type]


def _status(status: str | None) -> str | None:
    return "completed" if status == "done" else status


async def _with_next_action(records: MemoryRecords, scope: Scope, task_id: str) -> dict[str, Any]:
    """The task, with a short hint of what is next."""
    node = await records.get_node(scope, task_id)
    if node is None:  # deleted since it was written (another run)
        raise ToolFailure("not_found", f"no task {task_id!r}")
    out: dict[str, Any] = {"task": _task(node)}
    deps = [e.dst for e in await records.edges(scope, [task_id], relation="DEPENDS_ON") if e.src == task_id]
    open_deps = [n for n in (await records.get_nodes(scope, deps)).values() if n.status != "completed"]
    if open_deps and node.status != "completed":
        out["next_action"] = f"{len(open_deps)} dependenc{'y' if len(open_deps) == 1 else 'ies'} still open"
    elif node.status == "pending":
        out["next_action"] = "ready to start"
    return out


_PUBLIC = ("id", "type", "title", "content", "tags", "properties", "created_at")


def _public(node: MemoryNode) -> dict[str, Any]:
    shown = node.as_json()
    return {k: shown[k] for k in _PUBLIC}


def _task(node: MemoryNode) -> dict[str, Any]:
    return {"id": node.id, "title": node.title, "description": node.content, "status": node.status,
            "priority": node.priority, "assigned_to": node.assigned_to, "created_at": node.created_at,
            "updated_at": node.updated_at}


class _Tools:
    def __init__(self, memory: Memory) -> None:
        self.memory = memory

    async def store(self, a: StoreArgs, ctx: RunContext) -> dict[str, Any]:
        reserved = sorted(RESERVED & set(a.metadata))
        if reserved:
            raise ToolFailure("invalid_arguments", f"metadata keys {reserved} are reserved; use other names",
                              errors=[f"metadata.{k}: reserved key" for k in reserved])
        vectors = await self.memory.embed([a.content], ctx)
        node = await (await self.memory.records()).put_node(
            scope_of(ctx), labels=a.labels or [a.type], title=a.title or a.content[:100], content=a.content,
            properties=a.metadata, tags=a.tags, embedding=None if vectors is None else vectors[0])
        return {"id": node.id, "title": node.title, "embedded": node.embedded}

    async def recall(self, a: RecallArgs, ctx: RunContext) -> dict[str, Any]:
        records, scope = await self.memory.records(), scope_of(ctx)
        if a.id is not None:
            node = await records.get_node(scope, a.id)
            if node is None:
                raise ToolFailure("not_found", f"no node {a.id!r}")
            return {"nodes": [_public(node)], "count": 1}
        nodes = await records.find(scope, labels=a.type, tags=a.tags, since=a.since, limit=a.limit)
        return {"nodes": [_public(n) for n in nodes], "count": len(nodes)}

    async def discover(self, a: DiscoverArgs, ctx: RunContext) -> dict[str, Any]:
        scope = scope_of(ctx)
        hits, method = await self.memory.search(scope, a.query, types=a.type, limit=a.limit,
                                                min_similarity=a.min_similarity, ctx=ctx)
        nodes = await (await self.memory.records()).get_nodes(scope, [h.id for h in hits])
        related = await self.memory.neighbours(scope, [h.id for h in hits if h.id in nodes], a.depth)
        results = []
        for h in hits:
            node = nodes.get(h.id)
            if node is None:
                continue
            item = {"id": node.id, "type": node.type, "title": node.title,
                    "content_preview": node.content[:200],
                    "similarity": None if h.similarity is None else round(h.similarity, 4),
                    "properties": node.properties}
            if related.get(h.id):
                item["related"] = related[h.id]
            results.append(item)
        return {"results": results, "method": method, "total": len(results)}

    async def link(self, a: LinkArgs, ctx: RunContext) -> dict[str, Any]:
        records, scope = await self.memory.records(), scope_of(ctx)
        await _require(records, scope, [a.source, a.target])
        relation = a.relation.upper()
        edge_id, _ = await records.link(scope, a.source, a.target, relation, strength=a.strength,
                                        metadata=a.metadata)
        return {"edge_id": edge_id, "from": a.source, "to": a.target, "relation": relation}

    async def task(self, a: TaskArgs, ctx: RunContext) -> dict[str, Any]:
        records, scope = await self.memory.records(), scope_of(ctx)
        if a.depends_on:
            await _require(records, scope, a.depends_on, label="Task")
        if a.id is None:
            task_id = await self._create(records, scope, a)
        else:
            current = await records.get_node(scope, a.id)
            if current is None or "Task" not in current.labels:
                raise ToolFailure("not_found", f"no task {a.id!r}")
            if a.delete:
                await records.delete_node(scope, a.id)
                return {"task": {**_task(current), "deleted": True}}
            task_id = await self._update(records, scope, a, current)
        if a.depends_on is not None:
            await self._depend(records, scope, task_id, a.depends_on, created=a.id is None)
        return await _with_next_action(records, scope, task_id)

    @staticmethod
    async def _create(records: MemoryRecords, scope: Scope, a: TaskArgs) -> str:
        if not a.title:
            raise ToolFailure("invalid_arguments", "title is required to create a task",
                              errors=["title: required when no id is given"])
        made = await records.put_node(scope, labels=["Task"], title=a.title, content=a.description or "",
                                      status=_status(a.status) or "pending", priority=a.priority or "medium",
                                      assigned_to=a.assign)
        return made.id

    @staticmethod
    async def _update(records: MemoryRecords, scope: Scope, a: TaskArgs, current: MemoryNode) -> str:
        """Set the given fields; `complete` completes; no status and no field moves one step along."""
        status = "completed" if a.complete else _status(a.status)
        if status is None and not any((a.title, a.description, a.priority, a.assign, a.depends_on)):
            status = {"pending": "active", "active": "completed"}.get(current.status or "pending", current.status)
        changes = {k: v for k, v in (("title", a.title), ("content", a.description), ("status", status),
                                     ("priority", a.priority), ("assigned_to", a.assign)) if v is not None}
        if changes:
            await records.update_node(scope, current.id, **changes)
        return current.id

    @staticmethod
    async def _depend(records: MemoryRecords, scope: Scope, task_id: str, depends_on: list[str], *,
                      created: bool) -> None:
        cycle = await _cycle(records, scope, task_id, depends_on)
        if cycle:
            if created:
                await records.delete_node(scope, task_id)
            raise ToolFailure("invalid_arguments", f"dependency cycle: {' → '.join(cycle)}",
                              errors=[f"depends_on: would create the cycle {' → '.join(cycle)}"])
        for dep in depends_on:
            await records.link(scope, task_id, dep, "DEPENDS_ON")
        await records.unlink(scope, task_id, "DEPENDS_ON", keep=depends_on)

    async def tasks(self, a: TasksArgs, ctx: RunContext) -> dict[str, Any]:
        records, scope = await self.memory.records(), scope_of(ctx)
        status = ["completed" if s == "done" else s for s in a.status]
        nodes = await records.find(scope, labels=["Task"], status=status, priority=a.priority,
                                   assigned_to=a.assigned_to, limit=10_000 if a.unblocked_only else a.limit)
        if a.unblocked_only:
            edges = await records.edges(scope, [n.id for n in nodes], relation="DEPENDS_ON")
            done = {i for i, n in (await records.get_nodes(scope, {e.dst for e in edges})).items()
                    if n.status == "completed"}
            blocked = {e.src for e in edges if e.dst not in done}
            nodes = [n for n in nodes if n.id not in blocked][:a.limit]
        every = await records.count(scope, labels=["Task"])
        by_status: dict[str, int] = {}
        by_priority: dict[str, int] = {}
        for status_, priority in every:
            by_status[status_ or "pending"] = by_status.get(status_ or "pending", 0) + 1
            by_priority[priority or "medium"] = by_priority.get(priority or "medium", 0) + 1
        return {"tasks": [_task(n) for n in nodes],
                "stats": {"total": len(every), "by_status": by_status, "by_priority": by_priority}}

    async def remember(self, a: RememberArgs, ctx: RunContext) -> dict[str, Any]:
        return {"id": await remember(self.memory, scope_of(ctx), a.kind, a.text, ctx)}


async def remember(memory: Memory, scope: Scope, kind: str, text: str, ctx: RunContext | None = None) -> str:
    """Store a `Memory` node with `properties.kind`, linked (`MENTIONS`) to the graph entities it names."""
    records = await memory.records()
    vectors = await memory.embed([text], ctx)
    node = await records.put_node(scope, labels=["Memory"], title=text[:100], content=text,
                                  properties={"kind": kind}, embedding=None if vectors is None else vectors[0])
    for entity in await memory.entities_in(scope, text, memory.config.graph.max_entities):
        if entity != node.id:
            await records.link(scope, node.id, entity, "MENTIONS")
    return node.id


async def capture(memory: Memory, ctx: RunContext, items: list[tuple[str, str]]) -> None:
    """Implicit capture (`memory-and-context.md` §3): `(kind, text)` items (durable tool results, human
    decisions) become memories of the run's realm. A failure is logged; it never fails the run."""
    if not memory.config.implicit_capture or not items:
        return
    try:
        for kind, text in items:
            await remember(memory, scope_of(ctx), kind, text, ctx)
    except Exception:
        log.warning("implicit capture failed for run %s", ctx.run_id, exc_info=True)


async def _require(records: MemoryRecords, scope: Scope, ids: list[str], label: str | None = None) -> None:
    found = await records.get_nodes(scope, set(ids))
    missing = [i for i in ids if i not in found or (label and label not in found[i].labels)]
    if missing:
        raise ToolFailure("not_found", f"no {'task' if label else 'node'} {missing[0]!r}", ids=missing)


async def _cycle(records: MemoryRecords, scope: Scope, task_id: str, depends_on: list[str]) -> list[str] | None:
    """The path back to `task_id` if it depended on `depends_on`, else None."""
    stack = [(dep, [task_id, dep]) for dep in depends_on]
    seen: set[str] = set()
    while stack:
        node, path = stack.pop()
        if node == task_id:
            return path
        if node in seen:
            continue
        seen.add(node)
        edges = await records.edges(scope, [node], relation="DEPENDS_ON")
        stack.extend((e.dst, [*path, e.dst]) for e in edges if e.src == node)
    return None
