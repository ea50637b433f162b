"""The heartbeat (`server/durable/pulse.py`): each beat also looks at the other workers, in the same statement, so
a process looks for the dead at no cost of its own (no query of the store every second)."""

from __future__ import annotations

import asyncio
import threading

from sqlalchemy import insert, text

from postgres import fresh_database
from ringlet.server.durable.pulse import engine_url, pulse
from ringlet.store import Store
from ringlet.store.schema import workers
from ringlet.store.worker_records import Workers


async def test_each_beat_says_which_other_workers_are_silent(postgres_url: str) -> None:
    async with fresh_database(postgres_url) as url:
        store = await Store.open(url)
        try:
            async with store.db.begin() as conn:
                now = (await conn.execute(text("SELECT EXTRACT(EPOCH FROM clock_timestamp())"))).scalar_one()
                await conn.execute(insert(workers), [
                    {"id": "w-dead", "role": "worker", "started_at": "", "seen_at": float(now) - 60},
                    {"id": "w-live", "role": "worker", "started_at": "", "seen_at": float(now)},
                    {"id": "w-retired", "role": "worker", "started_at": "", "seen_at": 0.0}])
            looks: list[dict[str, bool]] = []
            stop = threading.Event()

            def heard(silent: dict[str, bool]) -> None:
                looks.append(silent)
                if len(looks) == 2:
                    stop.set()

            beat = threading.Thread(target=pulse, args=(engine_url(store), "w-me", "serve", 0.01, stop),
                                    kwargs={"silent_s": 5.0, "heard": heard})
            beat.start()
            await asyncio.to_thread(beat.join, 30)
            assert not beat.is_alive()
            others = {"w-dead": True, "w-live": False, "w-retired": True}
            assert looks[0] == others  # the first beat registers it: the look (taken before) has no row for it
            assert looks[1] == {**others, "w-me": False}  # a worker that beats is never silent to itself
            # the look says what `Workers.silent` says (the query a process made every second before)
            assert await Workers(store.db).silent(5.0) == {**others, "w-me": False}
        finally:
            await store.close()
