"""DBOS in a server process (`ringlet.server.durable.dbos`): the private DBOS API ringlet relies on, each symbol
named here (and the exact version pinned), and `take` (DBOS's dequeue, asked for now) on a real DBOS."""

from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
import inspect
import re
import subprocess
import sys
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from dbos import DBOS, SetWorkflowID
from sqlalchemy import text

from postgres import fresh_database
from ringlet.server.durable.dbos import (
    INTERNAL_POLL_S,
    PRIVATE,
    WAKE_INSTALLED,
    Dbos,
    claims,
    launch,
    register,
    shutdown,
    take,
    wake_fires,
)
from ringlet.server.http.settings import ServerSettings
from ringlet.store import Store

ROOT = Path(__file__).resolve().parents[1]

USED: dict[str, tuple[str, ...]] = {
    # `take` (ringlet.server.durable.dbos): DBOS's own dequeue, as its queue thread does it
    "dbos._core.execute_dequeued_workflow": ("dbos", "status", "owner_xid"),
    "dbos._dbos._get_dbos_instance": (),
    "DBOS._sys_db.start_queued_workflows": ("queue", "executor_id", "app_version", "queue_partition_key",
                                            "local_running_count", "partition_local_running_count", "owner_xid"),
    "DBOS._sys_db.get_queue_partitions": ("queue_name",),
    "DBOS._sys_db.get_workflow_statuses": ("workflow_ids",),
    "DBOS._sys_db.get_workflow_status": ("workflow_uuid",),
    "DBOS._sys_db.is_lock_conflict": ("error",),
    "DBOS._sys_db.is_serialization_conflict": ("error",),
    "DBOS._active_workflows_set.count_for_queue": ("queue_name",),
    "DBOS._active_workflows_set.count_for_partition": ("queue_name", "queue_partition_key"),
    # `stop_taking` (ringlet.server.durable.dbos): a draining process takes no more work (what `DBOS.destroy`
    # does first: its queue and scheduler threads stop)
    "DBOS.background_thread_stop_events": (),
    # `launch` (ringlet.server.durable.dbos): the internal queue's poll slowed (`INTERNAL_POLL_S`), through
    # its in-memory Queue's `_polling_interval_sec`, which its worker thread reads at every poll
    "DBOS._registry.get_internal_queue": (),
    # `Engine.hand_on` (ringlet.server.durable.engine): a dead executor's workflows back to their queues
    "DBOS._recover_pending_workflows": ("executor_ids",),
    # `ringlet.evals.durable`: whether DBOS was set up in this process already
    "dbos._dbos._dbos_global_instance": (),
}
"""Every private DBOS symbol ringlet uses → the parameters it passes (by position or name)."""


@DBOS.workflow(name="ringlet.test.noop")
async def noop(n: int) -> int:
    return n


@pytest.fixture
async def dbos(tmp_path: Path) -> AsyncIterator[None]:
    """DBOS launched on SQLite as a server process launches it, with queue `q`, which polls once an hour: in
    a test, only a `take` starts its work."""
    await launch(f"sqlite:///{tmp_path / 'dbos.sqlite'}", executor_id="test", settings=ServerSettings())
    try:
        await register("q", polling_interval_sec=3600)
        yield
    finally:
        shutdown()


def _resolve(symbol: str) -> Any:
    """The object `symbol` names: a module's attribute, or (`DBOS.…`) the launched DBOS's."""
    head, *path = symbol.split(".")
    if head == "DBOS":
        found: Any = importlib.import_module("dbos._dbos")._get_dbos_instance()
    else:
        module = importlib.import_module(f"{head}.{path[0]}")
        found, path = module, path[1:]
    for name in path:
        found = getattr(found, name)
    return found


