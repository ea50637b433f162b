"""The run machinery of one server process, wired once (`app.py` builds one `Runner`): its parts, each handed
what it needs at construction, and the runs service the protocols and firing call (`service.Runs`).

    protocols, firing ──► Runs (service.py): start, follow, outcome, cancel, decide, answer
                           │
            ┌──────────────┼───────────────┬───────────────┐
         Starter        RunDriver        Pauses          Recovery       (GraphRuns, Streams beside them)
     start a run, or  store each event, decide, answer,  close or hand on
     wait its turn;   then publish it;  expire; resume   dead processes'
     cancel it        end or abandon    a paused run     runs; upkeep
            └──────────────┴───── Here (here.py): this process's runs, and its Executor ─────┘

                      SSE streams ◄── Hub (per conversation, bounded) ◄── RunDriver ◄── the run's stream

Clients only read: a disconnect never touches a run; cancelling cancels its pump, and the run still ends
with `message_end`. This is the one driver for every kind of run: a conversation's message, a trigger's or
schedule's fire, a resumed pause, a graph run (`graphs.GraphRuns`), and a `/v1` request with or without a
conversation (`Starter.start_unstored`: its record is stored, its events go only to the requester).

`Runner` holds the parts; it forwards nothing. The DBOS executor (`durable/`) drives the runs it hands this
process with the same parts (`Starter.adopt`, `RunDriver.drive`, `Pauses.continuation_of`).
"""

from __future__ import annotations

import asyncio
from contextlib import suppress

from ringlet.server.catalog import Catalog
from ringlet.server.http.settings import ServerSettings
from ringlet.server.runs.driver import RunDriver
from ringlet.server.runs.executor import Executor, LocalExecutor
from ringlet.server.runs.graphs import GraphRuns
from ringlet.server.runs.here import Here
from ringlet.server.runs.pauses import Pauses
from ringlet.server.runs.recovery import Recovery
from ringlet.server.runs.service import Records, Runs
from ringlet.server.runs.starter import Starter
from ringlet.server.runs.streams import Streams
from ringlet.store import Store
from ringlet.store.writer import EventWriter


class Runner:
    """The parts of this process's run machinery, wired together (no behaviour but `use` and `close`)."""

    def __init__(self, store: Store, catalog: Catalog, settings: ServerSettings) -> None:
        self.store, self.catalog, self.settings = store, catalog, settings
        window = settings.events_commit_s
        if window is None:
            window = 0.05 if store.engine.dialect.name == "postgresql" else 0.0
        self.writer = EventWriter(store, window_s=window)
        self.here = here = Here(settings)
        self.streams = Streams(store, catalog, settings, here)
        self.driver = driver = RunDriver(store, catalog, settings, here, self.writer)
        self.graphs = GraphRuns(store, catalog, settings, here, driver.relaunch)
        self.pauses = driver.pauses = Pauses(store, here, self.streams, self.graphs, driver.relaunch)
        self.starter = Starter(store, catalog, settings, here, driver)
        self.recovery = Recovery(store, settings, here, driver, self.pauses, self.graphs)
        self.use(LocalExecutor(store, self.streams.new, driver.launch, here.queued))
        self.runs = Runs(Records.of(store), catalog, settings, here, self.starter, driver, self.pauses, self.graphs,
                         self.streams)
        """The runs service: what the protocols and firing call."""

    def use(self, executor: Executor) -> None:
        """How runs execute from now on: in process (the default), or DBOS's (`app.py` chooses, once)."""
        self.here.executor = executor

    async def close(self) -> None:
        """Cancel the active runs (each still ends with message_end), wait for them, flush the writer."""
        here = self.here
        here.closing = True
        self.pauses.close()
        for run in [*here.active.values(), *here.unstored.values()]:
            if run.watcher is not None:  # it executes elsewhere and goes on
                run.watcher.cancel()
            else:
                self.starter.stop(run)
        if here.tasks:
            with suppress(TimeoutError):
                async with asyncio.timeout(10):
                    await asyncio.gather(*here.tasks, return_exceptions=True)
        await self.catalog.aclose()
        await self.writer.close()
