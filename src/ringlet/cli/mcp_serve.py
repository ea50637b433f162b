"""`ringlet mcp serve`: the memory MCP server (`memory-and-context.md` §3, "MCP") over stdio or streamable HTTP.

Registered by `ringlet.cli` as `mcp_app.command("serve")(serve)`. It opens the store the agents use, builds
the six memory tools (and, with `--agents`, one `run_<agent>` tool per loop agent) and hands them to
`ringlet.mcp.server.ToolServer`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

err = Console(stderr=True, highlight=False, soft_wrap=True)

TransportOpt = Annotated[str, typer.Option(help="stdio (default), or http: streamable HTTP at /mcp, with API keys.")]
RealmOpt = Annotated[str | None, typer.Option(
    help="stdio: the realm (default `default`). http: the realm, for keys with several (one of the key's).")]
OrgOpt = Annotated[str, typer.Option(help="stdio: the organisation (over http it is the API key's).")]
HostOpt = Annotated[str, typer.Option(help="http: the address to bind.")]
PortOpt = Annotated[int, typer.Option(help="http: the port (0: any free port).", min=0, max=65535)]
DbOpt = Annotated[str | None, typer.Option("--db", help="Database URL (default: RINGLET_DB_URL or the SQLite file).")]
AgentsOpt = Annotated[str | None, typer.Option("--agents", help="Also serve the loop agents of this folder as "
                                                                "run_<agent> tools.")]


def serve(  # noqa: PLR0917 - Typer maps parameters to arguments and options
        transport: TransportOpt = "stdio", realm: RealmOpt = None, org: OrgOpt = "default",
        host: HostOpt = "127.0.0.1", port: PortOpt = 8765, db: DbOpt = None, agents_dir: AgentsOpt = None) -> None:
    """Serve the memory tools (store, recall, discover, link, task, tasks) to MCP clients, in one realm."""
    from ringlet.errors import ConfigError

    if transport not in ("stdio", "http"):
        raise fail(f"--transport {transport!r} is not stdio or http", "see `ringlet mcp serve --help`")
    folder = Path(agents_dir).expanduser() if agents_dir else None
    if folder is not None and not folder.is_dir():
        raise fail(f"--agents {agents_dir!r} is not a folder", "give the folder that holds the agent directories")

    def ready(where: str) -> None:
        shown = realm or ("default" if transport == "stdio" else "each API key's own")
        err.print(f"ringlet memory MCP server at {where} (realm: {shown})", markup=False)

    try:
        asyncio.run(_main(transport, realm=realm, org=org, host=host, port=port, db=db, folder=folder,
                          ready=ready))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except ConfigError as exc:
        raise fail(str(exc), "see `ringlet mcp serve --help`") from None


def fail(message: str, hint: str) -> typer.Exit:
    """As `ringlet.cli.fail`: the error and a hint on stderr, exit code 2 (this module is below the CLI's)."""
    err.print(f"[bold red]error:[/] {escape(message)}", markup=True, highlight=False)
    err.print(f"[dim]hint: {escape(hint)}[/]", markup=True)
    return typer.Exit(2)


async def _main(transport: str, *, realm: str | None, org: str, host: str, port: int, db: str | None,
                folder: Path | None, ready: Any) -> None:
    from ringlet import __version__
    from ringlet.mcp.server import MEMORY_TOOLS, Caller, ToolServer
    from ringlet.memory import Memory, memory_toolset
    from ringlet.store import Store

    store = await Store.open(db)
    try:
        tools = memory_toolset(Memory(store, tools=list(MEMORY_TOOLS))).static_tools or ()
        local = Caller(org, realm or "default") if transport == "stdio" else None
        server = ToolServer(tools, store.keys, agents=_agents(folder, store) if folder else None, local=local,
                            version=__version__)
        if transport == "stdio":
            ready("stdio")
            await server.serve_stdio()
        else:
            await server.serve_http(host, port, realm=realm, ready=ready)
    finally:
        await store.close()


def _agents(folder: Path, store: Any) -> dict[str, Any]:
    """The loop agents of `folder` (not the built-in ones), each built on its first call, keeping its
    memory in `store`."""
    from ringlet.agent.config import AgentSpec, build_agent, discover
    from ringlet.mcp.server import AgentEntry

    def builder(spec: AgentSpec) -> Any:
        def build() -> Any:
            agent = build_agent(spec)
            if agent.memory is not None:
                agent.memory.attach(store)
            return agent

        return build

    return {name: AgentEntry(spec.description, builder(spec)) for name, spec in discover(folder).items()
            if spec.kind == "loop" and not spec.builtin}
