"""How runs execute is chosen once, in `app.py` (issue 53): the run machinery asks its `Executor` what to do
with a run, and no module outside `server/durable/` (and the app that wires it) reaches DBOS's executor."""

from __future__ import annotations

import ast
from pathlib import Path

import ringlet
from ringlet.server.catalog import Catalog
from ringlet.server.http.settings import ServerSettings
from ringlet.server.runs.executor import LocalExecutor
from ringlet.server.runs.runner import Runner
from ringlet.store import Store

SERVER = Path(ringlet.__file__).parent / "server"
DBOS_SIDE = ("ringlet.server.durable.executor", "ringlet.server.durable.engine", "ringlet.server.durable.children")


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_only_the_app_and_the_durable_room_know_the_dbos_executor() -> None:
    reaching = sorted(str(path.relative_to(SERVER)) for path in SERVER.rglob("*.py")
                      if path.parent.name != "durable" and path.name != "app.py"
                      and _imports(path) & set(DBOS_SIDE))
    assert reaching == [], f"modules outside server/durable/ that reach the DBOS executor: {reaching}"


async def test_a_runner_executes_in_process_unless_the_app_wires_another(tmp_path: Path) -> None:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'r.db'}")
    try:
        runner = Runner(store, Catalog.of([]), ServerSettings())
        assert isinstance(runner.here.executor, LocalExecutor)
        assert not hasattr(runner, "engine")  # the flag it replaced
        assert runner.here.executor.children.store is store
        runner.here.queued.add("r_1")  # waiting for a slot in process: what `GET /runs/{id}` shows as queued
        assert await runner.here.executor.queued("r_1")
        assert not await runner.here.executor.goes_on("r_1")  # nothing carries a dead process's run on by itself
    finally:
        await store.close()
