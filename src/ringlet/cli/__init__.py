"""The `ringlet` command: run and chat with agents, list agents and model providers.

Exit codes: 0 success, 1 the run failed, 2 a usage or configuration error (one line on stderr, plus a hint),
3 the run paused: calls wait for approval and no terminal was there to ask (use --yes to approve all).
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ringlet.cli import eval_cmd, fork_cmd, graph_cmd, mcp_serve, ops_cmd, replay_cmd
from ringlet.cli.common import approver, err, fail, load, print_events
from ringlet.cli.common import variables as _variables
from ringlet.errors import ConfigError, RingletError

app = typer.Typer(name="ringlet", help="Run tool-using LLM agents.", no_args_is_help=True,
                  add_completion=False, pretty_exceptions_enable=False)
out = Console(highlight=False, soft_wrap=True)

ModelOpt = Annotated[str | None, typer.Option("--model", "-m", help="Override the model: provider:name.")]
VarOpt = Annotated[list[str] | None, typer.Option("--var", help="A template variable, name=value (repeatable).")]
PolicyOpt = Annotated[list[str] | None, typer.Option("--policy", help="A Rego policy file or folder (repeatable).")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Approve every tool call that needs approval.")]


async def _run(agent: Any, prompt: Any, *, json_out: bool, events_out: bool, history: list[Any] | None = None,
               max_iterations: int | None = None, yes: bool = False, resume: str | None = None,
               answer: str | None = None) -> Any:
    from ringlet.cli.render import Renderer

    renderer = None if json_out or events_out else Renderer(out, err)
    from ringlet.agent.settings import RunHost, RunSettings, run_options
    from ringlet.context import Caller

    if resume is not None:  # a graph run, from its last checkpoint
        stream = agent.resume_stream(resume, approver=approver(yes), answer=answer)
    else:
        settings = RunSettings(approver=approver(yes), host=RunHost(humans=sys.stdin.isatty()))
        stream = agent.stream(prompt, history=history or (), caller=Caller(channel="cli"),
                              **run_options(agent, {"max_iterations": max_iterations} if max_iterations else {},
                                            settings))
    await print_events(stream, renderer, events=events_out)
    await agent.wait_background()
    await agent.aclose()
    return stream.result


@app.command()
def run(  # noqa: PLR0917 - Typer maps parameters to arguments and options
        agent: Annotated[str, typer.Argument(help="Agent name, or a path to its directory (config.yaml or "
                                                   "graph.yaml).")],
        prompt: Annotated[str | None, typer.Argument(help="What to ask (not with --resume).")] = None,
        model: ModelOpt = None,
        json_out: Annotated[bool, typer.Option("--json", help="Print the RunResult as one JSON object.")] = False,
        events: Annotated[bool, typer.Option("--events", help="Print the event stream as JSON lines.")] = False,
        max_iterations: Annotated[int | None, typer.Option(help="Override the iteration limit.", min=1)] = None,
        var: VarOpt = None, policy: PolicyOpt = None, yes: YesOpt = False,
        resume: Annotated[str | None, typer.Option("--resume", help="Resume a graph run from its last "
                                                   "checkpoint (its run id).")] = None,
        answer: Annotated[str | None, typer.Option("--answer", help="With --resume: the answer to the question "
                                                   "the run paused on.")] = None) -> None:
    """Run an agent once: stream its answer, its tool calls (a graph's nodes) and a usage line. Calls that
    need approval are asked on the terminal (y/n/note), or approved with --yes."""
    if json_out and events:
        raise fail("--json and --events exclude each other", "pick one output format")
    if (prompt is None) == (resume is None):
        raise fail("give a prompt, or --resume RUN_ID", 'e.g. ringlet run assistant "What time is it?"')
    if answer is not None and resume is None:
        raise fail("--answer answers the question a paused run asked", "pass it with --resume RUN_ID")
    instance = load(agent, model, _variables(var), policy)
    if resume is not None and instance.kind != "graph":  # a loop run resumes from its state, not a run id
        raise fail(f"--resume continues graph runs; {instance.name!r} is a loop agent", "run it with a prompt")
    try:
        result = asyncio.run(_run(instance, prompt, json_out=json_out, events_out=events,
                                  max_iterations=max_iterations, yes=yes, resume=resume, answer=answer))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except RingletError as exc:
        hint = (f"only a run that paused or was interrupted resumes; start a new one: ringlet run {agent} \"PROMPT\""
                if resume is not None else "check the agent's configuration")
        raise fail(str(exc), hint, 1) from None
    if json_out:
        data = result.to_dict()
        sys.stdout.write(json.dumps(data, ensure_ascii=False) + "\n")
    if result.finish_reason == "error":
        raise typer.Exit(1)
    if result.pending_approvals or getattr(result, "pending_question", None) is not None:
        _paused(result, agent)
        raise typer.Exit(3)


def _paused(result: Any, agent: str) -> None:
    question = getattr(result, "pending_question", None)
    if question is not None:  # a graph's approval or input node, with nobody here to answer it
        err.print(f"[yellow]paused: {escape(question.question)}[/]", markup=True)
        choices = f" (one of: {', '.join(question.options)}, or other text)" if question.options else ""
        command = f"ringlet run {shlex.quote(agent)} --resume {result.run_id}"
        err.print(escape(f"resume: {command} --answer ANSWER{choices}"))
        err.print(f"[dim]hint: in a terminal, {escape(command)} asks it again[/]", markup=True)
        return
    calls = ", ".join(f"{r.tool} ({r.reason})" for r in result.pending_approvals.values())
    err.print(f"[yellow]paused: waiting for approval of {escape(calls)}[/]", markup=True)
    err.print("[dim]hint: run it in a terminal to answer y/n/note, or pass --yes to approve every call[/]",
              markup=True)


@app.command()
def chat(agent: Annotated[str, typer.Argument(help="Agent name or path.")], model: ModelOpt = None,
         var: VarOpt = None, policy: PolicyOpt = None, yes: YesOpt = False) -> None:
    """Talk with an agent; the conversation is kept. Commands: /reset, /model provider:name, /exit, and forks:
    /history, /fork N, /edit N TEXT, /result N TEXT, /rerun N (`ringlet.cli.fork_cmd`)."""
    variables = _variables(var)
    instance = load(agent, model, variables, policy)
    history: list[Any] = []
    err.print(f"[dim]chatting with {instance.name} on {instance.model.name}; /exit to leave[/]", markup=True)
    while True:
        try:
            line = input("you> ").strip()
        except (EOFError, KeyboardInterrupt):
            err.print()
            return
        if not line:
            continue
        if line in ("/exit", "/quit"):
            return
        if line == "/reset":
            history = []
            err.print("[dim]conversation cleared[/]", markup=True)
            continue
        if line.startswith("/model"):
            instance = _switch_model(instance, agent, line.removeprefix("/model").strip(), variables, policy)
            continue
        prompt: Any = line
        if line.startswith("/"):
            forked = fork_cmd.fork_command(line, history)
            if forked is None:
                continue
            history, prompt = forked
            if not prompt:  # a fork that keeps the history as it is: the next line goes on from there
                continue
        try:
            result = asyncio.run(_run(instance, prompt, json_out=False, events_out=False, history=history, yes=yes))
        except KeyboardInterrupt:
            err.print("[dim]interrupted[/]", markup=True)
            continue
        if result.pending_approvals:  # no terminal to ask: the paused turn is dropped, the history kept
            _paused(result, agent)
            continue
        history = result.messages


def _switch_model(instance: Any, agent: str, name: str, variables: dict[str, str], policy: list[str] | None) -> Any:
    """`/model provider:name` in a chat: the agent on that model (as it was, if it cannot load); no name: say
    which model it runs on."""
    if name:
        try:
            instance = load(agent, name, variables, policy)
        except typer.Exit:
            return instance
    err.print(f"[dim]model: {instance.model.name}[/]", markup=True)
    return instance


@app.command()
def agents() -> None:
    """List the agents: built-in ones and those in RINGLET_AGENTS_DIR."""
    from ringlet.agent.config import agents_dir, discover

    table = Table("name", "kind", "description", title=f"agents ({agents_dir()} and built-in)")
    for spec in discover().values():
        table.add_row(spec.name, spec.kind + (" (built-in)" if spec.builtin else ""), spec.description)
    out.print(table)


@app.command()
def models() -> None:
    """List model providers, whether each is usable here (a local server must answer), what would make
    the others usable, and the default model."""
    from ringlet.cli.models_cmd import print_models

    print_models(out)


keys_app = typer.Typer(help="Manage API keys (stored as hashes; a new key is printed once).",
                       no_args_is_help=True)
app.add_typer(keys_app, name="keys")
DbOpt = Annotated[str | None, typer.Option("--db", help="Database URL (default: RINGLET_DB_URL or the SQLite file).")]


async def _with_keys(db: str | None, action: Any) -> Any:
    from ringlet.store import Store

    store = await Store.open(db)
    try:
        return await action(store.keys)
    finally:
        await store.close()


def _keys(db: str | None, action: Any) -> Any:
    try:
        return asyncio.run(_with_keys(db, action))
    except ConfigError as exc:
        raise fail(str(exc), "see `ringlet keys create --help`") from None


@keys_app.command("create")
def keys_create(  # noqa: PLR0917 - Typer maps parameters to arguments and options
        name: Annotated[str, typer.Argument(help="A name to recognise the key by.")],
                scope: Annotated[list[str] | None, typer.Option(
                    help="chat, approve, trigger, admin or metrics (repeatable).")]
                = None,
                realm: Annotated[list[str] | None, typer.Option(help="Allowed realm (repeatable; default all).")]
                = None,
                agent: Annotated[list[str] | None, typer.Option(help="Allowed agent (repeatable; default all).")]
                = None,
                user: Annotated[str, typer.Option(help="The principal the key acts as.")] = "local",
                org: Annotated[str, typer.Option(help="The key's organisation.")] = "default",
                expires_days: Annotated[float | None, typer.Option(help="Days until the key expires.")] = None,
                db: DbOpt = None) -> None:
    """Create a key and print it once."""
    key, record = _keys(db, lambda keys: keys.create(name, scopes=scope or ["chat"], realms=realm or "*",
                                                     agents=agent or "*", user_id=user, org_id=org,
                                                     expires_in_days=expires_days))
    out.print(key)
    err.print(f"[dim]{record.id}: scopes {', '.join(record.scopes)}; store this key now, it is not "
              "shown again[/]", markup=True)


@keys_app.command("list")
def keys_list(db: DbOpt = None) -> None:
    """List keys (never the keys themselves)."""
    table = Table("id", "name", "prefix", "scopes", "realms", "agents", "expires", "revoked")
    for k in _keys(db, lambda keys: keys.list()):
        table.add_row(k.id, k.name, k.prefix + "…", ",".join(k.scopes), str(k.realms), str(k.agents),
                      k.expires_at or "-", k.revoked_at or "-")
    out.print(table)


@keys_app.command("revoke")
def keys_revoke(key_id: Annotated[str, typer.Argument(help="The key's id (see `ringlet keys list`).")],
                db: DbOpt = None) -> None:
    """Revoke a key at once."""
    if not _keys(db, lambda keys: keys.revoke(key_id)):
        raise fail(f"no active key {key_id!r}", "`ringlet keys list` shows the ids", 1)
    err.print(f"revoked {key_id}")


app.add_typer(fork_cmd.conversations_app, name="conversations")

mcp_app = typer.Typer(help="MCP: an agent's MCP servers, and ringlet as an MCP server.", no_args_is_help=True)
app.add_typer(mcp_app, name="mcp")
mcp_app.command("serve")(mcp_serve.serve)


@mcp_app.command("list")
def mcp_list(agent: Annotated[str, typer.Argument(help="Agent name or path.")]) -> None:
    """Start each of the agent's MCP servers and show its status and tools."""
    from ringlet.agent.config import build_agent, find
    from ringlet.context import RunContext
    from ringlet.mcp.client import MCPToolset
    from ringlet.testing import ScriptedModel
    from ringlet.tools.catalog import Catalog

    try:  # listing tools needs no model: a placeholder stands in for the agent's
        instance = build_agent(find(agent), model=ScriptedModel([], name="none:listing"))
    except ConfigError as exc:
        raise fail(str(exc), "`ringlet agents` lists agents") from None
    inner = [c.toolset for ts in instance.toolsets if isinstance(ts, Catalog) for c in ts.connectors.values()]
    servers = [ts for ts in [*instance.toolsets, *inner] if isinstance(ts, MCPToolset)]
    if not servers:
        err.print(f"agent {escape(instance.name)} has no MCP servers (mcp_servers in its config.yaml)")
        return

    async def survey() -> list[tuple[MCPToolset, list[Any]]]:
        ctx = RunContext(run_id="cli", agent=instance.name)
        try:
            return [(ts, list(await ts.list_tools(ctx))) for ts in servers]
        finally:
            await instance.aclose()

    table = Table("server", "transport", "status", "tools")
    for ts, tools in asyncio.run(survey()):
        status = "ok" if ts.error is None else f"unavailable: {ts.error}"
        table.add_row(ts.name, ts.config.kind, escape(status), ", ".join(f"{t.name} ({t.effect})" for t in tools))
    out.print(table)


access_app = typer.Typer(help="Connector access requests (from the catalog's request_connector_access).",
                         no_args_is_help=True)
app.add_typer(access_app, name="access")


@access_app.command("list")
def access_list(status: Annotated[str, typer.Option(help="pending, or all.")] = "pending", db: DbOpt = None) -> None:
    """List connector access requests."""
    from ringlet.store import Store
    from ringlet.store.records import AccessRequest

    async def main() -> list[AccessRequest]:
        store = await Store.open(db)
        try:
            return await store.audit.access_requests(status=None if status == "all" else status)
        finally:
            await store.close()

    table = Table("request", "connector", "realm", "requested by", "status", "reason", "at")
    for r in asyncio.run(main()):
        table.add_row(r.request_id, r.connector, r.realm, r.requested_by or "-", r.status, escape(r.reason),
                      r.created_at)
    out.print(table)


app.add_typer(eval_cmd.eval_app, name="eval")
app.command("migrate")(ops_cmd.migrate_command)
app.command("status")(ops_cmd.status_command)
app.command("replay")(replay_cmd.replay_command)
app.command("runs")(replay_cmd.runs_command)

graph_app = typer.Typer(help="The knowledge graph of a realm; graph agents (graph.yaml).", no_args_is_help=True)
app.add_typer(graph_app, name="graph")
graph_cmd.register(graph_app)


@graph_app.command("import")
def graph_import(file: Annotated[Path, typer.Argument(help="JSON lines: one node or edge per line.")],
                 realm: Annotated[str, typer.Option(help="The realm to load into.")] = "default",
                 org: Annotated[str, typer.Option(help="The organisation.")] = "default",
                 db: DbOpt = None) -> None:
    """Upsert graph entities and edges into a realm, all or nothing."""
    from ringlet.memory import Memory
    from ringlet.memory.graph_import import import_file
    from ringlet.store.memory_records import Scope

    async def main() -> tuple[int, int]:
        memory = Memory(db) if db else Memory()
        try:
            return await import_file(memory, file, Scope(org, realm))
        finally:
            await memory.close()

    try:
        nodes, edges = asyncio.run(main())
    except ConfigError as exc:
        raise fail(str(exc), "fix the line and run the import again; nothing was imported", 1) from None
    err.print(f"imported {nodes} nodes and {edges} edges into realm {escape(realm)}")


MetricsPortOpt = Annotated[int | None, typer.Option(
    "--metrics-port", help="Serve /metrics on this port too, without a key (RINGLET_METRICS_PORT; address: "
                           "RINGLET_METRICS_HOST, default 127.0.0.1).")]


@app.command("serve")
def serve_command(  # noqa: PLR0917 - Typer maps parameters to arguments and options
        host: Annotated[str | None, typer.Option(help="Address to bind (default 127.0.0.1).")] = None,
        port: Annotated[int | None, typer.Option(help="Port (default 8000).")] = None,
        db: DbOpt = None,
        agents: Annotated[str | None, typer.Option(help="Agents folder (default RINGLET_AGENTS_DIR).")] = None,
        auth: Annotated[str | None, typer.Option(help="key (default) or none (loopback only).")] = None,
        policy: Annotated[list[str] | None, typer.Option(help="A Rego policy file or folder (repeatable).")]
        = None,
        worker: Annotated[bool | None, typer.Option(
            "--worker/--no-worker", help="Execute runs here too (default), or only serve the API (runs execute "
                                         "in `ringlet worker` processes sharing the PostgreSQL database).")] = None,
        metrics_port: MetricsPortOpt = None,
) -> None:
    """Serve the agents over HTTP: the native API with SSE, the OpenAI-compatible /v1, triggers."""
    from ringlet.server import serve

    settings = _server_settings("serve", host=host, port=port, db_url=db, agents_dir=agents, auth_mode=auth,
                                policy_paths=policy, worker=worker, metrics_port=metrics_port)
    shown = "localhost" if settings.host in ("127.0.0.1", "0.0.0.0", "::") else settings.host
    err.print(f"ringlet serving at [bold]http://{shown}:{settings.port}/[/] — open it for the web UI (API docs: /docs, "
              f"OpenAI-compatible API: /v1, auth: {settings.auth_mode})", markup=True)
    serve(settings)


@app.command("worker")
def worker_command(
        db: DbOpt = None,
        agents: Annotated[str | None, typer.Option(help="Agents folder (default RINGLET_AGENTS_DIR).")] = None,
        policy: Annotated[list[str] | None, typer.Option(help="A Rego policy file or folder (repeatable).")]
        = None, metrics_port: MetricsPortOpt = None) -> None:
    """Execute runs, serving no API: one of any number of processes, on any machines, sharing a PostgreSQL
    database with `ringlet serve`. Stops on SIGTERM or Ctrl-C; its runs go on in another process."""
    from ringlet.server.app import work

    settings = _server_settings("worker", db_url=db, agents_dir=agents, policy_paths=policy, worker=True,
                                metrics_port=metrics_port)
    if not settings.durable(_dialect(settings.db_url)):
        raise fail("ringlet worker needs runs on the engine (engine 'dbos' or 'auto') with a PostgreSQL store",
                   "point RINGLET_DB_URL (or --db) at the PostgreSQL database `ringlet serve` uses")
    err.print("ringlet worker: executing runs from the queue (Ctrl-C to stop; its runs go on elsewhere)")
    try:
        work(settings)
    except ConfigError as exc:
        raise fail(str(exc), "point RINGLET_DB_URL (or --db) at the PostgreSQL database `ringlet serve` uses") \
            from None
    except KeyboardInterrupt:
        pass


def _dialect(db_url: str | None) -> str:
    """The database a server would open (`--db`, else RINGLET_DB_URL, else the SQLite default): its dialect."""
    from ringlet.store import DEFAULT_URL, database_url

    return database_url(db_url or os.environ.get("RINGLET_DB_URL") or DEFAULT_URL).get_backend_name()


def _server_settings(command: str, **given: Any) -> Any:
    """`ringlet serve`'s and `ringlet worker`'s settings, checked (a bad policy file included) before
    anything starts."""
    from pydantic import ValidationError

    from ringlet.gates import PolicySet
    from ringlet.server import ServerSettings

    try:
        settings = ServerSettings.from_env(**given)
        settings.check()
        settings.durable(_dialect(settings.db_url))  # engine 'dbos' without PostgreSQL: said before starting
        PolicySet.load(settings.policy_paths)  # a bad policy file is reported before anything starts
    except ValidationError as exc:
        first = exc.errors()[0]
        raise fail(f"{'.'.join(map(str, first['loc']))}: {first['msg']}", f"see `ringlet {command} --help`") from None
    except ConfigError as exc:
        raise fail(str(exc), f"see `ringlet {command} --help`") from None
    return settings


def main() -> None:
    try:
        app()
    except ConfigError as exc:  # pragma: no cover - commands catch their own
        err.print(f"error: {exc}")
        sys.exit(2)