def _moved(symbol: str, parameters: tuple[str, ...]) -> str | None:
    try:
        found = _resolve(symbol)
    except (ImportError, AttributeError) as exc:
        return f"{symbol} is gone ({type(exc).__name__}: {exc})"
    if symbol.endswith("_dbos_global_instance"):
        return None if found is _resolve("dbos._dbos._get_dbos_instance")() else \
            f"{symbol} is no longer the DBOS instance"
    missing = [p for p in parameters if p not in inspect.signature(found).parameters]
    return f"{symbol} takes no parameter {', '.join(missing)} any more" if missing else None


async def test_the_private_dbos_api_ringlet_uses_is_where_it_was_in_the_pinned_version(dbos: None) -> None:
    pinned = {re.sub(r"\s", "", d) for extra in ("server", "postgres")
              for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][extra]
              if re.match(r"dbos\b", d)}
    installed = importlib.metadata.version("dbos")
    assert pinned == {f"dbos=={installed}"}, (
        f"pyproject.toml pins {sorted(pinned)} (extras server and postgres), but dbos {installed} is installed: "
        "ringlet uses DBOS's private API, so it pins the one version this test passed with")
    moved = [m for symbol, parameters in USED.items() if (m := _moved(symbol, parameters)) is not None]
    assert not moved, (f"dbos {installed} moved private API ringlet uses: " + "; ".join(moved) + ". Re-read its "
                       "source (dbos/_queue.py `queue_worker_thread` does what `take` does), adapt "
                       "src/ringlet/server/durable/dbos.py, engine.py or evals/durable.py, and pin the new version")


async def test_the_internal_queue_polls_as_slowly_as_launch_set_it(dbos: None) -> None:
    """`launch` slows DBOS's internal queue's poll through a private attribute: the queue holds it, and DBOS's
    queue worker thread reads it at each poll (else the setting would silently do nothing)."""
    from dbos import _queue

    internal = _resolve("DBOS._registry.get_internal_queue")()
    assert internal._polling_interval_sec == INTERNAL_POLL_S
    assert not internal.database_backed_queue, "an in-memory queue: nothing re-reads its interval from a row"
    assert "queue._polling_interval_sec" in inspect.getsource(_queue.queue_worker_thread), (
        "DBOS's queue worker thread no longer reads `Queue._polling_interval_sec`: adapt `launch`")


def test_every_private_dbos_symbol_in_the_source_is_named_here() -> None:
    used: set[str] = set()
    for path in (ROOT / "src" / "ringlet").rglob("*.py"):
        source = path.read_text()
        for module, names in re.findall(r"from dbos\.(_\w+) import ([\w, ]+)", source):
            used |= {f"dbos.{module}.{n.strip()}" for n in names.split(",")}
        used |= {f"DBOS.{m}" for m in re.findall(r"\bDBOS\.(_\w+)", source)}
        used |= {f"DBOS._sys_db.{m}" for m in re.findall(r"\._sys_db\.(\w+)", source)}
        used |= {f"DBOS._registry.{m}" for m in re.findall(r"\._registry\.(\w+)", source)}
        used |= {f"DBOS._active_workflows_set.{m}" for m in re.findall(r"\bactive\.(count_for_\w+)", source)}
        used |= {f"dbos._dbos.{m}" for m in re.findall(r"\bdbos_module\.(_\w+)", source)}
    named = set(USED) | {s.rsplit(".", 1)[0] for s in USED}  # (`DBOS._sys_db` itself, in `PRIVATE`'s names)
    assert used <= named, f"private DBOS API used but not named in USED: {sorted(used - named)}"
    assert set(PRIVATE) <= set(USED)


async def test_a_take_cancelled_while_it_waits_leaves_later_takes_working(dbos: None) -> None:
    with SetWorkflowID("w_1"):
        first = await DBOS.enqueue_workflow_async("q", noop, 1)
    async with Dbos.turns.setdefault(("q", None), asyncio.Lock()):  # a take in progress: the next one waits
        waiting = asyncio.create_task(take("q"))
        await asyncio.sleep(0)  # (one yield: it runs until it waits for its turn)
        assert ("q", None) in Dbos.takes
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
    with SetWorkflowID("w_2"):
        second = await DBOS.enqueue_workflow_async("q", noop, 2)
    async with asyncio.timeout(10):  # (before the fix, every later take of the queue waited for ever)
        await take("q")
        assert [await first.get_result(polling_interval_sec=0.05),
                await second.get_result(polling_interval_sec=0.05)] == [1, 2]
    assert not Dbos.takes


