"""The tables, as SQLAlchemy Core metadata. The same schema runs on SQLite and PostgreSQL.

Timestamps are RFC 3339 strings (what the API returns), JSON documents are `JSON` columns, and each
conversation keeps `last_event_id`, the counter its event ids are drawn from (one UPDATE … RETURNING,
atomic on both engines).
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

metadata = MetaData()

schema_version = Table(
    "ringlet_schema", metadata,
    Column("version", Integer, primary_key=True),
    Column("applied_at", String(32), nullable=False),
    # the oldest schema version whose code still reads the database once this version is applied: unchanged by
    # a migration that only expands, this version itself for one that contracts (`migrations.CONTRACTS`)
    Column("oldest_reader", Integer),
)

conversations = Table(
    "conversations", metadata,
    Column("id", String(40), primary_key=True),
    Column("agent", String(200), nullable=False),
    Column("title", Text, nullable=False, default=""),
    Column("realm", String(200), nullable=False, default="default"),
    Column("org_id", String(200)),
    Column("user_id", String(200)),
    Column("parent_run_id", String(40)),
    Column("parent_conversation_id", String(40)),
    Column("parent_tool_call_id", String(100)),
    Column("is_sub_agent", Boolean, nullable=False, default=False),
    # the id a client named it by (an AG-UI threadId, an A2A contextId), scoped to its realm and agent: its
    # own id is derived from the three, so a name used in one realm neither shows nor blocks another's
    Column("client_id", String(200)),
    # a fork's origin: the conversation it was forked from and the message it was forked at (issue 44)
    Column("forked_from_conversation_id", String(40)),
    Column("forked_from_message_id", String(40)),
    Column("status", String(20), nullable=False, default="idle"),
    Column("in_tokens", Integer, nullable=False, default=0),
    Column("out_tokens", Integer, nullable=False, default=0),
    Column("cost_usd", Float),
    Column("priced", Boolean, nullable=False, default=True),
    Column("last_event_id", Integer, nullable=False, default=0),
    Column("pruned_event_id", Integer, nullable=False, default=0),
    Column("created_at", String(32), nullable=False),
    Column("updated_at", String(32), nullable=False),
    Column("deleted_at", String(32)),
    Index("ix_conversations_listing", "realm", "agent", "updated_at"),
)

messages = Table(
    "messages", metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", String(40), nullable=False, unique=True),
    Column("conversation_id", String(40), ForeignKey("conversations.id"), nullable=False),
    Column("run_id", String(40)),
    Column("role", String(20), nullable=False),
    Column("created_at", String(32), nullable=False),
    Column("schema_version", Integer, nullable=False),
    Column("body", JSON, nullable=False),
    Index("ix_messages_conversation", "conversation_id", "seq"),
)

runs = Table(
    "runs", metadata,
    Column("id", String(40), primary_key=True),
    Column("conversation_id", String(40), ForeignKey("conversations.id")),
    Column("parent_run_id", String(40)),
    Column("agent", String(200), nullable=False),
    Column("realm", String(200)),
    Column("kind", String(10), nullable=False, default="loop"),
    Column("status", String(20), nullable=False),
    Column("finish_reason", String(20)),
    Column("in_tokens", Integer, nullable=False, default=0),
    Column("out_tokens", Integer, nullable=False, default=0),
    Column("cost_usd", Float),
    Column("state", JSON),
    Column("lease_owner", String(100)),
    Column("lease_expires_at", String(32)),
    Column("started_at", String(32), nullable=False),
    Column("ended_at", String(32)),
    Column("key_id", String(200)),  # the API key that caused it: its runs count against that key's limit
    Index("ix_runs_conversation", "conversation_id"),
    Index("ix_runs_key", "key_id", "status"),  # a key's working runs, counted as each new run is admitted
)

events = Table(
    "events", metadata,
    Column("conversation_id", String(40), ForeignKey("conversations.id"), primary_key=True),
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("run_id", String(40)),
    Column("type", String(40), nullable=False),
    Column("payload", JSON, nullable=False),
    Column("created_at", String(32), nullable=False),
)

api_keys = Table(
    "api_keys", metadata,
    Column("id", String(40), primary_key=True),
    Column("name", String(200), nullable=False),
    Column("hash", String(64), nullable=False, unique=True),
    Column("prefix", String(12), nullable=False),
    Column("user_id", String(200), nullable=False),
    Column("org_id", String(200), nullable=False),
    Column("roles", JSON, nullable=False),
    Column("scopes", JSON, nullable=False),
    Column("realms", JSON, nullable=False),
    Column("agents", JSON, nullable=False),
    Column("created_at", String(32), nullable=False),
    Column("expires_at", String(32)),
    Column("revoked_at", String(32)),
)

triggers = Table(
    "triggers", metadata,
    Column("id", String(40), primary_key=True),
    Column("name", String(200), nullable=False),
    Column("agent", String(200), nullable=False),
    Column("kind", String(10), nullable=False),
    Column("cron", String(100)),
    Column("timezone", String(64), nullable=False, default="UTC"),
    Column("message_template", Text),
    Column("conversation_id", String(40)),
    Column("realm", String(200), nullable=False, default="default"),
    Column("secret", String(200)),
    Column("enabled", Boolean, nullable=False, default=True),
    Column("next_fire_at", String(32)),
    Column("last_fired_at", String(32)),
    Column("firing", String(200)),  # a cron trigger's last fire that ran: its workflow id (`server/firing/fires.py`)
    Column("created_by", String(200)),
    Column("created_by_key", String(200)),  # its fires count against this key's limits
    Column("created_at", String(32), nullable=False),
    Column("updated_at", String(32), nullable=False),
)

idempotency = Table(
    "idempotency_keys", metadata,
    Column("principal", String(200), primary_key=True),
    Column("key", String(200), primary_key=True),
    Column("route", String(200), nullable=False),
    Column("body_hash", String(64), nullable=False),
    Column("response", JSON, nullable=False),
    Column("created_at", String(32), nullable=False),
)

stream_tokens = Table(
    "stream_tokens", metadata,
    Column("hash", String(64), primary_key=True),
    Column("key_id", String(40), nullable=False),
    Column("expires_at", String(32), nullable=False),
)

audit_log = Table(
    "audit_log", metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("audit_id", String(40), nullable=False, unique=True),
    Column("at", String(32), nullable=False),
    Column("run_id", String(40)),
    Column("conversation_id", String(40)),
    Column("org_id", String(200)),
    Column("realm", String(200)),
    Column("action", String(40), nullable=False),
    Column("tool", String(200)),
    Column("decision", String(40), nullable=False),
    Column("record", JSON, nullable=False),
    Index("ix_audit_run", "run_id"),
    Index("ix_audit_at", "at"),
)

approvals = Table(
    "approvals", metadata,
    Column("approval_id", String(40), primary_key=True),
    Column("run_id", String(40), nullable=False),
    Column("conversation_id", String(40)),
    Column("tool_call_id", String(100), nullable=False),
    Column("agent", String(200)),
    Column("realm", String(200)),
    Column("tool", String(200), nullable=False),
    Column("connector", String(200)),
    Column("args", JSON, nullable=False),
    Column("effect", String(20), nullable=False),
    Column("reason", Text, nullable=False),
    Column("requested_at", String(32), nullable=False),
    Column("expires_at", String(32), nullable=False),
    Column("timeout_s", Float, nullable=False),
    Column("status", String(20), nullable=False),
    Column("decided_by", String(200)),
    Column("decided_at", String(32)),
    Column("note", Text),
    # `approval`, or `question` (an `ask_question` call or a graph input node; `question` holds it)
    Column("kind", String(20), nullable=False, default="approval"),
    Column("question", JSON),
    Column("answer", JSON),
    Index("ix_approvals_run", "run_id"),
    Index("ix_approvals_pending", "status", "expires_at"),
)

# -- memory: nodes, edges, labels/tags/aliases (memory-and-context.md §2); every row carries org and realm --

memory_nodes = Table(
    "memory_nodes", metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", String(40), nullable=False, unique=True),
    Column("org_id", String(200), nullable=False),
    Column("realm", String(200), nullable=False),
    Column("scope_key", String(40), nullable=False),  # a token for (org, realm) in the keyword index
    Column("labels", JSON, nullable=False),
    Column("title", Text, nullable=False),
    Column("content", Text, nullable=False),
    Column("properties", JSON, nullable=False),
    Column("tags", JSON, nullable=False),
    Column("name", Text),  # a graph entity's name, as written (its `properties.name`)
    Column("status", String(20)),
    Column("priority", String(20)),
    Column("assigned_to", String(200)),
    Column("embedding", LargeBinary),  # float32, L2-normalised; NULL without an embedding provider
    Column("created_at", String(32), nullable=False),
    Column("updated_at", String(32), nullable=False),
    Index("ix_memory_nodes_scope", "org_id", "realm", "created_at"),
)

memory_terms = Table(
    "memory_terms", metadata,
    Column("seq", Integer, ForeignKey("memory_nodes.seq", ondelete="CASCADE"), primary_key=True),
    Column("kind", String(10), primary_key=True),  # label, tag, or alias (a lower-cased entity name/alias)
    Column("value", String(400), primary_key=True),
    Column("org_id", String(200), nullable=False),
    Column("realm", String(200), nullable=False),
    Index("ix_memory_terms_lookup", "org_id", "realm", "kind", "value"),
)

memory_edges = Table(
    "memory_edges", metadata,
    Column("id", String(40), primary_key=True),
    Column("org_id", String(200), nullable=False),
    Column("realm", String(200), nullable=False),
    Column("src", String(40), nullable=False),
    Column("dst", String(40), nullable=False),
    Column("relation", String(200), nullable=False),
    Column("strength", Float, nullable=False),
    Column("metadata", JSON, nullable=False),
    Column("created_at", String(32), nullable=False),
    UniqueConstraint("org_id", "realm", "src", "dst", "relation", name="uq_memory_edge"),
    Index("ix_memory_edges_dst", "org_id", "realm", "dst"),
)

memory_versions = Table(
    "memory_versions", metadata,
    Column("org_id", String(200), primary_key=True),
    Column("realm", String(200), primary_key=True),
    Column("version", Integer, nullable=False),  # bumped by every write: caches (vectors, names) check it
    Column("rebuild", Integer, nullable=False),  # bumped on updates and deletes: caches reload, not append
)

access_requests = Table(
    "access_requests", metadata,
    Column("request_id", String(40), primary_key=True),
    Column("connector", String(200), nullable=False),
    Column("reason", Text, nullable=False),
    Column("requested_by", String(200)),
    Column("org_id", String(200)),
    Column("realm", String(200), nullable=False),
    Column("status", String(20), nullable=False),
    Column("created_at", String(32), nullable=False),
    Index("ix_access_pending", "status", "connector", "realm"),
)

# -- schedules of agents (builtin-tools-and-subagents.md §4): alarm_clock / schedule_task -----------------

schedules = Table(
    "schedules", metadata,
    Column("schedule_id", String(40), primary_key=True),
    Column("org_id", String(200)),
    Column("realm", String(200), nullable=False),
    Column("conversation_id", String(40), nullable=False),
    Column("agent", String(200), nullable=False),
    Column("kind", String(20), nullable=False),  # at | interval | cron
    Column("spec", JSON, nullable=False),  # at / interval_minutes / cron, timezone, until, max_runs
    Column("message", Text, nullable=False),
    Column("next_run_at", String(32)),
    Column("runs", Integer, nullable=False, default=0),
    Column("status", String(20), nullable=False),  # active | done
    Column("slot", Integer, nullable=False, default=0),  # its pending wake-up (`server/firing/schedules.py`)
    Column("firing", String(200)),  # its last fire that ran: that wake-up's workflow id
    Column("created_by", String(200)),
    Column("created_by_key", String(200)),  # its fires count against this key's limits
    Column("created_at", String(32), nullable=False),
    Column("updated_at", String(32), nullable=False),
    Index("ix_schedules_due", "status", "next_run_at"),
    Index("ix_schedules_conversation", "conversation_id"),
)

# -- graph runs' checkpoints (graph-workflows.md §10.4): the latest one of each run, as its JSON --

graph_checkpoints = Table(
    "graph_checkpoints", metadata,
    Column("run_id", String(100), primary_key=True),
    Column("agent", String(200), nullable=False),
    Column("status", String(20), nullable=False),  # working | input_required | completed | failed | canceled
    Column("step", Integer, nullable=False),
    Column("body", Text, nullable=False),  # Checkpoint.to_json(), kept byte for byte
    Column("updated_at", String(32), nullable=False),
    Column("ended_at", Float),  # epoch seconds once the run ended: retention counts from here
    Index("ix_graph_checkpoints_ended", "ended_at"),
)

# -- every checkpoint of a graph run, one per super-step: what a fork starts from (issue 44) --

graph_checkpoint_steps = Table(
    "graph_checkpoint_steps", metadata,
    Column("run_id", String(100), primary_key=True),
    Column("step", Integer, primary_key=True, autoincrement=False),
    Column("status", String(20), nullable=False),
    Column("body", Text, nullable=False),  # Checkpoint.to_json(), kept byte for byte
    Column("created_at", String(32), nullable=False),
)

# -- a run's recording: everything nondeterministic it read (model responses, tool results, clocks, ids), so
# `ringlet replay` runs it again exactly without calling the model or any tool (issue 44) --

run_tapes = Table(
    "run_tapes", metadata,
    Column("run_id", String(40), primary_key=True),
    Column("segment", BigInteger, primary_key=True, autoincrement=False),  # 0: the start; a resume: ms when stored
    Column("body", JSON, nullable=False),
    Column("created_at", String(32), nullable=False),
)

# -- the processes that execute runs (durable execution, `server/durable/engine.py`): each beats while it lives --

workers = Table(
    "workers", metadata,
    Column("id", String(100), primary_key=True),  # the process's lease owner id, also its DBOS executor id
    Column("role", String(20), nullable=False),  # serve | worker | api (serves only)
    Column("started_at", String(32), nullable=False),
    Column("seen_at", Float, nullable=False),  # epoch seconds of its last beat, by the database's clock
)

# -- `/v1` runs stopped on client tool calls (`server/protocols/compat.py`): their transcripts until the results --

continuations = Table(
    "continuations", metadata,
    Column("run_id", String(40), primary_key=True),
    Column("key_id", String(200), nullable=False),
    Column("agent", String(200), nullable=False),
    Column("messages", JSON, nullable=False),  # the run's transcript, each message as its JSON
    Column("expires_at", String(32), nullable=False),
    Index("ix_continuations_expiry", "expires_at"),
)

# -- MCP OAuth tokens (`ringlet.mcp.tokens`): one sealed record per (realm, user, server), named by its hash ------

mcp_tokens = Table(
    "mcp_tokens", metadata,
    Column("name", String(64), primary_key=True),  # SHA-256 of the owner: the table names no one
    Column("sealed", LargeBinary, nullable=False),  # Fernet ciphertext: the tokens are never stored in the clear
    Column("updated_at", String(32), nullable=False),
)

mcp_connections = Table(
    "mcp_connections", metadata,
    Column("name", String(64), primary_key=True),  # SHA-256 of the flow's OAuth state (the state is not stored)
    Column("realm", String(200), nullable=False),
    Column("user_id", String(200)),
    Column("server", String(200), nullable=False),
    Column("sealed", LargeBinary, nullable=False),  # the authorization URL, sealed (it carries the state)
    Column("answer", LargeBinary),  # the callback's code or error, sealed, once it came to any process
    Column("expires_at", String(32), nullable=False),
)