async def test_a_take_starts_what_waits_within_the_queues_limits(dbos: None) -> None:
    await register("one", polling_interval_sec=3600, global_concurrency=1)
    handles = []
    for n in range(3):
        with SetWorkflowID(f"w_{n}"):
            handles.append(await DBOS.enqueue_workflow_async("one", noop, n))
    started = []
    for _ in range(3):  # one at a time: the next once the last has ended
        taken = await take("one")
        assert len(taken) == 1
        started += taken
        handle = await DBOS.retrieve_workflow_async(taken[0])
        assert await handle.get_result(polling_interval_sec=0.05) == int(taken[0][-1])
    assert sorted(started) == ["w_0", "w_1", "w_2"]
    assert await take("one") == []


async def test_a_workflow_taken_here_by_an_earlier_take_counts_as_claimed_here(dbos: None) -> None:
    """`claims` (what `Engine.dispatch` asks): whether any take of this process claimed the workflow, its own
    take or one that was claiming already when it was enqueued (its own then finds nothing)."""
    with claims("w_1") as here:
        with SetWorkflowID("w_1"):
            handle = await DBOS.enqueue_workflow_async("q", noop, 1)
        assert not here()
        assert await take("q") == ["w_1"]  # another dispatch's take
        assert await take("q") == []  # this one's
        assert here()
        assert await handle.get_result(polling_interval_sec=0.05) == 1
    with claims("w_2") as here:
        with SetWorkflowID("w_2"):
            await DBOS.enqueue_workflow_async("q", noop, 2)
        assert not here()  # taken by no one here (another process, the queue's poll)
    assert not Dbos.expected  # nothing kept past the question
    assert await take("q") == ["w_2"]


def test_dbos_launched_first_under_a_swapped_stderr_launches_again_after_it_is_closed(tmp_path: Path) -> None:
    """DBOS logs through logging: its first launch in a process, while a runner (a CLI runner, a test's
    capture) has swapped `sys.stderr` for a stream it closes afterwards, leaves no handler on that stream,
    so the next launch does not fail flushing it (it did: `ValueError: I/O operation on closed file`)."""
    program = f"""
import asyncio, io, sys
from ringlet.server.http.settings import ServerSettings
from ringlet.store import Store
from ringlet.server.durable.dbos import launch, shutdown

async def once(n):
    await launch("sqlite:///{tmp_path}/dbos-" + str(n) + ".sqlite", executor_id="t", settings=ServerSettings())
    shutdown()

real, sys.stderr = sys.stderr, io.TextIOWrapper(io.BytesIO())  # as a CLI runner's or a capture's
asyncio.run(once(1))
sys.stderr.close()
sys.stderr = real
asyncio.run(once(2))
print("launched twice")
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "launched twice"


async def test_the_fires_wake_up_trigger_installs_once_and_its_absence_is_told(
        postgres_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """`wake_fires` installs its trigger on DBOS's table (again: it is there already), and a database where it
    cannot (no DBOS tables here) says so, so the caller keeps the fires queue's short poll."""
    for empty in (False, True):  # DBOS's tables made (as by a launch), or none
        async with fresh_database(postgres_url, empty=empty) as url:
            store = await Store.open(url)
            try:
                assert await wake_fires(store.db) is not empty
                if not empty:
                    assert await wake_fires(store.db)  # installed already: a second process finds it
                    async with store.db.connect() as conn:
                        assert (await conn.execute(text(WAKE_INSTALLED))).scalar() == 1
            finally:
                await store.close()
    assert "could not install their wake-up trigger" in caplog.text
